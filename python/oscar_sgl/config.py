"""`OscarConfig`: the one object that says how a KV cache is quantized.

Validated at construction (`oscar_sgl.supported.check_fields`), so a bad value fails at flag parsing /
model load with a message that names the field (or, through `OscarConfig.from_flags`, the
command-line flag), never later inside a kernel. What else is supported where: `oscar_sgl.supported`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal, Mapping

from .errors import OscarConfigError
from .supported import CLIP_CHOICES, INT_FIELD_LIMIT, KEY_RANGES_CHOICES, OFFSET_CHOICES, check_fields, check_layer_shape

__all__ = ["CLIP_CHOICES", "FORMAT_FIELDS", "INT2_FORMAT", "INT_FIELD_LIMIT", "KEY_RANGES_CHOICES", "LAYOUT_VERSION", "METHODS",
           "OFFSET_CHOICES", "PAPER_FORMAT", "Clip",
           "KeyRanges", "KeyRotation", "NormScope",
           "Offset", "OscarConfig", "SlidingLayers", "OscarConfigError"]

NormScope = Literal["layer", "head"]
KeyRotation = Literal["all", "weights"]
SlidingLayers = Literal["quantized", "bf16"]
Offset = Literal["integer", "min"]
Clip = Literal["none", "keys", "values", "both"]
KeyRanges = Literal["group", "page"]

#: method name -> (rotation, token_scaling). `kivi` is plain per-channel-K / per-token-V
#: quantization; `oscar` is the full method.
METHODS: dict[str, tuple[bool, bool]] = {
    "kivi": (False, False),
    "rotation-only": (True, False),
    "scaling-only": (False, True),
    "oscar": (True, True),
}

LAYOUT_VERSION = 1

#: The fields whose default depends on the code width and the method (`OscarConfig.format_defaults`).
FORMAT_FIELDS = ("k_group", "v_group", "offset", "clip", "key_ranges")

#: The paper's format (and KIVI's): an fp16 scale/offset pair per 32 tokens of a key channel and per
#: 32 channels of a value token, integer zero points, no clip search. The default at INT4 and of `kivi`.
PAPER_FORMAT: dict[str, object] = {"k_group": 32, "v_group": 32, "offset": "integer", "clip": "none", "key_ranges": "group"}

#: The INT2 default of every method but `kivi`: page-grid key ranges with key groups of 16 tokens,
#: value groups of 64 channels, the group minimum as offset and the clip search on value groups
#: (docs/OSCAR.md §2.3): the lowest ΔPPL per bit measured at INT2 (benches/results/quality.md).
INT2_FORMAT: dict[str, object] = {"k_group": 16, "v_group": 64, "offset": "min", "clip": "values", "key_ranges": "page"}


@dataclass(frozen=True)
class OscarConfig:
    """How keys and values are quantized.

    The format fields (`FORMAT_FIELDS`: k_group, v_group, offset, clip, key_ranges) left unset (None)
    take their default by code width and method when the config is built (`format_defaults`): at
    INT2 `INT2_FORMAT` (page-grid key ranges, k_group 16, v_group 64, offset "min", clip "values"),
    at INT4 and for `kivi` at every width `PAPER_FORMAT` (k_group 32, v_group 32, "integer", "none",
    "group"). A built config always holds concrete values, and `to_dict()` round-trips.

    Attributes:
        bits: code width, 2 or 4.
        k_group: tokens per key quantization group (per head and channel), G_K.
        v_group: channels per value quantization group (per token and head), G_V.
        page_size: R, tokens per page: a page is written in full precision and sealed (quantized)
            whole once it is full. It is also the residual window of the paper (docs/OSCAR.md):
            at most R tokens of a sequence are in full precision. A positive multiple of k_group.
            Server flag ``--oscar-page-size`` (alias ``--oscar-residual``); CLI ``--page-size``.
        rotation: apply the Walsh-Hadamard rotation to q, k and v.
        token_scaling: divide keys by their L2 norm s_t before quantizing (omni-token scaling).
        norm_scope: "layer" (one s_t over all KV heads of the layer, the paper's choice) or "head".
        key_rotation: which KV heads' keys are rotated when `rotation` is on (values always are).
            "all": every head (the paper). "weights": a data-free choice per (layer, KV head) from
            the model's weights (`oscar_sgl.reference.key_rotation_plan`): keys are left unrotated
            where the channels that carry the keys' energy are not the ones the queries read
            (rotation would spread the large error of those channels onto the channels the
            queries use; gemma-3's full-attention layers); a layer with no rotated head is stored
            as KIVI (no token scale, values unrotated). Needs the model's weights
            (`OscarCache(model, cfg)`, and the SGLang server, which reads the weights it loaded;
            docs/OSCAR.md §7).
        key_rotation_min_alignment: the rule's threshold: with "weights", a KV head's keys are
            rotated when its query/key channel alignment rho (`reference.qk_channel_alignment`) is
            at least this. 1.0 (the default) is where rotated and unrotated errors balance; a
            finite positive number.
        sliding_layers: what a hybrid model's sliding-window layers store (full-attention layers
            are always quantized): "quantized" (the same format; pages that leave the window are
            dropped) or "bf16" (the window in full precision, as SGLang's SWA pool would).
        offset: how the seal-time quantizer places a group's grid (docs/OSCAR.md §2.3): "integer"
            (the paper: an integer zero point, offset = -round(-min/scale) * scale) or "min"
            (offset = the group minimum itself, so the grid spans exactly [min, max]).
        clip: which groups get the seal-time MSE clip search (docs/OSCAR.md §2.3): "none",
            "keys", "values" or "both". A searched group tries its range shrunk about its middle
            to 1, 15/16, 7/8, 13/16 and 3/4 of its width and keeps the one with the least squared
            error. Seal time only: the packed layout and the decode path do not change.
        key_ranges: how a key group's range is stored (docs/LAYOUT.md §1): "group" (the paper: an
            fp16 scale/offset pair per k_group tokens of a (head, channel)) or "page" (per (page,
            head, channel) an fp16 grid of 256 levels spanning the page's keys, and per k_group
            tokens two uint8 indices into it, the group's range rounded outward to the grid:
            16 bits per group instead of 32, so `k_group=16` costs what 32 costs as "group",
            plus 32 bits per page). Key groups are always quantized on their range's grid
            (`offset` and `clip` then apply to the values only). Quality and bits: docs/OSCAR.md §2.3.
    """

    bits: int = 2
    k_group: int = None  # type: ignore[assignment]  # None: the format default (`format_defaults`)
    v_group: int = None  # type: ignore[assignment]
    page_size: int = 128
    rotation: bool = True
    token_scaling: bool = True
    norm_scope: NormScope = "layer"
    key_rotation: KeyRotation = "weights"
    key_rotation_min_alignment: float = 1.0
    sliding_layers: SlidingLayers = "quantized"
    offset: Offset = None  # type: ignore[assignment]
    clip: Clip = None  # type: ignore[assignment]
    key_ranges: KeyRanges = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for field, value in self.format_defaults(self.bits, self.rotation, self.token_scaling).items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        check_fields(self.to_dict())

    @staticmethod
    def format_defaults(bits: object, rotation: bool = True, token_scaling: bool = True) -> dict[str, object]:
        """The values the `FORMAT_FIELDS` take when not given: `INT2_FORMAT` at 2 bits for every
        method but `kivi` (no rotation, no token scaling), `PAPER_FORMAT` otherwise (INT4, where the
        paper's format is already near lossless and decodes 12-17 % faster, and the KIVI baseline,
        which keeps its paper's format at every width)."""
        kivi = not rotation and not token_scaling
        return dict(INT2_FORMAT if bits == 2 and not kivi else PAPER_FORMAT)

    @classmethod
    def from_flags(cls, flags: Mapping[str, str], **values: object) -> "OscarConfig":
        """The constructor for command-line front ends: a bad value raises `OscarConfigError` whose
        message names the flag (``flags[field]``, e.g. ``{"bits": "--oscar-bits"}``), not the field.
        A value None is a flag not given: the field's default (for `FORMAT_FIELDS`, by bits and method)."""
        given = {k: v for k, v in values.items() if v is not None}
        merged = {**cls._field_defaults(), **given}
        for field, value in cls.format_defaults(merged["bits"], bool(merged["rotation"]), bool(merged["token_scaling"])).items():
            if merged[field] is None:
                merged[field] = value
        check_fields(merged, lambda name: flags.get(name, name))
        return cls(**given)  # type: ignore[arg-type]

    @classmethod
    def _field_defaults(cls) -> dict[str, object]:
        return {f.name: f.default for f in fields(cls)}

    @classmethod
    def for_method(cls, method: str, **overrides: object) -> "OscarConfig":
        """The config of one ablation (`kivi`, `rotation-only`, `scaling-only`, `oscar`)."""
        if method not in METHODS:
            raise OscarConfigError(f"unknown method {method!r}; choose from {sorted(METHODS)}")
        rotation, token_scaling = METHODS[method]
        return cls(rotation=rotation, token_scaling=token_scaling, **overrides)  # type: ignore[arg-type]

    @property
    def method(self) -> str:
        for name, flags in METHODS.items():
            if flags == (self.rotation, self.token_scaling):
                return name
        raise AssertionError("unreachable: every flag pair is a method")

    @property
    def label(self) -> str:
        """`method`, plus the seal-time quantizer options that differ from the defaults
        (``oscar``, ``oscar+min``, ``oscar+clip-values``, ``oscar+min+clip-values``)."""
        return (self.method + ("+min" if self.offset == "min" else "") + ("" if self.clip == "none" else f"+clip-{self.clip}")
                + ("+page-ranges" if self.key_ranges == "page" else ""))

    @property
    def clip_keys(self) -> bool:
        return self.clip in ("keys", "both")

    @property
    def clip_values(self) -> bool:
        return self.clip in ("values", "both")

    def check_shape(self, num_kv_heads: int, head_dim: int) -> None:
        """Raise `OscarConfigError` if this config cannot quantize a layer of that shape
        (`oscar_sgl.supported.check_layer_shape`)."""
        check_layer_shape(self, num_kv_heads, head_dim)

    def scale_columns(self, num_kv_heads: int) -> int:
        """S: token-scale columns stored per token (docs/LAYOUT.md)."""
        if not self.token_scaling:
            return 0
        return 1 if self.norm_scope == "layer" else num_kv_heads

    def bytes_per_token(self, num_kv_heads: int, head_dim: int) -> float:
        """Packed bytes per token per layer (codes + params + token scales), BF16 tail excluded."""
        self.check_shape(num_kv_heads, head_dim)
        h, d = num_kv_heads, head_dim
        k_params = 2 * d / self.k_group + 4 * d / self.page_size if self.key_ranges == "page" else 4 * d / self.k_group
        per_head = 2 * d * self.bits / 8 + k_params + 4 * d / self.v_group
        return h * per_head + 4 * self.scale_columns(h)

    def effective_bits(self, num_kv_heads: int, head_dim: int) -> float:
        """Stored bits per K/V element, params and token scales included."""
        return 8 * self.bytes_per_token(num_kv_heads, head_dim) / (2 * num_kv_heads * head_dim)

    def replace(self, **changes: object) -> "OscarConfig":
        """A copy with `changes`; every other field keeps its value here (a format field set by
        default keeps that value too: ``cfg.replace(bits=4)`` of an INT2 config stays in its format)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
