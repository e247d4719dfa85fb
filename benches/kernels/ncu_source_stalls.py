"""Where a kernel's warps stall, by SASS instruction: reads Nsight Compute's source page
(``ncu -i REPORT --page source --csv --print-source sass``) and prints, for the hottest loop (the
backward branch whose span executed the most instructions), the warp-state samples per stall reason
and the instructions that hold the most samples with what they wait on.

    python3 benches/kernels/ncu_source_stalls.py SOURCE.csv [--top 25]

Stall names are ncu's (``stall_long_sb``: waiting on a global / local memory load's result;
``stall_wait``: a fixed-latency dependency; ``stall_short_sb``: a shared memory / MUFU / shuffle
result; ``stall_math``: a busy math pipe; ``stall_not_selected``: eligible, another warp issued;
``stall_selected``: issuing)."""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter


def rows_of(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(lines[start:]))


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = rows_of(args.csv)
    addr = [int(r["Address"], 16) for r in rows]
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    # loops: a BRA to a lower address
    loops = []
    for i, r in enumerate(rows):
        m = re.match(r"\s*(?:@!?U?P\w+\s+)?BRA\S*\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)?", r["Source"])
        tgt = re.search(r"0x([0-9a-f]+)", r["Source"]) if "BRA" in r["Source"] else None
        if tgt:
            t = int(tgt.group(1), 16)
            base = addr[0]
            t_abs = t if t >= base else base + t  # ncu prints offsets relative to the function
            if t_abs < addr[i]:
                span = [j for j in range(len(rows)) if t_abs <= addr[j] <= addr[i]]
                loops.append((sum(num(rows[j]["Instructions Executed"]) for j in span), span))
    print(f"{args.csv}: {len(rows)} instructions, {total:.0f} warp-state samples")
    if not loops:
        print("no loop found")
        return 1
    executed, span = max(loops)
    samples = sum(num(rows[j]["Warp Stall Sampling (All Samples)"]) for j in span)
    print(f"hottest loop: {len(span)} instructions, {executed:.0f} warp-instructions executed, "
          f"{samples:.0f} samples ({100 * samples / total:.1f} % of the kernel's)")
    by = Counter()
    for j in span:
        for c in stall_cols:
            by[c] += num(rows[j][c])
    for c, v in by.most_common(10):
        print(f"  {c:24s} {v:8.0f}  {100 * v / max(samples, 1):5.1f} %")
    print(f"top {args.top} instructions of the loop by samples (reason: share of its samples):")
    top = sorted(span, key=lambda j: -num(rows[j]["Warp Stall Sampling (All Samples)"]))[: args.top]
    for j in sorted(top):
        r = rows[j]
        s = num(r["Warp Stall Sampling (All Samples)"])
        reasons = sorted(((num(r[c]), c[6:]) for c in stall_cols if num(r[c]) > 0), reverse=True)[:2]
        why = ", ".join(f"{n}: {100 * v / max(s, 1):.0f}%" for v, n in reasons)
        print(f"  {span.index(j):4d} {r['Source'].strip()[:60]:60s} {s:6.0f}  {why}")
    # by opcode class
    cls = Counter()
    for j in span:
        op = re.sub(r"^@!?U?P\w+\s+", "", rows[j]["Source"].strip()).split(" ")[0].split(".")[0]
        cls[op] += num(rows[j]["Warp Stall Sampling (All Samples)"])
    print("samples by opcode (the instruction a warp waits to issue):")
    for op, v in cls.most_common(12):
        print(f"  {op:10s} {v:8.0f}  {100 * v / max(samples, 1):5.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
