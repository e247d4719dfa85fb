"""Python-side cost of the one-call-per-step runtime API.

Measures, per scheduler step at batch 1 / 64 / 256 (steady-state decode with page opens, seals,
finished requests released and new 512-token prompts prefilled; page size 128, as served):

* ``core``: ``_core.Runtime.step(ops_bytes, ids_bytes)`` alone (the Rust call through PyO3),
* ``wrapper``: ``OscarRuntime.step_arrays(ops, ids)`` (numpy in, ``StepResult`` numpy views out),
* ``allocator`` (with ``--sglang``): SGLang's ``alloc_decode`` on device="cpu" through
  ``OscarPagedAllocator`` + the step's runtime call (``OscarStep.begin``), against the plain ``PagedTokenToKVPoolAllocator``.

Event batches are generated before timing; each step is timed with ``perf_counter_ns``.

    .venv/bin/python benches/runtime/bench_step.py [--steps 3000] [--sglang] [--out benches/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from oscar_sgl import _core
from oscar_sgl.config import OscarConfig
from oscar_sgl.runtime import OscarRuntime, scratch_slots_needed, staging_slots_needed

P = 128
PROMPT = 512
MAX_LEN = 2048


class Workload:
    """Steady-state serving at one batch size (the same mix as the criterion bench)."""

    def __init__(self, num_pages: int, batch: int, seed: int = 7) -> None:
        rng = np.random.default_rng(seed)
        self.free = list(rng.permutation(np.arange(1, num_pages)))
        self.reqs: list[tuple[int, list[int]]] = []
        self.batch = batch

    def _prefill(self, length: int, ops: list[int], ids: list[int]) -> tuple[int, list[int]]:
        pages = [int(self.free.pop()) for _ in range(-(-length // P))]
        ops += [_core.OP_EXTEND, 1, 0, length]
        ids += pages
        return length, pages

    def warmup_batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for i in range(self.batch):
            ops: list[int] = []
            ids: list[int] = []
            self.reqs.append(self._prefill(PROMPT + (i * (MAX_LEN - PROMPT)) // self.batch, ops, ids))
            out.append((np.array(ops, dtype=np.int64), np.array(ids, dtype=np.int64)))
        return out

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        ops: list[int] = []
        ids: list[int] = []
        for i, (length, pages) in enumerate(self.reqs):
            if length >= MAX_LEN:
                ops += [_core.OP_RELEASE, len(pages)]
                ids += pages
                self.free.extend(pages)
                self.reqs[i] = self._prefill(PROMPT, ops, ids)
        ops += [_core.OP_DECODE, len(self.reqs)] + [length + 1 for length, _ in self.reqs]
        for i, (length, pages) in enumerate(self.reqs):
            if length % P == 0:
                pages.append(int(self.free.pop()))
            ids.append(pages[-1])
            self.reqs[i] = (length + 1, pages)
        return np.array(ops, dtype=np.int64), np.array(ids, dtype=np.int64)


def make_runtime(num_pages: int, batch: int, prefill_tokens: int = 2 * PROMPT) -> OscarRuntime:
    return OscarRuntime(
        num_pages=num_pages,
        page_size=P,
        staging_slots=staging_slots_needed(max_running_requests=batch, max_prefill_tokens=prefill_tokens, page_size=P),
        scratch_slots=scratch_slots_needed(max_prefill_tokens=prefill_tokens, page_size=P),
        kv_heads=8,
        head_dim=128,
        config=OscarConfig(),
    )


def summarize(ns: list[int]) -> dict[str, float]:
    q = statistics.quantiles(ns, n=10)
    return {
        "median_us": statistics.median(ns) / 1e3,
        "p10_us": q[0] / 1e3,
        "p90_us": q[-1] / 1e3,
        "mean_us": statistics.fmean(ns) / 1e3,
        "n": len(ns),
    }


def bench_runtime(batch: int, steps: int, repeats: int) -> dict[str, Any]:
    core_ns: list[int] = []
    wrap_ns: list[int] = []
    events = 0
    for rep in range(repeats):
        for mode in ("core", "wrapper"):
            w = Workload(200_000, batch, seed=rep)
            rt = make_runtime(200_000, batch)
            for ops, ids in w.warmup_batches():
                rt.step_arrays(ops, ids)
            batches = [w.next() for _ in range(steps)]
            events = sum(len(i) for _, i in batches)
            if mode == "core":
                raw = rt._rt
                pre = [(o.tobytes(), i.tobytes()) for o, i in batches]
                for ob, ib in pre:
                    t = time.perf_counter_ns()
                    raw.step(ob, ib)
                    core_ns.append(time.perf_counter_ns() - t)
            else:
                for o, i in batches:
                    t = time.perf_counter_ns()
                    rt.step_arrays(o, i)
                    wrap_ns.append(time.perf_counter_ns() - t)
            rt.check()
    return {
        "batch": batch,
        "page_events_per_step": events / steps,
        "core": summarize(core_ns),
        "wrapper": summarize(wrap_ns),
    }


def bench_allocator(batch: int, steps: int) -> dict[str, Any]:
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator

    from oscar_sgl.sglang.allocator import OscarPagedAllocator
    from oscar_sgl.sglang.step import OscarStep

    pages_per_req = -(-(PROMPT + steps) // P) + 1
    num_pages = batch * pages_per_req + 8
    size = num_pages * P

    def run(make: Callable[[], Any], with_step: bool) -> list[int]:
        alloc = make()
        pre = torch.zeros(batch, dtype=torch.int64)
        seq = torch.full((batch,), PROMPT, dtype=torch.int64)
        out = alloc.alloc_extend(pre, pre, seq, seq, torch.full((batch,), -1, dtype=torch.int64), batch * PROMPT)
        last = out.reshape(batch, PROMPT)[:, -1].clone()
        if with_step:
            alloc.oscar_step.begin(new_step=True)
        ns = []
        for _ in range(steps):
            seq = seq + 1
            t = time.perf_counter_ns()
            loc = alloc.alloc_decode(seq, seq, last)
            if with_step:
                alloc.oscar_step.begin(new_step=True)
            ns.append(time.perf_counter_ns() - t)
            last = loc
        return ns

    torch.set_num_threads(1)
    plain = run(lambda: PagedTokenToKVPoolAllocator(size, P, torch.bfloat16, "cpu", None, False), False)
    oscar = run(
        lambda: OscarPagedAllocator(
            size, P, torch.bfloat16, "cpu", None, False,
            step=OscarStep(make_runtime(num_pages + 1, batch, batch * PROMPT), device="cpu"),
        ),
        True,
    )
    return {"batch": batch, "sglang_alloc_decode": summarize(plain), "oscar_alloc_decode_plus_step": summarize(oscar)}


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "rustc": rustc,
        "layout_version": _core.LAYOUT_VERSION,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--sglang", action="store_true", help="also time the SGLang allocator path (device=cpu)")
    ap.add_argument("--out", type=Path, default=None, help="write runtime_step.json here")
    args = ap.parse_args()

    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "runtime": [bench_runtime(b, args.steps, args.repeats) for b in args.batches],
    }
    for r in result["runtime"]:
        print(
            f"batch {r['batch']:4d}: core {r['core']['median_us']:7.2f} us  wrapper {r['wrapper']['median_us']:7.2f} us"
            f"  (p90 {r['wrapper']['p90_us']:.2f} us, {r['page_events_per_step']:.1f} page events/step)"
        )
    if args.sglang:
        result["allocator"] = [bench_allocator(b, min(args.steps, 1000)) for b in args.batches]
        for r in result["allocator"]:
            print(
                f"batch {r['batch']:4d}: SGLang alloc_decode {r['sglang_alloc_decode']['median_us']:7.1f} us"
                f"  OScaR alloc_decode+step {r['oscar_alloc_decode_plus_step']['median_us']:7.1f} us"
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runtime_step.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
