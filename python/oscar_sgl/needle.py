"""Passkey retrieval ("needle in a haystack") through a quantized KV cache: `oscar-sgl eval needle`.

A random 5-digit passkey (seeded) is hidden at a chosen depth in filler text, followed by a question;
the model generates a few tokens greedily and a trial counts as retrieved when the first run of digits
it writes is exactly the passkey.

The prompt is the classic passkey prompt of Mohtashami & Jaggi (2023, "Landmark Attention"): an
instruction, the sentence ``The grass is green. The sky is blue. The sun is yellow. Here we go. There
and back again.`` repeated, the needle ``The pass key is 12345. Remember it. 12345 is the pass key.``
(here as a paragraph of its own) and ``What is the pass key? The pass key is``. With ``haystack="text"`` the filler is a real text
instead (the package's embedded *Emma* opening or any UTF-8 file), cut at a seeded offset.

Lengths are whole contexts: prompt tokens plus the generated tokens, so a length equal to the
model's context (8192 for SmolLM2) fits exactly. The prompt is assembled from token ids (the
instruction, the haystack cut to size, the needle, the question), so its length is exact; the needle
starts after the sentence end of the haystack nearest to the requested depth.

Two ways a quantized cache meets the prompt (`prefill`):

- ``context`` (the default): the context (instruction, haystack, needle) is prefilled exactly, once,
  and its whole pages are sealed; the question and the answer then read them as codes. This is close
  to a document already in the server's radix cache followed by a question (``--oscar-prefill
  exact``, warm; there the context's last, partial page is recomputed over the codes, here it keeps
  its exact prefill), and the protocol of KIVI-style evaluations (full-precision prefill, generation
  from the quantized cache). One exact prefill serves every method.
- ``position``: every prompt token reads the pages below its own page as codes
  (``--oscar-prefill position``, the server's default, whatever the radix cache held); costs one
  chunked prefill per method.

Quantized caches are `OscarCache` (packed codes, docs/LAYOUT.md) with one evaluation speed-up: the
dequantized sealed pages are kept between steps (`_KeptRestoreCache`), which gives the same values
(a sealed page never changes) without dequantizing the whole history at every step.
"""

from __future__ import annotations

import copy
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

#: Mohtashami & Jaggi (2023), the passkey prompt also used by LongLoRA, YaRN and KIVI's evaluation.
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: The original needle, set as its own paragraph: inline (one space either side) SmolLM2-135M found it
#: in 1 of 3 prompts at 2K tokens, as a paragraph in 3 of 3 at 2K and 4K (benches/results/needle.md).
NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"
#: Passkeys are drawn uniformly from these (5 digits).
KEY_RANGE = (10000, 99999)
#: Fewest haystack tokens a prompt may have (below this "depth" means little).
MIN_HAYSTACK = 32
#: How far (tokens) the needle may move from the requested depth to sit after a sentence end.
SNAP_WINDOW = 16
PREFILL_MODES = ("context", "position")
HAYSTACKS = ("filler", "text")
FULL = "full"


class NeedleError(ValueError):
    """A needle run that cannot be built (prompt too long for the model, haystack too short, ...)."""


@dataclass(frozen=True)
class NeedlePrompt:
    """One trial's prompt.

    Attributes:
        ids: prompt token ids; ``len(ids) + new_tokens == length``.
        question_start: index in `ids` where the question begins (the context is ``ids[:question_start]``).
        needle_start: index in `ids` of the needle's first token; ``needle_len`` tokens long.
        depth: requested depth in the haystack (0 = its start, 1 = its end).
        actual_depth: where the needle is: haystack tokens before it / haystack tokens.
    """

    length: int
    depth: float
    trial: int
    passkey: str
    ids: list[int]
    question_start: int
    needle_start: int
    needle_len: int
    haystack_tokens: int
    actual_depth: float
    haystack_offset: int


def passkey_for(seed: int, length: int, depth: float, trial: int) -> str:
    """The passkey of one trial: a seeded draw, the same for every method and on every machine."""
    return str(random.Random(f"needle:{seed}:{length}:{depth!r}:{trial}").randint(*KEY_RANGE))


def score(text: str, passkey: str) -> bool:
    """True when the first run of digits in `text` is exactly `passkey` (``" 12345."`` scores,
    ``" 1234"`` and ``" 123456"`` do not)."""
    m = re.search(r"\d+", text)
    return m is not None and m.group() == passkey


def _is_sentence_end(piece: str) -> bool:
    return piece.rstrip(" ").endswith((".", "!", "?", "\n", '"'))


class NeedleTask:
    """Builds passkey prompts of exact token lengths for one tokenizer.

    Args:
        tokenizer: a Hugging Face tokenizer.
        haystack: "filler" (the repeated sentence) or "text" (`text`, cut at a seeded offset).
        text: the haystack text when ``haystack == "text"``.
        bos: prepend the tokenizer's BOS token (what ``add_special_tokens=True`` would do).
    """

    def __init__(self, tokenizer: Any, haystack: str = "filler", text: str | None = None, bos: bool | None = None) -> None:
        if haystack not in HAYSTACKS:
            raise NeedleError(f"haystack must be one of {', '.join(HAYSTACKS)}, got {haystack!r}")
        if haystack == "text" and not text:
            raise NeedleError("haystack 'text' needs a text")
        self.tok = tokenizer
        self.haystack = haystack

        def enc(s: str) -> list[int]:
            return list(tokenizer(s, add_special_tokens=False).input_ids)

        self._enc = enc
        with_special = list(tokenizer("a", add_special_tokens=True).input_ids)
        plain = enc("a")
        adds_bos = tokenizer.bos_token_id is not None and with_special[:1] == [tokenizer.bos_token_id] and plain[:1] != with_special[:1]
        self.bos = adds_bos if bos is None else bos
        self.intro = ([tokenizer.bos_token_id] if self.bos else []) + enc(INTRO)
        self.question = enc(QUESTION)
        self._hay = enc(text) if haystack == "text" and text else []
        self.answer_tokens = len(enc(f" {KEY_RANGE[1]}"))

    def needle_ids(self, passkey: str) -> list[int]:
        return self._enc(NEEDLE.format(key=passkey))

    def fixed_tokens(self) -> int:
        """Prompt tokens that are not haystack (instruction, needle, question)."""
        return len(self.intro) + len(self.needle_ids("1" * len(str(KEY_RANGE[1])))) + len(self.question)

    def min_length(self, new_tokens: int) -> int:
        """The shortest length a prompt can have: fixed tokens, `MIN_HAYSTACK` and the generated tokens."""
        return self.fixed_tokens() + MIN_HAYSTACK + new_tokens

    def available_haystack(self) -> int | None:
        """Haystack tokens the text holds (None: the filler repeats without end)."""
        return None if self.haystack == "filler" else len(self._hay)

    def _haystack(self, n: int, offset: int) -> list[int]:
        if self.haystack == "filler":
            if len(self._hay) < n:  # the filler repeated, tokenized whole: each copy is more than 8 tokens
                self._hay = self._enc(" ".join([FILLER] * (n // 8 + 16)))
        return self._hay[offset:offset + n]

    def _piece_ends(self, ids: Sequence[int]) -> list[bool]:
        return [_is_sentence_end(self.tok.decode([t])) for t in ids]

    def build(self, length: int, depth: float, trial: int, new_tokens: int, seed: int = 0) -> NeedlePrompt:
        """The prompt of one trial: `length` - `new_tokens` token ids.

        Raises:
            NeedleError: `length` leaves fewer than `MIN_HAYSTACK` haystack tokens, the text is too short,
                or `depth` is outside [0, 1].
        """
        if not 0.0 <= depth <= 1.0:
            raise NeedleError(f"depth must be between 0 and 1, got {depth}")
        passkey = passkey_for(seed, length, depth, trial)
        needle = self.needle_ids(passkey)
        n_hay = length - new_tokens - len(self.intro) - len(needle) - len(self.question)
        if n_hay < MIN_HAYSTACK:
            raise NeedleError(f"length {length} leaves {n_hay} haystack tokens, fewer than {MIN_HAYSTACK}: "
                              f"the instruction, needle and question take {length - new_tokens - n_hay} tokens and "
                              f"the answer {new_tokens}; the shortest length is {self.min_length(new_tokens)}")
        offset = 0
        if self.haystack == "text":
            room = len(self._hay) - n_hay
            if room < 0:
                raise NeedleError(f"length {length} needs {n_hay} haystack tokens, the text has {len(self._hay)}")
            offset = random.Random(f"needle-offset:{seed}:{length}:{depth!r}:{trial}").randint(0, room)
        hay = self._haystack(n_hay, offset)
        want = round(depth * n_hay)
        ends = self._piece_ends(hay[max(0, want - SNAP_WINDOW - 1): want + SNAP_WINDOW])
        base = max(0, want - SNAP_WINDOW - 1)
        # Cut positions c where hay[c - 1] ends a sentence (c = 0 and c = n_hay are always fine).
        cuts = [base + i + 1 for i, e in enumerate(ends) if e] + [c for c in (0, n_hay) if abs(c - want) <= SNAP_WINDOW]
        cut = min(cuts, key=lambda c: (abs(c - want), c)) if cuts else want
        ids = self.intro + hay[:cut] + needle + hay[cut:] + self.question
        assert len(ids) + new_tokens == length
        return NeedlePrompt(
            length=length, depth=depth, trial=trial, passkey=passkey, ids=ids,
            question_start=len(ids) - len(self.question), needle_start=len(self.intro) + cut,
            needle_len=len(needle), haystack_tokens=n_hay, actual_depth=cut / n_hay, haystack_offset=offset,
        )


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------


def _kept_restore_cache(model: Any, cfg: Any) -> Any:
    """An `OscarCache` (of `model`: its weights choose the key rotation per head) whose layers keep
    their dequantized sealed pages between steps."""
    from . import reference as ref
    from .hf_cache import OscarCache, OscarLayer

    class _KeptRestoreLayer(OscarLayer):
        """`OscarLayer` that dequantizes each sealed page once: sealed pages never change, so the
        history attention sees is the same as `OscarLayer._history`'s, at the cost of keeping it."""

        def _history(self) -> Any:
            import torch

            assert self.k_tail is not None and self.v_tail is not None
            # Per batch row: [pages restored, their keys [H, T, D] or None, their values or None].
            kept = self.__dict__.setdefault("_kept", [])
            while len(kept) < len(self.k_blocks):
                kept.append([0, None, None])
            keys, values = [], []
            for b, row in enumerate(kept):
                new = len(self.k_blocks[b]) - row[0]
                if new:
                    ks = [ref.restore_k(blk, self.cfg, self.head_dim).to(self.dtype) for blk in self.k_blocks[b][row[0]:]]
                    vs = [ref.restore_v(blk, self.cfg, self.head_dim).to(self.dtype) for blk in self.v_blocks[b][row[0]:]]
                    row[1] = torch.cat([t for t in (row[1], *ks) if t is not None], dim=1)
                    row[2] = torch.cat([t for t in (row[2], *vs) if t is not None], dim=1)
                    row[0] += new
                keys.append(self.k_tail[b] if row[1] is None else torch.cat([row[1], self.k_tail[b]], dim=1))
                values.append(self.v_tail[b] if row[2] is None else torch.cat([row[2], self.v_tail[b]], dim=1))
            return torch.stack(keys), torch.stack(values)

        def reset(self) -> None:
            self.__dict__.pop("_kept", None)
            super().reset()

    cache = OscarCache(model, cfg)
    kept = {id(layer): _KeptRestoreLayer(cfg, layer.num_kv_heads, layer.head_dim, key_rotated=layer.key_rotated,
                                         sliding_window=layer.sliding_window) for layer in cache.oscar_layers}
    cache.oscar_layers = [kept[id(layer)] for layer in cache.oscar_layers]
    cache.layers = [kept.get(id(layer), layer) for layer in cache.layers]
    return cache


def _greedy(model: Any, first_logits: Any, cache: Any, new_tokens: int) -> list[int]:
    """`new_tokens` greedy tokens: the first from `first_logits` `[V]`, the rest decoded one by one
    through `cache` (end-of-sequence is not special: every method writes the same number)."""
    import torch

    out = [int(first_logits.argmax())]
    with torch.inference_mode():
        while len(out) < new_tokens:
            logits = model(torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits
            out.append(int(logits[0, -1].argmax()))
    return out


def _exact_prefill(model: Any, ids: list[int]) -> Any:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def _feed(model: Any, ids: list[int], cache: Any) -> Any:
    """Feed `ids` as one chunk through `cache`; the last position's logits `[V]`."""
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1].float()


def generate_full(model: Any, prompt: NeedlePrompt, new_tokens: int, context_cache: Any = None) -> list[int]:
    """Greedy tokens with the full-precision cache (the context's exact prefill may be given)."""
    cache = copy.deepcopy(context_cache) if context_cache is not None else _exact_prefill(model, prompt.ids[:prompt.question_start])
    return _greedy(model, _feed(model, prompt.ids[prompt.question_start:], cache), cache, new_tokens)


def generate_quantized(model: Any, prompt: NeedlePrompt, cfg: Any, new_tokens: int, prefill: str,
                       context_cache: Any = None) -> list[int]:
    """Greedy tokens through an `OscarCache` of `cfg`.

    ``prefill="context"``: the exact prefill of the context (`context_cache`, computed if None) is
    copied in and its whole pages sealed; the question is one chunk over those codes.
    ``prefill="position"``: the whole prompt in page-aligned chunks (`evaluate.position_logits`).
    """
    import torch

    from .evaluate import position_logits

    cache = _kept_restore_cache(model, cfg)
    if prefill == "position":
        first = position_logits(model, torch.tensor([prompt.ids]), cache)[-1]
    elif prefill == "context":
        exact = context_cache if context_cache is not None else _exact_prefill(model, prompt.ids[:prompt.question_start])
        for src, dst in zip(exact.layers, cache.oscar_layers):
            dst.update(src.keys, src.values)
        cache.flush()
        first = _feed(model, prompt.ids[prompt.question_start:], cache)
    else:
        raise NeedleError(f"prefill must be one of {', '.join(PREFILL_MODES)}, got {prefill!r}")
    return _greedy(model, first, cache, new_tokens)


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------


@dataclass
class Method:
    """One column of the results: full precision or a quantized config (`cfg`), with its stored bits
    per K/V element."""

    name: str
    bits: int | None
    effective_bits: float
    cfg: Any = None

    @property
    def label(self) -> str:
        return self.name if self.bits is None else f"INT{self.bits} {self.name}"


@dataclass
class Trial:
    length: int
    depth: float
    trial: int
    passkey: str
    actual_depth: float
    outputs: dict[str, str] = field(default_factory=dict)
    correct: dict[str, bool] = field(default_factory=dict)


def methods_for(configs: Iterable[Any], model: Any) -> list[Method]:
    """Full precision (the bits of the KV the model writes: its parameters' dtype) and one `Method`
    per quantized config."""
    from .supported import check_quality_model

    dtype = next(model.parameters()).dtype
    model_config = model.config
    full = Method(FULL, None, 8.0 * dtype.itemsize)
    out = [full]
    for cfg in configs:
        _, heads, head_dim = check_quality_model(cfg, model_config)
        # cfg.label: the method, plus the seal-time / key-range options that differ from the defaults
        out.append(Method(cfg.label, cfg.bits, cfg.effective_bits(heads, head_dim), cfg))
    return out


def accuracy_table(trials: Sequence[Trial], methods: Sequence[Method]) -> list[dict[str, Any]]:
    """One row per (length, method): retrieved / trials, with effective bits."""
    rows = []
    for length in sorted({t.length for t in trials}):
        ts = [t for t in trials if t.length == length]
        for m in methods:
            hits = sum(t.correct[m.label] for t in ts)
            rows.append({"length": length, "method": m.name, "bits": m.bits, "label": m.label,
                         "effective_bits": m.effective_bits, "retrieved": hits, "trials": len(ts),
                         "accuracy": hits / len(ts)})
    return rows


def run(model: Any, task: NeedleTask, prompts: Sequence[NeedlePrompt], methods: Sequence[Method], new_tokens: int,
        prefill: str = "context", tick: Callable[[int], None] | None = None) -> list[Trial]:
    """Generate every prompt with every method and score it. `tick(1)` after each generation."""
    tick = tick or (lambda n: None)
    trials = []
    for p in prompts:
        t = Trial(p.length, p.depth, p.trial, p.passkey, p.actual_depth)
        context = _exact_prefill(model, p.ids[:p.question_start])
        for m in methods:
            if m.cfg is None:
                ids = generate_full(model, p, new_tokens, context)
            else:
                ids = generate_quantized(model, p, m.cfg, new_tokens, prefill, context if prefill == "context" else None)
            text = task.tok.decode(ids)
            t.outputs[m.label], t.correct[m.label] = text, score(text, p.passkey)
            tick(1)
        trials.append(t)
    return trials


def server_generate(url: str, prompt: NeedlePrompt, new_tokens: int, timeout: float = 1800) -> list[int]:
    """Greedy tokens from a running SGLang server (`/generate` with the prompt's token ids; EOS ignored,
    so the server writes `new_tokens` tokens like the local path)."""
    body = _post(url, "/generate", {"input_ids": prompt.ids,
                                    "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                        "ignore_eos": True}}, timeout)
    ids = body.get("output_ids")
    if ids is None:
        raise NeedleError(f"{url}/generate returned no output_ids: {str(body)[:200]}")
    return list(ids)


def _post(url: str, path: str, payload: dict[str, Any], timeout: float) -> Any:
    import json
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def _get(url: str, path: str, timeout: float = 60) -> Any:
    import json
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as r:
        return json.loads(r.read().decode())


def server_method(url: str) -> tuple[Method, dict[str, Any]]:
    """What a running server's KV cache is (`/server_info`): OScaR (bits, method, effective bits) or
    SGLang's own cache (bits of its KV dtype), and the server's context length."""
    info = _get(url, "/server_info")
    state = (info.get("internal_states") or [{}])[0]
    oscar = state.get("oscar")
    context = info.get("context_length")
    if oscar:
        c = oscar["config"]
        from .config import OscarConfig

        cfg = OscarConfig(**c)
        name = f"server {cfg.method}"
        return Method(name, cfg.bits, float(oscar["effective_bits"]), None), {"context_length": context,
                                                                               "oscar": {k: oscar[k] for k in ("config", "effective_bits", "page_size", "prefill")}}
    dtype = info.get("kv_cache_dtype") or "auto"
    model_dtype = info.get("dtype") or "auto"
    kv = model_dtype if dtype == "auto" else dtype
    bits = {"float32": 32.0, "bfloat16": 16.0, "float16": 16.0, "half": 16.0, "fp8_e4m3": 8.0, "fp8_e5m2": 8.0}.get(str(kv), math.nan)
    return Method(f"server default ({kv})", None, bits, None), {"context_length": context, "kv_dtype": kv}


def run_server(url: str, task: NeedleTask, prompts: Sequence[NeedlePrompt], new_tokens: int,
               tick: Callable[[int], None] | None = None) -> tuple[Method, dict[str, Any], list[Trial]]:
    """Every prompt through the server at `url`, scored like `run`."""
    tick = tick or (lambda n: None)
    method, info = server_method(url)
    trials = []
    for p in prompts:
        text = task.tok.decode(server_generate(url, p, new_tokens))
        t = Trial(p.length, p.depth, p.trial, p.passkey, p.actual_depth)
        t.outputs[method.label], t.correct[method.label] = text, score(text, p.passkey)
        trials.append(t)
        tick(1)
    return method, info, trials


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def format_table(report: dict[str, Any]) -> str:
    """Accuracy per (length, method), each method with its effective bits."""
    labels = [m["label"] for m in report["methods"]]
    bits = {m["label"]: m["effective_bits"] for m in report["methods"]}
    lengths = sorted({r["length"] for r in report["accuracy"]})
    acc = {(r["length"], r["label"]): r for r in report["accuracy"]}
    width = max(14, *(len(lb) + 2 for lb in labels))
    lines = [
        f"model: {report['model']}",
        f"haystack: {report['haystack']}  prefill: {report['prefill']}  depths: {' '.join(f'{d:g}' for d in report['depths'])}"
        f"  trials per depth: {report['trials']}  seed: {report['seed']}  BOS: {'yes' if report['bos'] else 'no'}",
        "passkey retrieval accuracy (retrieved/trials) by context length:",
        "",
        f"{'method':<{width}} {'eff.bits':>8} " + " ".join(f"{n:>11}" for n in lengths),
    ]
    for lb in labels:
        cells = []
        for n in lengths:
            r = acc.get((n, lb))
            cells.append(f"{'-':>11}" if r is None else f"{r['accuracy']:>5.0%} {r['retrieved']:>2}/{r['trials']:<2}")
        lines.append(f"{lb:<{width}} {bits[lb]:>8.3f} " + " ".join(cells))
    return "\n".join(lines)


def plot(report: dict[str, Any], png: Any, title: str | None = None) -> None:
    """Accuracy vs context length, one line per method (labelled with its effective bits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = "osD^vP*X"
    n = len(report["methods"])
    for i, m in enumerate(report["methods"]):
        rows = sorted((r for r in report["accuracy"] if r["label"] == m["label"]), key=lambda r: r["length"])
        if not rows:
            continue
        # Equal accuracies would hide each other: each method's line is shifted by up to +-1.5 points.
        shift = 0.0 if n == 1 else 3.0 * (i / (n - 1) - 0.5)
        ax.plot([r["length"] for r in rows], [100 * r["accuracy"] + shift for r in rows], marker=markers[i % len(markers)],
                linestyle="--" if "server" in m["label"] else "-",
                label=f"{m['label']} ({m['effective_bits']:.2f} bits)")
    ax.set_xscale("log", base=2)
    lengths = sorted({r["length"] for r in report["accuracy"]})
    ax.set_xticks(lengths)
    ax.set_xticklabels([f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
    ax.set_ylim(-5, 105)
    ax.set_xlabel("context length (tokens, prompt + answer)")
    ax.set_ylabel("passkey retrieved (%; lines shifted ±1.5 to stay visible)")
    ax.set_title(title or f"passkey retrieval, {report['model_short']} ({report['haystack']} haystack, {report['prefill']} prefill)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
