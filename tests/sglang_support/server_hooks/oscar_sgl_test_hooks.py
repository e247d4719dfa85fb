"""A second SGLang plug-in, for tests and benches only: never installed, it is active in a server
whose processes have this folder on their PYTHONPATH (`sglang_support.soak.hooks_env`), where
SGLang's `sglang.srt.plugins` entry points find it next to oscar-sgl's own. It changes no decision
of SGLang or of oscar-sgl; it adds, under `internal_states[i]["oscar_test"]` of `/server_info`:

- `evicted_tokens`: tokens the radix cache evicted since start (SGLang counts none);
- `running_reqs`, `waiting_reqs`: the scheduler's running batch and waiting queue;
- `available_tokens`, `total_tokens`: SGLang's allocator's free slots and its size;
- `sealed_pages`: the sha256 of every sealed page the radix tree holds, over all its bytes in every
  layer (codes, parameters, token scales), sorted (page ids do not matter), when the tree holds at
  most `MAX_DIGEST_PAGES` of them (else None): after `/flush_cache` and one conversation, the sealed
  bytes of that conversation's prefix;

and, when `OSCAR_TEST_FAULT=LAYER:TOKEN` is set, one injected fault: the first forward whose
batch holds token id TOKEN in its input raises `RuntimeError("oscar-sgl test fault ...")` in the
OScaR attention backend at layer LAYER, i.e. after the layers below it wrote and sealed: a fault in
the middle of a step.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

MAX_DIGEST_PAGES = 512
_evicted = 0
_fault_fired = False


def _after_add_memory_usage(result: Any, self: Any, state: dict, *args: Any, **kwargs: Any) -> Any:
    alloc = self.scheduler.token_to_kv_pool_allocator
    pool = alloc.get_kvcache()
    sched = self.scheduler
    running = getattr(getattr(sched, "running_batch", None), "reqs", None) or []
    out: dict[str, Any] = {"evicted_tokens": _evicted, "sealed_pages": None, "running_reqs": len(running),
                           "waiting_reqs": len(getattr(sched, "waiting_queue", []) or []),
                           "available_tokens": int(alloc.available_size()), "total_tokens": int(alloc.size)}
    if hasattr(pool, "oscar_step"):
        out["sealed_pages"] = sealed_page_digests(pool)
    state["oscar_test"] = out
    return result


def sealed_page_digests(pool: Any) -> list[str] | None:
    import torch

    rt = pool.oscar_runtime
    if rt.stats().tree_pages > MAX_DIGEST_PAGES:
        return None
    digests = []
    for page in range(1, rt.num_pages):
        info = rt.page_info(page)
        if info.state != "sealed" or info.owner != "tree":
            continue
        h = hashlib.sha256()
        for li in range(pool.layer_num):
            for buf in (pool.k_codes, pool.v_codes, pool.k_params, pool.v_params, pool.scales):
                if buf is not None:
                    h.update(buf[li][page].contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
        digests.append(h.hexdigest())
    return sorted(digests)


def _count_evicted(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    global _evicted
    result = original(self, *args, **kwargs)
    _evicted += int(getattr(result, "num_tokens_evicted", 0) or 0)
    return result


def _install_fault(spec: str) -> None:
    layer, token = (int(x) for x in spec.split(":"))
    from oscar_sgl.sglang import backend

    mixin = backend.OscarAttnBackendMixin

    def wrap(name: str) -> None:
        real = getattr(mixin, name)

        def forward(self: Any, q: Any, k: Any, v: Any, lyr: Any, forward_batch: Any, *a: Any, **kw: Any) -> Any:
            global _fault_fired
            if not _fault_fired and lyr.layer_id == layer:
                ids = getattr(forward_batch, "input_ids", None)
                if ids is not None and bool((ids == token).any()):
                    _fault_fired = True
                    raise RuntimeError(f"oscar-sgl test fault (OSCAR_TEST_FAULT={spec}) in {name} at layer {layer}")
            return real(self, q, k, v, lyr, forward_batch, *a, **kw)

        setattr(mixin, name, forward)

    wrap("forward_extend")
    wrap("forward_decode")


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.managers.scheduler_components.internal_state."
                          "SchedulerInternalStateController._add_memory_usage", _after_add_memory_usage,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.mem_cache.radix_cache.RadixCache.evict", _count_evicted, HookType.AROUND)
    HookRegistry.register("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._evict", _count_evicted,
                          HookType.AROUND)
    spec = os.environ.get("OSCAR_TEST_FAULT")
    if spec:
        _install_fault(spec)
