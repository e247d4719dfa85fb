"""The "Seal-time ingredients (session 10)" tables of benches/results/quality.md, from the JSON files
`benches/quality/seal_ingredients.sh` wrote (`oscar-sgl eval ppl --windows 4`, SmolLM2, INT2).

Per text: ΔPPL % of every config with its 95 % Student t interval over the 4 windows. Pooled: the
12 windows of the three texts, each config's mean ΔPPL % and its paired difference against today's
default (`oscar`: offset integer, no clip) and against `kivi`, window by window. Runs from several
commands are paired only if their full-precision PPL agrees on every window (same windows, same
baseline), which this script checks.

A method evaluated at more than one (k_group, v_group) across the files is labelled with its groups
(e.g. ``oscar+min+clip-values+page-ranges (G_K32 G_V64)``). ``--against LABEL`` adds a column of paired
differences against that config (a label as printed).

Usage: python benches/quality/seal_report.py [--against LABEL] benches/results/quality_seal_*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from oscar_sgl.evaluate import mean_ci

TEXTS = {"austen_emma.txt": "Emma", "austen_persuasion.txt": "Persuasion", "devils_dictionary.txt": "The Devil's Dictionary"}
TODAY, KIVI = "oscar", "kivi"


def _ci(ci: Any, fmt: str = "+.2f") -> str:
    return "(no interval)" if ci is None else f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def load(paths: list[str]) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, list[float]]]:
    """(texts in order, per text {label: result row}, per text the full-precision PPL per window)."""
    texts: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    base: dict[str, list[float]] = {}
    reps = [(p, json.loads(Path(p).read_text())) for p in paths]
    groups: dict[str, set] = {}  # method -> the (k_group, v_group) it was evaluated at, over every file
    for _, rep in reps:
        for r in rep["results"]:
            groups.setdefault(r["method"], set()).add((r.get("k_group"), r.get("v_group")))

    def label(r: dict[str, Any]) -> str:
        many = len(groups[r["method"]]) > 1
        return f"{r['method']} (G_K{r.get('k_group')} G_V{r.get('v_group')})" if many else r["method"]

    for p, rep in reps:
        text = Path(rep["text"]).name
        fp = [w["ppl"] for w in rep["baseline"]["per_window"]]
        if text not in rows:
            texts.append(text)
            rows[text], base[text] = {}, fp
        elif [round(x, 6) for x in fp] != [round(x, 6) for x in base[text]]:
            raise SystemExit(f"{p}: full-precision PPL per window differs from the other run on {text}: not pairable")
        for r in rep["results"]:
            if r["bits"] != 2:
                continue
            rows[text].setdefault(label(r), r)
    return texts, rows, base


def main(argv: list[str]) -> None:
    against = None
    if argv[:1] == ["--against"]:
        if len(argv) < 2:
            raise SystemExit("--against needs a config label")
        against, argv = argv[1], argv[2:]
    texts, rows, base = load(argv)
    labels = list(dict.fromkeys(lab for t in texts for lab in rows[t]))
    labels = [lab for lab in labels if all(lab in rows[t] for t in texts)]
    if against is not None and against not in labels:
        raise SystemExit(f"--against {against!r}: no such config in every text; configs: {', '.join(labels)}")
    bits = {lab: rows[texts[0]][lab]["effective_bits"] for lab in labels}
    out = ["| config (INT2) | eff. bits | " + " | ".join(f"{TEXTS.get(t, t)}: ΔPPL % [95 % CI]" for t in texts) + " |",
           "|---|---|" + "---|" * len(texts)]
    for lab in labels:
        out.append(f"| {lab} | {bits[lab]:.3f} | " + " | ".join(
            f"{rows[t][lab]['delta_ppl_pct']:+.2f} {_ci(rows[t][lab]['delta_ppl_pct_ci95'])}" for t in texts) + " |")
    fp = [x for t in texts for x in base[t]]
    out += ["", f"Pooled over the {len(fp)} windows ({len(texts)} texts x {len(fp) // len(texts)}); paired: mean of "
            "the per-window ΔPPL(config) - ΔPPL(other) in points, 95 % Student t interval; 'lower' where it excludes 0.",
            "", f"| config (INT2) | eff. bits | ΔPPL % [95 % CI] | KL | vs {TODAY} (the paper's format) | vs {KIVI} |"
            + (f" vs {against} |" if against else ""), "|---|---|---|---|---|---|" + ("---|" if against else "")]

    def per_window(lab: str, key: str = "delta_ppl_pct") -> list[float]:
        return [w[key] for t in texts for w in rows[t][lab]["per_window"]]

    def paired(a: str, b: str) -> str:
        if a == b:
            return "-"
        m, ci = mean_ci([x - y for x, y in zip(per_window(a), per_window(b))])
        verdict = "" if ci is None else " lower" if ci[1] < 0 else " higher" if ci[0] > 0 else " not resolved"
        return f"{m:+.2f} {_ci(ci)}{verdict}"

    for lab in labels:
        m, ci = mean_ci(per_window(lab))
        kl, _ = mean_ci(per_window(lab, "kl"))
        out.append(f"| {lab} | {bits[lab]:.3f} | {m:+.2f} {_ci(ci)} | {kl:.4f} | "
                   f"{paired(lab, TODAY) if TODAY in labels else 'n/a'} | {paired(lab, KIVI) if KIVI in labels else 'n/a'} |"
                   + (f" {paired(lab, against)} |" if against else ""))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
