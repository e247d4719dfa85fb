"""Typed Python API over the Rust core (`oscar_sgl._core`): packer, memory planner, page runtime.

The runtime mirrors SGLang's KV pages with their OScaR state (free / open in a BF16 staging page /
sealed) and is driven by **one call per scheduler step**: every event of the step goes in as two
flat int64 arrays (see :class:`EventBatch`), and the GPU work comes back as two int32 arrays: the
seal plan (``(page, staging_slot)`` pairs to quantize after the step's forward, rows with page
``-1`` skipped) and the changes of the page -> staging map the decode kernel reads.

Only numpy is needed here; torch and SGLang are not imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _core
from .config import LAYOUT_VERSION, OscarConfig

__all__ = [
    "EventBatch",
    "MemoryPlanRow",
    "OscarRuntime",
    "PageInfo",
    "RuntimeStats",
    "StepResult",
    "bytes_per_token",
    "pack_k",
    "pack_k_page",
    "pack_v",
    "plan_memory",
    "scratch_slots_needed",
    "staging_slots_needed",
    "unpack_k",
    "unpack_k_page",
    "unpack_v",
]

if _core.LAYOUT_VERSION != LAYOUT_VERSION:  # pragma: no cover - a stale build
    raise ImportError(
        f"oscar_sgl._core implements layout version {_core.LAYOUT_VERSION}, the Python side expects "
        f"{LAYOUT_VERSION}: rebuild the extension (maturin develop)"
    )

IntArray = npt.NDArray[np.int64]
Ints = Union[Sequence[int], npt.NDArray[np.integer]]

OP_EXTEND = _core.OP_EXTEND
OP_DECODE = _core.OP_DECODE
OP_ALLOC = _core.OP_ALLOC
OP_WRITE = _core.OP_WRITE
OP_RELEASE = _core.OP_RELEASE
OP_LOCK = _core.OP_LOCK
OP_UNLOCK = _core.OP_UNLOCK
OP_SHARE = _core.OP_SHARE

#: Events that write or open pages: only a step may apply them (the runtime refuses them in a flush).
_STEP_OPS = frozenset((OP_EXTEND, OP_DECODE, OP_ALLOC, OP_WRITE))


def _i64(x: Ints) -> IntArray:
    return np.ascontiguousarray(x, dtype=np.int64).reshape(-1)


# --------------------------------------------------------------------------------------------
# Events of one step
# --------------------------------------------------------------------------------------------


class EventBatch:
    """The events of one scheduler step, in order, as the runtime's wire format.

    ``ops`` holds records ``[opcode, count, args...]``; ``ids`` the page ids the records consume,
    in order. Page ids are SGLang's (slot // page_size; page 0 is its padding page).
    """

    __slots__ = ("_ops", "_ids")

    def __init__(self) -> None:
        self._ops: list[IntArray] = []
        self._ids: list[IntArray] = []

    def __len__(self) -> int:
        return len(self._ops)

    def clear(self) -> None:
        self._ops.clear()
        self._ids.clear()

    def _record(self, head: Sequence[int], args: IntArray | None, ids: IntArray) -> None:
        rec = np.array(head, dtype=np.int64)
        self._ops.append(rec if args is None else np.concatenate((rec, args)))
        if ids.size:
            self._ids.append(ids)

    def extend(self, prefix_lens: Ints, seq_lens: Ints, pages: Ints) -> None:
        """Rows write tokens ``[prefix_len, seq_len)``. ``pages``: per row with ``seq > prefix``,
        every page the row writes, first to last (the first is the row's open page when
        ``prefix_len`` is not page-aligned, a new one otherwise)."""
        p, s = _i64(prefix_lens), _i64(seq_lens)
        if p.shape != s.shape:
            raise ValueError(f"prefix_lens {p.shape} and seq_lens {s.shape} differ")
        self._record((OP_EXTEND, p.size), np.concatenate((p, s)), _i64(pages))

    def decode(self, seq_lens: Ints, pages: Ints) -> None:
        """Each row writes one token at ``seq_len - 1`` into its page (a new one when that position
        starts a page)."""
        s = _i64(seq_lens)
        self._record((OP_DECODE, s.size), s, _i64(pages))

    def alloc(self, pages: Ints) -> None:
        """Pages handed out empty (SGLang's plain ``alloc``)."""
        ids = _i64(pages)
        self._record((OP_ALLOC, ids.size), None, ids)

    def write(self, pages: Ints, tokens: Ints) -> None:
        """Append ``tokens[i]`` tokens to ``pages[i]`` (positions unchecked; EXTEND/DECODE check them)."""
        ids, n = _i64(pages), _i64(tokens)
        if ids.shape != n.shape:
            raise ValueError(f"pages {ids.shape} and tokens {n.shape} differ")
        self._record((OP_WRITE, ids.size), n, ids)

    def _simple(self, op: int, pages: Ints) -> None:
        ids = _i64(pages)
        if ids.size:
            self._record((op, ids.size), None, ids)

    def release(self, pages: Ints) -> None:
        """Pages returned to SGLang's free list."""
        self._simple(OP_RELEASE, pages)

    def lock(self, pages: Ints) -> None:
        """One radix-cache lock on each page (a request holds the path to its prefix)."""
        self._simple(OP_LOCK, pages)

    def unlock(self, pages: Ints) -> None:
        self._simple(OP_UNLOCK, pages)

    def share(self, pages: Ints) -> None:
        """Pages now held by the radix cache (must be sealed)."""
        self._simple(OP_SHARE, pages)

    def only_between_steps(self) -> bool:
        """Whether :meth:`OscarRuntime.flush` may apply every event (none writes, opens or hands out
        a page: those belong to a step)."""
        return not any(int(rec[0]) in _STEP_OPS for rec in self._ops)

    def arrays(self) -> tuple[IntArray, IntArray]:
        """``(ops, ids)`` as flat int64 arrays."""
        empty = np.empty(0, dtype=np.int64)
        ops = np.concatenate(self._ops) if self._ops else empty
        ids = np.concatenate(self._ids) if self._ids else empty
        return ops, ids


# --------------------------------------------------------------------------------------------
# The runtime
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What the GPU side does after a step.

    Attributes:
        seal_plan: ``[k, 2]`` int32 ``(page, staging_slot)``: quantize these staging pages into the
            packed pool after this step's forward (one launch; rows with page ``-1`` are cancelled).
        map_delta: ``[m, 2]`` int32 ``(page, slot)``: apply ``map[page] = slot`` to the device copy of
            the page -> staging map before this step's attention (``-1``: read the packed pool).

    The seal plan must be enqueued after this step's K/V writes and before the next step's forward
    (on one stream): its staging pages are handed to other pages from the next step on.
    """

    seal_plan: npt.NDArray[np.int32]
    map_delta: npt.NDArray[np.int32]


@dataclass(frozen=True)
class RuntimeStats:
    """Counters for the server's metrics (see ``oscar_core::runtime::Stats``)."""

    total_pages: int
    free_pages: int
    open_pages: int
    sealed_pages: int
    tree_pages: int
    locked_pages: int
    open_tokens: int
    staging_capacity: int
    staging_in_use: int
    staging_high_water: int
    steps: int
    seals_last_step: int
    seals_total: int
    direct_seals_total: int
    max_seals_per_step: int
    events_total: int
    compression_ratio: float
    format_ratio: float


PageState = Literal["free", "open", "sealed"]
PageOwner = Literal["none", "request", "tree"]


@dataclass(frozen=True)
class PageInfo:
    state: PageState
    owner: PageOwner
    fill: int
    slot: int
    locks: int


def _pairs(raw: bytearray) -> npt.NDArray[np.int32]:
    return np.frombuffer(raw, dtype="<i4").reshape(-1, 2)


def staging_slots_needed(*, max_running_requests: int, max_prefill_tokens: int, page_size: int,
                         direct_seals: bool = True) -> int:
    """Staging pages that can never run out.

    Each running request holds at most one open page. In one step a request can fill the page it
    had open (its slot stays reserved until the next step: its seal runs in this step's forward)
    and open the next one: two slots. The pages a prefill chunk opens *and* fills in the step are
    sealed directly from scratch (:func:`scratch_slots_needed`) and take none; without direct seals
    they take ``ceil(max_prefill_tokens / page_size)`` more.
    """
    prefill_pages = 0 if direct_seals else -(-max_prefill_tokens // page_size)
    return 2 * (max_running_requests + prefill_pages) + 1


def scratch_slots_needed(*, max_prefill_tokens: int, page_size: int) -> int:
    """Scratch pages (one layer's worth, reused by every layer) for the direct seals of one step: at
    most ``max_prefill_tokens // page_size`` whole pages are written by one prefill batch."""
    return -(-max_prefill_tokens // page_size) + 1


def _groups(config: OscarConfig, kv_heads: int) -> dict[str, int]:
    """The format arguments every Rust entry point takes besides the bit width."""
    return {"k_group": config.k_group, "v_group": config.v_group, "scale_columns": config.scale_columns(kv_heads),
            "key_grid_page": config.page_size if config.key_ranges == "page" else 0}


class OscarRuntime:
    """Page table + staging pool + seal planning for one KV pool (one TP rank).

    Args:
        num_pages: page ids are ``0..num_pages`` (SGLang: ``allocator.num_pages + 1``).
        page_size: tokens per page, a multiple of ``config.k_group``.
        staging_slots: BF16 staging pages (see :func:`staging_slots_needed`).
        scratch_slots: per-step scratch pages for *direct seals* (see :func:`scratch_slots_needed`):
            a page that a prefill row opens and fills in one step takes one of them instead of a
            staging slot, named ``staging_slots + k`` in the seal plan (its map entry stays -1).
            0 turns direct seals off.
        kv_heads, head_dim: layer shape (for the compression statistics).
        config: the quantization config every sealed page is written with.
    """

    def __init__(
        self,
        *,
        num_pages: int,
        page_size: int,
        staging_slots: int,
        kv_heads: int,
        head_dim: int,
        config: OscarConfig,
        scratch_slots: int = 0,
    ) -> None:
        config.check_shape(kv_heads, head_dim)
        self.config = config
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self._rt = _core.Runtime(
            num_pages=num_pages,
            page_size=page_size,
            staging_slots=staging_slots,
            kv_heads=kv_heads,
            head_dim=head_dim,
            bits=config.bits,
            scratch_slots=scratch_slots,
            **_groups(config, kv_heads),
        )
        #: Fixed at construction (read back from the core, which validated them).
        self.num_pages, self.page_size, self.staging_slots, self.scratch_slots, self.layout_version = self._rt.sizes()

    def step(self, batch: EventBatch) -> StepResult:
        """Apply one step's events (raises ``EventError``, ``StagingExhausted``, ``InvariantViolation``)."""
        ops, ids = batch.arrays()
        return self.step_arrays(ops, ids)

    def step_arrays(self, ops: IntArray, ids: IntArray) -> StepResult:
        """:meth:`step` on prebuilt int64 arrays (the allocator's path)."""
        plan, delta = self._rt.step(ops.astype("<i8", copy=False).tobytes(), ids.astype("<i8", copy=False).tobytes())
        return StepResult(seal_plan=_pairs(plan), map_delta=_pairs(delta))

    def flush(self, batch: EventBatch) -> None:
        """Apply, between two steps, the events that follow a step's forward (releases, radix
        locks, unlocks, inserts), so :meth:`stats` describes the state after the step; the last
        step's seals count as run, so their staging pages come back. Writes and allocations are
        refused (``EventError``, nothing applied): they belong to the next :meth:`step`, which
        also delivers the map changes made here."""
        ops, ids = batch.arrays()
        self.flush_arrays(ops, ids)

    def flush_arrays(self, ops: IntArray, ids: IntArray) -> None:
        """:meth:`flush` on prebuilt int64 arrays (the allocator's path)."""
        self._rt.flush(ops.astype("<i8", copy=False).tobytes(), ids.astype("<i8", copy=False).tobytes())

    def check(self) -> None:
        """Audit every invariant (O(pages)); raises ``InvariantViolation``."""
        self._rt.check()

    def reset(self) -> None:
        """Everything free (SGLang's ``allocator.clear()``)."""
        self._rt.reset()

    def staging_free(self) -> int:
        return self._rt.staging_free()

    def staging_available(self) -> int:
        """Staging pages the next step can open (free now + released when it starts)."""
        return self._rt.staging_available()

    def page_to_staging(self) -> npt.NDArray[np.int32]:
        """The whole page -> staging map, int32 per page (``-1``: not in staging)."""
        return np.frombuffer(self._rt.page_to_staging(), dtype="<i4")

    def page_info(self, page: int) -> PageInfo:
        state, owner, fill, slot, locks = self._rt.page_info(page)
        return PageInfo(state=state, owner=owner, fill=fill, slot=slot, locks=locks)  # type: ignore[arg-type]

    def stats(self) -> RuntimeStats:
        return RuntimeStats(**self._rt.stats())  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Packer and planner
# --------------------------------------------------------------------------------------------


def _f32(values: npt.ArrayLike) -> tuple[bytes, tuple[int, int, int]]:
    x = np.ascontiguousarray(values, dtype="<f4")
    if x.ndim != 3:
        raise ValueError(f"expected a [H, n, D] array, got shape {x.shape}")
    h, n, d = x.shape
    return x.tobytes(), (h, n, d)


def pack_k(values: npt.ArrayLike, *, bits: int, k_group: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16]]:
    """Golden key packer: ``[H, n, D]`` fp32 (already divided by s) -> codes ``[H, n, D*b/8]`` uint8,
    params ``[H, n/k_group, 2, D]`` fp16 (docs/LAYOUT.md)."""
    codes, params, (h, n, d) = _pack("k", values, bits, k_group)
    return codes, params.reshape(h, n // k_group, 2, d)


def pack_v(values: npt.ArrayLike, *, bits: int, v_group: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16]]:
    """Golden value packer: ``[H, n, D]`` fp32 -> codes ``[H, n, D*b/8]``, params ``[H, n, 2, D/v_group]``."""
    codes, params, (h, n, d) = _pack("v", values, bits, v_group)
    return codes, params.reshape(h, n, 2, d // v_group)


def pack_k_page(values: npt.ArrayLike, *, bits: int, k_group: int, page_size: int
                ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16], npt.NDArray[np.uint8]]:
    """Golden key packer with page-grid ranges (``OscarConfig.key_ranges == "page"``): ``[H, n, D]``
    fp32 (already divided by s, n whole pages) -> codes ``[H, n, D*b/8]`` uint8, grid
    ``[H, n/page_size, 2, D]`` fp16 (base, step), ranges ``[H, n/k_group, 2, D]`` uint8 (a, b)."""
    raw, (h, n, d) = _f32(values)
    codes, grid, ranges = _core.pack_k_page(raw, shape=(h, n, d), bits=bits, k_group=k_group, page_size=page_size)
    return (np.frombuffer(codes, dtype=np.uint8).reshape(h, n, d * bits // 8),
            np.frombuffer(grid, dtype="<f2").reshape(h, n // page_size, 2, d),
            np.frombuffer(ranges, dtype=np.uint8).reshape(h, n // k_group, 2, d))


def unpack_k_page(codes: npt.ArrayLike, grid: npt.ArrayLike, ranges: npt.ArrayLike, *, bits: int, k_group: int,
                  page_size: int) -> npt.NDArray[np.float32]:
    """Dequantized keys ``[H, n, D]`` fp32 from `pack_k_page`'s codes, grid and ranges."""
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    h, n, row = c.shape
    d = row * 8 // bits
    out = _core.unpack_k_page(c.tobytes(), np.ascontiguousarray(grid, dtype="<f2").tobytes(),
                              np.ascontiguousarray(ranges, dtype=np.uint8).tobytes(), shape=(h, n, d), bits=bits,
                              k_group=k_group, page_size=page_size)
    return np.frombuffer(out, dtype="<f4").reshape(h, n, d)


def _pack(part: str, values: npt.ArrayLike, bits: int, group: int
          ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16], tuple[int, int, int]]:
    raw, (h, n, d) = _f32(values)
    codes, params = _core.pack(raw, part=part, shape=(h, n, d), bits=bits, group=group)
    return np.frombuffer(codes, dtype=np.uint8).reshape(h, n, d * bits // 8), np.frombuffer(params, dtype="<f2"), (h, n, d)


def _unpack(part: str, codes: npt.ArrayLike, params: npt.ArrayLike, bits: int, group: int) -> npt.NDArray[np.float32]:
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    h, n, row = c.shape
    d = row * 8 // bits
    out = _core.unpack(c.tobytes(), np.ascontiguousarray(params, dtype="<f2").tobytes(), part=part, shape=(h, n, d),
                       bits=bits, group=group)
    return np.frombuffer(out, dtype="<f4").reshape(h, n, d)


def unpack_k(codes: npt.ArrayLike, params: npt.ArrayLike, *, bits: int, k_group: int) -> npt.NDArray[np.float32]:
    """Dequantized keys ``[H, n, D]`` fp32 from codes ``[H, n, D*b/8]`` and params."""
    return _unpack("k", codes, params, bits, k_group)


def unpack_v(codes: npt.ArrayLike, params: npt.ArrayLike, *, bits: int, v_group: int) -> npt.NDArray[np.float32]:
    """Dequantized values ``[H, n, D]`` fp32."""
    return _unpack("v", codes, params, bits, v_group)


def bytes_per_token(config: OscarConfig, kv_heads: int, head_dim: int) -> float:
    """Packed bytes per token per layer, computed by the Rust core (equals ``config.bytes_per_token``)."""
    return _core.format_cost(shape=(kv_heads, head_dim), bits=config.bits, **_groups(config, kv_heads))[0]


KvDtype = Literal["bf16", "fp8", "int4", "int2"]


@dataclass(frozen=True)
class MemoryPlanRow:
    """What one KV storage format gets out of a byte budget.

    Attributes:
        dtype: ``bf16``, ``fp8``, ``int4`` or ``int2``.
        bytes_per_token: over all layers, packed (BF16 staging excluded).
        bytes_per_page: over all layers.
        staging_bytes: BF16 staging pages (0 for bf16 / fp8).
        pages: pages that fit, SGLang's padding page taken out.
        tokens: ``pages * page_size``.
    """

    dtype: KvDtype
    bytes_per_token: float
    bytes_per_page: int
    staging_bytes: int
    pages: int
    tokens: int


def plan_memory(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    budget_bytes: int,
    staging_pages: int,
    config: OscarConfig,
    int4_config: OscarConfig | None = None,
) -> list[MemoryPlanRow]:
    """Tokens that fit in ``budget_bytes`` for BF16, FP8, INT4 and INT2: the INT2 row in the format
    of ``config``, the INT4 row in that of ``int4_config`` (default: ``config``'s too; each format
    default depends on the width, `OscarConfig.format_defaults`). The configs' ``bits`` are ignored."""

    def rows_of(cfg: OscarConfig) -> list[MemoryPlanRow]:
        rows = _core.plan_memory(layers=layers, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
                                 staging_pages=staging_pages, budget_bytes=budget_bytes, **_groups(cfg, kv_heads))
        return [MemoryPlanRow(*row) for row in rows]  # type: ignore[arg-type]

    rows = rows_of(config)
    if int4_config is not None and int4_config != config:
        int4 = next(r for r in rows_of(int4_config) if r.dtype == "int4")
        rows = [int4 if r.dtype == "int4" else r for r in rows]
    return rows
