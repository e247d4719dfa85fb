"""What one more node of a decode step's CUDA graph costs on this GPU: the question behind
``long_gluon``'s empty launch (session 43: +3.1-3.7 us per step where its Gluon launch takes no
request, 1.12-1.30x a single request's step at 2K-32K tokens on an H100).

Each graph holds ``--steps`` copies of a step. The step is one small kernel (``_touch``: a stand-in
for the step's last launch) followed by:

- ``base``: nothing;
- ``empty G``: a launch of G one-warp programs that each load a length, find it short and exit
  (what ``long_gluon``'s Gluon launch does where no request is long);
- ``if-false``: a CUDA-graph conditional IF node (``torch.cuda.CUDAGraph.begin_capture_to_if_node``,
  what ``torch.cond`` captures to) whose predicate, a device bool written before the replay, is
  False, around the same launch;
- ``if-true``: the same node with the predicate True (the launch runs, its programs exit);
- ``if-false, predicate in the graph``: the predicate computed in the graph from the lengths
  (``(lens >= N).any()``) before the node.

The time per step minus ``base``'s is what the node costs. Needs a CUDA GPU (and, for the
conditional rows, torch with CUDA-graph conditional nodes, CUDA >= 12.4: torch 2.14 has them, the
device machine's torch 2.11 does not, and the script then says so and times the other rows). H100,
session 44 (benches/results/kernels_s44/call_c/): an empty launch of 528 / 1,584 one-warp programs
costs 1.18 / 1.61 us per step. From the repo root:

    python3 benches/kernels/graph_node_cost.py --out /tmp/graph_node_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _touch(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


@triton.jit
def _exit_if_short(len_ptr, long_min, out_ptr):
    if tl.load(len_ptr) >= long_min:
        tl.store(out_ptr + tl.program_id(0), 1.0)


def _capture(step, steps: int, warm: bool = True) -> torch.cuda.CUDAGraph:
    if warm:  # compiled and run once outside the capture (a conditional node exists only in one)
        step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(steps):
            step()
    return g


def _time_per_step(g: torch.cuda.CUDAGraph, steps: int, replays: int) -> float:
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * steps)  # us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=64, help="steps per graph (default: %(default)s)")
    ap.add_argument("--replays", type=int, default=50, help="graph replays per timing (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="timings per row, interleaved; the median is kept")
    ap.add_argument("--programs", type=int, nargs="+", default=None,
                    help="program counts of the empty launch (default: 4 and 12 per SM)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("graph_node_cost.py: needs a CUDA GPU", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = a.programs or [4 * sms, 12 * sms]
    x = torch.zeros(4096, device=dev)
    lens = torch.tensor([2048], dtype=torch.int32, device=dev)
    sink = torch.zeros(max(programs), device=dev)
    long_min = 1 << 30

    def touch():
        _touch[(4,)](x, x.numel(), BLOCK=1024)

    def empty(n):
        _exit_if_short[(n,)](lens, long_min, sink, num_warps=1)

    has_if = hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node")
    pred_false = torch.zeros((), dtype=torch.bool, device=dev)
    pred_true = torch.ones((), dtype=torch.bool, device=dev)

    def if_node(pred, n):
        graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
        graph.begin_capture_to_if_node(pred)
        try:
            empty(n)
        finally:
            graph.end_capture_to_conditional_node()

    rows: dict[str, callable] = {"base": touch}
    for n in programs:
        rows[f"empty {n}"] = lambda n=n: (touch(), empty(n))
    if has_if:
        n = programs[-1]
        empty(n)  # compiled outside any capture
        rows[f"if-false {n}"] = lambda: (touch(), if_node(pred_false, n))
        rows[f"if-true {n}"] = lambda: (touch(), if_node(pred_true, n))
        rows[f"if-false {n}, predicate in the graph"] = lambda: (touch(), if_node((lens >= long_min).any(), n))

    graphs = {}
    for name, fn in rows.items():
        try:
            graphs[name] = _capture(fn, a.steps, warm=not name.startswith("if-"))
        except Exception as e:  # a torch / driver without this node kind: say so, time the rest
            print(f"{name}: not captured ({type(e).__name__}: {e})")
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(a.repeats):
        for name, g in graphs.items():
            times[name].append(_time_per_step(g, a.steps, a.replays))
    base = statistics.median(times["base"])
    name_gpu = torch.cuda.get_device_name(dev)
    print(f"{name_gpu}, torch {torch.__version__}, triton {triton.__version__}, {sms} SMs; {a.steps} steps per graph, "
          f"medians of {a.repeats}; conditional nodes: {'yes' if has_if else 'not in this torch'}")
    print("| step | us per step | minus base (us) |\n|---|---|---|")
    out = []
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t:.2f} | {t - base:+.2f} |")
        out.append({"row": name, "us": t, "minus_base_us": t - base, "repeats": ts})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": name_gpu, "torch": torch.__version__, "triton": triton.__version__, "sms": sms,
                       "steps": a.steps, "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
