"""The server demo: launch `python -m sglang.launch_server --kv-cache oscar` on CPU with the default
model, run a short multi-turn agent conversation against it over the OpenAI API, print what matters
(tokens/s, KV bytes per token vs BF16, tokens that fit, prefix-cache hits), then stop the server.

    python scripts/sglang_demo.py [--model-path HF_FOLDER] [--bits 2|4] [--page-size 32]

Needs SGLang 0.5.23 in the environment (see README). On a GPU machine, run the server yourself:
    python -m sglang.launch_server --model-path <model> --kv-cache oscar --oscar-bits 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sglang_support.harness import converted_model, launch  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None, help="HF folder; default: the converted SmolLM2-135M-Instruct")
    ap.add_argument("--bits", type=int, default=2, choices=(2, 4))
    ap.add_argument("--page-size", type=int, default=32)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    args = ap.parse_args()

    model = args.model_path or converted_model()
    print(f"model: {model}\nlaunching: python -m sglang.launch_server --device cpu --kv-cache oscar "
          f"--oscar-bits {args.bits} --oscar-page-size {args.page_size} ...", flush=True)
    t0 = time.time()
    with launch(model, "--kv-cache", "oscar", "--oscar-bits", str(args.bits), "--oscar-page-size",
                str(args.page_size), "--oscar-k-group", str(min(32, args.page_size)),
                # A small chunked prefill keeps the BF16 staging small: every page a step writes is
                # staged until the next step, so staging scales with the largest prefill chunk.
                "--max-running-requests", "4", "--chunked-prefill-size", "256", "--enable-cache-report",
                max_total_tokens=args.max_total_tokens) as server:
        print(f"server up in {time.time() - t0:.0f}s (pid {server.proc.pid}, log {server.log_path})\n")
        messages = [{"role": "system", "content": SYSTEM}]
        gen_tokens, gen_time = 0, 0.0
        for turn in TURNS:
            messages.append({"role": "user", "content": turn})
            t = time.time()
            r = server.post("/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 48,
                                                     "temperature": 0})
            dt = time.time() - t
            answer = r["choices"][0]["message"]["content"].strip()
            usage = r["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            gen_tokens += usage["completion_tokens"]
            gen_time += dt
            print(f"user> {turn}\nagent> {answer}\n   [{usage['prompt_tokens']} prompt tokens, "
                  f"{cached} from the prefix cache; {usage['completion_tokens']} generated in {dt:.1f}s]\n")
            messages.append({"role": "assistant", "content": answer})
        o = server.get("/server_info")["internal_states"][0]["oscar"]
    print("---- OScaR KV cache ----")
    print(f"tokens/s (generation, one client, 2-core CPU): {gen_tokens / gen_time:.1f}")
    print(f"KV bytes/token (all layers): {o['kv_bytes_per_token']:.0f} vs BF16 {o['bf16_bytes_per_token']} "
          f"-> {o['compression_ratio']:.2f}x smaller ({o['effective_bits']:.2f} effective bits)")
    print(f"tokens that fit: {o['token_capacity']} in this pool; BF16 would fit "
          f"{o['bf16_tokens_same_bytes']} in the same bytes (BF16 staging of open pages: "
          f"{o['staging_pages_total']} pages of {o['page_size']} tokens, extra)")
    print(f"pages: {o['pages']}, seals: {o['seals_total']}, staging peak: {o['staging_pages_peak']}")
    print("server stopped.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
