"""The server soak, short form (issue 16 item 1; the long form and the figures:
`benches/serving/soak.py`, benches/results/reliability.md). A real `--kv-cache oscar` CPU server
(SmolLM2, fp32, a 1024-token pool of 32-token pages, 8 running requests) driven by
`sglang_support.soak` for at most 120 client operations and 50 s: multi-turn chats sharing a system
prompt, `/generate` over the shared prefix, streams closed mid-way, `/abort_request`, clients that
disconnect without reading, every bad request of `soak.BAD` once, and a burst larger than the pool.

Passes when: no request got a 5xx, a connection error or a timeout; the server still answers; once
idle, `/metrics` and `/server_info` show no open page, no lock and no staging page in use, every
sealed page in the radix tree and every other page free, SGLang's allocator agreeing; after
`/flush_cache` every page is free (no leak); the control conversation run before and after gives the
same greedy tokens, logprobs, cached prefix and sealed page bytes; the log holds no traceback. And
the workload did what it is for: every kind ran, pages were evicted, requests were retracted and
aborted, and the requests that used to kill SGLang 0.5.23's scheduler got a 400.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sglang")

from sglang_support import soak  # noqa: E402
from sglang_support.harness import converted_model, launch, server_env  # noqa: E402

pytestmark = pytest.mark.slow


def test_server_soak_short() -> None:
    # Retraction checks every 5th forward, not RETRACT_ENV's 20: the ~37 operations of this short run
    # gave 3 retractions at 20 on one CI run and none on another (session 38), when the check never
    # met a decode batch of two or more requests.
    knobs = soak.Knobs(requests=120, minutes=50 / 60, clients=6, max_new=12, huge_n=32, burst=8, burst_len=120,
                       burst_new=16)
    with launch(converted_model(), *soak.CPU_ARGS, max_total_tokens=soak.CPU_POOL_TOKENS,
                env=soak.hooks_env(server_env(), retract_interval=5)) as server:
        report = soak.soak(server, knobs)
    print(json.dumps({k: v for k, v in report.items() if k != "knobs"}, indent=1))
    assert not report["problems"], "\n".join(report["problems"])
    kinds = {k.split(":")[0] for k in report["by_kind"]}
    assert kinds == set(soak.KINDS), report["by_kind"]
    assert {f"bad:{name}" for name, _ in soak.BAD} <= set(report["by_kind"]), report["by_kind"]
    # The requests that crashed SGLang 0.5.23's scheduler (the whole server) get a 400 instead.
    for name in ("empty_text", "oov_id", "negative_id"):
        assert set(report["by_kind"][f"bad:{name}"]) == {"http_400"}, report["by_kind"]
    assert report["evicted_pages"] > 0, report
    assert (report["retractions"] or 0) > 0, report
    assert report["aborted"] >= 3 and report["served"] > 0, report
    assert report["leaked_pages"] == 0 and report["leaked_tokens_sglang"] == 0, report
    assert report["control"]["identical"] and report["control"]["sealed_pages_compared"] > 0, report
