"""A small scheduler that drives SGLang's real radix caches the way SGLang's scheduler does, for the
allocator and prefix-sharing tests (`tests/test_runtime_sglang.py`, `tests/test_sglang_prefix_sharing.py`).

One `RadixCache` or `UnifiedRadixCache` (Rust TreeCore) over an `OscarPagedAllocator`, and per
request: match -> lock -> alloc_extend / alloc_decode -> forward -> insert + free duplicates ->
relock / unlock -> evict. What a step's forward does is the subclass's: `forward` runs after each
allocation, `idle` is a scheduler step without a forward. Needs SGLang: import it after
`pytest.importorskip("sglang")`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from oscar_sgl.runtime import OscarRuntime
from oscar_sgl.sglang.allocator import OscarPagedAllocator, attach_radix_cache

KINDS = ["radix", "unified"]


@dataclass
class Req:
    """One request: its tokens (prompt, then what it will generate) and the scheduler's view of it."""

    tokens: list[int]
    prompt_len: int
    max_len: int
    chunk: int  # prefill tokens per extend step (chunked prefill)
    rid: int  # its row of the req_to_token pool
    row: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # token -> KV slot
    seq_len: int = 0
    protected: int = 0  # leading slots owned by the radix tree (matched or checkpointed)
    lock: Any = None


class FakeScheduler:
    """SGLang's scheduler around one radix cache (`kind`: "radix" or "unified") and `alloc`."""

    def __init__(self, kind: str, alloc: OscarPagedAllocator, req_to_token_pool: ReqToTokenPool, *,
                 page_size: int, gen_token: Callable[[int], int]) -> None:
        params = CacheInitParams(
            disable=False, req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=alloc,
            page_size=page_size, tree_components=(ComponentType.FULL,) if kind == "unified" else None,
        )
        self.kind = kind
        self.alloc = alloc
        self.page_size = page_size
        self.size = alloc.size
        self.gen_token = gen_token  # the i-th generated token of every request
        self.cache: Any = RadixCache(params) if kind == "radix" else UnifiedRadixCache(params)
        attach_radix_cache(self.cache, alloc)
        self.next_row = 0

    @property
    def rt(self) -> OscarRuntime:
        return self.alloc.oscar_step.runtime

    # ---- what the subclass does ----

    def forward(self, reqs: list[Req], pre: list[int], seq: list[int], out: torch.Tensor, decode: bool) -> None:
        """The step's forward: request i computes positions pre[i]..seq[i] into the slots `out`."""
        raise NotImplementedError

    def idle(self) -> None:
        """A scheduler step with no forward (the runtime still sees its events)."""
        raise NotImplementedError

    def page_map(self) -> np.ndarray | torch.Tensor:
        """The device's page -> staging map."""
        raise NotImplementedError

    # ---- what the scheduler does per request ----

    def key(self, tokens: list[int]) -> RadixKey:
        return RadixKey(array("q", tokens))

    def admit(self, tokens: list[int], *, gen: int, chunk: int) -> Req:
        """Match the prompt (all but its last token) in the tree and lock what matched."""
        self.next_row += 1
        r = Req(tokens=list(tokens) + [self.gen_token(i) for i in range(gen)], prompt_len=len(tokens),
                max_len=len(tokens) + gen, chunk=chunk, rid=self.next_row)
        m = self.cache.match_prefix(MatchPrefixParams(key=self.key(tokens[: len(tokens) - 1])))
        r.row = torch.zeros(r.max_len, dtype=torch.int64)
        if m.device_prefix_len:
            r.row[: m.device_prefix_len] = self.cache.path_device_indices(m.last_device_node)[: m.device_prefix_len]
        r.seq_len = r.protected = m.device_prefix_len
        r.lock = self.cache.lock(m.last_device_node)
        return r

    def extend(self, reqs: list[Req]) -> None:
        """One prefill batch: every request computes its next chunk."""
        pre = [r.seq_len for r in reqs]
        seq = [min(r.seq_len + r.chunk, r.prompt_len) for r in reqs]
        last = [int(r.row[p - 1]) if p > 0 else -1 for r, p in zip(reqs, pre)]
        t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        out = self.alloc.alloc_extend(t(pre), t(pre), t(seq), t(seq), t(last), sum(seq) - sum(pre))
        assert out is not None, "pool exhausted: evict first"
        at = 0
        for r, p, s in zip(reqs, pre, seq):
            r.row[p:s] = out[at : at + s - p]
            at += s - p
            r.seq_len = s
        self.forward(reqs, pre, seq, out, decode=False)

    def decode(self, reqs: list[Req]) -> None:
        """One decode batch: every request computes one token."""
        seq = [r.seq_len + 1 for r in reqs]
        t = torch.tensor(seq, dtype=torch.int64)
        last = torch.stack([r.row[r.seq_len - 1] for r in reqs])
        out = self.alloc.alloc_decode(t, t, last)
        assert out is not None
        for r, loc in zip(reqs, out):
            r.row[r.seq_len] = loc
            r.seq_len += 1
        self.forward(reqs, [s - 1 for s in seq], seq, out, decode=True)

    def _insert(self, r: Req) -> int:
        """Insert the page-aligned prefix; the duplicates it exposes are freed as each cache does it:
        RadixCache by its caller (`_insert_cache`), UnifiedRadixCache by the tree itself from
        `prev_prefix_len` on (`checkpoint_into_tree`)."""
        key = self.key(r.tokens[: r.seq_len]).page_aligned(self.page_size)
        n = len(key)
        if self.kind == "unified":
            self.cache.insert(InsertParams(key=key, value=r.row[:n].clone(), prev_prefix_len=r.protected))
        else:
            result = self.cache.insert(InsertParams(key=key, value=r.row[:n].clone()))
            dup = r.row[r.protected : result.prefix_len]
            if dup.numel():
                self.alloc.free_segment(dup, start_pos=r.protected)
        return n

    def checkpoint(self, r: Req) -> None:
        """cache_unfinished_req (chunked prefill): insert, adopt the tree's pages, move the lock."""
        n = self._insert(r)
        m = self.cache.match_prefix(MatchPrefixParams(key=self.key(r.tokens[:n])))
        assert m.device_prefix_len == n
        r.row[:n] = self.cache.path_device_indices(m.last_device_node)[:n]
        r.protected = n
        self.cache.unlock(r.lock)
        r.lock = self.cache.lock(m.last_device_node)

    def extend_step(self, reqs: list[Req]) -> None:
        """A whole prefill step of ``reqs``: ``extend`` (whose forward runs the step; a subclass
        whose step is a separate call overrides this)."""
        self.extend(reqs)

    def chunked_prefill(self, r: Req) -> None:
        """Prefill ``r`` chunk by chunk, as SGLang's chunked prefill does: every chunk but the last
        is checkpointed into the tree."""
        while r.seq_len < r.prompt_len:
            self.extend_step([r])
            if r.seq_len < r.prompt_len:
                self.checkpoint(r)

    def make_room(self, r: Req) -> None:
        """What SGLang's scheduler does before a prefill that does not fit: evict unlocked leaves
        until the pages of ``r`` (once fully decoded) are free."""
        need = -(-r.max_len // self.page_size) * self.page_size
        if self.alloc.available_size() < need:
            self.cache.evict(EvictParams(num_tokens=need - self.alloc.available_size()))

    def finish(self, r: Req) -> None:
        """cache_finished_req: insert, free the tail page, drop the lock."""
        n = self._insert(r)
        tail = r.row[n : r.seq_len]
        if tail.numel():
            self.alloc.free_segment(tail, start_pos=n)
        self.cache.unlock(r.lock)

    def abort(self, r: Req) -> None:
        """Abort, or retraction (SGLang's `release_kv_cache(checkpoint=False)`: the KV is dropped and
        recomputed later): free what the request owns, drop the lock, insert nothing."""
        own = r.row[r.protected : r.seq_len]
        if own.numel():
            self.alloc.free_segment(own, start_pos=r.protected)
        self.cache.unlock(r.lock)

    def evict_all_and_check(self) -> None:
        """Evict the whole tree: every page, staging page and map entry must come back."""
        self.cache.evict(EvictParams(num_tokens=self.size))
        self.idle()
        self.idle()  # the last seals' staging pages come back when the next step starts
        s = self.rt.stats()
        assert self.alloc.available_size() == self.size, "SGLang did not get every page back"
        assert s.free_pages == s.total_pages and s.open_pages == 0 and s.locked_pages == 0, s
        assert self.rt.staging_free() == self.rt.staging_slots, "a staging page leaked"
        assert bool((self.page_map() == -1).all()), "the device page map still names a staging page"
        self.rt.check()
