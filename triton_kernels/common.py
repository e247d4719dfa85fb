"""Helpers shared by the OScaR kernels: the Walsh-Hadamard butterfly, the bit-exact quantizer of
docs/LAYOUT.md section 1, the write path of one token (rotate, BF16 staging, s_t), the
dequantization of packed codes straight into tensor-core operands, the attention tiles (sealed
page / open page) of decode and extend, and the checks of the tensors the launchers are given.
Kernel modules import shared code from here only, never from each other's private names.

Every helper here runs both compiled (CUDA) and under ``TRITON_INTERPRET=1`` except the inline-PTX
dequantization, which the launchers switch off in the interpreter (``USE_ASM=False``; the plain
path computes the same values with integer ops).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..supported import check_kernel_shape


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_asm(device: torch.device) -> bool:
    """Whether the inline-PTX fast paths may be used on tensors of ``device``."""
    return device.type == "cuda" and not interpreting() and torch.version.hip is None


def unspecialized(*values: str, pointers: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """``triton.jit`` keyword arguments that keep a launch's per-batch values out of the compile key:
    the integers in ``values`` (batch sizes, plan lengths, windows) are specialized neither on
    ``== 1`` nor on divisibility by 16, and the index pointers in ``pointers`` (which the
    launchers may pass as slices of a batch's tables) not on 16-byte alignment. Otherwise a
    server compiles a new variant of a kernel the first time a batch brings a new combination, a
    multi-second stall in the middle of serving (benches/results/serving.md, session 17)."""
    import inspect

    kw: dict[str, list[str]] = {"do_not_specialize": list(values)}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        kw["do_not_specialize_on_alignment"] = list(values) + list(pointers)
    return kw


def log2_exact(x: int, what: str) -> int:
    """log2 of a power of two, with an error that names the quantity otherwise."""
    if x <= 0 or x & (x - 1):
        raise ValueError(f"{what} must be a positive power of two, got {x}")
    return x.bit_length() - 1


# ---------------------------------------------------------------------------------------------
# Host-side checks of what a launcher is given. The configuration rules (bits, groups, page size,
# head_dim) are ``oscar_sgl.supported.check_kernel_shape``; these check the tensors against them.
# ---------------------------------------------------------------------------------------------


def check_int32(**tensors: torch.Tensor) -> None:
    """TypeError naming the first of the index / map tensors that is not int32."""
    for name, t in tensors.items():
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")


def check_fp32_buffer(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """ValueError unless ``t`` (rotated queries, their scratch) is a contiguous fp32 tensor of ``shape``."""
    if tuple(t.shape) != tuple(shape) or t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous fp32 {list(shape)}, got {t.dtype} {tuple(t.shape)}")


def check_window(window_left: int | None) -> int | None:
    """A launch's sliding window (SGLang's ``RadixAttention.sliding_window_size``): None or a
    negative int (SGLang's -1) is no window; otherwise an int below 2^31 (a kernel argument)."""
    if window_left is None:
        return None
    if isinstance(window_left, bool) or not isinstance(window_left, int):
        raise TypeError(f"window_left must be an int or None, got {type(window_left).__name__}")
    if window_left < 0:
        return None
    if window_left >= 2**31:
        raise ValueError(f"window_left must be below 2^31, got {window_left}")
    return window_left


def check_sealed_tile(block_n: int, *, page_size: int, k_group: int) -> None:
    """A sealed-page tile of ``block_n`` tokens (a tuning choice): whole MMA tiles, whole tiles per
    page, and key groups that nest with the tile (one group spans whole tiles or the reverse)."""
    if page_size % block_n or block_n % 16 or (block_n % k_group and k_group % block_n):
        raise ValueError(f"block_n={block_n} must be a multiple of 16 dividing the page size {page_size} and nest with "
                         f"k_group={k_group}")


def check_pool(k_codes: torch.Tensor, k_params: torch.Tensor, v_codes: torch.Tensor, v_params: torch.Tensor,
               scale: torch.Tensor | None, *, bits: int, k_group: int, v_group: int, head_dim: int,
               k_ranges: torch.Tensor | None = None) -> tuple[int, int, int, int]:
    """The packed pool of one layer (docs/LAYOUT.md section 3) for heads of ``head_dim`` channels:
    a configuration the kernels support, and contiguous tensors of its shapes and dtypes.
    ``k_ranges``: page-grid key ranges (``key_ranges="page"``): uint8 ``[num_pages, H, P/k_group,
    2, D]``, and then ``k_params`` holds the page grids, fp16 ``[num_pages, H, 1, 2, D]``.

    Returns ``(num_pages, H, P, S)``, S the token-scale columns (0: no token scaling)."""
    if k_codes.dim() != 4:
        raise ValueError(f"k_codes must be [num_pages, H, P, D*bits/8], got {tuple(k_codes.shape)}")
    npages, h, p, _ = k_codes.shape
    check_kernel_shape(bits=bits, k_group=k_group, v_group=v_group, page_size=p, head_dim=head_dim)
    nbytes = head_dim * bits // 8
    expect = {
        "k_codes": (k_codes, (npages, h, p, nbytes), torch.uint8),
        "k_params": (k_params, (npages, h, 1 if k_ranges is not None else p // k_group, 2, head_dim), torch.float16),
        "v_codes": (v_codes, (npages, h, p, nbytes), torch.uint8),
        "v_params": (v_params, (npages, h, p, 2, head_dim // v_group), torch.float16),
    }
    if k_ranges is not None:
        expect["k_ranges"] = (k_ranges, (npages, h, p // k_group, 2, head_dim), torch.uint8)
    for name, (t, shape, dtype) in expect.items():
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
    s_cols = 0
    if scale is not None:
        s_cols = scale.shape[-1]
        if tuple(scale.shape) != (npages, p, s_cols) or scale.dtype != torch.float32 or not scale.is_contiguous():
            raise ValueError(f"scale must be contiguous fp32 [{npages}, {p}, S], got {scale.dtype} {tuple(scale.shape)}")
        if s_cols not in (1, h):
            raise ValueError(f"scale must have 1 or H={h} columns, got {s_cols}")
    return npages, h, p, s_cols


def check_staging(stg_k: torch.Tensor, stg_v: torch.Tensor, stg_scale: torch.Tensor | None, *, num_kv_heads: int,
                  head_dim: int, page_size: int | None = None, scale_columns: int | None = None) -> tuple[int, int]:
    """Staging pages: contiguous bf16 K/V ``[num_staging, H, P, D]`` and fp32 token scales
    ``[num_staging, P, S]`` (S = 1: layer scope, S = H: head scope) or None. ``page_size`` /
    ``scale_columns``: the pool's P and S, when the staging must match a pool.

    Returns ``(P, S)``, S = 0 without token scales."""
    if stg_k.dtype != torch.bfloat16 or stg_v.dtype != torch.bfloat16:
        raise TypeError(f"staging K/V must be bfloat16, got {stg_k.dtype} / {stg_v.dtype}")
    if stg_k.dim() != 4 or stg_k.shape != stg_v.shape:
        raise ValueError(f"staging K/V must both be [num_staging, H, P, D], got {tuple(stg_k.shape)} / {tuple(stg_v.shape)}")
    if stg_k.shape[1] != num_kv_heads or stg_k.shape[3] != head_dim:
        raise ValueError(f"staging {tuple(stg_k.shape)} does not match H={num_kv_heads}, D={head_dim}")
    if page_size is not None and stg_k.shape[2] != page_size:
        raise ValueError(f"staging pages hold {stg_k.shape[2]} tokens, the pool's {page_size}")
    if not (stg_k.is_contiguous() and stg_v.is_contiguous()):
        raise ValueError("staging K/V must be contiguous")
    s_cols = 0
    if stg_scale is not None:
        if stg_scale.dtype != torch.float32 or stg_scale.dim() != 3 or not stg_scale.is_contiguous():
            raise ValueError(f"staging scale must be contiguous fp32 [num_staging, P, S], got {stg_scale.dtype} {tuple(stg_scale.shape)}")
        if stg_scale.shape[:2] != stg_k.shape[:1] + stg_k.shape[2:3]:
            raise ValueError(f"staging scale {tuple(stg_scale.shape)} does not match staging K {tuple(stg_k.shape)}")
        s_cols = stg_scale.shape[2]
        if s_cols not in (1, num_kv_heads):
            raise ValueError(f"staging scale has {s_cols} columns; expected 1 (layer scope) or H={num_kv_heads} (head scope)")
    if scale_columns is not None and s_cols != scale_columns:
        raise ValueError(f"staging scale has {s_cols} columns, the pool's scale {scale_columns} (0: None; token scaling "
                         "is on for both or for neither)")
    return stg_k.shape[2], s_cols


@dataclass(frozen=True)
class PagedLayer:
    """One layer of an OScaR pool as the attention kernels read it (docs/LAYOUT.md §3).

    Attributes:
        k_codes, v_codes: ``[num_pages, H, P, D*bits/8]`` uint8 packed codes.
        k_params: ``[num_pages, H, P/k_group, 2, D]`` fp16; v_params: ``[num_pages, H, P, 2, D/v_group]`` fp16.
            With page-grid key ranges (``k_ranges`` given) ``k_params`` is ``[num_pages, H, 1, 2, D]``:
            each page's grid (base, step) per channel.
        scale: ``[num_pages, P, S]`` fp32 token scales, or None when token scaling is off.
        staging_k, staging_v: ``[num_staging, H, P, D]`` bf16, rotated K/V of open pages.
        page_to_staging: ``[num_pages]`` int32, staging slot of an open page, -1 when sealed.
        bits, k_group, v_group, rotation: the layer's `OscarConfig` values (``oscar_sgl.supported``).
        key_rotated: ``[H]`` int32 on the pool's device, nonzero where that KV head's keys (and the
            queries that read them) are rotated, when the layer's key-rotation plan rotates some
            heads' keys and not others (`reference.key_rotation_plan`); None: every head's keys
            follow ``rotation``. Values follow ``rotation`` in every head.
    """

    k_codes: torch.Tensor
    k_params: torch.Tensor
    v_codes: torch.Tensor
    v_params: torch.Tensor
    scale: torch.Tensor | None
    staging_k: torch.Tensor
    staging_v: torch.Tensor
    page_to_staging: torch.Tensor
    bits: int
    k_group: int
    v_group: int
    rotation: bool = True
    key_rotated: torch.Tensor | None = None
    #: ``[num_pages, H, P/k_group, 2, D]`` uint8 (a, b) grid indices of every key group with
    #: ``key_ranges="page"`` (docs/LAYOUT.md §1); None: fp16 (scale, offset) pairs in ``k_params``.
    k_ranges: torch.Tensor | None = None


def check_attention_inputs(q: torch.Tensor, layer: PagedLayer, *, rows: str) -> tuple[int, int, int, int, int, int]:
    """Queries ``[rows, Hq, D]`` (contiguous along D; Hq a multiple of the KV heads H) and the
    layer's pool, staging pages and page map they attend over (``check_pool``, ``check_staging``).

    Returns ``(rows, Hq, D, H, P, S)``."""
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [{rows}, Hq, D] contiguous along D, got {tuple(q.shape)}")
    n, hq, d = q.shape
    L = layer
    _, h, p, s_cols = check_pool(L.k_codes, L.k_params, L.v_codes, L.v_params, L.scale, bits=L.bits, k_group=L.k_group,
                                 v_group=L.v_group, head_dim=d, k_ranges=L.k_ranges)
    if hq % h:
        raise ValueError(f"q must be [{rows}, Hq, D={d}] with Hq a multiple of H={h}, got {tuple(q.shape)}")
    check_staging(L.staging_k, L.staging_v, None, num_kv_heads=h, head_dim=d, page_size=p)
    check_int32(page_to_staging=L.page_to_staging)
    return n, hq, d, h, p, s_cols


POOL_TENSORS = ("kw_ptr", "kp_ptr", "vw_ptr", "vp_ptr", "scale_ptr", "stg_k_ptr", "stg_v_ptr", "p2s_ptr", "kr_ptr")
"""The order of the attention kernels' ``pool`` tuple (``pool_arguments``), by the names the Gluon
stage 1 takes them under (``named_pool_arguments``)."""


def pool_format(k_codes: torch.Tensor, staging_k: torch.Tensor, scale: torch.Tensor | None, *, bits: int, k_group: int,
                v_group: int, key_page: bool = False) -> dict[str, object]:
    """The compile-time shape and format of a layer's pool by kernel parameter name (``H, D, P, S,
    BITS, G_K, G_V, KEY_PAGE``), from its codes ``[pages, H, P, ..]``, staging ``[.., D]`` and token
    scales ``[.., S]`` (None: S = 0), as checked by ``check_pool`` / ``check_staging``; ``key_page``:
    page-grid key ranges."""
    _, h, p, _ = k_codes.shape
    return {"H": h, "D": staging_k.shape[3], "P": p, "S": scale.shape[-1] if scale is not None else 0, "BITS": bits,
            "G_K": k_group, "G_V": v_group, "KEY_PAGE": key_page}


def pool_arguments(layer: PagedLayer) -> dict[str, object]:
    """What the attention kernels read about the layer's pool, by parameter name: ``pool``, the
    tuple of tensors in ``POOL_TENSORS`` order (the codes and params as the int32 views ``tile_raw``
    reads, the token scales (any tensor when None: not read with S == 0), the staging pages and the
    page -> staging map), and ``pool_format``. ``layer`` as checked by ``check_attention_inputs``."""
    L = layer
    pool = (L.k_codes.view(torch.int32), L.k_params.flatten(-2).view(torch.int32), L.v_codes.view(torch.int32),
            L.v_params.flatten(-2).view(torch.int32), L.scale if L.scale is not None else L.k_params, L.staging_k, L.staging_v,
            L.page_to_staging, L.k_ranges.view(torch.int16) if L.k_ranges is not None else L.k_codes)  # (read only with KEY_PAGE)
    return {"pool": pool, **pool_format(L.k_codes, L.staging_k, L.scale, bits=L.bits, k_group=L.k_group, v_group=L.v_group,
                                        key_page=L.k_ranges is not None)}


def named_pool_arguments(layer: PagedLayer) -> dict[str, object]:
    """``pool_arguments`` with the ``pool`` tuple spread under the ``POOL_TENSORS`` names (the Gluon
    stage 1's parameters; ``kr_ptr``, the groups' index bytes, read only with ``KEY_PAGE``)."""
    args = pool_arguments(layer)
    named = dict(zip(POOL_TENSORS, args.pop("pool")))
    return {**named, **args}


def rotation_arguments(head_dim: int, rotation: bool) -> dict[str, object]:
    """The compile-time arguments of ``fwht_rows`` / ``load_rotated`` by parameter name: whether to
    rotate, log2 of the head dimension (a power of two, else ValueError) and the normalization."""
    return {"ROTATE": rotation, "LOG2D": log2_exact(head_dim, "head_dim"), "INV_SQRT_D": 1.0 / math.sqrt(head_dim)}


def key_mask_arguments(key_rotated: torch.Tensor | None, *, rotation: bool, num_kv_heads: int,
                       device: torch.device, placeholder: torch.Tensor) -> dict[str, object]:
    """The per-head key-rotation arguments of the kernels that rotate keys or queries (write,
    decode): ``krot_ptr`` (the ``[H]`` int32 flags, or ``placeholder``, not read) and ``KEY_MASK``
    (compile time: False when every head's keys follow ``rotation``, the common case, which then
    compiles exactly as without a plan). ``key_rotated`` as `PagedLayer.key_rotated`."""
    if key_rotated is None or not rotation:
        return {"krot_ptr": placeholder, "KEY_MASK": False}
    if key_rotated.shape != (num_kv_heads,) or key_rotated.dtype != torch.int32:
        raise ValueError(f"key_rotated must be [H={num_kv_heads}] int32, got {tuple(key_rotated.shape)} {key_rotated.dtype}")
    if key_rotated.device != torch.device(device):
        raise ValueError(f"key_rotated is on {key_rotated.device}, the launch on {device}")
    return {"krot_ptr": key_rotated, "KEY_MASK": True}


# ---------------------------------------------------------------------------------------------
# Walsh-Hadamard rotation
# ---------------------------------------------------------------------------------------------


@triton.jit
def fwht_rows(x, ROWS: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr):
    """Unnormalized Sylvester butterfly over the last dim of an fp32 ``[ROWS, D]`` block.

    Stage ``h`` pairs element ``i`` with ``i + h`` inside blocks of ``2h`` and writes
    ``(a + b, a - b)``: the same additions in the same order as ``reference.hadamard``, so after
    the caller's multiplication by ``1/sqrt(D)`` the result is bit-identical to it.
    """
    for i in tl.static_range(LOG2D):
        y = tl.reshape(x, (ROWS, D // (2 << i), 2, 1 << i))
        y = tl.permute(y, (0, 1, 3, 2))
        a, b = tl.split(y)
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, (ROWS, D))
    return x


@triton.jit
def to_bf16_rne(x):
    """fp32 -> bf16, round to nearest even, with integer ops (finite inputs).

    The same bits as the hardware conversion, also under the interpreter, whose own fp32->bf16
    cast truncates.
    """
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)


# ---------------------------------------------------------------------------------------------
# Quantizer (docs/LAYOUT.md section 1), bit-exact with the torch reference
# ---------------------------------------------------------------------------------------------


@triton.jit
def rne(x):
    """Round half to even of fp32 ``x``, keeping the sign of zero (``torch.round`` / ``rint``).

    ``(|x| + 2^23) - 2^23`` rounds to an integer under IEEE round-to-nearest-even for
    ``|x| < 2^23``; larger magnitudes are integers already. The sign bit is copied back so that
    ``rne(-0.3) == -0.0`` as in torch (it decides the sign of a zero offset, hence its fp16 bytes).
    """
    ax = tl.abs(x)
    r = tl.where(ax < 8388608.0, (ax + 8388608.0) - 8388608.0, ax)
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def neg(x):
    """IEEE negation of fp32 ``x`` (flips the sign bit). Triton 3.6 compiles ``-x`` as ``0 - x``
    (``+0`` stays ``+0``; 3.8 emits a true negation), and the sign of a zero offset is part of the
    bytes."""
    return (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def quantize(x, lo, hi, QMAX: tl.constexpr, OFFSET_MIN: tl.constexpr = False):
    """Asymmetric min/max quantization of fp32 ``x`` whose group min/max are ``lo``/``hi``.

    ``lo``/``hi`` broadcast against ``x`` (the group axis kept as size 1). True divisions
    (``div_rn``), never reciprocals. Returns ``(q, scale, offset)`` in fp32: integer codes, and the
    fp32 scale/offset that the caller rounds to fp16. A constant group (all-zero included) gives
    scale 0, offset lo, codes 0: no NaN, no Inf. ``OFFSET_MIN``: the offset is ``lo`` itself and
    ``q = rne((x - lo) / scale)`` (``OscarConfig.offset == "min"``), else an integer zero point.
    Codes of values outside [lo, hi] (a clipped range) clamp to 0 / QMAX.
    """
    qmax = tl.full(lo.shape, QMAX, tl.float32)
    if OFFSET_MIN:
        scale = tl.math.div_rn(hi - lo, qmax)
        normal = scale > 0.0
        scale = tl.where(normal, scale, 0.0)
        safe = tl.where(normal, scale, 1.0)
        q = rne(tl.math.div_rn(x - lo, safe))
        q = tl.minimum(tl.maximum(q, 0.0), QMAX)
        q = tl.where(normal, q, 0.0)
        offset = lo
    else:
        normal = hi > lo
        scale = tl.where(normal, tl.math.div_rn(hi - lo, qmax), 0.0)
        safe = tl.where(normal, scale, 1.0)
        zero = rne(tl.math.div_rn(neg(lo), safe))
        q = rne(tl.math.div_rn(x, safe)) + zero
        q = tl.minimum(tl.maximum(q, 0.0), QMAX)
        q = tl.where(normal, q, 0.0)
        offset = tl.where(normal, neg(zero) * scale, lo)
    return q, scale, offset


@triton.jit
def _clip_score(x, lo, hi, w_safe, QMAX: tl.constexpr, OFFSET_MIN: tl.constexpr, AXIS: tl.constexpr):
    """``oscar_sgl.reference.clip_score``: int64, exact in any reduction order."""
    q, scale, off = quantize(x, lo, hi, QMAX, OFFSET_MIN)
    err = tl.abs(q * scale + off - x)
    t = rne(tl.math.div_rn(err, w_safe) * 1048576.0)
    t = tl.where(t <= 16777216.0, t, 16777216.0).to(tl.int64)
    return tl.sum(t * t, axis=AXIS, keep_dims=True)


@triton.jit
def clip_range(x, lo, hi, QMAX: tl.constexpr, OFFSET_MIN: tl.constexpr, AXIS: tl.constexpr):
    """The seal-time MSE clip search (``oscar_sgl.reference.clip_range``): of the bounds
    ``[lo + w*j/32, hi - w*j/32]``, j = 0..4, the one of least score, the first on ties."""
    width = hi - lo
    w_safe = tl.where(width > 0.0, width, 1.0)
    best = _clip_score(x, lo, hi, w_safe, QMAX, OFFSET_MIN, AXIS)
    best_lo = lo
    best_hi = hi
    for j in tl.static_range(1, 5):
        d = width * (j * 0.03125)
        c_lo = lo + d
        c_hi = hi - d
        score = _clip_score(x, c_lo, c_hi, w_safe, QMAX, OFFSET_MIN, AXIS)
        better = score < best
        best = tl.where(better, score, best)
        best_lo = tl.where(better, c_lo, best_lo)
        best_hi = tl.where(better, c_hi, best_hi)
    return best_lo, best_hi


@triton.jit
def pack_codes(q, ROWS: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """Pack fp32 integer codes ``[ROWS, D]`` along D, little-endian in a byte -> uint8 ``[ROWS, D*BITS/8]``."""
    E: tl.constexpr = 8 // BITS
    qi = tl.reshape(q.to(tl.int32), (ROWS, D // E, E))
    shifts = tl.arange(0, E) * BITS
    return tl.sum(qi << shifts[None, None, :], axis=2).to(tl.uint8)


# ---------------------------------------------------------------------------------------------
# Write path of one token: rotated K/V, BF16 into staging, s_t (oscar_write_kv and the decode
# kernel's fused write)
# ---------------------------------------------------------------------------------------------


@triton.jit
def key_rows_rotated(krot_ptr, o_kv, m_kv):
    """The per-row key-rotation flags (bool ``[ROWS]``) of rows that belong to KV heads ``o_kv``."""
    return tl.load(krot_ptr + o_kv, mask=m_kv, other=1) != 0


@triton.jit
def load_rotated(ptr, i_t, stride_t, stride_h, o_h, m_h, ROWS: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
                 ROTATE: tl.constexpr, INV_SQRT_D: tl.constexpr, MASKED: tl.constexpr, rows_rotated):
    """Rows ``o_h`` (heads) of token ``i_t`` as fp32 ``[ROWS, D]``, Walsh-Hadamard rotated when
    ROTATE; with MASKED only the rows whose ``rows_rotated`` flag is set (``key_rows_rotated``; not
    read otherwise)."""
    x = tl.load(ptr + i_t * stride_t + o_h[:, None] * stride_h + tl.arange(0, D)[None, :], mask=m_h[:, None], other=0.0)
    x = x.to(tl.float32)
    if ROTATE:
        x_rot = fwht_rows(x, ROWS, D, LOG2D) * INV_SQRT_D
        if MASKED:
            x = tl.where(rows_rotated[:, None], x_rot, x)
        else:
            x = x_rot
    return x


@triton.jit
def store_rotated_rows(src_ptr, dst_ptr, i_t, stride_t, stride_h, o_h, m_h, HQ: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                       LOG2D: tl.constexpr, ROTATE: tl.constexpr, INV_SQRT_D: tl.constexpr, MASKED: tl.constexpr, rows_rotated):
    """Rows ``o_h`` (query heads) of token ``i_t`` rotated (``load_rotated``) into the contiguous
    fp32 ``[T, HQ, D]`` at ``dst_ptr``."""
    b_x = load_rotated(src_ptr, i_t, stride_t, stride_h, o_h, m_h, ROWS, D, LOG2D, ROTATE, INV_SQRT_D, MASKED, rows_rotated)
    tl.store(dst_ptr + (i_t * HQ + o_h[:, None]) * D + tl.arange(0, D)[None, :], b_x, mask=m_h[:, None])


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


@triton.jit
def write_token(
    k_ptr, v_ptr, loc_ptr, p2s_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr, i_t, i_h,
    stride_kt, stride_kh, stride_vt, stride_vh,
    H: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr, P: tl.constexpr,
    S: tl.constexpr, ROTATE: tl.constexpr, INV_SQRT_D: tl.constexpr, krot_ptr, KEY_MASK: tl.constexpr,
):
    """The write path of KV head ``i_h`` of token ``i_t`` (the decode kernel's fused write): the
    same values as ``oscar_write_kv``'s launch for that head. With the layer norm scope (``S == 1``) the
    program of head 0 also computes and stores s_t (over every head's key as stored: rotated, or
    not where KEY_MASK's flags say so)."""
    o_d = tl.arange(0, D)
    loc = tl.load(loc_ptr + i_t).to(tl.int64)
    page = loc // P
    slot = loc % P
    stg = tl.load(p2s_ptr + page).to(tl.int64)
    if stg >= 0:  # padding slots (page 0, CUDA-graph batches) are never written
        o_1 = i_h + tl.arange(0, 1)
        m_1 = o_1 >= 0
        if KEY_MASK:
            r_1 = key_rows_rotated(krot_ptr, o_1, m_1)
        else:
            r_1 = m_1
        b_k = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_1, m_1, 1, D, LOG2D, ROTATE, INV_SQRT_D, KEY_MASK, r_1)
        b_v = load_rotated(v_ptr, i_t, stride_vt, stride_vh, o_1, m_1, 1, D, LOG2D, ROTATE, INV_SQRT_D, False, m_1)
        o_stg = ((stg * H + i_h) * P + slot) * D + o_d[None, :]
        tl.store(stg_k_ptr + o_stg, to_bf16_rne(b_k))
        tl.store(stg_v_ptr + o_stg, to_bf16_rne(b_v))
        p_scale = stg_scale_ptr + (stg * P + slot) * S
        if S == 1:
            if i_h == 0:  # the layer norm needs every head's rotated key
                o_h = tl.arange(0, BLOCK_H)
                m_h = o_h < H
                if KEY_MASK:
                    r_h = key_rows_rotated(krot_ptr, o_h, m_h)
                else:
                    r_h = m_h
                b_ka = load_rotated(k_ptr, i_t, stride_kt, stride_kh, o_h, m_h, BLOCK_H, D, LOG2D, ROTATE, INV_SQRT_D,
                                    KEY_MASK, r_h)
                store_token_scales(b_ka, p_scale, o_h, m_h, S)
        else:
            store_token_scales(b_k, p_scale, o_1, m_1, S)


# ---------------------------------------------------------------------------------------------
# Unpacking and dequantization in registers
# ---------------------------------------------------------------------------------------------
#
# A token's codes are read as W = D*BITS/32 little-endian int32 words; word w holds channels
# w*CPW .. w*CPW+CPW-1 (CPW = 32/BITS), channel w*CPW+i at bit i*BITS; a 16-bit half holds
# HALF = 16/BITS codes, a byte J = 8/BITS. The tensor-core operands want two fp16 values per
# 32-bit register, and packed integer/fp16 ops make them from a word with no conversion
# instruction: for the code pair at bit b of both halves (b < 8),
#     t = (x & (QM << b) * 0x10001) | E_b * 0x10001     E_b = (25 - b) << 10
# is the fp16 pair (2^(10-b) + c_lo, 2^(10-b) + c_hi) (the code bits are the low mantissa bits of a
# number whose unit is 1), so one packed subtract of E_b makes the exact codes and one packed FMA
# applies (scale, offset). Only codes in the low byte of each half fit below the exponent field:
# the high bytes are moved down by one shift per word.
#
# Keys (QK^T, contracted over channels): a register holds two channels of one token, the pair of
# code i of the low half and code i of the high half, so the dequantized block comes out with the
# channel of position p being ``channel_of(p)``:
#     channel_of(p) = (p // CPW) * CPW + (p % 2) * HALF + (p % CPW) // 2
# and the query is loaded in that order (the dot product does not care about the order).
# Values (PV, contracted over tokens): a register holds one channel of two tokens, so the 16-bit
# halves of the words of tokens 2i and 2i+1 are interleaved first; the values come out in channel
# order. Both blocks land directly in the MMA operand registers (no shared-memory round trip of
# dequantized data). The interpreter path computes the same values with plain integer ops.


@triton.jit
def channel_of(p, BITS: tl.constexpr):
    """The channel held at position ``p`` of a dequantized key block (see the comment above)."""
    CPW: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = 16 // BITS
    return (p // CPW) * CPW + (p % 2) * HALF + (p % CPW) // 2


@triton.jit
def pair_halves(a, b, USE_ASM: tl.constexpr = False):
    """Two int32 tensors of fp16 pairs -> f16x2 pairs ``(a.lo, b.lo)`` and ``(a.hi, b.hi)``: one
    byte permute (PRMT) each with ``USE_ASM`` (the integer expression below compiles to two
    instructions per result)."""
    if USE_ASM:
        lo = tl.inline_asm_elementwise(asm="prmt.b32 $0, $1, $2, 0x5410;", constraints="=r,r,r", args=[a, b],
                                       dtype=tl.int32, is_pure=True, pack=1)
        hi = tl.inline_asm_elementwise(asm="prmt.b32 $0, $1, $2, 0x7632;", constraints="=r,r,r", args=[a, b],
                                       dtype=tl.int32, is_pure=True, pack=1)
    else:
        lo = (a & 0xFFFF) | (b << 16)
        hi = ((a >> 16) & 0xFFFF) | (b & -65536)
    return lo, hi


_PAIR_ASM = tl.constexpr(
    "{\n"
    ".reg .b32 t;\n"
    "lop3.b32 t, $1, $2, $3, 0xea;\n"  # (x & mask) | magic
    "sub.rn.f16x2 t, t, $3;\n"  # exact codes
    "fma.rn.f16x2 $0, t, $4, $5;\n"  # code * scale + offset, one rounding
    "}"
)


@triton.jit
def _f16_lo(x):
    return (x & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _f16_hi(x):
    return (x >> 16).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _pair_dequant(x, bpos, s_pk, o_pk, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """Codes at bit ``bpos`` (< 8) of both halves of int32 ``x`` and the f16x2 (scale, offset)
    pairs ``s_pk`` / ``o_pk`` -> ``(c_lo * s.lo + o.lo, c_hi * s.hi + o.hi)`` in fp16."""
    QM: tl.constexpr = (1 << BITS) - 1
    if USE_ASM:
        mask = (QM << bpos) * 65537
        magic = ((25 - bpos) << 10) * 65537
        t = tl.inline_asm_elementwise(
            asm=_PAIR_ASM, constraints="=r,r,r,r,r,r", args=[x, mask, magic, s_pk, o_pk], dtype=tl.int32, is_pure=True, pack=1
        )
        # the two halves of the f16x2 result: the compiler hands the register to the MMA as is
        lo = _f16_lo(t)
        hi = _f16_hi(t)
    else:
        c_lo = ((x >> bpos) & QM).to(tl.float32)
        c_hi = ((x >> (bpos + 16)) & QM).to(tl.float32)
        lo = (c_lo * _f16_lo(s_pk).to(tl.float32) + _f16_lo(o_pk).to(tl.float32)).to(tl.float16)
        hi = (c_hi * _f16_hi(s_pk).to(tl.float32) + _f16_hi(o_pk).to(tl.float32)).to(tl.float16)
    return lo, hi


@triton.jit
def key_params(kpw, NGT: tl.constexpr, W: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr = False):
    """The int32 view ``[NGT, D]`` of NGT key-param blocks (fp16 scales then offsets of the D
    channels) -> f16x2 (scale, offset) pairs ``[NGT, 1, W, 2, J]`` of the channels (c, c + HALF)
    that one register of the dequantized keys holds (c = w*CPW + s*J + j)."""
    J: tl.constexpr = 8 // BITS
    # fp16 param index: so*D + c; its int32 word: so*D/2 + c//2; low-half channel word
    # w*CPW/2 + s*J/2 + j//2, its high-half partner HALF/2 words further, both in the same half (j%2)
    x = tl.permute(tl.reshape(kpw, (NGT, 2, W, 2, 2, J // 2)), (0, 1, 2, 4, 5, 3))  # [g, so, w, s, jj, half]
    w_lo, w_hi = tl.split(x)
    even, odd = pair_halves(w_lo, w_hi, USE_ASM)  # j = 2jj, 2jj + 1
    pk = tl.permute(tl.reshape(tl.join(even, odd), (NGT, 2, W, 2, J)), (0, 2, 3, 4, 1))  # [g, w, s, j, so]
    s_pk, o_pk = tl.split(pk)
    return tl.reshape(s_pk, (NGT, 1, W, 2, J)), tl.reshape(o_pk, (NGT, 1, W, 2, J))


@triton.jit
def value_params(vpw, N: tl.constexpr, NG: tl.constexpr, W: tl.constexpr, USE_ASM: tl.constexpr = False):
    """The int32 view ``[N, NG]`` of N tokens' value params (fp16 scales then offsets of the NG
    channel groups) -> f16x2 (even token, odd token) pairs of scales and offsets ``[N/2, W]`` (per
    word of codes)."""
    WPG: tl.constexpr = W // NG
    p_e, p_o = tl.split(tl.permute(tl.reshape(vpw, (N // 2, 2, NG)), (0, 2, 1)))  # [pair, word]
    lo, hi = pair_halves(p_e, p_o, USE_ASM)  # fp16 index 2m, 2m + 1 of both tokens
    pk = tl.reshape(tl.join(lo, hi), (N // 2, 2, NG))  # [pair, so, group]
    s_pk, o_pk = tl.split(tl.permute(pk, (0, 2, 1)))  # [pair, group]
    s_pk = tl.reshape(tl.broadcast_to(s_pk[:, :, None], (N // 2, NG, WPG)), (N // 2, W))
    o_pk = tl.reshape(tl.broadcast_to(o_pk[:, :, None], (N // 2, NG, WPG)), (N // 2, W))
    return s_pk, o_pk


@triton.jit
def dequant_keys(words, s_pk, o_pk, NGT: tl.constexpr, GT: tl.constexpr, W: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """Keys of a tile: int32 words ``[NGT*GT, W]`` (NGT key groups of GT tokens) and the packed
    group params of ``key_params`` -> fp16 ``[NGT*GT, D]`` in the ``channel_of`` order."""
    J: tl.constexpr = 8 // BITS
    x = tl.reshape(words, (NGT, GT, W))
    x2 = tl.join(x, x >> 8)  # [NGT, GT, W, 2]: low bytes, high bytes of both halves
    shape: tl.constexpr = (NGT, GT, W, 2, J)
    xs = tl.broadcast_to(x2[:, :, :, :, None], shape)
    bpos = tl.broadcast_to((tl.arange(0, J) * BITS)[None, None, None, None, :], shape)
    lo, hi = _pair_dequant(xs, bpos, tl.broadcast_to(s_pk, shape), tl.broadcast_to(o_pk, shape), BITS, USE_ASM)
    return tl.reshape(tl.join(lo, hi), (NGT * GT, W * 4 * J))


@triton.jit
def dequant_values(words, s_pk, o_pk, N: tl.constexpr, W: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr,
                   TRANS: tl.constexpr = False):
    """Values of a tile: int32 words ``[N, W]`` and the packed (even, odd token) params of
    ``value_params`` -> fp16 ``[N, D]`` in channel order, token pairs interleaved for P.V
    (``TRANS``: ``[D, N]``, the A operand of ``V^T P^T``)."""
    J: tl.constexpr = 8 // BITS
    w_e, w_o = tl.split(tl.permute(tl.reshape(words, (N // 2, 2, W)), (0, 2, 1)))
    lo, hi = pair_halves(w_e, w_o, USE_ASM)  # channels [0, HALF) / [HALF, 2*HALF) of the word, both tokens
    lh = tl.join(lo, hi)  # [N/2, W, 2]
    x2 = tl.join(lh, lh >> 8)  # [N/2, W, 2, 2]
    shape: tl.constexpr = (N // 2, W, 2, 2, J)
    xs = tl.broadcast_to(x2[:, :, :, :, None], shape)
    bpos = tl.broadcast_to((tl.arange(0, J) * BITS)[None, None, None, None, :], shape)
    v_e, v_o = _pair_dequant(
        xs,
        bpos,
        tl.broadcast_to(s_pk[:, :, None, None, None], shape),
        tl.broadcast_to(o_pk[:, :, None, None, None], shape),
        BITS,
        USE_ASM,
    )
    # Built as V^T then transposed: the transpose lets the layout engine place the values straight
    # into the MMA operand registers, as it does for the keys.
    v_t = tl.reshape(tl.permute(tl.join(v_e, v_o), (1, 2, 3, 4, 0, 5)), (W * 4 * J, N))  # [W, 2, 2, J, N/2, 2]
    if TRANS:
        return v_t
    else:
        return tl.trans(v_t)


# ---------------------------------------------------------------------------------------------
# Attention tiles shared by the decode and extend kernels (online softmax in base 2)
# ---------------------------------------------------------------------------------------------


@triton.jit
def token_scales(page, t0, s_col, pool, P: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr, valid=True):
    """s_t of tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page`` (column ``s_col`` of the
    ``pool`` tuple's token scales), fp32 ``[BLOCK_N]``: 1 without token scaling (``S == 0``)."""
    if S > 0:
        return tl.load(pool[4] + (page * P + t0 + tl.arange(0, BLOCK_N)) * S + s_col, mask=valid, other=0.0)
    else:
        return tl.full([BLOCK_N], 1.0, tl.float32)


@triton.jit
def tile_raw(page, t0, i_h, s_col, valid, pool, H: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, P: tl.constexpr,
             G_K: tl.constexpr, G_V: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr, KEY_PAGE: tl.constexpr = False):
    """The stored bytes of tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page`` (KV head ``i_h``),
    as loaded (nothing when ``valid`` is false: a prefetch past the end):
    ``(key params [NGT, D], key codes [BLOCK_N, W], s_t [BLOCK_N], value params [BLOCK_N, NG],
    value codes [BLOCK_N, W])``.

    The pool arrays (the ``pool`` tuple, ``POOL_TENSORS`` order) come as int32 views: codes ``[.., P, D*BITS/32]`` words, key params
    ``[.., P/G_K, D]`` and value params ``[.., P, D/G_V]`` (fp16 pairs): every load is one
    contiguous block of >= 4-byte elements. Without token scaling s_t is 1. ``KEY_PAGE``: the key
    params come as the page grid's and the groups' index bytes (``page_key_raw``), which
    ``attend_raw`` turns into the key params' register pairs (``page_key_pairs``)."""
    kw_ptr, kp_ptr, vw_ptr, vp_ptr = pool[0], pool[1], pool[2], pool[3]
    W: tl.constexpr = D * BITS // 32
    NG: tl.constexpr = D // G_V
    GT: tl.constexpr = G_K if G_K < BLOCK_N else BLOCK_N
    NGT: tl.constexpr = BLOCK_N // GT
    o_n = t0 + tl.arange(0, BLOCK_N)
    o_row = (page * H + i_h) * P + o_n
    o_g = (page * H + i_h) * (P // G_K) + t0 // G_K + tl.arange(0, NGT)
    o_w = tl.arange(0, W)
    if KEY_PAGE:
        kp = page_key_raw(kp_ptr, pool[8], page, t0, i_h, valid, H, D, P, G_K, NGT)
    else:
        kp = tl.load(kp_ptr + o_g[:, None] * D + tl.arange(0, D)[None, :], mask=valid, other=0)
    kw = tl.load(kw_ptr + o_row[:, None] * W + o_w[None, :], mask=valid, other=0)
    st = token_scales(page, t0, s_col, pool, P, S, BLOCK_N, valid)
    vp = tl.load(vp_ptr + o_row[:, None] * NG + tl.arange(0, NG)[None, :], mask=valid, other=0)
    vw = tl.load(vw_ptr + o_row[:, None] * W + o_w[None, :], mask=valid, other=0)
    return kp, kw, st, vp, vw


@triton.jit
def _f16_word(lo, hi):
    """int32 holding fp16 ``lo`` in its low half and ``hi`` in its high half (the memory order of two
    consecutive fp16)."""
    return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def page_key_raw(grid_ptr, ranges_ptr, page, t0, i_h, valid, H: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                 G_K: tl.constexpr, NGT: tl.constexpr):
    """The stored key-range bytes of the NGT key groups from token ``t0`` of sealed page ``page``
    with page-grid ranges, as loaded (``tile_raw`` with ``KEY_PAGE``; ``page_key_pairs`` makes the
    key params of them where they are used, so a prefetched tile's loads stay in flight), all in
    the word order of stored fp16 pairs (channels 2m, 2m + 1 per element):
    ``(base words [D/2], step words [D/2], a [NGT, D/2], b [NGT, D/2])``. ``grid_ptr``: the int32
    view ``[.., 1, D]`` of the page grids (fp16 bases then steps), ``ranges_ptr``: the int16 view
    ``[.., P/G_K, 2, D/2]`` of the uint8 indices (channel 2m in the low byte)."""
    HALF: tl.constexpr = D // 2
    o_w = tl.arange(0, HALF)
    g0 = (page * H + i_h) * D
    bw = tl.load(grid_ptr + g0 + o_w, mask=valid, other=0)
    sw = tl.load(grid_ptr + g0 + HALF + o_w, mask=valid, other=0)
    o_g = (page * H + i_h) * (P // G_K) + t0 // G_K + tl.arange(0, NGT)
    o_r = o_g[:, None] * D + o_w[None, :]
    a = tl.load(ranges_ptr + o_r, mask=valid, other=0)
    b = tl.load(ranges_ptr + o_r + HALF, mask=valid, other=0)
    return bw, sw, a, b


_PAGE_ASM = tl.constexpr(
    "{\n"
    ".reg .b32 m, ta, tb, d, a, p;\n"
    "mov.b32 m, 0x64006400;\n"  # fp16 1024 in both halves
    "prmt.b32 ta, $2, m, 0x5150;\n"  # the two index bytes as the low bytes of 1024 + a
    "prmt.b32 tb, $3, m, 0x5150;\n"
    "sub.rn.f16x2 d, tb, ta;\n"  # b - a, exact
    "sub.rn.f16x2 a, ta, m;\n"  # a, exact
    "mul.rn.f16x2 $0, d, $4;\n"  # scale = (b - a) * u
    "mul.rn.f16x2 p, a, $5;\n"  # a * step
    "add.rn.f16x2 $1, p, $6;\n"  # offset = base + a * step
    "}"
)


@triton.jit
def page_u_words(sw, QMAX: tl.constexpr):
    """u = fp16(step / qmax) of both fp16 halves of the grid's step words ``sw`` (once per tile)."""
    u_lo = tl.math.div_rn(_f16_lo(sw).to(tl.float32), tl.full(sw.shape, QMAX, tl.float32)).to(tl.float16)
    u_hi = tl.math.div_rn(_f16_hi(sw).to(tl.float32), tl.full(sw.shape, QMAX, tl.float32)).to(tl.float16)
    return _f16_word(u_lo, u_hi)


@triton.jit
def page_words(ra, rb, uw, sw, bw, QMAX: tl.constexpr, USE_ASM: tl.constexpr):
    """The (scale, offset) fp16-pair words ``[NGT, D/2]`` of NGT key groups from their index pairs
    ``ra`` / ``rb`` (int16 ``[NGT, D/2]``: channel 2m in the low byte) and the page grid's pair
    words ``[D/2]``: ``uw`` (u = step / qmax), ``sw`` (step), ``bw`` (base). fp16 arithmetic, each
    operation rounded (``reference.page_group_grid``): four f16x2 operations per word with
    ``USE_ASM``."""
    if USE_ASM:
        s_w, o_w = tl.inline_asm_elementwise(
            asm=_PAGE_ASM, constraints="=r,=r,r,r,r,r,r",
            args=[ra.to(tl.int32), rb.to(tl.int32), tl.broadcast_to(uw[None, :], ra.shape),
                  tl.broadcast_to(sw[None, :], ra.shape), tl.broadcast_to(bw[None, :], ra.shape)],
            dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        a_lo = (ra & 0xFF).to(tl.float32)
        a_hi = ((ra >> 8) & 0xFF).to(tl.float32)
        d_lo = (rb & 0xFF).to(tl.float32) - a_lo
        d_hi = ((rb >> 8) & 0xFF).to(tl.float32) - a_hi
        s_lo = (d_lo * _f16_lo(uw).to(tl.float32)[None, :]).to(tl.float16)
        s_hi = (d_hi * _f16_hi(uw).to(tl.float32)[None, :]).to(tl.float16)
        p_lo = (a_lo * _f16_lo(sw).to(tl.float32)[None, :]).to(tl.float16)
        p_hi = (a_hi * _f16_hi(sw).to(tl.float32)[None, :]).to(tl.float16)
        o_lo = (p_lo.to(tl.float32) + _f16_lo(bw).to(tl.float32)[None, :]).to(tl.float16)
        o_hi = (p_hi.to(tl.float32) + _f16_hi(bw).to(tl.float32)[None, :]).to(tl.float16)
        s_w = _f16_word(s_lo, s_hi)
        o_w = _f16_word(o_lo, o_hi)
    return s_w, o_w


@triton.jit
def _pair_words(x, NGT: tl.constexpr, W: tl.constexpr, J: tl.constexpr, USE_ASM: tl.constexpr):
    """int32 fp16-pair words ``[NGT, D/2]`` of one param (channels 2m, 2m + 1) -> the f16x2 pairs
    ``[NGT, 1, W, 2, J]`` of the channels (c, c + CPW/2) of one register (``key_params``, one
    param)."""
    # word w*CPW/2 + h*J + s*J/2 + jj holds channels w*CPW + h*CPW/2 + s*J + 2jj (+ 1)
    lo, hi = tl.split(tl.permute(tl.reshape(x, (NGT, W, 2, 2, J // 2)), (0, 1, 3, 4, 2)))  # [g, w, s, jj] per h
    even, odd = pair_halves(lo, hi, USE_ASM)  # j = 2jj, 2jj + 1
    return tl.reshape(tl.join(even, odd), (NGT, 1, W, 2, J))


@triton.jit
def page_key_pairs(raw, NGT: tl.constexpr, W: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                   USE_ASM: tl.constexpr = False):
    """``page_key_raw``'s bytes -> the f16x2 key (scale, offset) pairs ``key_params`` makes of stored
    pairs (``[NGT, 1, W, 2, J]``: channels c and c + CPW/2, c = w*CPW + s*J + j). The params are made
    in the stored pairs' word order (both fp16 halves of a word from one int16 of indices) and then
    take ``key_params``' path. Each group's grid is ``reference.page_group_grid``: fp16 arithmetic,
    every operation rounded (u = step / qmax once per tile, scale = (b - a) * u, offset = base +
    a * step), so the f16x2 instructions and the fp32 fallback give the same bits."""
    J: tl.constexpr = 8 // BITS
    QMAX: tl.constexpr = (1 << BITS) - 1
    bw, sw, ra, rb = raw
    s_w, o_w = page_words(ra, rb, page_u_words(sw, QMAX), sw, bw, QMAX, USE_ASM)
    s_pk = _pair_words(s_w, NGT, W, J, USE_ASM)
    o_pk = _pair_words(o_w, NGT, W, J, USE_ASM)
    return s_pk, o_pk


@triton.jit
def attend_raw(q, kp, kw, st, vp, vw, m_i, l_i, acc, sm_scale_log2, D: tl.constexpr, BITS: tl.constexpr,
               G_K: tl.constexpr, G_V: tl.constexpr, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, TRANS: tl.constexpr,
               row_ok=None, kv_ok=None, KEY_PAGE: tl.constexpr = False):
    """One online-softmax step over a sealed tile given its stored bytes (``tile_raw``): keys and
    values dequantized in registers (fp16, one rounding), logits ``s_t * <q, k_bar> * sm_scale``
    (base 2).

    ``TRANS=False``: ``q`` ``[M, D]`` fp16 query rows in the ``channel_of`` order, ``acc`` ``[M, D]``
    fp32 (channel order), ``m_i`` / ``l_i`` ``[M]``. ``TRANS=True`` (decode, few query rows): the
    tokens are the M side of both products and the query heads the N side (``S^T = K Q^T``,
    ``O^T += V^T P^T``), so a GQA group of 4 pads to 8 columns instead of 16 rows: half the
    tensor-core instructions, exponentials and accumulator registers; ``q`` ``[D, G]``, ``acc``
    ``[D, G]``, ``m_i`` / ``l_i`` ``[G]``.

    ``row_ok`` (``[M]`` bool, rows only): the rows that see this tile (the others keep their state;
    extend's per-row sealed boundary). ``kv_ok``: the (row, token) pairs that may attend (a sliding
    window): ``[BLOCK_N]`` tokens with ``TRANS`` (the caller guarantees one of them, the tile's
    last), ``[M or 1, BLOCK_N]`` otherwise. A row that has seen nothing yet stays empty, never NaN.
    ``KEY_PAGE``: ``kp`` is ``page_key_raw``'s bytes."""
    W: tl.constexpr = D * BITS // 32
    NG: tl.constexpr = D // G_V
    GT: tl.constexpr = G_K if G_K < BLOCK_N else BLOCK_N
    NGT: tl.constexpr = BLOCK_N // GT
    if KEY_PAGE:
        s_pk, o_pk = page_key_pairs(kp, NGT, W, D, BITS, USE_ASM)
    else:
        s_pk, o_pk = key_params(kp, NGT, W, BITS, USE_ASM)
    b_k = dequant_keys(kw, s_pk, o_pk, NGT, GT, W, BITS, USE_ASM)
    vs_pk, vo_pk = value_params(vp, BLOCK_N, NG, W, USE_ASM)
    b_st = st * sm_scale_log2
    if TRANS:
        b_s = tl.dot(b_k, q) * b_st[:, None]
        if kv_ok is not None:
            b_s = tl.where(kv_ok[:, None], b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(b_p, axis=0)
        v_t = dequant_values(vw, vs_pk, vo_pk, BLOCK_N, W, BITS, USE_ASM, True)
        acc = acc * alpha[None, :] + tl.dot(v_t, b_p.to(tl.float16))
    else:
        b_s = tl.dot(q, tl.trans(b_k)) * b_st[None, :]
        m_new, l_i, alpha, b_p = softmax_rows(b_s, m_i, l_i, row_ok, kv_ok)
        b_v = dequant_values(vw, vs_pk, vo_pk, BLOCK_N, W, BITS, USE_ASM, False)
        acc = acc * alpha[:, None] + tl.dot(b_p.to(tl.float16), b_v)
    return m_new, l_i, acc


@triton.jit
def softmax_rows(b_s, m_i, l_i, row_ok=None, kv_ok=None):
    """The online-softmax update of rows ``[M]`` for the base-2 logits ``b_s`` ``[M, N]`` of one
    tile: ``(m_new, l_i, alpha, p)``, the caller then scales its accumulator by ``alpha`` and adds
    ``p . V``. ``row_ok``, ``kv_ok``: as in ``attend_raw``."""
    if row_ok is not None:
        b_s = tl.where(row_ok[:, None], b_s, float("-inf"))
    if kv_ok is not None:
        b_s = tl.where(kv_ok, b_s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
    if kv_ok is not None:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = safe_max(m_new, row_ok)
    alpha = tl.exp2(m_i - m_ref)
    b_p = tl.exp2(b_s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(b_p, axis=1)
    return m_new, l_i, alpha, b_p


@triton.jit
def safe_max(m_new, row_ok=None):
    """The running maximum to subtract: ``m_new``, or 0 where a row has seen no key yet (``-inf``)
    when some rows may be masked (``row_ok`` given), so that its ``exp2`` terms are 0, not NaN."""
    if row_ok is not None:
        return tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        return m_new


@triton.jit
def sealed_tile(q, page, t0, i_h, s_col, m_i, l_i, acc, pool, sm_scale_log2, H: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                P: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
                USE_ASM: tl.constexpr, TRANS: tl.constexpr = False, row_ok=None, kv_ok=None, KEY_PAGE: tl.constexpr = False):
    """Tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page`` (KV head ``i_h``) against the queries
    ``q``: ``tile_raw`` then ``attend_raw`` (shapes, ``row_ok`` and ``kv_ok`` there). The loads are plain
    blocks, which Triton's software pipeliner prefetches when the caller's loop allows it."""
    kp, kw, st, vp, vw = tile_raw(page, t0, i_h, s_col, True, pool, H, D, BITS, P, G_K, G_V, S, BLOCK_N, KEY_PAGE)
    return attend_raw(q, kp, kw, st, vp, vw, m_i, l_i, acc, sm_scale_log2, D, BITS, G_K, G_V, BLOCK_N, USE_ASM, TRANS,
                      row_ok, kv_ok, KEY_PAGE)


@triton.jit
def dequantized_tile(q, row0, st, m_i, l_i, acc, sk_ptr, sv_ptr, sm_scale_log2, D: tl.constexpr, BLOCK_N: tl.constexpr,
                     row_ok=None, kv_ok=None):
    """``attend_raw`` (rows) over a sealed tile that ``dequantize_tiles`` already wrote out:
    fp16 keys ``[BLOCK_N, D]`` (``channel_of`` order) and values (channel order) at scratch rows
    ``[row0, row0 + BLOCK_N)`` of ``sk_ptr`` / ``sv_ptr``, s_t ``st`` ``[BLOCK_N]``. The same fp16
    operands, products and softmax as ``attend_raw`` on the stored bytes; the operands come as
    plain loads, which Triton pipelines into shared memory for the tensor cores."""
    o_n = row0 + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, D)
    b_k = tl.load(sk_ptr + o_n[:, None] * D + o_d[None, :])
    b_s = tl.dot(q, tl.trans(b_k)) * (st * sm_scale_log2)[None, :]
    m_new, l_i, alpha, b_p = softmax_rows(b_s, m_i, l_i, row_ok, kv_ok)
    b_v = tl.load(sv_ptr + o_n[:, None] * D + o_d[None, :])
    acc = acc * alpha[:, None] + tl.dot(b_p.to(tl.float16), b_v)
    return m_new, l_i, acc


@triton.jit
def dequantize_tile(page, t0, i_h, row0, pool, sk_ptr, sv_ptr, H: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                    P: tl.constexpr, G_K: tl.constexpr, G_V: tl.constexpr, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr,
                    KEY_PAGE: tl.constexpr = False):
    """Tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page`` (KV head ``i_h``) dequantized as
    ``attend_raw`` dequantizes them, stored at scratch rows ``[row0, row0 + BLOCK_N)``: fp16 keys
    in the ``channel_of`` order to ``sk_ptr``, values in channel order to ``sv_ptr`` (``[.., D]``
    rows)."""
    W: tl.constexpr = D * BITS // 32
    NG: tl.constexpr = D // G_V
    GT: tl.constexpr = G_K if G_K < BLOCK_N else BLOCK_N
    NGT: tl.constexpr = BLOCK_N // GT
    kp, kw, _, vp, vw = tile_raw(page, t0, i_h, 0, True, pool, H, D, BITS, P, G_K, G_V, 0, BLOCK_N, KEY_PAGE)
    if KEY_PAGE:
        s_pk, o_pk = page_key_pairs(kp, NGT, W, D, BITS, USE_ASM)
    else:
        s_pk, o_pk = key_params(kp, NGT, W, BITS, USE_ASM)
    b_k = dequant_keys(kw, s_pk, o_pk, NGT, GT, W, BITS, USE_ASM)
    vs_pk, vo_pk = value_params(vp, BLOCK_N, NG, W, USE_ASM)
    b_v = dequant_values(vw, vs_pk, vo_pk, BLOCK_N, W, BITS, USE_ASM, False)
    o_n = row0 + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, D)
    tl.store(sk_ptr + o_n[:, None] * D + o_d[None, :], b_k)
    tl.store(sv_ptr + o_n[:, None] * D + o_d[None, :], b_v)


@triton.jit
def staging_tile(qb, stg, i_h, t0, n_valid, m_i, l_i, acc, pool, sm_scale_log2, H: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                 BLOCK_T: tl.constexpr, BF16_DOT: tl.constexpr, TRANS: tl.constexpr = False, row_ok=None, kv_lo=None,
                 row_lo=None):
    """Tokens ``[t0, t0 + BLOCK_T)`` (those below ``n_valid``) of an open page, read BF16 (rotated)
    from staging slot ``stg`` (the staging pages of the ``pool`` tuple), against bf16 rotated queries ``qb`` in channel order: ``[M, D]`` rows,
    or ``[D, G]`` columns with ``TRANS`` (shapes as in ``attend_raw``).

    ``BF16_DOT=False`` (interpreter) upcasts the operands to fp32 after a round-to-nearest bf16
    rounding: the interpreter's dot multiplies the raw bits of bf16 operands and its cast truncates.
    ``row_ok`` (rows only): as in ``attend_raw``. A sliding window: ``kv_lo``, the first token (of
    the page) every row may see (the caller starts at its tile), or ``row_lo`` ``[M]`` (rows only),
    each row's.
    """
    stg_k_ptr, stg_v_ptr = pool[5], pool[6]
    o_t = t0 + tl.arange(0, BLOCK_T)
    m_t = o_t < n_valid
    if kv_lo is not None:
        m_t = m_t & (o_t >= kv_lo)
    o_d = tl.arange(0, D)
    o_tok = (stg * H + i_h) * P + o_t
    b_k = tl.load(stg_k_ptr + o_tok[:, None] * D + o_d[None, :], mask=m_t[:, None], other=0.0)
    if TRANS:
        if BF16_DOT:
            b_s = tl.dot(b_k, qb)
        else:
            b_s = tl.dot(b_k.to(tl.float32), qb.to(tl.float32))
        b_s = tl.where(m_t[:, None], b_s * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(b_p, axis=0)
        b_vt = tl.load(stg_v_ptr + o_tok[None, :] * D + o_d[:, None], mask=m_t[None, :], other=0.0)
        if BF16_DOT:
            acc = acc * alpha[None, :] + tl.dot(b_vt, b_p.to(tl.bfloat16))
        else:
            acc = acc * alpha[None, :] + tl.dot(b_vt.to(tl.float32), to_bf16_rne(b_p).to(tl.float32))
    else:
        if BF16_DOT:
            b_s = tl.dot(qb, tl.trans(b_k))
        else:
            b_s = tl.dot(qb.to(tl.float32), tl.trans(b_k.to(tl.float32)))
        if row_ok is not None:
            b_s = tl.where(m_t[None, :] & row_ok[:, None], b_s * sm_scale_log2, float("-inf"))
        else:
            b_s = tl.where(m_t[None, :], b_s * sm_scale_log2, float("-inf"))
        if row_lo is not None:
            b_s = tl.where(o_t[None, :] >= row_lo[:, None], b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
            m_ref = safe_max(m_new, row_ok)
        alpha = tl.exp2(m_i - m_ref)
        b_p = tl.exp2(b_s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(b_p, axis=1)
        b_v = tl.load(stg_v_ptr + o_tok[:, None] * D + o_d[None, :], mask=m_t[:, None], other=0.0)
        if BF16_DOT:
            acc = acc * alpha[:, None] + tl.dot(b_p.to(tl.bfloat16), b_v)
        else:
            acc = acc * alpha[:, None] + tl.dot(to_bf16_rne(b_p).to(tl.float32), b_v.to(tl.float32))
    return m_new, l_i, acc
