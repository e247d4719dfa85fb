"""Decode time against the split count, from `bench_decode.py --decode-only --variants ...` runs:
one row per (batch, context, bits), one column per split count measured, the old rule's choice
(8 programs per SM) and the balanced rule's (`pick_num_splits(waves=None)`) marked.

    python benches/kernels/splits_report.py benches/results/kernels_splits_8f465df/run*.json > .../splits.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from oscar_sgl.kernels import pick_num_splits

H = 8  # KV heads of the benchmark's Llama-3.1-8B shape


def main(paths: list[str]) -> int:
    times: dict[tuple[int, int, int], dict[int, float]] = defaultdict(dict)
    sms, meta = 132, {}
    for p in paths:
        d = json.load(open(p))
        meta = d.get("meta", meta)
        sms = meta.get("sms", sms)
        for sh in d["shapes"]:
            for bits in (2, 4):
                for v in sh.get(f"int{bits}", {}).get("variants", []):
                    if "us" in v:  # the same split count measured twice: the first
                        times[(sh["batch"], sh["ctx"], bits)].setdefault(v["num_splits"], v["us"])
    print(f"Decode (the default fused launch: bn 32, one warp, 3 stages, transposed) against the split count; "
          f"{meta.get('gpu', '?')}, {sms} SMs, triton {meta.get('triton', '?')}, {meta.get('date', '?')}. "
          "Microseconds per launch; **old**: the 8-programs-per-SM rule's choice from 512 (request, KV head) "
          "pairs on, **new**: the balanced rule's (`pick_num_splits(waves=None)`).\n")
    print("| B | ctx | pairs | bits | us by splits | old | new | new / old |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|")
    for (b, ctx, bits), by in sorted(times.items()):
        old, new = pick_num_splits(b, H, num_sms=sms, waves=8.0), pick_num_splits(b, H, num_sms=sms, waves=None)
        cells = ", ".join(f"{s}: {'**' if s in (old, new) else ''}{us:.0f}{'**' if s in (old, new) else ''}"
                          for s, us in sorted(by.items()))
        ratio = f"{by[old] / by[new]:.2f}x faster" if old in by and new in by and new != old else ("same" if new == old else "not measured")
        print(f"| {b} | {ctx} | {b * H} | {bits} | {cells} | {old} | {new} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
