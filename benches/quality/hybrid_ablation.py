"""Ablation of OScaR's ingredients on SmolLM2 and gemma-3-270m (issue 15, items 2-3), several windows.

Each window is `--prefix` + `--score` tokens starting at an evenly spread offset of the text (BOS
prepended when the model's tokenizer adds one: gemma-3's does, SmolLM2's does not). Per window,
`oscar_sgl.evaluate.perplexity` scores every config against full precision; the report gives per
config the mean over windows of dPPL % and KL with a 95 % t-interval, and the effective bits.

    python benches/quality/hybrid_ablation.py --model gemma-3-270m --text austen_emma.txt --windows 3 \\
        --json benches/results/quality_hybrid_gemma_emma.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from oscar_sgl import model as models
from oscar_sgl.config import PAPER_FORMAT, OscarConfig
from oscar_sgl.evaluate import perplexity
from oscar_sgl import reference as ref
from oscar_sgl.reference import key_rotation_plan, qk_channel_alignment

EVAL_DATA = Path("/work/shared/eval-data")

#: (row name, OscarConfig fields). INT2 unless named; the paper format (PAPER_FORMAT: k_group = v_group = 32), page 128.
CONFIGS: dict[str, dict[str, object]] = {
    "kivi-2": dict(bits=2, rotation=False, token_scaling=False),
    "scaling-only-2": dict(bits=2, rotation=False, token_scaling=True),
    "rotation-only-2 all-heads": dict(bits=2, rotation=True, token_scaling=False, key_rotation="all"),
    "oscar-2 all-heads (paper)": dict(bits=2, rotation=True, token_scaling=True, key_rotation="all"),
    "oscar-2 by-weights": dict(bits=2, rotation=True, token_scaling=True, key_rotation="weights"),
    "oscar-2 by-weights sliding-bf16": dict(bits=2, rotation=True, token_scaling=True, key_rotation="weights",
                                            sliding_layers="bf16"),
    "oscar-4 by-weights": dict(bits=4, rotation=True, token_scaling=True, key_rotation="weights"),
    "kivi-4": dict(bits=4, rotation=False, token_scaling=False),
}


def t95(n: int) -> float:
    return {1: float("nan"), 2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571}.get(n, 1.96)


def windows(tok, text: str, n: int, count: int) -> tuple[list[torch.Tensor], bool, list[int]]:
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    bos = tok("a", add_special_tokens=True).input_ids[0] == tok.bos_token_id and tok.bos_token_id is not None
    body = n - 1 if bos else n
    span = ids.shape[0] - body
    starts = [round(i * span / count) for i in range(count)] if count > 1 else [0]
    out = []
    for s in starts:
        w = ids[s:s + body]
        if bos:
            w = torch.cat([torch.tensor([tok.bos_token_id]), w])
        out.append(w[None])
    return out, bool(bos), starts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", default="austen_emma.txt")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--score", type=int, default=1024)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated row names")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-alignment", type=float, default=None,
                    help="the rule's threshold on rho, OscarConfig.key_rotation_min_alignment (default: its default)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tau = {} if args.min_alignment is None else {"key_rotation_min_alignment": args.min_alignment}
    names = [c for c in args.configs.split(",") if c]
    lm, tok = models.load(args.model)
    hybrid = "sliding_attention" in (getattr(lm.config, "layer_types", None) or [])
    if not hybrid:
        names = [c for c in names if "sliding" not in c]
    cfgs = [OscarConfig(**{**PAPER_FORMAT, **tau, **CONFIGS[c]}) for c in names]
    plan = key_rotation_plan(lm, OscarConfig(**tau))
    rho = qk_channel_alignment(lm)
    text = (EVAL_DATA / args.text).read_text(encoding="utf-8")
    wins, bos, starts = windows(tok, text, args.prefix + args.score, args.windows)
    per = {c: [] for c in names}
    base = []
    t0 = time.monotonic()
    for i, ids in enumerate(wins):
        b, results = perplexity(lm, ids, args.prefix, cfgs)
        base.append(b)
        for c, r in zip(names, results):
            per[c].append(r)
        print(f"window {i} (token {starts[i]}): base {b:.3f} " + " ".join(f"[{c}] {r.delta_ppl_pct:+.2f}%" for c, r in zip(names, results)),
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        report = _report(args, names, per, base, bos, starts, plan, rho, t0)
        args.json.write_text(json.dumps(report, indent=2) + "\n")  # after every window: a cut run keeps its windows
    for r in report["rows"]:
        print(f"  {r['config']:<36} eff.bits {r['effective_bits']:6.3f}  dPPL {r['delta_ppl_pct_mean']:+7.2f} % "
              f"± {r['delta_ppl_pct_ci95']:.2f}  KL {r['kl_mean']:.4f} ± {r['kl_ci95']:.4f}")
    return 0


def _report(args, names, per, base, bos, starts, plan, rho, t0) -> dict:
    rows = []
    for c in names:
        d = [r.delta_ppl_pct for r in per[c]]
        k = [r.kl for r in per[c]]
        n = len(d)
        ci = lambda x: t95(n) * statistics.stdev(x) / math.sqrt(n) if n > 1 else float("nan")  # noqa: E731
        rows.append({"config": c, "fields": CONFIGS[c], "bits": per[c][0].bits,
                     "effective_bits": per[c][0].effective_bits,
                     "delta_ppl_pct_mean": statistics.mean(d), "delta_ppl_pct_ci95": ci(d),
                     "kl_mean": statistics.mean(k), "kl_ci95": ci(k),
                     "top1_mean": statistics.mean(r.top1_agreement for r in per[c]),
                     "delta_ppl_pct_per_window": d})
    return {
        "model": args.model, "text": args.text, "bos": bos, "prefix_tokens": args.prefix, "score_tokens": args.score,
        "windows_done": len(base), "window_starts_tokens": starts[:len(base)], "baseline_ppl_per_window": base,
        "key_rotation_plan": [list(p) for p in plan], "qk_channel_alignment": rho,
        "key_rotation_min_alignment": args.min_alignment if args.min_alignment is not None else ref.KEY_ROTATION_MIN_ALIGNMENT,
        "command": " ".join(["python", "benches/quality/hybrid_ablation.py", *sys.argv[1:]]),
        "seconds": time.monotonic() - t0, "rows": rows,
    }


if __name__ == "__main__":
    raise SystemExit(main())
