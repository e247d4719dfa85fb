"""The same answer whether the prompt was cached or not (issue 20): a real CPU server with
`--kv-cache oscar` (default `--oscar-prefill position`) answers one prompt cold, warm (a full
prefix-cache hit), after a partial hit (another prompt sharing most of it), after `/flush_cache`,
prefilled in chunks of 64 tokens and in one piece (`--chunked-prefill-size` 64 / 8192), alone and
in a batch with other requests: the same greedy tokens, and output log-probabilities within
`LOGPROB_BOUND` of each other. (Until session 40 a third server at 256 too; ~80 s of CI, and
64 / 8192 are the two ends.)

Why the bound is not zero, and why 1e-3: with position-determined attention every token attends
to the same codes and the same exact tokens in every case, and on this path (the torch reference,
page by page with fixed shapes, `backend._extend_by_pages`) it does so with the same fp32 bits. What
can remain is SGLang's own rounding where its shapes change with the batch (its matmuls over the
batch's rows in decode steps), ~1e-6 relative. Measured with this test: 0 for cold / warm /
partial hit / flushed / every chunk size, at most 6e-6 in a batch (benches/results/determinism.md).
A bound far above that but far below what a changed attention gives (exact prefill differs from
position prefill by 0.05-1 in these log-probabilities, the same file) catches any regression; the
greedy tokens must be identical. The prompt is real text (the packaged opening of Austen's Emma).
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("sglang")

from sglang_support.harness import converted_model, launch  # noqa: E402

pytestmark = pytest.mark.slow

PAGE = 32
ARGS = ("--kv-cache", "oscar", "--oscar-bits", "2", "--oscar-page-size", str(PAGE), "--oscar-k-group", "32",
        "--max-running-requests", "4")
NEW_TOKENS = 12
LOGPROB_BOUND = 1e-3


@pytest.fixture(scope="module")
def prompts():
    """X: 500 tokens of Emma; Y: X's first 450 tokens, then 40 others (a partial hit on X's pages,
    ending mid-page); Z: unrelated text for batching."""
    from importlib.resources import files

    from transformers import AutoTokenizer

    path = converted_model()
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(files("oscar_sgl.data").joinpath("emma_opening.txt").read_text(), add_special_tokens=False).input_ids
    x = ids[:500]
    y = ids[:450] + ids[1000:1040]
    z = ids[2000:2300]
    return path, x, y, z


def _gen(server, ids):
    r = server.post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS,
                                                                         "temperature": 0},
                                  "return_logprob": True})
    meta = r["meta_info"]
    return ([t[1] for t in meta["output_token_logprobs"]], [t[0] for t in meta["output_token_logprobs"]],
            int(meta.get("cached_tokens", 0)))


def _same(label, a, b):
    """Two answers agree: identical greedy tokens, log-probabilities within the bound."""
    assert a[0] == b[0], f"{label}: tokens {a[0]} != {b[0]}"
    diff = max(abs(p - q) for p, q in zip(a[1], b[1]))
    assert diff <= LOGPROB_BOUND, f"{label}: log-probabilities differ by {diff:.2e}"
    return diff


def _batched(server, prompts):
    """The prompts sent at once (SGLang batches their prefills and decodes)."""
    out = [None] * len(prompts)

    def one(i):
        out[i] = _gen(server, prompts[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(o is not None for o in out), "a batched request did not finish"
    return out


def test_same_answer_cold_warm_partial_hit_flushed_chunked_and_batched(prompts):
    path, x, y, z = prompts
    diffs = {}
    with launch(path, *ARGS, "--chunked-prefill-size", "64") as server:
        x_cold = _gen(server, x)
        assert x_cold[2] == 0
        x_warm = _gen(server, x)
        assert x_warm[2] >= len(x) - PAGE, f"expected a full prefix hit, cached {x_warm[2]}"
        diffs["warm"] = _same("X warm vs cold", x_warm, x_cold)
        y_hit = _gen(server, y)
        assert PAGE <= y_hit[2] <= 450, f"expected a partial hit on X's pages, cached {y_hit[2]}"
        server.post("/flush_cache", {})
        x_flushed = _gen(server, x)
        assert x_flushed[2] == 0, "/flush_cache left cached tokens"
        diffs["flushed"] = _same("X after /flush_cache vs cold", x_flushed, x_cold)
        server.post("/flush_cache", {})
        y_cold = _gen(server, y)
        assert y_cold[2] == 0
        diffs["partial hit"] = _same("Y after a partial hit vs cold", y_hit, y_cold)
        server.post("/flush_cache", {})
        bx, by, _ = _batched(server, [x, y, z])
        diffs["batched X"] = _same("X in a batch vs alone", bx, x_cold)
        diffs["batched Y"] = _same("Y in a batch vs alone", by, y_cold)
        info = server.get("/server_info")["internal_states"][0]["oscar"]
        assert info["prefill"] == "position"
    with launch(path, *ARGS, "--chunked-prefill-size", "8192") as server:  # each prompt in one chunk
        diffs["X unchunked"] = _same("X at --chunked-prefill-size 8192 vs 64", _gen(server, x), x_cold)
        y_c = _gen(server, y)  # after X: a partial hit here too
        assert y_c[2] > 0
        diffs["Y unchunked"] = _same("Y at --chunked-prefill-size 8192 vs 64", y_c, y_cold)
    print("max |delta log-prob| per case:", {k: f"{v:.1e}" for k, v in diffs.items()})
