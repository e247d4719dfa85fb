"""Write path: a step's new keys/values -> rotated BF16 in the open staging pages, plus s_t.

One program per new token. It reads the token's post-RoPE K and V of every KV head of the layer,
applies the normalized Walsh-Hadamard rotation in fp32, computes the token scale s_t (L2 norm over
the layer's KV heads, or per head), and writes BF16 K/V and the fp32 s_t into the staging page that
``page_to_staging`` maps the token's page to. The same launch can rotate the step's queries, so the
attention kernels that follow read them ready (the "one small launch" of the query rotation is
this one).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import fwht_rows, log2_exact, to_bf16_rne


@triton.jit
def load_rotated(ptr, i_t, stride_t, stride_h, o_h, m_h, ROWS: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
                 ROTATE: tl.constexpr, INV_SQRT_D: tl.constexpr):
    """Rows ``o_h`` (heads) of token ``i_t`` as fp32 ``[ROWS, D]``, Walsh-Hadamard rotated when ROTATE."""
    x = tl.load(ptr + i_t * stride_t + o_h[:, None] * stride_h + tl.arange(0, D)[None, :], mask=m_h[:, None], other=0.0)
    x = x.to(tl.float32)
    if ROTATE:
        x = fwht_rows(x, ROWS, D, LOG2D) * INV_SQRT_D
    return x


@triton.jit
def store_token_scales(b_k, p_scale, o_h, m_h, S: tl.constexpr):
    """s_t of the rotated keys ``b_k`` ``[rows, D]`` of one token: the norm over every row (S == 1)
    or per row (S > 1, stored at ``p_scale + o_h``); a zero norm is stored as 1."""
    if S == 1:
        b_s = tl.sqrt_rn(tl.sum(tl.sum(b_k * b_k, axis=1), axis=0))
        tl.store(p_scale, tl.where(b_s > 0.0, b_s, 1.0))
    elif S > 1:
        b_s = tl.sqrt_rn(tl.sum(b_k * b_k, axis=1))
        tl.store(p_scale + o_h, tl.where(b_s > 0.0, b_s, 1.0), mask=m_h)


@triton.jit(do_not_specialize=["num_tokens"])
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
    HAS_Q: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, D)
    m_h = o_h < H

    loc = tl.load(loc_ptr + i_t).to(tl.int64)
    page = loc // P
    slot = loc % P
    stg = tl.load(p2s_ptr + page).to(tl.int64)
    # A token of a sealed page (or the padding slot of a CUDA-graph batch) is never written.
    if stg >= 0:
        b_k = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D)
        b_v = load_rotated(v_ptr, i_t, stride_vt, stride_vh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D)
        o_stg = ((stg * H + o_h[:, None]) * P + slot) * D + o_d[None, :]
        tl.store(stg_k_ptr + o_stg, to_bf16_rne(b_k), mask=m_h[:, None])
        tl.store(stg_v_ptr + o_stg, to_bf16_rne(b_v), mask=m_h[:, None])
        store_token_scales(b_k, stg_scale_ptr + (stg * P + slot) * S, o_h, m_h, S)
    if HAS_Q:
        o_hq = tl.arange(0, BLOCK_HQ)
        m_hq = o_hq < HQ
        b_q = load_rotated(q_ptr, i_t, stride_qt, stride_qh, o_hq, m_hq, BLOCK_HQ, D, LOG2D, ROTATE, INV_SQRT_D)
        tl.store(q_out_ptr + (i_t * HQ + o_hq[:, None]) * D + o_d[None, :], b_q, mask=m_hq[:, None])


@triton.jit
def write_token(
    k_ptr, v_ptr, loc_ptr, p2s_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr, i_t, i_h,
    stride_kt, stride_kh, stride_vt, stride_vh,
    H: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr, P: tl.constexpr,
    S: tl.constexpr, ROTATE: tl.constexpr, INV_SQRT_D: tl.constexpr,
):
    """The write path of KV head ``i_h`` of token ``i_t`` (the decode kernel's fused write): the
    same values as ``_write_kv_kernel`` for that head. With the layer norm scope (``S == 1``) the
    program of head 0 also computes and stores s_t (over every head's rotated key)."""
    o_d = tl.arange(0, D)
    loc = tl.load(loc_ptr + i_t).to(tl.int64)
    page = loc // P
    slot = loc % P
    stg = tl.load(p2s_ptr + page).to(tl.int64)
    if stg >= 0:  # padding slots (page 0, CUDA-graph batches) are never written
        o_1 = i_h + tl.arange(0, 1)
        m_1 = o_1 >= 0
        b_k = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_1, m_1, 1, D, LOG2D, ROTATE, INV_SQRT_D)
        b_v = load_rotated(v_ptr, i_t, stride_vt, stride_vh, o_1, m_1, 1, D, LOG2D, ROTATE, INV_SQRT_D)
        o_stg = ((stg * H + i_h) * P + slot) * D + o_d[None, :]
        tl.store(stg_k_ptr + o_stg, to_bf16_rne(b_k))
        tl.store(stg_v_ptr + o_stg, to_bf16_rne(b_v))
        p_scale = stg_scale_ptr + (stg * P + slot) * S
        if S == 1:
            if i_h == 0:  # the layer norm needs every head's rotated key
                o_h = tl.arange(0, BLOCK_H)
                m_h = o_h < H
                b_ka = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D)
                store_token_scales(b_ka, p_scale, o_h, m_h, S)
        else:
            store_token_scales(b_k, p_scale, o_1, m_1, S)

@triton.jit(do_not_specialize=["num_tokens"])
def _rotate_q_kernel(
    q_ptr,
    q_out_ptr,
    num_tokens,
    stride_qt,
    stride_qh,
    HQ: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    D: tl.constexpr,
    LOG2D: tl.constexpr,
    ROTATE: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    o_d = tl.arange(0, D)
    o_hq = tl.arange(0, BLOCK_HQ)
    m_hq = o_hq < HQ
    b_q = load_rotated(q_ptr, i_t, stride_qt, stride_qh, o_hq, m_hq, BLOCK_HQ, D, LOG2D, ROTATE, INV_SQRT_D)
    tl.store(q_out_ptr + (i_t * HQ + o_hq[:, None]) * D + o_d[None, :], b_q, mask=m_hq[:, None])


def _check_staging(stg_k: torch.Tensor, stg_v: torch.Tensor, stg_scale: torch.Tensor | None, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    if stg_k.dtype != torch.bfloat16 or stg_v.dtype != torch.bfloat16:
        raise TypeError(f"staging K/V must be bfloat16, got {stg_k.dtype} / {stg_v.dtype}")
    if stg_k.dim() != 4 or stg_k.shape != stg_v.shape:
        raise ValueError(f"staging K/V must both be [num_staging, H, P, D], got {tuple(stg_k.shape)} / {tuple(stg_v.shape)}")
    if stg_k.shape[1] != num_kv_heads or stg_k.shape[3] != head_dim:
        raise ValueError(f"staging {tuple(stg_k.shape)} does not match H={num_kv_heads}, D={head_dim}")
    if not (stg_k.is_contiguous() and stg_v.is_contiguous()):
        raise ValueError("staging K/V must be contiguous")
    page_size = stg_k.shape[2]
    s_cols = 0
    if stg_scale is not None:
        if stg_scale.dtype != torch.float32 or stg_scale.dim() != 3 or not stg_scale.is_contiguous():
            raise ValueError(f"staging scale must be contiguous fp32 [num_staging, P, S], got {stg_scale.dtype} {tuple(stg_scale.shape)}")
        if stg_scale.shape[:2] != stg_k.shape[:1] + stg_k.shape[2:3]:
            raise ValueError(f"staging scale {tuple(stg_scale.shape)} does not match staging K {tuple(stg_k.shape)}")
        s_cols = stg_scale.shape[2]
        if s_cols not in (1, num_kv_heads):
            raise ValueError(f"staging scale has {s_cols} columns; expected 1 (layer scope) or H={num_kv_heads} (head scope)")
    return page_size, s_cols


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
    Returns:
        The rotated queries ``[T, Hq, D]`` fp32 when ``q`` is given, else None.
    """
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, H, D], got {tuple(k.shape)} / {tuple(v.shape)}")
    t, h, d = k.shape
    log2d = log2_exact(d, "head_dim")
    page_size, s_cols = _check_staging(staging_k, staging_v, staging_scale, h, d)
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("k and v must be contiguous along head_dim")
    if loc.shape != (t,):
        raise ValueError(f"loc must be [T]={t}, got {tuple(loc.shape)}")
    if page_to_staging.dtype != torch.int32:
        raise TypeError(f"page_to_staging must be int32, got {page_to_staging.dtype}")
    hq = 1
    if q is not None:
        if q.dim() != 3 or q.shape[0] != t or q.shape[2] != d or q.stride(2) != 1:
            raise ValueError(f"q must be [T={t}, Hq, D={d}] contiguous along D, got {tuple(q.shape)}")
        hq = q.shape[1]
        if q_rot_out is None:
            q_rot_out = torch.empty((t, hq, d), dtype=torch.float32, device=q.device)
        elif q_rot_out.shape != (t, hq, d) or q_rot_out.dtype != torch.float32 or not q_rot_out.is_contiguous():
            raise ValueError(f"q_rot_out must be contiguous fp32 [{t}, {hq}, {d}]")
    if t == 0:
        return q_rot_out
    scale_arg = staging_scale if staging_scale is not None else staging_k
    _write_kv_kernel[(t,)](
        k,
        v,
        loc,
        page_to_staging,
        staging_k,
        staging_v,
        scale_arg,
        q if q is not None else k,
        q_rot_out if q_rot_out is not None else k,
        t,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        q.stride(0) if q is not None else 0,
        q.stride(1) if q is not None else 0,
        H=h,
        BLOCK_H=triton.next_power_of_2(h),
        HQ=hq,
        BLOCK_HQ=triton.next_power_of_2(hq),
        D=d,
        LOG2D=log2d,
        P=page_size,
        S=s_cols,
        ROTATE=rotation,
        INV_SQRT_D=1.0 / math.sqrt(d),
        HAS_Q=q is not None,
        num_warps=4,
    )
    return q_rot_out


def oscar_rotate_q(*, q: torch.Tensor, rotation: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """``H_D q`` in fp32 for queries ``[T, Hq, D]`` (contiguous along D): one small launch.

    Returns ``out`` (``[T, Hq, D]`` fp32, allocated when None). With ``rotation=False`` it is a copy
    to fp32, so the attention kernels take the same input either way.
    """
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [T, Hq, D] contiguous along D, got {tuple(q.shape)}")
    t, hq, d = q.shape
    log2d = log2_exact(d, "head_dim")
    if out is None:
        out = torch.empty((t, hq, d), dtype=torch.float32, device=q.device)
    elif out.shape != q.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous fp32 {tuple(q.shape)}")
    if t:
        _rotate_q_kernel[(t,)](
            q,
            out,
            t,
            q.stride(0),
            q.stride(1),
            HQ=hq,
            BLOCK_HQ=triton.next_power_of_2(hq),
            D=d,
            LOG2D=log2d,
            ROTATE=rotation,
            INV_SQRT_D=1.0 / math.sqrt(d),
            num_warps=4,
        )
    return out
