"""SGLang's paged KV allocator, forwarding every page event to the OScaR runtime.

`OscarPagedAllocator` subclasses SGLang's `PagedTokenToKVPoolAllocator` and changes none of its
decisions: SGLang still owns the free list. Each allocation, write and release is recorded as it
happens (host arrays for the CPU-known lengths, device tensors for the page ids, copied to pinned
host memory without blocking), and :meth:`OscarPagedAllocator.oscar_step` hands the whole step to
the Rust runtime in **one** call, returning the seal plan and the page -> staging map changes.

Writes are derived from SGLang's own arguments: ``alloc_extend`` writes tokens
``[prefix_len, seq_len)`` of each row, ``alloc_decode`` one token at ``seq_len - 1``. The page of
every written token comes from the slots SGLang returns (``out_cache_loc // page_size``, gathered
at page starts), so nothing depends on how SGLang orders its free list.

Radix-cache events (lock, unlock, insert) come from :func:`attach_radix_cache`, which wraps one cache
instance (``RadixCache`` or ``UnifiedRadixCache``) without touching its class.

In the server (``--kv-cache oscar``) the plug-in builds this allocator over the ``OscarKVPool`` with
the pool's runtime; the allocator attaches itself to the pool (``pool.oscar_attach``), and the pool
makes the step's one :meth:`OscarPagedAllocator.oscar_step` call from the backend's
``init_forward_metadata`` (``OscarKVPool.oscar_begin_step``).

SGLang is imported lazily: ``OscarPagedAllocator`` is built on first access, so importing this
module (or ``oscar_sgl``) does not need SGLang.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import StagingExhausted
from ..runtime import (
    OP_ALLOC,
    OP_DECODE,
    OP_EXTEND,
    OP_LOCK,
    OP_RELEASE,
    OP_SHARE,
    OP_UNLOCK,
    OP_WRITE,
    OscarRuntime,
    StepResult,
)

if TYPE_CHECKING:
    import torch

__all__ = ["OscarPagedAllocator", "attach_radix_cache", "extend_page_starts"]


def extend_page_starts(prefix_lens: np.ndarray, seq_lens: np.ndarray, page_size: int) -> np.ndarray:
    """Offsets into ``alloc_extend``'s output of every token that starts a written page run.

    For each row (tokens ``[p, s)`` laid out consecutively in the output), the row's first token
    and each later token at a page boundary: exactly one offset per page the row writes, in order.
    """
    p = prefix_lens.astype(np.int64, copy=False)
    s = seq_lens.astype(np.int64, copy=False)
    ext = s - p
    count = np.where(ext > 0, (s - 1) // page_size - p // page_size + 1, 0)
    row_start = np.cumsum(ext) - ext
    row = np.repeat(np.arange(p.size), count)
    k = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    first_boundary = page_size - p % page_size  # == page_size when p is page-aligned
    local = np.where(k == 0, 0, first_boundary[row] + (k - 1) * page_size)
    starts: np.ndarray = row_start[row] + local
    return starts


def _cpu_i64(t: "torch.Tensor") -> np.ndarray:
    arr: np.ndarray = np.ascontiguousarray(t.numpy(), dtype=np.int64).reshape(-1)
    return arr


def _page_ids(slots: "torch.Tensor", page_size: int) -> "np.ndarray | torch.Tensor":
    """Page of each slot: a numpy array for host tensors (cheaper than a torch op), else a device
    tensor (copied to host later, without a sync)."""
    if slots.device.type == "cpu":
        return slots.numpy().reshape(-1) // page_size
    return slots.reshape(-1) // page_size


#: Events that write or open pages: only a step may apply them (the runtime refuses them in a flush).
_STEP_OPS = frozenset((OP_EXTEND, OP_DECODE, OP_ALLOC, OP_WRITE))


class _EventLog:
    """One step's events: host records plus page ids (host arrays, or device tensors copied to
    pinned host memory without a sync)."""

    __slots__ = ("ops", "ids", "event", "pending_opens")

    def __init__(self) -> None:
        self.ops: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.event: Any = None
        self.pending_opens = 0

    def clear(self) -> None:
        self.ops.clear()
        self.ids.clear()
        self.event = None
        self.pending_opens = 0

    def push(self, op: int, n: int, args: np.ndarray | None, ids: "np.ndarray | torch.Tensor | None") -> None:
        head = np.array((op, n), dtype=np.int64)
        self.ops.append(head if args is None else np.concatenate((head, args)))
        if ids is None or len(ids) == 0:
            return
        if isinstance(ids, np.ndarray):
            # Fresh arrays computed here; SGLang never writes its page-id tensors in place.
            self.ids.append(ids.astype(np.int64, copy=False))
            return
        import torch

        if ids.device.type == "cpu":
            self.ids.append(ids.numpy().astype(np.int64, copy=False))
            return
        host = torch.empty(ids.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.event.record()
        # The numpy view is read only in drain(), after the event.
        self.ids.append(host.numpy())

    def only_between_steps(self) -> bool:
        """Whether every logged event may be flushed between two steps (none writes or opens a
        page: each record is one event, its opcode first)."""
        return self.pending_opens == 0 and not any(int(r[0]) in _STEP_OPS for r in self.ops)

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        if self.event is not None:
            # Waits for the copies only (recorded right after the allocation kernels), not for the
            # forward enqueued behind them.
            self.event.synchronize()
        ops = np.concatenate(self.ops) if self.ops else np.empty(0, dtype=np.int64)
        ids = np.concatenate(self.ids) if self.ids else np.empty(0, dtype=np.int64)
        self.clear()
        return ops, ids


@functools.cache
def _allocator_class() -> type:
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # type: ignore[import-untyped]

    class OscarPagedAllocator(PagedTokenToKVPoolAllocator):  # type: ignore[misc]
        """`PagedTokenToKVPoolAllocator` that mirrors its page events into an :class:`OscarRuntime`.

        Args:
            size, page_size, dtype, device, kvcache, need_sort: as SGLang's allocator.
            runtime: the page runtime; its ``num_pages`` must cover SGLang's page ids
                (``size // page_size + 1``) and its ``page_size`` must match.
        """

        def __init__(
            self,
            size: int,
            page_size: int,
            dtype: "torch.dtype",
            device: str,
            kvcache: Any,
            need_sort: bool,
            *,
            runtime: OscarRuntime,
        ) -> None:
            # SGLang's __init__ calls clear(), which must not reach a runtime yet.
            self._oscar: OscarRuntime | None = None
            self._oscar_log = _EventLog()
            super().__init__(size, page_size, dtype, device, kvcache, need_sort)
            if runtime.page_size != page_size:
                raise ValueError(f"runtime page_size {runtime.page_size} != allocator page_size {page_size}")
            if runtime.num_pages < self.num_pages + 1:
                raise ValueError(
                    f"runtime has {runtime.num_pages} pages, SGLang uses ids 0..{self.num_pages} "
                    f"(size {size} / page_size {page_size} + the padding page)"
                )
            runtime.reset()
            self._oscar = runtime
            attach = getattr(kvcache, "oscar_attach", None)
            if attach is not None:  # an OscarKVPool: its page map and seals follow this runtime
                attach(self)

        # ---- the runtime side ----

        @property
        def oscar_runtime(self) -> OscarRuntime:
            if self._oscar is None:
                raise RuntimeError("the allocator is still being constructed")
            return self._oscar

        def oscar_step(self) -> StepResult:
            """Hand this step's events to the runtime (one call). Call once per forward batch,
            after the scheduler's allocations and before the first layer."""
            ops, ids = self._oscar_log.drain()
            return self.oscar_runtime.step_arrays(ops, ids)

        def oscar_flush(self) -> bool:
            """Between two steps, hand the runtime the events logged since the last step when all
            of them are result processing (releases, radix locks, unlocks, inserts), so its
            statistics are the state after the step. A log holding an allocation or a write (the
            next batch is being scheduled) stays for the next :meth:`oscar_step`. The caller makes
            sure no forward is in progress (`OscarKVPool.oscar_sync`). Returns whether it flushed."""
            log = self._oscar_log
            if self._oscar is None or not log.ops or not log.only_between_steps():
                return False
            ops, ids = log.drain()
            self._oscar.flush_arrays(ops, ids)
            return True

        def _reserve_staging(self, new_pages: int) -> None:
            if self._oscar is None or new_pages == 0:
                return
            log = self._oscar_log
            available = self._oscar.staging_available() - log.pending_opens
            if new_pages > available:
                raise StagingExhausted(
                    f"OScaR staging pool too small: {new_pages} page(s) would open this step, "
                    f"{available} of {self._oscar.staging_slots} staging pages are available; "
                    "size it with oscar_sgl.runtime.staging_slots_needed()",
                    {"capacity": self._oscar.staging_slots, "page": None, "event": None},
                )
            log.pending_opens += new_pages

        def _log(self, op: int, n: int, args: np.ndarray | None, ids: "np.ndarray | torch.Tensor | None") -> None:
            if self._oscar is not None:
                self._oscar_log.push(op, n, args, ids)

        def record_lock(self, pages: "np.ndarray | torch.Tensor") -> None:
            """Radix lock on each page (the path root -> locked node)."""
            self._log(OP_LOCK, len(pages), None, pages)

        def record_unlock(self, pages: "np.ndarray | torch.Tensor") -> None:
            self._log(OP_UNLOCK, len(pages), None, pages)

        def record_share(self, pages: "np.ndarray | torch.Tensor") -> None:
            """Pages held by the radix cache after an insert."""
            self._log(OP_SHARE, len(pages), None, pages)

        # ---- SGLang's allocator interface ----

        def alloc(self, need_size: int) -> "torch.Tensor | None":
            num = need_size // self.page_size
            self._reserve_staging(num)
            out: torch.Tensor | None = super().alloc(need_size)
            if out is None:
                self._oscar_log.pending_opens -= num if self._oscar is not None else 0
                return None
            self._log(OP_ALLOC, num, None, _page_ids(out[:: self.page_size], self.page_size))
            return out

        def alloc_extend(
            self,
            prefix_lens: "torch.Tensor",
            prefix_lens_cpu: "torch.Tensor",
            seq_lens: "torch.Tensor",
            seq_lens_cpu: "torch.Tensor",
            last_loc: "torch.Tensor",
            extend_num_tokens: int,
            num_new_pages: int | None = None,
        ) -> "torch.Tensor | None":
            import torch

            p, s = _cpu_i64(prefix_lens_cpu), _cpu_i64(seq_lens_cpu)
            ps = self.page_size
            new = int(((s + ps - 1) // ps - (p + ps - 1) // ps).sum())
            self._reserve_staging(new)
            out: torch.Tensor | None = super().alloc_extend(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, num_new_pages
            )
            if out is None:
                if self._oscar is not None:
                    self._oscar_log.pending_opens -= new
                return None
            starts = torch.from_numpy(extend_page_starts(p, s, ps))
            if out.device.type != "cpu":
                starts = starts.pin_memory().to(out.device, non_blocking=True)
            self._log(OP_EXTEND, p.size, np.concatenate((p, s)), _page_ids(out[starts], ps))
            return out

        def alloc_decode(
            self,
            seq_lens: "torch.Tensor",
            seq_lens_cpu: "torch.Tensor",
            last_loc: "torch.Tensor",
        ) -> "torch.Tensor | None":
            s = _cpu_i64(seq_lens_cpu)
            new = int(np.count_nonzero((s - 1) % self.page_size == 0))
            self._reserve_staging(new)
            out: torch.Tensor | None = super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)
            if out is None:
                if self._oscar is not None:
                    self._oscar_log.pending_opens -= new
                return None
            self._log(OP_DECODE, s.size, s, _page_ids(out, self.page_size))
            return out

        def _release_page_ids(self, *page_ids: "torch.Tensor") -> None:
            super()._release_page_ids(*page_ids)
            for ids in page_ids:
                self._log(OP_RELEASE, int(ids.numel()), None, ids.reshape(-1))

        def clear(self) -> None:
            """SGLang's `clear()` (flush_cache, resize): every page free, here and in the runtime and
            the pool (its page map and any seal plan it still holds)."""
            super().clear()
            if self._oscar is None:
                return
            self._oscar_log.clear()
            if self._oscar.num_pages < self.num_pages + 1:
                raise RuntimeError(
                    f"OScaR allocator: {self.num_pages} pages exceed the runtime's {self._oscar.num_pages - 1}; "
                    "the allocator was resized past its pool (use resize(), which refuses that)"
                )
            self._oscar.reset()
            on_clear = getattr(self._kvcache, "oscar_on_clear", None)
            if on_clear is not None:
                on_clear()

        def oscar_page_capacity(self) -> int:
            """Most pages this allocator may hand out: the pool's packed arrays, its page map and the
            runtime are sized once, at construction (page 0 is SGLang's padding page)."""
            pages = self.oscar_runtime.num_pages
            pool_pages = getattr(self._kvcache, "num_pages", None)
            if pool_pages is not None:
                pages = min(pages, int(pool_pages))
            return pages - 1

        def resize(self, config: Any) -> None:
            """SGLang's `resize(config)` (new `config.max_total_num_tokens`; every page is freed).

            SGLang 0.5.23 calls it from one place only: `ModelRunner.post_capture_resize_kv_pool`
            (kv_pool_runtime.py `compute_post_capture_kv_resize`), which the scheduler runs when
            `token_to_kv_pool.post_capture_active`, i.e. for a pool reserved as virtual memory before
            CUDA-graph capture and backed afterwards. An OScaR pool is never built that way
            (`post_capture_active=False`, CUDA graphs off), so a server never gets here. Should it,
            the pool, its page map and the runtime stay consistent: a resize within the pages they
            were built with is applied (the runtime keeps its size, so every page id stays valid),
            one past them is refused before anything changes: the packed arrays cannot grow."""
            new_pages = int(config.max_total_num_tokens) // self.page_size
            cap = self.oscar_page_capacity()
            if new_pages > cap:
                raise ValueError(
                    f"--kv-cache oscar: cannot resize the KV allocator to {config.max_total_num_tokens} tokens "
                    f"({new_pages} pages of {self.page_size}): the OScaR pool was built with {cap} pages "
                    f"({cap * self.page_size} tokens) and its packed arrays, page map and runtime do not grow"
                )
            super().resize(config)

    return OscarPagedAllocator


def _path_pages(cache: Any, node: Any, page_size: int) -> "np.ndarray | torch.Tensor":
    return _page_ids(cache.path_device_indices(node)[::page_size], page_size)


def attach_radix_cache(cache: Any, allocator: Any) -> None:
    """Forward a radix cache's locks, unlocks and inserts to ``allocator``'s runtime.

    Works for SGLang's ``RadixCache`` and ``UnifiedRadixCache``: both funnel every lock through
    ``inc_lock_ref`` / ``dec_lock_ref`` (each covering the root -> node path) and expose
    ``path_device_indices``. Only this instance is wrapped. Idempotent.
    """
    if getattr(cache, "_oscar_attached", False):
        return
    ps = allocator.page_size
    inc: Callable[..., Any] = cache.inc_lock_ref
    dec: Callable[..., Any] = cache.dec_lock_ref
    insert: Callable[..., Any] = cache.insert

    def inc_lock_ref(node: Any, *args: Any, **kwargs: Any) -> Any:
        result = inc(node, *args, **kwargs)
        if not cache.disable:
            allocator.record_lock(_path_pages(cache, node, ps))
        return result

    def dec_lock_ref(node: Any, *args: Any, **kwargs: Any) -> Any:
        if not cache.disable:
            allocator.record_unlock(_path_pages(cache, node, ps))
        return dec(node, *args, **kwargs)

    def insert_(params: Any, *args: Any, **kwargs: Any) -> Any:
        result = insert(params, *args, **kwargs)
        node = getattr(result, "last_device_node", None)
        if node is not None and not cache.disable:
            allocator.record_share(_path_pages(cache, node, ps))
        return result

    cache.inc_lock_ref = inc_lock_ref
    cache.dec_lock_ref = dec_lock_ref
    cache.insert = insert_
    cache._oscar_attached = True


def __getattr__(name: str) -> Any:
    if name == "OscarPagedAllocator":
        return _allocator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    class OscarPagedAllocator(PagedTokenToKVPoolAllocator):  # type: ignore[misc]
        def __init__(
            self,
            size: int,
            page_size: int,
            dtype: torch.dtype,
            device: str,
            kvcache: Any,
            need_sort: bool,
            *,
            runtime: OscarRuntime,
        ) -> None: ...
        @property
        def oscar_runtime(self) -> OscarRuntime: ...
        def oscar_step(self) -> StepResult: ...
        def record_lock(self, pages: np.ndarray | torch.Tensor) -> None: ...
        def record_unlock(self, pages: np.ndarray | torch.Tensor) -> None: ...
        def record_share(self, pages: np.ndarray | torch.Tensor) -> None: ...
