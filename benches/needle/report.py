"""Markdown tables from the JSON of `oscar-sgl eval needle` (for benches/results/needle.md).

Usage: python benches/needle/report.py benches/results/needle.json [benches/results/needle_server.json]

Per file: accuracy by context length and method (each with its effective bits), accuracy by depth,
and how often each method's answer is the full-precision answer word for word.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tables(rep: dict) -> str:
    labels = [m["label"] for m in rep["methods"]]
    bits = {m["label"]: m["effective_bits"] for m in rep["methods"]}
    lengths = rep["lengths"]
    acc = {(r["length"], r["label"]): r for r in rep["accuracy"]}
    out = [f"Passkey retrieved (of {len(rep['depths']) * rep['trials']} trials per length: depths "
           f"{', '.join(f'{d:g}' for d in rep['depths'])} x {rep['trials']} trials; {rep['haystack']} haystack, "
           f"{rep['prefill']} prefill):", "",
           "| method | effective bits | " + " | ".join(f"{n}" for n in lengths) + " | all |",
           "|---|---:|" + "---:|" * (len(lengths) + 1)]
    for lb in labels:
        rows = [acc[(n, lb)] for n in lengths]
        hit, tot = sum(r["retrieved"] for r in rows), sum(r["trials"] for r in rows)
        out.append(f"| {lb} | {bits[lb]:.3f} | " + " | ".join(f"{r['retrieved']}/{r['trials']}" for r in rows)
                   + f" | {hit}/{tot} ({hit / tot:.0%}) |")
    trials = rep["trial_results"]
    out += ["", "By depth (all lengths together):", "",
            "| method | effective bits | " + " | ".join(f"depth {d:g}" for d in rep["depths"]) + " |",
            "|---|---:|" + "---:|" * len(rep["depths"])]
    for lb in labels:
        cells = []
        for d in rep["depths"]:
            ts = [t for t in trials if t["depth"] == d]
            cells.append(f"{sum(t['correct'][lb] for t in ts)}/{len(ts)}")
        out.append(f"| {lb} | {bits[lb]:.3f} | " + " | ".join(cells) + " |")
    ref = "full"
    if ref in labels:
        out += ["", f"Answer identical to the full-precision answer ({rep['new_tokens']} greedy tokens, as text):", "",
                "| method | effective bits | " + " | ".join(f"{n}" for n in lengths) + " |",
                "|---|---:|" + "---:|" * len(lengths)]
        for lb in labels:
            if lb == ref:
                continue
            cells = []
            for n in lengths:
                ts = [t for t in trials if t["length"] == n]
                cells.append(f"{sum(t['outputs'][lb] == t['outputs'][ref] for t in ts)}/{len(ts)}")
            out.append(f"| {lb} | {bits[lb]:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(paths: list[str]) -> None:
    for path in paths:
        rep = json.loads(Path(path).read_text())
        print(f"### {Path(path).name}\n")
        print(tables(rep))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
