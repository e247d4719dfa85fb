"""The OScaR pool + `OscarPagedAllocator` (Rust runtime) + `oscar` backend under SGLang's real radix
caches, on device="cpu".

A small scheduler (`sglang_support.scheduler`) drives SGLang's `RadixCache` and `UnifiedRadixCache`
the way SGLang's scheduler does (match -> lock -> alloc_extend / alloc_decode -> forward -> insert +
free duplicates -> relock / unlock -> evict). The forward is the real backend over the real pool: `init_forward_metadata` makes
the step's one runtime call, every layer writes its K/V into staging and seals the plan's pages, and
attention must equal the reference with the server's sealing schedule (by default the pages below
a token's own page read as codes, its page exact; with `--oscar-prefill exact` the pages sealed
before the step as codes, the rest exact). K/V/Q of a token depend only on (layer, token, position), so a
request that reuses another's sealed pages must get exactly the same answers as if it had computed
them. Shared sealed pages are never rewritten; eviction, abort and retraction give every page and
staging page back.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang_support.scheduler import KINDS, FakeScheduler, Req  # noqa: E402
from support.kernel_data import query_reference  # noqa: E402

from oscar_sgl.config import OscarConfig  # noqa: E402
from oscar_sgl.sglang.allocator import OscarPagedAllocator  # noqa: E402
from oscar_sgl.sglang.backend import create_oscar_backend  # noqa: E402

H, HQ, D, P, LAYERS, VOCAB = 2, 4, 16, 8, 2, 97
CFG = OscarConfig(bits=2, k_group=8, v_group=8, page_size=P)
SM = D ** -0.5


def _tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(LAYERS, VOCAB, H, D, generator=g)
    v = torch.randn(LAYERS, VOCAB, H, D, generator=g)
    q = torch.randn(LAYERS, VOCAB, HQ, D, generator=g)
    return k, v, q


KT, VT, QT = _tables()


def kvq(tokens: list[int], start: int, end: int, li: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[n, H, D]` K, V and `[n, HQ, D]` Q of positions start..end (a function of token and position)."""
    ids = torch.tensor([t % VOCAB for t in tokens[start:end]])
    pos = torch.arange(start, end, dtype=torch.float32)
    gain = (1.0 + 0.05 * pos)[:, None, None]  # token norms that vary, as real keys do
    return KT[li, ids] * gain, VT[li, ids], QT[li, ids]


def expected(tokens: list[int], pos: int, step_start: int, li: int, mode: str = "position") -> torch.Tensor:
    """The reference for the query at `pos` of a step starting at `step_start`: with `--oscar-prefill
    position` (the default) a function of the tokens up to `pos` alone, whatever the step."""
    k, v, q = kvq(tokens, 0, pos + 1, li)
    return query_reference(q[pos], k.transpose(0, 1), v.transpose(0, 1), pos, step_start, mode, CFG, SM)


class Server(FakeScheduler):
    """The fake scheduler over one OScaR pool + allocator + the `oscar` backend."""

    def __init__(self, kind: str, *, pages: int, max_requests: int = 4, metrics: bool = False,
                 prefill: str = "position") -> None:
        from oscar_sgl.sglang.pool import pool_class_for

        size = pages * P
        self.mode = prefill
        self.pool = pool_class_for(CFG, max_running_requests=max_requests, max_prefill_tokens=64,
                                   enable_metrics=metrics, prefill=prefill)(
            size, page_size=P, dtype=torch.float32, head_num=H, head_dim=D, layer_num=LAYERS,
            device="cpu", enable_memory_saver=False,
        )
        self.pool.oscar_set_key_rotation([(True,) * H] * LAYERS)  # no model here to compute it from
        alloc = OscarPagedAllocator(size, P, torch.float32, "cpu", self.pool, False, step=self.pool.oscar_step)
        self.r2t = ReqToTokenPool(size=8, max_context_len=256, device="cpu", enable_memory_saver=False)
        super().__init__(kind, alloc, self.r2t, page_size=P, gen_token=lambda i: 500 + 7 * i)
        runner = SimpleNamespace(device="cpu", req_to_token_pool=self.r2t, token_to_kv_pool=self.pool)
        self.backend = create_oscar_backend(runner)
        self.layers = [RadixAttention(HQ, D, SM, H, layer_id=i) for i in range(LAYERS)]
        self.checked = 0
        self.steps = 0

    def forward(self, reqs: list[Req], pre: list[int], seq: list[int], out: torch.Tensor, decode: bool) -> None:
        """The real backend over the real pool; every output checked against the reference."""
        for r, p, s in zip(reqs, pre, seq):
            self.r2t.req_to_token[r.rid, :s] = r.row[:s].to(torch.int32)
        fb = SimpleNamespace(
            req_pool_indices=torch.tensor([r.rid for r in reqs]), seq_lens=torch.tensor(seq),
            extend_prefix_lens=torch.tensor(pre), out_cache_loc=out,
        )
        self.backend.init_forward_metadata(fb)  # the step's one runtime call
        self.steps += 1
        for li, layer in enumerate(self.layers):
            parts = [kvq(r.tokens, p, s, li) for r, p, s in zip(reqs, pre, seq)]
            k = torch.cat([x[0] for x in parts])
            v = torch.cat([x[1] for x in parts])
            q = torch.cat([x[2] for x in parts]).reshape(-1, HQ * D)
            fwd = self.backend.forward_decode if decode else self.backend.forward_extend
            o = fwd(q, k, v, layer, fb).reshape(-1, HQ, D)
            at = 0
            for r, p, s in zip(reqs, pre, seq):
                for pos in range(p, s):
                    torch.testing.assert_close(o[at], expected(r.tokens, pos, p, li, self.mode), atol=3e-5, rtol=3e-5)
                    at += 1
                    self.checked += 1
        self.rt.check()

    def idle(self) -> None:
        self.pool.oscar_step.begin(new_step=True)
        self.pool.oscar_step.end_layer(LAYERS - 1, LAYERS)
        self.steps += 1

    def page_map(self) -> torch.Tensor:
        return self.pool.page_map

    def codes_of(self, pages: list[int]) -> list[torch.Tensor]:
        return [torch.cat([self.pool.k_codes[li][pages].flatten(), self.pool.v_codes[li][pages].flatten(),
                           self.pool.k_params[li][pages].flatten().view(torch.uint8),
                           self.pool.scales[li][pages].flatten().view(torch.uint8)]).clone()
                for li in range(LAYERS)]

    def evict_all_and_check(self) -> None:
        super().evict_all_and_check()
        assert self.rt.stats().steps == self.steps, "one runtime call per scheduler step, never per layer"


def _prompt(base: int, n: int) -> list[int]:
    return [base * 31 + i for i in range(n)]


@pytest.mark.parametrize("mode", ["position", "exact"])
@pytest.mark.parametrize("kind", KINDS)
def test_shared_prefix_eviction_abort(kind: str, mode: str) -> None:
    srv = Server(kind, pages=24, prefill=mode)
    shared = _prompt(1, 19)
    # A: chunked prefill (8 + 8 + 6 tokens), decode, finish: its whole pages go to the tree.
    a = srv.admit(shared + [3, 3, 3], gen=6, chunk=8)
    srv.chunked_prefill(a)
    for _ in range(6):
        srv.decode([a])
    srv.finish(a)
    srv.idle()
    assert srv.rt.stats().tree_pages == a.seq_len // P

    # B and C match A's first two pages (16 tokens): sealed, tree-owned, read as codes.
    b = srv.admit(shared + [9, 9], gen=7, chunk=32)
    c = srv.admit(shared + [5], gen=4, chunk=32)
    assert b.protected == c.protected == 16
    shared_pages = sorted(set((b.row[:16] // P).tolist()))
    for page in shared_pages:
        info = srv.rt.page_info(page)
        assert (info.state, info.owner) == ("sealed", "tree")
    before = srv.codes_of(shared_pages)
    srv.extend([b, c])  # one batch, two requests over the same sealed prefix
    for page in shared_pages:
        assert srv.rt.page_info(page).locks == 2
    for _ in range(4):
        srv.decode([b, c])
    srv.abort(c)  # C aborts mid-decode: its open page and staging page come back
    for _ in range(3):
        srv.decode([b])
    after = srv.codes_of(shared_pages)
    assert all(torch.equal(x, y) for x, y in zip(before, after)), "a shared sealed page was rewritten"
    srv.finish(b)
    srv.idle()

    # D aborts mid-prefill (after a checkpoint put its first pages in the tree).
    d = srv.admit(_prompt(4, 30), gen=2, chunk=9)
    srv.extend([d])
    srv.checkpoint(d)
    srv.extend([d])
    assert srv.rt.stats().open_pages == 1
    srv.abort(d)
    srv.idle()
    assert srv.rt.stats().open_pages == 0
    # E re-prefills D's prompt and reuses the sealed pages D left in the tree.
    e = srv.admit(_prompt(4, 30), gen=2, chunk=32)
    assert e.protected == 8
    srv.extend([e])
    srv.decode([e])
    srv.finish(e)
    srv.evict_all_and_check()
    assert srv.checked > 100


@pytest.mark.parametrize("kind", KINDS)
def test_eviction_under_pressure_and_retraction(kind: str) -> None:
    srv = Server(kind, pages=10)
    held: list[Req] = []
    for i in range(6):
        r = srv.admit(_prompt(i + 10, 11), gen=3, chunk=16)  # 2 pages once decoded
        srv.make_room(r)
        srv.extend([r])
        for _ in range(3):
            srv.decode([r])
        if i % 3 == 0:
            held.append(r)
        else:
            srv.finish(r)
            srv.idle()
    # Retraction of a running request: its KV is dropped (never moved without its scales) and it
    # is prefilled again from scratch, matching the tree where it can.
    victim = held.pop()
    srv.abort(victim)
    srv.idle()
    again = srv.admit(victim.tokens[:victim.prompt_len], gen=2, chunk=16)
    srv.extend([again])
    srv.decode([again])
    srv.finish(again)
    for r in held:
        srv.finish(r)
    srv.idle()
    srv.evict_all_and_check()


def test_retraction_to_host_is_rejected_cleanly() -> None:
    srv = Server("radix", pages=8)
    with pytest.raises(NotImplementedError, match="retraction"):
        srv.pool.get_cpu_copy(torch.arange(P))
    with pytest.raises(NotImplementedError):
        srv.pool.load_cpu_copy(None, torch.arange(P))


def test_resize_keeps_allocator_pool_and_runtime_consistent() -> None:
    """`OscarPagedAllocator.resize` (SGLang calls it only for post-capture pools, which an OScaR pool
    never is; see its docstring). Within the pages the pool was built with it frees everything in the
    allocator, the runtime and the pool's page map at once; past them it is refused before anything
    changes (the packed arrays cannot grow)."""
    from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig

    srv = Server("radix", pages=12)
    a = srv.admit(_prompt(2, 19), gen=6, chunk=32)  # 19 + 6 tokens: pages 1-3 sealed
    srv.extend([a])
    for _ in range(6):
        srv.decode([a])
    srv.finish(a)
    cap = srv.pool.num_pages - 1  # the pages the pool's packed arrays and page map hold
    assert cap == srv.rt.num_pages - 1 >= 12

    before = (srv.alloc.size, srv.alloc.num_pages, srv.alloc.available_size(), srv.rt.stats())
    with pytest.raises(ValueError, match=r"cannot resize the KV allocator .* built with \d+ pages"):
        srv.alloc.resize(MemoryPoolConfig(max_total_num_tokens=(cap + 1) * P))
    assert (srv.alloc.size, srv.alloc.num_pages, srv.alloc.available_size(), srv.rt.stats()) == before
    assert srv.rt.num_pages == srv.pool.num_pages  # the runtime was not grown past the pool

    # SGLang resizes an empty pool (right after graph capture): drop the tree first, as flush_cache does.
    srv.cache.reset()
    assert bool((srv.pool.page_map >= 0).any()), "a page sealed in the last step still maps its staging"
    srv.alloc.resize(MemoryPoolConfig(max_total_num_tokens=6 * P))
    srv.size = 6 * P
    srv.steps = 0  # the runtime was reset with everything else, its step counter included
    assert srv.alloc.num_pages == 6 and srv.alloc.available_size() == 6 * P
    s = srv.rt.stats()
    assert s.free_pages == s.total_pages and s.open_pages == s.sealed_pages == s.tree_pages == 0, s
    assert srv.rt.staging_free() == srv.rt.staging_slots
    assert bool((srv.pool.page_map == -1).all()), "the pool's page map still names staging pages"
    assert srv.pool.oscar_step.seal_plan is None and not srv.pool.oscar_step.begun

    # The resized allocator serves requests over the same pool: attention checked against the
    # reference at every step, page ids within the new range, everything returned at the end.
    for i in range(3):
        r = srv.admit(_prompt(20 + i, 13), gen=4, chunk=16)
        srv.extend([r])
        for _ in range(4):
            srv.decode([r])
        assert int(r.row[:r.seq_len].max()) // P <= 6
        srv.finish(r)
        srv.idle()
        srv.cache.evict(EvictParams(num_tokens=srv.size))  # 6 pages: make room for the next one
    srv.evict_all_and_check()
    assert srv.alloc.oscar_page_capacity() == cap  # a shrink keeps the pool's pages for a later resize


def test_metrics_describe_the_state_after_the_step() -> None:
    """What `/server_info` and the `oscar:*` gauges report once SGLang has processed a step's results
    (the plug-in calls `metrics.after_step` after `Scheduler.process_batch_result`): the finished
    request's pages are already released or in the tree, its locks gone, its staging pages back. The
    runtime sees those events between steps (a flush, not a step), never during a forward, and never
    ahead of the next batch's allocations."""
    from prometheus_client import REGISTRY

    from oscar_sgl.sglang.metrics import after_step, snapshot

    def gauge(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {**labels, "tp_rank": "0"})

    srv = Server("radix", pages=16, metrics=True)
    a = srv.admit(_prompt(3, 20), gen=6, chunk=32)  # 26 tokens: pages 1-3 sealed, the 4th open
    srv.extend([a])
    for _ in range(6):
        srv.decode([a])
    after_step(srv.pool, srv.alloc)  # a decode step's results: nothing finished yet
    s = snapshot(srv.pool, srv.alloc)
    assert (s["pages"]["open"], s["pages"]["sealed"], s["tree_pages"]) == (1, 3, 0), s
    assert gauge("oscar:pages", state="open") == 1 and gauge("oscar:pages", state="sealed") == 3

    srv.finish(a)  # result processing: whole pages into the tree, the tail page released, unlock
    steps = s["runtime_steps"]
    after_step(srv.pool, srv.alloc)
    s = snapshot(srv.pool, srv.alloc)
    assert (s["pages"]["open"], s["pages"]["sealed"], s["tree_pages"], s["locked_pages"]) == (0, 3, 3, 0), s
    assert s["staging_pages_in_use"] == 0 and s["pages"]["free"] == 16 - 3, s
    assert s["runtime_steps"] == steps, "a flush between steps is not a step"
    assert gauge("oscar:pages", state="open") == 0 and gauge("oscar:pages", state="sealed") == 3
    assert gauge("oscar:staging_pages_in_use") == 0 and gauge("oscar:pages", state="free") == 13

    # B reuses A's sealed pages. While B's batch is being scheduled (its lock and allocation are in
    # the log) nothing is flushed: those events belong to B's step.
    b = srv.admit(_prompt(3, 20) + [7, 7], gen=2, chunk=32)
    assert b.protected == 16
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    out = srv.alloc.alloc_extend(t([16]), t([16]), t([22]), t([22]), t([int(b.row[15])]), 6)
    assert not srv.pool.oscar_step.flush(), "flushed the next batch's allocation outside its step"
    b.row[16:22] = out
    b.seq_len = 22
    srv.r2t.req_to_token[b.rid, :22] = b.row[:22].to(torch.int32)
    fb = SimpleNamespace(req_pool_indices=torch.tensor([b.rid]), seq_lens=torch.tensor([22]),
                         extend_prefix_lens=torch.tensor([16]), out_cache_loc=out)
    srv.backend.init_forward_metadata(fb)  # B's step begins (one runtime call)
    srv.steps += 1
    srv.alloc.record_unlock(torch.zeros(0, dtype=torch.int64))  # an event logged mid-forward
    assert not srv.pool.oscar_step.flush(), "flushed while a forward was under way"
    for li, layer in enumerate(srv.layers):
        k, v, q = kvq(b.tokens, 16, 22, li)
        o = srv.backend.forward_extend(q.reshape(-1, HQ * D), k, v, layer, fb).reshape(-1, HQ, D)
        for j, pos in enumerate(range(16, 22)):
            torch.testing.assert_close(o[j], expected(b.tokens, pos, 16, li, srv.mode), atol=3e-5, rtol=3e-5)
    after_step(srv.pool, srv.alloc)
    assert snapshot(srv.pool, srv.alloc)["locked_pages"] == 2  # B still holds the shared prefix
    for _ in range(2):
        srv.decode([b])
    srv.finish(b)
    after_step(srv.pool, srv.alloc)
    s = snapshot(srv.pool, srv.alloc)
    assert (s["pages"]["open"], s["locked_pages"], s["staging_pages_in_use"]) == (0, 0, 0), s
    srv.evict_all_and_check()  # the next steps deliver the map changes the flushes made
