"""Session 46: what Gluon's warp specialization (``gl.warp_specialize``, Triton 3.6) gives an sm_90 decode stage 1
whose roles are one warp each: a key warp (its 32-token tile's logits by ``mma_v2``, the probabilities into a
shared-memory ring) and a value warp (the ring's probabilities times its tile's values by ``mma_v2``), handing
over through mbarriers. Compiled for sm_90 on the CPU (no GPU needed; needs Triton 3.6, e.g. ``pip install
--target /tmp/t36 triton==3.6.0``):

    PYTHONPATH=/tmp/t36 python3 benches/results/kernels_s46/ws_probe.py

Prints, per form, the compile error or the CTA's threads, the registers and stack of the cubin and the
``setmaxnreg`` values in its PTX. The kernel is a probe of the partitioning (its math is a stand-in: exp2 of
one MMA's logits, no online softmax); it is not a decode kernel. The batched form gives each of a partition's
4 warps a split of its own through a leading axis of size 4 over the warps (``mma_v2`` on rank-3 operands, no
cross-warp exchange).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier



@gluon.jit
def _offsets(W: gl.constexpr, R: gl.constexpr, C: gl.constexpr, L: gl.constexpr):
    """Element offsets of a [W, R, C] block (row-major per split) in layout L."""
    o_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    o_r = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    o_c = gl.arange(0, C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    return o_w[:, None, None] * (R * C) + o_r[None, :, None] * C + o_c[None, None, :]


@gluon.jit
def _keys(x_ptr, p_s, ready, empty, n, MMA: gl.constexpr, W: gl.constexpr):
    """The key role for W splits at once, one per warp (a leading axis of W over the partition's warps)."""
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    LB: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 8, 4], [W, 1, 1], [2, 1, 0])
    off = _offsets(W, 32, 16, LB)
    q = gl.convert_layout(gl.full([W, 16, 8], 1.0, gl.float16, LB), B)
    for it in range(n):
        k = gl.load(x_ptr + it * W * 512 + off)
        p = gl.exp2(mma_v2(gl.convert_layout(k, A), q, gl.zeros([W, 32, 8], gl.float32, MMA))).to(gl.float16)
        mbarrier.wait(empty.index(it % 2), ((it // 2) & 1) ^ 1)
        p_s.index(it % 2).store(p)
        mbarrier.arrive(ready.index(it % 2))


@gluon.jit
def _values(y_ptr, out_ptr, p_s, ready, empty, n, MMA: gl.constexpr, W: gl.constexpr):
    """The value role for W splits at once, one per warp."""
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    LB: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 4, 8], [W, 1, 1], [2, 1, 0])
    off = _offsets(W, 128, 32, LB)
    acc = gl.zeros([W, 128, 8], gl.float32, MMA)
    for it in range(n):
        v = gl.load(y_ptr + it * W * 4096 + off)
        mbarrier.wait(ready.index(it % 2), (it // 2) & 1)
        p = p_s.index(it % 2).load(B)
        mbarrier.arrive(empty.index(it % 2))
        acc = mma_v2(gl.convert_layout(v, A), p, acc)
    LO: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    gl.store(out_ptr + _offsets(W, 128, 8, LO), gl.convert_layout(acc, LO))


@gluon.jit
def _idle(n):
    pass


@gluon.jit
def _ring(W: gl.constexpr):
    p_s = gl.allocate_shared_memory(gl.float16, [2, W, 32, 8], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)
    return p_s, ready, empty


@gluon.jit
def ws_two_roles(x_ptr, y_ptr, out_ptr, n, W: gl.constexpr):
    """The value role the default partition (the kernel's num_warps W), the key role a worker of W warps, each
    warp on a split of its own (W = 1: one value and one key warp per program)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    p_s, ready, empty = _ring(W)
    gl.warp_specialize([(_values, (y_ptr, out_ptr, p_s, ready, empty, n, MMA, W)),
                        (_keys, (x_ptr, p_s, ready, empty, n, MMA, W))], [W], [128])


@gluon.jit
def ws_idle_default(x_ptr, y_ptr, out_ptr, n):
    """A 4-warp default partition that does nothing, the value and key warps 1-warp workers."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1, 1], instr_shape=[1, 16, 8])
    p_s, ready, empty = _ring(1)
    gl.warp_specialize([(_idle, (n,)), (_values, (y_ptr, out_ptr, p_s, ready, empty, n, MMA, 1)),
                        (_keys, (x_ptr, p_s, ready, empty, n, MMA, 1))], [1, 1], [128, 128])


FORMS = [("value warp as the default partition (num_warps 1)", ws_two_roles, {"W": 1}, {"num_warps": 1}),
         ("idle 4-warp default + value and key workers of 1 warp", ws_idle_default, {}, {"num_warps": 4}),
         ("the same, maxnreg 128", ws_idle_default, {}, {"num_warps": 4, "maxnreg": 128}),
         ("4 value warps (default) + 4 key warps, a split per warp (batched layouts)", ws_two_roles, {"W": 4},
          {"num_warps": 4}),
         ("the same, maxnreg 128", ws_two_roles, {"W": 4}, {"num_warps": 4, "maxnreg": 128})]


def main() -> None:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    sig = {"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp32", "n": "i32"}
    print(f"triton {triton.__version__}, sm_90")
    for label, fn, const, options in FORMS:
        try:
            src = GluonASTSource(fn, {**sig, **{c: "constexpr" for c in const}}, const, {})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        except Exception as e:  # the compiler's own message is the finding
            msg = next((ln for ln in str(e).splitlines() if "error" in ln.lower() or "requires" in ln), str(e)[-200:])
            print(f"{label}: does not compile: {msg.strip()}")
            continue
        ptx = k.asm["ptx"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            res = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
        regs = re.search(r"REG:(\d+) STACK:(\d+)", res)
        ntid = re.search(r"\.reqntid (\d+)", ptx)
        setmax = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)))
        threads = int(ntid.group(1)) if ntid else None
        warps = threads // 32 if threads else None
        ctas = 65536 // (threads * int(regs.group(1))) if threads and regs else None
        print(f"{label}: {threads} threads ({warps} warps) per CTA, {regs.group(1)} registers, {regs.group(2)} B stack,"
              f" setmaxnreg {', '.join(f'{a} {b}' for a, b in setmax) or 'none'}; CTAs per SM by registers: {ctas}")


if __name__ == "__main__":
    main()
