"""Quality evaluation with the protocol of docs/OSCAR.md §6.

Perplexity: prefill `prefix_tokens` exactly, seal every whole block (flush), then score the next
`score_tokens` in chunks whose boundaries sit on flush points. Inside a chunk the causal mask gives
each position exactly what token-by-token decoding would give it (earlier blocks quantized, the
current block in full precision), which `tests/test_eval.py` checks against true token-by-token
decoding. Quantization therefore acts on attention at every scored position.

The exact prefix KV is computed once and copied into each method's cache (prefill attention is
exact in every method, so this changes nothing but the run time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from .config import OscarConfig
from .hf_cache import OscarCache
from .supported import check_quality_model


@dataclass
class PplResult:
    method: str
    bits: int
    ppl: float
    delta_ppl_pct: float
    kl: float
    top1_agreement: float
    effective_bits: float
    config: dict[str, Any] = field(default_factory=dict)


def chunk_bounds(start: int, end: int, cfg: OscarConfig | None) -> list[tuple[int, int]]:
    """Chunks of [start, end) whose boundaries include every page boundary of `cfg` (exactness)."""
    step = 128 if cfg is None else cfg.page_size
    bounds, a = [], start
    while a < end:
        b = min(end, (a // step + 1) * step)
        bounds.append((a, b))
        a = b
    return bounds


def position_logits(model: Any, ids: torch.Tensor, cache: OscarCache, start: int = 0) -> torch.Tensor:
    """Feed `ids[:, start:]` into `cache` (holding `start` tokens) in chunks cut at every page
    boundary; return their logits `[n - start, V]` (fp32). Each token then attends to the sealed
    pages below its own page and to its own page exactly: what a server with `--oscar-prefill
    position` (the default) computes for it, whatever the server's chunking, cache hits or batch."""
    outs = []
    with torch.inference_mode():
        for a, b in chunk_bounds(start, ids.shape[1], cache.cfg):
            outs.append(model(ids[:, a:b], past_key_values=cache, use_cache=True).logits[0].float())
    return torch.cat(outs, dim=0)


def tokenize(tok: Any, text: str, n: int, source: str = "text") -> torch.Tensor:
    """The first `n` tokens of `text` as `[1, n]` (no special tokens added)."""
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    if ids.shape[1] < n:
        raise ValueError(f"{source} has {ids.shape[1]} tokens, fewer than the {n} needed")
    return ids[:, :n]


def _prefill(model: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
    from transformers import DynamicCache

    # No config: every layer keeps all its tokens (sliding layers too; the model's mask still applies
    # the window), so the prefix can be copied into any cache.
    cache = DynamicCache()
    out = model(ids, past_key_values=cache, use_cache=True)
    return cache, out.logits[:, -1:].float()


def _copy_prefix(exact: Any, cache: OscarCache) -> None:
    """Put the exact prefix KV into an OscarCache and seal its whole blocks."""
    cache.load_exact(exact)


def _score(model: Any, ids: torch.Tensor, prefix: int, cache: Any, cfg: OscarConfig | None,
           first_logits: torch.Tensor, tick: Callable[[int], None]) -> torch.Tensor:
    """Log-probs `[score, V]` (fp32) predicting tokens prefix..end-1."""
    outs = [torch.log_softmax(first_logits[0], dim=-1)]
    total = ids.shape[1]
    # The last input token's logit predicts nothing we score: feed tokens prefix..total-2.
    for a, b in chunk_bounds(prefix, total - 1, cfg):
        out = model(ids[:, a:b], past_key_values=cache, use_cache=True)
        outs.append(torch.log_softmax(out.logits[0].float(), dim=-1))
        tick(b - a)
    tick(1)
    return torch.cat(outs, dim=0)


def perplexity(
    model: Any,
    ids: torch.Tensor,
    prefix: int,
    configs: Iterable[OscarConfig],
    progress: bool = False,
) -> tuple[float, list[PplResult]]:
    """Baseline perplexity and one `PplResult` per config, on `ids[:, prefix:]`.

    Args:
        ids: `[1, prefix + score]` token ids.
        configs: quantization configs (methods x bits) to compare with full precision.
    """
    configs = list(configs)
    score = ids.shape[1] - prefix
    if prefix < 1 or score < 1:
        raise ValueError(f"need prefix >= 1 and score >= 1 tokens, got prefix={prefix}, score={score}")
    for cfg in configs:
        _, heads, head_dim = check_quality_model(cfg, model.config)
    targets = ids[0, prefix:]
    bar = _bar(score * (len(configs) + 1), progress)
    with torch.inference_mode():
        exact, first = _prefill(model, ids[:, :prefix])
        import copy

        base_lp = _score(model, ids, prefix, copy.deepcopy(exact), None, first, bar.update)
        base_nll = -base_lp.gather(1, targets[:, None]).mean().item()
        base_ppl = math.exp(base_nll)
        base_p = base_lp.exp()
        base_top1 = base_lp.argmax(dim=-1)
        results = []
        for cfg in configs:
            cache = OscarCache(model, cfg)
            _copy_prefix(exact, cache)
            lp = _score(model, ids, prefix, cache, cfg, first, bar.update)
            nll = -lp.gather(1, targets[:, None]).mean().item()
            ppl = math.exp(nll)
            kl = (base_p * (base_lp - lp)).sum(dim=-1).mean().item()
            top1 = (lp.argmax(dim=-1) == base_top1).float().mean().item()
            results.append(PplResult(
                method=cfg.method, bits=cfg.bits, ppl=ppl, delta_ppl_pct=100.0 * (ppl / base_ppl - 1.0),
                kl=kl, top1_agreement=top1, effective_bits=cache.effective_bits(ids.shape[1]),
                config=cfg.to_dict(),
            ))
    bar.close()
    return base_ppl, results


class _NoBar:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="tok", desc="scoring", dynamic_ncols=True)


# ------------------------------------------------------------------------------------------------
# Token-norm imbalance (docs/OSCAR.md §1)
# ------------------------------------------------------------------------------------------------


def collect_keys(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """Post-RoPE keys `[H, T, D]` fp32 of every layer for one sequence, as the cache receives them."""
    from transformers import DynamicCache

    cache: Any = DynamicCache()  # no config: sliding layers keep every token too
    with torch.inference_mode():
        model(ids, past_key_values=cache, use_cache=True)
    return [layer.keys[0].float() for layer in cache.layers]


def tni_stats(keys: torch.Tensor, group: int = 32, scope: str = "layer") -> dict[str, float]:
    """Max/min per-head token-norm ratio inside `group`-token groups, before and after token scaling.

    Args:
        keys: `[H, T, D]` post-RoPE keys of one layer (T is cut to a whole number of groups).
    Returns:
        mean and max over (head, group) of the ratio, before (`before_*`) and after (`after_*`)
        dividing each token by its omni-token scale s_t.
    """
    from .reference import token_scales

    h, t, d = keys.shape
    t = (t // group) * group
    if t == 0:
        raise ValueError(f"need at least {group} tokens for TNI statistics")
    k = keys[:, :t]
    s = token_scales(k, scope)  # [T, S]
    scaled = k / (s.transpose(0, 1)[:, :, None] if s.shape[1] > 1 else s[:, 0][None, :, None])

    def ratio(x: torch.Tensor) -> torch.Tensor:
        norms = x.norm(dim=-1).reshape(h, t // group, group).clamp_min(1e-12)
        return norms.amax(dim=-1) / norms.amin(dim=-1)

    before, after = ratio(k), ratio(scaled)
    return {
        "before_mean": before.mean().item(), "before_max": before.max().item(),
        "after_mean": after.mean().item(), "after_max": after.max().item(),
    }
