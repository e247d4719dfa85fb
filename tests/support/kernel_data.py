"""Shared builders for the Triton kernel tests (no tests here).

On a CPU-only machine the kernels run through Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` before anything imports ``oscar_sgl.kernels``), so the CPU shapes are tiny;
the ``gpu`` tests repeat the checks at real sizes on CUDA.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from oscar_sgl import reference as R
from oscar_sgl.config import OscarConfig

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (real sizes); the CPU interpreter runs the tiny shapes")
#: A test that runs the Triton kernels on CPU tensors, i.e. through Triton's interpreter
#: (TRITON_INTERPRET=1, which tests/conftest.py sets where there is no GPU). In a GPU process the
#: kernels are compiled for CUDA and cannot take CPU tensors; there the test's CUDA form runs instead.
needs_interpreter = pytest.mark.skipif(
    HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the Triton kernels on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1, set by "
           "conftest without a GPU); on a GPU this test's CUDA form (or the file's gpu tests) runs instead")

# Relative-RMS bounds of attention outputs against the fp32 torch reference (which dequantizes
# the same packed bytes). Where the error comes from: keys/values are dequantized to fp16 in
# registers (2^-11 relative), the query to fp16 (2^-11); on the open page the query and the
# probabilities are bf16 operands, as in SGLang's own BF16 kernel (2^-9). Measured worst cases sit
# at 1e-3 .. 2.1e-3 (interpreter and H200); the bounds leave 2.5x headroom. A bf16 output adds its
# own rounding (2^-9 relative per element).
ATTN_BOUND_FP32_OUT = 5e-3
ATTN_BOUND_BF16_OUT = 1e-2
#: How far a Gluon ``lean_dequant`` variant's INT2 output may be from the reference or the Triton
#: kernel's: its offsets folded with the magic (``o - 16 s``, ``o - 4 s``) are rounded to fp16, up to
#: |o - 16 s| / 2^12 per element and the same for a whole group (the numpy stand-in measured 3.6e-3 -
#: 5.2e-3 relative RMS from the Triton kernel; an H100 5.25e-3 from the reference at Llama-8B shapes
#: and 6.8e-3 from the Triton step at 64 requests; the other variants stay within 1e-3 of Triton).
#: The Gluon default is lean at INT2 since session 28 (decode.GLUON_DEFAULT_VARIANT).
LEAN_BOUND = 1e-2


def variant_bound(variant: str, bits: int, bound: float) -> float:
    """``bound``, or ``LEAN_BOUND`` for a lean Gluon variant at INT2 (where its dequantization differs)."""
    from oscar_sgl.kernels import gluon_decode  # not at import time: TRITON_INTERPRET is set first

    return LEAN_BOUND if bits == 2 and gluon_decode.GLUON_VARIANTS[variant].lean_dequant else bound


def default_decode_bound(bits: int, bound: float = ATTN_BOUND_FP32_OUT, cfg: OscarConfig | None = None) -> float:
    """The bound of a default decode launch that may take the Gluon default (sm_90, 16-1024 (request,
    KV head) pairs): ``variant_bound`` of ``decode.GLUON_DEFAULT_VARIANT``, or for a pool of
    page-grid key ranges (``cfg.key_ranges == "page"``) of ``decode.GLUON_DEFAULT_PAGE_VARIANT`` at
    the bit widths ``decode.GLUON_DEFAULT_PAGE_BITS`` names (else the Triton stage 1: ``bound``)."""
    from oscar_sgl.kernels import decode

    if cfg is not None and cfg.key_ranges == "page":
        return variant_bound(decode.GLUON_DEFAULT_PAGE_VARIANT, bits, bound) if bits in decode.GLUON_DEFAULT_PAGE_BITS else bound
    return variant_bound(decode.GLUON_DEFAULT_VARIANT, bits, bound)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float().cpu()
    ref = ref.float().cpu()
    assert torch.isfinite(out).all(), "output has NaN/Inf (an unwritten element or a bad group)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def random_kv(h: int, n: int, d: int, *, kind: str = "normal", gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-RoPE-like keys/values ``[H, n, D]`` fp32 with unequal token norms (the TNI OScaR fixes)."""
    k = torch.randn(h, n, d, generator=gen)
    v = torch.randn(h, n, d, generator=gen)
    norms = torch.rand(1, n, 1, generator=gen) * 4 + 0.05
    if n:
        norms[0, 0, 0] = 0.02  # a sink-like tiny token
    k = k * norms
    if kind == "zero":
        k.zero_()
        v.zero_()
    elif kind == "constant":
        k[:] = 0.75
        v[:] = -1.25
    elif kind == "signed_zero":
        # groups of zeros of both signs: min/max must not depend on which zero the reduction meets
        # first (docs/LAYOUT.md §1 canonicalizes -0.0 to +0.0)
        k[:, :, : d // 2] = -0.0
        k[:, 1::2, : d // 2] = 0.0
        v[:, :, : min(32, d)] = -0.0
        v[:, :, 1 : min(32, d) : 2] = 0.0
    elif kind == "rising":
        # key norms growing along the sequence, with a jump: the running max of the logits moves
        # by small steps and by large ones (without rescaling, fp16 probabilities would overflow)
        ramp = torch.linspace(0.1, 2.5, n).view(1, n, 1) if n else torch.ones(1, 0, 1)
        k = torch.randn(h, n, d, generator=gen) * ramp
        k[:, (2 * n) // 3 :] *= 3.0
    elif kind == "mixed":
        # constant channels over whole key groups, constant value groups, an all-zero token
        k[:, :, : d // 4] = 0.5
        v[:, ::2, : min(32, d)] = 2.0
        k[:, n // 2] = 0.0
        v[:, n // 2] = 0.0
    return k, v


@dataclass
class Pool:
    """One layer's paged pool plus the per-request reference view of it."""

    cfg: OscarConfig
    h: int
    d: int
    p: int
    layer: Any  # the launchers' `oscar_sgl.kernels.PagedLayer` (codes, params, scales, staging, page map)
    staging_scale: torch.Tensor | None
    kv_indptr: torch.Tensor
    kv_page_indices: torch.Tensor
    seq_lens: torch.Tensor
    k_blocks: list = field(default_factory=list)  # per request: sealed KBlocks
    v_blocks: list = field(default_factory=list)
    k_tail: list = field(default_factory=list)  # per request: [H, t, D] fp32 of the open page (un-rotated basis)
    v_tail: list = field(default_factory=list)
    raw: list = field(default_factory=list)  # per request: the (k, v) [H, n, D] fp32 it was built from
    also_staged: dict = field(default_factory=dict)  # request -> (page index, k, v as staged, un-rotated)
    key_rotated: tuple | None = None  # the layer's key-rotation flags (None: every head follows cfg.rotation)

    def prefix(self, b: int, n: int) -> tuple[list, list, torch.Tensor, torch.Tensor]:
        """The first ``n`` pooled tokens of request ``b`` as the reference sees them: the sealed
        blocks among them, then the rest of them (its open page, as staged in BF16, un-rotated)."""
        sealed = min(n // self.p, len(self.k_blocks[b]))
        rest = n - sealed * self.p
        return self.k_blocks[b][:sealed], self.v_blocks[b][:sealed], self.k_tail[b][:, :rest], self.v_tail[b][:, :rest]

    def pool_kwargs(self) -> dict:
        """The launchers' ``layer`` argument."""
        return dict(layer=self.layer)


def lens_before_write(lens, p: int) -> list[int]:
    """The cached lengths ``build_pool`` gets for a decode step whose requests reach ``lens`` with
    the step's new token (the last request is padding: its token goes to page 0, it keeps
    ``lens[-1] - 1`` tokens): ``n - 1``, except where the new token opens a fresh page
    (``(n - 1) % p == 0``): ``n``, so that the request holds that page (open, in staging), as the
    server allocates it before the step, its slot 0 a placeholder the write overwrites. (With ``n -
    1`` there the request's pages would end one page short of ``n`` tokens and the step would read
    a page that is not the request's.)"""
    return [n if (n - 1) % p == 0 else n - 1 for n in lens[:-1]] + [lens[-1] - 1]


def build_pool(
    cfg: OscarConfig,
    *,
    h: int,
    d: int,
    p: int,
    lens: list[int],
    last_sealed: set[int] = frozenset(),
    kinds: dict[int, str] | None = None,
    device: torch.device = DEVICE,
    seed: int = 0,
    stage_also: dict[int, int] | None = None,
    key_rotated: tuple[bool, ...] | None = None,
) -> Pool:
    """A pool holding ``len(lens)`` requests, each on shuffled pages; every page but a request's last
    is sealed (packed with the torch reference); the last page is open (rotated BF16 in staging)
    unless it is full and the request's index is in ``last_sealed``. ``stage_also`` (request ->
    page index): a sealed page that keeps its staging slot too, as a page sealed in the current
    step does. Spare pages are filled with garbage so that a wrong page index shows.
    ``key_rotated``: the layer's key-rotation flags (`reference.key_rotation_plan`): the pages are
    sealed and staged with them, and the kernels' `PagedLayer` carries them as the server's does."""
    gen = torch.Generator().manual_seed(seed)
    kinds = kinds or {}
    n_pages = [-(-n // p) for n in lens]
    total = sum(n_pages) + 3
    nbytes = d * cfg.bits // 8
    s_cols = cfg.scale_columns(h) if R.scales_tokens(cfg, key_rotated) else 0
    k_codes = torch.randint(0, 256, (total, h, p, nbytes), dtype=torch.uint8, generator=gen)
    v_codes = torch.randint(0, 256, (total, h, p, nbytes), dtype=torch.uint8, generator=gen)
    page_keys = cfg.key_ranges == "page"
    k_params = torch.randn(total, h, 1 if page_keys else p // cfg.k_group, 2, d, generator=gen).half() * 50
    k_ranges = torch.randint(0, 256, (total, h, p // cfg.k_group, 2, d), dtype=torch.uint8, generator=gen) if page_keys else None
    v_params = torch.randn(total, h, p, 2, d // cfg.v_group, generator=gen).half() * 50
    scale = torch.rand(total, p, s_cols, generator=gen) * 100 if s_cols else None
    stage_also = stage_also or {}
    ns = len(lens) + 2 + len(stage_also)
    staging_k = torch.randn(ns, h, p, d, generator=gen).bfloat16() * 50
    staging_v = torch.randn(ns, h, p, d, generator=gen).bfloat16() * 50
    staging_scale = torch.rand(ns, p, s_cols, generator=gen) if s_cols else None
    p2s = torch.full((total,), -1, dtype=torch.int32)
    order = (torch.randperm(total - 1, generator=gen) + 1).tolist()
    pool = Pool(cfg, h, d, p, None, staging_scale, torch.zeros(len(lens) + 1, dtype=torch.int32),
                torch.zeros(0, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32))  # fmt: skip
    pool.key_rotated = key_rotated
    v_rotated = R.rotates_values(cfg, key_rotated)

    def rot_k(x: torch.Tensor) -> torch.Tensor:  # [H, n, D]: the rotation of the keys as stored (its own inverse)
        return R.rotate_keys(x, cfg, key_rotated)

    def rot_v(x: torch.Tensor) -> torch.Tensor:
        return R.hadamard(x) if v_rotated else x.float()

    pages: list[int] = []
    nxt = 0
    for b, n in enumerate(lens):
        k, v = random_kv(h, n, d, kind=kinds.get(b, "normal"), gen=gen)
        mine = order[nxt : nxt + n_pages[b]]
        nxt += n_pages[b]
        pages += mine
        pool.kv_indptr[b + 1] = len(pages)
        sealed = n_pages[b] - 1 if (n % p or b not in last_sealed) else n_pages[b]
        kbs, vbs = [], []
        for i in range(sealed):
            kb, vb = R.seal(k[:, i * p : (i + 1) * p], v[:, i * p : (i + 1) * p], cfg, key_rotated)
            k_codes[mine[i]] = kb.codes
            k_params[mine[i]] = kb.params
            if k_ranges is not None:
                k_ranges[mine[i]] = kb.ranges
            v_codes[mine[i]] = vb.codes
            v_params[mine[i]] = vb.params
            if scale is not None:
                scale[mine[i]] = kb.scale
            kbs.append(kb)
            vbs.append(vb)
        t0 = sealed * p
        k_rot = rot_k(k[:, t0:]).bfloat16()
        v_rot = rot_v(v[:, t0:]).bfloat16()
        if sealed < n_pages[b]:
            p2s[mine[-1]] = b
            staging_k[b, :, : n - t0] = k_rot
            staging_v[b, :, : n - t0] = v_rot
        if b in stage_also:
            i = stage_also[b]
            assert i < sealed, "stage_also names a sealed page"
            slot = len(lens) + 2 + sorted(stage_also).index(b)
            p2s[mine[i]] = slot
            k_st = rot_k(k[:, i * p : (i + 1) * p]).bfloat16()
            v_st = rot_v(v[:, i * p : (i + 1) * p]).bfloat16()
            staging_k[slot] = k_st
            staging_v[slot] = v_st
            pool.also_staged[b] = (i, rot_k(k_st.float()), rot_v(v_st.float()))
        pool.k_blocks.append(kbs)
        pool.v_blocks.append(vbs)
        pool.raw.append((k, v))
        # the reference rotates its tail itself: hand it the staged BF16 values taken back
        pool.k_tail.append(rot_k(k_rot.float()))
        pool.v_tail.append(rot_v(v_rot.float()))
    pool.kv_page_indices = torch.tensor(pages, dtype=torch.int32)
    for name in ("staging_scale", "kv_indptr", "kv_page_indices", "seq_lens"):
        t = getattr(pool, name)
        if t is not None:
            setattr(pool, name, t.to(device))
    from oscar_sgl.kernels import PagedLayer

    def dev(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    pool.layer = PagedLayer(k_codes=dev(k_codes), k_params=dev(k_params), v_codes=dev(v_codes), v_params=dev(v_params),
                            scale=dev(scale), staging_k=dev(staging_k), staging_v=dev(staging_v),
                            page_to_staging=dev(p2s), bits=cfg.bits, k_group=cfg.k_group, v_group=cfg.v_group,
                            rotation=v_rotated, key_rotated=key_flags(cfg, key_rotated, device),
                            k_ranges=dev(k_ranges))  # fmt: skip
    return pool


def key_flags(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None, device: torch.device) -> torch.Tensor | None:
    """`PagedLayer.key_rotated` of a layer with these flags (None unless some heads rotate and some not)."""
    mixed = R.mixed_key_rotation(cfg, key_rotated)
    return None if mixed is None else torch.tensor(mixed, dtype=torch.int32, device=device)


def reference_decode(pool: Pool, q: torch.Tensor, sm_scale: float, window_left: int | None = None) -> torch.Tensor:
    """``[B, Hq, D]`` fp32 reference outputs (``reference.decode_attention`` per request);
    ``window_left``: a sliding-window layer's window."""
    outs = []
    for b in range(q.shape[0]):
        outs.append(
            R.decode_attention(q[b].float().cpu(), pool.k_blocks[b], pool.v_blocks[b], pool.k_tail[b], pool.v_tail[b], pool.cfg, sm_scale,
                               key_rotated=pool.key_rotated, window_left=window_left)
        )
    return torch.stack(outs)


def query_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int, step_start: int, mode: str,
                    cfg: OscarConfig, sm_scale: float, key_rotated: tuple[bool, ...] | None = None,
                    window_left: int | None = None) -> torch.Tensor:
    """What the server's attention gives the query ``q`` ``[Hq, D]`` at position ``pos`` of a step
    starting at ``step_start``, over keys / values ``k``, ``v`` ``[H, >= pos + 1, D]`` (positions from
    0, un-rotated): the pages below its boundary sealed (``reference.seal``), the tokens from the
    boundary to ``pos`` exact. ``mode`` "position" (``--oscar-prefill position``, the default): the
    boundary is the start of the query's own page, whatever the step; "exact": the start of the page
    holding ``step_start``, so a fresh prompt is exact. ``key_rotated``: the layer's key-rotation
    flags (`reference.key_rotation_plan`); ``window_left``: a sliding-window layer's window."""
    p = cfg.page_size
    own = (pos if mode == "position" else step_start) // p * p
    blocks = [R.seal(k[:, s:s + p], v[:, s:s + p], cfg, key_rotated) for s in range(0, own, p)]
    return R.decode_attention(q, [kb for kb, _ in blocks], [vb for _, vb in blocks], k[:, own:pos + 1], v[:, own:pos + 1],
                              cfg, sm_scale, key_rotated=key_rotated, window_left=window_left)


def check_graph_replays(cfg: OscarConfig, lens: list[int], shifts: list[int], eager_step, graph_step, *, h: int = 8,
                        g: int = 4, d: int = 128, seed: int = 12) -> torch.Tensor:
    """A decode step with the new token's write, eager on one pool and from one CUDA graph on a copy:
    ``eager_step(pool, q, **kw)`` runs each step on the first pool, ``graph_step(pool, q, **kw)`` is
    run once (compiles; stores step 0's token, as replay 0 does again), captured, and replayed with
    each step's lengths (``lens`` + that step's shift), slots, tokens and queries copied into the
    captured buffers. Asserts each replay's output within 1e-6 of the eager one and the same staged
    bytes at the end. ``kw`` carries ``out``, ``new_k``, ``new_v``, ``new_loc``, ``staging_scale``.
    Returns the graph pool's seq_lens (the captured buffer)."""
    p, b = cfg.page_size, len(lens)
    pools = [build_pool(cfg, h=h, d=d, p=p, lens=lens, device=torch.device("cuda"), seed=seed) for _ in range(2)]
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    steps = [(torch.randn(b, h * g, d, device="cuda", generator=gen).bfloat16(),
              torch.randn(b, h, d, device="cuda", generator=gen).bfloat16(),
              torch.randn(b, h, d, device="cuda", generator=gen).bfloat16()) for _ in shifts]

    def slots(pool, n_tokens):
        last = [int(pool.kv_page_indices[int(pool.kv_indptr[i + 1]) - 1]) for i in range(b)]
        return torch.tensor([pg * p + (n - 1) % p for pg, n in zip(last, n_tokens)], device="cuda")

    eager = []
    for (q, k_new, v_new), s in zip(steps, shifts):
        n_tokens = [n + s for n in lens]
        pools[0].seq_lens = torch.tensor(n_tokens, dtype=torch.int32, device="cuda")
        eager.append(eager_step(pools[0], q, out=torch.empty(q.shape, device="cuda"), new_k=k_new, new_v=v_new,
                                new_loc=slots(pools[0], n_tokens), staging_scale=pools[0].staging_scale))
    pool = pools[1]
    q_s, k_s, v_s = (t.clone() for t in steps[0])
    loc_s = slots(pool, [n + shifts[0] for n in lens])
    pool.seq_lens = torch.tensor([n + shifts[0] for n in lens], dtype=torch.int32, device="cuda")
    out_s = torch.empty(q_s.shape, device="cuda")
    kw = dict(out=out_s, new_k=k_s, new_v=v_s, new_loc=loc_s, staging_scale=pool.staging_scale)
    graph_step(pool, q_s, **kw)  # compile outside the capture (writes step 0's token, as replay 0 does again)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_step(pool, q_s, **kw)
    for i, ((q, k_new, v_new), s) in enumerate(zip(steps, shifts)):
        n_tokens = [n + s for n in lens]
        q_s.copy_(q)
        k_s.copy_(k_new)
        v_s.copy_(v_new)
        loc_s.copy_(slots(pool, n_tokens))
        pool.seq_lens.copy_(torch.tensor(n_tokens, dtype=torch.int32))
        out_s.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_rms(out_s, eager[i]) < 1e-6, i
    assert torch.equal(pools[0].layer.staging_k.view(torch.int16), pool.layer.staging_k.view(torch.int16))
    assert torch.equal(pools[0].layer.staging_v.view(torch.int16), pool.layer.staging_v.view(torch.int16))
    return pool.seq_lens
