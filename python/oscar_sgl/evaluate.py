"""Quality evaluation with the protocol of docs/OSCAR.md §6.

Perplexity: prefill `prefix_tokens` exactly, seal every whole block (flush), then score the next
`score_tokens` in chunks whose boundaries sit on flush points. Inside a chunk the causal mask gives
each position exactly what token-by-token decoding would give it (earlier blocks quantized, the
current block in full precision), which `tests/test_eval.py` checks against true token-by-token
decoding. Quantization therefore acts on attention at every scored position.

The exact prefix KV is computed once and copied into each method's cache (prefill attention is
exact in every method, so this changes nothing but the run time).

What is scored: the text's body (`gutenberg_body`: no Project Gutenberg header or footer), tokenized
as the model expects (`bos_choice`: BOS first when the tokenizer puts it there), in several windows
(`window_starts`), with means and Student t intervals over the windows and paired differences
between methods on the same windows (`window_report`): one window's ΔPPL swings by tens of percent
with where it starts, so single-window figures cannot rank methods.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

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
    bar = progress_bar((ids.shape[1] - prefix) * (len(configs) + 1), progress)
    try:
        return _perplexity(model, ids, prefix, configs, bar.update)
    finally:
        bar.close()


def _perplexity(model: Any, ids: torch.Tensor, prefix: int, configs: list[OscarConfig],
                tick: Callable[[int], None]) -> tuple[float, list[PplResult]]:
    score = ids.shape[1] - prefix
    if prefix < 1 or score < 1:
        raise ValueError(f"need prefix >= 1 and score >= 1 tokens, got prefix={prefix}, score={score}")
    for cfg in configs:
        _, heads, head_dim = check_quality_model(cfg, model.config)
    targets = ids[0, prefix:]
    with torch.inference_mode():
        exact, first = _prefill(model, ids[:, :prefix])
        base_lp = _score(model, ids, prefix, copy.deepcopy(exact), None, first, tick)
        base_nll = -base_lp.gather(1, targets[:, None]).mean().item()
        base_ppl = math.exp(base_nll)
        base_p = base_lp.exp()
        base_top1 = base_lp.argmax(dim=-1)
        results = []
        for cfg in configs:
            cache = OscarCache(model, cfg)
            _copy_prefix(exact, cache)
            lp = _score(model, ids, prefix, cache, cfg, first, tick)
            nll = -lp.gather(1, targets[:, None]).mean().item()
            ppl = math.exp(nll)
            kl = (base_p * (base_lp - lp)).sum(dim=-1).mean().item()
            top1 = (lp.argmax(dim=-1) == base_top1).float().mean().item()
            results.append(PplResult(
                method=cfg.label, bits=cfg.bits, ppl=ppl, delta_ppl_pct=100.0 * (ppl / base_ppl - 1.0),
                kl=kl, top1_agreement=top1, effective_bits=cache.effective_bits(ids.shape[1]),
                config=cfg.to_dict(),
            ))
    return base_ppl, results


class _NoBar:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def progress_bar(total: int, enabled: bool, unit: str = "tok", desc: str = "scoring") -> Any:
    """A tqdm progress bar of ``total`` steps (``unit``, labelled ``desc``), or one that shows nothing
    when disabled or tqdm is not installed."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True)


# ------------------------------------------------------------------------------------------------
# What is evaluated: the body of the text, tokenized as the model expects, in several windows
# ------------------------------------------------------------------------------------------------

# Project Gutenberg's delimiter lines ("*** START OF THE PROJECT GUTENBERG EBOOK EMMA ***"; older files
# say "THIS" and "EBOOK" or "E-BOOK"). The header (title page, licence notice) and the footer (the
# licence) are not the book: the first 1024 tokens of an unstripped file can be licence text alone.
_PG_START = re.compile(r"^[ \t]*\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK\b[^\n]*$", re.I | re.M)
_PG_END = re.compile(r"^[ \t]*\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK\b[^\n]*$", re.I | re.M)
# Older files close the book with this line just above the END delimiter.
_PG_END_LINE = re.compile(r"^[ \t]*End of (?:the )?Project Gutenberg'?s? [^\n]*$", re.I | re.M)


@dataclass(frozen=True)
class TextBody:
    """The part of a text that is evaluated: `text[start:end]` of the file's `chars` characters."""

    text: str
    start: int
    end: int
    chars: int
    gutenberg_header: bool
    gutenberg_footer: bool

    def describe(self) -> str:
        if not (self.gutenberg_header or self.gutenberg_footer):
            return "no Project Gutenberg header or footer: the whole text is evaluated"
        parts = [p for p, on in (("header", self.gutenberg_header), ("footer", self.gutenberg_footer)) if on]
        return (f"Project Gutenberg {' and '.join(parts)} stripped: evaluating characters {self.start}..{self.end} "
                f"of {self.chars}")

    def to_dict(self) -> dict[str, Any]:
        return {"header": self.gutenberg_header, "footer": self.gutenberg_footer,
                "body_chars": [self.start, self.end], "text_chars": self.chars}


def gutenberg_body(text: str) -> TextBody:
    """`text` without its Project Gutenberg header (up to and including the START delimiter line)
    and footer (from the END delimiter line, or the "End of the Project Gutenberg EBook" line above
    it, on); the whole text when it has neither.

    Raises:
        ValueError: the delimiters leave nothing but whitespace between them.
    """
    start, end = 0, len(text)
    head = _PG_START.search(text)
    if head:
        start = head.end()
        start += 2 if text.startswith("\r\n", start) else int(text.startswith("\n", start))  # its line end
    foot = _PG_END.search(text, start)
    if foot:
        end = foot.start()
        line = None
        for line in _PG_END_LINE.finditer(text, start, end):
            pass
        if line is not None and not text[line.end() : end].strip():
            end = line.start()
    body = TextBody(text[start:end], start, end, len(text), head is not None, foot is not None)
    if (head or foot) and not body.text.strip():
        raise ValueError(f"has nothing between its Project Gutenberg header and footer ({body.describe()})")
    return body


@dataclass(frozen=True)
class BosChoice:
    """Whether each window starts with the BOS token, as the tokenizer would put it there."""

    token_id: int | None  # the id prepended, or None
    token: str | None
    reason: str

    @property
    def prepended(self) -> bool:
        return self.token_id is not None

    def describe(self) -> str:
        if self.prepended:
            return f"BOS {self.token!r} (id {self.token_id}) prepended to every window: {self.reason}"
        return f"no BOS prepended: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"prepended": self.prepended, "token": self.token, "token_id": self.token_id, "reason": self.reason}


def bos_choice(tok: Any) -> BosChoice:
    """Prepend BOS exactly when the tokenizer's own special-token handling does (what
    `tok(text)` gives a model: Llama-3 and gemma-3 tokenizers prepend it, SmolLM2's does not)."""
    probe = "It was a bright cold day in April."
    with_special = tok(probe, add_special_tokens=True).input_ids
    plain = tok(probe, add_special_tokens=False).input_ids
    bos = tok.bos_token_id
    if bos is None:
        return BosChoice(None, None, "the tokenizer has no BOS token")
    name = tok.convert_ids_to_tokens(bos)
    if with_special[:1] == [bos] and plain[:1] != [bos]:
        return BosChoice(bos, name, "the tokenizer prepends it (add_special_tokens=True)")
    return BosChoice(None, None, f"the tokenizer does not prepend its BOS {name!r} (id {bos}) with add_special_tokens=True")


def window_starts(body_tokens: int, window: int, count: int) -> list[int]:
    """`count` non-overlapping windows of `window` tokens spread evenly over `body_tokens` tokens:
    the first starts at 0, the last ends at the end, equal gaps between (token offsets).

    Raises:
        ValueError: fewer than `count * window` tokens.
    """
    if count < 1 or window < 1:
        raise ValueError(f"need count >= 1 and window >= 1, got {count} and {window}")
    if count * window > body_tokens:
        raise ValueError(f"{count} non-overlapping windows of {window} tokens need {count * window} tokens, "
                         f"the text has {body_tokens} (room for {body_tokens // window})")
    if count == 1:
        return [0]
    room = body_tokens - window
    # Floors of i * room / (count - 1): consecutive starts differ by at least `window` (room >= (count - 1) * window).
    return [i * room // (count - 1) for i in range(count)]


def window_ids(body_ids: torch.Tensor, start: int, length: int, bos: BosChoice) -> torch.Tensor:
    """`[1, length]` model input: BOS (when chosen) then the body's tokens from `start` on.

    BOS counts as one of the `length` positions (as the first prefix token), so every window's pages
    seal at the same positions with or without it."""
    text = length - int(bos.prepended)
    ids = body_ids[:, start : start + text]
    if ids.shape[1] < text:
        raise ValueError(f"the window at token {start} needs {text} text tokens, only {ids.shape[1]} remain")
    if bos.prepended:
        ids = torch.cat([torch.tensor([[bos.token_id]], dtype=ids.dtype), ids], dim=1)
    return ids


# ------------------------------------------------------------------------------------------------
# Means and 95 % intervals over windows
# ------------------------------------------------------------------------------------------------

INTERVAL_METHOD = "two-sided Student t interval over windows: mean ± t(0.975, n-1) · s / √n, s the sample standard deviation"


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: int) -> float:
    """The `p` quantile (0.5 < p < 1) of Student's t with `df` >= 1 degrees of freedom (bisection
    on the CDF to 1e-12; scipy is not a dependency)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def mean_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, tuple[float, float] | None]:
    """Mean of `xs` and its two-sided Student t interval; None when there is one value (no interval
    exists without an estimate of the spread)."""
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    mean = sum(xs) / n
    if n == 1:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = student_t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def _stat(xs: Sequence[float]) -> dict[str, Any]:
    mean, ci = mean_ci(xs)
    return {"mean": mean, "ci95": None if ci is None else list(ci)}


# ------------------------------------------------------------------------------------------------
# Several windows, one model
# ------------------------------------------------------------------------------------------------

METRICS = ("ppl", "delta_ppl_pct", "kl", "top1_agreement")


def perplexity_windows(
    model: Any,
    windows: Sequence[torch.Tensor],
    prefix: int,
    configs: Iterable[OscarConfig],
    progress: bool = False,
) -> tuple[list[float], list[list[PplResult]]]:
    """`perplexity` on each window (`[1, prefix + score]` ids each) with one model and one progress
    bar: (full-precision PPL per window, per window one `PplResult` per config)."""
    configs = list(configs)
    total = sum(w.shape[1] - prefix for w in windows) * (len(configs) + 1)
    bar = progress_bar(total, progress)
    bases, results = [], []
    for ids in windows:
        base, res = _perplexity(model, ids, prefix, configs, bar.update)
        bases.append(base)
        results.append(res)
    bar.close()
    return bases, results


def window_report(starts: Sequence[int], bases: Sequence[float], per_window: Sequence[Sequence[PplResult]],
                  baseline_bits: float) -> dict[str, Any]:
    """The JSON-ready summary of `perplexity_windows`: full precision and every config as means with
    95 % intervals over the windows plus per-window figures, and every pair of configs compared on
    the same windows (paired differences: the mean and interval of per-window A - B)."""
    n = len(starts)
    if not n or len(bases) != n or len(per_window) != n:
        raise ValueError(f"need one baseline and one result list per window, got {n}, {len(bases)}, {len(per_window)}")
    b = _stat(bases)
    report: dict[str, Any] = {
        "interval": {"method": INTERVAL_METHOD, "confidence": 0.95, "windows": n,
                     "t": student_t_quantile(0.975, n - 1) if n > 1 else None},
        "baseline": {"effective_bits": baseline_bits, "ppl": b["mean"], "ppl_ci95": b["ci95"],
                     "per_window": [{"start": s, "ppl": p} for s, p in zip(starts, bases)]},
        "baseline_ppl": b["mean"],
        "results": [],
        "paired": [],
    }
    rows = list(zip(*per_window))  # per config: its result on every window
    for col in rows:
        r0 = col[0]
        row: dict[str, Any] = {"method": r0.method, "bits": r0.bits, "effective_bits": r0.effective_bits}
        for m in METRICS:
            s = _stat([getattr(r, m) for r in col])
            row[m], row[f"{m}_ci95"] = s["mean"], s["ci95"]
        row |= {k: r0.config[k] for k in ("k_group", "v_group", "page_size", "norm_scope", "key_rotation", "key_rotation_min_alignment",
                                          "sliding_layers", "offset", "clip", "key_ranges")
                if k in r0.config}
        row["per_window"] = [{"start": s} | {m: getattr(r, m) for m in METRICS} for s, r in zip(starts, col)]
        report["results"].append(row)
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a, c = rows[i], rows[j]
            dppl = [x.delta_ppl_pct - y.delta_ppl_pct for x, y in zip(a, c)]
            dkl = [x.kl - y.kl for x, y in zip(a, c)]
            sp, sk = _stat(dppl), _stat(dkl)
            lower = None
            if sp["ci95"] is not None:
                lower = "a" if sp["ci95"][1] < 0 else "b" if sp["ci95"][0] > 0 else None
            report["paired"].append({
                "a": {"method": a[0].method, "bits": a[0].bits, "effective_bits": a[0].effective_bits},
                "b": {"method": c[0].method, "bits": c[0].bits, "effective_bits": c[0].effective_bits},
                "delta_ppl_pct_diff": sp["mean"], "delta_ppl_pct_diff_ci95": sp["ci95"],
                "kl_diff": sk["mean"], "kl_diff_ci95": sk["ci95"],
                # Which side has the lower ΔPPL with 95 % confidence (its interval excludes 0); None: not resolved.
                "lower_delta_ppl": lower,
                "per_window": [{"start": s, "delta_ppl_pct_diff": p, "kl_diff": k} for s, p, k in zip(starts, dppl, dkl)],
            })
    return report


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
