"""Seal: quantize whole staging pages into the packed pool, all pages of a step in one launch.

For each ``(page, staging_slot)`` pair of the seal plan, the staging page (rotated BF16 K/V and the
fp32 token scales written by ``oscar_write_kv``) becomes the packed block of docs/LAYOUT.md
section 3 at ``page``: keys per channel over groups of ``G_K`` tokens (``x = float(k) / s``, true
division), values per token over groups of ``G_V`` channels, fp16 (scale, offset), codes packed
along channels. The bytes equal ``oscar_sgl.reference.pack_k`` / ``pack_v`` bit for bit.

Grid: ``(plan length, H, (P / G_K) * (D / BLOCK_D))``; one program owns ``BLOCK_D`` channels of
one K group of one head (``G_K`` tokens; key groups are per channel, so channel chunks are
independent) and the V groups of the same tokens and channels (``BLOCK_D`` is a multiple of
``G_V``). With page-grid key ranges (``KEY_PAGE``, ``key_ranges="page"``) the keys' grid spans the
page, so their programs and the values' are separate: grid ``(plan length, H, D / BLOCK_D + P /
BLOCK_TV)``, the first ``D / BLOCK_D`` programs quantize the keys of ``BLOCK_D`` channels over the
whole page (``reference.page_key_grid``), the others the values of ``BLOCK_TV`` tokens over every
channel (and copy their token scales); each holds at most ~4K values, which keeps the value clip
search in registers. Plan rows with ``page < 0`` are skipped, so a fixed-size (padded) plan can be
replayed in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import check_int32, check_pool, check_staging, clip_range, pack_codes, pool_format, quantize, rne, unspecialized


@triton.jit(**unspecialized("num_plan", pointers=("plan_ptr",)))
def _seal_kernel(
    plan_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr, k_codes_ptr, k_params_ptr, v_codes_ptr, v_params_ptr, scale_ptr,
    k_ranges_ptr, num_plan,
    H: tl.constexpr, D: tl.constexpr, P: tl.constexpr, S: tl.constexpr, BITS: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr,
    KEY_PAGE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TV: tl.constexpr, OFFSET_MIN: tl.constexpr, CLIP_K: tl.constexpr,
    CLIP_V: tl.constexpr,
):
    i_p = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    QMAX: tl.constexpr = (1 << BITS) - 1
    NCH: tl.constexpr = D // BLOCK_D

    page = tl.load(plan_ptr + 2 * i_p).to(tl.int64)
    stg = tl.load(plan_ptr + 2 * i_p + 1).to(tl.int64)
    if page >= 0:
        if KEY_PAGE:
            # programs [0, NCH): the keys of BLOCK_D channels over the whole page (its grid spans the
            # page); programs [NCH, NCH + P / BLOCK_TV): the values of BLOCK_TV tokens, every channel
            i_z = tl.program_id(2)
            if i_z < NCH:
                o_kt = tl.arange(0, P)
                o_kd = i_z * BLOCK_D + tl.arange(0, BLOCK_D)
                b_k = _keys_over_scales(stg_k_ptr, stg_scale_ptr, stg, i_h, o_kt, o_kd, H, D, P, S)
                k_q = _page_keys(b_k, k_params_ptr, k_ranges_ptr, page, i_h, o_kd, H, D, P, G_K, QMAX, BLOCK_D)
                _store_codes(k_codes_ptr, k_q, page, i_h, o_kt, i_z, H, P, D, BITS, P, BLOCK_D)
            else:
                o_vt = (i_z - NCH).to(tl.int64) * BLOCK_TV + tl.arange(0, BLOCK_TV)
                _seal_values(stg_v_ptr, v_codes_ptr, v_params_ptr, stg, page, i_h, o_vt, 0, H, D, P, BITS, G_V, BLOCK_TV, D,
                             QMAX, OFFSET_MIN, CLIP_V)
                _copy_scales(stg_scale_ptr, scale_ptr, stg, page, i_h, o_vt, P, S, BLOCK_S)
        else:
            # one program: BLOCK_D channels of one key group (G_K tokens) and the value groups of the
            # same tokens and channels
            i_g = (tl.program_id(2) // NCH).to(tl.int64)
            i_c = tl.program_id(2) % NCH
            o_t = i_g * G_K + tl.arange(0, G_K)
            o_d = i_c * BLOCK_D + tl.arange(0, BLOCK_D)
            b_k = _keys_over_scales(stg_k_ptr, stg_scale_ptr, stg, i_h, o_t, o_d, H, D, P, S)
            k_lo = tl.min(b_k, axis=0)[None, :]
            k_hi = tl.max(b_k, axis=0)[None, :]
            if CLIP_K:
                k_lo, k_hi = clip_range(b_k, k_lo, k_hi, QMAX, OFFSET_MIN, 0)
            k_q, k_sc, k_off = quantize(b_k, k_lo, k_hi, QMAX, OFFSET_MIN)
            o_kp = (((page * H + i_h) * (P // G_K) + i_g) * 2) * D + o_d
            tl.store(k_params_ptr + o_kp, tl.reshape(k_sc, (BLOCK_D,)).to(tl.float16))
            tl.store(k_params_ptr + o_kp + D, tl.reshape(k_off, (BLOCK_D,)).to(tl.float16))
            _store_codes(k_codes_ptr, k_q, page, i_h, o_t, i_c, H, P, D, BITS, G_K, BLOCK_D)
            _seal_values(stg_v_ptr, v_codes_ptr, v_params_ptr, stg, page, i_h, o_t, i_c, H, D, P, BITS, G_V, G_K, BLOCK_D,
                         QMAX, OFFSET_MIN, CLIP_V)
            if i_c == 0:
                _copy_scales(stg_scale_ptr, scale_ptr, stg, page, i_h, o_t, P, S, BLOCK_S)


@triton.jit
def _keys_over_scales(stg_k_ptr, stg_scale_ptr, stg, i_h, o_t, o_d, H: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                      S: tl.constexpr):
    """Staging keys ``[tokens o_t, channels o_d]`` of head ``i_h`` as fp32 ``x = k / s`` (true
    division; S == 0: k), with -0.0 made +0.0 (the canonical zero, docs/LAYOUT.md §1)."""
    b_k = tl.load(stg_k_ptr + ((stg * H + i_h) * P + o_t[:, None]) * D + o_d[None, :]).to(tl.float32)
    if S > 0:
        if S == 1:
            b_s = tl.load(stg_scale_ptr + (stg * P + o_t) * S)
        else:
            b_s = tl.load(stg_scale_ptr + (stg * P + o_t) * S + i_h)
        b_k = tl.math.div_rn(b_k, b_s[:, None])
    return b_k + 0.0


@triton.jit
def _store_codes(codes_ptr, q, page, i_h, o_t, i_c, H: tl.constexpr, P: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pack the codes ``q`` ``[ROWS tokens o_t, BLOCK_D channels of chunk i_c]`` into the page's rows."""
    BYTES: tl.constexpr = D * BITS // 8
    CBYTES: tl.constexpr = BLOCK_D * BITS // 8
    o_c = ((page * H + i_h) * P + o_t[:, None]) * BYTES + i_c * CBYTES + tl.arange(0, CBYTES)[None, :]
    tl.store(codes_ptr + o_c, pack_codes(q, ROWS, BLOCK_D, BITS))


@triton.jit
def _seal_values(stg_v_ptr, v_codes_ptr, v_params_ptr, stg, page, i_h, o_t, i_c, H: tl.constexpr, D: tl.constexpr,
                 P: tl.constexpr, BITS: tl.constexpr, G_V: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 QMAX: tl.constexpr, OFFSET_MIN: tl.constexpr, CLIP_V: tl.constexpr):
    """The values of tokens ``o_t`` (``ROWS``) and channels ``[i_c * BLOCK_D, +BLOCK_D)`` (whole
    groups of ``G_V`` channels of one token): codes and per-(token, group) fp16 (scale, offset)."""
    NG: tl.constexpr = D // G_V
    NGC: tl.constexpr = BLOCK_D // G_V
    o_d = i_c * BLOCK_D + tl.arange(0, BLOCK_D)
    b_v = tl.load(stg_v_ptr + ((stg * H + i_h) * P + o_t[:, None]) * D + o_d[None, :]).to(tl.float32)
    b_v = tl.reshape(b_v, (ROWS, NGC, G_V)) + 0.0  # canonical zero
    v_lo = tl.min(b_v, axis=2)[:, :, None]
    v_hi = tl.max(b_v, axis=2)[:, :, None]
    if CLIP_V:
        v_lo, v_hi = clip_range(b_v, v_lo, v_hi, QMAX, OFFSET_MIN, 2)
    v_q, v_sc, v_off = quantize(b_v, v_lo, v_hi, QMAX, OFFSET_MIN)
    _store_codes(v_codes_ptr, tl.reshape(v_q, (ROWS, BLOCK_D)), page, i_h, o_t, i_c, H, P, D, BITS, ROWS, BLOCK_D)
    o_vp = (((page * H + i_h) * P + o_t[:, None]) * 2) * NG + i_c * NGC + tl.arange(0, NGC)[None, :]
    tl.store(v_params_ptr + o_vp, tl.reshape(v_sc, (ROWS, NGC)).to(tl.float16))
    tl.store(v_params_ptr + o_vp + NG, tl.reshape(v_off, (ROWS, NGC)).to(tl.float16))


@triton.jit
def _copy_scales(stg_scale_ptr, scale_ptr, stg, page, i_h, o_t, P: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr):
    """The token scales of tokens ``o_t``, copied exactly (by head 0's programs)."""
    if S > 0:
        if i_h == 0:
            o_sc = tl.arange(0, BLOCK_S)
            m_sc = o_sc[None, :] < S
            b_all = tl.load(stg_scale_ptr + (stg * P + o_t[:, None]) * S + o_sc[None, :], mask=m_sc)
            tl.store(scale_ptr + (page * P + o_t[:, None]) * S + o_sc[None, :], b_all, mask=m_sc)


@triton.jit
def _page_keys(b_k, k_params_ptr, k_ranges_ptr, page, i_h, o_d, H: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
               G_K: tl.constexpr, QMAX: tl.constexpr, BLOCK_D: tl.constexpr):
    """``reference.page_key_grid`` of one page's keys ``[P, BLOCK_D]`` (channels ``o_d``): stores the
    page grid (fp16 base, step) and the groups' uint8 (a, b), returns the codes ``[P, BLOCK_D]``."""
    NGP: tl.constexpr = P // G_K
    x = tl.reshape(b_k, (NGP, G_K, BLOCK_D))
    g_lo = tl.min(x, axis=1)  # [NGP, BLOCK_D]
    g_hi = tl.max(x, axis=1)
    base_h = tl.min(g_lo, axis=0).to(tl.float16)  # round to nearest even
    base = base_h.to(tl.float32)
    step = tl.math.div_rn(tl.max(g_hi, axis=0) - base, tl.full(base.shape, 255.0, tl.float32)).to(tl.float16).to(tl.float32)
    normal = step > 0.0
    step = tl.where(normal, step, 0.0)
    o_g = (page * H + i_h) * 2 * D + o_d
    tl.store(k_params_ptr + o_g, base_h)
    tl.store(k_params_ptr + o_g + D, step.to(tl.float16))
    safe = tl.where(normal, step, 1.0)[None, :]
    a = tl.floor(tl.math.div_rn(g_lo - base[None, :], safe))
    b = tl.ceil(tl.math.div_rn(g_hi - base[None, :], safe))
    a = tl.where(normal[None, :], tl.minimum(tl.maximum(a, 0.0), 255.0), 0.0)
    b = tl.where(normal[None, :], tl.minimum(tl.maximum(b, 0.0), 255.0), 0.0)
    o_r = (((page * H + i_h) * NGP + tl.arange(0, NGP))[:, None] * 2) * D + o_d[None, :]
    tl.store(k_ranges_ptr + o_r, a.to(tl.uint8))
    tl.store(k_ranges_ptr + o_r + D, b.to(tl.uint8))
    # the group's grid, every operation rounded to fp16 (reference.page_group_grid): u = step / qmax,
    # scale = (b - a) * u, offset = base + a * step (the fp16 roundings leave nothing to contract)
    u = tl.math.div_rn(step, tl.full(step.shape, QMAX, tl.float32)).to(tl.float16).to(tl.float32)
    scale = ((b - a) * u[None, :]).to(tl.float16).to(tl.float32)
    off = (base[None, :] + (a * step[None, :]).to(tl.float16).to(tl.float32)).to(tl.float16).to(tl.float32)
    ok = scale > 0.0
    s3 = tl.where(ok, scale, 1.0)[:, None, :]
    q = rne(tl.math.div_rn(x - off[:, None, :], tl.broadcast_to(s3, x.shape)))
    q = tl.where(ok[:, None, :], tl.minimum(tl.maximum(q, 0.0), QMAX), 0.0)
    return tl.reshape(q, (P, BLOCK_D))


@dataclass(frozen=True)
class _SealTuning:
    """How one seal launch runs (never what it computes: the bytes are the reference's in any
    configuration): the default below, or what a test or benchmark passes as
    ``oscar_seal(_tuning=...)``.

    Attributes:
        values: the most fp32 values (tokens x channels) one program holds, a power of two; the
            program's tile is as large as that allows (at least one whole value group and byte of
            codes per row; group key ranges: one whole key group of tokens).
        num_warps: Triton warps per program.
    """

    values: int = 4096
    num_warps: int = 4


#: The tilings measured fastest on the H200 (benches/results/kernels_history.md, "Seal"): page-grid key
#: ranges in programs of 1024 values (keys: 8 channels of a 128-token page; values: 8 tokens x 128
#: channels) at 4 warps, group key ranges (keys and values of 32 tokens x 32 channels) at 2 warps.
_PAGE_TUNING = _SealTuning(values=1024, num_warps=4)
_GROUP_TUNING = _SealTuning(values=1024, num_warps=2)


def oscar_seal(
    *,
    plan: torch.Tensor,
    staging_k: torch.Tensor,
    staging_v: torch.Tensor,
    staging_scale: torch.Tensor | None,
    k_codes: torch.Tensor,
    k_params: torch.Tensor,
    v_codes: torch.Tensor,
    v_params: torch.Tensor,
    scale: torch.Tensor | None,
    bits: int,
    k_group: int,
    v_group: int,
    offset: str = "integer",
    clip: str = "none",
    k_ranges: torch.Tensor | None = None,
    _tuning: _SealTuning | None = None,
) -> None:
    """Quantize the staging pages named by ``plan`` into the packed pool of one layer.

    Args:
        plan: ``[n, 2]`` (or flat ``[2n]``) int32 pairs ``(page, staging_slot)``; rows with page < 0
            are skipped.
        staging_k, staging_v: ``[num_staging, H, P, D]`` bf16 rotated keys/values.
        staging_scale: ``[num_staging, P, S]`` fp32 token scales, or None (token scaling off).
        k_codes: ``[num_pages, H, P, D*bits/8]`` uint8.
        k_params: ``[num_pages, H, P/k_group, 2, D]`` fp16.
        v_codes: ``[num_pages, H, P, D*bits/8]`` uint8.
        v_params: ``[num_pages, H, P, 2, D/v_group]`` fp16.
        scale: ``[num_pages, P, S]`` fp32, or None (token scaling off).
        bits, k_group, v_group, offset, clip: the layer's OscarConfig values (offset and clip:
            the seal-time quantizer, docs/OSCAR.md §2.3; the bytes stay those of the reference).
        k_ranges: ``[num_pages, H, P/k_group, 2, D]`` uint8 with page-grid key ranges
            (``key_ranges="page"``; ``k_params`` is then ``[num_pages, H, 1, 2, D]``); offset and clip
            then apply to the values only (``clip`` must not name the keys).
        _tuning: tests and benchmarks only: a ``_SealTuning`` instead of the default.
    """
    if offset not in ("integer", "min") or clip not in ("none", "keys", "values", "both"):
        raise ValueError(f"offset must be 'integer' or 'min' and clip 'none', 'keys', 'values' or 'both', got {offset!r}, {clip!r}")
    check_int32(plan=plan)
    plan = plan.reshape(-1)
    if plan.numel() % 2 or not plan.is_contiguous():
        raise ValueError("the seal plan must hold (page, staging_slot) pairs, contiguous")
    n = plan.numel() // 2
    if staging_k.dim() != 4:
        raise ValueError(f"staging K must be [num_staging, H, P, D], got {tuple(staging_k.shape)}")
    d = staging_k.shape[3]
    if k_ranges is not None and clip in ("keys", "both"):
        raise ValueError(f"clip {clip!r} clips key groups, which page-grid key ranges do not store as free ranges")
    _, h, p, s_cols = check_pool(k_codes, k_params, v_codes, v_params, scale, bits=bits, k_group=k_group, v_group=v_group,
                                 head_dim=d, k_ranges=k_ranges)
    check_staging(staging_k, staging_v, staging_scale, num_kv_heads=h, head_dim=d, page_size=p, scale_columns=s_cols)
    if n == 0:
        return
    tune = _tuning if _tuning is not None else (_PAGE_TUNING if k_ranges is not None else _GROUP_TUNING)
    if tune.values < 16 or tune.values & (tune.values - 1) or tune.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"seal tuning: values must be a power of two >= 16 and num_warps 1-16, got {tune}")
    if k_ranges is not None:  # keys: BLOCK_D channels over the page; values: BLOCK_TV tokens x D
        block_d = min(d, max(tune.values // p, 8 // bits))
        block_tv = min(p, max(1, tune.values // d))
        programs = d // block_d + p // block_tv
    else:  # keys and values of one key group (G_K tokens) x BLOCK_D channels
        block_d = min(d, max(v_group, tune.values // k_group, 8 // bits))
        block_tv = k_group
        programs = (p // k_group) * (d // block_d)
    _seal_kernel[(n, h, programs)](
        plan_ptr=plan,
        stg_k_ptr=staging_k,
        stg_v_ptr=staging_v,
        stg_scale_ptr=staging_scale if staging_scale is not None else staging_k,  # not read when S == 0
        k_codes_ptr=k_codes,
        k_params_ptr=k_params,
        v_codes_ptr=v_codes,
        v_params_ptr=v_params,
        scale_ptr=scale if scale is not None else k_codes,
        k_ranges_ptr=k_ranges if k_ranges is not None else k_codes,  # not read without KEY_PAGE
        num_plan=n,
        **pool_format(k_codes, staging_k, scale, bits=bits, k_group=k_group, v_group=v_group, key_page=k_ranges is not None),
        BLOCK_S=triton.next_power_of_2(max(s_cols, 1)),
        BLOCK_D=block_d,
        BLOCK_TV=block_tv,
        OFFSET_MIN=offset == "min",
        CLIP_K=clip in ("keys", "both"),
        CLIP_V=clip in ("values", "both"),
        num_warps=tune.num_warps,
        # The quantizer must round exactly like the reference: no a*b+c contraction anywhere.
        enable_fp_fusion=False,
    )
