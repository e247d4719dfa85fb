"""Serving benchmark: BF16 SGLang (`--kv-cache default`, Triton attention) against `--kv-cache oscar`,
same machine, same flags, one server at a time (benches/results/serving.md says how it was run).

    python benches/serving/bench.py run --name int2 --kv-cache oscar --bits 2 --workloads long-decode,sweep \
        --model DIR --out OUTDIR       # one server, its workloads; writes OUTDIR/NAME.json and NAME.log
    python benches/serving/bench.py report OUTDIR... --results benches/results   # serving.json/.md/.png

Workloads (each request: random token ids from a seeded generator, `ignore_eos`, greedy):
- `long-decode`: as many `--long-input`-token requests (default 32768, 256 output tokens) as the pool
  holds, all sent at once. Gives the pool tokens, the most requests that ran at once (SGLang's own
  `#running-req`), whether anything was retracted, and the steady decode throughput (SGLang's
  `gen throughput` log lines at that concurrency) next to the client-side output tokens / wall time.
- `sweep`: decode throughput against concurrency at `--sweep-input` tokens (default 4096).
- `multi-turn`: agent conversations sharing a long system prompt, growing turn by turn. Reports
  `cached_tokens`, time to first token of turns 2+ (streamed) and how many conversations were still
  cached when they came back.
- `graph-check`: the same greedy requests' output ids, for comparing CUDA-graph and eager servers.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import serve  # noqa: E402
from sglang_support.soak import find_key, pool_tokens  # noqa: E402  (stdlib only, shared with the soak)

DECODE_LINE = re.compile(
    r"Decode batch.*?#running-req:\s*(?P<running>\d+),\s+#token:\s*(?P<tokens>\d+),\s+"
    r"token usage:\s*(?P<usage>[0-9.]+),.*?gen throughput \(token/s\):\s*(?P<tps>[0-9.]+),\s+"
    r"#queue-req:\s*(?P<queue>\d+)")
RETRACT = re.compile(r"retract", re.IGNORECASE)


def decode_lines(log: str) -> list[dict[str, float]]:
    """SGLang's periodic decode log lines as numbers."""
    return [{k: float(v) for k, v in m.groupdict().items()} for m in DECODE_LINE.finditer(log)]


def retractions(log: str) -> int:
    return sum(1 for line in log.splitlines() if RETRACT.search(line) and "Decode batch" not in line)


def steady_throughput(lines: list[dict[str, float]], running: int) -> float | None:
    """Median `gen throughput` of the decode log lines with `running` requests and an empty queue
    (the first line at that concurrency is dropped: its window can include prefill time)."""
    tps = [x["tps"] for x in lines if int(x["running"]) == running and x["queue"] == 0][1:]
    return statistics.median(tps) if tps else None


class Ids:
    """Deterministic random prompts (token ids in [1000, vocab)), one stream per request key."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab, self.seed = vocab, seed

    def make(self, key: int, n: int) -> list[int]:
        import random

        r = random.Random(self.seed * 1_000_003 + key)
        return [r.randrange(1000, self.vocab) for _ in range(n)]


def generate(server: serve.Server, ids: list[int], max_new: int, *, logprobs: bool = False) -> dict[str, Any]:
    payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                     "ignore_eos": True}}
    if logprobs:
        payload["return_logprob"] = True
    t0 = time.monotonic()
    r = server.post("/generate", payload, timeout=1800)
    r["client_s"] = time.monotonic() - t0
    return r


def generate_stream(server: serve.Server, ids: list[int], max_new: int) -> dict[str, Any]:
    """Streamed /generate: the time to the first streamed chunk, and the final meta_info."""
    payload = {"input_ids": ids, "stream": True,
               "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(server.url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, last = None, None
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.monotonic() - t0
            last = json.loads(line[5:])
    if last is None:
        raise RuntimeError("empty stream")
    return {"ttft_s": ttft, "total_s": time.monotonic() - t0, "output_ids": last.get("output_ids"),
            "meta_info": last["meta_info"]}


def _parallel(fn: Any, items: list[Any], workers: int) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        return list(ex.map(fn, items))


def _profile_summary(folder: Path, tag: str, wait_s: float = 120) -> dict[str, Any]:
    """The summary of the trace `tag` (written by the scheduler once its steps are done)."""
    import trace_summary

    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        found = sorted(folder.glob(f"{tag}*.trace.json.gz"))
        if found:
            size = -1
            while size != found[0].stat().st_size:  # still being written
                size = found[0].stat().st_size
                time.sleep(2.0)
            return {"trace": found[0].name, **trace_summary.summarize(found[0])}
        time.sleep(1.0)
    return {"error": f"no trace {tag}*.trace.json.gz in {folder} after {wait_s:.0f}s"}


def long_decode(server: serve.Server, ids: Ids, *, input_len: int, output_len: int, margin: float) -> dict[str, Any]:
    pool = pool_tokens(server.get("/server_info"))
    n = max(1, int(margin * pool // (input_len + output_len)))
    log0 = len(server.log())
    t0 = time.monotonic()
    res = _parallel(lambda i: generate(server, ids.make(10_000 + i, input_len), output_len), list(range(n)), n)
    wall = time.monotonic() - t0
    log = server.log()[log0:]
    lines = decode_lines(log)
    running = int(max((x["running"] for x in lines), default=0))
    out_tokens = sum(len(r["output_ids"]) for r in res)
    return {"workload": "long-decode", "pool_tokens": pool, "input_len": input_len, "output_len": output_len,
            "requests": n, "max_running": running, "retractions": retractions(log),
            "max_concurrent_32k": running if input_len == 32768 and retractions(log) == 0 else None,
            "concurrency": running, "output_tok_s": steady_throughput(lines, running),
            "client_output_tok_s": out_tokens / wall, "wall_s": wall,
            "decode_lines": [x for x in lines if int(x["running"]) == running]}


def sweep(server: serve.Server, ids: Ids, *, input_len: int, output_len: int, concurrencies: list[int]) -> list[dict[str, Any]]:
    pool = pool_tokens(server.get("/server_info"))
    rows = []
    for c in concurrencies:
        if c * (input_len + output_len) > 0.95 * pool:
            rows.append({"workload": "sweep", "concurrency": c, "input_len": input_len, "output_len": output_len,
                         "output_tok_s": None, "skipped": f"{c} x {input_len + output_len} tokens > 95% of the pool"})
            continue
        log0 = len(server.log())
        t0 = time.monotonic()
        res = _parallel(lambda i: generate(server, ids.make(20_000 + 1000 * c + i, input_len), output_len),
                        list(range(c)), c)
        wall = time.monotonic() - t0
        lines = decode_lines(server.log()[log0:])
        rows.append({"workload": "sweep", "concurrency": c, "input_len": input_len, "output_len": output_len,
                     "pool_tokens": pool, "output_tok_s": steady_throughput(lines, c),
                     "client_output_tok_s": sum(len(r["output_ids"]) for r in res) / wall, "wall_s": wall})
    return rows


PREFILL_LINE = re.compile(r"^\[(?P<at>[^\]]+)\].*Prefill batch.*?#new-seq:\s*(?P<seqs>\d+),\s+#new-token:\s*(?P<new>\d+),"
                          r"\s+#cached-token:\s*(?P<cached>\d+)", re.MULTILINE)


def prefill_lines(log: str) -> list[dict[str, Any]]:
    """SGLang's `Prefill batch` log lines: their timestamp and the new / cached token counts."""
    return [{"at": m["at"], "seqs": int(m["seqs"]), "new": int(m["new"]), "cached": int(m["cached"])}
            for m in PREFILL_LINE.finditer(log)]


def profile_steps(server: serve.Server, out_dir: Path, steps: int, tag: str) -> None:
    """Ask the server to profile its next `steps` forward steps (SGLang's /start_profile: torch
    profiler, CPU and GPU activities, no stacks or shapes), written under `out_dir` as
    `tag-TP-0.trace.json.gz` when the last step ends."""
    out_dir.mkdir(parents=True, exist_ok=True)
    server.post("/start_profile", {"output_dir": str(out_dir.resolve()), "num_steps": steps, "activities": ["CPU", "GPU"],
                                   "with_stack": False, "record_shapes": False, "profile_id": tag})


def multi_turn(server: serve.Server, ids: Ids, *, conversations: int, system_len: int, history_len: int,
               turns: int, user_len: int, output_len: int, profile: tuple[int, int, Path] | None = None) -> dict[str, Any]:
    """`conversations` agents share a `system_len`-token system prompt, each with its own
    `history_len`-token history; every turn appends the answer and `user_len` new tokens. All
    conversations run turn t before any runs turn t+1 (so the pool sees all of them). `profile`
    (turn, steps, folder): the first `steps` forward steps of that turn go through the torch
    profiler, summarised into the turn's entry (`trace_summary.summarize`)."""
    system = ids.make(1, system_len)
    convs = [system + ids.make(30_000 + c, history_len) for c in range(conversations)]
    per_turn: list[dict[str, Any]] = []
    for t in range(turns):
        prompts = [conv + ids.make(40_000 + 100 * c + t, user_len) for c, conv in enumerate(convs)]
        traced = profile is not None and profile[0] == t + 1
        tag = f"turn{t + 1}-{int(time.time())}"
        if traced:
            profile_steps(server, profile[2], profile[1], tag)
        log0 = len(server.log())
        res = _parallel(lambda p: generate_stream(server, p, output_len), prompts, conversations)
        cached = [int(r["meta_info"].get("cached_tokens", 0)) for r in res]
        reusable = [len(convs[c]) for c in range(conversations)]  # what an earlier turn wrote
        per_turn.append({
            "turn": t + 1, "prompt_tokens": [len(p) for p in prompts], "cached_tokens": cached,
            "ttft_s_median": statistics.median(r["ttft_s"] for r in res),
            "ttft_s_max": max(r["ttft_s"] for r in res),
            # a conversation "stayed cached" if its earlier turns (beyond the shared system prompt)
            # came back from the radix cache: at least half of what it had written before
            "conversations_cached": sum(1 for c, r in zip(cached, reusable) if t > 0 and c >= system_len + (r - system_len) // 2),
            "prefill_batches": prefill_lines(server.log()[log0:]),
        })
        if traced:
            per_turn[-1]["profile"] = _profile_summary(profile[2], tag)
        convs = [p + list(r["output_ids"] or []) for p, r in zip(prompts, res)]
    later = per_turn[1:]
    return {"workload": "multi-turn", "conversations": conversations, "system_len": system_len,
            "history_len": history_len, "turns": turns, "user_len": user_len, "output_len": output_len,
            "per_turn": per_turn,
            "cached_fraction_turns2plus": (sum(sum(x["cached_tokens"]) for x in later)
                                           / max(1, sum(sum(x["prompt_tokens"]) for x in later))),
            "ttft_s_median_turns2plus": statistics.median(x["ttft_s_median"] for x in later) if later else None,
            "conversations_cached_last_turn": later[-1]["conversations_cached"] if later else None,
            "concurrency": conversations}


def graph_check(server: serve.Server, ids: Ids, *, prompts: int, input_len: int, output_len: int,
                batch: list[int]) -> dict[str, Any]:
    """Greedy output ids and logprobs of fixed prompts (compared across servers by `report`), and
    decode throughput at the given batch sizes."""
    outs = _parallel(lambda i: generate(server, ids.make(50_000 + i, input_len), output_len, logprobs=True),
                     list(range(prompts)), prompts)
    speed = {}
    for b in batch:
        log0 = len(server.log())
        t0 = time.monotonic()
        res = _parallel(lambda i: generate(server, ids.make(60_000 + 1000 * b + i, input_len), 256), list(range(b)), b)
        wall = time.monotonic() - t0
        lines = decode_lines(server.log()[log0:])
        speed[str(b)] = {"output_tok_s": steady_throughput(lines, b),
                         "client_output_tok_s": sum(len(r["output_ids"]) for r in res) / wall}
    return {"workload": "graph-check", "output_ids": [o["output_ids"] for o in outs],
            "output_logprobs": [[t[0] for t in o["meta_info"]["output_token_logprobs"]] for o in outs],
            "speed": speed}


def cache_check(server: serve.Server, ids: Ids, *, prompts: int, input_len: int, output_len: int) -> dict[str, Any]:
    """The same prompts cold (one at a time), warm (a full prefix-cache hit), after `/flush_cache`
    and cold in one batch (issue 20): per case vs cold, how many prompts give identical greedy ids,
    the first diverging token and the largest |delta log-prob| over the tokens before it."""
    ps = [ids.make(70_000 + i, input_len) for i in range(prompts)]

    def one_by_one() -> list[dict[str, Any]]:
        return [generate(server, p, output_len, logprobs=True) for p in ps]

    server.post("/flush_cache", {})
    cases = {"cold": one_by_one(), "warm": one_by_one()}
    server.post("/flush_cache", {})
    cases["flushed"] = one_by_one()
    server.post("/flush_cache", {})
    cases["batched"] = _parallel(lambda p: generate(server, p, output_len, logprobs=True), ps, len(ps))
    res: dict[str, Any] = {"workload": "cache-check", "prompts": prompts, "input_len": input_len,
                           "output_len": output_len}
    for name in ("warm", "flushed", "batched"):
        same, first, dlp, cached = 0, [], 0.0, []
        for a, b in zip(cases["cold"], cases[name]):
            ia, ib = a["output_ids"], b["output_ids"]
            k = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), len(ia))
            same += k == len(ia)
            first.append(k)
            la = [t[0] for t in a["meta_info"]["output_token_logprobs"]][:k]
            lb = [t[0] for t in b["meta_info"]["output_token_logprobs"]][:k]
            dlp = max([dlp] + [abs(x - y) for x, y in zip(la, lb)])
            cached.append(int(b["meta_info"].get("cached_tokens", 0)))
        res[name] = {"identical": same, "first_divergence": first, "max_abs_dlogprob_before": dlp,
                     "cached_tokens": cached}
    return res


def cmd_run(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env, stand_in = serve.harness_env()
    compile_log = out / f"compile-{a.name}.jsonl" if a.compile_log else None
    if compile_log is not None:  # every Triton compile of the server's processes (oscar_sgl.compile_log)
        compile_log.unlink(missing_ok=True)
        env["OSCAR_SGL_COMPILE_LOG"] = str(compile_log)
    if a.fresh_triton_cache:  # nothing compiled by an earlier server on this machine is reused
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{a.name}-")
    args = serve.server_args(a.model, kv_cache=a.kv_cache, bits=a.bits, cuda_graph=not a.eager,
                             mem_fraction=a.mem_fraction, dummy=not a.trained, extra=tuple(a.extra or ()))
    ids = Ids(vocab=a.vocab)
    result: dict[str, Any] = {"name": a.name, "kv_cache": a.kv_cache, "bits": a.bits if a.kv_cache == "oscar" else 16,
                              "cuda_graph": not a.eager, "stand_in": stand_in, "args": args, "workloads": []}
    t0 = time.monotonic()
    with serve.launch(args, log_path=out / f"{a.name}.log", env=env) as server:
        result["startup_s"] = server.started_s
        ready_at = time.time()
        info = server.get("/server_info")
        result["pool_tokens"] = pool_tokens(info)
        result["oscar"] = find_key(info, "oscar")
        print(f"[{a.name}] up in {server.started_s:.0f}s, pool {result['pool_tokens']} tokens", flush=True)
        for w in a.workloads.split(","):
            t1 = time.monotonic()
            if w == "long-decode":
                r = long_decode(server, ids, input_len=a.long_input, output_len=a.long_output, margin=a.margin)
                result["workloads"].append(r)
            elif w == "sweep":
                result["workloads"] += sweep(server, ids, input_len=a.sweep_input, output_len=a.sweep_output,
                                             concurrencies=[int(c) for c in a.concurrency.split(",")])
            elif w == "multi-turn":
                # each multi-turn of one run draws its own prompts (the first one: those of every run)
                k = sum(1 for x in result["workloads"] if x.get("workload") == "multi-turn")
                prof = (a.profile_turn, a.profile_steps, out / f"profile-{a.name}-mt{k}") if a.profile_turn else None
                r = multi_turn(server, Ids(vocab=a.vocab, seed=k), conversations=a.conversations,
                               system_len=a.system_len, history_len=a.history_len, turns=a.turns,
                               user_len=a.user_len, output_len=a.turn_output, profile=prof)
                result["workloads"].append({**r, "round": k, "after": [x.get("workload") for x in result["workloads"]]})
            elif w == "graph-check":
                result["workloads"].append(graph_check(server, ids, prompts=8, input_len=1000, output_len=32,
                                                       batch=[int(b) for b in a.graph_batch.split(",")]))
            elif w == "cache-check":
                result["workloads"].append(cache_check(server, ids, prompts=4, input_len=1000, output_len=64))
            else:
                raise SystemExit(f"unknown workload {w!r}")
            print(f"[{a.name}] {w}: {time.monotonic() - t1:.0f}s "
                  f"{json.dumps(_brief(result['workloads'][-1]))}", flush=True)
        result["final_info_oscar"] = find_key(server.get("/server_info"), "oscar")
        result["stubbed_sgl_kernel_names_in_log"] = sorted(set(re.findall(r"sgl_kernel\.(\w+) was called", server.log())))
    result["total_s"] = time.monotonic() - t0
    if compile_log is not None:
        from oscar_sgl.compile_log import read, summarize

        result["triton_compiles"] = summarize(read(compile_log), split_at=ready_at)
        c = result["triton_compiles"]
        print(f"[{a.name}] Triton compiles: {c['before']['compiles']} ({c['before']['seconds']} s) before ready, "
              f"{c['after']['compiles']} ({c['after']['seconds']} s) after", flush=True)
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1))
    return 0


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("pool_tokens", "requests", "max_running", "retractions", "output_tok_s", "client_output_tok_s",
            "concurrency", "cached_fraction_turns2plus", "ttft_s_median_turns2plus",
            "conversations_cached_last_turn", "speed", "warm", "flushed", "batched")
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k in keep}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def rows_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """serving.json rows: one per (kv_cache, bits, workload[, concurrency]) of the CUDA-graph runs,
    plus the eager rows of graph-check; numbers as measured."""
    rows = []
    for run in runs:
        base = {"kv_cache": run["kv_cache"], "bits": run["bits"], "cuda_graph": run["cuda_graph"],
                "pool_tokens": run["pool_tokens"]}
        rows.append({**base, "workload": "capacity", "max_concurrent_32k": next(
            (w.get("max_concurrent_32k") for w in run["workloads"] if w["workload"] == "long-decode"), None)})
        for w in run["workloads"]:
            row = {**base, **{k: v for k, v in w.items() if k not in ("decode_lines", "per_turn", "output_ids",
                                                                     "output_logprobs")}}
            if w["workload"] == "graph-check":
                for b, s in w["speed"].items():
                    rows.append({**base, "workload": "decode-batch", "concurrency": int(b), **s})
                continue
            rows.append(row)
    return rows


def compare_outputs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Greedy ids and logprobs of two graph-check workloads (e.g. CUDA graphs vs eager)."""
    ga = next(w for w in a["workloads"] if w["workload"] == "graph-check")
    gb = next(w for w in b["workloads"] if w["workload"] == "graph-check")
    same_ids = sum(x == y for x, y in zip(ga["output_ids"], gb["output_ids"]))
    diffs = [abs(p - q) for x, y in zip(ga["output_logprobs"], gb["output_logprobs"]) for p, q in zip(x, y)
             if p is not None and q is not None]
    return {"prompts": len(ga["output_ids"]), "identical_ids": same_ids, "max_abs_logprob_diff": max(diffs, default=0.0)}


def cmd_report(a: argparse.Namespace) -> int:
    runs = []
    for d in a.inputs:
        runs += [json.loads(p.read_text()) for p in sorted(Path(d).glob("*.json")) if p.name != "serving.json"]
    runs = [r for r in runs if "workloads" in r]
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": a.gpu, "commit": a.commit, "rows": rows_of(runs)}
    by = {r["name"]: r for r in runs}
    if "int2" in by and "int2-eager" in by:
        doc["cuda_graph_vs_eager_int2"] = compare_outputs(by["int2"], by["int2-eager"])
    (res / "serving.json").write_text(json.dumps(doc, indent=1) + "\n")
    _plot(doc["rows"], res / "serving.png")
    print(json.dumps(doc, indent=1)[:3000])
    return 0


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["workload"] == "sweep" and r.get("output_tok_s"):
            label = "BF16 (Triton)" if r["kv_cache"] == "default" else f"OScaR INT{r['bits']}"
            series.setdefault(label, []).append((r["concurrency"], r["output_tok_s"]))
    for label, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("decode output tokens/s")
    ax.set_title("Llama-3.1-8B shape, H200, 4K-token prompts")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--kv-cache", choices=("default", "oscar"), required=True)
    r.add_argument("--bits", type=int, default=2)
    r.add_argument("--eager", action="store_true", help="no decode CUDA graphs")
    r.add_argument("--model", required=True, help="model folder (config.json only with dummy weights)")
    r.add_argument("--trained", action="store_true", help="real weights and tokenizer (no --load-format dummy)")
    r.add_argument("--vocab", type=int, default=128256)
    r.add_argument("--mem-fraction", type=float, default=0.5)
    r.add_argument("--workloads", default="long-decode,sweep,multi-turn")
    r.add_argument("--long-input", type=int, default=32768)
    r.add_argument("--long-output", type=int, default=256)
    r.add_argument("--margin", type=float, default=0.97, help="fraction of the pool the long-decode requests fill")
    r.add_argument("--sweep-input", type=int, default=4096)
    r.add_argument("--sweep-output", type=int, default=128)
    r.add_argument("--concurrency", default="1,8,32,64,128")
    r.add_argument("--conversations", type=int, default=48)
    r.add_argument("--system-len", type=int, default=2048)
    r.add_argument("--history-len", type=int, default=8192)
    r.add_argument("--turns", type=int, default=3)
    r.add_argument("--user-len", type=int, default=256)
    r.add_argument("--turn-output", type=int, default=64)
    r.add_argument("--graph-batch", default="1,64")
    r.add_argument("--profile-turn", type=int, default=0,
                   help="multi-turn: run this turn's first --profile-steps forward steps under the torch profiler "
                        "(SGLang's /start_profile) and summarise the trace into the result (0: off)")
    r.add_argument("--profile-steps", type=int, default=4)
    r.add_argument("--compile-log", action="store_true",
                   help="log every Triton compile of the server (OSCAR_SGL_COMPILE_LOG) to OUT/compile-NAME.jsonl and "
                        "summarise it into the result: per kernel, before the server was ready and after")
    r.add_argument("--fresh-triton-cache", action="store_true",
                   help="a new empty TRITON_CACHE_DIR for this server (startup times comparable between servers run "
                        "one after another on the same machine)")
    r.add_argument("--out", required=True)
    r.add_argument("extra", nargs="*", help="more server flags, after --")
    rp = sub.add_parser("report")
    rp.add_argument("inputs", nargs="+")
    rp.add_argument("--results", default="benches/results")
    rp.add_argument("--gpu", default="NVIDIA H200")
    rp.add_argument("--commit", required=True)
    a = p.parse_args(argv)
    return cmd_run(a) if a.cmd == "run" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
