"""`OscarStep`, the one owner of a step's state, through SGLang's real paged allocator and our pool
on device="cpu": staging is reserved only for pages that stay open (a prefill's whole new pages
are sealed directly from scratch while the step's scratch lasts), a refused allocation loses
nothing, and the arrows go one way (the allocator and the backend reach the step, not each other)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from oscar_sgl.config import OscarConfig  # noqa: E402
from oscar_sgl.errors import StagingExhausted  # noqa: E402
from oscar_sgl.sglang.allocator import OscarPagedAllocator  # noqa: E402
from oscar_sgl.sglang.pool import pool_class_for  # noqa: E402
from oscar_sgl.sglang.step import OscarStep  # noqa: E402

H, D, P, LAYERS = 2, 16, 16, 2
CFG = OscarConfig(bits=2, k_group=8, v_group=8, page_size=P)


def _stack(*, tokens: int = 512, max_running_requests: int = 1, max_prefill_tokens: int = 128):
    pool = pool_class_for(CFG, max_running_requests=max_running_requests, max_prefill_tokens=max_prefill_tokens)(
        tokens, page_size=P, dtype=torch.float32, head_num=H, head_dim=D, layer_num=LAYERS, device="cpu",
        enable_memory_saver=False,
    )
    alloc = OscarPagedAllocator(tokens, P, torch.float32, "cpu", pool, False, step=pool.oscar_step)
    return pool, alloc


def _extend(alloc, prefix: int, seq: int):
    p = torch.tensor([prefix], dtype=torch.int64)
    s = torch.tensor([seq], dtype=torch.int64)
    last = torch.tensor([-1], dtype=torch.int64)
    return alloc.alloc_extend(p, p, s, s, last, seq - prefix)


def test_whole_prefill_pages_take_no_staging():
    """3 staging pages (one running request) and 9 scratch pages: a 100-token prompt opens 7 pages,
    6 of them whole: they are sealed directly, only the last one takes staging."""
    pool, alloc = _stack()
    step = pool.oscar_step
    assert (step.num_staging, step.num_scratch) == (3, 9)
    out = _extend(alloc, 0, 100)
    assert out is not None and (step.pending_opens, step.pending_direct) == (1, 6)
    res = step.begin(new_step=True)
    assert res is not None
    stats = step.runtime.stats()
    assert (stats.direct_seals_total, stats.open_pages, stats.staging_in_use) == (6, 1, 1)
    assert len(step.direct_host) == 6 and step.seal_host == []
    step.runtime.check()


def test_scratch_runs_out_then_staging_is_reserved_and_a_refusal_loses_nothing():
    """With 3 scratch pages (--max-prefill-tokens 32) a 100-token prompt needs 3 + 1 staging pages:
    more than the 3 there are, so the allocation is refused before SGLang hands out anything."""
    pool, alloc = _stack(max_prefill_tokens=32)
    step = pool.oscar_step
    assert (step.num_staging, step.num_scratch) == (3, 3)
    free_before = alloc.available_size()
    with pytest.raises(StagingExhausted, match="4 page\\(s\\) would stay open this step, 3 of 3"):
        _extend(alloc, 0, 100)
    assert alloc.available_size() == free_before
    assert (step.pending_opens, step.pending_direct, len(step.events)) == (0, 0, 0)
    # 64 tokens: 3 whole pages from scratch, 1 whole page and nothing else from staging.
    assert _extend(alloc, 0, 64) is not None
    assert (step.pending_opens, step.pending_direct) == (1, 3)
    step.begin(new_step=True)
    st = step.runtime.stats()
    assert (st.direct_seals_total, st.sealed_pages) == (3, 4)
    step.runtime.check()


def test_a_failed_allocation_gives_its_reservation_back():
    pool, alloc = _stack(tokens=64)
    step = pool.oscar_step
    assert _extend(alloc, 0, 70) is None  # 5 pages, 4 exist: SGLang says no
    assert (step.pending_opens, step.pending_direct, len(step.events)) == (0, 0, 0)


def test_flush_applies_only_result_processing_and_never_mid_forward():
    pool, alloc = _stack()
    step = pool.oscar_step
    out = _extend(alloc, 0, 40)
    assert not step.flush(), "flushed an allocation outside its step"
    step.begin(new_step=True)
    alloc.free(out)
    assert not step.flush(), "flushed while a forward was under way"
    step.end_layer(LAYERS - 1, LAYERS)
    assert step.flush() and step.runtime.stats().open_pages == 0
    assert not step.flush()  # nothing left


def test_clear_resets_runtime_maps_and_plans():
    pool, alloc = _stack()
    step = pool.oscar_step
    _extend(alloc, 0, 40)
    step.begin(new_step=True)
    assert int((step.page_map >= 0).sum()) == 1 and step.seal_plan is None and step.direct_plan is not None
    alloc.clear()
    assert int((step.page_map >= 0).sum()) == 0 and int((step.scratch_map >= 0).sum()) == 0
    assert step.direct_plan is None and not step.begun and step.runtime.stats().free_pages == step.runtime.num_pages
    step.runtime.check()


def test_the_step_owner_knows_neither_pool_nor_allocator():
    pool, alloc = _stack()
    assert isinstance(pool.oscar_step, OscarStep) and alloc.oscar_step is pool.oscar_step
    assert pool.oscar_runtime is pool.oscar_step.runtime
    assert not any(o is pool or o is alloc for o in vars(pool.oscar_step).values())
