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

Hybrid models (gemma-3: 5 sliding-window layers per full-attention layer) keep their layer types:
full-attention layers are always quantized; sliding layers follow `OscarConfig.sliding_layers`,
"quantized" (an `OscarLayer` that drops every sealed page no future token can see) or "bf16"
(transformers' own `DynamicSlidingWindowLayer`, the window in the model dtype).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from . import reference as ref
from .config import OscarConfig, OscarConfigError
from .supported import check_quality_model, quality_layer_types


class OscarLayer(CacheLayerMixin):
    """The cache of one attention layer (keys `[B, H, T, D]` as transformers passes them)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, cfg: OscarConfig, num_kv_heads: int, head_dim: int, *,
                 key_rotated: tuple[bool, ...] | None = None, sliding_window: int | None = None) -> None:
        """`key_rotated`: one flag per KV head (`reference.key_rotation_plan`), None for every head.
        `sliding_window`: the layer's window when it is a sliding-window layer (tokens at distance
        >= window are never attended), else None."""
        cfg.check_shape(num_kv_heads, head_dim)
        if key_rotated is not None and len(key_rotated) != num_kv_heads:
            raise OscarConfigError(f"key_rotated must have one flag per KV head ({num_kv_heads}), got {len(key_rotated)}")
        super().__init__()
        self.cfg = cfg
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.key_rotated = None if key_rotated is None else tuple(bool(x) for x in key_rotated)
        self.scales_tokens = ref.scales_tokens(cfg, self.key_rotated)
        self.rotates_values = ref.rotates_values(cfg, self.key_rotated)
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.dropped_tokens = 0  # sealed tokens of a sliding layer no future token can see: freed
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
        dropped = self._dropped_after_flush()
        return self.get_seq_length() - dropped + query_length, dropped

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.cfg, self.num_kv_heads, self.head_dim,  # type: ignore[misc]
                      key_rotated=self.key_rotated, sliding_window=self.sliding_window)

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
        page = self.cfg.page_size
        n_k = (self.k_tail.shape[2] // page) * page
        # A sliding layer seals page by page, so that pages leave the window one at a time (the
        # bytes are the same: no key group straddles a page).
        step_k = page if self.sliding_window is not None else max(n_k, 1)
        for a in range(0, n_k, step_k):
            for b in range(self.k_tail.shape[0]):
                k_rot = ref.rotate_keys(self.k_tail[b, :, a:a + step_k], self.cfg, self.key_rotated)
                s = ref.token_scales(k_rot, self.cfg.norm_scope) if self.scales_tokens else None
                blk = ref.pack_k(k_rot, s, self.cfg)
                blk.key_rotated = self.key_rotated
                self.k_blocks[b].append(blk)
        if n_k:
            self.k_tail = self.k_tail[:, :, n_k:].contiguous()
            self.sealed_k_tokens += n_k
        n_v = (self.v_tail.shape[2] // page) * page
        step_v = page if self.sliding_window is not None else max(n_v, 1)
        for a in range(0, n_v, step_v):
            for b in range(self.v_tail.shape[0]):
                v = self.v_tail[b, :, a:a + step_v]
                blk_v = ref.pack_v(ref.hadamard(v) if self.rotates_values else v.to(torch.float32), self.cfg)
                blk_v.rotated = self.rotates_values or not self.cfg.rotation
                self.v_blocks[b].append(blk_v)
        if n_v:
            self.v_tail = self.v_tail[:, :, n_v:].contiguous()
            self.sealed_v_tokens += n_v
        if self.sliding_window is not None:
            self._drop_out_of_window()

    def _dropped_after_flush(self) -> int:
        """Tokens of a sliding layer no later token can see once the tail is flushed: whole pages
        (sealed page by page) ending at or before `get_seq_length() - window + 1`, since the next
        token is at position `get_seq_length()` and sees the positions above it minus the window.
        `get_mask_sizes` runs before `update` flushes, so both use this one count."""
        if self.sliding_window is None or not self.is_initialized:
            return self.dropped_tokens
        page = self.cfg.page_size
        seq = self.get_seq_length()
        horizon = max(seq - self.sliding_window + 1, 0)
        return max(self.dropped_tokens, min((seq // page) * page, (horizon // page) * page))

    def _drop_out_of_window(self) -> None:
        """Free the sealed pages `_dropped_after_flush` counts."""
        target = self._dropped_after_flush()
        while self.dropped_tokens < target:
            n = self.k_blocks[0][0].num_tokens
            for row in self.k_blocks:
                row.pop(0)
            for row in self.v_blocks:
                row.pop(0)
            self.dropped_tokens += n

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
        >>> cache = OscarCache(model, OscarConfig(bits=2))
        >>> model.generate(ids, past_key_values=cache, max_new_tokens=32)
        >>> cache.memory()  # true bytes held: packed history + full-precision tail

    Args:
        model: the causal LM, or only its `PretrainedConfig` (num_hidden_layers, num_key_value_heads,
            head_dim, layer_types, sliding_window) when `cfg.key_rotation` is "all" or rotation is off:
            `key_rotation="weights"` (the default) chooses per head from the weights
            (`reference.key_rotation_plan`).
        cfg: how to quantize (default: OScaR INT2).
    Raises:
        OscarConfigError: at construction, when the model shape cannot run with `cfg` (e.g. head_dim
            not a power of two), the model has layers that are not full or sliding-window attention,
            or `key_rotation="weights"` was given a config without weights.
    """

    def __init__(self, model: Any, cfg: OscarConfig | None = None) -> None:
        self.cfg = cfg or OscarConfig()
        is_model = isinstance(model, torch.nn.Module)
        model_config = model.config if is_model else model
        num_layers, heads, head_dim = check_quality_model(self.cfg, model_config)
        types, window = quality_layer_types(model_config)
        self.num_kv_heads, self.head_dim = heads, head_dim
        self.layer_types, self.sliding_window = types, window
        if self.cfg.rotation and self.cfg.key_rotation == "weights":
            if not is_model:
                raise OscarConfigError(
                    "key_rotation 'weights' needs the model's weights, got only its config: pass the model "
                    "(OscarCache(model, cfg)), or use key_rotation='all'"
                )
            try:
                plan: list[tuple[bool, ...] | None] = list(ref.key_rotation_plan(model, self.cfg))
            except ValueError as e:
                raise OscarConfigError(f"key_rotation 'weights' must read the model's q/k projections: {e}; "
                                       "use key_rotation='all'") from None
        else:
            plan = [None] * num_layers
        self.key_rotation_plan = plan
        self.oscar_layers: list[OscarLayer] = []
        layers: list[CacheLayerMixin] = []
        for i, kind in enumerate(types):
            if kind == "sliding_attention" and self.cfg.sliding_layers == "bf16":
                layers.append(DynamicSlidingWindowLayer(sliding_window=window))
                continue
            layer = OscarLayer(self.cfg, heads, head_dim, key_rotated=plan[i],
                               sliding_window=window if kind == "sliding_attention" else None)
            self.oscar_layers.append(layer)
            layers.append(layer)
        super().__init__(layers=layers)

    def flush(self) -> None:
        """Seal every whole block now (call after a prefill to quantize it, docs/OSCAR.md §2.4)."""
        for layer in self.oscar_layers:
            layer.flush()

    def load_exact(self, exact: Cache) -> None:
        """Fill this empty cache from `exact`, a transformers cache holding a prefix in full precision
        whose every layer keeps all its tokens (a `DynamicCache()` built without the model config, so
        that sliding layers are not cut to their window), and seal its whole pages."""
        if self.get_seq_length():
            raise ValueError("load_exact needs an empty OscarCache")
        for src, dst in zip(exact.layers, self.layers, strict=True):
            dst.update(src.keys, src.values)
        self.flush()

    def _bf16_window_bytes(self) -> int:
        """Bytes of the full-precision sliding layers ("bf16"), in the model dtype (like `tail_bytes`)."""
        return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                   for layer in self.layers
                   if isinstance(layer, DynamicSlidingWindowLayer) and layer.is_initialized)

    def _layer_elements(self, tokens: int) -> list[tuple[int, bool]]:
        """Per layer, `(K/V elements per sequence, quantized)` after `tokens` tokens, counting what a
        BF16 cache of the same model would hold: every token of a full-attention layer, at most the
        window (window - 1 kept between steps) of a sliding one."""
        per_token = 2 * self.num_kv_heads * self.head_dim
        out = []
        for kind in self.layer_types:
            n = tokens if kind == "full_attention" else min(tokens, (self.sliding_window or 1) - 1)
            out.append((n * per_token, not (kind == "sliding_attention" and self.cfg.sliding_layers == "bf16")))
        return out

    def stored_elements(self, tokens: int) -> tuple[int, int]:
        """`(quantized, bf16)` K/V elements per sequence the cache holds after `tokens` tokens
        (`_layer_elements`)."""
        rows = self._layer_elements(tokens)
        return sum(n for n, q in rows if q), sum(n for n, q in rows if not q)

    def layer_bits(self, i: int) -> float:
        """Stored bits per element of quantized layer ``i``: the config's, without the token scale
        where the key-rotation plan stores the layer as KIVI (`reference.scales_tokens`)."""
        plan = self.key_rotation_plan[i] if self.key_rotation_plan is not None else None
        cfg = self.cfg if ref.scales_tokens(self.cfg, plan) else self.cfg.replace(token_scaling=False)
        return cfg.effective_bits(self.num_kv_heads, self.head_dim)

    def effective_bits(self, tokens: int) -> float:
        """Stored bits per K/V element of the whole cache after `tokens` tokens, over the elements a
        BF16 cache of the same model holds (sliding layers: their window): `OscarConfig.effective_bits`
        for a model whose layers are all quantized and scale their tokens, less where the key-rotation
        plan stores layers as KIVI (no token scale), more when sliding layers stay BF16."""
        rows = self._layer_elements(tokens)
        total = sum(n for n, _ in rows)
        return sum(n * (self.layer_bits(i) if q else 16.0) for i, (n, q) in enumerate(rows)) / max(total, 1)

    def memory(self) -> dict[str, float]:
        """True bytes held, and what BF16 would need for the same tokens."""
        packed = sum(layer.packed_bytes() for layer in self.oscar_layers)
        tail = sum(layer.tail_bytes() for layer in self.oscar_layers) + self._bf16_window_bytes()
        tokens = self.get_seq_length()
        first = self.oscar_layers[0] if self.oscar_layers else None
        rows = len(first.k_blocks) if first is not None and first.is_initialized else 0
        quant, bf16 = self.stored_elements(tokens)
        return {
            "tokens": tokens,
            "packed_bytes": packed,
            "tail_bytes": tail,
            "total_bytes": packed + tail,
            "bf16_bytes": 2 * rows * (quant + bf16),
            "effective_bits": self.effective_bits(tokens),
        }

    def __repr__(self) -> str:
        return f"OscarCache({self.cfg}, layers={len(self.layers)})"
