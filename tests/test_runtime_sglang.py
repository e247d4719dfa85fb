"""The OScaR allocator subclass under SGLang's real radix caches, on device="cpu".

A small scheduler (`sglang_support.scheduler`) drives SGLang's `RadixCache` and `UnifiedRadixCache`
(Rust TreeCore) the way SGLang's scheduler does (match -> lock -> alloc_extend / alloc_decode ->
insert + free duplicates -> relock / unlock -> evict), with `OscarPagedAllocator` forwarding every
page event to the Rust runtime in one call per step. The GPU side is emulated by a tiny "KV" store
that follows the runtime's answers exactly as the kernels would: writes go to the staging page the
map names (a write into a page the map says is sealed fails), attention reads staging or the packed
pool by the same map, and the seal plan copies staging pages into the packed pool. Every token read
must be the token written, every page must come back, and no sealed shared page may be rewritten.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sglang", reason="SGLang is not installed: the allocator subclass needs its real radix caches")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang_support.scheduler import KINDS, FakeScheduler, Req  # noqa: E402

from oscar_sgl.config import OscarConfig  # noqa: E402
from oscar_sgl.errors import StagingExhausted  # noqa: E402
from oscar_sgl.runtime import OscarRuntime, StepResult  # noqa: E402
from oscar_sgl.sglang.allocator import OscarPagedAllocator  # noqa: E402
from oscar_sgl.sglang.step import OscarStep  # noqa: E402

P = 4


class Harness(FakeScheduler):
    """The fake scheduler + an emulated GPU that obeys the runtime (token ids as "KV")."""

    def __init__(self, kind: str, *, pages: int, staging: int, need_sort: bool = False) -> None:
        size = pages * P
        rt = OscarRuntime(
            num_pages=pages + 1,
            page_size=P,
            staging_slots=staging,
            kv_heads=2,
            head_dim=16,
            config=OscarConfig(k_group=4, v_group=16, page_size=P),
        )
        alloc = OscarPagedAllocator(size, P, torch.bfloat16, "cpu", None, need_sort, step=OscarStep(rt, device="cpu"))
        r2t = ReqToTokenPool(size=8, max_context_len=size, device="cpu", enable_memory_saver=False)
        super().__init__(kind, alloc, r2t, page_size=P, gen_token=lambda i: 1000 + i)
        # Observe every page SGLang frees (request, duplicate or eviction) to retire its packed copy.
        release = self.alloc._release_page_ids

        def observe(*page_ids: torch.Tensor) -> None:
            for ids in page_ids:
                for page in ids.tolist():
                    self.sealed_once.pop(page, None)
            release(*page_ids)

        self.alloc._release_page_ids = observe
        # The emulated device: page -> staging map, staging pages, packed pool (token ids as "KV").
        self.map = np.full(pages + 1, -1, dtype=np.int32)
        self.staging = np.full((staging, P), -1, dtype=np.int64)
        self.packed = np.full((pages + 1, P), -1, dtype=np.int64)
        self.sealed_once: dict[int, np.ndarray] = {}
        self.shared_reads = 0
        self.steps = 0
        self._writes: list[tuple[torch.Tensor, list[int]]] = []

    def forward(self, reqs: list[Req], pre: list[int], seq: list[int], out: torch.Tensor, decode: bool) -> None:
        """The K/V writes of the step's forward: they reach the device in `step`."""
        for r, p, s in zip(reqs, pre, seq):
            self._writes.append((r.row[p:s].clone(), r.tokens[p:s]))

    def idle(self) -> None:
        self.step([])

    def extend_step(self, reqs: list[Req]) -> None:
        """A prefill step of ``reqs``: the scheduler's extend, then the step (runtime call, forward)."""
        self.extend(reqs)
        self.step(reqs)

    def decode_step(self, reqs: list[Req]) -> None:
        """A decode step of ``reqs``: the scheduler's decode, then the step."""
        self.decode(reqs)
        self.step(reqs)

    def drain_and_check(self) -> None:
        """The end of a test: one step for the events queued so far (finishes, aborts), then evict
        the whole tree and check that everything came back (``evict_all_and_check``)."""
        self.step([])
        self.evict_all_and_check()

    def begin(self) -> StepResult:
        """The step's one runtime call (`OscarStep.begin`); this emulated forward has one layer."""
        step = self.alloc.oscar_step
        res = step.begin(new_step=True)
        step.end_layer(0, 1)
        assert res is not None
        return res

    def page_map(self) -> np.ndarray:
        return self.map

    # ---- one scheduler step ----

    def step(self, reads: list[Req]) -> None:
        """Flush events (one runtime call), run the "forward": writes, attention reads, seals."""
        res = self.begin()
        self.steps += 1
        for page, slot in res.map_delta.tolist():
            self.map[page] = slot
        assert np.array_equal(self.map, self.rt.page_to_staging()), "delta-applied map differs from the runtime's"
        for locs, toks in self._writes:
            for loc, tok in zip(locs.tolist(), toks):
                page, off = divmod(loc, P)
                slot = self.map[page]
                assert slot >= 0, f"write into page {page}, which the runtime says is sealed"
                self.staging[slot, off] = tok
        self._writes.clear()
        for r in reads:
            self.read(r)
        for page, slot in res.seal_plan.tolist():
            if page < 0:
                continue
            assert page not in self.sealed_once, f"page {page} sealed twice without being freed"
            self.packed[page] = self.staging[slot]
            self.sealed_once[page] = self.packed[page].copy()
        self.rt.check()

    def read(self, r: Req) -> None:
        """Attention over the whole row: staging where the map names a slot, else the packed page."""
        for pos, loc in enumerate(r.row[: r.seq_len].tolist()):
            page, off = divmod(loc, P)
            slot = self.map[page]
            got = self.staging[slot, off] if slot >= 0 else self.packed[page, off]
            assert got == r.tokens[pos], f"position {pos}: read {got}, wrote {r.tokens[pos]}"
            if slot < 0 and self.rt.page_info(page).owner == "tree":
                self.shared_reads += 1


def _prompt(base: int, n: int) -> list[int]:
    return [base * 100 + i for i in range(n)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("need_sort", [False, True])
def test_two_requests_share_a_sealed_prefix(kind: str, need_sort: bool) -> None:
    h = Harness(kind, pages=32, staging=12, need_sort=need_sort)
    shared = _prompt(1, 18)
    a = h.admit(shared + [7, 7, 7], gen=5, chunk=8)  # chunked prefill: 8 + 8 + 5 tokens
    h.chunked_prefill(a)
    for _ in range(5):
        h.decode_step([a])
    h.finish(a)
    h.step([])
    tree_pages = h.rt.stats().tree_pages
    assert tree_pages == (a.seq_len // P)

    # B matches A's first four pages (16 tokens): they are sealed, tree-owned, and now locked.
    b = h.admit(shared + [9, 9], gen=6, chunk=32)
    assert b.protected == 16
    shared_pages = sorted(set((b.row[:16] // P).tolist()))
    for page in shared_pages:
        info = h.rt.page_info(page)
        assert (info.state, info.owner) == ("sealed", "tree")
    packed_before = {p: h.packed[p].copy() for p in shared_pages}
    c = h.admit(shared + [5], gen=3, chunk=32)  # a third request on the same prefix, concurrently
    h.extend_step([b, c])
    h.step([])  # the lock events of B and C reach the runtime
    for page in shared_pages:
        assert h.rt.page_info(page).locks == 2
    for _ in range(6):
        running = [r for r in (b, c) if r.seq_len < r.max_len]
        h.decode_step(running)
    for page in shared_pages:
        assert np.array_equal(h.packed[page], packed_before[page]), f"shared page {page} was rewritten"
    assert h.shared_reads > 0
    h.finish(b)
    h.abort(c)
    h.drain_and_check()
    assert h.rt.stats().seals_total >= tree_pages


@pytest.mark.parametrize("kind", KINDS)
def test_eviction_under_pressure(kind: str) -> None:
    h = Harness(kind, pages=16, staging=8)
    held: list[Req] = []
    for i in range(12):
        r = h.admit(_prompt(i + 2, 9), gen=3, chunk=16)  # 3 pages each once decoded
        h.make_room(r)
        h.extend_step([r])
        for _ in range(3):
            h.decode_step([r])
        if i % 4 == 0:
            held.append(r)  # keep a few running: their pages must survive every eviction
        else:
            h.finish(r)
            h.step([])
        assert h.rt.stats().free_pages > 0
    for r in held:
        h.read(r)
        h.finish(r)
    h.drain_and_check()


@pytest.mark.parametrize("kind", KINDS)
def test_abort_mid_prefill_returns_everything(kind: str) -> None:
    h = Harness(kind, pages=24, staging=10)
    a = h.admit(_prompt(3, 30), gen=2, chunk=9)
    h.extend_step([a])
    h.checkpoint(a)  # two sealed pages now in the tree, one open page with 1 token
    h.extend_step([a])
    assert h.rt.stats().open_pages == 1
    h.abort(a)
    h.step([])
    s = h.rt.stats()
    assert s.open_pages == 0 and s.locked_pages == 0
    # A request that re-prefills the same prompt reuses the sealed pages in the tree.
    b = h.admit(_prompt(3, 30), gen=0, chunk=32)
    assert b.protected == 8
    h.extend_step([b])
    h.finish(b)
    h.drain_and_check()


@pytest.mark.parametrize("kind", KINDS)
def test_staging_exhaustion_is_raised_before_sglang_allocates(kind: str) -> None:
    h = Harness(kind, pages=16, staging=2)
    r = h.admit(_prompt(4, 13), gen=0, chunk=16)  # needs 4 pages at once
    free_before = h.alloc.available_size()
    with pytest.raises(StagingExhausted) as err:
        h.extend([r])
    assert isinstance(err.value, MemoryError)
    assert h.alloc.available_size() == free_before, "SGLang's free list must be untouched"
    h.abort(r)
    h.drain_and_check()


def test_clear_resets_the_runtime() -> None:
    h = Harness("radix", pages=8, staging=4)
    r = h.admit(_prompt(5, 6), gen=0, chunk=8)
    h.extend_step([r])
    assert h.rt.stats().open_pages == 1
    h.alloc.clear()
    res = h.begin()
    assert sorted(res.map_delta[:, 1].tolist()) == [-1, -1]
    assert h.rt.stats().free_pages == h.rt.stats().total_pages
    h.rt.check()
