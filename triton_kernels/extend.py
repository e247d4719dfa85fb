"""Extend (prefill) attention with a cached prefix: new tokens over the sealed pages + exact tokens.

Grid ``(B, H, cdiv(max_new, BLOCK_M / GP))``: a program takes the GQA query heads of KV head h
(``GP`` = GROUP rounded up to a power of two) for ``BLOCK_M / GP`` consecutive new tokens, so one
dequantized page tile serves ``BLOCK_M`` query rows (row r: token r // GP, head r % GP).

Each query row has a *sealed boundary* page: it reads every page below it as codes, the way the
decode kernel reads sealed pages (rotated basis: keys folded into the query, values dequantized in
registers, logits times s_t), and every token from the boundary page's start up to itself exactly:
the prefix's tokens of that page BF16 from staging, the step's own tokens from ``k``/``v``
(un-rotated, model basis) with a causal mask. ``position=True`` (the server's default): the
boundary is the page holding the row's own token, as in decode, so a token's attention depends on
its position only, not on where a prefill chunk started (pages the step filled before the row are
read as codes: the pool sealed them before this launch). ``position=False`` (``--oscar-prefill
exact``): the page holding the end of the prefix, for every row, so a fresh prompt is plain exact
attention. The two parts share one online softmax and keep two accumulators, one per basis; the
rotated one is turned back (``H_D`` is its own inverse) and added at the end.

Sealed pages are read one of two ways, with the same fp16 operands and the same products
(``_ExtendTuning.dequantize``): by default a first launch (``_dequantize_kernel``) dequantizes
every page some row reads as codes into an fp16 scratch, once per (page, KV head), and the
attention launch streams those tiles as plain loads, which Triton pipelines into shared memory for
the tensor cores; otherwise (a batch whose scratch would pass ``DEQUANTIZE_SCRATCH_BYTES``) each
program dequantizes its tiles in registers, as decode does. Decode reads every tile once per (request, KV
head); extend reads it once per block of new tokens, so dequantizing it once pays there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import (PagedLayer, channel_of, check_attention_inputs, check_fp32_buffer, check_int32, check_sealed_tile, check_window, dequantize_tile,
                     dequantized_tile, fwht_rows, interpreting, pool_arguments, rotation_arguments, sealed_tile, staging_tile,
                     to_bf16_rne, token_scales, unspecialized, use_asm)
from .write import oscar_rotate_q


_INDEX_POINTERS = ("qo_indptr_ptr", "kv_indptr_ptr", "page_idx_ptr", "prefix_lens_ptr")


@triton.jit(**unspecialized("B", "window_left", "search_steps", pointers=_INDEX_POINTERS))
def _dequantize_kernel(
    pool, qo_indptr_ptr, kv_indptr_ptr, page_idx_ptr, prefix_lens_ptr, sk_ptr, sv_ptr, B, window_left, search_steps,
    H: tl.constexpr, D: tl.constexpr, P: tl.constexpr, BITS: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr,
    BLOCK_N: tl.constexpr, POSITION: tl.constexpr, USE_ASM: tl.constexpr, WINDOW: tl.constexpr,
    KEY_PAGE: tl.constexpr,
):
    """Grid ``(len(kv_page_indices), H, P / BLOCK_N)``: tile ``t`` of KV head ``h`` of the ``i``-th
    page of the batch's page list, dequantized to scratch rows ``(i * H + h) * P + t * BLOCK_N ..``
    when some row of its request reads that page as codes (below the request's largest sealed
    boundary: ``_extend_kernel``) and, with ``WINDOW``, inside the window of its first new token;
    other entries are left unwritten and never read."""
    i = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    t0 = tl.program_id(2) * BLOCK_N
    # the request of entry i: the last b with kv_indptr[b] <= i (binary search over B + 1 offsets,
    # search_steps = bit length of B: a runtime trip count, so one compiled kernel serves every B)
    lo = 0
    hi = B
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        go = tl.load(kv_indptr_ptr + mid) <= i
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    prefix = tl.load(prefix_lens_ptr + lo)
    n_new = tl.load(qo_indptr_ptr + lo + 1) - tl.load(qo_indptr_ptr + lo)
    if POSITION:
        limit = (prefix + n_new - 1) // P
    else:
        limit = prefix // P
    j = i - tl.load(kv_indptr_ptr + lo)
    if WINDOW:
        first = (prefix - window_left) // P  # pages below it end before every row's window
    else:
        first = 0
    if (j < limit) & (j >= first) & (n_new > 0):
        page = tl.load(page_idx_ptr + i).to(tl.int64)
        dequantize_tile(page, t0, i_h, (i * H + i_h) * P + t0, pool, sk_ptr, sv_ptr, H, D, BITS, P, G_K, G_V, BLOCK_N, USE_ASM,
                        KEY_PAGE)


@triton.jit(**unspecialized("window_left", pointers=_INDEX_POINTERS))
def _extend_kernel(
    q_ptr, qrot_ptr, k_ptr, v_ptr, o_ptr, pool, qo_indptr_ptr, kv_indptr_ptr, page_idx_ptr, prefix_lens_ptr,
    sk_ptr, sv_ptr,  # DEQUANTIZED: the sealed pages as _dequantize_kernel wrote them
    sm_scale_log2, window_left,
    strides,  # (q, k, v, o) x (token, head)
    H: tl.constexpr, D: tl.constexpr, P: tl.constexpr, S: tl.constexpr, BITS: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr,
    ROTATE: tl.constexpr, LOG2D: tl.constexpr, INV_SQRT_D: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
    POSITION: tl.constexpr, DEQUANTIZED: tl.constexpr, INTERPRET: tl.constexpr, USE_ASM: tl.constexpr,
    WINDOW: tl.constexpr, KEY_PAGE: tl.constexpr,
):
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh = strides
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_m = tl.program_id(2)
    HQ: tl.constexpr = H * GROUP
    ROWS_T: tl.constexpr = BLOCK_M // GP
    if S > 1:
        s_col = i_h
    else:
        s_col = 0

    q_start = tl.load(qo_indptr_ptr + i_b).to(tl.int64)
    n_new = (tl.load(qo_indptr_ptr + i_b + 1) - q_start).to(tl.int32)
    if i_m * ROWS_T < n_new:
        prefix = tl.load(prefix_lens_ptr + i_b)
        kv_start = tl.load(kv_indptr_ptr + i_b).to(tl.int64)
        o_r = tl.arange(0, BLOCK_M)
        o_m = i_m * ROWS_T + o_r // GP  # the row's new token (index inside the request)
        o_g = o_r % GP
        m_m = (o_m < n_new) & (o_g < GROUP)
        o_hq = i_h * GROUP + o_g  # the row's query head
        o_d = tl.arange(0, D)
        rows = q_start + o_m

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc_r = tl.zeros([BLOCK_M, D], tl.float32)  # codes and staging, rotated basis
        acc_n = tl.zeros([BLOCK_M, D], tl.float32)  # new tokens, model basis

        # The sealed boundary: a row reads pages below its boundary page as codes and every token
        # from that page's start up to itself exactly. POSITION: the page holding the row's own
        # token (pages this step filled before it included: set_kv_buffer sealed them before this
        # launch); otherwise the page holding the prefix's end, for every row.
        open_page = prefix // P
        if POSITION:
            row_sp = (prefix + o_m) // P
            sp_lo = (prefix + i_m * ROWS_T) // P  # the program's first (smallest) boundary
            sp_hi = (prefix + tl.minimum(n_new, (i_m + 1) * ROWS_T) - 1) // P  # its largest
        else:
            row_sp = tl.full([BLOCK_M], 0, tl.int32) + open_page
            sp_lo = open_page
            sp_hi = open_page
        # WINDOW (a sliding-window layer): row x = prefix + o_m sees positions x - window_left .. x
        # only; tiles below the program's first row's window are skipped, the rest masked per row.
        if WINDOW:
            row_lo = prefix + o_m - window_left
            t_skip = tl.maximum(prefix + i_m * ROWS_T - window_left, 0) // BLOCK_N
        else:
            row_lo = o_m  # unused
            t_skip = 0
        if (sp_hi > 0) | (prefix > 0):
            o_qr = (rows * HQ + o_hq)[:, None] * D
            b_qrb = to_bf16_rne(tl.load(qrot_ptr + o_qr + o_d[None, :], mask=m_m[:, None], other=0.0))
            b_qr = tl.load(qrot_ptr + o_qr + channel_of(o_d, BITS)[None, :], mask=m_m[:, None], other=0.0).to(tl.float16)
            if DEQUANTIZED:  # one loop over the tiles, so that Triton pipelines their loads
                TPP: tl.constexpr = P // BLOCK_N
                # (kv_ok: each row's window over the tile, a compile-time None without WINDOW)
                for ti in range(t_skip, sp_lo * TPP):  # below every row's boundary
                    pi = ti // TPP
                    t0 = (ti % TPP) * BLOCK_N
                    page = tl.load(page_idx_ptr + kv_start + pi).to(tl.int64)
                    kv_ok = None
                    if WINDOW:
                        kv_ok = (ti * BLOCK_N + tl.arange(0, BLOCK_N))[None, :] >= row_lo[:, None]
                    m_i, l_i, acc_r = dequantized_tile(
                        b_qr, ((kv_start + pi) * H + i_h) * P + t0, token_scales(page, t0, s_col, pool, P, S, BLOCK_N),
                        m_i, l_i, acc_r, sk_ptr, sv_ptr, sm_scale_log2, D, BLOCK_N, None, kv_ok,
                    )  # fmt: skip
                if POSITION:
                    for ti in range(tl.maximum(sp_lo * TPP, t_skip), sp_hi * TPP):  # below the boundary of some rows only
                        pi = ti // TPP
                        t0 = (ti % TPP) * BLOCK_N
                        page = tl.load(page_idx_ptr + kv_start + pi).to(tl.int64)
                        kv_ok = None
                        if WINDOW:
                            kv_ok = (ti * BLOCK_N + tl.arange(0, BLOCK_N))[None, :] >= row_lo[:, None]
                        m_i, l_i, acc_r = dequantized_tile(
                            b_qr, ((kv_start + pi) * H + i_h) * P + t0, token_scales(page, t0, s_col, pool, P, S, BLOCK_N),
                            m_i, l_i, acc_r, sk_ptr, sv_ptr, sm_scale_log2, D, BLOCK_N, row_sp > pi, kv_ok,
                        )  # fmt: skip
            else:
                p_skip = t_skip * BLOCK_N // P
                for pi in range(p_skip, sp_lo):  # below every row's boundary
                    page = tl.load(page_idx_ptr + kv_start + pi).to(tl.int64)
                    for t0 in range(0, P, BLOCK_N):
                        kv_ok = None
                        if WINDOW:
                            kv_ok = (pi * P + t0 + tl.arange(0, BLOCK_N))[None, :] >= row_lo[:, None]
                        m_i, l_i, acc_r = sealed_tile(
                            b_qr, page, t0, i_h, s_col, m_i, l_i, acc_r,
                            pool, sm_scale_log2,
                            H, D, BITS, P, G_K, G_V, S, BLOCK_N, USE_ASM, False, None, kv_ok, KEY_PAGE,
                        )  # fmt: skip
                if POSITION:
                    for pi in range(tl.maximum(sp_lo, p_skip), sp_hi):  # below the boundary of some rows only
                        page = tl.load(page_idx_ptr + kv_start + pi).to(tl.int64)
                        for t0 in range(0, P, BLOCK_N):
                            kv_ok = None
                            if WINDOW:
                                kv_ok = (pi * P + t0 + tl.arange(0, BLOCK_N))[None, :] >= row_lo[:, None]
                            m_i, l_i, acc_r = sealed_tile(
                                b_qr, page, t0, i_h, s_col, m_i, l_i, acc_r,
                                pool, sm_scale_log2,
                                H, D, BITS, P, G_K, G_V, S, BLOCK_N, USE_ASM, False, row_sp > pi, kv_ok, KEY_PAGE,
                            )  # fmt: skip
            # The prefix's own tokens of the open page (BF16 staging), for the rows whose boundary it is.
            if (prefix % P != 0) & (sp_lo == open_page):
                stg = tl.load(pool[7] + tl.load(page_idx_ptr + kv_start + open_page)).to(tl.int64)
                n_valid = prefix % P
                row_ok = None
                if POSITION:
                    row_ok = row_sp == open_page
                stg_lo = None
                if WINDOW:
                    stg_lo = row_lo - open_page * P  # each row's window, in the page's token indices
                for t0 in range(0, n_valid, BLOCK_N):
                    m_i, l_i, acc_r = staging_tile(
                        b_qrb, stg, i_h, t0, n_valid, m_i, l_i, acc_r,
                        pool, sm_scale_log2, H, D, P, BLOCK_N, not INTERPRET, False, row_ok, None, stg_lo,
                    )  # fmt: skip

        # New tokens, causal: query o_m sees keys 0..o_m of this step (from its boundary on).
        b_q = tl.load(q_ptr + rows[:, None] * stride_qt + o_hq[:, None] * stride_qh + o_d[None, :], mask=m_m[:, None], other=0.0)
        if INTERPRET:
            if k_ptr.dtype.element_ty == tl.bfloat16:
                b_q = to_bf16_rne(b_q.to(tl.float32))
            else:
                b_q = b_q.to(k_ptr.dtype.element_ty)
        else:
            b_q = b_q.to(k_ptr.dtype.element_ty)
        hi = tl.minimum(n_new, (i_m + 1) * ROWS_T)
        lo = tl.maximum(sp_lo * P - prefix, 0)  # no row sees keys before its boundary
        if WINDOW:
            lo = tl.maximum(lo, i_m * ROWS_T - window_left)  # nor before its window
        lo = lo // BLOCK_N * BLOCK_N
        for n0 in range(lo, hi, BLOCK_N):
            o_n = n0 + tl.arange(0, BLOCK_N)
            m_n = o_n < n_new
            b_k = tl.load(k_ptr + (q_start + o_n)[:, None] * stride_kt + i_h * stride_kh + o_d[None, :], mask=m_n[:, None], other=0.0)
            if INTERPRET:
                b_qk = tl.dot(b_q.to(tl.float32), tl.trans(b_k.to(tl.float32)))
            else:
                b_qk = tl.dot(b_q, tl.trans(b_k))
            causal = (o_n[None, :] <= o_m[:, None]) & m_n[None, :]
            if POSITION:
                causal = causal & (prefix + o_n[None, :] >= row_sp[:, None] * P)
            if WINDOW:
                causal = causal & (prefix + o_n[None, :] >= row_lo[:, None])
            b_qk = tl.where(causal, b_qk * sm_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_qk, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded rows see no key at all
            alpha = tl.exp2(m_i - m_ref)
            b_p = tl.exp2(b_qk - m_ref[:, None])
            l_i = l_i * alpha + tl.sum(b_p, axis=1)
            b_v = tl.load(v_ptr + (q_start + o_n)[:, None] * stride_vt + i_h * stride_vh + o_d[None, :], mask=m_n[:, None], other=0.0)
            if INTERPRET:
                if v_ptr.dtype.element_ty == tl.bfloat16:
                    b_pv = to_bf16_rne(b_p).to(tl.float32)
                else:
                    b_pv = b_p.to(v_ptr.dtype.element_ty).to(tl.float32)
                acc_n = acc_n * alpha[:, None] + tl.dot(b_pv, b_v.to(tl.float32))
            else:
                acc_n = acc_n * alpha[:, None] + tl.dot(b_p.to(v_ptr.dtype.element_ty), b_v)
            acc_r = acc_r * alpha[:, None]
            m_i = m_new

        if ROTATE:
            acc_r = fwht_rows(acc_r, BLOCK_M, D, LOG2D) * INV_SQRT_D
        b_o = (acc_r + acc_n) / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        p_o = o_ptr + rows[:, None] * stride_ot + o_hq[:, None] * stride_oh + o_d[None, :]
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=m_m[:, None])


@dataclass(frozen=True)
class _ExtendTuning:
    """How one extend launch runs (never what it computes): ``_default_tuning``'s choice, or what a
    test or benchmark passes as ``oscar_extend_attention(_tuning=...)``.

    Attributes:
        block_m: query rows per program, (token, head) pairs of one KV head: a power of two >= 16
            and a multiple of the GQA group rounded up to a power of two; None: 64 on
            pre-dequantized pages, 128 in registers (32 above head_dim 128), at least the group.
        num_warps: Triton warps per program; None: 4 on pre-dequantized pages, 8 in registers.
        block_n: tokens per prefix / new-token tile: a multiple of 16 dividing the page that nests
            with k_group (``check_sealed_tile``); None: 64 on pre-dequantized pages (head_dim <=
            128, pages of 64+ tokens), else 32.
        dequantize: read the sealed pages as fp16 that a first launch dequantized into a scratch
            (True), or dequantize each tile in registers in the attention launch (False); None:
            True for every group of consecutive requests whose scratch stays within
            ``DEQUANTIZE_SCRATCH_BYTES`` (``scratch_groups``). The same values either way
            (``dequantized_tile``).
        num_stages: Triton's software-pipelining depth; None: Triton's default.
    """

    block_m: int | None = None
    num_warps: int | None = None
    block_n: int | None = None
    dequantize: bool | None = None
    num_stages: int | None = None


#: The largest scratch (fp16 keys + values of the pages of an extend batch's page lists, all KV
#: heads of the layer) one extend launch allocates to read its sealed pages pre-dequantized: a
#: larger batch runs as groups of consecutive requests that fit, and a request that alone does not
#: fit dequantizes in registers (``_ExtendTuning.dequantize``). 512 MiB holds 131072 tokens of 8
#: KV heads at head_dim 128: transient, one layer at a time, inside the activation headroom the
#: server keeps beside the pool (a BF16 pool's layer of those tokens is as large).
DEQUANTIZE_SCRATCH_BYTES = 512 << 20


def dequantize_scratch_bytes(num_pages: int, num_kv_heads: int, page_size: int, head_dim: int) -> int:
    """Bytes of the fp16 key + value scratch for ``num_pages`` entries of a page list."""
    return 2 * 2 * num_pages * num_kv_heads * page_size * head_dim


def scratch_groups(kv_indptr: list[int], budget_pages: int) -> list[tuple[int, int, bool]]:
    """Requests ``[0, B)`` with their page-list offsets ``kv_indptr`` (host, B + 1) split into runs
    of consecutive requests ``(first, end, dequantize)``: runs whose pages fit ``budget_pages`` read
    them pre-dequantized, a request that alone does not fit runs alone in registers."""
    groups: list[tuple[int, int, bool]] = []
    b, g0 = len(kv_indptr) - 1, 0
    while g0 < b:
        g1 = g0
        while g1 < b and kv_indptr[g1 + 1] - kv_indptr[g0] <= budget_pages:
            g1 += 1
        groups.append((g0, g1, True) if g1 > g0 else (g0, g0 + 1, False))
        g0 = max(g1, g0 + 1)
    return groups


def _default_tuning(num_q_heads: int, num_kv_heads: int, head_dim: int) -> _ExtendTuning:
    """The extend configuration: every field automatic, chosen per launch by the way sealed pages
    are read (``_launch_shape``)."""
    return _ExtendTuning()


def _launch_shape(tune: _ExtendTuning, dequantized: bool, gp: int, head_dim: int, page_size: int) -> tuple[int, int, int]:
    """``(block_m, num_warps, block_n)`` of one attention launch, ``tune``'s automatic fields filled
    from the H200 sweeps (benches/results/kernels_history.md, "Extend over pre-dequantized pages"): on
    pre-dequantized pages 64 rows on 4 warps over 64-token tiles (1.08-2.58x SGLang's BF16 extend,
    the fastest of the sweep at all 12 shapes), in registers 128 rows on 8 warps over 32-token tiles
    (5-9 % over 64 rows on 4; 32 rows above head_dim 128)."""
    fast = dequantized and head_dim <= 128
    block_m = tune.block_m or max(gp, 64 if fast else 128 if head_dim <= 128 else 32)
    num_warps = tune.num_warps or (4 if fast else 8)
    block_n = tune.block_n or (64 if fast and page_size % 64 == 0 else 32)
    return block_m, num_warps, block_n


def oscar_extend_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    layer: PagedLayer,
    kv_indptr: torch.Tensor,
    kv_page_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    sm_scale: float,
    q_rot: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
    out: torch.Tensor | None = None,
    position: bool = True,
    kv_indptr_host: list[int] | None = None,
    window_left: int | None = None,
    _tuning: _ExtendTuning | None = None,
) -> torch.Tensor:
    """Attention of a step's new tokens over their cached prefix plus themselves (causal), each
    row over codes below its sealed boundary page and exact tokens from it on (module docstring).

    Args:
        q: ``[T, Hq, D]`` post-RoPE queries of the new tokens of all requests, concatenated.
        k, v: ``[T, H, D]`` their keys/values (un-rotated; bf16 or fp16 on CUDA).
        qo_indptr: ``[B + 1]`` int32, request b's new tokens are rows ``qo_indptr[b]:qo_indptr[b+1]``.
        layer: the layer's pool (`PagedLayer`), as in ``oscar_decode_attention``.
        kv_indptr, kv_page_indices: int32, request b's pages ``kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]``,
            oldest first: at least the ``cdiv(prefix_lens[b], P)`` prefix pages and, with ``position``,
            the ``(prefix_lens[b] + n_new - 1) // P`` pages below its last token's page.
        prefix_lens: ``[B]`` int32 cached tokens before the new ones. Pages below a row's boundary are
            sealed (packed); a partial last prefix page is open (staging).
        sm_scale: the softmax scale.
        q_rot: ``[T, Hq, D]`` fp32 rotated queries (e.g. from ``oscar_write_kv``); computed when None.
        max_new_tokens: the largest new-token count of a request; read from ``qo_indptr`` (a host
            synchronization) when None.
        out: ``[T, Hq, D]`` destination, dtype of q when allocated here.
        position: the boundary by position (True) or by the prefix's end (False), module docstring.
        kv_indptr_host: ``kv_indptr`` as a host list, when the caller has it: read (a host
            synchronization otherwise) only when the batch's pages pass the dequantize scratch
            budget and the batch is split (``scratch_groups``).
        window_left: a sliding-window layer (SGLang's ``RadixAttention.sliding_window_size``): the
            row at position x sees positions ``x - window_left .. x`` only; tiles below every row's
            window are neither dequantized nor read. None or negative: every position.
        _tuning: tests and benchmarks only: an ``_ExtendTuning`` instead of ``_default_tuning``'s.
    """
    t, hq, d, h, p, _ = check_attention_inputs(q, layer, rows="T")
    if k.shape != (t, h, d) or v.shape != (t, h, d) or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError(f"k and v must be [T={t}, H={h}, D={d}] contiguous along D")
    if k.dtype != v.dtype:
        raise TypeError("k and v must share a dtype")
    check_int32(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices, prefix_lens=prefix_lens)
    rotate = rotation_arguments(d, layer.rotation)  # ValueError unless head_dim is a power of two
    window = check_window(window_left)
    b = prefix_lens.shape[0]
    if qo_indptr.shape != (b + 1,):
        raise ValueError(f"qo_indptr must be [B + 1] = [{b + 1}], got {tuple(qo_indptr.shape)}")
    tune = _default_tuning(hq, h, d) if _tuning is None else _tuning
    gp = triton.next_power_of_2(hq // h)
    if tune.block_m is not None and (tune.block_m % gp or tune.block_m < 16 or tune.block_m & (tune.block_m - 1)):
        raise ValueError(f"block_m={tune.block_m} must be a power of two >= 16 and a multiple of {gp} (GQA group)")
    check_sealed_tile(tune.block_n or 32, page_size=p, k_group=layer.k_group)  # (the automatic 64 divides p)
    if q_rot is None:
        q_rot = oscar_rotate_q(q=q, rotation=layer.rotation, key_rotated=layer.key_rotated)
    else:
        check_fp32_buffer("q_rot", q_rot, (t, hq, d))
    if out is None:
        out = torch.empty_like(q)
    if max_new_tokens is None:
        max_new_tokens = int((qo_indptr[1:] - qo_indptr[:-1]).max().item()) if b else 0
    if t == 0 or b == 0 or max_new_tokens == 0:
        return out
    pool = pool_arguments(layer)
    n_pages = kv_page_indices.shape[0]
    page_bytes = dequantize_scratch_bytes(1, h, p, d)
    if tune.dequantize is False or n_pages == 0:
        groups = [(0, b, False)]
    elif tune.dequantize or n_pages * page_bytes <= DEQUANTIZE_SCRATCH_BYTES:
        groups = [(0, b, True)]
    else:
        groups = scratch_groups(kv_indptr_host if kv_indptr_host is not None else kv_indptr.tolist(),
                                DEQUANTIZE_SCRATCH_BYTES // page_bytes)
    host = kv_indptr_host if len(groups) > 1 and kv_indptr_host is not None else None
    if len(groups) > 1 and host is None:
        host = kv_indptr.tolist()
    scratch = None
    deq_n = min(p, 32)  # the dequantize launch's tiles: within one key group
    for g0, g1, dequantize in groups:
        if len(groups) == 1:
            kv_ind, pages, pre_g, qo_g = kv_indptr, kv_page_indices, prefix_lens, qo_indptr
        else:  # the group's slices; qo_indptr stays absolute (rows of q / out)
            kv_ind = kv_indptr[g0:g1 + 1] - host[g0]
            pages = kv_page_indices[host[g0]:host[g1]]
            pre_g, qo_g = prefix_lens[g0:g1], qo_indptr[g0:g1 + 1]
        n_g = pages.shape[0]
        dequantize = dequantize and n_g > 0
        if dequantize:
            if scratch is None:
                most = n_pages if len(groups) == 1 else max(host[e] - host[f] for f, e, dq in groups if dq)
                scratch = torch.empty((2, most, h, p, d), dtype=torch.float16, device=q.device)
            sk, sv = scratch[0], scratch[1]
            check_sealed_tile(deq_n, page_size=p, k_group=layer.k_group)
            _dequantize_kernel[(n_g, h, p // deq_n)](
                pool=pool["pool"], qo_indptr_ptr=qo_g, kv_indptr_ptr=kv_ind, page_idx_ptr=pages,
                prefix_lens_ptr=pre_g, sk_ptr=sk, sv_ptr=sv, B=g1 - g0, window_left=window if window is not None else 0,
                search_steps=max(1, (g1 - g0).bit_length()),
                **{k_: pool[k_] for k_ in ("H", "D", "P", "BITS", "G_K", "G_V", "KEY_PAGE")}, BLOCK_N=deq_n,
                POSITION=bool(position), USE_ASM=use_asm(q.device),
                WINDOW=window is not None,
            )  # fmt: skip
        else:
            sk = sv = q_rot  # not read
        block_m, num_warps, block_n = _launch_shape(tune, dequantize, gp, d, p)
        extra = {} if tune.num_stages is None else {"num_stages": tune.num_stages}
        _extend_kernel[(g1 - g0, h, triton.cdiv(max_new_tokens, block_m // gp))](
            # the new tokens, the output, the layer's pool and the requests' pages
            q_ptr=q, qrot_ptr=q_rot, k_ptr=k, v_ptr=v, o_ptr=out, **pool,
            qo_indptr_ptr=qo_g, kv_indptr_ptr=kv_ind, page_idx_ptr=pages, prefix_lens_ptr=pre_g,
            sk_ptr=sk, sv_ptr=sv, sm_scale_log2=sm_scale * math.log2(math.e), window_left=window if window is not None else 0,
            strides=(q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1)),
            **rotate, GROUP=hq // h, POSITION=bool(position), DEQUANTIZED=bool(dequantize),
            # how it runs (_ExtendTuning)
            BLOCK_M=block_m, GP=gp, BLOCK_N=block_n, INTERPRET=interpreting(), USE_ASM=use_asm(q.device),
            WINDOW=window is not None, num_warps=num_warps, **extra,
        )  # fmt: skip
    return out


def warm_up_extend(*, layer: PagedLayer, num_q_heads: int, dtype: torch.dtype, position: bool = True,
                   window_left: int | None = None) -> None:
    """Compile the launches `oscar_extend_attention` can make for ``layer``'s format before a
    request needs them: one request, one new token over one sealed page (page 0, which SGLang
    never allocates), its pages read pre-dequantized and in registers. Nothing of the pool is
    written (the output and the scratch are this call's own). With the batch values kept out of
    the compile key (`unspecialized`), these are every variant a server step of this layer runs."""
    h, p, d = layer.k_codes.shape[1], layer.k_codes.shape[2], layer.staging_k.shape[3]
    dev = layer.k_codes.device
    q = torch.zeros(1, num_q_heads, d, dtype=dtype, device=dev)
    k = torch.zeros(1, h, d, dtype=dtype, device=dev)
    v = torch.zeros(1, h, d, dtype=dtype, device=dev)

    def i32(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int32).to(dev)

    for dequantize in (True, False):
        oscar_extend_attention(q=q, k=k, v=v, qo_indptr=i32([0, 1]), layer=layer, kv_indptr=i32([0, 1]),
                               kv_page_indices=i32([0]), prefix_lens=i32([p]), sm_scale=1.0, max_new_tokens=1,
                               position=position, kv_indptr_host=[0, 1], window_left=window_left,
                               _tuning=_ExtendTuning(dequantize=dequantize))
