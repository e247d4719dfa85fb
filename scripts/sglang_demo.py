"""The server demo: `oscar-sgl serve --device cpu --kv-cache oscar` (SGLang's own server) on the
default model, next to the same server with `--kv-cache default` (unquantized KV), both greedy; a
short multi-turn agent conversation over the OpenAI API, each turn's answer from both servers and
their token agreement, then what matters (tokens/s, KV bytes per token vs BF16, tokens that fit,
prefix-cache hits); then both servers stop.

    python scripts/sglang_demo.py [--model-path HF_FOLDER] [--bits 2|4] [--page-size 32]

Both servers get the same prompt every turn (the conversation's history holds the OScaR answers),
so each turn's agreement is the quality cost of the quantized KV on that prompt alone. Needs SGLang
0.5.23 in the environment (see README). On a GPU machine, run the server yourself:
    python -m sglang.launch_server --model-path <model> --kv-cache oscar --oscar-bits 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sglang_support.harness import common_prefix, converted_model, start_cpu_server  # noqa: E402

SYSTEM = (
    "You are a travel-planning agent. Keep every answer to one or two short sentences. You know the "
    "capitals, rivers and landmarks of Europe, train routes and typical travel times."
)
TURNS = [
    "I want to visit France. What is its capital?",
    "Which river runs through that city?",
    "Suggest one museum to see there.",
    "How long is the train from there to London?",
]
MAX_TOKENS = 48
STARTUP_TIMEOUT = 300


def _chat(server, messages):
    t = time.time()
    r = server.post("/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS,
                                             "temperature": 0, "return_token_ids": True})
    choice = r["choices"][0]
    return choice["message"]["content"].strip(), choice["response_token_ids"], r["usage"], time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None, help="HF folder; default: the converted SmolLM2-135M-Instruct")
    ap.add_argument("--bits", type=int, default=2, choices=(2, 4))
    ap.add_argument("--page-size", type=int, default=32)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    args = ap.parse_args()

    model = args.model_path or converted_model()
    # A small chunked prefill keeps the BF16 staging small: every page a step writes is staged until
    # the next step, so staging scales with the largest prefill chunk. The baseline gets the same
    # scheduling flags and page size (`--oscar-page-size` sets SGLang's), so only the KV cache differs.
    common = ("--max-running-requests", "4", "--chunked-prefill-size", "256", "--enable-cache-report")
    oscar_args = ("--kv-cache", "oscar", "--oscar-bits", str(args.bits), "--oscar-page-size", str(args.page_size),
                  "--oscar-k-group", str(min(32, args.page_size)), *common)
    print(f"model: {model}\nlaunching, side by side (--dtype float32, greedy):\n"
          f"  oscar-sgl serve --device cpu --kv-cache oscar --oscar-bits {args.bits} --oscar-page-size "
          f"{args.page_size} ...\n  oscar-sgl serve --device cpu --kv-cache default ...  (unquantized fp32 KV)",
          flush=True)
    t0 = time.time()
    oscar = start_cpu_server(model, *oscar_args, max_total_tokens=args.max_total_tokens)
    try:
        base = start_cpu_server(model, "--kv-cache", "default", "--page-size", str(args.page_size), *common,
                                max_total_tokens=args.max_total_tokens)
    except BaseException:
        oscar.stop()
        raise
    with oscar, base:
        oscar.wait_healthy(STARTUP_TIMEOUT)
        base.wait_healthy(STARTUP_TIMEOUT)
        print(f"both servers up in {time.time() - t0:.0f}s\n")
        messages = [{"role": "system", "content": SYSTEM}]
        tokens, secs, agree = [0, 0], [0.0, 0.0], []
        for turn in TURNS:
            messages.append({"role": "user", "content": turn})
            answer, ids, usage, dt = _chat(oscar, messages)
            base_answer, base_ids, _, base_dt = _chat(base, messages)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            same = common_prefix(ids, base_ids)
            agree.append((same, len(ids)))
            for i, (n, s) in enumerate(((len(ids), dt), (len(base_ids), base_dt))):
                tokens[i] += n
                secs[i] += s
            print(f"user> {turn}\nagent (OScaR INT{args.bits})> {answer}\nagent (unquantized KV)> {base_answer}\n"
                  f"   [{usage['prompt_tokens']} prompt tokens, {cached} from the prefix cache; "
                  f"{len(ids)} generated in {dt:.1f}s; the first {same} of {len(ids)} tokens equal the "
                  f"unquantized answer's{' (all)' if ids == base_ids else ''}]\n")
            messages.append({"role": "assistant", "content": answer})
        o = oscar.get("/server_info")["internal_states"][0]["oscar"]
    total_same, total = sum(a for a, _ in agree), sum(n for _, n in agree)
    print("---- OScaR KV cache ----")
    print(f"token agreement with the unquantized KV, same prompts: {total_same}/{total} leading tokens "
          f"({', '.join(f'{a}/{n}' for a, n in agree)} per turn), counted up to each turn's first "
          "difference (after it the two greedy answers go on from different text)")
    print(f"tokens/s (generation, one client, 2-core CPU): OScaR {tokens[0] / secs[0]:.1f}, "
          f"unquantized {tokens[1] / secs[1]:.1f}")
    print(f"KV bytes/token (all layers): {o['kv_bytes_per_token']:.0f} vs BF16 {o['bf16_bytes_per_token']} "
          f"-> {o['compression_ratio']:.2f}x smaller ({o['effective_bits']:.2f} effective bits)")
    print(f"tokens that fit: {o['token_capacity']} in this pool; BF16 would fit "
          f"{o['bf16_tokens_same_bytes']} in the same bytes (BF16 staging of open pages: "
          f"{o['staging_pages_total']} pages of {o['page_size']} tokens, extra)")
    print(f"pages: {o['pages']}, seals: {o['seals_total']}, staging peak: {o['staging_pages_peak']}")
    print("servers stopped.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
