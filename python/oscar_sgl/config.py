"""`OscarConfig`: the one object that says how a KV cache is quantized.

Validated at construction, so a bad value fails at flag parsing / model load with a message that
names the field (or, through `OscarConfig.from_flags`, the command-line flag), never later inside a
kernel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, Literal, Mapping

NormScope = Literal["layer", "head"]

#: method name -> (rotation, token_scaling). `kivi` is plain per-channel-K / per-token-V
#: quantization; `oscar` is the full method.
METHODS: dict[str, tuple[bool, bool]] = {
    "kivi": (False, False),
    "rotation-only": (True, False),
    "scaling-only": (False, True),
    "oscar": (True, True),
}

LAYOUT_VERSION = 1


class OscarConfigError(ValueError):
    """A configuration value that OScaR cannot run with."""


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


#: Every int field stays below this, so it fits the Rust core's u32/i32 arguments.
INT_FIELD_LIMIT = 2**31


def check_fields(values: Mapping[str, object], name: Callable[[str], str] = str, *,
                 zero_residual: bool = True) -> None:
    """Raise `OscarConfigError` for the first field value `OscarConfig` cannot run with. Messages
    say `name(field)` for each field they mention (a flag name for command-line front ends).
    `zero_residual=False`: residual 0 (seal as early as the groups allow) is refused too."""
    ints: dict[str, int] = {}
    for field in ("bits", "k_group", "v_group", "residual"):
        value = values[field]
        if isinstance(value, bool) or not isinstance(value, int):
            raise OscarConfigError(f"{name(field)} must be an int, got {value!r}")
        if value >= INT_FIELD_LIMIT:
            raise OscarConfigError(f"{name(field)} must be below 2^31, got {value}")
        ints[field] = value
    bits, k_group, v_group, residual = (ints[f] for f in ("bits", "k_group", "v_group", "residual"))
    if bits not in (2, 4):
        raise OscarConfigError(f"{name('bits')} must be 2 or 4, got {bits}")
    if not _is_pow2(k_group):
        raise OscarConfigError(f"{name('k_group')} must be a positive power of two, got {k_group}")
    if not _is_pow2(v_group):
        raise OscarConfigError(f"{name('v_group')} must be a positive power of two, got {v_group}")
    if residual < 0 or residual % k_group != 0 or (residual == 0 and not zero_residual):
        raise OscarConfigError(
            f"{name('residual')} must be a {'non-negative' if zero_residual else 'positive'} multiple "
            f"of {name('k_group')} ({k_group}), "
            f"so that no key group straddles a flush, got {residual}"
        )
    if values["norm_scope"] not in ("layer", "head"):
        raise OscarConfigError(f"{name('norm_scope')} must be 'layer' or 'head', got {values['norm_scope']!r}")


@dataclass(frozen=True)
class OscarConfig:
    """How keys and values are quantized.

    Attributes:
        bits: code width, 2 or 4.
        k_group: tokens per key quantization group (per head and channel), G_K.
        v_group: channels per value quantization group (per token and head), G_V.
        residual: R, tokens kept in full precision until a whole block of R is sealed.
            0 means "seal as early as the groups allow": values every token, keys every k_group.
        rotation: apply the Walsh-Hadamard rotation to q, k and v.
        token_scaling: divide keys by their L2 norm s_t before quantizing (omni-token scaling).
        norm_scope: "layer" (one s_t over all KV heads of the layer, the paper's choice) or "head".
    """

    bits: int = 2
    k_group: int = 32
    v_group: int = 32
    residual: int = 128
    rotation: bool = True
    token_scaling: bool = True
    norm_scope: NormScope = "layer"

    def __post_init__(self) -> None:
        check_fields(self.to_dict())

    @classmethod
    def from_flags(cls, flags: Mapping[str, str], *, zero_residual: bool = True, **values: object) -> "OscarConfig":
        """The constructor for command-line front ends: a bad value raises `OscarConfigError` whose
        message names the flag (``flags[field]``, e.g. ``{"bits": "--oscar-bits"}``), not the field.
        ``zero_residual=False`` refuses residual 0 (a page size)."""
        check_fields({**cls().to_dict(), **values}, lambda name: flags.get(name, name), zero_residual=zero_residual)
        return cls(**values)  # type: ignore[arg-type]

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
    def k_flush(self) -> int:
        """Tokens per key flush (a multiple of k_group)."""
        return self.residual if self.residual > 0 else self.k_group

    @property
    def v_flush(self) -> int:
        """Tokens per value flush."""
        return self.residual if self.residual > 0 else 1

    def check_shape(self, num_kv_heads: int, head_dim: int) -> None:
        """Raise OscarConfigError if this config cannot run on a layer of that shape."""
        if num_kv_heads <= 0:
            raise OscarConfigError(f"num_kv_heads must be positive, got {num_kv_heads}")
        if self.rotation and not _is_pow2(head_dim):
            raise OscarConfigError(
                f"head_dim must be a power of two for the Walsh-Hadamard rotation, got {head_dim}"
            )
        if head_dim % self.v_group != 0:
            raise OscarConfigError(f"v_group={self.v_group} must divide head_dim={head_dim}")
        if (head_dim * self.bits) % 8 != 0:
            raise OscarConfigError(f"head_dim={head_dim} does not pack into whole bytes at {self.bits} bits")

    def scale_columns(self, num_kv_heads: int) -> int:
        """S: token-scale columns stored per token (docs/LAYOUT.md)."""
        if not self.token_scaling:
            return 0
        return 1 if self.norm_scope == "layer" else num_kv_heads

    def bytes_per_token(self, num_kv_heads: int, head_dim: int) -> float:
        """Packed bytes per token per layer (codes + params + token scales), BF16 tail excluded."""
        self.check_shape(num_kv_heads, head_dim)
        h, d = num_kv_heads, head_dim
        per_head = 2 * d * self.bits / 8 + 4 * d / self.k_group + 4 * d / self.v_group
        return h * per_head + 4 * self.scale_columns(h)

    def effective_bits(self, num_kv_heads: int, head_dim: int) -> float:
        """Stored bits per K/V element, params and token scales included."""
        return 8 * self.bytes_per_token(num_kv_heads, head_dim) / (2 * num_kv_heads * head_dim)

    def replace(self, **changes: object) -> "OscarConfig":
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
