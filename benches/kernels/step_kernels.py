"""What one default decode step launches, kernel by kernel: each kernel's GPU time and the step's span.

For each shape, the default decode step (``bench_decode``'s ``fused`` call: the write, the query
rotation and the merge as the backend runs them; ``--set FIELD=VALUE,...`` changes the launcher's
tuning) is replayed from a CUDA graph ``--steps`` times over distinct KV copies under
``torch.profiler``; per kernel name it prints the mean GPU time per step, and the mean span of a
step (first kernel's start to last kernel's end: launch gaps included). Needs a CUDA GPU and SGLang
importable (as ``bench_decode.py``). From the repo root:

    python3 benches/kernels/step_kernels.py --shapes 1x2048,1x32768 --bits 2

Prints one ``KERNELS`` line per (shape, kernel) and one ``SPAN`` line per shape; ``--out FILE`` also
writes them as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import statistics
import time
from pathlib import Path

#: the host's pause between two profiled replays (seconds). The steps are told apart by the gap
#: between one replay's last kernel and the next one's first. Session 46's form split them at 20 us
#: without a pause, and merged or split steps (1.3-4.0 launches of a kernel per step in session 47's call A).
_PAUSE_S = 0.002


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x2048,1x32768", help="BxCTX,...")
    ap.add_argument("--bits", default="2", help="comma-separated bit widths")
    ap.add_argument("--format", default="group", choices=("group", "page"))
    ap.add_argument("--set", default="", help="FIELD=VALUE,... of decode._DecodeTuning on the launcher's tuning")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    here = Path(__file__).parent
    bench = runpy.run_path(str(here / "bench_decode.py"))
    ab = runpy.run_path(str(here / "tuning_ab.py"))
    import torch
    from torch.profiler import ProfilerActivity, profile

    from oscar_sgl.kernels import decode

    fields = {f.name: f for f in dataclasses.fields(decode._DecodeTuning)}
    changes = ab["parse_fields"](args.set, fields)
    fmt = {"group": dict(k_group=32, v_group=32, key_page=False), "page": dict(k_group=16, v_group=64, key_page=True)}[args.format]
    rows = []
    for bits in (int(b) for b in args.bits.split(",")):
        for shape in args.shapes.split(","):
            b, ctx = (int(x) for x in shape.split("x"))
            tune = dataclasses.replace(bench["launcher_tuning"](bits, b, **fmt), **changes)
            st, ws, _, copies = bench["_default_launch_setup"](bits, b, ctx, 8e9, tune, **fmt)
            calls = [st.call(c % copies, tuning=tune, ws=ws) for c in range(args.steps)]
            for c in calls:
                c()
            torch.cuda.synchronize()
            graphs = []
            for c in calls:  # one graph per step, so that each step's kernels are one replay
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    c()
                graphs.append(g)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for g in graphs:
                    g.replay()
                    torch.cuda.synchronize()
                    time.sleep(_PAUSE_S)  # a gap no step has inside it: where one replay ends
            events = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0),
                            key=lambda e: e.time_range.start)
            # steps: groups of kernels separated by the host synchronization after each replay
            steps, cur, last_end = [], [], None
            for e in events:
                if last_end is not None and e.time_range.start - last_end > _PAUSE_S * 1e6 / 2:  # us: the next replay
                    steps.append(cur)
                    cur = []
                cur.append(e)
                last_end = max(last_end or 0, e.time_range.end)
            if cur:
                steps.append(cur)
            per_name: dict[str, list[float]] = {}
            for s in steps:
                for e in s:
                    per_name.setdefault(e.name, []).append(e.device_time)
            spans = [max(e.time_range.end for e in s) - min(e.time_range.start for e in s) for s in steps]
            row = {"bits": bits, "batch": b, "ctx": ctx, "format": args.format, "set": args.set,
                   "stage1": tune.gluon_variant if tune.gluon else "triton", "steps": len(steps),
                   "span_us": statistics.median(spans),
                   "kernels": {n: statistics.median(v) for n, v in per_name.items()},
                   "launches_per_step": {n: len(v) / max(1, len(steps)) for n, v in per_name.items()}}
            rows.append(row)
            for n, t in row["kernels"].items():
                print(f"KERNELS INT{bits} ({b},{ctx}) {n[:70]}: {t:.1f} us ({row['launches_per_step'][n]:.1f} per step)", flush=True)
            print(f"SPAN INT{bits} ({b},{ctx}) {row['stage1']}: {row['span_us']:.1f} us per step (median of {len(steps)})", flush=True)
            del st, ws, graphs
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
