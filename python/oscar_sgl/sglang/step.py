"""`OscarStep`: the one owner of a scheduler step's OScaR state.

One instance per KV pool (one per TP rank). It holds

- the Rust runtime handle (`oscar_sgl.runtime.OscarRuntime`: page states, staging free list),
- the step's event batch (`StepEvents`, the runtime's one wire format), which the allocator and the
  radix-cache hooks only *record* into,
- the page -> staging map and the page -> scratch map (device int32 arrays the kernels read),
- the seal plan of the step (staging pages to seal) and of its direct seals (scratch pages),
- the CUDA-graph seal-plan buffer and whether the current step runs inside a graph,
- the per-forward-batch kernel metadata the backend builds at the first layer.

Its life in one forward (docs/ARCHITECTURE.md):

1. SGLang's scheduler allocates (`OscarPagedAllocator.alloc_extend` / `alloc_decode`) and the radix
   cache locks / inserts: each records its event here (`events`), and `reserve_staging` refuses an
   allocation whose open pages staging could not hold (SGLang retries or retracts, nothing lost).
2. The backend's `init_forward_metadata` calls :meth:`begin`: **one** runtime call applies the
   events, and the answer updates `page_map` / `scratch_map` and sets the seal plans.
3. Each layer's write (`OscarKVPool.set_kv_buffer`, or the fused decode launch) reads the maps and
   seals the plans' pages; the last layer calls :meth:`end_layer`, which ends the step.
4. After SGLang processed the step's results (releases, radix inserts, unlocks), :meth:`flush` hands
   those events to the runtime, so metrics show the state after the step.

`clear` (SGLang's flush_cache) resets the runtime and both maps. Nothing here imports SGLang.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..errors import StagingExhausted
from ..runtime import EventBatch, OscarRuntime, StepResult

__all__ = ["OscarStep", "StepEvents"]


class StepEvents(EventBatch):
    """`EventBatch` whose page ids may be device tensors: they are copied to pinned host memory
    without blocking and read only when the batch is drained (after the copy's event)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        super().__init__()
        self._event: Any = None

    def clear(self) -> None:
        super().clear()
        self._event = None

    def host_ids(self, ids: "np.ndarray | torch.Tensor") -> np.ndarray:
        """Page ids as an int64 host array; a device tensor's values arrive before :meth:`drain`."""
        if isinstance(ids, np.ndarray):
            return ids.astype(np.int64, copy=False).reshape(-1)
        if ids.device.type == "cpu":
            return ids.numpy().astype(np.int64, copy=False).reshape(-1)
        host = torch.empty(ids.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._event.record()
        return host.numpy().reshape(-1)  # read only in drain(), after the event

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ops, ids)`` of every recorded event; the batch is empty afterwards."""
        if self._event is not None:
            # Waits for the copies only (recorded right after the allocation kernels), not for the
            # forward enqueued behind them.
            self._event.synchronize()
        ops, ids = self.arrays()
        self.clear()
        return ops, ids


class OscarStep:
    """The state of one scheduler step over an OScaR pool (see the module docstring).

    Args:
        runtime: the page runtime (its staging and scratch slot counts size the plans).
        device: where the maps and plans live (the pool's device).
    """

    def __init__(self, runtime: OscarRuntime, *, device: "str | torch.device") -> None:
        self.runtime = runtime
        self.device = torch.device(device)
        self.num_staging = runtime.staging_slots
        self.num_scratch = runtime.scratch_slots
        self.events = StepEvents()
        self.pending_opens = 0  # staging reserved by the logged allocations
        self.pending_direct = 0  # scratch (direct seals) the logged allocations will take
        self.page_map = torch.full((runtime.num_pages,), -1, dtype=torch.int32, device=self.device)
        self.scratch_map = torch.full((runtime.num_pages,), -1, dtype=torch.int32, device=self.device)
        self.seal_host: list[tuple[int, int]] = []  # (page, staging page) to seal in this forward
        self.seal_plan: torch.Tensor | None = None
        self.direct_host: list[tuple[int, int]] = []  # (page, scratch page) of this forward
        self.direct_plan: torch.Tensor | None = None
        self._direct_pages: torch.Tensor | None = None
        self.begun = False
        self.layers_done = 0  # layers of the begun forward that wrote and sealed (see `begin`)
        self.in_graph = False
        self._meta: tuple[Any, Any, dict[str, Any]] | None = None
        self.graph_plan: torch.Tensor | None = None
        self._graph_plan_host: torch.Tensor | None = None

    # -- recording (the allocator and the radix-cache hooks) --------------------------------------
    def reserve_staging(self, new_pages: int, whole_new_pages: int = 0) -> tuple[int, int]:
        """Reserve staging for the pages an allocation is about to open: ``new_pages`` in all, of
        which ``whole_new_pages`` its write fills entirely (a prefill chunk's whole pages: the
        runtime seals them directly from scratch while this step's scratch lasts, and they take no
        staging). Raises `StagingExhausted` (before SGLang hands anything out) when staging could not
        hold the rest. Returns the reservation, for `unreserve_staging`."""
        direct = min(whole_new_pages, self.num_scratch - self.pending_direct)
        need = new_pages - direct
        if need > 0:
            available = self.runtime.staging_available() - self.pending_opens
            if need > available:
                raise StagingExhausted(
                    f"OScaR staging pool too small: {need} page(s) would stay open this step, "
                    f"{available} of {self.runtime.staging_slots} staging pages are available; "
                    "size it with oscar_sgl.runtime.staging_slots_needed()",
                    {"capacity": self.runtime.staging_slots, "page": None, "event": None},
                )
        self.pending_opens += need
        self.pending_direct += direct
        return need, direct

    def unreserve_staging(self, reservation: tuple[int, int]) -> None:
        """The allocation that made ``reservation`` failed (SGLang had no free pages)."""
        self.pending_opens -= reservation[0]
        self.pending_direct -= reservation[1]

    # -- the step ------------------------------------------------------------------------------
    def start_forward(self) -> None:
        """The backend's `init_forward_metadata` (an eager forward): begin a new step."""
        self.in_graph = False
        self.begin(new_step=True)

    def begin(self, new_step: bool = False) -> StepResult | None:
        """Once per forward batch, before its first layer: hand the step's events to the runtime
        (one call), apply the page -> staging map changes, set the seal plans. Returns the runtime's
        answer, or None when the step had already begun.

        Idempotent within a forward (the last layer ends the step). With `new_step` (the backend's
        `init_forward_metadata`) while a step is still begun (its forward never finished its last
        layer): with nothing recorded since, the same step is kept (the same batch again: a second
        `init_forward_metadata`, or a retry after a fault mid-step); otherwise a step whose layers
        never ran keeps its seal plans, merged into the new ones, so no seal is lost, and a step
        that failed mid-way (some layers done, its batch since aborted) is dropped."""
        if self.begun and not new_step:
            return None
        if self.begun and not len(self.events):
            # The forward that began this step never finished its last layer and nothing was
            # recorded since: the same batch again (init_forward_metadata twice for one forward,
            # or a retry after a fault mid-step). Its step already reached the runtime and the
            # maps: keep it as is (a runtime call now would retire the staging pages its seals
            # still read); every layer writes and seals again.
            self.layers_done = 0
            self._meta = None
            return None
        if self.begun and self.layers_done:
            # A forward that raised mid-step (some layers had written and sealed), then events:
            # the scheduler moved on (SGLang 0.5.23's does not survive such a fault; an in-process
            # caller aborts the batch, releasing its pages). Its seals are dropped, not carried
            # into this step: their pages belong to aborted requests and may be handed out again.
            self._drop_failed_forward()
        carried = self.seal_host if self.begun else []
        carried_direct = self.direct_host if self.begun else []
        ops, ids = self.events.drain()
        self.pending_opens = self.pending_direct = 0
        res = self.runtime.step_arrays(ops, ids)
        self._meta = None
        if len(res.map_delta):
            d = torch.from_numpy(res.map_delta.astype("int64"))
            if self.device.type != "cpu":
                d = d.pin_memory().to(self.device, non_blocking=True)
            self.page_map[d[:, 0]] = d[:, 1].to(torch.int32)
        plan = res.seal_plan
        rows = [(int(a), int(b)) for a, b in plan[plan[:, 0] >= 0].tolist()]
        # Plan slots past the staging pool name scratch pages: this step's direct seals.
        self.seal_host = carried + [(a, b) for a, b in rows if b < self.num_staging]
        new_direct = [(a, b - self.num_staging) for a, b in rows if b >= self.num_staging]
        if carried_direct and new_direct:
            # The runtime numbers each step's scratch pages from 0: move the new ones clear of the
            # carried ones (this forward's layers seal both).
            used = {x for _, x in carried_direct}
            free = [i for i in range(self.num_scratch) if i not in used]
            if len(free) < len(new_direct):
                raise RuntimeError(f"OScaR: {len(carried_direct) + len(new_direct)} direct seals in one forward, "
                                   f"over the {self.num_scratch} scratch pages")
            new_direct = [(a, free[i]) for i, (a, _) in enumerate(new_direct)]
        self.direct_host = carried_direct + new_direct
        self.seal_plan = self._device_pairs(self.seal_host)
        if self._direct_pages is not None:  # the last step's direct pages are sealed: unmap
            self.scratch_map[self._direct_pages] = -1
            self._direct_pages = None
        self.direct_plan = self._device_pairs(self.direct_host)
        if self.direct_plan is not None:
            self._direct_pages = self.direct_plan[:, 0].to(torch.int64)
            self.scratch_map[self._direct_pages] = self.direct_plan[:, 1]
        self.begun = True
        return res

    def _device_pairs(self, rows: list[tuple[int, int]]) -> torch.Tensor | None:
        return torch.tensor(rows, dtype=torch.int32).to(self.device) if rows else None

    def end_layer(self, layer: int, num_layers: int) -> None:
        """A layer wrote and sealed; the last one ends the step."""
        self.layers_done += 1
        if layer == num_layers - 1:
            self.begun = False
            self.layers_done = 0

    def _drop_failed_forward(self) -> None:
        """A forward raised mid-step and its batch was not retried: close the step without its
        seal plans. The runtime already counts those pages as sealed; the requests that own them
        were aborted, so SGLang releases them (the next step or flush frees them and the staging)."""
        self.seal_host, self.direct_host = [], []
        self.seal_plan = self.direct_plan = None
        self.begun = False
        self.layers_done = 0
        self._meta = None

    def flush(self) -> bool:
        """Between steps: the events SGLang logged after the last forward (finished requests'
        releases, radix inserts, unlocks) reach the runtime now instead of at the next step, so the
        page states and staging use it reports are those after the step. Skipped while a forward is
        under way (its seals still need their staging pages) and when the log already holds the next
        batch's allocations. Returns whether events were applied."""
        if not len(self.events) or self.pending_opens or not self.events.only_between_steps():
            return False
        if self.begun:
            if not self.layers_done:  # a forward under way (or begun, no layer yet)
                return False
            # A forward that raised mid-step, then result-processing events (its batch aborted):
            # without this, an idle server would keep reporting its pages open until a next step.
            self._drop_failed_forward()
        ops, ids = self.events.drain()
        self.runtime.flush_arrays(ops, ids)
        return True

    def clear(self) -> None:
        """SGLang's allocator was cleared (flush_cache, resize): every page free, no event pending, no
        page in staging, no seal planned."""
        self.events.clear()
        self.pending_opens = self.pending_direct = 0
        self.runtime.reset()
        self.seal_host, self.direct_host = [], []
        self.seal_plan = self.direct_plan = self._direct_pages = None
        self.begun = False
        self.layers_done = 0
        self._meta = None
        self.page_map.fill_(-1)
        self.scratch_map.fill_(-1)

    def batch_meta(self, key: Any, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Per-forward-batch metadata (``key``: the forward batch and mode): built by the first layer
        that asks, reused by the others, dropped when the next step begins."""
        if self._meta is not None and self._meta[0] is key[0] and self._meta[1] == key[1]:
            return self._meta[2]
        meta = build()
        self._meta = (key[0], key[1], meta)
        return meta

    # -- CUDA graphs (decode; see backend.py) -------------------------------------------------------
    def graph_plan_init(self, capacity: int) -> None:
        """A fixed ``[capacity, 2]`` seal plan that captured seal launches read (rows -1: none)."""
        self.graph_plan = torch.full((capacity, 2), -1, dtype=torch.int32, device=self.device)
        self._graph_plan_host = torch.full((capacity, 2), -1, dtype=torch.int32)

    def graph_plan_stage(self) -> None:
        """Out of the graph: begin the step, copy its seal plan into the fixed plan buffer, and close
        the step on the host (every layer's write and seal run inside the graph)."""
        if self.graph_plan is None or self._graph_plan_host is None:
            raise RuntimeError("OScaR: graph_plan_init was not called before a captured step")
        self.in_graph = True
        self.begin(new_step=True)
        cap = self.graph_plan.shape[0]
        if self.direct_host:
            raise RuntimeError("OScaR: a decode step cannot seal pages directly (they open and fill in "
                               "one prefill step); this is a bookkeeping error")
        if len(self.seal_host) > cap:
            raise RuntimeError(f"OScaR: {len(self.seal_host)} pages to seal in one decode step, over the "
                               f"CUDA-graph plan buffer of {cap}")
        self._graph_plan_host.fill_(-1)
        if self.seal_host:
            self._graph_plan_host[: len(self.seal_host)] = torch.tensor(self.seal_host, dtype=torch.int32)
        self.graph_plan.copy_(self._graph_plan_host)
        self.begun = False

