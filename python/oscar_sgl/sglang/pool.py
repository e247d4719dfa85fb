"""`OscarKVPool`: SGLang's MHA pool with OScaR pages (docs/LAYOUT.md, paged layout).

Per layer (leading axis = SGLang page id; page 0 is SGLang's padding page and is never read):

    k_codes  u8  [num_pages, H, P, D*b/8]      v_codes  u8  [num_pages, H, P, D*b/8]
    k_params f16 [num_pages, H, P/G_K, 2, D]   v_params f16 [num_pages, H, P, 2, D/G_V]
    scale    f32 [num_pages, P, S]             (absent when S = 0)
    stage_k, stage_v  [num_staging + 1, H, P, D]   staging of open pages (+ a sink page for padding):
                      reference path: model basis, model dtype; kernel path: rotated, BF16
    stage_scale f32 [num_staging + 1, P, S]    kernel path only: s_t computed at write time
    page_map  i32 [num_pages]                  page -> staging page (-1: read the packed pool)

and once, shared by every layer (used by one layer at a time):

    scratch_k, scratch_v, scratch_scale [num_scratch, ...]   as the staging, for direct seals
    scratch_map i32 [num_pages]                page -> scratch page during the step, else -1

A page is *open* while a request writes it: its tokens live in a staging page. Page state is owned
by the Rust runtime (`oscar_sgl.runtime.OscarRuntime`) behind `OscarPagedAllocator`: SGLang's
allocations, releases and radix-cache locks/inserts are recorded as events, and once per forward
batch (`oscar_begin_step`, from the backend's `init_forward_metadata`) one runtime call returns the
changes of the page -> staging map (applied to `page_map`, a device int32 array) and the seal plan:
the `(page, staging page)` pairs that became full in this step. Each layer's `set_kv_buffer` writes
the step's K/V into the mapped staging pages, then seals the plan's pages (rotate, scale, quantize,
pack). A sealed page keeps its staging page until the next step starts, so this step's attention
still reads it exactly; from the next step on it is read as codes.

*Direct seals*: a page that a prefill chunk opens and fills in one step is never read from staging
(the step's attention takes the chunk's own K/V from the forward), so the runtime gives it no staging
page but a scratch page (plan slot ``num_staging + k``). Each layer writes those tokens into the one
scratch buffer, seals them from there, and the next layer reuses it. Staging therefore holds only
the open page of each running request (and, within a step, the page it just filled), not the prefill
chunk: at Llama-3.1-8B shapes that is 4.3 GB less staging charged to the KV budget.

On CPU the seal is `oscar_sgl.reference.seal` (the oracle), one page at a time; on CUDA (or with
`OSCAR_SGL_USE_KERNELS=1`, see `kernels_wanted`) each layer runs one `oscar_write_kv` launch and one
`oscar_seal` launch for every page of the step's plan (see `backend.py`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ..config import OscarConfig
from .. import reference as ref
from ..runtime import OscarRuntime, scratch_slots_needed, staging_slots_needed


def cell_size_bytes(cfg: OscarConfig, num_kv_heads: int, head_dim: int, num_layers: int) -> int:
    """Bytes per token over all layers, what SGLang's pool sizer divides the KV budget by."""
    return int(math.ceil(cfg.bytes_per_token(num_kv_heads, head_dim) * num_layers))


def kernels_wanted(device: Any) -> bool:
    """Whether the pool/backend run the Triton kernels: on CUDA by default, elsewhere only with
    `OSCAR_SGL_USE_KERNELS=1` (and `TRITON_INTERPRET=1`, Triton's CPU interpreter: tiny shapes only).
    `OSCAR_SGL_USE_KERNELS=0` forces the torch reference path on CUDA too."""
    env = os.environ.get("OSCAR_SGL_USE_KERNELS", "")
    if env:
        return env not in ("0", "false", "no")
    return torch.device(device).type == "cuda"


def check_kernel_shape(cfg: OscarConfig, head_dim: int) -> None:
    """What the Triton kernels support (checked when the pool is built, never deep in a launch)."""
    cpw = 32 // cfg.bits
    if (head_dim * cfg.bits) % 32:
        raise ValueError(f"OScaR kernels: head_dim={head_dim} at {cfg.bits} bits is not a whole number of 32-bit words")
    if cfg.v_group % cpw:
        raise ValueError(f"OScaR kernels: --oscar-v-group must be a multiple of {cpw} at {cfg.bits} bits, got {cfg.v_group}")
    if cfg.k_group < 16 or cfg.residual % cfg.k_group:
        raise ValueError(f"OScaR kernels: --oscar-k-group must be >= 16 and divide the page size, got {cfg.k_group}")
    if cfg.residual % 32:
        # oscar_extend_attention walks sealed pages in tiles of 32 tokens
        raise ValueError(f"OScaR kernels: the page size must be a multiple of 32, got {cfg.residual}")


#: Running requests an OScaR server admits when --max-running-requests is not given (the plug-in
#: sets it, so SGLang never runs more requests than the staging pool holds open pages for).
DEFAULT_MAX_RUNNING_REQUESTS = 128
#: SGLang 0.5.23's default --max-prefill-tokens.
DEFAULT_MAX_PREFILL_TOKENS = 16384


def staging_slots_for(*, max_running_requests: int | None, max_prefill_tokens: int | None, page_size: int,
                      direct_seals: bool = True) -> int:
    """Staging pages the pool allocates before capping at its page count."""
    return staging_slots_needed(max_running_requests=max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
                                max_prefill_tokens=max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS,
                                page_size=page_size, direct_seals=direct_seals)


def scratch_slots_for(*, max_prefill_tokens: int | None, page_size: int) -> int:
    """Scratch pages for the direct seals of one step (one layer's worth)."""
    return scratch_slots_needed(max_prefill_tokens=max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS,
                                page_size=page_size)


def staging_bytes_upper_bound(cfg: OscarConfig, *, num_kv_heads: int, head_dim: int, num_layers: int,
                              max_running_requests: int | None, max_prefill_tokens: int | None,
                              element_size: int) -> int:
    """Bytes of the staging pool over all layers (K, V, the padding sink page and the kernel path's
    fp32 token scales) plus the one-layer scratch of direct seals, at most what `OscarKVPool` allocates."""
    pages = staging_slots_for(max_running_requests=max_running_requests, max_prefill_tokens=max_prefill_tokens,
                              page_size=cfg.residual) + 1
    scratch = scratch_slots_for(max_prefill_tokens=max_prefill_tokens, page_size=cfg.residual)
    per_page = cfg.residual * (2 * num_kv_heads * head_dim * element_size + 4 * cfg.scale_columns(num_kv_heads))
    return (pages * num_layers + scratch) * per_page


def bf16_cell_size_bytes(num_kv_heads: int, head_dim: int, num_layers: int) -> int:
    return 2 * num_kv_heads * head_dim * 2 * num_layers


def pool_class_for(cfg: OscarConfig, *, max_running_requests: int | None, enable_metrics: bool = False,
                   max_prefill_tokens: int | None = None, use_kernels: bool | None = None,
                   tp_rank: int = 0, tp_size: int = 1, direct_seals: bool = True) -> type:
    """A subclass of `OscarKVPool` bound to `cfg`: SGLang constructs the pool class itself, with its
    own fixed keyword arguments. `tp_rank` / `tp_size` label this rank's metrics (each rank's pool
    holds only its own KV heads, and its token scales are computed over them)."""
    return type("OscarKVPool", (pool_base(),), {"oscar_config": cfg, "oscar_max_requests": max_running_requests,
                                            "oscar_max_prefill_tokens": max_prefill_tokens,
                                            "oscar_use_kernels": use_kernels,
                                            "oscar_enable_metrics": enable_metrics,
                                            "oscar_tp_rank": tp_rank, "oscar_tp_size": tp_size,
                                            "oscar_direct_seals": direct_seals})


def _mha_base() -> type:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool



def _make_pool_class() -> type:
    base = _mha_base()

    class OscarKVPoolImpl(base):  # type: ignore[misc, valid-type]
        oscar_config: OscarConfig = OscarConfig()
        oscar_max_requests: int | None = None
        oscar_max_prefill_tokens: int | None = None
        oscar_use_kernels: bool | None = None  # None: `kernels_wanted(device)`
        oscar_enable_metrics: bool = False
        oscar_tp_rank: int = 0
        oscar_tp_size: int = 1
        oscar_direct_seals: bool = True  # False: every page is staged (the layout before direct seals)

        def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                     layer_num: int, device: str, enable_memory_saver: bool, **kwargs: Any) -> None:
            cfg = self.oscar_config
            if page_size != cfg.residual:
                raise ValueError(f"OScaR pool: SGLang page size {page_size} != --oscar-page-size {cfg.residual}")
            kwargs.pop("enable_kv_cache_copy", None)
            kwargs.pop("quant_method", None)
            kwargs["post_capture_active"] = False
            cfg.check_shape(head_num, head_dim)
            self.use_kernels = kernels_wanted(device) if self.oscar_use_kernels is None else bool(self.oscar_use_kernels)
            if self.use_kernels:
                check_kernel_shape(cfg, head_dim)
            self.num_pages = (size + page_size + page_size - 1) // page_size
            self.scale_cols = cfg.scale_columns(head_num)
            if self.use_kernels and torch.device(device).type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(
                    f"OScaR kernel path: the model dtype must be bfloat16 or float16 on CUDA, got {dtype}; "
                    "use --dtype bfloat16 (or OSCAR_SGL_USE_KERNELS=0 for the torch reference path)"
                )
            if self.use_kernels and torch.device(device).type != "cuda":
                from ..kernels.common import interpreting

                if not interpreting():
                    raise RuntimeError(
                        "OScaR kernel path on a non-CUDA device needs TRITON_INTERPRET=1 (set before "
                        "anything imports triton); unset OSCAR_SGL_USE_KERNELS for the torch reference path"
                    )
            # Every page a step writes is staged; a page that fills keeps its staging page until the
            # next step (its seal runs in this step's forward, its attention still reads it).
            # The pool sizer charged these bytes to the KV budget (plugin.py).
            self.num_staging = max(2, min(self.num_pages, staging_slots_for(
                max_running_requests=self.oscar_max_requests, max_prefill_tokens=self.oscar_max_prefill_tokens,
                page_size=page_size, direct_seals=self.oscar_direct_seals)))
            self.num_scratch = (scratch_slots_for(max_prefill_tokens=self.oscar_max_prefill_tokens,
                                                  page_size=page_size) if self.oscar_direct_seals else 0)
            super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device,
                             enable_memory_saver, enable_kv_cache_copy=False, **kwargs)
            self._oscar_allocator: Any = None
            self._runtime = OscarRuntime(num_pages=self.num_pages, page_size=page_size,
                                         staging_slots=self.num_staging, kv_heads=head_num, head_dim=head_dim,
                                         config=cfg, scratch_slots=self.num_scratch)
            self.page_map = torch.full((self.num_pages,), -1, dtype=torch.int32, device=device)
            self.scratch_map = torch.full((self.num_pages,), -1, dtype=torch.int32, device=device)
            self._seal_host: list[tuple[int, int]] = []
            self._seal_plan: torch.Tensor | None = None
            self._direct_host: list[tuple[int, int]] = []  # (page, scratch page) of this step
            self._direct_plan: torch.Tensor | None = None
            self._direct_pages: torch.Tensor | None = None
            self._step_begun = False
            self._check_writes = torch.device(device).type == "cpu"
            self._gauges = None
            if self.oscar_enable_metrics:
                from .metrics import PrometheusGauges

                self._gauges = PrometheusGauges(tp_rank=self.oscar_tp_rank)
                self._gauges.update(self)

        # -- buffers ------------------------------------------------------------------------
        def _create_buffers(self) -> None:
            cfg, h, d, p = self.oscar_config, self.head_num, self.head_dim, self.page_size
            n, dev, nb = self.num_pages, self.device, self.head_dim * self.oscar_config.bits // 8

            def z(shape: tuple[int, ...], dt: torch.dtype) -> list[torch.Tensor]:
                return [torch.zeros(shape, dtype=dt, device=dev) for _ in range(self.layer_num)]

            self.k_codes = z((n, h, p, nb), torch.uint8)
            self.v_codes = z((n, h, p, nb), torch.uint8)
            self.k_params = z((n, h, p // cfg.k_group, 2, d), torch.float16)
            self.v_params = z((n, h, p, 2, d // cfg.v_group), torch.float16)
            self.scales = z((n, p, self.scale_cols), torch.float32) if self.scale_cols else None
            # One extra staging page: the sink of padding writes (page 0), never read. The reference
            # path stages model-basis K/V in the model dtype; the kernel path stages the rotated K/V
            # in BF16 and each token's s_t, computed at write time (what oscar_seal reads).
            stage_dtype = torch.bfloat16 if self.use_kernels else self.dtype
            self.stage_k = z((self.num_staging + 1, h, p, d), stage_dtype)
            self.stage_v = z((self.num_staging + 1, h, p, d), stage_dtype)
            self.stage_scale = (z((self.num_staging + 1, p, self.scale_cols), torch.float32)
                                if self.use_kernels and self.scale_cols else None)
            ns = self.num_scratch
            self.scratch_k = torch.zeros((ns, h, p, d), dtype=stage_dtype, device=dev)
            self.scratch_v = torch.zeros((ns, h, p, d), dtype=stage_dtype, device=dev)
            self.scratch_scale = (torch.zeros((ns, p, self.scale_cols), dtype=torch.float32, device=dev)
                                  if self.use_kernels and self.scale_cols else None)
            # SGLang's generic code (pointer tables, size logs) sees the code buffers.
            self.k_buffer, self.v_buffer = self.k_codes, self.v_codes
            self.k_scale_buffer = self.v_scale_buffer = None
            self.native_k_scale_buffer = self.native_v_scale_buffer = None
            self.dq_k_buffer = self.dq_v_buffer = None
            self.store_dtype = torch.uint8
            self._kv_buffer_descs = []
            self._init_data_ptrs_and_strides()

        def get_kv_size_bytes(self) -> tuple[int, int]:
            def nb(ts: list[torch.Tensor] | None) -> int:
                return sum(t.numel() * t.element_size() for t in ts or [])

            k = (nb(self.k_codes) + nb(self.k_params) + nb(self.scales) + nb(self.stage_k) + nb(self.stage_scale)
                 + nb([self.scratch_k]) + nb([self.scratch_scale] if self.scratch_scale is not None else None))
            v = nb(self.v_codes) + nb(self.v_params) + nb(self.stage_v) + nb([self.scratch_v])
            return k, v

        # -- page state (owned by the Rust runtime) ------------------------------------------
        @property
        def oscar_runtime(self) -> Any:
            """The `OscarRuntime` that owns page state: the allocator's once one is attached."""
            alloc = self._oscar_allocator
            return alloc.oscar_runtime if alloc is not None else self._runtime

        def oscar_attach(self, allocator: Any) -> None:
            """Called by `OscarPagedAllocator.__init__`: its events drive this pool's pages."""
            self._oscar_allocator = allocator

        def oscar_begin_step(self, new_step: bool = False) -> None:
            """Once per forward batch, before its first layer: hand the step's page events to the
            runtime (one call), apply the page -> staging map changes, keep the seal plan.

            Idempotent within a forward (the last layer's write ends the step) unless `new_step`
            (the backend's `init_forward_metadata`): then a begun step whose layers never ran keeps
            its seal plan, merged into the new one, so no seal is lost."""
            if self._step_begun and not new_step:
                return
            carried = self._seal_host if self._step_begun else []
            alloc = self._oscar_allocator
            if alloc is None:
                raise RuntimeError(
                    "OScaR pool: no OscarPagedAllocator attached (the runtime has no page events); "
                    "build the allocator with kvcache=<this pool>, runtime=pool.oscar_runtime"
                )
            res = alloc.oscar_step()
            delta = res.map_delta
            if len(delta):
                d = torch.from_numpy(delta.astype("int64"))
                if torch.device(self.device).type != "cpu":
                    d = d.pin_memory().to(self.device, non_blocking=True)
                self.page_map[d[:, 0]] = d[:, 1].to(torch.int32)
            plan = res.seal_plan
            plan = plan[plan[:, 0] >= 0]
            rows = [(int(a), int(b)) for a, b in plan.tolist()]
            # Plan slots past the staging pool name scratch pages: this step's direct seals.
            self._seal_host = carried + [(a, b) for a, b in rows if b < self.num_staging]
            carried_direct = self._direct_host if self._step_begun else []
            new_direct = [(a, b - self.num_staging) for a, b in rows if b >= self.num_staging]
            if carried_direct and new_direct:
                # The runtime numbers each step's scratch pages from 0: move the new ones clear of
                # the carried ones (both are sealed by this forward's layers).
                free = [i for i in range(self.num_scratch) if i not in {x for _, x in carried_direct}]
                if len(free) < len(new_direct):
                    raise RuntimeError(f"OScaR: {len(carried_direct) + len(new_direct)} direct seals in one forward, "
                                       f"over the {self.num_scratch} scratch pages")
                new_direct = [(a, free[i]) for i, (a, _) in enumerate(new_direct)]
            self._direct_host = carried_direct + new_direct
            self._seal_plan = (torch.tensor(self._seal_host, dtype=torch.int32).to(self.device)
                               if self._seal_host else None)
            if self._direct_pages is not None:  # the last step's direct pages are sealed: unmap
                self.scratch_map[self._direct_pages] = -1
                self._direct_pages = None
            self._direct_plan = None
            if self._direct_host:
                d = torch.tensor(self._direct_host, dtype=torch.int32).to(self.device)
                self._direct_plan = d
                self._direct_pages = d[:, 0].to(torch.int64)
                self.scratch_map[self._direct_pages] = d[:, 1]
            self._step_begun = True

        def oscar_sync(self) -> bool:
            """Between steps: the events SGLang logged after the last forward (finished requests'
            releases, radix inserts, unlocks) reach the runtime now instead of at the next step, so
            the page states and staging use it reports are those after the step. Skipped while a
            forward is under way (its seals still need their staging pages) and when the log already
            holds the next batch's allocations. Returns whether events were applied."""
            alloc = self._oscar_allocator
            if alloc is None or self._step_begun:
                return False
            return bool(alloc.oscar_flush())

        def oscar_after_step(self) -> None:
            """Once per scheduler step, after SGLang processed its results (plugin hook on
            `Scheduler.process_batch_result`): sync, then update the Prometheus gauges."""
            self.oscar_sync()
            if self._gauges is not None:
                self._gauges.update(self)

        def oscar_on_clear(self) -> None:
            """The allocator was cleared (SGLang's flush_cache or resize) and the runtime reset:
            no page is in staging and no seal is pending any more."""
            self._seal_host = []
            self._seal_plan = None
            self._direct_host = []
            self._direct_plan = self._direct_pages = None
            self._step_begun = False
            self.page_map.fill_(-1)
            self.scratch_map.fill_(-1)

        def oscar_page_states(self) -> dict[str, int]:
            s = self.oscar_runtime.stats()
            return {
                "sealed": int(s.sealed_pages),
                "open": int(s.open_pages),
                "staging_in_use": int(s.staging_in_use),
                "staging_total": int(s.staging_capacity),
            }

        # -- writes -------------------------------------------------------------------------
        def set_kv_buffer(self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor,
                          k_scale: Any = None, v_scale: Any = None, layer_id_override: Any = None,
                          dcp_kv_mask: Any = None) -> None:
            """Write a step's K/V of one layer into the staging pages the runtime mapped, then seal the
            pages of the step's seal plan (they are full now) into the packed arrays. Their staging
            pages stay mapped until the next step, so this step's attention still reads them exactly."""
            li, loc, k, v = self.oscar_prepare_write(layer, loc_info, cache_k, cache_v, layer_id_override, dcp_kv_mask)
            if self.use_kernels:
                self._write_and_seal_kernels(li, loc, k, v)
            else:
                p = self.page_size
                if loc.numel():
                    pages = loc // p
                    slot = self.page_map[pages].to(torch.int64)
                    direct = self.scratch_map[pages] >= 0
                    # Padding writes (page 0) go to the sink staging page, never read.
                    slot = torch.where(slot < 0, self.num_staging, slot)
                    off = loc % p
                    keep = ~direct
                    self.stage_k[li][slot[keep], :, off[keep], :] = k[keep].to(self.dtype)
                    self.stage_v[li][slot[keep], :, off[keep], :] = v[keep].to(self.dtype)
                    if bool(direct.any()):
                        sp = self.scratch_map[pages[direct]].to(torch.int64)
                        self.scratch_k[sp, :, off[direct], :] = k[direct].to(self.dtype)
                        self.scratch_v[sp, :, off[direct], :] = v[direct].to(self.dtype)
                for page, s in self._seal_host:
                    self._seal(li, page, self.stage_k[li][s], self.stage_v[li][s])
                for page, s in self._direct_host:
                    self._seal(li, page, self.scratch_k[s], self.scratch_v[s])
            self._end_layer(li)

        def oscar_prepare_write(self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor,
                                layer_id_override: Any = None, dcp_kv_mask: Any = None
                                ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
            """The checks and views shared by every write: ``(layer index, int64 slots, k [T, H, D], v)``.
            Starts the step's page bookkeeping on the first layer."""
            from sglang.srt.mem_cache.memory_pool import unwrap_write_loc

            if dcp_kv_mask is not None:
                raise RuntimeError("OScaR pool: decode context parallelism is not supported")
            loc = unwrap_write_loc(loc_info)[0].reshape(-1).to(torch.int64)
            layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
            li = layer_id - self.start_layer
            self.oscar_begin_step()
            h, d, p = self.head_num, self.head_dim, self.page_size
            k = cache_k.reshape(-1, h, d)
            v = cache_v.reshape(-1, h, d)
            if loc.numel() and self._check_writes:  # host tensors: a cheap bookkeeping check
                pages = loc // p
                bad = (self.page_map[pages] < 0) & (self.scratch_map[pages] < 0) & (pages > 0)
                if bool(bad.any()):
                    page = int(pages[bad][0])
                    raise RuntimeError(
                        f"OScaR: write into page {page}, which the runtime does not hold open "
                        f"(state {self.oscar_runtime.page_info(page).state}); a sealed page is never written again"
                    )
            return li, loc, k, v

        def oscar_seal_after_fused_write(self, li: int) -> None:
            """After a decode launch that wrote the step's tokens itself (the fused write): seal the
            step's plan and close the layer, as ``set_kv_buffer`` does after its own write."""
            self._seal_kernels(li)
            self._end_layer(li)

        # -- CUDA graphs (see backend.py) -----------------------------------------------------
        def oscar_graph_plan_init(self, capacity: int) -> None:
            """A fixed ``[capacity, 2]`` seal plan that captured seal launches read (rows -1: none)."""
            self._g_plan = torch.full((capacity, 2), -1, dtype=torch.int32, device=self.device)
            self._g_plan_host = torch.full((capacity, 2), -1, dtype=torch.int32)

        def oscar_graph_plan_stage(self) -> None:
            """Copy this step's seal plan into the fixed plan buffer (outside the graph) and close the
            step on the host: every layer's write and seal of this step run inside the graph."""
            cap = self._g_plan.shape[0]
            if self._direct_host:
                raise RuntimeError("OScaR: a decode step cannot seal pages directly (they open and fill in "
                                   "one prefill step); this is a bookkeeping error")
            if len(self._seal_host) > cap:
                raise RuntimeError(f"OScaR: {len(self._seal_host)} pages to seal in one decode step, over the "
                                   f"CUDA-graph plan buffer of {cap}")
            self._g_plan_host.fill_(-1)
            if self._seal_host:
                self._g_plan_host[: len(self._seal_host)] = torch.tensor(self._seal_host, dtype=torch.int32)
            self._g_plan.copy_(self._g_plan_host)
            self._step_begun = False

        def oscar_graph_seal(self, li: int) -> None:
            """The captured seal launch of layer ``li`` over the fixed plan buffer."""
            self._seal_kernels(li, plan=self._g_plan)

        def _end_layer(self, li: int) -> None:
            if li == self.layer_num - 1:
                self._step_begun = False

        def _write_and_seal_kernels(self, li: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            """Kernel path: one write launch (rotate, s_t, BF16 staging; padding tokens skipped by the
            map) and one seal launch for every page of the step's plan."""
            from .. import kernels as K

            cfg = self.oscar_config
            if loc.numel():
                k, v = k.contiguous(), v.contiguous()
                K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.page_map,
                                 staging_k=self.stage_k[li], staging_v=self.stage_v[li],
                                 staging_scale=self.stage_scale[li] if self.stage_scale is not None else None,
                                 rotation=cfg.rotation)
                if self._direct_plan is not None:  # this step's direct pages: into the shared scratch
                    K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.scratch_map,
                                     staging_k=self.scratch_k, staging_v=self.scratch_v,
                                     staging_scale=self.scratch_scale, rotation=cfg.rotation)
            self._seal_kernels(li)
            if self._direct_plan is not None:
                self._seal_kernels(li, plan=self._direct_plan, scratch=True)

        def _seal_kernels(self, li: int, plan: torch.Tensor | None = None, scratch: bool = False) -> None:
            """One seal launch for every page of the step's plan (kernel path); `scratch`: the plan
            names scratch pages (direct seals)."""
            from .. import kernels as K

            cfg = self.oscar_config
            plan = self._seal_plan if plan is None else plan
            if scratch:
                sk, sv, ss = self.scratch_k, self.scratch_v, self.scratch_scale
            else:
                sk, sv = self.stage_k[li], self.stage_v[li]
                ss = self.stage_scale[li] if self.stage_scale is not None else None
            if plan is not None:
                K.oscar_seal(plan=plan, staging_k=sk, staging_v=sv, staging_scale=ss,
                             k_codes=self.k_codes[li], k_params=self.k_params[li], v_codes=self.v_codes[li],
                             v_params=self.v_params[li], scale=self.scales[li] if self.scales is not None else None,
                             bits=cfg.bits, k_group=cfg.k_group, v_group=cfg.v_group)

        def _seal(self, li: int, page: int, k: torch.Tensor, v: torch.Tensor) -> None:
            """Quantize one page `[H, P, D]` of layer `li` into the packed arrays (reference path)."""
            kb, vb = ref.seal(k, v, self.oscar_config)
            self.k_codes[li][page] = kb.codes
            self.k_params[li][page] = kb.params
            self.v_codes[li][page] = vb.codes
            self.v_params[li][page] = vb.params
            if self.scales is not None:
                self.scales[li][page] = kb.scale

        # -- reads (for the backend) ----------------------------------------------------------
        def sealed_blocks(self, li: int, pages: torch.Tensor) -> tuple[ref.KBlock, ref.VBlock]:
            """Sealed pages `pages` (oldest first) of layer `li` as one reference block each."""
            h, p = self.head_num, self.page_size
            n = pages.numel()

            def cat_tokens(x: torch.Tensor) -> torch.Tensor:  # [n, H, m, ...] -> [H, n*m, ...]
                return x.transpose(0, 1).reshape(h, n * x.shape[2], *x.shape[3:])

            scale = None
            if self.scales is not None:
                scale = self.scales[li][pages].reshape(n * p, self.scale_cols)
            kb = ref.KBlock(codes=cat_tokens(self.k_codes[li][pages]), params=cat_tokens(self.k_params[li][pages]),
                            scale=scale)
            vb = ref.VBlock(codes=cat_tokens(self.v_codes[li][pages]), params=cat_tokens(self.v_params[li][pages]))
            return kb, vb

        def open_tokens(self, li: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """BF16 K/V `[H, t, D]` of slots that lie in open (staged) pages."""
            p = self.page_size
            pages = slots // p
            stg = self.page_map.to(slots.device)[pages].to(torch.int64)
            if bool((stg < 0).any()):
                raise RuntimeError("OScaR: reading an open token whose page has no staging page")
            off = slots % p
            return (self.stage_k[li][stg, :, off, :].transpose(0, 1),
                    self.stage_v[li][stg, :, off, :].transpose(0, 1))

        # -- what SGLang must not do with a packed pool ---------------------------------------
        def _no_plain(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(
                "the OScaR pool holds packed INT2/INT4 pages; only the 'oscar' attention backend reads it"
            )

        get_key_buffer = get_value_buffer = get_kv_buffer = _no_plain
        _get_key_buffer = _get_value_buffer = _no_plain

        def get_cpu_copy(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(
                "--kv-cache oscar: retraction to host (get_cpu_copy) is not supported yet; "
                "size --max-total-tokens / --max-running-requests so the scheduler does not retract"
            )

        load_cpu_copy = get_cpu_copy

        def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
            raise NotImplementedError("--kv-cache oscar: slot moves are not supported (no speculative decoding)")

        def set_kv_buffer_prefix_valid(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("--kv-cache oscar: speculative prefix-valid writes are not supported")

        def get_device_pool_infos(self) -> Any:
            raise NotImplementedError("--kv-cache oscar: HiCache host pools are not supported")

        def get_contiguous_buf_infos(self) -> Any:
            raise NotImplementedError("--kv-cache oscar: PD disaggregation transfer is not supported")

    OscarKVPoolImpl.__name__ = OscarKVPoolImpl.__qualname__ = "OscarKVPool"
    return OscarKVPoolImpl


_POOL_CLASS: type | None = None


def pool_base() -> type:
    """`OscarKVPool`, the `MHATokenToKVPool` subclass (built on first use: importing this module
    imports no SGLang)."""
    global _POOL_CLASS
    if _POOL_CLASS is None:
        _POOL_CLASS = _make_pool_class()
    return _POOL_CLASS


def __getattr__(name: str) -> Any:
    if name == "OscarKVPool":
        return pool_base()
    raise AttributeError(name)
