"""Server soak, long form (issue 16 item 1; the short form is `tests/test_sglang_soak.py`, the same
driver: `tests/sglang_support/soak.py`). Launches one `--kv-cache oscar` server with a small pool,
runs the control conversation, the soak (bounded by --requests and --minutes), the checks after it
and the control again; prints and writes the figures (`OUT/soak-NAME.json`, the server log next to
it). Exit status 0 when every check passed, 1 otherwise (the JSON lists them under `problems`).

CPU (this machine; SmolLM2 from the harness, fp32, 1024-token pool of 32-token pages):

    .venv/bin/python benches/serving/soak.py --requests 100000 --minutes 12 --out /tmp/soak

GPU (the H200 of benches/serving, after `bash benches/serving/run_gpu.sh setup`): the
Llama-3.1-8B shape with dummy weights and no tokenizer (token ids only), launched like bench.py's
servers; see benches/serving/soak_gpu.sh:

    python3 benches/serving/soak.py --gpu --model /tmp/llama-3.1-8b-config --minutes 3 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benches" / "serving"))

from sglang_support import soak  # noqa: E402

CPU_ARGS, CPU_POOL_TOKENS = soak.CPU_ARGS, soak.CPU_POOL_TOKENS


def launch_cpu(log_dir: Path):
    from sglang_support.harness import converted_model, launch, server_env

    return launch(converted_model(), *CPU_ARGS, max_total_tokens=CPU_POOL_TOKENS, env=soak.hooks_env(server_env()))


def launch_gpu(model: str, out: Path, pool_tokens: int, max_running: int, bits: int):
    import serve

    env, _ = serve.harness_env()
    args = serve.server_args(model, kv_cache="oscar", bits=bits, cuda_graph=True, mem_fraction=0.5, dummy=True,
                             extra=("--max-total-tokens", str(pool_tokens), "--max-running-requests",
                                    str(max_running), "--enable-metrics"))
    env = soak.hooks_env(env)
    env["SGLANG_TEST_RETRACT_INTERVAL"] = "50"
    return serve.launch(args, log_path=out / "soak-server.log", env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=100_000, help="client operations at most")
    p.add_argument("--minutes", type=float, default=12.0, help="soak wall time at most (startup and checks not counted)")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/oscar-soak")
    p.add_argument("--name", default=None)
    p.add_argument("--gpu", action="store_true", help="an H200 server as benches/serving/bench.py launches it")
    p.add_argument("--model", default="/tmp/llama-3.1-8b-config", help="--gpu: the model folder (config.json)")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--pool-tokens", type=int, default=32768, help="--gpu: --max-total-tokens")
    p.add_argument("--max-running", type=int, default=32, help="--gpu: --max-running-requests")
    a = p.parse_args(argv)
    # `timeout` (soak_gpu.sh) sends SIGTERM: exit through the `finally` that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = a.name or ("gpu" if a.gpu else "cpu")
    if a.gpu:
        knobs = soak.Knobs(requests=a.requests, minutes=a.minutes, clients=max(a.clients, 16), seed=a.seed,
                           text=False, vocab=128256, max_new=64, huge_n=256, burst=24, burst_len=1500,
                           burst_new=256, timeout=600)
    else:
        knobs = soak.Knobs(requests=a.requests, minutes=a.minutes, clients=a.clients, seed=a.seed)
    t0 = time.monotonic()
    server = launch_gpu(a.model, out, a.pool_tokens, a.max_running, a.bits) if a.gpu else launch_cpu(out)
    try:
        started = time.monotonic() - t0
        print(f"[soak {name}] server up in {started:.0f}s", flush=True)
        report = soak.soak(server, knobs)
        report["startup_s"] = round(started, 1)
        report["total_s"] = round(time.monotonic() - t0, 1)
        (out / f"soak-{name}.log").write_text(server.log())
    finally:
        server.stop()
    (out / f"soak-{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    brief = {k: report.get(k) for k in ("wall_s", "operations", "served", "aborted", "http_4xx", "unexpected",
                                        "evicted_pages", "retractions", "retractions_in_answers",
                                        "peak_pages_in_use", "peak_staging_in_use", "peak_running_reqs",
                                        "peak_waiting_reqs", "leaked_pages", "leaked_tokens_sglang", "control")}
    print(json.dumps(brief, indent=1))
    print(json.dumps(report["by_kind"], indent=1))
    for problem in report["problems"]:
        print("PROBLEM:", problem)
    print(f"[soak {name}] {'passed' if not report['problems'] else 'FAILED'}; figures in {out / f'soak-{name}.json'}")
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
