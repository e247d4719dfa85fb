"""Passkey retrieval through the real SGLang CPU server: `--kv-cache oscar` (INT2, position prefill,
the server's default) and `--kv-cache default` (SGLang's own fp32 KV, torch_native attention),
launched side by side on the converted SmolLM2 (`oscar-sgl serve --device cpu`, as the tests and
`scripts/sglang_demo.py` do), then one `oscar-sgl eval needle --server URL --server URL` run sending
both the same prompts (token ids, greedy, EOS ignored) next to the local full-precision and INT2
`oscar` OscarCache runs in the same prefill mode (the reference the OScaR server must match).

    python benches/needle/run_server.py [--lengths 1024 2048] [--depths 0.1 0.5 0.9] [--trials 1] \
        [--json benches/results/needle_server.json] [--png benches/results/needle_server.png]

Both servers are stopped by their PIDs at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from sglang_support.harness import converted_model, start_cpu_server  # noqa: E402

from oscar_sgl import cli  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", nargs="+", default=["1024", "2048"])
    p.add_argument("--depths", nargs="+", default=["0.1", "0.5", "0.9"])
    p.add_argument("--trials", default="1")
    p.add_argument("--bits", default="2", choices=("2", "4"))
    p.add_argument("--oscar-format", default="--oscar-k-group 32 --oscar-v-group 32 --oscar-key-ranges group "
                   "--oscar-offset integer --oscar-clip none", metavar="FLAGS",
                   help="the OScaR server's format flags, one string (default: the paper's format, the default when "
                   "needle.md was measured; '' for the server's own defaults)")
    p.add_argument("--json", default=str(ROOT / "benches/results/needle_server.json"))
    p.add_argument("--png", default=str(ROOT / "benches/results/needle_server.png"))
    a = p.parse_args()
    model = converted_model()
    total = max(int(n) for n in a.lengths) + 256
    t0 = time.monotonic()
    servers = [
        start_cpu_server(model, "--kv-cache", "oscar", "--oscar-bits", a.bits, *a.oscar_format.split(), "--max-running-requests", "2",
                         max_total_tokens=total),
        start_cpu_server(model, "--attention-backend", "torch_native", "--max-running-requests", "2",
                         max_total_tokens=total),
    ]
    try:
        for s in servers:
            s.wait_healthy(600)
        print(f"both servers healthy after {time.monotonic() - t0:.0f} s: {servers[0].url} (oscar), "
              f"{servers[1].url} (default)", flush=True)
        argv = ["eval", "needle", "--lengths", *a.lengths, "--depths", *a.depths, "--trials", a.trials,
                "--bits", a.bits, "--methods", "oscar", "--prefill", "position", "--threads", "1",
                "--server", servers[0].url, "--server", servers[1].url, "--json", a.json, "--png", a.png]
        print("oscar-sgl " + " ".join(argv), flush=True)
        t1 = time.monotonic()
        rc = cli.main(argv)
        print(f"needle run: {time.monotonic() - t1:.0f} s", flush=True)
        return rc
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    raise SystemExit(main())
