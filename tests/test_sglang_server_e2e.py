"""The real thing: `python -m sglang.launch_server ... --device cpu --kv-cache oscar` serving the
converted SmolLM2, driven through the OpenAI-compatible API (multi-turn, shared prefixes, two
concurrent clients); the same probes through the same weights without quantization give the
baseline. (Until session 40 that baseline was a second server, `--attention-backend torch_native`:
~50 s more of CI for what transformers computes in a few seconds; README's `--kv-cache default`
command is served in tests/test_readme_serving.py.)

Measures (stated):
1. Server vs the reference: the same converted weights run through transformers with `OscarCache`
   under the server's sealing schedule (each token over the sealed pages below its own page and its
   page exact, whatever part of the prompt the radix cache held, then page-by-page seals) must give
   the same greedy tokens: the first 8 of 16 on every probe, all 16 on at least 3 of 4 (fp32
   kernels differ, a near-tie may flip late; measured: all 16 on all 4).
2. Server with `--kv-cache oscar` vs the unquantized model (transformers, fp32 K/V in its own
   cache, greedy): for each of 4 greedy probes, the common token prefix of the two 16-token
   completions as a fraction of 16. At INT2 with 32-token pages (a 32-token BF16
   window) on a 135M model this is low by nature (measured [0.5, 0.5, 0.0, 0.0625] with exact
   prefill, [0.5, 0.0, 0.0, 0.0625] with the default position prefill, where the probe's own tokens
   read the system prompt's pages as codes as decode does; "What is 2 + 2?" answers off-topic in the
   reference too; against the unquantized model in transformers, session 40: [0.5, 0.0, 0.125,
   0.1875]); we require the first token to agree on >= 2 of 4 probes and a mean >= 0.125. The
   quality numbers live in benches/results (quality.md, determinism.md), not here.
Runs from a neutral working directory; every server is stopped by its PID.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("sglang")

from sglang_support.harness import common_prefix, converted_model, launch  # noqa: E402
from sglang_support.reference import oscar_reference_ids  # noqa: E402

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a concise assistant for a travel agency. Answer in one short sentence. "
    "You know the capitals, rivers and mountains of every European country, the main train routes, "
    "typical travel times, and the best seasons to visit. Never invent facts; say 'I do not know' instead."
)
QUESTIONS = [
    ["What is the capital of France?", "Which river flows through it?", "Name one famous museum there."],
    ["What is the capital of Italy?", "Which river flows through it?", "Name one famous square there."],
]
PROBES = ["What is the capital of Germany?", "What is the capital of Spain?", "What is 2 + 2?",
          "Name a mountain in Switzerland."]
MAX_TOKENS = 16
# The INT2 default format (page-grid key ranges, G_K 16, G_V 64, min offsets, value clip search).
OSCAR_ARGS = ("--kv-cache", "oscar", "--oscar-bits", "2", "--oscar-page-size", "32",
              "--max-running-requests", "4", "--enable-cache-report", "--enable-metrics")


def _chat(server, messages):
    r = server.post("/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS,
                                             "temperature": 0})
    return r["choices"][0]["message"]["content"], r["usage"]


def _conversation(server, questions, out):
    messages = [{"role": "system", "content": SYSTEM}]
    for q in questions:
        messages.append({"role": "user", "content": q})
        answer, usage = _chat(server, messages)
        out.append((q, answer, usage))
        messages.append({"role": "assistant", "content": answer})


def _greedy_ids(server, prompt):
    r = server.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": MAX_TOKENS,
                                                                       "temperature": 0},
                                  "return_logprob": True})
    return [t[1] for t in r["meta_info"]["output_token_logprobs"]], r["meta_info"].get("cached_tokens", 0)


def _plain_ids(model, tok, prompt):
    """The greedy tokens of the unquantized model (transformers' own K/V cache, fp32)."""
    import torch

    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return [int(t) for t in out[0, ids.shape[1]:]]


def _probe_prompt(q):
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model_path():
    return converted_model()


def test_oscar_server_end_to_end(model_path):
    oscar_out: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    with launch(model_path, *OSCAR_ARGS) as server:
        results: list[list[tuple]] = [[] for _ in QUESTIONS]
        threads = [threading.Thread(target=_conversation, args=(server, qs, res))
                   for qs, res in zip(QUESTIONS, results)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "a client did not finish"
        for res, qs in zip(results, QUESTIONS):
            assert len(res) == len(qs)
            assert all(answer.strip() for _, answer, _ in res), res
            # Later turns share the system prompt and earlier turns: the radix cache serves sealed pages.
            for _, _, usage in res[1:]:
                assert usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
        assert "Paris" in results[0][0][1], results[0][0]
        assert "Rom" in results[1][0][1], results[1][0]  # "Rome", or "Roma" as the INT2 default answers
        for q in PROBES:
            oscar_out[q], cached[q] = _greedy_ids(server, _probe_prompt(q))

        info = server.get("/server_info")
        oscar = info["internal_states"][0]["oscar"]
        assert oscar["config"]["bits"] == 2 and oscar["page_size"] == 32
        assert oscar["kv_bytes_per_token"] < oscar["bf16_bytes_per_token"] / 4
        assert oscar["pages"]["sealed"] > 0 and oscar["seals_total"] > 0
        assert oscar["staging_pages_in_use"] <= oscar["staging_pages_total"]
        # Page state comes from the Rust runtime behind the allocator (one call per step), and the
        # radix cache's inserts reach it: the tree holds sealed pages.
        assert oscar["runtime_steps"] > 0 and oscar["tree_pages"] > 0, oscar
        # Every request has finished: the numbers are those after the last step (its finished
        # requests' pages released or in the tree, locks gone, staging back), not one step behind.
        assert (oscar["pages"]["open"], oscar["locked_pages"], oscar["staging_pages_in_use"]) == (0, 0, 0), oscar
        assert oscar["pages"]["sealed"] == oscar["tree_pages"], oscar
        metrics = server.get("/metrics")
        assert "oscar:compression_ratio" in metrics, metrics
        for line in ('oscar:pages{state="open",tp_rank="0"} 0.0', 'oscar:staging_pages_in_use{tp_rank="0"} 0.0',
                     f'oscar:pages{{state="sealed",tp_rank="0"}} {float(oscar["pages"]["sealed"])}'):
            assert line in metrics, (line, [m for m in metrics.splitlines() if m.startswith("oscar:")])
        # SGLang logs a harmless /freeze_gc connection traceback at startup on some runs; none may be ours.
        assert "oscar_sgl/" not in server.log(), server.log()[-3000:]

    from oscar_sgl import OscarConfig
    from oscar_sgl import model as models

    model, tok = models.load(model_path)
    agree = []
    for q in PROBES:
        agree.append(common_prefix(oscar_out[q], _plain_ids(model, tok, _probe_prompt(q))) / MAX_TOKENS)
    print("greedy common-prefix fraction per probe (vs the unquantized model):", agree)
    # The strong check: the server computes exactly what the reference computes. The same weights
    # (the converted folder, fp32) through transformers + OscarCache, with the server's sealing
    # schedule, give the same greedy tokens (different fp32 kernels may flip a near-tie late; the
    # first 8 tokens must match on every probe, all 16 on at least 3 of 4).
    cfg = OscarConfig(bits=2, page_size=32)
    same = []
    for q in PROBES:
        want = oscar_reference_ids(model, tok, _probe_prompt(q), cfg, MAX_TOKENS)
        got = oscar_out[q]
        same.append(next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), MAX_TOKENS))
    print("server vs reference: matching greedy tokens per probe", same, "cached prefix", list(cached.values()))
    assert min(same) >= 8, same
    assert sum(n == MAX_TOKENS for n in same) >= 3, same
    assert sum(agree) / len(agree) >= 0.125, agree
    assert sum(a >= 1 / MAX_TOKENS for a in agree) >= 2, agree
