"""Where a kernel's warps stall, by SASS instruction: reads Nsight Compute's source page
(``ncu -i REPORT --page source --csv --print-source sass``) and prints, for the hottest loop (the
backward branch whose span executed the most instructions), the warp-state samples per stall reason,
the instructions holding the most samples with what they wait on, and the samples by opcode.

    python3 benches/kernels/ncu_source_stalls.py SOURCE.csv [--top 25]

Stall names are ncu's (``stall_long_sb``: waiting on a global / local memory load's result;
``stall_wait``: a fixed-latency dependency; ``stall_short_sb``: a shared memory / MUFU / shuffle
result; ``stall_math``: a busy math pipe; ``stall_not_selected``: eligible, another warp issued;
``stall_selected``: issuing). A sample is charged to the instruction the warp waits to issue, so a
load's latency shows at the first instruction that reads its register.
``benches/results/kernels_gluon_s34/run_source_profile.sh`` makes the CSV on the device machine."""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter

_BRA = re.compile(r"\bBRA\S*\s+(?:`?\(?\.?\w*\)?\s*)?0x([0-9a-f]+)")


def rows_of(text: str) -> list[dict[str, str]]:
    """The source page's rows (one per SASS instruction), from the CSV's text."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError("not an ncu source page (--page source --csv): no \"Address\" header row")
    return list(csv.DictReader(lines[start:]))


def _num(x: str | None) -> float:
    try:
        return float((x or "").replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    """``@!P0 LDG.E.128 R4, [R2]`` -> ``LDG``."""
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0].split(".")[0]


def summarize(rows: list[dict[str, str]], top: int = 25) -> dict:
    """The hottest loop's instructions, samples, samples per stall reason, its ``top`` instructions
    by samples (index in the loop, source, samples, two main reasons) and samples by opcode."""
    if not rows:
        raise ValueError("no instructions in the source page")
    addr = [int(r["Address"], 16) for r in rows]
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    loops = []
    for i, r in enumerate(rows):
        m = _BRA.search(r["Source"])
        if m and int(m.group(1), 16) < addr[i]:
            span = [j for j in range(len(rows)) if int(m.group(1), 16) <= addr[j] <= addr[i]]
            loops.append((sum(_num(rows[j]["Instructions Executed"]) for j in span), span))
    if not loops:
        raise ValueError("no loop (backward branch) in the source page")
    executed, span = max(loops, key=lambda x: x[0])
    samples = sum(_num(rows[j]["Warp Stall Sampling (All Samples)"]) for j in span)
    reasons = Counter({c: sum(_num(rows[j][c]) for j in span) for c in stall_cols})
    hot = sorted(span, key=lambda j: -_num(rows[j]["Warp Stall Sampling (All Samples)"]))[:top]
    tops = []
    for j in sorted(hot):
        s = _num(rows[j]["Warp Stall Sampling (All Samples)"])
        why = sorted(((_num(rows[j][c]), c[6:]) for c in stall_cols if _num(rows[j][c]) > 0), reverse=True)[:2]
        tops.append((span.index(j), rows[j]["Source"].strip(), s, [(n, v / max(s, 1)) for v, n in why]))
    by_op = Counter()
    for j in span:
        by_op[opcode(rows[j]["Source"])] += _num(rows[j]["Warp Stall Sampling (All Samples)"])
    return {"instructions": len(rows), "samples": total, "loop_instructions": len(span), "loop_executed": executed,
            "loop_samples": samples, "reasons": reasons, "top": tops, "by_opcode": by_op}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        s = summarize(rows_of(f.read()), args.top)
    ls = max(s["loop_samples"], 1)
    print(f"{args.csv}: {s['instructions']} instructions, {s['samples']:.0f} warp-state samples")
    print(f"hottest loop: {s['loop_instructions']} instructions, {s['loop_executed']:.0f} warp-instructions "
          f"executed, {s['loop_samples']:.0f} samples ({100 * s['loop_samples'] / max(s['samples'], 1):.1f} % of the "
          f"kernel's)")
    for c, v in s["reasons"].most_common(10):
        print(f"  {c:24s} {v:8.0f}  {100 * v / ls:5.1f} %")
    print(f"top {args.top} instructions of the loop by samples (index in the loop, reasons):")
    for i, src, n, why in s["top"]:
        print(f"  {i:4d} {src[:60]:60s} {n:6.0f}  " + ", ".join(f"{r}: {100 * w:.0f}%" for r, w in why))
    print("samples by opcode (the instruction a warp waits to issue):")
    for op, v in s["by_opcode"].most_common(12):
        print(f"  {op:10s} {v:8.0f}  {100 * v / ls:5.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
