"""Write path: a step's new keys/values -> rotated BF16 in the open staging pages, plus s_t.

One program per new token. It reads the token's post-RoPE K and V of every KV head of the layer,
applies the normalized Walsh-Hadamard rotation in fp32, computes the token scale s_t (L2 norm over
the layer's KV heads, or per head), and writes BF16 K/V and the fp32 s_t into the staging page that
``page_to_staging`` maps the token's page to. The same launch can rotate the step's queries, so the
attention kernels that follow read them ready (the "one small launch" of the query rotation is
this one).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:  # Grid dependency control (sm_90+): lets a programmatic dependent launch start early (no-op without PDL)
    from triton.language.extra.cuda import gdc_launch_dependents
except ImportError:  # a Triton without it: oscar_write_kv refuses _launch_dependents (its caller, the Gluon default, needs 3.6)
    gdc_launch_dependents = None

from .common import (check_fp32_buffer, check_int32, check_staging, key_mask_arguments, key_rows_rotated, load_rotated, rotation_arguments,
                     store_rotated_rows, store_token_scales, to_bf16_rne, unspecialized)


@triton.jit(**unspecialized("num_tokens"))
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    loc_ptr,
    p2s_ptr,
    stg_k_ptr,
    stg_v_ptr,
    stg_scale_ptr,
    q_ptr,
    q_out_ptr,
    krot_ptr,
    num_tokens,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_qt,
    stride_qh,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HQ: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    D: tl.constexpr,
    LOG2D: tl.constexpr,
    P: tl.constexpr,
    S: tl.constexpr,
    ROTATE: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
    KEY_MASK: tl.constexpr,
    QG: tl.constexpr,
    HAS_KV: tl.constexpr,
    HAS_Q: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr = False,
):
    # One program per token: its K/V into staging (HAS_KV), its queries rotated (HAS_Q), or both.
    # KEY_MASK: only the KV heads flagged in krot_ptr have their keys rotated, and the queries of
    # their QG query heads; values follow ROTATE in every head. LAUNCH_DEPENDENTS: the next launch
    # (a programmatic dependent launch, which waits for this one's stores where it reads them) may start.
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    i_t = tl.program_id(0).to(tl.int64)
    if HAS_KV:
        o_h = tl.arange(0, BLOCK_H)
        o_d = tl.arange(0, D)
        m_h = o_h < H
        loc = tl.load(loc_ptr + i_t).to(tl.int64)
        page = loc // P
        slot = loc % P
        stg = tl.load(p2s_ptr + page).to(tl.int64)
        # A token of a sealed page (or the padding slot of a CUDA-graph batch) is never written.
        if stg >= 0:
            if KEY_MASK:
                r_h = key_rows_rotated(krot_ptr, o_h, m_h)
            else:
                r_h = m_h
            b_k = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D, KEY_MASK, r_h)
            b_v = load_rotated(v_ptr, i_t, stride_vt, stride_vh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D, False, m_h)
            o_stg = ((stg * H + o_h[:, None]) * P + slot) * D + o_d[None, :]
            tl.store(stg_k_ptr + o_stg, to_bf16_rne(b_k), mask=m_h[:, None])
            tl.store(stg_v_ptr + o_stg, to_bf16_rne(b_v), mask=m_h[:, None])
            store_token_scales(b_k, stg_scale_ptr + (stg * P + slot) * S, o_h, m_h, S)
    if HAS_Q:
        o_hq = tl.arange(0, BLOCK_HQ)
        m_hq = o_hq < HQ
        if KEY_MASK:
            r_hq = key_rows_rotated(krot_ptr, o_hq // QG, m_hq)
        else:
            r_hq = m_hq
        store_rotated_rows(q_ptr, q_out_ptr, i_t, stride_qt, stride_qh, o_hq, m_hq, HQ, BLOCK_HQ, D, LOG2D, ROTATE, INV_SQRT_D,
                           KEY_MASK, r_hq)


# The K/V arguments of a launch that only rotates queries (not read without HAS_KV).
_KV_POINTERS = ("k_ptr", "v_ptr", "loc_ptr", "p2s_ptr", "stg_k_ptr", "stg_v_ptr", "stg_scale_ptr")
_KV_SIZES = ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "S")


def _launch(t: int, d: int, rotate: dict[str, object], q: torch.Tensor | None, q_out: torch.Tensor | None,
            kv: dict[str, object] | None, key_rotated: torch.Tensor | None, num_kv_heads: int,
            launch_dependents: bool = False) -> None:
    """``_write_kv_kernel`` over ``t`` tokens of head dim ``d``: the K/V write when ``kv`` (its K/V
    arguments by name) is given, the query rotation into ``q_out`` when ``q`` is; ``rotate``:
    ``rotation_arguments``; ``key_rotated``: `PagedLayer.key_rotated` of ``num_kv_heads`` heads;
    ``launch_dependents``: the next launch, a programmatic dependent one, may start right away."""
    has_kv = kv is not None
    anchor = kv["k_ptr"] if kv is not None else q
    mask = key_mask_arguments(key_rotated, rotation=bool(rotate["ROTATE"]), num_kv_heads=num_kv_heads,
                              device=anchor.device, placeholder=anchor)
    if not has_kv:
        kv = {**dict.fromkeys(_KV_POINTERS, q), **dict.fromkeys(_KV_SIZES, 0), "H": 1, "BLOCK_H": 1, "P": 1}
    hq = q.shape[1] if q is not None else 1
    _write_kv_kernel[(t,)](
        **kv,
        q_ptr=q if q is not None else kv["k_ptr"],  # not read without HAS_Q
        q_out_ptr=q_out if q_out is not None else kv["k_ptr"],
        num_tokens=t,
        stride_qt=q.stride(0) if q is not None else 0,
        stride_qh=q.stride(1) if q is not None else 0,
        HQ=hq,
        BLOCK_HQ=triton.next_power_of_2(hq),
        D=d,
        **rotate,
        **mask,
        QG=max(1, hq // num_kv_heads),
        HAS_KV=has_kv,
        HAS_Q=q is not None,
        LAUNCH_DEPENDENTS=launch_dependents,
        num_warps=4,
    )


def oscar_write_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    loc: torch.Tensor,
    page_to_staging: torch.Tensor,
    staging_k: torch.Tensor,
    staging_v: torch.Tensor,
    staging_scale: torch.Tensor | None,
    rotation: bool = True,
    q: torch.Tensor | None = None,
    q_rot_out: torch.Tensor | None = None,
    key_rotated: torch.Tensor | None = None,
    _launch_dependents: bool = False,
) -> torch.Tensor | None:
    """Rotate a step's new keys/values, compute s_t and write them into the staging pages.

    Args:
        k, v: ``[T, H, D]`` post-RoPE keys/values of the step (any float dtype; last dim contiguous).
        loc: ``[T]`` int32/int64 KV slot of each token (``page * P + offset``). Tokens whose page maps
            to ``-1`` in ``page_to_staging`` (sealed pages, the padding slot) are skipped.
        page_to_staging: ``[num_pages]`` int32, staging index of each open page, ``-1`` if sealed.
        staging_k, staging_v: ``[num_staging, H, P, D]`` bf16, receive ``bf16(H_D k)`` / ``bf16(H_D v)``.
        staging_scale: ``[num_staging, P, S]`` fp32, receives s_t (S=1: norm over all heads and
            channels of the layer; S=H: per head; zero norms stored as 1), or None (no token scaling).
        rotation: apply the Walsh-Hadamard rotation (False: the `kivi` / `scaling-only` ablations).
        q: optional ``[T, Hq, D]`` queries of the same tokens, rotated in the same launch.
        q_rot_out: optional ``[T, Hq, D]`` fp32 destination of the rotated queries.
        key_rotated: ``[H]`` int32 per-head key-rotation flags (`PagedLayer.key_rotated`): only
            the flagged heads' keys, and their queries, are rotated; None: every head's.
        _launch_dependents: the decode launcher only (``_DecodeTuning.split_pdl``): the launch that
            follows is a programmatic dependent one and may start at once (sm_90+).
    Returns:
        The rotated queries ``[T, Hq, D]`` fp32 when ``q`` is given, else None.
    """
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, H, D], got {tuple(k.shape)} / {tuple(v.shape)}")
    t, h, d = k.shape
    rotate = rotation_arguments(d, rotation)
    page_size, s_cols = check_staging(staging_k, staging_v, staging_scale, num_kv_heads=h, head_dim=d)
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("k and v must be contiguous along head_dim")
    if loc.shape != (t,):
        raise ValueError(f"loc must be [T]={t}, got {tuple(loc.shape)}")
    check_int32(page_to_staging=page_to_staging)
    if q is not None:
        if q.dim() != 3 or q.shape[0] != t or q.shape[2] != d or q.stride(2) != 1 or q.shape[1] % h:
            raise ValueError(f"q must be [T={t}, Hq, D={d}] contiguous along D with Hq a multiple of H={h}, got {tuple(q.shape)}")
        if q_rot_out is None:
            q_rot_out = torch.empty((t, q.shape[1], d), dtype=torch.float32, device=q.device)
        else:
            check_fp32_buffer("q_rot_out", q_rot_out, (t, q.shape[1], d))
    if t == 0:
        return q_rot_out
    kv = {
        "k_ptr": k,
        "v_ptr": v,
        "loc_ptr": loc,
        "p2s_ptr": page_to_staging,
        "stg_k_ptr": staging_k,
        "stg_v_ptr": staging_v,
        "stg_scale_ptr": staging_scale if staging_scale is not None else staging_k,  # not read when S == 0
        "stride_kt": k.stride(0),
        "stride_kh": k.stride(1),
        "stride_vt": v.stride(0),
        "stride_vh": v.stride(1),
        "H": h,
        "BLOCK_H": triton.next_power_of_2(h),
        "P": page_size,
        "S": s_cols,
    }
    if _launch_dependents and gdc_launch_dependents is None:
        raise RuntimeError("this Triton has no grid dependency control (triton.language.extra.cuda.gdc_launch_dependents)")
    _launch(t, d, rotate, q, q_rot_out, kv, key_rotated, h, launch_dependents=_launch_dependents)
    return q_rot_out


def oscar_rotate_q(*, q: torch.Tensor, rotation: bool = True, out: torch.Tensor | None = None,
                   key_rotated: torch.Tensor | None = None) -> torch.Tensor:
    """``H_D q`` in fp32 for queries ``[T, Hq, D]`` (contiguous along D): one small launch.

    Returns ``out`` (``[T, Hq, D]`` fp32, allocated when None). With ``rotation=False`` it is a copy
    to fp32, so the attention kernels take the same input either way. ``key_rotated``: ``[H]``
    int32 per-KV-head flags (`PagedLayer.key_rotated`, Hq a multiple of H): only the queries of
    flagged heads are rotated.
    """
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [T, Hq, D] contiguous along D, got {tuple(q.shape)}")
    t, hq, d = q.shape
    rotate = rotation_arguments(d, rotation)
    if out is None:
        out = torch.empty((t, hq, d), dtype=torch.float32, device=q.device)
    else:
        check_fp32_buffer("out", out, (t, hq, d))
    h = key_rotated.shape[0] if key_rotated is not None and key_rotated.dim() == 1 else 1
    if key_rotated is not None and hq % max(1, h):
        raise ValueError(f"q has {hq} heads, not a multiple of the {h} KV heads of key_rotated")
    if t:
        _launch(t, d, rotate, q, out, None, key_rotated, h)
    return out
