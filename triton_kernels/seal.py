"""Seal: quantize whole staging pages into the packed pool, all pages of a step in one launch.

For each ``(page, staging_slot)`` pair of the seal plan, the staging page (rotated BF16 K/V and the
fp32 token scales written by ``oscar_write_kv``) becomes the packed block of docs/LAYOUT.md
section 3 at ``page``: keys per channel over groups of ``G_K`` tokens (``x = float(k) / s``, true
division), values per token over groups of ``G_V`` channels, fp16 (scale, offset), codes packed
along channels. The bytes equal ``oscar_sgl.reference.pack_k`` / ``pack_v`` bit for bit.

Grid: ``(plan length, H, (P / G_K) * (D / BLOCK_D))``; one program owns ``BLOCK_D`` channels of
one K group of one head (``G_K`` tokens; key groups are per channel, so channel chunks are
independent) and the V groups of the same tokens and channels (``BLOCK_D`` is a multiple of
``G_V``). Plan rows with ``page < 0`` are skipped, so a fixed-size (padded) plan can be replayed in
a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import check_int32, check_pool, check_staging, clip_range, pack_codes, pool_format, quantize


@triton.jit(do_not_specialize=["num_plan"])
def _seal_kernel(
    plan_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr, k_codes_ptr, k_params_ptr, v_codes_ptr, v_params_ptr, scale_ptr, num_plan,
    H: tl.constexpr, D: tl.constexpr, P: tl.constexpr, S: tl.constexpr, BITS: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, OFFSET_MIN: tl.constexpr, CLIP_K: tl.constexpr, CLIP_V: tl.constexpr,
):
    i_p = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    NCH: tl.constexpr = D // BLOCK_D
    i_g = (tl.program_id(2) // NCH).to(tl.int64)
    i_c = tl.program_id(2) % NCH
    QMAX: tl.constexpr = (1 << BITS) - 1
    NG: tl.constexpr = D // G_V
    NGC: tl.constexpr = BLOCK_D // G_V
    BYTES: tl.constexpr = D * BITS // 8
    CBYTES: tl.constexpr = BLOCK_D * BITS // 8

    page = tl.load(plan_ptr + 2 * i_p).to(tl.int64)
    stg = tl.load(plan_ptr + 2 * i_p + 1).to(tl.int64)
    if page >= 0:
        o_t = i_g * G_K + tl.arange(0, G_K)  # token inside the page
        o_d = i_c * BLOCK_D + tl.arange(0, BLOCK_D)
        o_src = ((stg * H + i_h) * P + o_t[:, None]) * D + o_d[None, :]

        # ---- keys: x = k / s, one group = G_K tokens of one channel ----
        b_k = tl.load(stg_k_ptr + o_src).to(tl.float32)
        if S > 0:
            if S == 1:
                b_s = tl.load(stg_scale_ptr + (stg * P + o_t) * S)
            else:
                b_s = tl.load(stg_scale_ptr + (stg * P + o_t) * S + i_h)
            b_k = tl.math.div_rn(b_k, b_s[:, None])
        b_k = b_k + 0.0  # canonical zero (docs/LAYOUT.md §1): -0.0 -> +0.0 before min/max
        k_lo = tl.min(b_k, axis=0)[None, :]
        k_hi = tl.max(b_k, axis=0)[None, :]
        if CLIP_K:
            k_lo, k_hi = clip_range(b_k, k_lo, k_hi, QMAX, OFFSET_MIN, 0)
        k_q, k_sc, k_off = quantize(b_k, k_lo, k_hi, QMAX, OFFSET_MIN)
        o_kc = ((page * H + i_h) * P + o_t[:, None]) * BYTES + i_c * CBYTES + tl.arange(0, CBYTES)[None, :]
        tl.store(k_codes_ptr + o_kc, pack_codes(k_q, G_K, BLOCK_D, BITS))
        o_kp = (((page * H + i_h) * (P // G_K) + i_g) * 2) * D + o_d
        tl.store(k_params_ptr + o_kp, tl.reshape(k_sc, (BLOCK_D,)).to(tl.float16))
        tl.store(k_params_ptr + o_kp + D, tl.reshape(k_off, (BLOCK_D,)).to(tl.float16))

        # ---- values: one group = G_V channels of one token ----
        b_v = tl.reshape(tl.load(stg_v_ptr + o_src).to(tl.float32), (G_K, NGC, G_V))
        b_v = b_v + 0.0  # canonical zero
        v_lo = tl.min(b_v, axis=2)[:, :, None]
        v_hi = tl.max(b_v, axis=2)[:, :, None]
        if CLIP_V:
            v_lo, v_hi = clip_range(b_v, v_lo, v_hi, QMAX, OFFSET_MIN, 2)
        v_q, v_sc, v_off = quantize(b_v, v_lo, v_hi, QMAX, OFFSET_MIN)
        tl.store(v_codes_ptr + o_kc, pack_codes(tl.reshape(v_q, (G_K, BLOCK_D)), G_K, BLOCK_D, BITS))
        o_vp = (((page * H + i_h) * P + o_t[:, None]) * 2) * NG + i_c * NGC + tl.arange(0, NGC)[None, :]
        tl.store(v_params_ptr + o_vp, tl.reshape(v_sc, (G_K, NGC)).to(tl.float16))
        tl.store(v_params_ptr + o_vp + NG, tl.reshape(v_off, (G_K, NGC)).to(tl.float16))

        # ---- token scales, copied exactly (one head's programs do it) ----
        if S > 0:
            if (i_h == 0) & (i_c == 0):
                o_sc = tl.arange(0, BLOCK_S)
                m_sc = o_sc[None, :] < S
                b_all = tl.load(stg_scale_ptr + (stg * P + o_t[:, None]) * S + o_sc[None, :], mask=m_sc)
                tl.store(scale_ptr + (page * P + o_t[:, None]) * S + o_sc[None, :], b_all, mask=m_sc)


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
    _, h, p, s_cols = check_pool(k_codes, k_params, v_codes, v_params, scale, bits=bits, k_group=k_group, v_group=v_group, head_dim=d)
    check_staging(staging_k, staging_v, staging_scale, num_kv_heads=h, head_dim=d, page_size=p, scale_columns=s_cols)
    if n == 0:
        return
    # at most ~4K fp32 values per program (registers), whole V groups, whole bytes
    block_d = min(d, max(v_group, 4096 // k_group, 8 // bits))
    _seal_kernel[(n, h, (p // k_group) * (d // block_d))](
        plan_ptr=plan,
        stg_k_ptr=staging_k,
        stg_v_ptr=staging_v,
        stg_scale_ptr=staging_scale if staging_scale is not None else staging_k,  # not read when S == 0
        k_codes_ptr=k_codes,
        k_params_ptr=k_params,
        v_codes_ptr=v_codes,
        v_params_ptr=v_params,
        scale_ptr=scale if scale is not None else k_codes,
        num_plan=n,
        **pool_format(k_codes, staging_k, scale, bits=bits, k_group=k_group, v_group=v_group),
        BLOCK_S=triton.next_power_of_2(max(s_cols, 1)),
        BLOCK_D=block_d,
        OFFSET_MIN=offset == "min",
        CLIP_K=clip in ("keys", "both"),
        CLIP_V=clip in ("values", "both"),
        num_warps=4,
        # The quantizer must round exactly like the reference: no a*b+c contraction anywhere.
        enable_fp_fusion=False,
    )
