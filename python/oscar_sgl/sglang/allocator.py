"""SGLang's paged KV allocator, forwarding every page event to the OScaR runtime.

`OscarPagedAllocator` subclasses SGLang's `PagedTokenToKVPoolAllocator` and changes none of its
decisions: SGLang still owns the free list. Each allocation, write and release is only *recorded*, as
it happens, into the step owner's event batch (`step.OscarStep.events`: host arrays for the
CPU-known lengths, device page ids copied to pinned host memory without blocking); the step owner
hands the whole step to the Rust runtime in **one** call (`OscarStep.begin`).

Writes are derived from SGLang's own arguments: ``alloc_extend`` writes tokens
``[prefix_len, seq_len)`` of each row, ``alloc_decode`` one token at ``seq_len - 1``. The page of
every written token comes from the slots SGLang returns (``out_cache_loc // page_size``, gathered
at page starts), so nothing depends on how SGLang orders its free list.

Radix-cache events (lock, unlock, insert) come from :func:`attach_radix_cache`, which wraps one cache
instance (``RadixCache`` or ``UnifiedRadixCache``) without touching its class.

In the server (``--kv-cache oscar``) the plug-in builds this allocator over the ``OscarKVPool`` with
the pool's step owner (``step=pool.oscar_step``); the backend's ``init_forward_metadata`` begins the
step.

``OscarPagedAllocator`` is ``OscarPagedAllocatorMixin`` over SGLang's ``PagedTokenToKVPoolAllocator``
(`classes.sglang_subclass`), resolved on first access: importing this module (or ``oscar_sgl``) does
not need SGLang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .classes import sglang_subclass
from .step import OscarStep

if TYPE_CHECKING:
    import torch

__all__ = ["OscarPagedAllocatorMixin", "attach_radix_cache", "extend_page_starts"]


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
    tensor (copied to host by `StepEvents.host_ids`, without a sync)."""
    if slots.device.type == "cpu":
        return slots.numpy().reshape(-1) // page_size
    return slots.reshape(-1) // page_size


class OscarPagedAllocatorMixin:
    """`PagedTokenToKVPoolAllocator` that records its page events into an :class:`OscarStep`.

    Args:
        size, page_size, dtype, device, kvcache, need_sort: as SGLang's allocator.
        step: the step owner; its runtime's ``num_pages`` must cover SGLang's page ids
            (``size // page_size + 1``) and its ``page_size`` must match.
    """

    def __init__(self, size: int, page_size: int, dtype: "torch.dtype", device: str, kvcache: Any,
                 need_sort: bool, *, step: OscarStep) -> None:
        # SGLang's __init__ calls clear(), which must not reach the step yet.
        self._oscar: OscarStep | None = None
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)  # type: ignore[call-arg]
        rt = step.runtime
        if rt.page_size != page_size:
            raise RuntimeError(f"runtime page_size {rt.page_size} != allocator page_size {page_size}")
        if rt.num_pages < self.num_pages + 1:  # type: ignore[attr-defined]
            raise RuntimeError(
                f"runtime has {rt.num_pages} pages, SGLang uses ids 0..{self.num_pages} "  # type: ignore[attr-defined]
                f"(size {size} / page_size {page_size} + the padding page)"
            )
        step.clear()
        self._oscar = step

    @property
    def oscar_step(self) -> OscarStep:
        if self._oscar is None:
            raise RuntimeError("the allocator is still being constructed")
        return self._oscar

    def _reserve(self, new_pages: int, whole_new_pages: int = 0) -> tuple[int, int]:
        if self._oscar is None:
            return 0, 0
        return self._oscar.reserve_staging(new_pages, whole_new_pages)

    def _unreserve(self, reservation: tuple[int, int]) -> None:
        if self._oscar is not None:
            self._oscar.unreserve_staging(reservation)

    def _record(self, op: str, ids: "np.ndarray | torch.Tensor", *args: np.ndarray) -> None:
        """Record one event (an `EventBatch` method name) whose page ids are ``ids``."""
        if self._oscar is not None:
            ev = self._oscar.events
            getattr(ev, op)(*args, ev.host_ids(ids))

    def record_lock(self, pages: "np.ndarray | torch.Tensor") -> None:
        """Radix lock on each page (the path root -> locked node)."""
        self._record("lock", pages)

    def record_unlock(self, pages: "np.ndarray | torch.Tensor") -> None:
        self._record("unlock", pages)

    def record_share(self, pages: "np.ndarray | torch.Tensor") -> None:
        """Pages held by the radix cache after an insert."""
        self._record("share", pages)

    # ---- SGLang's allocator interface ----

    def alloc(self, need_size: int) -> "torch.Tensor | None":
        ps: int = self.page_size  # type: ignore[attr-defined]
        num = need_size // ps
        reservation = self._reserve(num)
        out: torch.Tensor | None = super().alloc(need_size)  # type: ignore[misc]
        if out is None:
            self._unreserve(reservation)
            return None
        self._record("alloc", _page_ids(out[::ps], ps))
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
        ps: int = self.page_size  # type: ignore[attr-defined]
        first_new = (p + ps - 1) // ps  # each row's first page that this write opens
        new = int(((s + ps - 1) // ps - first_new).sum())
        whole = int(np.maximum(s // ps - first_new, 0).sum())  # new pages the write fills
        reservation = self._reserve(new, whole)
        out: torch.Tensor | None = super().alloc_extend(  # type: ignore[misc]
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, num_new_pages
        )
        if out is None:
            self._unreserve(reservation)
            return None
        starts = torch.from_numpy(extend_page_starts(p, s, ps))
        if out.device.type != "cpu":
            starts = starts.pin_memory().to(out.device, non_blocking=True)
        self._record("extend", _page_ids(out[starts], ps), p, s)
        return out

    def alloc_decode(
        self,
        seq_lens: "torch.Tensor",
        seq_lens_cpu: "torch.Tensor",
        last_loc: "torch.Tensor",
    ) -> "torch.Tensor | None":
        s = _cpu_i64(seq_lens_cpu)
        ps: int = self.page_size  # type: ignore[attr-defined]
        new = int(np.count_nonzero((s - 1) % ps == 0))
        reservation = self._reserve(new)  # a decode write never fills a new page whole (no direct seal)
        out: torch.Tensor | None = super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)  # type: ignore[misc]
        if out is None:
            self._unreserve(reservation)
            return None
        self._record("decode", _page_ids(out, ps), s)
        return out

    def _release_page_ids(self, *page_ids: "torch.Tensor") -> None:
        super()._release_page_ids(*page_ids)  # type: ignore[misc]
        for ids in page_ids:
            self._record("release", ids.reshape(-1))

    def clear(self) -> None:
        """SGLang's `clear()` (flush_cache, resize): every page free, here and in the step owner
        (runtime, maps, plans)."""
        super().clear()  # type: ignore[misc]
        if self._oscar is None:
            return
        if self._oscar.runtime.num_pages < self.num_pages + 1:  # type: ignore[attr-defined]
            raise RuntimeError(
                f"OScaR allocator: {self.num_pages} pages exceed the runtime's "  # type: ignore[attr-defined]
                f"{self._oscar.runtime.num_pages - 1}; the allocator was resized past its pool (use resize(), "
                "which refuses that)"
            )
        self._oscar.clear()

    def oscar_page_capacity(self) -> int:
        """Most pages this allocator may hand out: the pool's packed arrays, its page map and the
        runtime are sized once, at construction (page 0 is SGLang's padding page)."""
        pages = self.oscar_step.runtime.num_pages
        pool_pages = getattr(self._kvcache, "num_pages", None)  # type: ignore[attr-defined]
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
        new_pages = int(config.max_total_num_tokens) // self.page_size  # type: ignore[attr-defined]
        cap = self.oscar_page_capacity()
        if new_pages > cap:
            raise ValueError(
                f"--kv-cache oscar: cannot resize the KV allocator to {config.max_total_num_tokens} tokens "
                f"({new_pages} pages of {self.page_size}): the OScaR pool was built with {cap} pages "
                f"({cap * self.page_size} tokens) and its packed arrays, page map and runtime do not grow"
            )
        super().resize(config)  # type: ignore[misc]


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


def allocator_class() -> type:
    """`OscarPagedAllocator`: the mixin over SGLang's `PagedTokenToKVPoolAllocator`."""
    return sglang_subclass(OscarPagedAllocatorMixin, "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator",
                           "OscarPagedAllocator")


def __getattr__(name: str) -> Any:
    if name == "OscarPagedAllocator":
        return allocator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
