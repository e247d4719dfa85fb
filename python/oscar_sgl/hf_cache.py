"""`OscarCache`: a transformers `Cache` that really stores OScaR-packed keys and values.

Any Hugging Face causal LM (GQA included) can generate and be scored with it. Per layer it keeps:

- sealed blocks in the packed format of docs/LAYOUT.md (codes + fp16 params + fp32 token scales),
  produced once per block and never re-quantized;
- a full-precision tail of the newest tokens (fewer than `page_size` of them after a flush).

Flushes are lazy: a step always attends to its own new tokens exactly; at the start of the next
`update` (or on an explicit `flush()`) every whole block of the tail is sealed. This is the block
flush of docs/OSCAR.md §2.4, and it is what makes R-aligned chunked scoring identical to
token-by-token decoding.

Attention sees `restore_k`/`restore_v` of the sealed blocks (dequantized, times s_t, un-rotated):
`q . restore_k = s_t <H q, deq(K_bar)>`, the logits the fused GPU kernel computes in the rotated
basis. The dequantized history is a per-step temporary, never stored.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from . import reference as ref
from .config import OscarConfig, OscarConfigError
from .supported import check_quality_model


class OscarLayer(CacheLayerMixin):
    """The cache of one attention layer (keys `[B, H, T, D]` as transformers passes them)."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, cfg: OscarConfig, num_kv_heads: int, head_dim: int) -> None:
        cfg.check_shape(num_kv_heads, head_dim)
        super().__init__()
        self.cfg = cfg
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.is_initialized = False
        self.k_blocks: list[list[ref.KBlock]] = []  # per batch row
        self.v_blocks: list[list[ref.VBlock]] = []
        self.k_tail: torch.Tensor | None = None  # [B, H, t_k, D] model dtype
        self.v_tail: torch.Tensor | None = None
        self.sealed_k_tokens = 0
        self.sealed_v_tokens = 0

    # -- transformers CacheLayerMixin protocol -------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        if (h, d) != (self.num_kv_heads, self.head_dim):
            raise OscarConfigError(
                f"layer was configured for {self.num_kv_heads} KV heads x head_dim {self.head_dim}, "
                f"the model passed {h} x {d}"
            )
        self.dtype, self.device = key_states.dtype, key_states.device
        self.k_blocks = [[] for _ in range(b)]
        self.v_blocks = [[] for _ in range(b)]
        self.k_tail = key_states.new_zeros((b, h, 0, d))
        self.v_tail = value_states.new_zeros((b, h, 0, d))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != len(self.k_blocks):
            raise ValueError(
                f"OscarCache holds {len(self.k_blocks)} sequences, got a batch of {key_states.shape[0]} "
                "(beam search and batch reshuffles are not supported)"
            )
        self.flush()
        assert self.k_tail is not None and self.v_tail is not None
        self.k_tail = torch.cat((self.k_tail, key_states), dim=2)
        self.v_tail = torch.cat((self.v_tail, value_states), dim=2)
        return self._history()

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        assert self.k_tail is not None
        return self.sealed_k_tokens + self.k_tail.shape[2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.cfg, self.num_kv_heads, self.head_dim)  # type: ignore[misc]

    def offload(self) -> None:  # transformers' offloading is not supported: keep data where it is
        return None

    def prefetch(self) -> None:
        return None

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        raise NotImplementedError("OscarCache does not support beam search (packed blocks are per sequence)")

    # -- OScaR ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Seal every whole page of the tail (`page_size` tokens, keys and values alike)."""
        if not self.is_initialized:
            return
        assert self.k_tail is not None and self.v_tail is not None
        n_k = (self.k_tail.shape[2] // self.cfg.page_size) * self.cfg.page_size
        if n_k:
            for b in range(self.k_tail.shape[0]):
                k_rot = ref.rotate(self.k_tail[b, :, :n_k], self.cfg)
                s = ref.token_scales(k_rot, self.cfg.norm_scope) if self.cfg.token_scaling else None
                self.k_blocks[b].append(ref.pack_k(k_rot, s, self.cfg))
            self.k_tail = self.k_tail[:, :, n_k:].contiguous()
            self.sealed_k_tokens += n_k
        n_v = (self.v_tail.shape[2] // self.cfg.page_size) * self.cfg.page_size
        if n_v:
            for b in range(self.v_tail.shape[0]):
                self.v_blocks[b].append(ref.pack_v(ref.rotate(self.v_tail[b, :, :n_v], self.cfg), self.cfg))
            self.v_tail = self.v_tail[:, :, n_v:].contiguous()
            self.sealed_v_tokens += n_v

    def _history(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.k_tail is not None and self.v_tail is not None
        d = self.head_dim
        keys, values = [], []
        for b in range(self.k_tail.shape[0]):
            ks = [ref.restore_k(blk, self.cfg, d) for blk in self.k_blocks[b]]
            vs = [ref.restore_v(blk, self.cfg, d) for blk in self.v_blocks[b]]
            keys.append(torch.cat([*(k.to(self.dtype) for k in ks), self.k_tail[b]], dim=1))
            values.append(torch.cat([*(v.to(self.dtype) for v in vs), self.v_tail[b]], dim=1))
        return torch.stack(keys), torch.stack(values)

    def packed_bytes(self) -> int:
        """Bytes of the sealed, packed history (codes, params, token scales) of all rows."""
        return sum(blk.nbytes() for row in self.k_blocks for blk in row) + sum(
            blk.nbytes() for row in self.v_blocks for blk in row
        )

    def tail_bytes(self) -> int:
        """Bytes of the full-precision tail (the open page: the residual window)."""
        if not self.is_initialized:
            return 0
        assert self.k_tail is not None and self.v_tail is not None
        return self.k_tail.numel() * self.k_tail.element_size() + self.v_tail.numel() * self.v_tail.element_size()


class OscarCache(Cache):
    """A transformers `Cache` with OScaR-packed KV.

    Example:
        >>> cache = OscarCache(model.config, OscarConfig(bits=2))
        >>> model.generate(ids, past_key_values=cache, max_new_tokens=32)
        >>> cache.memory()  # true bytes held: packed history + full-precision tail

    Args:
        model_config: the model's `PretrainedConfig` (num_hidden_layers, num_key_value_heads, head_dim).
        cfg: how to quantize (default: OScaR INT2).
    Raises:
        OscarConfigError: at construction, when the model shape cannot run with `cfg` (e.g. head_dim
            not a power of two) or the model has non-full-attention layers.
    """

    def __init__(self, model_config: Any, cfg: OscarConfig | None = None) -> None:
        self.cfg = cfg or OscarConfig()
        num_layers, heads, head_dim = check_quality_model(self.cfg, model_config)
        self.num_kv_heads, self.head_dim = heads, head_dim
        self.oscar_layers = [OscarLayer(self.cfg, heads, head_dim) for _ in range(num_layers)]
        super().__init__(layers=list(self.oscar_layers))

    def flush(self) -> None:
        """Seal every whole block now (call after a prefill to quantize it, docs/OSCAR.md §2.4)."""
        for layer in self.oscar_layers:
            layer.flush()

    def memory(self) -> dict[str, float]:
        """True bytes held, and what BF16 would need for the same tokens."""
        packed = sum(layer.packed_bytes() for layer in self.oscar_layers)
        tail = sum(layer.tail_bytes() for layer in self.oscar_layers)
        tokens = self.get_seq_length()
        first = self.oscar_layers[0] if self.oscar_layers else None
        rows = len(first.k_blocks) if first is not None and first.is_initialized else 0
        bf16 = 2 * 2 * len(self.layers) * rows * tokens * self.num_kv_heads * self.head_dim
        return {
            "tokens": tokens,
            "packed_bytes": packed,
            "tail_bytes": tail,
            "total_bytes": packed + tail,
            "bf16_bytes": bf16,
            "effective_bits": self.cfg.effective_bits(self.num_kv_heads, self.head_dim),
        }

    def __repr__(self) -> str:
        return f"OscarCache({self.cfg}, layers={len(self.layers)})"
