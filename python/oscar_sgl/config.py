"""`OscarConfig`: the one object that says how a KV cache is quantized.

Validated at construction, so a bad value fails at flag parsing / model load with a message that
names the field, never later inside a kernel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

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
        for name in ("bits", "k_group", "v_group", "residual"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise OscarConfigError(f"{name} must be an int, got {value!r}")
        if self.bits not in (2, 4):
            raise OscarConfigError(f"bits must be 2 or 4, got {self.bits}")
        if not _is_pow2(self.k_group):
            raise OscarConfigError(f"k_group must be a positive power of two, got {self.k_group}")
        if not _is_pow2(self.v_group):
            raise OscarConfigError(f"v_group must be a positive power of two, got {self.v_group}")
        if self.residual < 0 or self.residual % self.k_group != 0:
            raise OscarConfigError(
                f"residual must be a non-negative multiple of k_group={self.k_group} "
                f"(a key group must never straddle a flush), got {self.residual}"
            )
        if self.norm_scope not in ("layer", "head"):
            raise OscarConfigError(f"norm_scope must be 'layer' or 'head', got {self.norm_scope!r}")

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
