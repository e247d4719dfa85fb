"""Run the Gluon decode stage 1's source on the CPU with numpy standing in for ``gl`` (no GPU, no
Gluon compiler): checks its index arithmetic, fragment channel maps, dequantization and softmax
against the torch reference and today's Triton kernel (in Triton's interpreter), before device time
is spent. Developer tool, not a test.

What it checks: the kernel's tensor semantics (addresses, shapes, reshapes and joins, the channel
each operand position holds, the online softmax, the partials' contract with the merge launch).
What it cannot check: layouts (``convert_layout`` is the identity here), the compiled code, the
inline PTX (emulated with the same arithmetic: fp16 pair (2^(10-b) + c) - 2^(10-b), then one fp32
FMA rounded to fp16). Run from the repo root with the installed package (any Triton version):

    python benches/kernels/gluon_numpy_check.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import sys
import types
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # the rotation and merge launches (portable Triton) on the CPU

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from support.kernel_data import build_pool, lens_before_write, reference_decode, rel_rms  # noqa: E402

from oscar_sgl.config import PAPER_FORMAT, OscarConfig  # noqa: E402
from oscar_sgl.kernels import decode as kdecode  # noqa: E402
from oscar_sgl.kernels import gluon_decode as G  # noqa: E402

_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32, "int16": np.int16, "int32": np.int32,
       "int64": np.int64}  # bf16 loads are widened to fp32 (the values are bf16 already)


class _DT:
    def __init__(self, name):
        self.name = name


class Ptr:
    """A pointer: a flat numpy array and element offsets (a scalar or an array); ``dtype`` names
    the element type the kernel sees (``bfloat16`` for a float32 array standing in for bf16)."""

    def __init__(self, arr, off=0, dtype=None):
        self.arr, self.off = arr, off
        self.dtype = types.SimpleNamespace(element_ty=_DT(dtype or {np.float32: "float32", np.int32: "int32",
                                                                   np.int64: "int64", np.int16: "int16",
                                                                   np.float16: "float16"}.get(arr.dtype.type, "float32")))

    def __add__(self, o):
        return Ptr(self.arr, self.off + (o.a if isinstance(o, T) else o), self.dtype.element_ty.name)

    __radd__ = __add__

    def __sub__(self, o):
        return Ptr(self.arr, self.off - (o.a if isinstance(o, T) else o), self.dtype.element_ty.name)

    def to(self, ptr_type, bitcast=False):
        """A pointer cast (``ptr.to(gl.pointer_type(dt), bitcast=True)``): the same bytes as
        elements of ``dt``; the offset must fall on a whole element of it."""
        assert bitcast, "only bitcast pointer casts"
        new = _NP[ptr_type.name]
        ratio = np.dtype(new).itemsize // self.arr.dtype.itemsize
        off = _a(self.off)
        assert ratio >= 1 and np.all(np.asarray(off) % ratio == 0), "a cast pointer must be aligned to its new type"
        return Ptr(self.arr.view(new), np.asarray(off) // ratio, ptr_type.name)


class T:
    """A tensor: numpy semantics with the Triton methods the kernel uses."""

    def __init__(self, a):
        self.a = np.asarray(a)

    def _w(self, o):
        return o.a if isinstance(o, T) else o

    def to(self, dt, bitcast=False):
        if dt.name == "bfloat16":  # round to nearest even bf16, kept in fp32
            return T(torch.from_numpy(np.ascontiguousarray(self.a, np.float32)).bfloat16().float().numpy())
        t = _NP[dt.name]
        return T(self.a.view(t) if bitcast else self.a.astype(t))

    def __bool__(self):
        return bool(self.a)

    def __index__(self):
        return int(self.a)

    def __getitem__(self, idx):
        return T(self.a[idx])

    @property
    def type(self):  # ``x.type.layout``: layouts do not exist here
        return types.SimpleNamespace(layout=None)

    @property
    def shape(self):
        return self.a.shape


def _binop(name):
    def f(self, o):
        a, b = self.a, self._w(o)
        if name in ("floordiv", "mod") and np.issubdtype(np.asarray(a).dtype, np.integer):
            r = getattr(np, {"floordiv": "floor_divide", "mod": "mod"}[name])(a, b)  # operands here are >= 0
        else:
            r = getattr(np, name)(a, b)
        return T(r)

    def rf(self, o):
        return T(getattr(np, name)(self._w(o), self.a))

    return f, rf


for _n, _np_name in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                     ("floordiv", "floordiv"), ("mod", "mod"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                     ("lshift", "left_shift"), ("rshift", "right_shift"), ("lt", "less"), ("le", "less_equal"),
                     ("gt", "greater"), ("ge", "greater_equal"), ("eq", "equal"), ("ne", "not_equal")]:
    _f, _rf = _binop(_np_name)
    setattr(T, f"__{_n}__", _f)
    if _n not in ("lt", "le", "gt", "ge", "eq", "ne"):
        setattr(T, f"__r{_n}__", _rf)


def _a(x):
    return x.a if isinstance(x, T) else x


class Shim(types.SimpleNamespace):
    pass


def make_gl(ctx):
    gl = Shim()
    for n in _NP:
        setattr(gl, n, _DT(n))
    gl.constexpr = lambda x: x
    gl.pointer_type = lambda dt: dt
    gl.SliceLayout = gl.BlockedLayout = gl.DotOperandLayout = gl.NVMMADistributedLayout = lambda *a, **k: None
    gl.arange = lambda s, e, layout=None: T(np.arange(s, e, dtype=np.int32))
    gl.full = lambda shape, v, dt, layout=None: T(np.full(shape, v, dtype=_NP[dt.name]))
    gl.zeros = lambda shape, dt, layout=None: T(np.zeros(shape, dtype=_NP[dt.name]))
    gl.program_id = lambda i: T(np.int32(ctx["pid"][i]))
    gl.num_programs = lambda i: ctx["grid"][i]
    gl.convert_layout = lambda x, layout, assert_trivial=False: x
    gl.expand_dims = lambda x, ax: T(np.expand_dims(_a(x), ax))
    gl.broadcast = lambda a, b: tuple(T(x) for x in np.broadcast_arrays(_a(a), _a(b)))
    gl.join = lambda a, b: T(np.stack(np.broadcast_arrays(_a(a), _a(b)), axis=-1))
    gl.reshape = lambda x, shape: T(_a(x).reshape(shape))
    gl.permute = lambda x, dims: T(np.transpose(_a(x), dims))
    gl.split = lambda x: (T(_a(x)[..., 0]), T(_a(x)[..., 1]))
    gl.sqrt_rn = lambda x: T(np.sqrt(np.float32(_a(x))).astype(np.float32))
    gl.where = lambda c, a, b: T(np.where(_a(c), _a(a), _a(b)))
    gl.maximum = lambda a, b: T(np.maximum(_a(a), _a(b)))
    gl.minimum = lambda a, b: T(np.minimum(_a(a), _a(b)))
    gl.max = lambda x, axis: T(np.max(_a(x), axis=axis))
    gl.sum = lambda x, axis: T(np.sum(_a(x), axis=axis, dtype=np.float32))
    gl.exp2 = lambda x: T(np.exp2(_a(x)).astype(np.float32))
    gl.log2 = lambda x: T(np.log2(_a(x)).astype(np.float32))

    def load(p, mask=None, other=0, cache_modifier=""):
        off = _a(p.off)
        if mask is None:
            return T(p.arr[off])
        m = np.broadcast_to(_a(mask), np.shape(off))
        safe = np.where(m, off, 0)
        return T(np.where(m, p.arr[safe], other).astype(p.arr.dtype))

    def store(p, v, mask=None):
        off, v = np.broadcast_arrays(_a(p.off), _a(v))
        m = np.ones(off.shape, bool) if mask is None else np.broadcast_to(_a(mask), off.shape)
        p.arr[off[m]] = v[m]

    gl.load, gl.store = load, store

    def atomic_add(p, v, sem=None, scope=None):  # the programs run one after the other
        old = p.arr[_a(p.off)].copy()
        p.arr[_a(p.off)] += v
        return T(old)

    def atomic_xchg(p, v, sem=None, scope=None):
        old = p.arr[_a(p.off)].copy()
        p.arr[_a(p.off)] = v
        return T(old)

    gl.atomic_add, gl.atomic_xchg = atomic_add, atomic_xchg

    def inline_asm_elementwise(asm, constraints, args, dtype, is_pure, pack):
        if asm.startswith("prefetch.global.L2"):  # _l2_prefetch: no effect but its addresses, which
            # must fall inside the array the kernel reads (the GPU fetches the 128-byte line of each)
            ptr = args[0]
            off = np.asarray(_a(ptr.off)).astype(np.int64)
            assert np.all(off >= 0) and np.all(off < ptr.arr.size), "an L2 prefetch outside its array"
            ctx.setdefault("l2_prefetched", 0)
            ctx["l2_prefetched"] += off.size
            return T(np.zeros(off.shape, np.int32))
        args = [_a(x) for x in args]
        if asm.startswith("griddepcontrol."):  # _gdc_wait / _gdc_launch_dependents: programs run one launch
            # after the other here, so a launch before this one has run whole: only the operand's move
            ctx.setdefault("griddepcontrol", []).append(asm.split(";")[0])
            return T(np.asarray(args[0]).astype(np.int32))
        if asm.startswith("shfl.sync.bfly"):  # _lane_xor inside _fwht_lanes, whose layout (_fwht_layout) holds
            # ROWS * D / 32 = size / 32 consecutive elements of a row per lane: lane bit i is bit
            # log2(size / 32) + i of the last axis' index, so the partner differs in that index bit
            x = np.asarray(args[0])
            m = int(re.match(r"shfl\.sync\.bfly\.b32 \$0, \$1, (\d+),", asm).group(1))
            bit = (x.size // 32).bit_length() - 1 + m.bit_length() - 1
            idx = np.arange(x.shape[-1]) ^ (1 << bit)
            return T(x[..., idx].copy())
        if asm.startswith("prmt"):
            a, b = (x.astype(np.int64) & 0xFFFFFFFF for x in args)
            r = (a & 0xFFFF) | ((b & 0xFFFF) << 16) if "0x5410" in asm else (a >> 16) | ((b >> 16) << 16)
            return T(r.astype(np.uint32).view(np.int32))
        def hv(x):  # f16x2 word -> [..., 2] float64 (exact)
            return x.view(np.uint16).reshape(x.shape + (2,)).view(np.float16).astype(np.float64)

        def rnd(x):  # one f16x2 operation's rounding
            return x.astype(np.float16).astype(np.float64)

        def consts(asm):  # the asm's h(1 / qmax) and -qmax
            cw, qw = (np.array([int(re.search(f"mov.b32 {n}, (0x[0-9a-f]+);", asm).group(1), 16)], np.uint32)
                      .view(np.int32) for n in ("c", "q"))
            return hv(cw)[0, 0], hv(qw)[0, 0]

        if "0x5150" not in asm and "mov.b32 c," in asm:  # u = h(step / qmax) of a grid word (_page_u_asm)
            st_w = np.ascontiguousarray(args[0].astype(np.int32))
            k, mq = consts(asm)
            st = hv(st_w)
            r0 = rnd(st * k)
            u = rnd(rnd(r0 * mq + st) * k + r0)
            return T(np.ascontiguousarray(u.astype(np.float16)).view(np.int32).reshape(st_w.shape))
        if "0x5150" in asm and len(args) == 5:  # a group's (scale, offset) from u (_PAGE_GROUP_ASM)
            a, b, u_w, st_w, base_w = (np.ascontiguousarray(x.astype(np.int32)) for x in np.broadcast_arrays(*args))
            ra = np.stack([a & 0xFF, (a >> 8) & 0xFF], -1).astype(np.float64)
            rb = np.stack([b & 0xFF, (b >> 8) & 0xFF], -1).astype(np.float64)
            scale = rnd((rb - ra) * hv(u_w))
            offset = rnd(rnd(ra * hv(st_w)) + hv(base_w))
            return tuple(T(np.ascontiguousarray(x.astype(np.float16)).view(np.int32).reshape(a.shape))
                         for x in (scale, offset))
        if "0x5150" in asm:  # page-grid key ranges: (scale, offset) f16x2 of a channel pair (_page_params_asm)
            a, b, st_w, base_w = (np.ascontiguousarray(x.astype(np.int32)) for x in np.broadcast_arrays(*args))

            def idx(x):  # int16 word of two index bytes -> [..., 2] float64
                return np.stack([x & 0xFF, (x >> 8) & 0xFF], -1).astype(np.float64)

            k, mq = consts(asm)
            st, base = hv(st_w), hv(base_w)
            r0 = rnd(st * k)
            u = rnd(rnd(r0 * mq + st) * k + r0)
            ra = idx(a)
            scale = rnd((idx(b) - ra) * u)
            offset = rnd(rnd(ra * st) + base)

            def word(x):
                return T(np.ascontiguousarray(x.astype(np.float16)).view(np.int32).reshape(a.shape))

            return word(scale), word(offset)
        if asm.startswith("mul.rn.f16x2"):  # a * b on f16x2 pairs (keys="mma": q' = q * scale)
            a, b = (np.ascontiguousarray(x.astype(np.int32)) for x in np.broadcast_arrays(*args))
            h = [x.view(np.uint16).reshape(x.shape + (2,)).view(np.float16).astype(np.float64) for x in (a, b)]
            r = (h[0] * h[1]).astype(np.float16)
            return T(np.ascontiguousarray(r).view(np.int32).reshape(a.shape))
        if asm.startswith("fma.rn.f16x2"):  # a * b + c on f16x2 pairs, one rounding (the lean offsets)
            a, b, c = (np.ascontiguousarray(x.astype(np.int32)) for x in np.broadcast_arrays(*args))
            h = [x.view(np.uint16).reshape(x.shape + (2,)).view(np.float16).astype(np.float64) for x in (a, b, c)]
            r = (h[0] * h[1] + h[2]).astype(np.float16)
            return T(np.ascontiguousarray(r).view(np.int32).reshape(a.shape))
        if len(args) == 3:  # the codes only: lop3 (2^(10-b) + code), then optionally sub.f16x2 (exact codes)
            x, mask, magic = np.broadcast_arrays(*args)
            t = ((x & mask) | magic).astype(np.int32)
            if "sub" not in asm:
                return T(t)
            tu = np.ascontiguousarray(t).view(np.uint16).reshape(t.shape + (2,)).view(np.float16)
            mu = np.ascontiguousarray(magic.astype(np.int32)).view(np.uint16).reshape(t.shape + (2,)).view(np.float16)
            return T(np.ascontiguousarray((tu - mu).astype(np.float16)).view(np.int32).reshape(t.shape))
        x, mask, magic, s_pk, o_pk = np.broadcast_arrays(*args)
        t = ((x & mask) | magic).astype(np.int32)

        def halves(v):
            v = np.ascontiguousarray(v.astype(np.int32))
            h = v.view(np.uint16).reshape(v.shape + (2,)).view(np.float16)
            return h[..., 0].astype(np.float32), h[..., 1].astype(np.float32)

        (tl_, th), (ml, mh), (sl, sh), (ol, oh) = halves(t), halves(magic), halves(s_pk), halves(o_pk)
        if "sub" not in asm:  # the lean form: (magic + code) * scale + (offset - magic * scale)
            ml = mh = 0.0
        lo = ((tl_ - ml) * sl + ol).astype(np.float16)
        hi = ((th - mh) * sh + oh).astype(np.float16)
        out = (lo.view(np.uint16).astype(np.uint32) | (hi.view(np.uint16).astype(np.uint32) << 16)).view(np.int32)
        return T(out)

    gl.inline_asm_elementwise = inline_asm_elementwise

    # shared memory: a numpy array per allocation; cp.async copies are queued per commit group and
    # land only when a wait_group lets them (so a ring slot read before its wait reads stale data)
    # a plain strided shared layout: its order (fastest dim first) is what a _reinterpret view needs
    gl.SwizzledSharedLayout = lambda vec, per_phase, max_phase, order, **k: types.SimpleNamespace(order=list(order))
    gl.DistributedLinearLayout = lambda *a, **k: None
    gl.static_range = range

    def static_assert(cond, msg=""):
        assert cond, msg

    gl.static_assert = static_assert
    gl.thread_barrier = lambda: None
    gl.allocate_shared_memory = lambda dt, shape, layout: Smem(np.zeros(shape, dtype=_NP[dt.name]))
    ctx["copies"] = {"open": [], "groups": []}
    return gl


class Smem:
    def __init__(self, arr, slot=None, view=None):
        self.arr, self.slot, self.view = arr, slot, view

    def index(self, i):
        if self.view is not None:  # a reinterpreted view: select along its first (logical) axis
            dt, shape, order, subs = self.view
            return Smem(self.arr, self.slot, (dt, shape, order, subs + (int(_a(i)),)))
        return Smem(self.arr, int(_a(i)))

    def _reinterpret(self, dtype, shape, layout):
        """The slot's bytes as a tensor of ``shape`` whose memory order is ``layout.order``
        (fastest dim first), as ``SwizzledSharedLayout(1, 1, 1, order)`` lays it out."""
        return Smem(self.arr, self.slot, (_NP[dtype.name], list(shape), list(layout.order), ()))

    def load(self, layout):
        if self.view is None:
            return T(self.arr[self.slot].copy())
        dt, shape, order, subs = self.view
        if len(order) == len(shape) - 1:  # a buffer axis in front: the slowest, not in the layout
            order = [o + 1 for o in order] + [0]
        flat = np.ascontiguousarray(self.arr[self.slot]).reshape(-1).view(dt)
        slow = list(reversed(order))
        a = flat.reshape([shape[d] for d in slow]).transpose([slow.index(d) for d in range(len(shape))])
        for i in subs:
            a = a[i]
        return T(a.copy())


class Desc:
    """A TMA tensor descriptor: a 2D numpy view of a pool tensor and the block one copy moves."""

    def __init__(self, arr2d, block):
        self.arr2d, self.block, self.layout = arr2d, list(block), None


def make_tma(ctx):
    """TMA copies and mbarriers: a copy is queued on its barrier and lands when a wait on that
    barrier returns (so a slot read before its wait reads stale data); ``expect`` records the bytes
    the barrier's phase waits for and the copies must add up to them."""
    pend = ctx.setdefault("tma", {})

    def copy(desc, coord, bar, dst, pred=True):
        if not bool(_a(pred)):
            return
        r, c = (int(_a(x)) for x in coord)
        br, bc = desc.block
        block = np.zeros((br, bc), desc.arr2d.dtype)  # out of bounds: zero fill, as the TMA does
        src = desc.arr2d[r:r + br, c:c + bc]
        block[:src.shape[0], :src.shape[1]] = src
        pend.setdefault(id(bar.arr), []).append((dst.arr, dst.slot, block, bar.slot))

    def expect(bar, nbytes, pred=True):
        if bool(_a(pred)):
            ctx.setdefault("tma_bytes", {})[(id(bar.arr), bar.slot)] = int(nbytes)

    def wait(bar, phase, pred=True, deps=()):
        todo = [x for x in pend.get(id(bar.arr), []) if x[3] == bar.slot]
        pend[id(bar.arr)] = [x for x in pend.get(id(bar.arr), []) if x[3] != bar.slot]
        got = sum(b.nbytes for _, _, b, _ in todo)
        want = ctx.get("tma_bytes", {}).pop((id(bar.arr), bar.slot), None)
        assert todo and got == want, f"mbarrier wait: {got} bytes arrived, {want} expected"
        # the phase this wait completes: its parity is what try_wait.parity must be given (a wrong
        # parity returns at once on the GPU, before the copies land)
        done = ctx.setdefault("tma_phase", {})
        key = (id(bar.arr), bar.slot)
        assert int(_a(phase)) == done.get(key, 0) % 2, f"mbarrier wait with parity {int(_a(phase))} on phase {done.get(key, 0)}"
        done[key] = done.get(key, 0) + 1
        for dst, slot, block, _ in todo:
            dst[slot] = block.reshape(dst[slot].shape)

    tma = types.SimpleNamespace(async_copy_global_to_shared=copy)
    mbar = types.SimpleNamespace(init=lambda bar, count: None, expect=expect, wait=wait,
                                 MBarrierLayout=lambda *a, **k: None)
    return tma, mbar


def make_async_copy(ctx):
    q = ctx["copies"]

    def copy(view, p, mask=None):
        q["open"].append((view.arr, view.slot, p.arr, np.array(_a(p.off))))

    def commit():
        q["groups"].append(q["open"])
        q["open"] = []

    def wait(n):
        while len(q["groups"]) > n:
            for dst, slot, src, off in q["groups"].pop(0):
                dst[slot] = src[off]

    return types.SimpleNamespace(async_copy_global_to_shared=copy, commit_group=commit, wait_group=wait)


def mma(a, b, acc):
    return T(_a(acc) + _a(a).astype(np.float32) @ _a(b).astype(np.float32))


def kernel_functions(ctx):
    """The kernel's raw Python functions, re-bound to globals where ``gl`` is the numpy shim."""
    g = dict(vars(G))
    g["gl"] = make_gl(ctx)
    g["mma_v2"] = mma
    g["async_copy"] = make_async_copy(ctx)
    g["tma"], g["mbarrier"] = make_tma(ctx)
    g["fence_async_shared"] = lambda: None
    g["_PAIR_ASM"] = G._PAIR_ASM.value
    g["_PAGE_ASM2"], g["_PAGE_ASM4"] = G._PAGE_ASM2.value, G._PAGE_ASM4.value
    g["_PAGE_U2"], g["_PAGE_U4"], g["_PAGE_GROUP"] = G._PAGE_U2.value, G._PAGE_U4.value, G._PAGE_GROUP.value
    g["_LAZY_TAU"] = G._LAZY_TAU.value
    for n in ("_SHFL1", "_SHFL2", "_SHFL4", "_SHFL8", "_SHFL16"):
        g[n] = getattr(G, n).value
    g["_fwht_layout"] = lambda rows, d: None  # layouts do not exist here
    names = ["_row_partials", "_row_total", "_fold_rows", "_folded_keys", "_params_from_words", "_tma_issue", "_tma_read", "_tile_scales", "_key_param_pairs", "_page_key_param_pairs", "_page_key_param_pairs_spread", "_page_group_pairs", "_page_words", "_param_word_offsets", "_dequant_pairs_lean", "_pair_operands", "_halves_f16", "_dequant_pairs", "_code_pairs", "_pack_f16", "_pair_words", "_l2_prefetch", "_l2_prefetch_tile", "_tile_ptrs", "_tile_small", "_tile_raw", "_tile_issue",
             "_tile_smem", "_tile_logits", "_tile_values", "_running_max", "_tile_sum", "_attend", "_attend2", "_open_page_softmax", "_staging_tile", "_staging_tile_direct", "_open_page", "_open_tiles", "_lane_xor", "_fwht_lanes", "_gdc_wait", "_gdc_launch_dependents", "_fwht_rows", "_rotated_rows",
             "_new_rows", "_layer_key_sumsq", "_fused_write", "_fused_write_early", "_merge_heads", "_key_channel",
             "_value_channel", "_gluon_decode_stage1_kernel"]
    for n in names:
        fn = getattr(G, n).fn
        g[n] = types.FunctionType(fn.__code__, g, n, fn.__defaults__)
    return g


def run_stage1(pool, q_rot, group, part_o, part_lse, block_n, block_t, sm_scale, variant="regs1", fused=None,
               window_left=None, long_min=None):
    """Every program of the Gluon stage 1, one after the other, on numpy copies of the pool; the
    partials (and, with ``fused``, the rotated queries into ``q_rot``, the staging pages and token
    scales the fused write stores) copied back. ``fused`` (a ``fused`` variant): ``q`` (None: ``q_rot``
    holds the rotated queries), ``new_k`` / ``new_v`` / ``new_loc`` / ``staging_scale`` (None: no
    write), ``key_rotated`` (the layer's flags or None), ``rotation``, ``out`` (the merge in the
    launch, into this tensor; absent: the caller merges). ``variant``: a name of ``GLUON_VARIANTS``
    or a ``GluonVariant``. ``window_left``: a sliding-window layer's window, or None. ``long_min``
    (``decode._DecodeTuning.long_gluon``): the requests of at least that many tokens only (the
    others' programs wait for the launch before and leave: nothing of theirs is stored)."""
    var = variant if isinstance(variant, G.GluonVariant) else G.gluon_variant(variant)
    args = kdecode.named_pool_arguments(pool.layer)
    base = var.name.removesuffix("_unfused")  # check_step's unfused copy: its registered form's checks
    if args["KEY_PAGE"]:
        G.check_gluon_key_page(base)  # the launcher's check (a GluonVariant: by its name's registered form)
    G.check_gluon_key_groups(base, block_n=block_n, k_group=args["G_K"])
    b, hq, d = q_rot.shape
    h = args["H"]
    n_part = part_o.shape[2]
    ctx = {"pid": (0, 0, 0), "grid": (b, h, n_part)}
    fns = kernel_functions(ctx)

    def flat(t, dt=None):
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.reshape(-1).numpy() if dt is None else t.reshape(-1).view(dt).numpy()

    # NaN where the launch must store; with long_min the rows of the other launch's requests are
    # kept (the Triton stage 1's, before this one): whatever this launch stores over them shows
    po = np.full(part_o.numel(), np.nan, np.float32) if long_min is None else flat(part_o).copy()
    pl = np.full(part_lse.numel(), np.nan, np.float32) if long_min is None else flat(part_lse).copy()
    scale = args["scale_ptr"]
    qr = flat(q_rot).copy()
    stg_k, stg_v = flat(args["stg_k_ptr"]).copy(), flat(args["stg_v_ptr"]).copy()
    ptrs = [Ptr(qr), Ptr(flat(args["kw_ptr"])), Ptr(flat(args["kp_ptr"], torch.float16)), Ptr(flat(args["vw_ptr"])),
            Ptr(flat(args["vp_ptr"], torch.float16)), Ptr(flat(scale) if scale.dtype == torch.float32 else np.zeros(1, np.float32)),
            Ptr(stg_k), Ptr(stg_v), Ptr(flat(args["p2s_ptr"])), Ptr(flat(pool.kv_indptr)),
            Ptr(flat(pool.kv_page_indices)), Ptr(flat(pool.seq_lens)), Ptr(po), Ptr(pl)]  # fmt: skip
    f = fused or {}
    q, new_k, new_v = f.get("q"), f.get("new_k"), f.get("new_v")
    write = new_k is not None
    stg_s = flat(f["staging_scale"]).copy() if write and f.get("staging_scale") is not None else np.zeros(1, np.float32)
    krot = f.get("key_rotated")
    out = f.get("out")
    counters = np.zeros(b * h, np.int32)
    out_np = np.full(out.numel(), np.nan, np.float32) if out is not None else None
    rotate = kdecode.rotation_arguments(d, bool(f.get("rotation", False)))
    extra = dict(
        q_ptr=Ptr(flat(q)) if q is not None else Ptr(qr), new_k_ptr=Ptr(flat(new_k)) if write else Ptr(qr),
        new_v_ptr=Ptr(flat(new_v)) if write else Ptr(qr), new_loc_ptr=Ptr(flat(f["new_loc"])) if write else Ptr(qr),
        stg_scale_ptr=Ptr(stg_s), krot_ptr=Ptr(flat(krot)) if krot is not None else Ptr(np.ones(h, np.int32)),
        counter_ptr=Ptr(counters), out_ptr=Ptr(out_np if out is not None else po,
                                               dtype=str(out.dtype).split(".")[-1] if out is not None else None),
        stride_ob=out.stride(0) if out is not None else 0, stride_oh=out.stride(1) if out is not None else 0,
        stride_qb=q.stride(0) if q is not None else 0, stride_qh=q.stride(1) if q is not None else 0,
        stride_kb=new_k.stride(0) if write else 0, stride_kh=new_k.stride(1) if write else 0,
        stride_vb=new_v.stride(0) if write else 0, stride_vh=new_v.stride(1) if write else 0,
        ROT_Q=q is not None, WRITE=write, ROT_OUT=var.fused, KEY_MASK=krot is not None and rotate["ROTATE"],
        BLOCK_HK=max(1, 1 << (h - 1).bit_length()), MERGE=out is not None,
        BLOCK_G=max(1, 1 << (group - 1).bit_length()), CHUNK=max(1, 2048 // (max(1, 1 << (group - 1).bit_length()) * d)),
        LM=None, **rotate, **_tma_descriptors(args, var, block_n),
        kr_ptr=Ptr(flat(args["kr_ptr"])), KEY_PAGE=args["KEY_PAGE"],
    )  # fmt: skip
    block_h = max(8, 1 << (group - 1).bit_length())
    for ib in range(b):
        for ih in range(h):
            for isp in range(n_part):
                ctx["pid"] = (ib, ih, isp)
                ctx["tma_phase"], ctx["tma_bytes"] = {}, {}  # a fresh program: fresh barriers
                fns["async_copy"].wait_group(0)  # a fresh program: no copy of the last one pending
                fns["_gluon_decode_stage1_kernel"](
                    *ptrs, **extra, sm_scale_log2=np.float32(sm_scale * math.log2(math.e)),
                    window_left=np.int32(window_left or 0), WINDOW=window_left is not None, H=h, GROUP=group,
                    BLOCK_H=block_h, D=d, BITS=args["BITS"], P=args["P"], G_K=args["G_K"], G_V=args["G_V"],
                    S=args["S"], BLOCK_N=block_n, BLOCK_T=var.staging_block or block_t, LK=None, LV=None, MMA=None,
                    LLOAD=None, **var.constexprs(),
                    **({"long_min": np.int32(long_min), "DUAL": True} if long_min is not None else {}),
                )  # fmt: skip
                assert not ctx["copies"]["groups"] and not ctx["copies"]["open"], "the program left cp.async groups pending"
                assert not any(ctx.get("tma", {}).values()), "the program left TMA copies pending"
    part_o.copy_(torch.from_numpy(po).view(part_o.shape))
    part_lse.copy_(torch.from_numpy(pl).view(part_lse.shape))
    if q is not None:
        q_rot.copy_(torch.from_numpy(qr).view(q_rot.shape))
    if out is not None:
        assert not counters.any(), "the fused merge left a counter set"
        out.copy_(torch.from_numpy(out_np).view(out.shape).to(out.dtype))
    if write:
        pool.layer.staging_k.copy_(torch.from_numpy(stg_k).view(pool.layer.staging_k.shape).bfloat16())
        pool.layer.staging_v.copy_(torch.from_numpy(stg_v).view(pool.layer.staging_v.shape).bfloat16())
        if f.get("staging_scale") is not None:
            f["staging_scale"].copy_(torch.from_numpy(stg_s).view(f["staging_scale"].shape))


def _tma_descriptors(args, var, block_n):
    """``gluon_tma_descriptors``' blocks over numpy copies of the pool (None without ``tma``)."""
    if not var.tma:
        return {"kw_desc": None, "kp_desc": None, "vw_desc": None, "vp_desc": None}
    d, g_v = args["vw_ptr"].shape[-1] * 32 // args["BITS"], args["G_V"]
    w, ng = args["kw_ptr"].shape[-1], d // g_v

    def two_d(t, cols, dt=None):
        return (t.detach().cpu() if dt is None else t.detach().cpu().view(dt)).reshape(-1, cols).numpy()

    n = block_n * var.tma_tiles
    assert args["P"] % n == 0, "gluon_tma_descriptors refuses transfers that split a page"
    return {"kw_desc": Desc(two_d(args["kw_ptr"], w), (n, w)),
            "kp_desc": Desc(two_d(args["kp_ptr"], d), (max(1, n // args["G_K"]), d)),
            "vw_desc": Desc(two_d(args["vw_ptr"], w), (n, w)),
            "vp_desc": Desc(two_d(args["vp_ptr"], 8, torch.float16), (n * ng // 4, 8))}


#: The Triton kernels' outputs this process computed, by the digest of everything they read
#: (``_triton_memo``): the variants of one check share the same pool, queries and splits, and the
#: Triton kernel in the interpreter is ~95 % of a check's time; the stand-in runs every time.
_TRITON_MEMO: dict[str, tuple[torch.Tensor | None, ...]] = {}


def _digest(*objs) -> str:
    """A digest of tensors (dtype, shape, bytes), dataclasses (fields), containers and plain values."""
    h = hashlib.sha256()

    def feed(o):
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(o.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            h.update(type(o).__name__.encode())
            for f in dataclasses.fields(o):
                h.update(f.name.encode())
                feed(getattr(o, f.name))
        elif isinstance(o, (list, tuple)):
            h.update(b"(")
            for x in o:
                feed(x)
            h.update(b")")
        elif isinstance(o, dict):
            h.update(b"{")
            for k in sorted(o, key=str):
                h.update(str(k).encode())
                feed(o[k])
            h.update(b"}")
        else:
            h.update(repr(o).encode())
        h.update(b";")

    for o in objs:
        feed(o)
    return h.hexdigest()


def _triton_memo(inputs: tuple, run) -> tuple[torch.Tensor | None, ...]:
    """``run()``'s tensors (copies), computed once per digest of ``inputs`` (everything ``run``
    reads, taken right before it would run)."""
    key = _digest(*inputs)
    if key not in _TRITON_MEMO:
        _TRITON_MEMO[key] = tuple(None if t is None else t.detach().clone() for t in run())
    return tuple(None if t is None else t.clone() for t in _TRITON_MEMO[key])


def _merge_in_launch(n_split, group, d):
    """The launcher's rule (``oscar_decode_attention``): a fused variant merges in its launch when
    the Triton step would fuse its merge (few splits)."""
    cap = max(1, min(64, 4096 // ((1 << (group - 1).bit_length()) * d)))
    return n_split + 1 <= 2 * cap


def check(bits, h, g, p, lens, last_sealed, scope, block_n, n_split, seed, variant="regs1", window_left=None,
          fmt=None, partials=None):
    """One pool, its Gluon stage 1 (the numpy stand-in) against the reference and the Triton kernel:
    (relative RMS vs the reference, vs the Triton kernel). ``fmt``: fields over PAPER_FORMAT (the
    format the Gluon design reads), e.g. other value or key group sizes. ``partials``: a list the
    stage 1's log-sum-exps ``[B, Hq, splits + 1]`` are appended to."""
    d = 128
    cfg = OscarConfig(bits=bits, page_size=p, norm_scope=scope, **{**PAPER_FORMAT, **(fmt or {})})
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed=last_sealed, kinds={len(lens) - 1: "mixed"},
                      device=torch.device("cpu"), seed=seed)
    q = torch.randn(len(lens), h * g, d, generator=torch.Generator().manual_seed(seed)).bfloat16()
    sm = 1.0 / math.sqrt(d)
    from oscar_sgl.kernels import oscar_rotate_q

    q_rot = oscar_rotate_q(q=q, rotation=cfg.rotation)
    part_o, part_lse, _, _ = kdecode.decode_workspace(len(lens), h * g, h, d, n_split, "cpu")
    fused = G.gluon_variant(variant).fused  # partials rotated back in the launch: the plain merge
    out = torch.full(q.shape, float("nan"))
    merge_in = fused and _merge_in_launch(n_split, g, d)
    run_stage1(pool, q_rot, g, part_o, part_lse, block_n, min(p, 32), sm, variant=variant,
               fused={"rotation": cfg.rotation, **({"out": out} if merge_in else {})} if fused else None,
               window_left=window_left)
    if partials is not None:
        partials.append(part_lse.clone())
    if not merge_in:
        kdecode.merge_launch(part_o, part_lse, out, rotation=cfg.rotation and not fused)
    err = rel_rms(out, reference_decode(pool, q, sm, window_left=window_left))
    # today's Triton kernel on the same pool and splits (Triton's CPU interpreter)
    from oscar_sgl.kernels import oscar_decode_attention

    tune = dataclasses.replace(kdecode._default_tuning(len(lens), h, d, p), num_splits=n_split, block_n=block_n)
    (tri,) = _triton_memo(
        ("check", q, pool.layer, pool.kv_indptr, pool.kv_page_indices, pool.seq_lens, sm, tune, window_left),
        lambda: (oscar_decode_attention(q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr,
                                        kv_page_indices=pool.kv_page_indices, seq_lens=pool.seq_lens, sm_scale=sm,
                                        out=torch.empty(q.shape), _tuning=tune, window_left=window_left),))
    agree = rel_rms(out, tri)
    print(f"{variant} INT{bits} H={h} group={g} P={p} {scope} block_n={block_n} splits={n_split} {fmt or ''}"
          f"{'' if window_left is None else f' window {window_left}'}: relative RMS vs reference {err:.2e}, "
          f"vs the Triton kernel {agree:.2e}")
    return err, agree


def check_step(bits, scope, key_rotated, variant, seed=41, lens=(300, 97, 1000, 64), h=8, g=4, merge=None, fmt=None,
               block_n=None, split_write=False):
    """A whole decode step of a ``fused`` variant (its query rotation, the new token's write and the
    partials rotated back, then the plain merge) against the fused Triton step (Triton's
    interpreter) on copies of one pool: the staged keys and values (bits), the token scales (max
    relative difference) and the outputs (relative RMS); and against the same variant unfused (the
    write launch with the query rotation, the stage 1 on rotated queries, the rotating merge), which
    rounds exactly as it does but for the merge's order. The last request is padding (its token goes
    to page 0, which has no staging slot). ``merge``: the merge in the launch (None: the launcher's
    rule). ``fmt``: fields over PAPER_FORMAT (e.g. ``INT2_FORMAT``: page-grid key ranges);
    ``block_n``: the Gluon tile (None: the Triton tuning's). Returns (staging equal, s_t max rel.
    diff, output rel. RMS vs the Triton step, vs the unfused path); with ``split_write`` also the
    output's relative RMS from the launcher's ``split_write`` form (``"write"``: the write launch, then
    the same fused variant without its write; ``"rotation"``: the query rotation in the write launch
    too, as ``split_rotation``) and whether that form staged the same bits."""
    from oscar_sgl.kernels import oscar_decode_attention, oscar_write_kv

    d, p = 128, 128
    cfg = OscarConfig(bits=bits, page_size=p, norm_scope=scope, **{**PAPER_FORMAT, **(fmt or {})})
    pools = [build_pool(cfg, h=h, d=d, p=p, lens=lens_before_write(lens, p), device=torch.device("cpu"), seed=seed,
                        key_rotated=key_rotated) for _ in range(4 if split_write else 3)]
    seq_lens = torch.tensor(list(lens[:-1]) + [lens[-1] - 1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed + 1)
    k_new = torch.randn(len(lens), h, d, generator=gen).bfloat16()
    v_new = torch.randn(len(lens), h, d, generator=gen).bfloat16()
    q = torch.randn(len(lens), h * g, d, generator=gen).bfloat16()
    pool = pools[0]
    last = [int(pool.kv_page_indices[int(pool.kv_indptr[b + 1]) - 1]) for b in range(len(lens))]
    loc = torch.tensor([last[b] * p + (n - 1) % p for b, n in enumerate(lens[:-1])] + [5])
    sm = 1.0 / math.sqrt(d)
    tune = kdecode._default_tuning(len(lens), h, d, p)
    n_split = kdecode.pick_num_splits(len(lens), h, waves=tune.waves, resident=tune.resident, fit=tune.fit)
    tri_pool = pools[1]

    def tri_step():
        o = oscar_decode_attention(q=q, **tri_pool.pool_kwargs(), kv_indptr=tri_pool.kv_indptr,
                                   kv_page_indices=tri_pool.kv_page_indices, seq_lens=seq_lens, sm_scale=sm, new_k=k_new,
                                   new_v=v_new, new_loc=loc, staging_scale=tri_pool.staging_scale,
                                   out=torch.empty(q.shape), _tuning=tune)  # fmt: skip
        return o, tri_pool.layer.staging_k, tri_pool.layer.staging_v, tri_pool.staging_scale

    # the fused Triton step writes the new tokens into this pool's staging (what `same` and `st`
    # compare below): on a digest hit its staged state is restored from the first run
    tri, sk, sv, ss = _triton_memo(("step", q, tri_pool.layer, tri_pool.kv_indptr, tri_pool.kv_page_indices, seq_lens,
                                    k_new, v_new, loc, tri_pool.staging_scale, sm, tune), tri_step)
    tri_pool.layer.staging_k.copy_(sk)
    tri_pool.layer.staging_v.copy_(sv)
    if ss is not None:
        tri_pool.staging_scale.copy_(ss)
    part_o, part_lse, _, q_scratch = kdecode.decode_workspace(len(lens), h * g, h, d, n_split, "cpu")
    pool.seq_lens = seq_lens
    out = torch.full(q.shape, float("nan"))
    merge_in = _merge_in_launch(n_split, g, d) if merge is None else merge
    bn = block_n or tune.block_n
    run_stage1(pool, q_scratch, g, part_o, part_lse, bn, min(p, 32), sm, variant=variant,
               fused={"q": q, "new_k": k_new, "new_v": v_new, "new_loc": loc, "staging_scale": pool.staging_scale,
                      "key_rotated": pool.layer.key_rotated, "rotation": cfg.rotation, **({"out": out} if merge_in else {})})
    if not merge_in:
        kdecode.merge_launch(part_o, part_lse, out)
    # the same streaming unfused: the write launch (+ query rotation), stage 1, the rotating merge
    un, lay = pools[2], pools[2].layer
    un.seq_lens = seq_lens
    q_rot = oscar_write_kv(k=k_new, v=v_new, loc=loc, page_to_staging=lay.page_to_staging, staging_k=lay.staging_k,
                           staging_v=lay.staging_v, staging_scale=un.staging_scale, rotation=lay.rotation, q=q,
                           q_rot_out=torch.empty(q.shape), key_rotated=lay.key_rotated)  # fmt: skip
    part_o2, part_lse2, _, _ = kdecode.decode_workspace(len(lens), h * g, h, d, n_split, "cpu")
    unfused = dataclasses.replace(G.gluon_variant(variant), name=variant + "_unfused", fused=False)
    run_stage1(un, q_rot, g, part_o2, part_lse2, bn, min(p, 32), sm, variant=unfused)
    out_un = torch.empty(q.shape)
    kdecode.merge_launch(part_o2, part_lse2, out_un, rotation=cfg.rotation)
    same = (torch.equal(pool.layer.staging_k.view(torch.int16), pools[1].layer.staging_k.view(torch.int16))
            and torch.equal(pool.layer.staging_v.view(torch.int16), pools[1].layer.staging_v.view(torch.int16)))
    st = ((pool.staging_scale - pools[1].staging_scale).abs() / pools[1].staging_scale.abs().clamp_min(1e-30)).max().item()
    err, err_un = rel_rms(out, tri), rel_rms(out, out_un)
    print(f"{variant} step INT{bits} {scope} key_rotated={key_rotated} block_n={bn} {fmt or ''}: staging equal {same}, s_t max rel. diff "
          f"{st:.1e}, output vs the Triton step {err:.2e} (16-token open-page tiles round its probabilities "
          f"to bf16 against other running maxima than 32-token ones), vs the unfused path {err_un:.2e}")
    if not split_write:
        return same, st, err, err_un
    # the launcher's split_write form: the write launch (split_rotation: + the query rotation), then the
    # fused variant without the write (its partials rotated back in the launch, the merge by the same rule)
    if split_write not in ("write", "rotation"):
        raise ValueError(f"split_write: False, 'write' or 'rotation', got {split_write!r}")
    rot = split_write == "rotation"
    sp, lay = pools[3], pools[3].layer
    sp.seq_lens = seq_lens
    q_rot3 = oscar_write_kv(k=k_new, v=v_new, loc=loc, page_to_staging=lay.page_to_staging, staging_k=lay.staging_k,
                            staging_v=lay.staging_v, staging_scale=sp.staging_scale, rotation=lay.rotation,
                            q=q if rot else None, q_rot_out=torch.empty(q.shape) if rot else None,
                            key_rotated=lay.key_rotated)  # fmt: skip
    part_o3, part_lse3, _, q_scratch3 = kdecode.decode_workspace(len(lens), h * g, h, d, n_split, "cpu")
    out_sp = torch.full(q.shape, float("nan"))
    run_stage1(sp, q_rot3 if rot else q_scratch3, g, part_o3, part_lse3, bn, min(p, 32), sm, variant=variant,
               fused={**({} if rot else {"q": q}), "key_rotated": lay.key_rotated, "rotation": cfg.rotation,
                      **({"out": out_sp} if merge_in else {})})
    if not merge_in:
        kdecode.merge_launch(part_o3, part_lse3, out_sp)
    same_sp = (torch.equal(lay.staging_k.view(torch.int16), pools[1].layer.staging_k.view(torch.int16))
               and torch.equal(lay.staging_v.view(torch.int16), pools[1].layer.staging_v.view(torch.int16)))
    err_sp = rel_rms(out_sp, out)
    print(f"  split write ({split_write}): staging equal {same_sp}, output vs the fused step {err_sp:.2e}")
    return same, st, err, err_un, err_sp, same_sp


@contextlib.contextmanager
def stand_in_launches():
    """Inside the block the launcher's Gluon stage 1 (``gluon_decode.gluon_stage1_launch``) runs its
    source in this numpy stand-in (``run_stage1``) on the CPU, and ``gluon_available`` lets it: the
    launcher's own code around it (workspaces, the Triton launches in the interpreter, the merge) as
    on a GPU."""
    saved = G.gluon_stage1_launch, G.gluon_available

    def launch(*, q_rot, pool_args, group, kv_indptr, kv_page_indices, seq_lens, part_o, part_lse, sm_scale, block_n,
               block_t, variant=G.DEFAULT_GLUON_VARIANT, fused=None, window_left=None, pdl=False,
               launch_dependents=False, long_min=None):
        layer = _LAUNCHED_LAYER["layer"]
        pool = types.SimpleNamespace(layer=layer, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices, seq_lens=seq_lens)
        f = fused or {}
        out = f.get("out_ptr")
        run_stage1(pool, q_rot, group, part_o, part_lse, block_n, block_t, sm_scale, variant=variant,
                   fused=None if fused is None else {
                       "q": f.get("q_ptr"), "new_k": f.get("new_k_ptr"), "new_v": f.get("new_v_ptr"),
                       "new_loc": f.get("new_loc_ptr"), "staging_scale": f.get("stg_scale_ptr"),
                       "key_rotated": layer.key_rotated, "rotation": layer.rotation, **({"out": out} if out is not None else {})},
                   window_left=window_left, long_min=long_min)

    G.gluon_stage1_launch, G.gluon_available = launch, lambda device=None: None
    try:
        yield
    finally:
        G.gluon_stage1_launch, G.gluon_available = saved


#: The layer ``stand_in_launches``' launch reads (run_stage1 takes the pool's tensors from the layer
#: object, which the launcher's keyword arguments do not carry whole).
_LAUNCHED_LAYER: dict = {}


def check_dual(bits, variant, long_min, lens=(300, 1000, 97, 64), seed=43, fmt=None, h=8, g=4, long_waves=20.0):
    """The launcher's ``long_gluon`` step on the CPU (``stand_in_launches``: the Gluon launch's source
    in the numpy stand-in, the Triton stage 1 and the merge in the interpreter): the Triton stage 1
    for the requests shorter than ``long_min``, the Gluon ``variant`` for the others, one merge over
    rows of two split counts (``long_waves`` makes the Gluon one larger). Against the same step taken
    whole by the Triton stage 1 and whole by the Gluon one (the launcher's tuning with ``gluon``).
    The last request is padding (its token to page 0, no staging slot). Returns (staging equal to the
    Triton step's, the long requests' output rel. RMS vs the Gluon step, the short ones' vs the Triton
    step, the two launches' split counts)."""
    from oscar_sgl.kernels import oscar_decode_attention

    d, p = 128, 128
    cfg = OscarConfig(bits=bits, page_size=p, norm_scope="layer", **{**PAPER_FORMAT, **(fmt or {})})
    pools = [build_pool(cfg, h=h, d=d, p=p, lens=lens_before_write(lens, p), device=torch.device("cpu"), seed=seed)
             for _ in range(3)]
    seq_lens = torch.tensor(list(lens[:-1]) + [lens[-1] - 1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed + 1)
    k_new = torch.randn(len(lens), h, d, generator=gen).bfloat16()
    v_new = torch.randn(len(lens), h, d, generator=gen).bfloat16()
    q = torch.randn(len(lens), h * g, d, generator=gen).bfloat16()
    last = [int(pools[0].kv_page_indices[int(pools[0].kv_indptr[b + 1]) - 1]) for b in range(len(lens))]
    loc = torch.tensor([last[b] * p + (n - 1) % p for b, n in enumerate(lens[:-1])] + [5])
    sm = 1.0 / math.sqrt(d)
    base = kdecode._default_tuning(len(lens), h, d, p)
    key_page = cfg.key_ranges == "page"
    g_bn = kdecode.gluon_block_n(base.block_n, cfg.k_group, key_page)
    g_var = variant or kdecode.gluon_lane_form(kdecode.GLUON_DEFAULT_PAGE_VARIANT if key_page else kdecode.GLUON_DEFAULT_VARIANT,
                                               kdecode.GLUON_LANE_FWHT_PAIRS)  # the launcher's "" (_long_gluon_form)
    tunes = [dataclasses.replace(base, long_gluon=long_min, long_variant=variant, long_waves=long_waves), base,
             dataclasses.replace(base, gluon=True, gluon_variant=g_var, block_n=g_bn, resident=kdecode.GLUON_RESIDENT,
                                 waves=long_waves)]
    outs = []
    with stand_in_launches():
        for pool, tune in zip(pools, tunes):
            _LAUNCHED_LAYER["layer"] = pool.layer
            n = kdecode.tuning_num_splits(tune, len(lens), h)
            ws = kdecode.decode_workspace(len(lens), h * g, h, d, n, "cpu")
            outs.append(oscar_decode_attention(q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr,
                                               kv_page_indices=pool.kv_page_indices, seq_lens=seq_lens, sm_scale=sm,
                                               new_k=k_new, new_v=v_new, new_loc=loc, staging_scale=pool.staging_scale,
                                               out=torch.full(q.shape, float("nan")), workspace=ws, _tuning=tune))
    long = seq_lens >= long_min
    same = (torch.equal(pools[0].layer.staging_k.view(torch.int16), pools[1].layer.staging_k.view(torch.int16))
            and torch.equal(pools[0].layer.staging_v.view(torch.int16), pools[1].layer.staging_v.view(torch.int16)))
    err_long = rel_rms(outs[0][long], outs[2][long]) if long.any() else 0.0
    err_short = rel_rms(outs[0][~long], outs[1][~long]) if (~long).any() else 0.0
    splits = (kdecode.pick_num_splits(len(lens), h, waves=base.waves, resident=base.resident),
              kdecode.long_gluon_splits(tunes[0], len(lens), h))
    print(f"dual step INT{bits} {fmt or ''} long_min={long_min} splits (triton, gluon) {splits}: staging equal {same}, "
          f"long requests vs the Gluon step {err_long:.2e}, short ones vs the Triton step {err_short:.2e}")
    return same, err_long, err_short, splits


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="regs1,cp2,cp3,cp4,fold,cp3_magic,r16,d16,dnp,d16f",
                    help="keys of GLUON_VARIANTS (their streaming; register caps do not change the source)")
    variants = ap.parse_args().variants.split(",")
    res = []
    for v in variants:
        for bits in (2, 4):
            res.append(check(bits, 2, 4, 128, [300, 128, 5], {1}, "layer", 32, 3, bits, v))
            res.append(check(bits, 1, 8, 64, [200, 64], {1}, "head", 16, 2, bits + 10, v))
            if v != "regs1":  # splits of 1 and 2 tiles: shorter than the ring
                res.append(check(bits, 1, 4, 64, [3 * 64 + 5, 64], {1}, "layer", 32, 3, bits + 20, v))
            for window in (0, 5, 64 + 7, 150):  # inside the open page, across sealed pages and tiles
                res.append(check(bits, 1, 4, 64, [1, 63, 3 * 64, 2 * 64 + 3, 4 * 64 + 5], {2}, "layer", 16, 3,
                                 bits + 30, v, window_left=window))
    ref, agree = max(r for r, _ in res), max(a for _, a in res)
    print(f"worst: {ref:.2e} vs the reference (GPU tests' bound 5e-3), {agree:.2e} vs the Triton kernel (bound 1e-3)")
    steps = [check_step(bits, scope, flags, v) for v in variants if G.gluon_variant(v).fused
             for bits, scope, flags in ((2, "layer", None), (4, "head", None), (2, "layer", (True, False) * 4))]
    ok_steps = all(same and st <= 2.4e-7 and err < 1e-3 and err_un < 1e-6 for same, st, err, err_un in steps)
    return 0 if ref < 5e-3 and agree < 1e-3 and ok_steps else 1


if __name__ == "__main__":
    sys.exit(main())
