"""Summarise a torch-profiler Chrome trace (what SGLang's /start_profile writes) into a small JSON:
where the wall time of the profiled steps went, on the GPU and on the host.

    python benches/serving/trace_summary.py TRACE.json.gz [--top 25]

- `span_us`: first event start to last event end.
- `gpu`: kernels (and memcpy / memset) by name: total and count; `busy_us`, the union of their
  intervals (what the GPU did), against the span (the rest the GPU waited for the host).
- `host`: CPU ops, user annotations and Python functions by name, *self* time per thread (a
  parent's time minus its children's), so nested ops are not counted twice; `runtime`: CUDA runtime
  calls (launches, synchronizations, copies) by name.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _self_times(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """name -> [self us, count] over events nested per (pid, tid) by their intervals."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[list[Any]] = []  # [end, name, child time]
        for e in evs:
            ts, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= ts:
                end, name, child, start_dur = stack.pop()
                out[name][0] += start_dur - child
                out[name][1] += 1
            if stack:
                stack[-1][2] += dur
            stack.append([ts + dur, e["name"], 0.0, dur])
        while stack:
            end, name, child, start_dur = stack.pop()
            out[name][0] += start_dur - child
            out[name][1] += 1
    return out


def _top(table: dict[str, list[float]], n: int) -> list[dict[str, Any]]:
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": k[:160], "us": round(v[0], 1), "count": int(v[1])} for k, v in rows]


def summarize(path: Path | str, top: int = 25) -> dict[str, Any]:
    events = load(Path(path))
    if not events:
        return {"events": 0}
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e["dur"]) for e in events)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in gpu:
        kernels[e["name"]][0] += float(e["dur"])
        kernels[e["name"]][1] += 1
    runtime: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            runtime[e["name"]][0] += float(e["dur"])
            runtime[e["name"]][1] += 1
    host = _self_times([e for e in events if e.get("cat") in HOST_CATS])
    annotations: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") == "user_annotation":
            annotations[e["name"]][0] += float(e["dur"])
            annotations[e["name"]][1] += 1
    return {
        "events": len(events),
        "span_us": round(t1 - t0, 1),
        "gpu": {"busy_us": round(_union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]), 1),
                "kernel_us": round(sum(v[0] for v in kernels.values()), 1), "kernels": len(gpu),
                "top": _top(kernels, top)},
        "host": {"self_top": _top(host, top), "runtime_top": _top(runtime, 12),
                 "annotations_top": _top(annotations, 12)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    print(json.dumps(summarize(a.trace, a.top), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
