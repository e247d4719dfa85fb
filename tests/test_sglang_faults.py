"""Faults in the middle of a step (issue 16 item 4), in process: SGLang's real radix caches, paged
allocator and `RadixAttention` layers over the real OScaR pool and backend (the small scheduler of
`test_sglang_prefix_sharing`, which checks every attention output against the reference), with an
exception injected into one layer of one forward: in a page's seal (`OscarKVPool._seal`, the torch
seal of the CPU path) or in the attention after the layer's write (`reference.decode_attention`).

SGLang 0.5.23's scheduler does not survive an exception in a forward (`run_scheduler_process`
logs it and SIGQUITs the server; `test_sglang_soak.py` checks that a server with a fault injected
this way exits and leaves no client waiting). What the plug-in guarantees is its own state, for a
caller that does survive the fault:

- abort: the failed batch's requests are aborted (their pages released); the failed step's seals
  are dropped, never applied to pages that may be handed out again; the flush after result
  processing runs, so an idle pool reports no open page, no staging page in use and no lock; the
  sealed pages shared through the radix tree keep their bytes; the next requests are exact; nothing
  leaks;
- retry: the same forward is run again (no new event): the step is kept as it was handed to the
  runtime, every layer writes and seals again, and the outputs and the sealed pages are those of a
  forward that never failed.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang_support.scheduler import KINDS  # noqa: E402
from test_sglang_prefix_sharing import LAYERS, P, Server, _prompt  # noqa: E402

from oscar_sgl import reference as ref  # noqa: E402
from oscar_sgl.sglang.metrics import after_step, snapshot  # noqa: E402


class Injected(RuntimeError):
    pass


class Fault:
    """Replace `obj.name` by a wrapper that raises `Injected` once, on the call that `when(call
    number, args)` picks, while armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, when: Any) -> None:
        self.armed, self.fired, self.calls = False, 0, 0
        real = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.calls += 1
                if when(self.calls, args):
                    self.armed = False
                    self.fired += 1
                    raise Injected(f"injected fault in {name}")
            return real(*args, **kwargs)

        monkeypatch.setattr(obj, name, wrapper)


def _fault(where: str, srv: Server, monkeypatch: pytest.MonkeyPatch) -> Fault:
    """`seal`: the seal of layer 1 (the last), before the layer ends: layer 0 has written and sealed.
    `attention`: the attention of layer 0, after its write and seals."""
    if where == "seal":
        return Fault(monkeypatch, srv.pool, "_seal", lambda n, args: args[0] == LAYERS - 1)
    return Fault(monkeypatch, ref, "decode_attention", lambda n, args: n == 1)


def _shared_prefix(srv: Server) -> list[int]:
    """A's whole pages in the tree: the sealed prefix later requests share."""
    shared = _prompt(1, 19)
    a = srv.admit(shared + [3, 3, 3], gen=4, chunk=32)
    srv.extend([a])
    for _ in range(4):
        srv.decode([a])
    srv.finish(a)
    srv.idle()
    return shared


def _two_requests(kind: str) -> tuple[Server, list[int], Any, Any]:
    """A server whose tree holds a shared prefix, and two admitted requests: B on that prefix, C on
    a prompt of its own."""
    srv = Server(kind, pages=24)
    shared = _shared_prefix(srv)
    b = srv.admit(shared + [9, 9], gen=12, chunk=32)
    c = srv.admit(_prompt(5, 13), gen=12, chunk=32)
    return srv, shared, b, c


def _run_to_page_end(srv: Server, reqs: list[Any]) -> None:
    """Prefill ``reqs``, then decode until the next decode step fills a page of the first request
    (its seal is planned)."""
    srv.extend(reqs)
    while (reqs[0].seq_len + 1) % P:
        srv.decode(reqs)


@pytest.mark.parametrize("where", ["seal", "attention"])
@pytest.mark.parametrize("kind", KINDS)
def test_fault_mid_step_then_abort(kind: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    srv, shared, b, c = _two_requests(kind)
    assert b.protected == 16
    shared_pages = sorted(set((b.row[:16] // P).tolist()))
    before = srv.codes_of(shared_pages)
    _run_to_page_end(srv, [b, c])
    fault = _fault(where, srv, monkeypatch)
    fault.armed = True
    with pytest.raises(Injected):
        srv.decode([b, c])  # the step that fills B's page: its seal is planned, one layer done
    assert fault.fired == 1
    step = srv.pool.oscar_step
    assert step.begun, "the fault did not land mid-step"

    # The scheduler aborts the failed batch; its result processing ends with the flush.
    srv.abort(b)
    srv.abort(c)
    after_step(srv.pool, srv.alloc)
    s = snapshot(srv.pool, srv.alloc)
    assert (s["pages"]["open"], s["locked_pages"], s["staging_pages_in_use"]) == (0, 0, 0), s
    assert s["pages"]["sealed"] == s["tree_pages"], s  # every page free or cached
    assert not step.begun and step.seal_host == [] and step.direct_host == []
    srv.rt.check()

    # The next requests are served exactly (every output checked against the reference), over the
    # same shared pages, whose bytes the fault did not touch.
    d = srv.admit(shared + [7], gen=10, chunk=32)
    e = srv.admit(_prompt(6, 21), gen=10, chunk=32)
    srv.extend([d, e])
    for _ in range(10):
        srv.decode([d, e])
    srv.finish(d)
    srv.finish(e)
    after = srv.codes_of(shared_pages)
    assert all(torch.equal(x, y) for x, y in zip(before, after)), "a shared sealed page was rewritten"
    srv.idle()
    srv.evict_all_and_check()


@pytest.mark.parametrize("where", ["seal", "attention"])
@pytest.mark.parametrize("kind", KINDS)
def test_fault_mid_step_then_retry(kind: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    srv, _, b, c = _two_requests(kind)
    _run_to_page_end(srv, [b, c])
    fault = _fault(where, srv, monkeypatch)

    failed: list[tuple[tuple, dict]] = []
    real_forward = srv.forward

    def forward(*args: Any, **kwargs: Any) -> None:
        try:
            real_forward(*args, **kwargs)
        except Injected:
            failed.append((args, kwargs))
            raise

    monkeypatch.setattr(srv, "forward", forward)
    fault.armed = True
    with pytest.raises(Injected):
        srv.decode([b, c])
    assert fault.fired == 1 and len(failed) == 1
    filled = int(b.row[b.seq_len - 1]) // P  # the page this step fills
    runtime_steps = srv.rt.stats().steps
    srv.steps -= 1  # the retry below is the same scheduler step: one runtime call in all
    srv.forward(*failed[0][0], **failed[0][1])  # the same batch again: outputs checked against the reference
    assert srv.rt.stats().steps == runtime_steps, "the retry made a second runtime step"
    assert srv.rt.page_info(filled).state == "sealed"
    # Later steps read the page sealed by the retry as codes: still exact to the reference.
    for _ in range(P // 2):
        srv.decode([b, c])
    srv.finish(b)
    srv.finish(c)
    srv.idle()
    srv.evict_all_and_check()


@pytest.mark.slow
def test_fault_mid_step_in_a_real_server_stops_it_loudly() -> None:
    """The same fault in a real CPU server (`--kv-cache oscar`): the test-only plug-in
    (`sglang_support/server_hooks`, `OSCAR_TEST_FAULT=LAYER:TOKEN`) raises in the OScaR backend at
    layer 5 of the first forward whose input holds token 31337, after layers 0-4 wrote and sealed.
    SGLang 0.5.23 does not catch an exception in a forward: its scheduler logs it and SIGQUITs the
    launcher, which stops the server. What must hold: the request gets an error, not a hang; the
    server exits (bounded) instead of staying half alive; the log names the fault."""
    import subprocess
    import time

    from sglang_support import soak
    from sglang_support.harness import converted_model, launch, server_env

    env = soak.hooks_env({**server_env(), "OSCAR_TEST_FAULT": "5:31337"})
    with launch(converted_model(), *soak.CPU_ARGS, max_total_tokens=soak.CPU_POOL_TOKENS, env=env) as server:
        ok, _ = soak.post(server.url, "/generate", {"input_ids": [1000, 2000, 3000], "sampling_params":
                                                    {"max_new_tokens": 2}}, 300)
        assert ok == 200, "the server must serve before the fault"
        status, body = soak.post(server.url, "/generate", {"input_ids": [1000, 31337, 2000] * 20,
                                                           "sampling_params": {"max_new_tokens": 4}}, 300)
        assert status != 200, (status, body)
        assert status is None or status >= 500, (status, body)  # no answer, or a server error
        try:
            server.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server is still running after the scheduler's fault:\n{server.log()[-3000:]}")
        time.sleep(1)
        log = server.log()
        assert "oscar-sgl test fault (OSCAR_TEST_FAULT=5:31337) in forward_extend at layer 5" in log, log[-3000:]
        assert "Scheduler hit an exception" in log, log[-3000:]
