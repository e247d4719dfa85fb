"""Print the rows of benches/results/quality_hybrid.md from the JSON files hybrid_ablation.py wrote.

    python benches/quality/hybrid_report.py benches/results/quality_hybrid_*.json
"""

import json
import sys


def main() -> int:
    print("| model | text | config | threshold | windows | eff. bits | ΔPPL % mean ± 95 % CI | per window | KL mean ± CI | top-1 |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|---:|")
    for path in sys.argv[1:]:
        d = json.load(open(path))
        tau = d.get("key_rotation_min_alignment", 0.5)
        for r in d["rows"]:
            uses_rule = r["fields"].get("key_rotation") == "weights" and r["fields"].get("rotation")
            per = ", ".join(f"{x:+.2f}" for x in r["delta_ppl_pct_per_window"])
            print(f"| {d['model']} | {d['text']} | {r['config']} | {tau if uses_rule else '-'} | {d['windows_done']} | "
                  f"{r['effective_bits']:.3f} | {r['delta_ppl_pct_mean']:+.2f} ± {r['delta_ppl_pct_ci95']:.2f} | {per} | "
                  f"{r['kl_mean']:.4f} ± {r['kl_ci95']:.4f} | {r['top1_mean']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
