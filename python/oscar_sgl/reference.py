"""The OScaR reference in plain PyTorch: the oracle every kernel and the Rust packer are checked against.

Readable first, fast second. Shapes follow docs/LAYOUT.md: a block of one layer is `[H, n, D]`
(KV heads, tokens, head_dim). Everything here runs on any device torch supports, CPU included.

The pipeline for one block of keys/values (post-RoPE):

    k_rot, v_rot = rotate(k), rotate(v)             # Walsh-Hadamard, skipped when rotation is off
    s            = token_scales(k_rot)              # L2 norm per token (layer or head scope)
    block        = pack_block(k_rot, v_rot, s)      # per-channel K / per-token V, b bits, packed
    k_bar, v_hat = unpack_block(block)              # dequantized, still rotated, K still / s
    logits       = s * <rotate(q), k_bar> * sm_scale
    out          = extend_attention(q, blocks, exact)  # causal; decode_attention: one query
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import OscarConfig


# --------------------------------------------------------------------------------------------
# Walsh-Hadamard rotation
# --------------------------------------------------------------------------------------------


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalized Sylvester Walsh-Hadamard transform of the last dim, in fp32.

    Args:
        x: `[..., D]`, any float dtype, D a power of two.
    Returns:
        `[..., D]` fp32, `H_D x` with `H_D` symmetric and orthonormal (so `hadamard(hadamard(x)) == x`
        up to rounding). D * log2(D) additions, no matrix.
    """
    d = x.shape[-1]
    if d <= 0 or d & (d - 1):
        raise ValueError(f"hadamard needs a power-of-two last dim, got {d}")
    lead = x.shape[:-1]
    y = x.to(torch.float32).reshape(-1, d)
    h = 1
    while h < d:
        # Pair element i with i + h inside blocks of 2h: Sylvester ordering.
        y = y.view(-1, d // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return (y.reshape(*lead, d) * (1.0 / math.sqrt(d))).contiguous()


# --------------------------------------------------------------------------------------------
# Token scaling
# --------------------------------------------------------------------------------------------


def token_scales(k: torch.Tensor, scope: str = "layer") -> torch.Tensor:
    """Omni-token scale s_t: the L2 norm of each token's keys, zero norms replaced by 1.

    Args:
        k: `[H, n, D]` keys of one layer (rotation does not change the norm).
        scope: "layer" (norm over all heads and channels) or "head" (per head).
    Returns:
        `[n, 1]` (layer) or `[n, H]` (head) fp32.
    """
    kf = k.to(torch.float32)
    if scope == "layer":
        s = torch.sqrt((kf * kf).sum(dim=(0, 2)))[:, None]
    elif scope == "head":
        s = torch.sqrt((kf * kf).sum(dim=2)).transpose(0, 1).contiguous()
    else:
        raise ValueError(f"norm scope must be 'layer' or 'head', got {scope!r}")
    return torch.where(s > 0, s, torch.ones_like(s))


def _broadcast_scale(s: torch.Tensor, num_heads: int) -> torch.Tensor:
    """`[n, S]` token scales -> `[H, n, 1]` to divide / multiply keys."""
    if s.shape[1] == 1:
        return s.transpose(0, 1)[:, :, None].expand(num_heads, -1, 1)
    if s.shape[1] != num_heads:
        raise ValueError(f"token scales have {s.shape[1]} columns, expected 1 or {num_heads}")
    return s.transpose(0, 1)[:, :, None]


# --------------------------------------------------------------------------------------------
# Quantizer (docs/LAYOUT.md section 1) and packing (section 2)
# --------------------------------------------------------------------------------------------


#: The seal-time clip search (`OscarConfig.clip`, docs/OSCAR.md §2.3): a searched group of range
#: [lo, hi] and width w = hi - lo tries [lo + w*c, hi - w*c] for each c here, i.e. its range shrunk
#: about its middle to 1, 15/16, 7/8, 13/16 and 3/4 of its width. Exact binary fractions: w*c is
#: one correctly rounded fp32 product in every implementation.
CLIP_SHRINK = (0.0, 1 / 32, 2 / 32, 3 / 32, 4 / 32)
#: A candidate's score is sum_i t_i^2 over the group, t_i = round_half_even(|x̂_i - x_i| / w * 2^20)
#: capped at 2^24, summed as int64: integer addition is exact in any order, so the reference, the
#: Rust packer and the Triton kernel (whatever its reduction tree) pick the same candidate.
CLIP_SCORE_ONE = 2.0**20
CLIP_SCORE_CAP = 2.0**24


def _grid(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qmax: float,
          offset: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(q, scale, offset)` in fp32 of groups with bounds `lo`/`hi` (broadcast against x); codes of
    values outside [lo, hi] are clamped to 0 / qmax."""
    if offset == "integer":
        normal = hi > lo
        scale = torch.where(normal, (hi - lo) / qmax, torch.zeros_like(lo))
        safe = torch.where(normal, scale, torch.ones_like(scale))
        zero = torch.round(-lo / safe)
        q = torch.clamp(torch.round(x / safe) + zero, 0.0, qmax)
        q = torch.where(normal, q, torch.zeros_like(q))
        return q, scale, torch.where(normal, (-zero) * scale, lo)
    if offset == "min":
        scale = (hi - lo) / qmax
        normal = scale > 0
        scale = torch.where(normal, scale, torch.zeros_like(scale))
        safe = torch.where(normal, scale, torch.ones_like(scale))
        q = torch.clamp(torch.round((x - lo) / safe), 0.0, qmax)
        return torch.where(normal, q, torch.zeros_like(q)), scale, lo.expand_as(scale)
    raise ValueError(f"offset must be 'integer' or 'min', got {offset!r}")


def clip_score(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, width: torch.Tensor, qmax: float,
               offset: str, dim: int) -> torch.Tensor:
    """The clip search's int64 score of the candidate bounds `lo`/`hi` (`CLIP_SCORE_ONE`), the
    group axis `dim` kept as 1. `width` is the unclipped group's max - min (0: constant group)."""
    q, scale, off = _grid(x, lo, hi, qmax, offset)
    err = torch.abs(q * scale + off - x)
    t = torch.round(err / torch.where(width > 0, width, torch.ones_like(width)) * CLIP_SCORE_ONE)
    t = torch.where(t <= CLIP_SCORE_CAP, t, torch.full_like(t, CLIP_SCORE_CAP)).to(torch.int64)
    return (t * t).sum(dim=dim, keepdim=True)


def clip_range(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qmax: float, offset: str,
               dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The seal-time MSE clip search: the candidate bounds (`CLIP_SHRINK`) of least score, the
    first (widest) on ties."""
    width = hi - lo
    best_lo, best_hi = lo, hi
    best = clip_score(x, lo, hi, width, qmax, offset, dim)
    for c in CLIP_SHRINK[1:]:
        d = width * c
        c_lo, c_hi = lo + d, hi - d
        score = clip_score(x, c_lo, c_hi, width, qmax, offset, dim)
        better = score < best
        best = torch.where(better, score, best)
        best_lo, best_hi = torch.where(better, c_lo, best_lo), torch.where(better, c_hi, best_hi)
    return best_lo, best_hi


def quantize_groups(x: torch.Tensor, bits: int, dim: int, offset: str = "integer",
                    clip: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max round-to-nearest quantization; a group is the whole of axis `dim`.

    Args:
        x: fp32 tensor, finite.
        bits: 2 or 4.
        dim: the group axis.
        offset: "integer" (an integer zero point: offset = -round(-lo/scale) * scale) or "min"
            (offset = lo), `OscarConfig.offset`.
        clip: run the MSE clip search (`clip_range`) before quantizing, `OscarConfig.clip`.
    Returns:
        `(q, scale_h, offset_h)`: q uint8 codes shaped like x; scale/offset fp16 with `dim` kept as 1.
        Dequantize as `q * scale_h.float() + offset_h.float()`.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"quantize_groups wants fp32 input, got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantize NaN or Inf (the KV entering the cache is not finite)")
    qmax = float((1 << bits) - 1)
    x = x + 0.0  # -0.0 -> +0.0: min/max of a group holding both zeros must not depend on the reduction order
    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    if clip:
        lo, hi = clip_range(x, lo, hi, qmax, offset, dim)
    q, scale, off = _grid(x, lo, hi, qmax, offset)
    return q.to(torch.uint8), scale.to(torch.float16), off.to(torch.float16)


#: Levels of a page's key grid (`OscarConfig.key_ranges == "page"`): uint8 indices 0..255.
PAGE_GRID_STEPS = 255


def page_key_grid(x: torch.Tensor, bits: int, k_group: int, page_size: int) -> tuple[torch.Tensor, ...]:
    """Quantize keys with page-grid ranges (docs/LAYOUT.md §1, `key_ranges="page"`).

    Per (head, page, channel): base = fp16(min), step = fp16((max - base) / 255) (a step that is
    not > 0 stores 0: the page is constant); per k_group tokens of a (head, channel) the group's
    [lo, hi] rounded outward to the grid: a = clamp(floor((lo - base) / step), 0, 255), b =
    clamp(ceil((hi - base) / step), 0, 255) (fp32, true divisions); the group's grid is
    `page_group_grid` (fp16 operations: u = step / qmax, scale = (b - a) * u, offset = base +
    a * step) and codes clamp(rne((x - offset) / scale), 0, qmax) in fp32 with those fp16 values
    (0 where scale is not > 0). No fused multiply-add.

    Args:
        x: fp32 `[H, n, D]` keys (rotated and divided by s as stored), n a multiple of page_size.
    Returns:
        `(q, grid, ranges, scale, offset)`: uint8 codes `[H, n, D]`, fp16 `[H, n/P, 2, D]` (base,
        step), uint8 `[H, n/G_K, 2, D]` (a, b), and the group grid `[H, n/G_K, 1, D]` (scale,
        offset: fp16 values in fp32) that dequantizes the codes.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"page_key_grid wants fp32 input, got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantize NaN or Inf (the KV entering the cache is not finite)")
    h, n, d = x.shape
    if n % page_size or page_size % k_group:
        raise ValueError(f"a key block of {n} tokens is not whole pages of {page_size} in groups of {k_group}")
    qmax = float((1 << bits) - 1)
    x = (x + 0.0).reshape(h, n // page_size, page_size // k_group, k_group, d)
    g_lo, g_hi = x.amin(dim=3), x.amax(dim=3)  # [H, pages, groups, D]
    base_h = g_lo.amin(dim=2).to(torch.float16)  # [H, pages, D]
    base = base_h.to(torch.float32)
    step_h = ((g_hi.amax(dim=2) - base) / PAGE_GRID_STEPS).to(torch.float16)
    if not bool(torch.isfinite(base_h).all() & torch.isfinite(step_h).all()):
        raise ValueError("a page's keys exceed the fp16 range of the page grid (|k| > 65504)")
    step_h = torch.where(step_h.to(torch.float32) > 0, step_h, torch.zeros_like(step_h))
    step = step_h.to(torch.float32)[:, :, None, :]
    b0 = base[:, :, None, :]
    normal = step > 0
    safe = torch.where(normal, step, torch.ones_like(step))
    a = torch.clamp(torch.floor((g_lo - b0) / safe), 0.0, float(PAGE_GRID_STEPS))
    b = torch.clamp(torch.ceil((g_hi - b0) / safe), 0.0, float(PAGE_GRID_STEPS))
    a = torch.where(normal, a, torch.zeros_like(a))
    b = torch.where(normal, b, torch.zeros_like(b))
    scale, offset = page_group_grid(b0, step, a, b, qmax)
    sc, off = scale[:, :, :, None, :], offset[:, :, :, None, :]
    ok = sc > 0
    q = torch.clamp(torch.round((x - off) / torch.where(ok, sc, torch.ones_like(sc))), 0.0, qmax)
    q = torch.where(ok, q, torch.zeros_like(q)).reshape(h, n, d)
    grid = torch.stack((base_h, step_h), dim=2)  # [H, pages, 2, D]
    ranges = torch.stack((a, b), dim=3).reshape(h, n // k_group, 2, d).to(torch.uint8)
    return (q.to(torch.uint8), grid, ranges, scale.reshape(h, n // k_group, 1, d),
            offset.reshape(h, n // k_group, 1, d))


def page_group_grid(base: torch.Tensor, step: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A key group's `(scale, offset)` from its page grid (base, step: fp16 values held in fp32) and
    indices (a, b), in fp16 arithmetic with every operation rounded to fp16 (docs/LAYOUT.md §1):
    u = fp16(step / qmax), scale = fp16((b - a) * u), offset = fp16(base + fp16(a * step)).

    Each operation is computed in fp32 and then rounded to fp16; fp32 carries 24 >= 2 * 11 + 2
    bits, so this equals the correctly rounded fp16 operation (what the decode kernels' f16x2
    instructions compute). Returns fp32 tensors holding fp16 values.
    """
    def h(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).to(torch.float32)

    u = h(step / qmax)
    scale = h((b - a) * u)
    offset = h(base + h(a * step))
    return scale, offset


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes along the last dim, little-endian inside a byte: `[..., D] -> [..., D*bits/8]`."""
    per_byte = 8 // bits
    d = q.shape[-1]
    if d % per_byte:
        raise ValueError(f"last dim {d} is not a multiple of {per_byte} codes per byte")
    g = q.to(torch.int32).reshape(*q.shape[:-1], d // per_byte, per_byte)
    shifts = torch.arange(per_byte, dtype=torch.int32, device=q.device) * bits
    return (g << shifts).sum(dim=-1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_codes`: `[..., B] uint8 -> [..., B*8/bits] uint8`."""
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, dtype=torch.int32, device=packed.device) * bits
    codes = (packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte).to(torch.uint8)


# --------------------------------------------------------------------------------------------
# Blocks (a sealed page of one layer)
# --------------------------------------------------------------------------------------------


@dataclass
class KBlock:
    """Packed keys of `n` tokens of one layer (docs/LAYOUT.md section 3)."""

    codes: torch.Tensor  # uint8 [H, n, D*b/8]
    #: fp16 [H, n/G_K, 2, D] (scale, offset) per key group; with `key_ranges="page"` the page
    #: grids, fp16 [H, n/P, 2, D] (base, step).
    params: torch.Tensor
    scale: torch.Tensor | None  # fp32 [n, S] or None when token scaling is off
    #: bool per KV head: whether its keys were rotated (None: every head, as `cfg.rotation` says).
    key_rotated: tuple[bool, ...] | None = None
    #: uint8 [H, n/G_K, 2, D] (a, b) per key group with `key_ranges="page"`, else None.
    ranges: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.codes.shape[1]

    def nbytes(self) -> int:
        extra = self.scale.numel() * 4 if self.scale is not None else 0
        extra += self.ranges.numel() if self.ranges is not None else 0
        return self.codes.numel() + self.params.numel() * 2 + extra


@dataclass
class VBlock:
    """Packed values of `n` tokens of one layer."""

    codes: torch.Tensor  # uint8 [H, n, D*b/8]
    params: torch.Tensor  # fp16 [H, n, 2, D/G_V]
    #: False when the values were stored unrotated although `cfg.rotation` is on (`rotates_values`).
    rotated: bool = True

    @property
    def num_tokens(self) -> int:
        return self.codes.shape[1]

    def nbytes(self) -> int:
        return self.codes.numel() + self.params.numel() * 2


def pack_k(k_rot: torch.Tensor, s: torch.Tensor | None, cfg: OscarConfig) -> KBlock:
    """Quantize and pack keys.

    Args:
        k_rot: `[H, n, D]` keys after rotation (if any), any float dtype; n a multiple of k_group.
        s: `[n, S]` fp32 token scales, or None when token scaling is off.
    """
    h, n, d = k_rot.shape
    if n % cfg.k_group:
        raise ValueError(f"a key block of {n} tokens is not a whole number of k_group={cfg.k_group}")
    x = k_rot.to(torch.float32)
    if s is not None:
        x = x / _broadcast_scale(s.to(torch.float32), h)
    s32 = None if s is None else s.to(torch.float32).contiguous()
    if cfg.key_ranges == "page":
        q, grid, ranges, _, _ = page_key_grid(x, cfg.bits, cfg.k_group, cfg.page_size)
        return KBlock(codes=pack_codes(q, cfg.bits).contiguous(), params=grid.contiguous(), scale=s32,
                      ranges=ranges.contiguous())
    x = x.reshape(h, n // cfg.k_group, cfg.k_group, d)
    q, sc, off = quantize_groups(x, cfg.bits, dim=2, offset=cfg.offset, clip=cfg.clip_keys)
    codes = pack_codes(q.reshape(h, n, d), cfg.bits)
    params = torch.cat((sc, off), dim=2)  # [H, n/G, 2, D]
    return KBlock(codes=codes.contiguous(), params=params.contiguous(), scale=s32)


def pack_v(v_rot: torch.Tensor, cfg: OscarConfig) -> VBlock:
    """Quantize and pack values `[H, n, D]` (after rotation, if any), per-token groups of v_group channels."""
    h, n, d = v_rot.shape
    x = v_rot.to(torch.float32).reshape(h, n, d // cfg.v_group, cfg.v_group)
    q, sc, off = quantize_groups(x, cfg.bits, dim=3, offset=cfg.offset, clip=cfg.clip_values)
    codes = pack_codes(q.reshape(h, n, d), cfg.bits)
    params = torch.cat((sc[..., 0], off[..., 0]), dim=2).reshape(h, n, 2, d // cfg.v_group)
    return VBlock(codes=codes.contiguous(), params=params.contiguous())


def unpack_k(block: KBlock, cfg: OscarConfig, head_dim: int) -> torch.Tensor:
    """Dequantized normalized keys `[H, n, D]` fp32 (still rotated, still divided by s)."""
    h, n, _ = block.codes.shape
    q = unpack_codes(block.codes, cfg.bits).to(torch.float32).reshape(h, n // cfg.k_group, cfg.k_group, head_dim)
    sc, off = key_group_params(block, cfg)
    return (q * sc + off).reshape(h, n, head_dim)


def key_group_params(block: KBlock, cfg: OscarConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 `(scale, offset)` `[H, n/G_K, 1, D]` of every key group of a block, either layout."""
    if block.ranges is None:
        return block.params[:, :, 0:1, :].to(torch.float32), block.params[:, :, 1:2, :].to(torch.float32)
    h, groups, _, d = block.ranges.shape
    per_page = cfg.page_size // cfg.k_group
    grid = block.params.to(torch.float32).repeat_interleave(per_page, dim=1)  # [H, n/G, 2, D]
    idx = block.ranges.to(torch.float32)
    return page_group_grid(grid[:, :, 0:1, :], grid[:, :, 1:2, :], idx[:, :, 0:1, :], idx[:, :, 1:2, :],
                           float((1 << cfg.bits) - 1))


def unpack_v(block: VBlock, cfg: OscarConfig, head_dim: int) -> torch.Tensor:
    """Dequantized values `[H, n, D]` fp32 (still rotated)."""
    h, n, _ = block.codes.shape
    q = unpack_codes(block.codes, cfg.bits).to(torch.float32).reshape(h, n, head_dim // cfg.v_group, cfg.v_group)
    sc = block.params[:, :, 0, :, None].to(torch.float32)
    off = block.params[:, :, 1, :, None].to(torch.float32)
    return (q * sc + off).reshape(h, n, head_dim)


# --------------------------------------------------------------------------------------------
# The whole transform, and attention over a quantized history
# --------------------------------------------------------------------------------------------


def rotate(x: torch.Tensor, cfg: OscarConfig) -> torch.Tensor:
    """`H_D x` over the last dim when rotation is on, else x as fp32."""
    return hadamard(x) if cfg.rotation else x.to(torch.float32)


class LayerKeys(tuple):
    """A layer's key-rotation flags (one bool per KV head held here) together with whether the layer
    is stored as KIVI, when that was decided over more heads than these: a tensor-parallel rank
    holds some of a layer's KV heads, and the layer is KIVI only when no head of the whole layer is
    rotated (docs/OSCAR.md §7). A plain tuple of flags means the layer's heads are all here."""

    kivi: bool

    def __new__(cls, flags: tuple[bool, ...] | list[bool], kivi: bool) -> LayerKeys:
        flags = tuple(bool(x) for x in flags)
        if kivi and any(flags):
            raise ValueError(f"a layer with rotated keys {flags} cannot be stored as KIVI")
        obj = super().__new__(cls, flags)
        obj.kivi = bool(kivi)
        return obj

    def __repr__(self) -> str:
        return f"LayerKeys({tuple(self)!r}, kivi={self.kivi})"

    def __reduce__(self) -> tuple[object, ...]:
        return (LayerKeys, (tuple(self), self.kivi))


def layer_keys(key_rotated: tuple[bool, ...] | list[bool] | None) -> tuple[bool, ...] | None:
    """``key_rotated`` as bools, keeping a `LayerKeys` layer decision."""
    if key_rotated is None:
        return None
    if isinstance(key_rotated, LayerKeys):
        return key_rotated
    return tuple(bool(x) for x in key_rotated)


def _key_mask(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None, num_heads: int) -> tuple[bool, ...]:
    if not cfg.rotation:
        return (False,) * num_heads
    if key_rotated is None:
        return (True,) * num_heads
    if len(key_rotated) != num_heads:
        raise ValueError(f"key_rotated has {len(key_rotated)} flags for {num_heads} KV heads")
    return layer_keys(key_rotated)


def rotate_keys(x: torch.Tensor, cfg: OscarConfig, key_rotated: tuple[bool, ...] | None = None,
                head_axis: int = 0) -> torch.Tensor:
    """`H_D x` for the KV heads whose keys are rotated, `x` (fp32) for the others.

    Args:
        x: keys, or the queries that read them, with the KV heads on `head_axis` (`[H, n, D]`,
            or `[t, H, g, D]` queries with `head_axis=1`).
        key_rotated: one flag per KV head (`key_rotation_plan`); None rotates every head when
            `cfg.rotation` is on.
    """
    mask = _key_mask(cfg, key_rotated, x.shape[head_axis])
    if all(mask):
        return hadamard(x)
    if not any(mask):
        return x.to(torch.float32)
    shape = [1] * x.dim()
    shape[head_axis] = len(mask)
    m = torch.tensor(mask, dtype=torch.bool, device=x.device).reshape(shape)
    return torch.where(m, hadamard(x), x.to(torch.float32))


def kivi_layer(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None) -> bool:
    """Whether a layer with these key flags is stored as KIVI (no token scale, values unrotated):
    rotation on and no head's keys rotated (a `LayerKeys` row: its layer-wide decision)."""
    if not cfg.rotation or key_rotated is None:
        return False
    if isinstance(key_rotated, LayerKeys):
        return key_rotated.kivi
    return not any(key_rotated)



def mixed_key_rotation(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None) -> tuple[bool, ...] | None:
    """The per-head key flags a kernel must apply for a layer with these flags: None when every
    head's keys follow the layer's rotation (`rotates_values`: all rotated, or a layer stored as
    KIVI where none is), else the flags (some heads rotated, some not; under tensor parallelism
    possibly none of this rank's, in a layer that rotates other ranks' heads)."""
    if key_rotated is None or not cfg.rotation or all(key_rotated) or kivi_layer(cfg, key_rotated):
        return None
    return tuple(bool(x) for x in key_rotated)


def scales_tokens(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None = None) -> bool:
    """Whether a layer's keys are divided by their token scale s_t: `cfg.token_scaling`, except in
    a layer where the key-rotation rule left every head unrotated (`key_rotation_plan`): that layer
    is stored as KIVI stores it. Such heads carry large near-constant channels, and dividing by s_t
    would turn them into per-token variation (docs/OSCAR.md §7)."""
    return cfg.token_scaling and not kivi_layer(cfg, key_rotated)


def rotates_values(cfg: OscarConfig, key_rotated: tuple[bool, ...] | None = None) -> bool:
    """Whether a layer's values are rotated: `cfg.rotation`, except in a layer the key-rotation
    rule stores as KIVI (no head's keys rotated)."""
    return cfg.rotation and not kivi_layer(cfg, key_rotated)


def seal(k: torch.Tensor, v: torch.Tensor, cfg: OscarConfig,
         key_rotated: tuple[bool, ...] | None = None) -> tuple[KBlock, VBlock]:
    """Rotate, scale, quantize and pack one block of post-RoPE keys and values `[H, n, D]`
    (keys rotated per `key_rotated`, see `rotate_keys`; token scales per `scales_tokens`)."""
    cfg.check_shape(k.shape[0], k.shape[2])
    k_rot = rotate_keys(k, cfg, key_rotated)
    s = token_scales(k_rot, cfg.norm_scope) if scales_tokens(cfg, key_rotated) else None
    kb = pack_k(k_rot, s, cfg)
    kb.key_rotated = None if key_rotated is None else _key_mask(cfg, key_rotated, k.shape[0])
    v_rot = rotates_values(cfg, key_rotated)
    vb = pack_v(hadamard(v) if v_rot else v.to(torch.float32), cfg)
    vb.rotated = v_rot or not cfg.rotation
    return kb, vb


def restore_k(block: KBlock, cfg: OscarConfig, head_dim: int) -> torch.Tensor:
    """Keys as the model sees them `[H, n, D]` fp32: dequantized, times s, un-rotated.

    `q . restore_k(...)` equals `s * <H q, deq(K_bar)>`: the same logits the fused kernel computes.
    """
    k = unpack_k(block, cfg, head_dim)
    if block.scale is not None:
        k = k * _broadcast_scale(block.scale, k.shape[0])
    return rotate_keys(k, cfg, block.key_rotated)


def restore_v(block: VBlock, cfg: OscarConfig, head_dim: int) -> torch.Tensor:
    """Values as the model sees them `[H, n, D]` fp32: dequantized, un-rotated."""
    v = unpack_v(block, cfg, head_dim)
    return hadamard(v) if cfg.rotation and block.rotated else v


def quantize_dequantize(k: torch.Tensor, v: torch.Tensor, cfg: OscarConfig,
                        key_rotated: tuple[bool, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Round trip of one block through the packed format: what attention sees after a seal."""
    kb, vb = seal(k, v, cfg, key_rotated)
    return restore_k(kb, cfg, k.shape[2]), restore_v(vb, cfg, v.shape[2])


def decode_attention(
    q: torch.Tensor,
    k_blocks: list[KBlock],
    v_blocks: list[VBlock],
    k_tail: torch.Tensor,
    v_tail: torch.Tensor,
    cfg: OscarConfig,
    sm_scale: float,
    *,
    key_rotated: tuple[bool, ...] | None = None,
    window_left: int | None = None,
) -> torch.Tensor:
    """One query step over sealed blocks plus a full-precision tail, computed the way the kernel does.

    Args:
        q: `[Hq, D]` post-RoPE queries, Hq a multiple of the KV heads H (GQA).
        k_blocks, v_blocks: sealed history, oldest first.
        k_tail, v_tail: `[H, t, D]` open tokens (not rotated; t may be 0).
        key_rotated: the layer's key-rotation flags (`key_rotation_plan`), as in `extend_attention`.
        window_left: a sliding-window layer's window, as in `extend_attention`.
    Returns:
        `[Hq, D]` fp32 attention output in the model's (un-rotated) basis.

    The query sees every token (within its window): this is `extend_attention` of one query (the
    last token of the sequence), `extend_attention(q[None], ...)[0]`.
    """
    return extend_attention(q[None], k_blocks, v_blocks, k_tail, v_tail, cfg, sm_scale, key_rotated=key_rotated,
                            window_left=window_left)[0]


def extend_attention(
    q: torch.Tensor,
    k_blocks: list[KBlock],
    v_blocks: list[VBlock],
    k_exact: torch.Tensor,
    v_exact: torch.Tensor,
    cfg: OscarConfig,
    sm_scale: float,
    *,
    exact_from: int | None = None,
    sealed_until: torch.Tensor | list[int] | None = None,
    key_rotated: tuple[bool, ...] | None = None,
    window_left: int | None = None,
) -> torch.Tensor:
    """Causal attention of the last `t` tokens of a sequence over the sequence, computed the way the
    kernels do: what a prefill chunk (a fresh prompt, or the tokens after a prefix-cache hit) sees.

    The sequence has `L` tokens. The sealed blocks hold its positions `0 .. n_s-1` (`n_s` their
    tokens in all), the exact tokens its positions `e .. L-1` (`e = exact_from`, default `n_s`;
    `e <= n_s`, so the two may overlap). The queries are its last `t` tokens: query `i` is at
    position `x_i = L - t + i` and sees every token at or before `x_i`, those below its boundary
    `b_i = sealed_until[i]` (default `n_s`) as codes (dequantized, logits times s_t) and those at
    or after it exactly (`e <= b_i <= n_s`).

    With block flush (docs/OSCAR.md §2.4, §4) and page size P: position-determined attention (the
    server's default, decode, `OscarCache`) has `b_i = (x_i // P) * P`, the start of the query's own
    page: sealed blocks for every page below the last query's page, exact tokens from the first
    query's page on. Exact prefill (`--oscar-prefill exact`) has one boundary, the start of the page
    holding the prefix's end, for every query (the defaults, with the sealed blocks the pages
    sealed before the step).

    Args:
        q: `[t, Hq, D]` post-RoPE queries, Hq a multiple of the KV heads H (GQA), `t <= L`.
        k_blocks, v_blocks: sealed history, oldest first (may be empty).
        k_exact, v_exact: `[H, m, D]` exact keys / values of positions `e .. L-1` (post-RoPE, not
            rotated; m may be 0).
        sm_scale: the softmax scale applied to the logits.
        exact_from: `e`, the position of the first exact token (default `n_s`).
        sealed_until: `[t]` the boundaries `b_i` (default `n_s` for every query).
        key_rotated: the layer's key-rotation flags (`key_rotation_plan`); None: those the sealed
            blocks carry (every head's keys rotated when there is no block). Given with blocks, the
            two must agree.
        window_left: a sliding-window layer (SGLang's `RadixAttention.sliding_window_size`,
            transformers' `sliding_window - 1`): query `x_i` sees only positions
            `x_i - window_left .. x_i`; None (or negative): every position.
    Returns:
        `[t, Hq, D]` fp32 attention output in the model's (un-rotated) basis.

    Works in the rotated basis: logits of sealed tokens are `s * <Hq, deq(K_bar)> * sm_scale`,
    the output is accumulated rotated and un-rotated once at the end.
    """
    t, hq, d = q.shape
    h = k_exact.shape[0]
    n_s = sum(kb.num_tokens for kb in k_blocks)
    e = n_s if exact_from is None else int(exact_from)
    length = e + k_exact.shape[1]  # L
    if not 0 <= e <= n_s:
        raise ValueError(f"exact tokens from position {e}: must be within the {n_s} sealed positions or right after")
    if t > length:
        raise ValueError(f"{t} queries over a sequence of {length} tokens: the queries are its last tokens")
    if sealed_until is None:
        bound = torch.full((t,), n_s, dtype=torch.int64, device=q.device)
    else:
        bound = torch.as_tensor(sealed_until, dtype=torch.int64).to(q.device)
        if bound.shape != (t,) or (t and (int(bound.min()) < e or int(bound.max()) > n_s)):
            raise ValueError(f"sealed_until must be [{t}] boundaries within [{e}, {n_s}], got {bound.tolist()}")
    plan = key_rotated if key_rotated is not None else (k_blocks[0].key_rotated if k_blocks else None)
    if any(_key_mask(cfg, kb.key_rotated, h) != _key_mask(cfg, plan, h) or kivi_layer(cfg, kb.key_rotated) != kivi_layer(cfg, plan)
           for kb in k_blocks):
        raise ValueError("the sealed key blocks disagree on which heads' keys are rotated")
    key_rotated = plan
    q_rot = rotate_keys(q.reshape(t, h, hq // h, d), cfg, key_rotated, head_axis=1)
    v_rot = rotates_values(cfg, key_rotated)
    logits, values = [], []
    for kb, vb in zip(k_blocks, v_blocks, strict=True):
        lg = torch.einsum("thgd,hnd->hgtn", q_rot, unpack_k(kb, cfg, d))
        if kb.scale is not None:
            lg = lg * _broadcast_scale(kb.scale, h).transpose(1, 2)[:, :, None, :]
        logits.append(lg)
        values.append(unpack_v(vb, cfg, d))
    logits.append(torch.einsum("thgd,hnd->hgtn", q_rot, rotate_keys(k_exact, cfg, key_rotated)))
    values.append(hadamard(v_exact) if v_rot else v_exact.to(torch.float32))
    x = torch.arange(length - t, length, device=q.device)[:, None]  # [t, 1] query positions
    sealed_pos = torch.arange(n_s, device=q.device)[None, :]
    exact_pos = torch.arange(e, length, device=q.device)[None, :]
    b = bound[:, None]
    visible = torch.cat(((sealed_pos <= x) & (sealed_pos < b), (exact_pos <= x) & (exact_pos >= b)), dim=1)
    if window_left is not None and window_left >= 0:
        visible &= torch.cat((sealed_pos, exact_pos), dim=1) >= x - window_left
    lg = (torch.cat(logits, dim=3) * sm_scale).masked_fill(~visible, float("-inf"))
    p = torch.softmax(lg, dim=-1)
    out = torch.einsum("hgtn,hnd->thgd", p, torch.cat(values, dim=1)).reshape(t, hq, d)
    return hadamard(out) if v_rot else out


# --------------------------------------------------------------------------------------------
# Which heads' keys to rotate: a data-free choice from the weights (docs/OSCAR.md §7)
# --------------------------------------------------------------------------------------------

#: Keys of a KV head are rotated when its query/key channel alignment rho is at least this: 1 is
#: where the rotated and unrotated query-weighted errors are equal if every channel's values had
#: the same shape (`qk_channel_alignment`). Measured (benches/results/quality_hybrid.md): every
#: SmolLM2 head is >= 1.001 (nothing changes there); on gemma-3-270m 0.5 (which catches only the
#: four heads where rotation multiplies the query-weighted key error by 2.8-15x) left INT2 at
#: +9.8 % against KIVI's +6.9 %, 1.0 gives +6.7 %.
KEY_ROTATION_MIN_ALIGNMENT = OscarConfig().key_rotation_min_alignment


def _norm_gain(norm: torch.nn.Module, dim: int) -> torch.Tensor:
    """The per-channel gain of an RMSNorm-like module: its output for an all-ones input (whose RMS
    is 1), so `w` (Llama) and `1 + w` (Gemma) conventions need no special case."""
    with torch.no_grad():
        w = norm.weight
        return norm(torch.ones(1, dim, dtype=w.dtype, device=w.device))[0].float()


def qk_channel_alignment(model: torch.nn.Module, k_group: int = 32) -> list[list[float]]:
    """Per layer and KV head, how well the channels that carry the keys' energy match the
    channels the queries read, from the weights alone:

        rho = (D/2) * sum_j a_j v_j / (sum_j a_j * sum_j v_j)

    over the D/2 RoPE channel pairs j = (c, c + D/2) (RoPE mixes the two channels of a pair, never
    two pairs), with `v_j` the keys' expected energy in pair j and `a_j` the queries' (mean over the
    query heads of the group). A channel's expected energy is the squared norm of its projection row
    times the layer's input-norm gains (a unit-RMS, isotropic hidden state), plus its projection
    bias squared when the model has biases, times the squared gain of a q/k RMSNorm when the model
    has one (which rescales each head to unit RMS first). For the keys only the part of a bias that
    varies within a key group counts: RoPE turns pair j's constant bias into a sinusoid of frequency
    theta_j = rope_theta^(-2j/D), whose variance over G = k_group consecutive tokens is the share
    1 - sinc^2(G theta_j / 2) of its energy (a constant per channel costs nothing: per-channel
    quantization, rotated or not, absorbs it in the offset); a query's bias multiplies the key error
    whole.

    Why it decides rotation: per-channel key quantization (KIVI) leaves each channel an error that
    grows with that channel's range, and a logit error `sum_c q_c e_c`; a rotation spreads every
    channel's error evenly over all channels. rho < 1 says the keys' large channels are the ones
    the queries read least: unrotated, their error lands where the queries barely look; rotated, it
    lands on the channels they do read. On gemma-3-270m log(rho) tracks the measured ratio of
    query-weighted key error rotated / unrotated with correlation -0.94 (18 layers, Emma). On
    Qwen2.5-Coder-0.5B (large q/k biases: the key bias carries up to 10^4 times the weights'
    energy in layer 0) the biases move 20 of its 48 heads below 1, where the weights alone kept all
    but two above (benches/results/quality_hybrid.md, "A third model").

    Raises:
        ValueError: the model's layers do not expose `self_attn.{q_proj,k_proj}` and an
            `input_layernorm` (then use `key_rotation="all"`).
    """
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    hq = int(cfg.num_attention_heads)
    h = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder `layers`: the key-rotation rule reads "
                         "self_attn.q_proj / k_proj of each layer")
    theta = rope_theta_of(cfg)
    out = []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not hasattr(attn, "q_proj") or not hasattr(attn, "k_proj") or not hasattr(layer, "input_layernorm"):
            raise ValueError(f"layer {i} of {type(model).__name__} has no self_attn.q_proj / k_proj / input_layernorm: "
                             "the key-rotation rule reads them")
        with torch.no_grad():
            ln = _norm_gain(layer.input_layernorm, layer.input_layernorm.weight.shape[-1])
            gains = {name: _norm_gain(getattr(attn, name), d) for name in ("q_norm", "k_norm") if getattr(attn, name, None) is not None}
        out.append(head_alignment(attn.q_proj.weight, attn.k_proj.weight, ln, num_kv_heads=h, head_dim=d,
                                  q_norm_gain=gains.get("q_norm"), k_norm_gain=gains.get("k_norm"),
                                  q_bias=getattr(attn.q_proj, "bias", None), k_bias=getattr(attn.k_proj, "bias", None),
                                  rope_theta=theta, k_group=k_group))
    return out


def rope_theta_of(config: object) -> float | None:
    """The RoPE base of a transformers config (``rope_theta``, or ``rope_parameters["rope_theta"]``)."""
    theta = getattr(config, "rope_theta", None)
    params = getattr(config, "rope_parameters", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
        if theta is None and params and all(isinstance(v, dict) for v in params.values()):  # per layer type
            theta = next((v.get("rope_theta") for v in params.values() if v.get("rope_theta")), None)
    return float(theta) if theta else None


def bias_variation(head_dim: int, rope_theta: float | None, k_group: int) -> torch.Tensor:
    """``[D/2]``: the share of a constant pre-RoPE bias's energy in pair j that varies within a key
    group of ``k_group`` tokens, ``1 - sinc^2(k_group * theta_j / 2)`` (1 everywhere when the RoPE
    base is unknown: the whole bias counts)."""
    if rope_theta is None:
        return torch.ones(head_dim // 2)
    theta = float(rope_theta) ** (-torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim)
    w = k_group * theta / 2
    return (1 - (torch.sin(w) / w) ** 2).float()


def head_alignment(w_q: torch.Tensor, w_k: torch.Tensor, input_gain: torch.Tensor, *, num_kv_heads: int, head_dim: int,
                   q_norm_gain: torch.Tensor | None = None, k_norm_gain: torch.Tensor | None = None,
                   q_bias: torch.Tensor | None = None, k_bias: torch.Tensor | None = None,
                   rope_theta: float | None = None, k_group: int = 32) -> list[float]:
    """One layer's `qk_channel_alignment`, one rho per KV head, from its query / key projection
    weights ``[Hq * D, hidden]`` / ``[H * D, hidden]`` (heads in order) and biases ``[Hq * D]`` /
    ``[H * D]`` when it has them, the input norm's per-channel gain ``[hidden]``, the q/k RMSNorm
    gains ``[D]`` when the model has them, the RoPE base and the key group size (`bias_variation`).
    Any module layout (separate or fused projections, a tensor-parallel shard of whole heads)
    reduces to these."""
    h, d = num_kv_heads, head_dim
    hq = w_q.shape[0] // d
    if w_q.shape[0] != hq * d or w_k.shape[0] != h * d or hq % h or w_q.shape[1] != input_gain.shape[0] or w_k.shape[1] != input_gain.shape[0]:
        raise ValueError(f"q/k projections {tuple(w_q.shape)} / {tuple(w_k.shape)} do not make whole heads of "
                         f"{d} channels ({h} KV heads) over {input_gain.shape[0]} inputs")
    for name, b, rows in (("q", q_bias, hq * d), ("k", k_bias, h * d)):
        if b is not None and b.numel() != rows:
            raise ValueError(f"the {name} projection's bias has {b.numel()} entries, its weight {rows} rows")
    with torch.no_grad():
        ln = input_gain.float()
        ek = (w_k.float() * ln[None]).pow(2).sum(-1).reshape(h, d)
        eq = (w_q.float() * ln[None]).pow(2).sum(-1).reshape(hq, d)
        if k_bias is not None:
            f = bias_variation(d, rope_theta, k_group).to(ek.device)
            ek = ek + k_bias.float().reshape(h, d).pow(2) * torch.cat((f, f))[None]
        if q_bias is not None:
            eq = eq + q_bias.float().reshape(hq, d).pow(2)
        for e, gain in ((ek, k_norm_gain), (eq, q_norm_gain)):
            if gain is not None:
                e.copy_(e / e.mean(-1, keepdim=True) * gain.float().pow(2)[None])
        pairs_k = ek[:, : d // 2] + ek[:, d // 2 :]
        pairs_q = (eq[:, : d // 2] + eq[:, d // 2 :]).reshape(h, hq // h, d // 2).mean(1)
        rho = (d // 2) * (pairs_q * pairs_k).sum(-1) / (pairs_q.sum(-1) * pairs_k.sum(-1))
    return [float(x) for x in rho]


def key_rotation_plan(model: torch.nn.Module, cfg: OscarConfig) -> list[tuple[bool, ...]]:
    """Per layer, one flag per KV head: whether `cfg` rotates that head's keys.

    `cfg.rotation` off: no head. `cfg.key_rotation == "all"`: every head. `"weights"`: the heads
    whose `qk_channel_alignment` is at least `cfg.key_rotation_min_alignment` (default
    `KEY_ROTATION_MIN_ALIGNMENT`; a layer with no such
    head also skips token scaling, `scales_tokens`). A function of the weights
    only: every request, token and prefix gets the same choice (the packed bytes of a shared prefix
    do not depend on the request), and decode pays nothing for it (the query of an unrotated head is
    simply not rotated). Values are rotated in every head when `cfg.rotation` is on.
    """
    if not cfg.rotation or cfg.key_rotation == "all":
        cfg_text = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        hq = int(cfg_text.num_attention_heads)
        h = int(getattr(cfg_text, "num_key_value_heads", None) or hq)
        return [(cfg.rotation,) * h for _ in range(int(cfg_text.num_hidden_layers))]
    return plan_from_alignment(qk_channel_alignment(model, cfg.k_group), cfg)


def plan_from_alignment(rho: list[list[float]], cfg: OscarConfig) -> list[tuple[bool, ...]]:
    """`key_rotation_plan` from the per-(layer, KV head) alignments ``rho`` (`qk_channel_alignment`)."""
    if not cfg.rotation:
        return [(False,) * len(row) for row in rho]
    if cfg.key_rotation == "all":
        return [(True,) * len(row) for row in rho]
    return [tuple(r >= cfg.key_rotation_min_alignment for r in row) for row in rho]
