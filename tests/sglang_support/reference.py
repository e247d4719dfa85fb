"""What a CPU server with `--kv-cache oscar` must generate, computed in this process: the converted
weights through transformers with `OscarCache` under the server's sealing schedule."""

from __future__ import annotations


def oscar_reference_ids(model, tok, prompt: str, cfg, max_tokens: int) -> list[int]:
    """The greedy tokens of the transformers model with `OscarCache`: each prompt token attending to
    the sealed pages below its own page and its page exactly (`--oscar-prefill position`, fed in
    page-aligned chunks), then decoding with page-by-page seals. Whatever part of the prompt came
    from the radix cache makes no difference. The prompt is tokenized as SGLang's `/generate` does
    for ``text`` (no special tokens added)."""
    import torch

    from oscar_sgl import OscarCache
    from oscar_sgl.evaluate import position_logits

    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    cache = OscarCache(model, cfg)  # the server computes the same key-rotation plan from its own weights
    out = [int(position_logits(model, ids, cache)[-1].argmax())]
    with torch.inference_mode():  # greedy decoding, one token per step (each sees its own page exactly)
        while len(out) < max_tokens:
            logits = model(torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits
            out.append(int(logits[0, -1].argmax()))
    return out


def matching_prefix(got, want) -> int:
    """How many leading tokens of ``got`` equal ``want``'s."""
    return next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
