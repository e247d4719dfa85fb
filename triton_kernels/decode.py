"""Decode attention over the OScaR paged pool: split-KV flash-decoding, INT2/INT4 in one kernel.

Stage 1, grid ``(B, H, num_splits + 1)``: program ``(b, h, s)`` takes the GQA query heads of KV
head ``h`` of request ``b``. Splits ``s < num_splits`` share the request's sealed pages (all pages
but the last), ``BLOCK_N`` tokens per step: codes and fp16 params are read, keys and values
dequantized in registers straight into tensor-core operands, logits multiplied by s_t. Split
``num_splits`` takes the request's last page: BF16 from staging when the page is open (the usual
case), the packed path otherwise. Each program writes its normalized partial output and log-sum-exp.
Two stage-1 forms, chosen by ``_default_tuning`` (the launcher's one tuning table):

- ``transposed`` (head_dim <= 128): the tokens are the M side of both products (``S^T = K Q^T``,
  ``O^T += V^T P^T``) and the query heads the N side, padded to 8 (Llama's GQA group of 4 fills half
  of an MMA instead of a quarter), and the loads of the next tile are issued before the current
  tile's math (register double buffering, page ids one tile further ahead).
- plain (larger head dims): the query heads are the rows, padded to 16, and Triton's software
  pipeliner handles the loop.

With few splits the merge runs inside stage 1 (the last program of a (request, head) to finish:
log-sum-exp merge, then the inverse rotation, ``H_D`` being its own inverse). Otherwise every
stage-1 program rotates its partial back and stage 2, grid ``(B, Hq, D / 32)``, is a channel-parallel
log-sum-exp weighted sum of the ``num_splits + 1`` partials, written in the query dtype.

Everything happens in the rotated basis; sequence lengths are read on the device (never
compile-time constants, no host synchronization), the grid depends only on the batch size and
``num_splits``: a launch can be captured in a CUDA graph and replayed for any lengths.

Assumption (guaranteed by the runtime, which seals a page as soon as it fills): every page of a
request but its last is sealed when decode runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from . import gluon_decode
from .common import (PagedLayer, attend_raw, channel_of, check_attention_inputs, check_fp32_buffer, check_int32, check_sealed_tile, check_staging, check_window, fwht_rows,
                     interpreting, key_mask_arguments, key_rows_rotated, named_pool_arguments, pool_arguments, rotation_arguments, sealed_tile, staging_tile, store_rotated_rows, tile_raw, to_bf16_rne,
                     unspecialized, use_asm, write_token)
from .write import oscar_rotate_q, oscar_write_kv

try:  # Grid dependency control (sm_90+): the separate merge launch as a programmatic dependent of stage 1
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without it: the launcher never sets merge_pdl (``merge_pdl_reason``)
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def merge_partials(part_o_ptr, part_lse_ptr, base, m_rows, n_part, d0, ROWS: tl.constexpr, D: tl.constexpr, DB: tl.constexpr,
                   CHUNK: tl.constexpr):
    """Log-sum-exp merge of the ``n_part`` partials of ``ROWS`` query heads (partial ``j`` of row
    ``r`` at index ``base[r] + j``, rows of ``D`` floats), channels ``[d0, d0 + DB)``, CHUNK partials
    per block load -> ``[ROWS, DB]`` fp32.

    Loads bypass L1 (``.cg``): in the fused merge the partials were written by other programs."""
    o_d = d0 + tl.arange(0, DB)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DB], tl.float32)
    for s0 in range(0, n_part, CHUNK):
        o_s = s0 + tl.arange(0, CHUNK)
        m_s = m_rows[:, None] & (o_s < n_part)[None, :]
        o_p = base[:, None] + o_s[None, :]
        b_lse = tl.load(part_lse_ptr + o_p, mask=m_s, other=float("-inf"), cache_modifier=".cg")
        b_o = tl.load(part_o_ptr + o_p[:, :, None] * D + o_d[None, None, :], mask=m_s[:, :, None], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(b_lse, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_ref)
        w = tl.exp2(b_lse - m_ref[:, None])  # empty splits (lse = -inf) weigh 0
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * b_o, axis=1)
        l = l * alpha + tl.sum(w, axis=1)
        m = m_new
    return acc / tl.where(l > 0.0, l, 1.0)[:, None]


@triton.jit
def load_queries(qrot_ptr, o_q, m_r, o_c, TRANS: tl.constexpr):
    """Rotated fp32 queries of the rows at offsets ``o_q`` (masked by ``m_r``), channels in the
    order ``o_c``: ``[rows, D]``, or ``[D, rows]`` for the transposed tiles."""
    if TRANS:
        return tl.load(qrot_ptr + o_q[None, :] + o_c[:, None], mask=m_r[None, :], other=0.0)
    else:
        return tl.load(qrot_ptr + o_q[:, None] + o_c[None, :], mask=m_r[:, None], other=0.0)


@triton.jit
def _decode_stage1_kernel(
    qrot_ptr, pool, kv_indptr_ptr, page_idx_ptr, seq_lens_ptr, part_o_ptr, part_lse_ptr,
    q_ptr, new_k_ptr, new_v_ptr, new_loc_ptr, stg_scale_ptr, counter_ptr, out_ptr, krot_ptr,
    strides,  # (q, new_k, new_v, out) x (request, head)
    sm_scale_log2, window_left,
    H: tl.constexpr, D: tl.constexpr, P: tl.constexpr, S: tl.constexpr, BITS: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr,
    ROTATE: tl.constexpr, LOG2D: tl.constexpr, INV_SQRT_D: tl.constexpr, KEY_MASK: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_HK: tl.constexpr, CHUNK: tl.constexpr,
    USE_ASM: tl.constexpr, INTERPRET: tl.constexpr, ROT_Q: tl.constexpr, WRITE: tl.constexpr, MERGE: tl.constexpr,
    TRANS: tl.constexpr, WINDOW: tl.constexpr, KEY_PAGE: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr = False,
    SPREAD: tl.constexpr = 0, long_min=0, part_stride=0, DUAL: tl.constexpr = False,
):
    # LAUNCH_DEPENDENTS: the merge launch after this one is a programmatic dependent launch
    # (``_DecodeTuning.merge_pdl``): it may be scheduled at once, and waits for this whole launch.
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    # DUAL (``_DecodeTuning.long_gluon``): this launch takes the requests shorter than ``long_min``
    # tokens only; a longer request's programs leave at once (the Gluon launch after this one, its
    # programmatic dependent, takes it: its programs may start as soon as these have left). The
    # partials' rows then hold ``part_stride`` partials (the Gluon launch's count), this launch's first.
    if DUAL:
        tl.static_assert(not MERGE, "DUAL: the merge is a launch of its own")
        if tl.load(seq_lens_ptr + tl.program_id(0)) >= long_min:
            return
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh = strides
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_s = tl.program_id(2)
    n_split = tl.num_programs(2) - 1
    HQ: tl.constexpr = H * GROUP
    TPP: tl.constexpr = P // BLOCK_N

    o_r = tl.arange(0, BLOCK_H)
    m_r = o_r < GROUP
    o_hq = i_h * GROUP + o_r
    o_d = tl.arange(0, D)
    if S > 1:
        s_col = i_h
    else:
        s_col = 0

    o_g = tl.arange(0, BLOCK_G)
    m_g = o_g < GROUP
    if ROT_Q:
        # The query rotation, fused: every program of (b, h) rotates the GROUP query heads of KV head
        # h (identical values, so the concurrent stores of the splits agree) and re-reads them below
        # in the order the sealed tiles want. KEY_MASK: rotated only if head h's keys are.
        if KEY_MASK:
            r_g = key_rows_rotated(krot_ptr, i_h + o_g * 0, m_g)
        else:
            r_g = m_g
        store_rotated_rows(q_ptr, qrot_ptr, i_b, stride_qb, stride_qh, i_h * GROUP + o_g, m_g, HQ, BLOCK_G, D, LOG2D, ROTATE, INV_SQRT_D,
                           KEY_MASK, r_g)
    if WRITE:
        if i_s == n_split:
            # The write path, fused into the program that reads the open page: rotate the new
            # token's K/V of head h, store them BF16 into its staging slot, and its s_t.
            write_token(new_k_ptr, new_v_ptr, new_loc_ptr, pool[7], pool[5], pool[6], stg_scale_ptr,
                        i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh,
                        H, BLOCK_HK, D, LOG2D, P, S, ROTATE, INV_SQRT_D, krot_ptr, KEY_MASK)  # fmt: skip
    if ROT_Q or WRITE:
        tl.debug_barrier()  # this program's stores above are read back below

    seq_len = tl.load(seq_lens_ptr + i_b)
    kv_start = tl.load(kv_indptr_ptr + i_b).to(tl.int64)
    n_pages = tl.cdiv(seq_len, P)
    # WINDOW (a sliding-window layer): the query sees positions lo .. seq_len - 1 only; the sealed
    # tiles below lo's tile are skipped, and the tokens below lo of the tile holding it masked.
    if WINDOW:
        lo = tl.maximum(seq_len - 1 - window_left, 0)
    else:
        lo = 0
    # SPREAD (``_DecodeTuning.spread_open``; no window): where the sealed programs hold at most SPREAD
    # sealed tiles each and the request's last page is open, its BF16 tiles before the new token's
    # (the last) are taken by the last sealed programs, one each, and the open-page program reads the
    # last tile only: a short request's step is then not the open-page program's tile after tile.
    # Every program decides alike from the request's length (one CUDA graph serves every length).
    n_spread = 0
    if SPREAD > 0:
        tl.static_assert(not WINDOW, "SPREAD: not with a sliding window")
        n_before = (seq_len - (n_pages - 1) * P - 1) // BLOCK_T  # open tiles before the new token's
        per_l = tl.cdiv((n_pages - 1) * TPP, n_split)
        short = (per_l <= SPREAD) & (n_before <= n_split)
        # The last page's staging slot, read only where the request is short: a long request's
        # programs start their sealed tiles without these two dependent loads.
        last = tl.load(page_idx_ptr + kv_start + n_pages - 1, mask=short, other=0).to(tl.int64)
        stg_l = tl.load(pool[7] + last, mask=short, other=-1)
        n_spread = tl.where(short & (stg_l >= 0), n_before, 0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    if TRANS:
        acc = tl.zeros([D, BLOCK_H], tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, D], tl.float32)
    o_q = (i_b * HQ + o_hq) * D
    if i_s < n_split:
        # Sealed pages [0, n_pages - 1) (from lo's tile on), split evenly by tiles of BLOCK_N tokens.
        n_tiles = (n_pages - 1) * TPP
        t_first = lo // BLOCK_N
        per = tl.cdiv(tl.maximum(n_tiles - t_first, 0), n_split)
        t_lo = t_first + i_s * per
        t_hi = tl.minimum(t_lo + per, n_tiles)
        b_q = load_queries(qrot_ptr, o_q, m_r, channel_of(o_d, BITS), TRANS).to(tl.float16)
        if TRANS:
            # Register double buffering: the loads of tile it + 1 are issued before tile it is
            # computed (page ids one tile further ahead), so every tile's HBM latency overlaps the
            # previous tile's math. (Triton's pipeliner single-buffers these page-indirect loads.)
            pg_idx = page_idx_ptr + kv_start
            page = tl.load(pg_idx + t_lo // TPP, mask=t_lo < t_hi, other=0).to(tl.int64)
            page_n = tl.load(pg_idx + (t_lo + 1) // TPP, mask=t_lo + 1 < t_hi, other=0).to(tl.int64)
            kp, kw, st, vp, vw = tile_raw(page, (t_lo % TPP) * BLOCK_N, i_h, s_col, t_lo < t_hi, pool,
                                          H, D, BITS, P, G_K, G_V, S, BLOCK_N, KEY_PAGE)
            for it in tl.range(t_lo, t_hi, num_stages=1):
                page_nn = tl.load(pg_idx + (it + 2) // TPP, mask=it + 2 < t_hi, other=0).to(tl.int64)
                kp_n, kw_n, st_n, vp_n, vw_n = tile_raw(
                    page_n, ((it + 1) % TPP) * BLOCK_N, i_h, s_col, it + 1 < t_hi, pool,
                    H, D, BITS, P, G_K, G_V, S, BLOCK_N, KEY_PAGE,
                )  # fmt: skip
                kv_ok = None  # (the window's tokens of the tile; a compile-time None without WINDOW)
                if WINDOW:
                    kv_ok = it * BLOCK_N + tl.arange(0, BLOCK_N) >= lo
                m_i, l_i, acc = attend_raw(b_q, kp, kw, st, vp, vw, m_i, l_i, acc, sm_scale_log2,
                                           D, BITS, G_K, G_V, BLOCK_N, USE_ASM, TRANS, None, kv_ok, KEY_PAGE)  # fmt: skip
                kp, kw, st, vp, vw = kp_n, kw_n, st_n, vp_n, vw_n
                page_n = page_nn
        else:
            for it in range(t_lo, t_hi):
                page = tl.load(page_idx_ptr + kv_start + it // TPP).to(tl.int64)
                kv_ok = None
                if WINDOW:
                    kv_ok = (it * BLOCK_N + tl.arange(0, BLOCK_N) >= lo)[None, :]
                m_i, l_i, acc = sealed_tile(
                    b_q, page, (it % TPP) * BLOCK_N, i_h, s_col, m_i, l_i, acc,
                    pool, sm_scale_log2,
                    H, D, BITS, P, G_K, G_V, S, BLOCK_N, USE_ASM, False, None, kv_ok, KEY_PAGE,
                )  # fmt: skip
        if SPREAD > 0:
            if i_s >= n_split - n_spread:  # open tile n_split - 1 - i_s of the last page (SPREAD)
                b_qs = to_bf16_rne(load_queries(qrot_ptr, o_q, m_r, o_d, TRANS))
                m_i, l_i, acc = staging_tile(
                    b_qs, stg_l.to(tl.int64), i_h, (n_split - 1 - i_s) * BLOCK_T, seq_len - (n_pages - 1) * P, m_i, l_i, acc,
                    pool, sm_scale_log2, H, D, P, BLOCK_T, not INTERPRET, TRANS, None, None,
                )  # fmt: skip
    else:
        page = tl.load(page_idx_ptr + kv_start + n_pages - 1).to(tl.int64)
        stg = tl.load(pool[7] + page).to(tl.int64)
        t_min = tl.maximum(lo - (n_pages - 1) * P, 0)  # the first token of the page in the window
        if stg >= 0:
            n_valid = seq_len - (n_pages - 1) * P
            b_qb = to_bf16_rne(load_queries(qrot_ptr, o_q, m_r, o_d, TRANS))
            kv_lo = None
            t_start = n_spread * BLOCK_T  # SPREAD: the earlier tiles are the sealed programs'
            if WINDOW:
                kv_lo = t_min
                t_start = t_min // BLOCK_T * BLOCK_T
            for t0 in tl.range(t_start, n_valid, BLOCK_T, num_stages=1):
                m_i, l_i, acc = staging_tile(
                    b_qb, stg, i_h, t0, n_valid, m_i, l_i, acc,
                    pool, sm_scale_log2, H, D, P, BLOCK_T, not INTERPRET, TRANS, None, kv_lo,
                )  # fmt: skip
        else:
            b_q = load_queries(qrot_ptr, o_q, m_r, channel_of(o_d, BITS), TRANS).to(tl.float16)
            t_start = 0
            if WINDOW:
                t_start = t_min // BLOCK_N * BLOCK_N
            for t0 in tl.range(t_start, P, BLOCK_N, num_stages=1):
                kv_ok = None
                if WINDOW:
                    kv_ok = t0 + tl.arange(0, BLOCK_N) >= t_min
                    if not TRANS:
                        kv_ok = kv_ok[None, :]
                m_i, l_i, acc = sealed_tile(
                    b_q, page, t0, i_h, s_col, m_i, l_i, acc,
                    pool, sm_scale_log2,
                    H, D, BITS, P, G_K, G_V, S, BLOCK_N, USE_ASM, TRANS, None, kv_ok, KEY_PAGE,
                )  # fmt: skip

    # Empty split (short request): lse = -inf and a zero partial, which stage 2 weighs by 0.
    has = l_i > 0.0
    b_lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if DUAL:
        o_part = (i_b * HQ + o_hq) * part_stride + i_s
    else:
        o_part = (i_b * HQ + o_hq) * (n_split + 1) + i_s
    if TRANS:
        b_o = acc / tl.where(has, l_i, 1.0)[None, :]
        if ROTATE and not MERGE:
            # The merge launch will be a weighted sum only (channel-parallel): the inverse rotation
            # is linear, so it is applied to each partial here.
            b_o = fwht_rows(tl.trans(b_o), BLOCK_H, D, LOG2D) * INV_SQRT_D
            tl.store(part_o_ptr + o_part[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
        else:
            tl.store(part_o_ptr + o_part[None, :] * D + o_d[:, None], b_o, mask=m_r[None, :])
    else:
        b_o = acc / tl.where(has, l_i, 1.0)[:, None]
        if ROTATE and not MERGE:
            b_o = fwht_rows(b_o, BLOCK_H, D, LOG2D) * INV_SQRT_D
        tl.store(part_o_ptr + o_part[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
    tl.store(part_lse_ptr + o_part, b_lse, mask=m_r)
    if MERGE:
        # The merge, fused: the last of the n_split + 1 programs of (b, h) to finish merges all
        # partials (a release/acquire counter; the barrier makes every thread's partial stores part
        # of the release) and resets the counter for the next launch (CUDA-graph replays included).
        tl.debug_barrier()
        o_cnt = counter_ptr + i_b * H + i_h
        arrived = tl.atomic_add(o_cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == n_split:
            base = (i_b * HQ + i_h * GROUP + o_g) * (n_split + 1)
            b_out = merge_partials(part_o_ptr, part_lse_ptr, base, m_g, n_split + 1, 0, BLOCK_G, D, D, CHUNK)
            if ROTATE:
                b_out = fwht_rows(b_out, BLOCK_G, D, LOG2D) * INV_SQRT_D
            p_out = out_ptr + i_b * stride_ob + (i_h * GROUP + o_g)[:, None] * stride_oh + o_d[None, :]
            tl.store(p_out, b_out.to(out_ptr.dtype.element_ty), mask=m_g[:, None])
            tl.atomic_xchg(o_cnt, 0, sem="relaxed", scope="gpu")


@triton.jit(**unspecialized("n_part"))
def _decode_stage2_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    n_part,
    stride_ob,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
    DB: tl.constexpr,
    CHUNK: tl.constexpr,
    ROTATE: tl.constexpr = False,
    LOG2D: tl.constexpr = 0,
    INV_SQRT_D: tl.constexpr = 1.0,
    PDL: tl.constexpr = False,
    ONE_PASS: tl.constexpr = 0,
    seq_lens_ptr=None,
    long_min=0,
    n_short=0,
    DUAL: tl.constexpr = False,
):
    # The unfused merge (``fused_merge`` off), grid (B, Hq, D / DB): one program per (request,
    # query head, DB channels), a weighted sum of partials that stage 1 already rotated back.
    # ROTATE (DB == D; the Gluon stage 1, whose partials stay in the rotated basis): the inverse
    # rotation after the weighted sum. PDL: launched as a programmatic dependent of stage 1
    # (``merge_pdl``): griddepcontrol.wait returns once all of stage 1 has run and its stores are visible.
    if PDL:
        gdc_wait()
    i_b = tl.program_id(0).to(tl.int64)
    i_hq = tl.program_id(1).to(tl.int64)
    d0 = tl.program_id(2) * DB
    n_valid = n_part
    if DUAL:
        # ``_DecodeTuning.long_gluon``: rows of ``n_part`` partials, of which a request shorter than
        # ``long_min`` tokens has the Triton stage 1's first ``n_short``, a longer one all (the Gluon
        # stage 1's)
        n_valid = tl.where(tl.load(seq_lens_ptr + i_b) >= long_min, n_part, n_short)
    if ONE_PASS > 0:
        # ``_DecodeTuning.merge_one_pass``: every partial's log-sum-exp in one load, then the partial
        # outputs of the splits that hold any (empty splits' rows are not read: a short request's
        # many empty splits cost no memory traffic), all rows of the block in one load: one round
        # trip for each instead of one per CHUNK of partials.
        row = (i_b * HQ + i_hq) * n_part
        o_s = tl.arange(0, ONE_PASS)
        m_s = o_s < n_valid
        b_lse = tl.load(part_lse_ptr + row + o_s, mask=m_s, other=float("-inf"))
        m = tl.max(b_lse, axis=0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(b_lse - m_ref)  # empty splits (lse = -inf) weigh 0
        o_d = d0 + tl.arange(0, DB)
        b_o = tl.load(part_o_ptr + (row + o_s)[:, None] * D + o_d[None, :], mask=(w > 0.0)[:, None], other=0.0)
        l = tl.sum(w, axis=0)
        b_out = (tl.sum(w[:, None] * b_o, axis=0) / tl.where(l > 0.0, l, 1.0))[None, :]
    else:
        base = (i_b * HQ + i_hq) * n_part + tl.arange(0, 1)
        b_out = merge_partials(part_o_ptr, part_lse_ptr, base, base >= 0, n_valid, d0, 1, D, DB, CHUNK)
    if ROTATE:
        b_out = fwht_rows(b_out, 1, D, LOG2D) * INV_SQRT_D
    p_out = out_ptr + i_b * stride_ob + i_hq * stride_oh + (d0 + tl.arange(0, DB))[None, :]
    tl.store(p_out, b_out.to(out_ptr.dtype.element_ty))


#: The most partials per (request, query head) ``merge_launch(one_pass=True)`` takes in one load
#: (a block of this many rows of 32 channels per program); more keep the chunked merge.
ONE_PASS_MAX_PARTS = 256


def merge_launch(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, rotation: bool = False,
                 pdl: bool = False, one_pass: bool = False,
                 dual: tuple[torch.Tensor, int, int] | None = None) -> None:
    """The separate merge launch over stage 1's partials ``[B, Hq, n, D]``: rotated back already,
    or in the rotated basis with ``rotation`` (the Gluon stage 1; one program per query head then).
    ``pdl``: a programmatic dependent launch of the stage 1 launched just before it, which must have
    been launched with its dependents allowed (``_DecodeTuning.merge_pdl``; sm_90+, not in the
    interpreter). ``one_pass`` (``_DecodeTuning.merge_one_pass``; not with ``rotation``, at most
    ``ONE_PASS_MAX_PARTS`` partials): all log-sum-exps in one load, then the non-empty partials' rows
    in one load, instead of one round trip per chunk of partials. ``dual`` (``_DecodeTuning.long_gluon``:
    ``(seq_lens, long_min, n_short)``): a request shorter than ``long_min`` tokens has ``n_short``
    partials per row (the Triton stage 1's, the first of each row), a
    longer one ``part_o.shape[2]`` (the Gluon stage 1's); rows of ``part_o.shape[2]`` either way."""
    b, hq, n_part, d = part_o.shape
    if dual is not None and (rotation or not 1 <= dual[2] <= n_part):
        raise ValueError(f"merge_launch(dual=...): not with the rotated-basis merge, and 1 <= n_short <= {n_part} "
                         f"(got rotation={rotation}, n_short={dual[2]})")
    db = d if rotation else min(d, 32)
    rotate = rotation_arguments(d, True) if rotation else {}
    if one_pass and (rotation or n_part > ONE_PASS_MAX_PARTS):
        raise ValueError(f"merge_one_pass: not with the rotated-basis merge (rotation={rotation}) nor over more than "
                         f"{ONE_PASS_MAX_PARTS} partials (got {n_part})")
    _decode_stage2_kernel[(b, hq, d // db)](
        part_o_ptr=part_o,
        part_lse_ptr=part_lse,
        out_ptr=out,
        n_part=n_part,
        stride_ob=out.stride(0),
        stride_oh=out.stride(1),
        HQ=hq,
        D=d,
        DB=db,
        CHUNK=min(64, triton.next_power_of_2(n_part)) if not rotation else min(64, max(1, 4096 // d), triton.next_power_of_2(n_part)),
        num_warps=2,
        **rotate,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
        **({"ONE_PASS": max(16, triton.next_power_of_2(n_part))} if one_pass else {}),
        **({"seq_lens_ptr": dual[0], "long_min": int(dual[1]), "n_short": int(dual[2]), "DUAL": True} if dual else {}),
    )


#: Sealed-split programs of the tuned one-warp stage 1 resident on one SM at once (~240 registers
#: each), and the most waves of them `pick_num_splits(waves=None)` spreads a launch over.
RESIDENT_PROGRAMS_PER_SM = 8
BALANCED_MAX_WAVES = 4.0


def pick_num_splits(batch: int, num_kv_heads: int, num_sms: int | None = None, waves: float | None = 4.0,
                    max_splits: int = 128, resident: int = RESIDENT_PROGRAMS_PER_SM, fit: bool = False) -> int:
    """Sealed-page splits per (request, KV head).

    ``fit`` (``waves`` then unused): the most splits whose ``splits + 1`` programs per pair fit the
    SMs' ``resident`` slots in one wave, at least 1: for a Gluon variant whose open-page program takes
    an equal share of the sealed tiles (``GluonVariant.open_share``; the default takes it where
    ``gluon_share_rule`` says so; ``bench_decode.py --gluon-fit`` times it, kernels_gluon_s27, s32).

    ``waves`` a number: about ``waves`` programs per SM in all, the open-page program of each
    (request, head) included (``splits + 1`` programs per pair). ``waves`` None (balanced): the
    ``pairs * splits`` sealed-split programs fill the SMs' ``resident`` slots (the programs of the
    stage 1 an SM holds at once: `RESIDENT_PROGRAMS_PER_SM` for the Triton one, `GLUON_RESIDENT`
    for the Gluon default) in whole waves: the smallest split count whose last wave is at least
    95 % full (``ceil(w) / w <= 1.05``, ``w`` the waves), else the fullest within
    `BALANCED_MAX_WAVES` waves. Measured on an H200 (Llama
    shapes, benches/results/kernels_splits_8f465df/splits.md): 8 programs per SM gave one split from
    528 pairs on, so 67-72 requests of 32K tokens at 8 KV heads ran one half-empty wave, 1.85x the
    time of 64 requests; the balanced count (7) runs them 1.6x faster, 96 requests of 16K 1.3x
    faster (4), and keeps 512, 1024 and 2048 pairs at their old count.

    Depends on the batch size only (never on lengths), so one CUDA graph per batch size serves
    every length. Without a GPU (the kernels then run in Triton's interpreter, tests only) it counts
    8 "SMs": every split is a program the interpreter runs one after the other.
    """
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 8
    pairs = max(1, batch * num_kv_heads)
    if fit:
        return max(1, min(max_splits, num_sms * resident // pairs - 1))
    if waves is not None:
        want = int(num_sms * waves)
        return max(1, min(max_splits, -(-want // pairs) - 1))
    slots = num_sms * resident
    best, best_fill = 1, 0.0
    for s in range(1, max_splits + 1):
        w = pairs * s / slots
        if s > 1 and w > BALANCED_MAX_WAVES:
            break
        fill = w / math.ceil(w)  # how full the waves are on average
        if fill >= 1 / 1.05:
            return s
        if fill > best_fill + 1e-12:
            best, best_fill = s, fill
    return best


@dataclass(frozen=True)
class _DecodeTuning:
    """How one decode launch runs (never what it computes): ``_default_tuning``'s choice, or what a
    test or benchmark passes as ``oscar_decode_attention(_tuning=...)``.

    Attributes:
        block_n: tokens per sealed tile (a multiple of 16 dividing the page, nested with k_group).
        block_t: tokens per open-page (BF16 staging) tile.
        num_warps, num_stages, maxnreg: Triton launch options of stage 1 (maxnreg None: no cap).
        transposed: the tuned stage-1 form (tokens as the M side of both products, the query heads
            padded to 8 columns, the next tile's loads issued before the current tile's math);
            False: the query heads as rows padded to 16, the loop left to Triton's pipeliner.
        waves: programs per SM, turned into the split count by ``pick_num_splits``; None: the
            balanced split count (whole waves of resident programs, ``pick_num_splits(waves=None)``).
        num_splits: sealed-page splits per (request, KV head); None: the workspace's when one is
            given, else from ``waves``.
        fused_merge: merge the splits in the last stage-1 program of each (request, KV head) (one
            launch) or in a separate launch; None: fused when that takes at most two block loads per
            row (few splits, i.e. batches of 16+ requests at 8 KV heads); with many splits (small
            batches) the separate, wider merge launch is faster on an H200.
        gluon: stage 1 written in Gluon with explicit MMA operand layouts (``gluon_decode``): one
            warp, ``block_n`` / ``block_t`` / ``waves`` / ``num_splits`` as above, the other launch
            options ignored; the write with the query rotation (``oscar_write_kv``) and the merge
            with the inverse rotation are separate launches, except for the ``fused`` variants
            (the query rotation, the write and the partials' inverse rotation in the Gluon launch,
            then the plain merge: two launches, one with few splits). The default where
            ``gluon_default_reason`` finds nothing against it (sm_90 with Triton 3.6's Gluon,
            16-1024 (request, KV head) pairs (``GLUON_DEFAULT_PAIRS``), a format and shape the Gluon stage 1 reads):
            ``GLUON_DEFAULT_VARIANT``, measured on an H100 at 0.90-1.33x the fused Triton step
            there, 1K-64K tokens (benches/results/kernels_gluon_s25/). Elsewhere opt-in.
        resident: with ``waves`` None, the programs per SM the balanced split count fills in whole
            waves (``pick_num_splits(resident=...)``): the Triton stage 1's 8, the Gluon default's 16.
        gluon_variant: with ``gluon``, how its stage 1 streams tiles: a key of
            ``gluon_decode.GLUON_VARIANTS`` (register prefetch, cp.async rings, register caps).
        merge_chunk: partials per block load of the fused merge; None: as many as ~4K fp32 of
            the group's partial outputs hold, at most 8 (8 at GQA 4 and head_dim 64 or 128),
            whatever the split count, so that the batch sizes a server captures compile one fused
            and one separate-merge variant, not one per split count (``"splits"``: the next power
            of two of the split count, capped at ~4K fp32: the rule before session 18, for
            comparison). The fused merge runs when the partials fit two ~4K-fp32 loads, as before.
        fit: the split count whose ``splits + 1`` programs per pair fit one wave of ``resident``
            programs per SM (``pick_num_splits(fit=True)``; ``waves`` then unused): with a Gluon
            variant whose open-page program takes a share of the sealed tiles (``open_share``), where
            the launcher's rule takes one (``gluon_share_rule``).
        split_write: with a ``fused`` Gluon variant, the new token's write as its own launch
            (``oscar_write_kv``) before the Gluon stage 1, which keeps the query rotation, the
            partials' inverse rotation and the merge: the stage 1 compiled without the write's code
            (ptxas schedules its sealed-tile loop as in the launch without a write).
        split_rotation: with ``split_write``, the query rotation moves into the write launch too (the
            stage 1 then compiled without either).
        split_pdl: with ``split_write``, the stage 1 as a programmatic dependent launch (sm_90): it
            starts while the write's launch runs, and only its open-page programs wait for that
            launch's stores (``griddepcontrol.wait``); not with ``split_rotation`` (every program
            reads the rotated queries).
        merge_pdl: the separate merge launch (``fused_merge`` off, or a Gluon stage 1 with many splits)
            as a programmatic dependent launch of the stage 1 (sm_90+, ``merge_pdl_reason``): every
            stage-1 program lets it be scheduled at its start, and the merge waits
            (``griddepcontrol.wait``) until the whole stage 1 has run and its partials are visible,
            so only the launch's latency leaves the step. No effect where the merge is fused. The
            launcher's default with the Gluon stage 1 on sm_90+ (``MERGE_PDL``), not with the
            Triton one (single requests: measured slower).
        spread_open: the Triton stage 1 only, no sliding window: where every sealed program holds at
            most this many sealed tiles (short contexts) and the request's last page is open, the
            open page's BF16 tiles before the new token's are read by the last sealed programs, one
            tile each, and the open-page program reads the new token's tile only (decided on the
            device per request, so one CUDA graph serves every length); 0: off. A single request's
            step at 2K-8K tokens waits for the open-page program's tiles one after another (session
            36, ``step_kernels.py``). The launcher's default (``SPREAD_OPEN``) below the Gluon
            default's pairs (single requests at 8 KV heads), measured in session 37.
        merge_one_pass: the separate merge launch (not the rotated-basis one, at most
            ``ONE_PASS_MAX_PARTS`` partials) reads every partial's log-sum-exp in one load and then
            the rows of the splits that hold any in one more, where the chunked merge takes one round
            trip per 64 partials (a single request's 129 partials: three) and reads empty splits' rows
            too. None (the default): the launcher's rule, ``merge_one_pass_default`` (from
            ``MERGE_ONE_PASS_PARTS`` partials on); True / False force it on / off.
        long_gluon: the Triton stage 1 only (not ``gluon``), no sliding window: requests of at least
            this many tokens are taken by a Gluon stage 1 of their own (``long_variant`` at
            ``long_waves`` programs per SM), launched after the Triton one as its programmatic
            dependent; the Triton launch takes the shorter ones (decided on the device per request,
            so one CUDA graph serves every length; the programs of the requests a launch does not
            take leave at once), the separate merge then reads each request's partials at the
            count of the launch that took it (``merge_launch(dual=...)``). The workspace holds the
            larger of the two split counts (``tuning_num_splits``). 0: off. A single request has
            few (request, KV head) pairs, so only a split count much larger than the Triton stage
            1's fills the GPU with the Gluon program's registers, and at short contexts those many
            short programs lose to the Triton stage 1 (session 33, 42): this gives each length its
            faster stage 1, at a fixed price: the Gluon launch's whole grid runs on every step (H100,
            session 43: 0.88-0.94x the Triton step's time at (1, 131072), but 3.1-3.7 us more per step
            where it takes no request), so the launcher leaves it off (``LONG_GLUON_TOKENS``).
        long_variant: with ``long_gluon``, the Gluon variant (a ``fused`` one); "": the ``lane_fwht``
            form of the Gluon default for the pool's format (``GLUON_DEFAULT_VARIANT``,
            ``GLUON_DEFAULT_PAGE_VARIANT`` + "h": with this launch's code the plain paper-format form
            spills 16 bytes at its 128 registers, the lane form does not; sm_90 SASS).
        long_waves: with ``long_gluon``, the Gluon launch's programs per SM (its split count:
            ``pick_num_splits(waves=long_waves, max_splits=ONE_PASS_MAX_PARTS - 1)``) where the
            workspace does not set it.
    """

    block_n: int
    block_t: int
    num_warps: int
    transposed: bool
    waves: float | None
    num_stages: int = 3
    maxnreg: int | None = None
    num_splits: int | None = None
    fused_merge: bool | None = None
    gluon: bool = False
    gluon_variant: str = "regs1"
    resident: int = RESIDENT_PROGRAMS_PER_SM
    merge_chunk: int | str | None = None
    fit: bool = False
    split_write: bool = False
    split_rotation: bool = False
    split_pdl: bool = False
    merge_pdl: bool = False
    spread_open: int = 0
    merge_one_pass: bool | None = None
    long_gluon: int = 0
    long_variant: str = ""
    long_waves: float = 12.0


def tuning_num_splits(tune: _DecodeTuning, batch: int, num_kv_heads: int) -> int:
    """The split count a workspace for a launch of ``tune`` holds (``decode_workspace``): the stage
    1's (``pick_num_splits`` of its waves), or with ``long_gluon`` the larger of the Triton launch's
    and the long requests' Gluon launch's; a tuning whose ``num_splits`` is set holds that many (the
    launch takes them whatever the workspace, ``oscar_decode_attention``). Depends on the batch size
    only."""
    n = (tune.num_splits if tune.num_splits is not None
         else pick_num_splits(batch, num_kv_heads, waves=tune.waves, resident=tune.resident, fit=tune.fit))
    if tune.long_gluon:
        n = max(n, long_gluon_splits(tune, batch, num_kv_heads))
    return n


def long_gluon_splits(tune: _DecodeTuning, batch: int, num_kv_heads: int) -> int:
    """The split count of ``tune``'s long-request Gluon launch (``_DecodeTuning.long_waves``)."""
    return pick_num_splits(batch, num_kv_heads, waves=tune.long_waves, resident=GLUON_RESIDENT,
                           max_splits=ONE_PASS_MAX_PARTS - 1)


#: Whether the launcher runs a separate merge launch as a programmatic dependent of a Gluon stage 1
#: (``_DecodeTuning.merge_pdl``) where ``merge_pdl_reason`` allows it (sm_90+, not the interpreter).
#: H100, session 36, whole steps side by side (benches/results/kernels_gluon_s36/): the Gluon default
#: where its merge is a launch of its own (2-16 requests at 8 KV heads: 16-128 splits) INT2 0.2-1.4 %
#: less time (both formats), INT4 within -0.1 / +0.3 %; the Triton stage 1 of single requests (128
#: splits, one wave, so the merge's programs are resident from the start) 3.5-13.5 % MORE time (and
#: with the trigger after each program's stores instead, within -0.2 / +1.0 %): single requests keep
#: the plain merge launch.
MERGE_PDL = True


#: The Triton stage 1's ``_DecodeTuning.spread_open`` where the launcher runs it for fewer (request, KV
#: head) pairs than the Gluon default's least (``GLUON_DEFAULT_PAIRS``: single requests at 8 KV heads,
#: many splits, so short requests leave short sealed programs). H100, session 37, whole steps side by
#: side with 0, medians of 5 (benches/results/kernels_gluon_s37/): paper format INT2 / INT4 0.763 / 0.747
#: of the time at 2048 tokens, 0.845 / 0.893 at 8192, 0.993-1.004 at 32768-131072; the server's INT2
#: format (page-grid key ranges) 0.770 at 2048, 0.857 at 8192, 1.014 / 1.017 at 32768 / 131072 (the
#: kernel's code for it costs ~1.5 % there though it is not taken). 1 and 4 time as 2 up to 32768
#: tokens but for 1 at 8192 (not taken there).
SPREAD_OPEN = 2


#: The least partials per (request, query head) from which the launcher's separate merge runs in one
#: pass (``_DecodeTuning.merge_one_pass`` None: ``merge_one_pass_default``). H200, session 41, whole
#: decode steps side by side with the chunked merge, medians of 5 interleaved repeats
#: (benches/results/kernels_s41/): 129 partials (single requests, the Triton stage 1; 2 requests, Gluon)
#: 0.941-0.990 of the time in both formats and bit widths, 65 partials (4 requests) 0.988-0.990, 33
#: partials (8 requests) 0.999-1.002, 17 partials (16 requests) 0.999-1.015.
MERGE_ONE_PASS_PARTS = 64


def merge_one_pass_default(n_part: int, rotation: bool = False) -> bool:
    """Whether the launcher's separate merge over ``n_part`` partials per (request, query head) runs
    in one pass when the tuning leaves it open (``merge_one_pass`` None): from ``MERGE_ONE_PASS_PARTS``
    to ``ONE_PASS_MAX_PARTS`` partials, never the rotated-basis merge. Depends on the split count
    only (the batch size), so one CUDA graph per batch size still serves every length."""
    return not rotation and MERGE_ONE_PASS_PARTS <= n_part <= ONE_PASS_MAX_PARTS


def _one_pass(tune: "_DecodeTuning", part_o: torch.Tensor, rotation: bool = False) -> bool:
    """``tune.merge_one_pass``, or the launcher's rule where it is None."""
    if tune.merge_one_pass is None:
        return merge_one_pass_default(part_o.shape[2], rotation=rotation)
    return tune.merge_one_pass


def merge_pdl_reason(device: torch.device, capability: tuple[int, int] | None = None) -> str | None:
    """None when the separate merge launch can run as a programmatic dependent launch of the stage 1
    on ``device`` (``_DecodeTuning.merge_pdl``), else why not. ``capability``: the device's (tests;
    None: asked from ``device``)."""
    if gdc_wait is None or gdc_launch_dependents is None:
        return "this Triton has no grid dependency control (triton.language.extra.cuda.gdc_wait)"
    if interpreting():
        return "Triton's CPU interpreter runs launches one after another (no programmatic dependent launch)"
    if capability is None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return f"device {device}: programmatic dependent launch is a CUDA feature"
        capability = torch.cuda.get_device_capability(device)
    if capability[0] < 9:
        return f"sm_{capability[0]}{capability[1]}: programmatic dependent launch needs sm_90 or newer"
    return None


def _default_tuning(batch: int, num_kv_heads: int, head_dim: int, page_size: int) -> _DecodeTuning:
    """The decode configuration by launch size, from the H200 sweeps (benches/results/kernels_history.md).

    head_dim <= 128: one warp per program on 32-token tiles, the transposed form; ~16 programs per
    SM below 512 (request, KV head) pairs, balanced splits from 512 on (whole waves of the 8
    one-warp programs of ~240 registers an SM holds, ``pick_num_splits(waves=None)``); the Triton
    stage 1 with the write and the merge fused (``_launch_tuning`` puts the Gluon stage 1 in its
    place where ``gluon_default_reason`` allows, same splits). Larger head dims keep the first version's
    two warps on 64-token tiles and the plain form (not tuned on a GPU). The page size is a multiple
    of 32 (``oscar_sgl.supported``). Never depends on lengths: a launch replays in a CUDA graph."""
    block_t = min(page_size, 32 if head_dim <= 128 else 16)
    if head_dim <= 128:
        return _DecodeTuning(block_n=32, block_t=block_t, num_warps=1, transposed=True,
                             waves=16.0 if batch * num_kv_heads < 512 else None)
    return _DecodeTuning(block_n=min(page_size, 64), block_t=block_t, num_warps=2, transposed=False, waves=4.0)


def decode_num_splits(batch: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                      layer: PagedLayer | None = None, num_q_heads: int | None = None,
                      device: torch.device | None = None) -> int:
    """The sealed-page splits ``oscar_decode_attention`` runs a launch of this size with: what to
    size ``decode_workspace`` with when the caller keeps the workspace (CUDA graphs). Depends on the
    batch size, never on lengths. With ``layer``, ``num_q_heads`` and ``device`` (what the launch
    will get): the split count of the stage 1 the launcher picks for it (``_launch_tuning``: the
    Gluon default balances whole waves of its 16 resident programs per SM from 512 pairs on, the
    Triton one of 8); without them, the Triton stage 1's."""
    if layer is not None and num_q_heads is not None and device is not None:
        tune = _launch_tuning(batch, num_kv_heads, head_dim, page_size, group=num_q_heads // num_kv_heads,
                              bits=layer.bits, k_group=layer.k_group, v_group=layer.v_group,
                              key_page=layer.k_ranges is not None, device=torch.device(device))
    else:
        tune = _default_tuning(batch, num_kv_heads, head_dim, page_size)
    return tuning_num_splits(tune, batch, num_kv_heads)


#: The Gluon stage-1 variant the default decode runs where ``gluon_default_reason`` allows it: no
#: prefetch, 16-token open-page tiles loaded straight into the operand layouts and spread over the
#: sealed splits, the write, the query rotation and the partials' inverse rotation (and with few
#: splits the merge) in the launch, 128 registers (16 one-warp programs per SM); the running maximum
#: moved lazily, the key params paired from whole words and folded into the query and an
#: accumulator-input MMA (keys="mma"). Session 25 (H100, Triton 3.6, whole steps against the fused
#: Triton step, INT2 / INT4): 1.08x / 1.04x at (8, 4096), 1.17x / 1.10x at (16, 8192), 1.24x / 1.12x
#: at (8, 32768), 1.33x / 1.16x at (16, 65536), 1.15x / 1.07x at (64, 8192), against 1.06-1.19x /
#: 1.04-1.14x for session 21's "dnp_r128fs"; 0.94x / 0.90x at (32, 1024)
#: (benches/results/kernels_gluon_s25/). Since session 28 its lean INT2 form, "dnp_r128fslwnk": at
#: INT2 each code pair in two instructions (the magic folded into an fp16-rounded offset, keys
#: dequantized that way rather than folded), the same kernel at INT4. H100, session 28, one run,
#: whole steps against "dnp_r128fslwk" at the same split count: 0-4 % less time at INT2 at 4-128
#: requests of 1K-64K tokens (3.9 % at (16, 65536), 2.5 % at (8, 32768)), never more beyond the
#: run's spread (+0.3 % at (4, 32768)); its perplexity and KL on two texts equal the exact dequantization's within the
#: windows' spread (session 22, quality_lean_offsets_*.json); ~5e-3 relative RMS from the reference at
#: INT2 instead of ~2e-3 (tests: LEAN_BOUND) (benches/results/kernels_gluon_s28/). Since session 34
#: with the tile's value lines prefetched into L2 at its start ("dnp_r128fslwnkv",
#: ``GluonVariant.l2_prefetch`` 1: ptxas issues the value loads after the first wait on the key loads,
#: so each tile paid two memory round trips; two prefetch instructions per tile make the second an L2
#: hit). H100, whole steps, the same split count side by side, four defaults (this one, the open
#: share, the page grid and its open share): 0.8-4.2 % less time at 17 of 20 (shape, format, bits) at
#: 2-128 requests of 2K-64K tokens, INT2 and INT4, equal at two, 0.3 % more at (2, 65536) paper INT4;
#: the same outputs (benches/results/kernels_gluon_s34/).
GLUON_DEFAULT_VARIANT = "dnp_r128fslwnkv"
#: The (request, KV head) pairs of a launch, first and last, for which the default takes the Gluon
#: stage 1. From 32 pairs since session 21 (H100, session 25: 1.02-1.14x at 4 requests of 8K and 32K
#: tokens at 8 KV heads). From 16 since session 33 (2-3 requests at 8 KV heads; whole steps against
#: the fused Triton step, the variant and split count the launcher then takes, paper format /
#: server format, INT2 and INT4, benches/results/kernels_gluon_s33/): H200 1.09-1.32x at
#: (2, 8192), (2, 65536) and (3, 32768); H100 0.99-1.26x from 4K tokens, 0.96-1.04x at 2K,
#: 0.90-1.03x at 1K (2 us more of 21 at worst). Below 16, one request at 8 KV heads: H200, the same
#: session, 0.88x at (1, 32768), 0.97-0.98x at (1, 131072) at the launcher's split count; 1.15x at
#: (1, 131072) but 0.72-0.83x at 8K-32K at the one-wave count (a split count may not depend on
#: lengths: one CUDA graph per batch size), so it stays on Triton. Above 1024, not measured.
GLUON_DEFAULT_PAIRS = (16, 1024)
#: Resident programs per SM whose whole waves the Gluon default's split count fills from 512 pairs
#: on (``pick_num_splits(waves=None, resident=GLUON_RESIDENT)``), where the Triton default balances
#: waves of its 8 (~240 registers): the Gluon program's 128 registers leave 16 resident. H200, whole
#: steps against the fused Triton step: with the Triton rule's 1-2 splits at 512 and 1024 pairs
#: 0.77-0.84x, at 16 programs per SM 1.15-1.22x (kernels_gluon_s21/step_waves.md); in between
#: "16 programs per SM" left a nearly empty second wave (800 pairs: 2 splits, 0.99-1.05x; 768: 2,
#: 0.94-0.99x) where whole waves of 16 (5 and 8 splits) give 1.11-1.20x
#: (kernels_gluon_s22/splits.md).
GLUON_RESIDENT = 16
#: The bit widths at which the default rule takes the Gluon stage 1 for page-grid key ranges
#: (G_K 16; the tile: ``GLUON_DEFAULT_PAGE_BLOCK_N``). Session 25 (H200, 16-token tiles, the variant
#: "dnp_r128fslw") took INT4 only: INT4 1.02-1.32x the fused Triton step, INT2 0.97-1.09x. Since
#: session 29 INT2 too, on 32-token tiles with the lean INT2 form: H100, whole steps, the launcher's
#: own split count, against the fused Triton step (benches/results/kernels_gluon_s29/): INT2
#: 1.05-1.19x at 16-128 requests of 4K-64K tokens and 1.08-1.13x at 4-8 requests of 32K, 0.96-0.99x
#: at 4-8 requests of 4K-8K and 0.88-0.90x at (32, 1024) (short contexts, where the paper format's
#: Gluon default loses too); INT4 against the 16-token Gluon default: 1.00-1.01x (within the runs'
#: spread) at 4-32 requests of 1K-8K, 1.02-1.03x at 32K-64K tokens and (32, 4096), 1.04-1.06x at
#: 64-128 requests.
GLUON_DEFAULT_PAGE_BITS = (2, 4)
#: The key groups (tokens) at which the default rule takes the Gluon stage 1 for page-grid key
#: ranges. G_K 16 since session 25 (see above); G_K 32 since session 47: H100, whole steps,
#: "dnp_r128fslwnpv" / "dnp_r128fslwnpxv" at the Gluon default's split counts against the launcher's
#: Triton step, INT2 0.77x / 0.72x / 0.81x the time at (8, 32768) / (16, 65536) / (32, 8192), INT4
#: 0.86x at (8, 32768), outputs within 2.1-2.5e-3 (INT2) and 4.5e-4 (INT4) relative RMS of the Triton
#: step's (benches/results/kernels_s47/call_b/). Shorter contexts and fewer requests were not timed
#: at G_K 32.
GLUON_DEFAULT_PAGE_K_GROUPS = (16, 32)
#: The Gluon variant the default takes for page-grid key ranges: the lean INT2 form (two
#: instructions per code pair; at INT4 the same kernel as "dnp_r128fslw"). Keys dequantized rather
#: than folded into the query: on 16-token tiles folding cost more than it saved (H200, session 25:
#: 2-8 %), and on 32-token tiles two key groups per tile need dequantized keys
#: (``check_gluon_key_groups``). Since session 31 with the key params paired by the lane that makes
#: them and one shared-memory hand-over per key group (``GluonVariant.page_pairs``; "dnp_r128fslwn"
#: before): 784 instead of 889 instructions per 32-token INT2 tile (sm_90 SASS), whole steps on an
#: H100 6-8 % faster at INT2 and 4-5 % at INT4 at (8, 32768) and (16, 65536)
#: (benches/results/kernels_gluon_s31/). Since session 34 with the value-line L2 prefetch
#: ("dnp_r128fslwnpv", see ``GLUON_DEFAULT_VARIANT``): H100, 0.8-4.2 % less time at INT2 and INT4
#: at 2-64 requests (equal at (64, 4096) INT2).
GLUON_DEFAULT_PAGE_VARIANT = "dnp_r128fslwnpv"
#: The Gluon default's tile for page-grid key ranges at G_K 16: 32 tokens, two key groups per tile
#: (the per-tile costs spread over twice the tokens: 889 instead of 2 x 523 instructions per 32
#: INT2 tokens, sm_90 SASS, session 29's form); 16 (one key group per tile) until session 29. At
#: G_K 32 the same tile holds one key group.
GLUON_DEFAULT_PAGE_BLOCK_N = 32
#: Set to 0 to keep the default decode on the Triton stage 1 everywhere (1: the default rule).
GLUON_DEFAULT_ENV = "OSCAR_SGL_GLUON_DECODE"
#: The Gluon variants the default takes where ``gluon_share_rule`` says the launch's last wave would
#: be a partial one: ``GLUON_DEFAULT_VARIANT`` / ``GLUON_DEFAULT_PAGE_VARIANT`` with the open-page
#: program (the new token's write, the open page's last tile) taking an equal share of the sealed
#: tiles (``GluonVariant.open_share``), at the split count whose programs fit one wave.
GLUON_DEFAULT_SHARE_VARIANT = "dnp_r128fslwnkxv"
GLUON_DEFAULT_PAGE_SHARE_VARIANT = "dnp_r128fslwnpxv"
#: The (request, KV head) pairs, first and last, and the bit widths at which the Gluon default runs
#: the new token's write as a launch of its own and its stage 1 as a programmatic dependent of it
#: (``_DecodeTuning.split_write`` + ``split_pdl``): the stage 1 compiled without the write's code,
#: whose sealed-tile loop ptxas schedules as in the launch without a write (sm_90 SASS: the same
#: sequence), faster at 32-64 requests at INT2; the open-page programs alone wait for the write's
#: stores. H100, session 35, whole steps side by side (benches/results/kernels_gluon_s35/), INT2
#: against the fused step, paper / server format: 24-64 requests at 8 KV heads (192-512 pairs) 0.4-3.3 %
#: less time ((24, 8192) 3.3 / 2.5 %, (32, 8192) 1.6-2.3 / 2.8 %, (40, 4096) 0.4 / 0.8 %, (48, 4096)
#: 0.7 / 0.9 %, (64, 4096) 1.5-1.6 / 1.5-2.2 %); 8 and 16 requests 1.2-2.6 % more ((16, 65536) within
#: +-1 %), 96 requests 4.7-6.0 % more, 128 requests 2.1-2.8 % less (outside the range: 96 loses);
#: INT4 0-2.3 % more at 8-64 requests (kept fused).
GLUON_SPLIT_WRITE_PAIRS = (192, 512)
GLUON_SPLIT_WRITE_BITS = (2,)
#: ``gluon_share_rule``: the share of a wave the launch's last, partial wave must exceed before the
#: default takes the open-share variant at the one-wave split count. H200, whole steps, side by side
#: (benches/results/kernels_gluon_s32/share/): at 128 pairs (16 requests at 8 KV heads: 17 programs
#: per pair, a last wave of 64 programs, 3.0 % of the 2112 slots) the open share takes 0.8-4.1 %
#: more time than the launcher's grid; from 160 pairs (a last wave of 6.1 % and more) 1.3-2.9 % less
#: at 160-512 pairs and 3.0-8.8 % less at 768-1024 (paper format and the server's page-grid format,
#: INT2 and INT4); on an H100 the same signs (sessions 27, 28, 32).
GLUON_SHARE_MIN_TAIL = 0.05
#: The (request, KV head) pairs from which the Gluon default runs its variant's ``lane_fwht`` form
#: (the same name with the suffix ``h``: the query rotation, the partial's inverse rotation and the
#: write's butterflies in a layout of their own, lane shuffles for the upper index bits; the same
#: bits, ~1100 fewer instructions per program, and another ptxas schedule of the sealed-tile loop).
#: Session 42, two H100s, whole steps side by side with the plain form, outputs bit-identical
#: (benches/results/kernels_s42/, calls C and E): paper format, INT2 and INT4, 128 pairs 0.994-0.997x
#: the time, 256-512 pairs 0.965-0.978x, 768 pairs 0.917-0.972x, 1024 pairs 0.939-0.973x; the
#: server's page-grid format 0.985-0.993x at 128 pairs, 0.936-0.972x at 256-1024; 64 pairs
#: 1.001-1.020x (the plain form kept), and (call B, the lane form everywhere) 32 pairs 1.027-1.030x,
#: 16 pairs 1.037-1.095x.
GLUON_LANE_FWHT_PAIRS = 128

#: Below the Gluon default's pairs (``GLUON_DEFAULT_PAIRS``: single requests at 8 KV heads), the
#: requests of at least this many tokens take a Gluon stage 1 of their own at ``long_waves`` programs
#: per SM (``_DecodeTuning.long_gluon``: decided on the device per request, one CUDA graph per batch
#: size); 0 (the default): the Triton stage 1 takes every length. H100, session 43, whole steps side
#: by side, one request at 8 KV heads (benches/results/kernels_s43/): every length on the Gluon launch
#: against the Triton stage 1 alone, paper format INT2 / INT4: 1.285 / 1.290 of the time at 32768
#: tokens, 1.047 / 1.069 at 65536, 0.942 (INT2) at 98304, 0.884 / 0.944 at 131072 (server format
#: 1.125 / 1.022 at 65536, 0.941 / 0.883 at 131072); but where the Gluon launch takes no request its
#: empty grid costs the step 3.1-3.7 us (1.21-1.30x at 2K-8K tokens, 1.12-1.14x at 32K). So no
#: threshold pays for every length, and the rule stays off: ``long_gluon`` is an opt-in. At a third
#: of the programs (``long_waves`` 4) the empty launch still costs 2.8-3.2 us (session 44): the cost
#: is the launch, not its grid, and torch 2.11 has no CUDA-graph conditional node to skip it.
LONG_GLUON_TOKENS = 0


def gluon_lane_form(variant: str, pairs: int) -> str:
    """The Gluon default's variant for a launch of ``pairs`` (request, KV head) pairs: its
    ``lane_fwht`` form (``variant + "h"``) from ``GLUON_LANE_FWHT_PAIRS`` on, where there is one."""
    lanes = variant + "h"
    return lanes if pairs >= GLUON_LANE_FWHT_PAIRS and lanes in gluon_decode.GLUON_VARIANTS else variant


def gluon_share_rule(batch: int, num_kv_heads: int, *, waves: float | None, resident: int,
                     num_sms: int | None = None) -> bool:
    """Whether the Gluon default runs its open-share variant at the one-wave split count
    (``pick_num_splits(fit=True)``) instead of ``GLUON_DEFAULT_VARIANT`` at ``pick_num_splits(waves,
    resident)``'s: True when that split count's grid (``splits + 1`` programs per (request, KV
    head) pair) ends in a partial wave of more than ``GLUON_SHARE_MIN_TAIL`` of the SMs' resident
    slots. There the last wave holds the open-page programs (launched last, the write's latency
    and the open page's last tile) or whole sealed programs, and the step waits for it; fitting
    every program into one wave, the open-page program taking a share of the sealed tiles so that
    no program of the launch is a short one, removes that wave (sessions 27-32). Depends on the
    batch size only (one CUDA graph per batch size). ``num_sms``: as ``pick_num_splits``."""
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 8
    pairs = max(1, batch * num_kv_heads)
    splits = pick_num_splits(batch, num_kv_heads, num_sms=num_sms, waves=waves, resident=resident)
    w = pairs * (splits + 1) / (num_sms * resident)
    return w - math.floor(w) > GLUON_SHARE_MIN_TAIL


def gluon_default_reason(*, batch: int, num_kv_heads: int, group: int, head_dim: int, bits: int, k_group: int,
                         v_group: int, key_page: bool, block_n: int, device: torch.device,
                         capability: tuple[int, int] | None = None, pairs: bool = True) -> str | None:
    """None when the default decode runs the Gluon stage 1 (``GLUON_DEFAULT_VARIANT``; for page-grid
    key ranges ``GLUON_DEFAULT_PAGE_VARIANT``) on ``block_n``-token tiles for this launch, else why
    it runs the Triton stage 1. Depends on the batch size, never on lengths (one CUDA graph per
    batch size). ``capability``: the device's (tests; None: asked from ``device``). ``pairs`` False:
    whatever the launch's (request, KV head) pairs (``LONG_GLUON_TOKENS``' rule for single requests)."""
    import os

    env = os.environ.get(GLUON_DEFAULT_ENV, "1")
    if env not in ("0", "1"):
        raise ValueError(f"{GLUON_DEFAULT_ENV} must be 0 (Triton stage 1 only) or 1 (the default rule), got {env!r}")
    if env == "0":
        return f"{GLUON_DEFAULT_ENV}=0"
    lo, hi = GLUON_DEFAULT_PAIRS
    if pairs and not lo <= batch * num_kv_heads <= hi:
        return (f"{batch * num_kv_heads} (request, KV head) pairs: the Gluon default covers {lo}-{hi}, where it was "
                f"measured faster")
    if key_page and bits not in GLUON_DEFAULT_PAGE_BITS:
        return (f"page-grid key ranges (key_ranges='page') at {bits} bits: the Gluon stage 1 reads them (opt-in) "
                f"but was measured faster at {' and '.join(map(str, GLUON_DEFAULT_PAGE_BITS)) or 'no'} "
                f"bits only")
    if key_page and k_group not in GLUON_DEFAULT_PAGE_K_GROUPS:
        return (f"page-grid key ranges with k_group={k_group}: the Gluon default for them was measured at k_group "
                f"{' and '.join(map(str, GLUON_DEFAULT_PAGE_K_GROUPS))} only (opt-in elsewhere)")
    variant = GLUON_DEFAULT_PAGE_VARIANT if key_page else GLUON_DEFAULT_VARIANT
    try:
        gluon_decode.check_gluon_shape(bits=bits, head_dim=head_dim, k_group=k_group, v_group=v_group, block_n=block_n,
                                       group=group)
        gluon_decode.check_gluon_key_groups(variant, block_n=block_n, k_group=k_group)
        if key_page:
            gluon_decode.check_gluon_key_page(variant)
    except ValueError as exc:
        return str(exc)
    reason = gluon_decode.gluon_available(device if capability is None else None)
    if reason is not None:
        return reason
    if capability is None:
        if device.type != "cuda":
            return f"device {device}"
        capability = torch.cuda.get_device_capability(device)
    if capability[0] != 9:
        return f"sm_{capability[0]}{capability[1]}: the Gluon default was measured on sm_90 (H200) only"
    return None


def _launch_tuning(batch: int, num_kv_heads: int, head_dim: int, page_size: int, *, group: int, bits: int,
                   k_group: int, v_group: int, key_page: bool, device: torch.device) -> _DecodeTuning:
    """The launcher's tuning when the caller passes none: ``_default_tuning``, with the Gluon stage 1
    (``GLUON_DEFAULT_VARIANT``; for page-grid key ranges ``GLUON_DEFAULT_PAGE_VARIANT`` on
    ``gluon_block_n``'s tiles) where ``gluon_default_reason`` allows it, its split count balanced
    over whole waves of ``GLUON_RESIDENT`` programs per SM where the Triton tuning balances over 8
    (from 512 pairs on; the same split count below); where that grid would end in a partial wave
    (``gluon_share_rule``), the open-share variant (``GLUON_DEFAULT_SHARE_VARIANT``,
    ``GLUON_DEFAULT_PAGE_SHARE_VARIANT``) at the one-wave split count (``fit``); from
    ``GLUON_SPLIT_WRITE_PAIRS`` at ``GLUON_SPLIT_WRITE_BITS``, the write as a launch of its own
    before it (``split_write``, ``split_pdl``); from ``GLUON_LANE_FWHT_PAIRS``, the variant's
    ``lane_fwht`` form (``gluon_lane_form``). Where the Triton stage 1 runs for fewer pairs than the
    Gluon default's least, the open page's tiles go to short sealed programs (``SPREAD_OPEN``).
    ``decode_num_splits(..., layer=...)`` gives its split count."""
    tune = _default_tuning(batch, num_kv_heads, head_dim, page_size)
    block_n = gluon_block_n(tune.block_n, k_group, key_page)
    if gluon_default_reason(batch=batch, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, bits=bits,
                            k_group=k_group, v_group=v_group, key_page=key_page, block_n=block_n,
                            device=device) is None:
        lo, hi = GLUON_SPLIT_WRITE_PAIRS
        split = bits in GLUON_SPLIT_WRITE_BITS and lo <= batch * num_kv_heads <= hi
        tune = replace(tune, merge_pdl=MERGE_PDL and merge_pdl_reason(device) is None)
        if gluon_share_rule(batch, num_kv_heads, waves=tune.waves, resident=GLUON_RESIDENT):
            variant = gluon_lane_form(GLUON_DEFAULT_PAGE_SHARE_VARIANT if key_page else GLUON_DEFAULT_SHARE_VARIANT,
                                      batch * num_kv_heads)
            return replace(tune, gluon=True, gluon_variant=variant, resident=GLUON_RESIDENT, block_n=block_n, fit=True,
                           split_write=split, split_pdl=split)
        variant = gluon_lane_form(GLUON_DEFAULT_PAGE_VARIANT if key_page else GLUON_DEFAULT_VARIANT,
                                  batch * num_kv_heads)
        return replace(tune, gluon=True, gluon_variant=variant, resident=GLUON_RESIDENT, block_n=block_n,
                       split_write=split, split_pdl=split)
    if batch * num_kv_heads < GLUON_DEFAULT_PAIRS[0]:
        tune = replace(tune, spread_open=SPREAD_OPEN)
        if LONG_GLUON_TOKENS and gluon_default_reason(
                batch=batch, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, bits=bits, k_group=k_group,
                v_group=v_group, key_page=key_page, block_n=block_n, device=device, pairs=False) is None:
            tune = replace(tune, long_gluon=LONG_GLUON_TOKENS)
    return tune


def gluon_block_n(block_n: int, k_group: int, key_page: bool) -> int:
    """The Gluon default's tile: the Triton tuning's ``block_n``, except ``GLUON_DEFAULT_PAGE_BLOCK_N``
    for page-grid key ranges at G_K 16 where the Triton tile is 32 (the format and tiles measured: 32
    tokens over two key groups, ``check_gluon_key_groups``, since session 29; 16, one key group per
    tile, before). Elsewhere a tile the Gluon stage 1 cannot take (e.g. group key ranges at G_K 16: 32
    tokens span two groups, which ``GLUON_DEFAULT_VARIANT`` does not do) keeps the Triton stage 1
    (``gluon_default_reason``)."""
    return GLUON_DEFAULT_PAGE_BLOCK_N if key_page and k_group == 16 and block_n == 32 else block_n


def decode_workspace(batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int, num_splits: int,
                     device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scratch of one decode launch, reusable across launches of the same (batch, splits) and in
    CUDA graphs: ``(partial_out [B, Hq, splits+1, D] fp32, partial_lse [B, Hq, splits+1] fp32,
    merge counters [B * H] int32 (zero; every launch leaves them zero), rotated queries [B, Hq, D] fp32)``."""
    return (
        torch.empty((batch, num_q_heads, num_splits + 1, head_dim), dtype=torch.float32, device=device),
        torch.empty((batch, num_q_heads, num_splits + 1), dtype=torch.float32, device=device),
        torch.zeros((max(1, batch * num_kv_heads),), dtype=torch.int32, device=device),
        torch.empty((batch, num_q_heads, head_dim), dtype=torch.float32, device=device),
    )


def _fused_merge_rule(tune: _DecodeTuning, num_splits: int, group: int, head_dim: int) -> bool:
    """Whether the Triton stage 1 merges its splits itself (few splits: at most two ~4K-fp32 block
    loads of the group's partials), unless ``tune.fused_merge`` says."""
    cap = max(1, min(64, 4096 // (triton.next_power_of_2(group) * head_dim)))
    return num_splits + 1 <= 2 * cap if tune.fused_merge is None else tune.fused_merge


def _triton_stage1(*, q, layer, kv_indptr, kv_page_indices, seq_lens, q_rot, q_scratch, part_o, part_lse, counters, out,
                   write, new_k, new_v, new_loc, staging_scale, new_strides, sm_scale, window, rotate, group, num_splits,
                   tune, fused_merge, launch_dependents, long_min=None) -> None:
    """The Triton stage 1 over ``(B, H, num_splits + 1)`` programs (``oscar_decode_attention`` has
    checked its inputs): with ``fused_merge`` the merge too; ``long_min``: the requests shorter than
    that only (``_DecodeTuning.long_gluon``), their partials the first ``num_splits + 1`` of rows of
    ``part_o.shape[2]``."""
    b, h, d = q.shape[0], layer.k_codes.shape[1], q.shape[2]
    block_g = triton.next_power_of_2(group)
    cap = max(1, min(64, 4096 // (block_g * d)))  # ~4K fp32 of the group's partials per block load
    # Not by the split count: one compile for every batch size. At most 8: more raises the registers
    # of the whole kernel at head_dim 64 (sm_90: 191 instead of 166 at 16), fewer programs per SM.
    chunk = min(cap, 8)
    if tune.merge_chunk == "splits":
        chunk = max(1, min(cap, triton.next_power_of_2(num_splits + 1)))
    elif tune.merge_chunk is not None:
        chunk = int(tune.merge_chunk)
    options = {} if tune.maxnreg is None else {"maxnreg": tune.maxnreg}
    _decode_stage1_kernel[(b, h, num_splits + 1)](
        # inputs, the layer's pool and the requests' pages
        qrot_ptr=q_rot if q_rot is not None else q_scratch, **pool_arguments(layer),
        kv_indptr_ptr=kv_indptr, page_idx_ptr=kv_page_indices, seq_lens_ptr=seq_lens,
        # workspace, the fused query rotation and write (the new_* are not read without WRITE), output
        part_o_ptr=part_o, part_lse_ptr=part_lse, q_ptr=q, new_k_ptr=new_k if write else q, new_v_ptr=new_v if write else q,
        new_loc_ptr=new_loc if write else seq_lens, stg_scale_ptr=staging_scale if staging_scale is not None else part_lse,
        counter_ptr=counters, out_ptr=out,
        **key_mask_arguments(layer.key_rotated, rotation=layer.rotation, num_kv_heads=h, device=q.device, placeholder=seq_lens),
        strides=(q.stride(0), q.stride(1), *new_strides, out.stride(0), out.stride(1)),
        sm_scale_log2=sm_scale * math.log2(math.e), window_left=window if window is not None else 0, **rotate, GROUP=group,
        # how it runs (_DecodeTuning) and which fused parts it takes
        BLOCK_H=max(8 if tune.transposed else 16, block_g), BLOCK_N=tune.block_n, BLOCK_T=tune.block_t, BLOCK_G=block_g,
        BLOCK_HK=triton.next_power_of_2(h), CHUNK=chunk, USE_ASM=use_asm(q.device), INTERPRET=interpreting(),
        ROT_Q=q_rot is None, WRITE=write, MERGE=fused_merge, TRANS=tune.transposed, WINDOW=window is not None,
        LAUNCH_DEPENDENTS=launch_dependents, SPREAD=tune.spread_open if window is None else 0,
        **({"long_min": int(long_min), "part_stride": part_o.shape[2], "DUAL": True} if long_min else {}),
        num_warps=tune.num_warps, num_stages=tune.num_stages,
        **options,
    )


def _long_gluon_form(tune: _DecodeTuning, layer: PagedLayer, *, group: int, head_dim: int, page_size: int,
                     device: torch.device) -> tuple[str, int]:
    """The long requests' Gluon stage 1 of ``tune`` (``long_gluon``) for ``layer``: its variant and
    tile, checked (a ValueError / RuntimeError naming what does not fit)."""
    key_page = layer.k_ranges is not None
    # "": the format's Gluon default in its lane_fwht form (sm_90 SASS with the DUAL code: the plain
    # paper-format default spills 16 bytes, the lane form does not)
    variant = tune.long_variant or gluon_lane_form(GLUON_DEFAULT_PAGE_VARIANT if key_page else GLUON_DEFAULT_VARIANT,
                                                   GLUON_LANE_FWHT_PAIRS)
    var = gluon_decode.gluon_variant(variant)  # unknown names: ValueError naming the known ones
    if not var.fused:
        raise ValueError(f"_DecodeTuning.long_variant: a fused Gluon variant (the write, the query rotation and the "
                         f"partials' inverse rotation in its launch), got {variant!r}")
    block_n = var.block_n or gluon_block_n(tune.block_n, layer.k_group, key_page)
    check_sealed_tile(block_n, page_size=page_size, k_group=layer.k_group)
    if key_page:
        gluon_decode.check_gluon_key_page(variant)
    gluon_decode.check_gluon_shape(bits=layer.bits, head_dim=head_dim, k_group=layer.k_group, v_group=layer.v_group,
                                   block_n=block_n, group=group)
    gluon_decode.check_gluon_key_groups(variant, block_n=block_n, k_group=layer.k_group)
    reason = gluon_decode.gluon_available(device)
    if reason is not None:
        raise RuntimeError(reason)
    return variant, block_n


def oscar_decode_attention(
    *,
    q: torch.Tensor,
    layer: PagedLayer,
    kv_indptr: torch.Tensor,
    kv_page_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    q_rot: torch.Tensor | None = None,
    new_k: torch.Tensor | None = None,
    new_v: torch.Tensor | None = None,
    new_loc: torch.Tensor | None = None,
    staging_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, ...] | None = None,
    window_left: int | None = None,
    _tuning: _DecodeTuning | None = None,
) -> torch.Tensor:
    """One decode step of attention over sealed INT2/INT4 pages plus each request's open BF16 page.

    With ``new_k``/``new_v``/``new_loc`` the step's write path runs in the same launch (rotate the
    new token's K/V, BF16 staging write, s_t), and with ``q_rot=None`` so does the query rotation;
    with few splits the last program of each (request, KV head) merges them: one launch per layer
    and step. On an sm_90 GPU with Triton 3.6, from 16 to 1024 (request, KV head) pairs and the
    formats it reads (``gluon_default_reason``), the default is the Gluon stage 1
    (``GLUON_DEFAULT_VARIANT``, ``GLUON_DEFAULT_PAGE_VARIANT`` for page-grid key ranges: the
    write, the query rotation and with few splits the merge in its launch too, else a merge launch
    after it; at INT2 from 192 to 512 pairs, ``GLUON_SPLIT_WRITE_PAIRS``, the write in a launch of
    its own before it, the stage 1 its programmatic dependent); ``OSCAR_SGL_GLUON_DECODE=0`` keeps
    the Triton one.

    Args:
        q: ``[B, Hq, D]`` post-RoPE queries (un-rotated); Hq a multiple of the KV heads H.
        layer: the layer's pool (`PagedLayer`: packed pages, staging, page map, bits, groups, rotation).
        kv_indptr: ``[B + 1]`` int32, request b owns ``kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]``.
        kv_page_indices: int32 page ids, oldest first.
        seq_lens: ``[B]`` int32 tokens per request (>= 1), the current token included.
        sm_scale: the softmax scale.
        q_rot: ``[B, Hq, D]`` fp32 rotated queries when an earlier launch produced them (rotated
            as ``layer.key_rotated`` says: ``oscar_rotate_q(..., key_rotated=layer.key_rotated)``);
            None: the rotation is fused into this launch.
        new_k, new_v: ``[B, H, D]`` post-RoPE K/V of the step's token of each request (un-rotated),
            written by this launch into slot ``new_loc[b]`` (``page * P + offset``, int32/int64) of
            the staging page ``page_to_staging`` maps it to (skipped when that is -1: padding);
            ``staging_scale`` ``[num_staging, P, S]`` fp32 receives s_t (None: no token scaling).
        out: ``[B, Hq, D]`` destination (dtype of q when allocated here).
        workspace: ``decode_workspace(..., decode_num_splits(...), ...)`` to reuse across calls (CUDA
            graphs); its size sets the split count. Allocated when None.
        window_left: a sliding-window layer (SGLang's ``RadixAttention.sliding_window_size``): the
            query at position ``seq_len - 1`` sees positions ``seq_len - 1 - window_left ..`` only,
            the sealed tiles before them are skipped; None or negative: every position. A launch
            argument, not a compile-time one (one compiled kernel serves every window).
        _tuning: tests and benchmarks only: a ``_DecodeTuning`` instead of ``_launch_tuning``'s.
    Returns:
        ``out``, the attention output in the model's basis.
    """
    b, hq, d, h, p, s_cols = check_attention_inputs(q, layer, rows="B")
    check_int32(kv_indptr=kv_indptr, kv_page_indices=kv_page_indices, seq_lens=seq_lens)
    group = hq // h
    rotate = rotation_arguments(d, layer.rotation)  # ValueError unless head_dim is a power of two
    write = new_k is not None or new_v is not None or new_loc is not None
    new_strides = (0, 0, 0, 0)  # (new_k, new_v) x (request, head)
    if write:
        if new_k is None or new_v is None or new_loc is None:
            raise ValueError("the fused write needs new_k, new_v and new_loc together")
        check_staging(layer.staging_k, layer.staging_v, staging_scale, num_kv_heads=h, head_dim=d, page_size=p, scale_columns=s_cols)
        if new_k.shape != (b, h, d) or new_v.shape != (b, h, d) or new_k.stride(2) != 1 or new_v.stride(2) != 1:
            raise ValueError(f"new_k / new_v must be [B={b}, H={h}, D={d}] contiguous along D, got "
                             f"{tuple(new_k.shape)} / {tuple(new_v.shape)}")
        if new_loc.shape != (b,):
            raise ValueError(f"new_loc must be [B]={b}, got {tuple(new_loc.shape)}")
        new_strides = (new_k.stride(0), new_k.stride(1), new_v.stride(0), new_v.stride(1))
    if q_rot is not None:
        check_fp32_buffer("q_rot", q_rot, (b, hq, d))
    if _tuning is None:
        tune = _launch_tuning(b, h, d, p, group=group, bits=layer.bits, k_group=layer.k_group, v_group=layer.v_group,
                              key_page=layer.k_ranges is not None, device=q.device)
    else:
        tune = _tuning
    if not isinstance(tune.long_gluon, int) or tune.long_gluon < 0:
        raise ValueError(f"_DecodeTuning.long_gluon must be a token count >= 0, got {tune.long_gluon!r}")
    if tune.long_gluon and tune.gluon:
        raise ValueError("_DecodeTuning.long_gluon: with the Triton stage 1 only (gluon=False): it hands the long "
                         "requests to a Gluon launch of their own")
    if tune.gluon:  # a Gluon variant with a tile of its own (GluonVariant.block_n) runs on it
        gluon_bn = gluon_decode.gluon_variant(tune.gluon_variant).block_n
        if gluon_bn is not None and gluon_bn != tune.block_n:
            tune = replace(tune, block_n=gluon_bn)
    check_sealed_tile(tune.block_n, page_size=p, k_group=layer.k_group)
    window = check_window(window_left)
    if tune.gluon:
        if layer.k_ranges is not None:
            gluon_decode.check_gluon_key_page(tune.gluon_variant)
        gluon_decode.check_gluon_shape(bits=layer.bits, head_dim=d, k_group=layer.k_group, v_group=layer.v_group,
                                       block_n=tune.block_n, group=group)
        gluon_decode.gluon_variant(tune.gluon_variant)  # unknown names: ValueError naming the known ones
        gluon_decode.check_gluon_key_groups(tune.gluon_variant, block_n=tune.block_n, k_group=layer.k_group)
        reason = gluon_decode.gluon_available(q.device)
        if reason is not None:
            raise RuntimeError(reason)
    if tune.num_splits is not None:
        num_splits = tune.num_splits
    else:
        num_splits = (workspace[0].shape[2] - 1 if workspace is not None
                      else tuning_num_splits(tune, b, h))
    if out is None:
        out = torch.empty_like(q)
    if workspace is None:
        workspace = decode_workspace(b, hq, h, d, num_splits, q.device)
    part_o, part_lse, counters, q_scratch = workspace
    if part_o.shape[:2] != (b, hq) or part_o.shape[3:] != (d,) or part_o.shape[2] < num_splits + 1:
        raise ValueError(f"workspace partial_out must be [{b}, {hq}, >= {num_splits + 1}, {d}]")
    part_o = part_o[:, :, : num_splits + 1]
    part_lse = part_lse[:, :, : num_splits + 1]
    if not (part_o.is_contiguous() and part_lse.is_contiguous()):
        raise ValueError("the workspace must be sized for exactly num_splits + 1 partials (contiguous)")
    if counters.dtype != torch.int32 or counters.numel() < b * h or q_scratch.shape != q.shape or q_scratch.dtype != torch.float32:
        raise ValueError("workspace counters / query scratch do not match this launch (use decode_workspace)")
    if not isinstance(tune.spread_open, int) or not 0 <= tune.spread_open <= 1024:
        raise ValueError(f"_DecodeTuning.spread_open must be an int in [0, 1024], got {tune.spread_open!r}")
    if tune.merge_pdl:
        reason = merge_pdl_reason(q.device)
        if reason is not None:
            raise ValueError(f"_DecodeTuning.merge_pdl: {reason}")
    long_min = tune.long_gluon
    if long_min:
        if window is None:
            long_variant, long_bn = _long_gluon_form(tune, layer, group=group, head_dim=d, page_size=p, device=q.device)
        else:  # a sliding-window layer: every request on the Triton stage 1 (its window bounds the tiles), no Gluon launch
            long_min = 2**31 - 1
        n_short = pick_num_splits(b, h, waves=tune.waves, resident=tune.resident, fit=tune.fit)
        if n_short > num_splits:
            raise ValueError(f"_DecodeTuning.long_gluon: the workspace holds {num_splits} splits, fewer than the Triton "
                             f"stage 1's {n_short} (size it with tuning_num_splits / decode_num_splits)")
    if b == 0:
        return out
    if long_min:
        # Two stage-1 launches, each for the requests of its lengths, then one merge: the Triton stage 1
        # (requests shorter than long_min; its partials the first of each row), the Gluon one as its
        # programmatic dependent (the longer requests, at the workspace's split count), the merge
        # reading each request's partials at its launch's count.
        _triton_stage1(q=q, layer=layer, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices, seq_lens=seq_lens,
                       q_rot=q_rot, q_scratch=q_scratch, part_o=part_o, part_lse=part_lse, counters=counters, out=out,
                       write=write, new_k=new_k, new_v=new_v, new_loc=new_loc, staging_scale=staging_scale,
                       new_strides=new_strides, sm_scale=sm_scale, window=window, rotate=rotate, group=group,
                       num_splits=n_short, tune=tune, fused_merge=False, launch_dependents=False, long_min=long_min)
        fused = {"q_ptr": q if q_rot is None else None,
                 **key_mask_arguments(layer.key_rotated, rotation=layer.rotation, num_kv_heads=h, device=q.device,
                                      placeholder=seq_lens), **rotate}
        if write:
            fused.update(new_k_ptr=new_k, new_v_ptr=new_v, new_loc_ptr=new_loc, stg_scale_ptr=staging_scale)
        if window is None:
            gluon_decode.gluon_stage1_launch(q_rot=q_rot if q_rot is not None else q_scratch, pool_args=named_pool_arguments(layer),
                                             group=group, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices,
                                             seq_lens=seq_lens, part_o=part_o, part_lse=part_lse, sm_scale=sm_scale,
                                             block_n=long_bn, block_t=tune.block_t, variant=long_variant, fused=fused,
                                             launch_dependents=tune.merge_pdl, long_min=long_min)
        merge_launch(part_o, part_lse, out, pdl=tune.merge_pdl and window is None, one_pass=_one_pass(tune, part_o),
                     dual=(seq_lens, long_min, n_short + 1))
        return out
    if tune.gluon and gluon_decode.gluon_variant(tune.gluon_variant).fused:
        pdl = False
        if write and tune.split_write:  # the write first, in a launch of its own (with the query rotation: split_rotation)
            if tune.split_pdl and tune.split_rotation:
                raise ValueError("split_pdl: the stage 1 would read the queries the write's launch rotates before it waits")
            rot = q_rot is None and tune.split_rotation
            pdl = tune.split_pdl
            rotated = oscar_write_kv(k=new_k, v=new_v, loc=new_loc, page_to_staging=layer.page_to_staging,
                                     staging_k=layer.staging_k, staging_v=layer.staging_v, staging_scale=staging_scale,
                                     rotation=layer.rotation, q=q if rot else None, q_rot_out=q_scratch if rot else None,
                                     key_rotated=layer.key_rotated, _launch_dependents=pdl)  # fmt: skip
            q_rot = rotated if rot else q_rot
            write = False
        # one launch (few splits: the merge fused too, as the Triton step does) or two: the Gluon stage
        # 1 with the query rotation, the write and the partials' inverse rotation, then the plain merge
        fused = {"q_ptr": q if q_rot is None else None,
                 **key_mask_arguments(layer.key_rotated, rotation=layer.rotation, num_kv_heads=h, device=q.device,
                                      placeholder=seq_lens), **rotate}
        if write:
            fused.update(new_k_ptr=new_k, new_v_ptr=new_v, new_loc_ptr=new_loc, stg_scale_ptr=staging_scale)
        # the merge in the launch where the Triton step fuses its own (the same rule: few splits)
        cap = max(1, min(64, 4096 // (triton.next_power_of_2(group) * d)))
        merge_in = num_splits + 1 <= 2 * cap if tune.fused_merge is None else tune.fused_merge
        if merge_in:
            fused.update(counter_ptr=counters, out_ptr=out)
        gluon_decode.gluon_stage1_launch(q_rot=q_rot if q_rot is not None else q_scratch, pool_args=named_pool_arguments(layer),
                                         group=group, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices,
                                         seq_lens=seq_lens, part_o=part_o, part_lse=part_lse, sm_scale=sm_scale,
                                         block_n=tune.block_n, block_t=tune.block_t, variant=tune.gluon_variant,
                                         fused=fused, window_left=window, pdl=pdl,
                                         launch_dependents=tune.merge_pdl and not merge_in)
        if not merge_in:
            merge_launch(part_o, part_lse, out, pdl=tune.merge_pdl, one_pass=_one_pass(tune, part_o))
        return out
    if tune.gluon:  # three launches: write (+ query rotation), Gluon stage 1, merge (+ inverse rotation)
        if write:
            rotated = oscar_write_kv(k=new_k, v=new_v, loc=new_loc, page_to_staging=layer.page_to_staging,
                                     staging_k=layer.staging_k, staging_v=layer.staging_v, staging_scale=staging_scale,
                                     rotation=layer.rotation, q=q if q_rot is None else None,
                                     q_rot_out=q_scratch if q_rot is None else None, key_rotated=layer.key_rotated)  # fmt: skip
            q_rot = rotated if q_rot is None else q_rot
        elif q_rot is None:
            q_rot = oscar_rotate_q(q=q, rotation=layer.rotation, out=q_scratch, key_rotated=layer.key_rotated)
        gluon_decode.gluon_stage1_launch(q_rot=q_rot, pool_args=named_pool_arguments(layer), group=group, kv_indptr=kv_indptr,
                                         kv_page_indices=kv_page_indices, seq_lens=seq_lens, part_o=part_o,
                                         part_lse=part_lse, sm_scale=sm_scale, block_n=tune.block_n, block_t=tune.block_t,
                                         variant=tune.gluon_variant, window_left=window, launch_dependents=tune.merge_pdl)
        merge_launch(part_o, part_lse, out, rotation=layer.rotation, pdl=tune.merge_pdl,
                     one_pass=_one_pass(tune, part_o, rotation=layer.rotation))
        return out
    fused_merge = _fused_merge_rule(tune, num_splits, group, d)
    _triton_stage1(q=q, layer=layer, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices, seq_lens=seq_lens, q_rot=q_rot,
                   q_scratch=q_scratch, part_o=part_o, part_lse=part_lse, counters=counters, out=out, write=write,
                   new_k=new_k, new_v=new_v, new_loc=new_loc, staging_scale=staging_scale, new_strides=new_strides,
                   sm_scale=sm_scale, window=window, rotate=rotate, group=group, num_splits=num_splits, tune=tune,
                   fused_merge=fused_merge, launch_dependents=tune.merge_pdl and not fused_merge)
    if not fused_merge:
        merge_launch(part_o, part_lse, out, pdl=tune.merge_pdl, one_pass=_one_pass(tune, part_o))
    return out
