"""The typed runtime API (`oscar_sgl.runtime`), the error mapping (`oscar_sgl.errors`) and the stub
of the extension (`_core.pyi`, checked by mypy's stubtest). No SGLang needed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oscar_sgl import _core
from oscar_sgl.config import OscarConfig
from oscar_sgl.errors import EventError, InvariantViolation, LayoutError, OscarCoreError, StagingExhausted, from_core
from oscar_sgl.runtime import (
    EventBatch,
    OscarRuntime,
    RuntimeStats,
    bytes_per_token,
    pack_k,
    pack_v,
    plan_memory,
    scratch_slots_needed,
    staging_slots_needed,
    unpack_k,
    unpack_v,
)
from oscar_sgl.sglang.allocator import extend_page_starts

ROOT = Path(__file__).resolve().parents[1]
P = 4


def make(pages: int = 16, staging: int = 8) -> OscarRuntime:
    return OscarRuntime(
        num_pages=pages,
        page_size=P,
        staging_slots=staging,
        kv_heads=2,
        head_dim=16,
        config=OscarConfig(k_group=4, v_group=16, page_size=P),
    )


def pairs(a: np.ndarray) -> list[tuple[int, int]]:
    return sorted(map(tuple, a.tolist()))


def test_stub_matches_the_extension() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(ROOT / "tests" / "stubtest_mypy.ini"),
         "oscar_sgl._core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_needs_no_sglang() -> None:
    code = (
        "import sys; sys.modules['sglang'] = None\n"
        "import oscar_sgl, oscar_sgl.runtime, oscar_sgl.errors, oscar_sgl.sglang.allocator as a\n"
        "try:\n    a.OscarPagedAllocator\nexcept ImportError:\n    print('lazy-ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "lazy-ok"


def test_prefill_decode_seal_and_map() -> None:
    rt = make()
    b = EventBatch()
    b.extend([0, 0], [6, 3], [1, 2, 3])  # row 0: pages 1 (full) and 2; row 1: page 3
    res = rt.step(b)
    assert res.seal_plan.dtype == np.int32 and res.seal_plan.tolist() == [[1, 0]]
    assert pairs(res.map_delta) == [(1, 0), (2, 1), (3, 2)]
    b.clear()
    b.decode([7, 4], [2, 3])  # positions 6 and 3: page 3 fills
    res = rt.step(b)
    assert res.seal_plan.tolist() == [[3, 2]]
    assert pairs(res.map_delta) == [(1, -1)]  # page 1's seal ran after the last forward
    np.testing.assert_array_equal(rt.page_to_staging()[:4], [-1, -1, 1, 2])
    info = rt.page_info(3)
    assert (info.state, info.owner, info.fill, info.slot) == ("sealed", "request", 4, 2)
    s = rt.stats()
    assert (s.open_pages, s.sealed_pages, s.seals_total, s.open_tokens) == (1, 2, 2, 3)
    assert s.format_ratio == pytest.approx(2 * 16 * 2 * 2 / bytes_per_token(rt.config, 2, 16))
    rt.check()


def test_flush_between_steps() -> None:
    """`flush`: a step's result processing (release, share, unlock) applied between steps, so the
    stats are those after the step; writes are refused and the map changes wait for the next step."""
    rt = make()
    b = EventBatch()
    b.extend([0], [6], [1, 2])  # page 1 sealed this step (slot 0 queued), page 2 open (slot 1)
    rt.step(b)
    b.clear()
    b.share([1])
    b.release([2])
    rt.flush(b)
    s = rt.stats()
    assert (s.open_pages, s.sealed_pages, s.tree_pages, s.staging_in_use, s.steps) == (0, 1, 1, 0, 1)
    np.testing.assert_array_equal(rt.page_to_staging()[:3], [-1, -1, -1])  # the device copy: next step
    before = rt.stats()
    w = EventBatch()
    w.release([1])
    w.alloc([3])
    with pytest.raises(EventError, match="belongs to a step"):
        rt.flush(w)
    assert rt.stats() == before
    res = rt.step(EventBatch())
    assert res.seal_plan.size == 0 and pairs(res.map_delta) == [(1, -1), (2, -1)]
    rt.check()


def test_shared_pages_are_protected() -> None:
    rt = make()
    b = EventBatch()
    b.extend([0], [8], [1, 2])
    b.share([1, 2])
    b.lock([1, 2])
    rt.step(b)
    assert rt.page_info(1).owner == "tree" and rt.page_info(1).locks == 1
    for bad, kind in [
        (lambda e: e.write([1], [1]), "write_sealed"),
        (lambda e: e.release([2]), "release_locked"),
        (lambda e: e.unlock([3]), "unlock_unlocked"),
        (lambda e: e.release([5]), "double_free"),
        (lambda e: (e.alloc([5]), e.share([5])), "share_unsealed"),
    ]:
        e = EventBatch()
        bad(e)
        with pytest.raises(InvariantViolation) as err:
            rt.step(e)
        assert err.value.violation == kind
        assert isinstance(err.value, RuntimeError)
        if kind == "share_unsealed":  # the alloc before the failing event stays applied
            e = EventBatch()
            e.release([5])
            rt.step(e)
    e = EventBatch()
    e.unlock([1, 2])
    e.release([1, 2])
    rt.step(e)
    rt.check()
    assert rt.stats().free_pages == 16


def test_errors_map_to_builtin_classes() -> None:
    with pytest.raises(LayoutError) as layout:
        OscarRuntime(num_pages=8, page_size=6, staging_slots=2, kv_heads=2, head_dim=16, config=OscarConfig(k_group=4, v_group=16, page_size=4))
    assert isinstance(layout.value, ValueError) and isinstance(layout.value, OscarCoreError)
    rt = make(staging=1)
    with pytest.raises(EventError) as event:
        rt.step_arrays(np.array([42, 0]), np.array([], dtype=np.int64))
    assert isinstance(event.value, ValueError) and event.value.at == 0
    with pytest.raises(EventError):
        rt.step_arrays(np.array([_core.OP_ALLOC, 1]), np.array([99]))  # page out of range
    b = EventBatch()
    b.alloc([1, 2])
    with pytest.raises(StagingExhausted) as full:
        rt.step(b)
    assert isinstance(full.value, MemoryError)
    assert (full.value.page, full.value.event) == (2, 0)
    rt.check()
    with pytest.raises(AssertionError):
        from_core("no_such_kind", "boom")


def test_malformed_batch_changes_nothing() -> None:
    rt = make()
    before = (rt.stats(), rt.page_to_staging().copy())
    with pytest.raises(EventError):
        rt.step_arrays(np.array([_core.OP_EXTEND, 1, 0, 8, _core.OP_ALLOC, 1]), np.array([1, 2, 99]))
    assert rt.stats() == before[0]
    np.testing.assert_array_equal(rt.page_to_staging(), before[1])


def test_stats_fields_are_the_core_counters() -> None:
    raw = make()._rt.stats()
    assert set(raw) == {f.name for f in dataclasses.fields(RuntimeStats)}


def test_reset() -> None:
    rt = make()
    b = EventBatch()
    b.extend([0], [5], [3, 4])
    rt.step(b)
    rt.reset()
    assert pairs(rt.step(EventBatch()).map_delta) == [(3, -1), (4, -1)]
    assert rt.layout_version == _core.LAYOUT_VERSION == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 16]))
def test_extend_page_starts_matches_brute_force(rows: list[tuple[int, int]], page_size: int) -> None:
    p = np.array([min(a, b) for a, b in rows])
    s = np.array([max(a, b) for a, b in rows])
    want, at = [], 0
    for pi, si in zip(p, s):
        for j, pos in enumerate(range(pi, si)):
            if j == 0 or pos % page_size == 0:
                want.append(at + j)
        at += si - pi
    assert extend_page_starts(p, s, page_size).tolist() == want


def test_numpy_packers_round_trip() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 128)).astype(np.float32)
    codes, params = pack_k(x, bits=4, k_group=32)
    assert codes.shape == (2, 64, 64) and params.shape == (2, 2, 2, 128) and params.dtype == np.float16
    assert np.abs(unpack_k(codes, params, bits=4, k_group=32) - x).max() < 0.5
    codes, params = pack_v(x[:, :7], bits=2, v_group=32)
    assert codes.shape == (2, 7, 32) and params.shape == (2, 7, 2, 4)
    assert np.abs(unpack_v(codes, params, bits=2, v_group=32) - x[:, :7]).max() < 2.0


def test_plan_memory_and_staging_sizing() -> None:
    rows = plan_memory(layers=30, kv_heads=3, head_dim=64, page_size=128, budget_bytes=2 << 30, staging_pages=16, config=OscarConfig())
    assert [r.dtype for r in rows] == ["bf16", "fp8", "int4", "int2"]
    assert all(r.tokens == r.pages * 128 for r in rows)
    assert rows[3].bytes_per_token == 30 * OscarConfig().bytes_per_token(3, 64)
    assert rows[3].staging_bytes == 16 * 128 * 30 * 3 * 64 * 4
    # Two pages per running request (the one it filled this step, the one it opens); prefill pages
    # opened and filled in one step are sealed from scratch, so they count only without direct seals.
    assert staging_slots_needed(max_running_requests=8, max_prefill_tokens=256, page_size=128) == 17
    assert staging_slots_needed(max_running_requests=8, max_prefill_tokens=256, page_size=128, direct_seals=False) == 21
    assert scratch_slots_needed(max_prefill_tokens=256, page_size=128) == 3
    assert scratch_slots_needed(max_prefill_tokens=257, page_size=128) == 4
