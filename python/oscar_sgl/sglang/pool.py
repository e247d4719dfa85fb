"""`OscarKVPool`: SGLang's MHA pool with OScaR pages (docs/LAYOUT.md §3, docs/OSCAR.md §4).

Per layer (leading axis = SGLang page id; page 0 is SGLang's padding page and is never read):

    k_codes  u8  [num_pages, H, P, D*b/8]      v_codes  u8  [num_pages, H, P, D*b/8]
    k_params f16 [num_pages, H, P/G_K, 2, D]   v_params f16 [num_pages, H, P, 2, D/G_V]
    (key_ranges="page": k_params f16 [num_pages, H, 1, 2, D], k_ranges u8 [num_pages, H, P/G_K, 2, D])
    scale    f32 [num_pages, P, S]             (absent when S = 0)
    stage_k, stage_v  [num_staging + 1, H, P, D]   staging of open pages (+ a sink page for padding):
                      reference path: model basis, model dtype; kernel path: rotated, BF16
    stage_scale f32 [num_staging + 1, P, S]    kernel path only: s_t computed at write time

and once, shared by every layer (used by one layer at a time):

    scratch_k, scratch_v, scratch_scale [num_scratch, ...]   as the staging, for direct seals

The page -> staging map and page -> scratch map (device int32, -1: none) and the step's seal plans
belong to the step owner, `pool.oscar_step` (`step.OscarStep`), which the pool builds with the Rust
runtime and SGLang's allocator records its events into.

A page is *open* while a request writes it: its tokens live in a staging page. Page state is owned
by the Rust runtime (`oscar_sgl.runtime.OscarRuntime`), held by `OscarStep`: SGLang's allocations,
releases and radix-cache locks/inserts are recorded there as events, and once per forward batch
(`OscarStep.begin`, from the backend's `init_forward_metadata`) one runtime call returns the changes
of the page -> staging map and the seal plan: the `(page, staging page)` pairs that became full in
this step. Each layer's `set_kv_buffer` writes
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
from dataclasses import dataclass
from typing import Any

import torch

from .. import reference as ref
from ..config import OscarConfig
from ..errors import OscarConfigError
from ..runtime import OscarRuntime, scratch_slots_needed, staging_slots_needed
from ..supported import check_kernel_device, check_kernel_shape
from .classes import sglang_subclass
from .step import OscarStep

__all__ = ["PREFILL_MODES", "OscarKVPoolMixin", "PoolSettings", "pool_class_for"]

#: ``--oscar-prefill`` values, the default first (`backend.py`).
PREFILL_MODES = ("position", "exact")


def cell_size_bytes(cfg: OscarConfig, num_kv_heads: int, head_dim: int, num_layers: int, *, bf16_layers: int = 0,
                    element_size: int = 2) -> int:
    """Bytes per token over all layers, what SGLang's pool sizer divides the KV budget by:
    ``bf16_layers`` of the ``num_layers`` (`--oscar-sliding-layers bf16`) hold K and V at
    ``element_size`` bytes per value, the others the packed format."""
    packed = cfg.bytes_per_token(num_kv_heads, head_dim) * (num_layers - bf16_layers)
    return int(math.ceil(packed + bf16_layers * 2 * num_kv_heads * head_dim * element_size))


def kernels_wanted(device: Any) -> bool:
    """Whether the pool/backend run the Triton kernels: on CUDA by default, elsewhere only with
    `OSCAR_SGL_USE_KERNELS=1` (and `TRITON_INTERPRET=1`, Triton's CPU interpreter: tiny shapes only).
    `OSCAR_SGL_USE_KERNELS=0` forces the torch reference path on CUDA too."""
    env = os.environ.get("OSCAR_SGL_USE_KERNELS", "")
    if env:
        return env not in ("0", "false", "no")
    return torch.device(device).type == "cuda"


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
                              page_size=cfg.page_size) + 1
    scratch = scratch_slots_for(max_prefill_tokens=max_prefill_tokens, page_size=cfg.page_size)
    per_page = cfg.page_size * (2 * num_kv_heads * head_dim * element_size + 4 * cfg.scale_columns(num_kv_heads))
    return (pages * num_layers + scratch) * per_page


@dataclass(frozen=True)
class PoolSettings:
    """What an `OscarKVPool` class is bound to besides SGLang's constructor arguments.

    Attributes:
        config: the quantization config.
        max_running_requests, max_prefill_tokens: SGLang's flags (None: their defaults); they size
            the staging pool and the direct-seal scratch.
        use_kernels: None: `kernels_wanted(device)`.
        enable_metrics: Prometheus gauges on `/metrics`.
        tp_rank, tp_size: this rank (each rank's pool holds its own KV heads and token scales).
        direct_seals: False stages every page (the layout before direct seals; tests).
        prefill: ``--oscar-prefill``: ``"position"`` (each query reads codes below its own page) or
            ``"exact"`` (below the page holding the step's first token), see `backend.py`.
        bf16_layers: the layer ids (the model's, not this pipeline stage's) kept in the KV dtype,
            one K and V row per token slot as SGLang's own pool (`--oscar-sliding-layers bf16`:
            the model's sliding-window layers; `sliding.py`). Their packed and staging arrays are
            one page each, never read.
    """

    config: OscarConfig = OscarConfig()
    max_running_requests: int | None = None
    max_prefill_tokens: int | None = None
    use_kernels: bool | None = None
    enable_metrics: bool = False
    tp_rank: int = 0
    tp_size: int = 1
    direct_seals: bool = True
    prefill: str = "position"
    bf16_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prefill not in PREFILL_MODES:
            raise OscarConfigError(f"--oscar-prefill must be one of {', '.join(PREFILL_MODES)}, got {self.prefill!r}")


def pool_class_for(cfg: OscarConfig, **settings: Any) -> type:
    """A subclass of `OscarKVPool` bound to `cfg` and `PoolSettings(**settings)`: SGLang constructs
    the pool class itself, with its own fixed keyword arguments."""
    return type("OscarKVPool", (pool_base(),), {"oscar_settings": PoolSettings(config=cfg, **settings)})


class OscarKVPoolMixin:
    """`MHATokenToKVPool` with OScaR pages (module docstring); `OscarKVPool` is this mixin over
    SGLang's class (`pool_base()`), bound to its `PoolSettings` by `pool_class_for`."""

    oscar_settings: PoolSettings = PoolSettings()

    @property
    def oscar_config(self) -> OscarConfig:
        return self.oscar_settings.config

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                 layer_num: int, device: str, enable_memory_saver: bool, **kwargs: Any) -> None:
        st = self.oscar_settings
        cfg = st.config
        if page_size != cfg.page_size:
            raise RuntimeError(f"OScaR pool: SGLang page size {page_size} != --oscar-page-size {cfg.page_size} "
                               "(the plug-in sets --page-size; this is a wiring bug)")
        kwargs.pop("enable_kv_cache_copy", None)
        kwargs.pop("quant_method", None)
        kwargs["post_capture_active"] = False
        cfg.check_shape(head_num, head_dim)
        self.use_kernels = kernels_wanted(device) if st.use_kernels is None else bool(st.use_kernels)
        if self.use_kernels:
            from ..kernels.common import interpreting

            check_kernel_shape(bits=cfg.bits, k_group=cfg.k_group, v_group=cfg.v_group, page_size=cfg.page_size,
                               head_dim=head_dim)
            check_kernel_device(device_type=torch.device(device).type, dtype=dtype, interpreting=interpreting())
        self.num_pages = (size + page_size + page_size - 1) // page_size
        self.scale_cols = cfg.scale_columns(head_num)
        # Every page a step writes is staged; a page that fills keeps its staging page until the
        # next step (its seal runs in this step's forward, its attention still reads it).
        # The pool sizer charged these bytes to the KV budget (plugin.py).
        self.num_staging = max(2, min(self.num_pages, staging_slots_for(
            max_running_requests=st.max_running_requests, max_prefill_tokens=st.max_prefill_tokens,
            page_size=page_size, direct_seals=st.direct_seals)))
        self.num_scratch = (scratch_slots_for(max_prefill_tokens=st.max_prefill_tokens, page_size=page_size)
                            if st.direct_seals else 0)
        super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device,  # type: ignore[call-arg]
                         enable_memory_saver, enable_kv_cache_copy=False, **kwargs)
        # The key-rotation plan (one flag per local KV head and layer): None rotates every head's
        # keys when rotation is on, until `oscar_set_key_rotation` installs the plan the backend
        # computed from the loaded weights (before the first forward).
        self.key_rotation_plan: list[tuple[bool, ...]] | None = None
        # Sliding-window layers (layer id -> window), as the backend found them in the loaded model:
        # stored like every layer; their attention reads their window only (backend.window_of).
        self.sliding_windows: dict[int, int] = {}
        self._key_flags: list[torch.Tensor | None] = [None] * layer_num
        runtime = OscarRuntime(num_pages=self.num_pages, page_size=page_size, staging_slots=self.num_staging,
                               kv_heads=head_num, head_dim=head_dim, config=cfg, scratch_slots=self.num_scratch)
        self.oscar_step = OscarStep(runtime, device=device)
        self._check_writes = torch.device(device).type == "cpu"
        self.oscar_gauges = None
        if st.enable_metrics:
            from .metrics import PrometheusGauges

            self.oscar_gauges = PrometheusGauges(tp_rank=st.tp_rank)

    # -- buffers ------------------------------------------------------------------------
    def _create_buffers(self) -> None:
        cfg, h, d, p = self.oscar_config, self.head_num, self.head_dim, self.page_size
        n, dev, nb = self.num_pages, self.device, self.head_dim * self.oscar_config.bits // 8
        start = int(getattr(self, "start_layer", 0) or 0)
        self.bf16_layer_indices = frozenset(g - start for g in self.oscar_settings.bf16_layers
                                            if 0 <= g - start < self.layer_num)

        def z(shape: tuple[int, ...], dt: torch.dtype) -> list[torch.Tensor]:
            # a layer kept in the KV dtype gets one page of each packed / staging array (never read)
            return [torch.zeros((1,) + shape[1:] if li in self.bf16_layer_indices else shape, dtype=dt, device=dev)
                    for li in range(self.layer_num)]

        # `--oscar-sliding-layers bf16`: those layers as SGLang's MHA pool stores them (slot-indexed).
        self.bf16_k = [torch.zeros((self.size + p, h, d), dtype=self.dtype, device=dev)
                       if li in self.bf16_layer_indices else None for li in range(self.layer_num)]
        self.bf16_v = [torch.zeros((self.size + p, h, d), dtype=self.dtype, device=dev)
                       if li in self.bf16_layer_indices else None for li in range(self.layer_num)]

        self.k_codes = z((n, h, p, nb), torch.uint8)
        self.v_codes = z((n, h, p, nb), torch.uint8)
        # Key params: fp16 (scale, offset) per key group, or with page-grid key ranges the page's
        # grid (base, step) per channel plus uint8 (a, b) indices per key group (docs/LAYOUT.md §1).
        page_keys = cfg.key_ranges == "page"
        self.k_params = z((n, h, 1 if page_keys else p // cfg.k_group, 2, d), torch.float16)
        self.k_ranges = z((n, h, p // cfg.k_group, 2, d), torch.uint8) if page_keys else None
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

        k = (nb(self.k_codes) + nb(self.k_params) + nb(self.k_ranges) + nb(self.scales) + nb(self.stage_k) + nb(self.stage_scale)
             + nb([self.scratch_k]) + nb([self.scratch_scale] if self.scratch_scale is not None else None))
        v = nb(self.v_codes) + nb(self.v_params) + nb(self.stage_v) + nb([self.scratch_v])
        k += nb([t for t in self.bf16_k if t is not None])
        v += nb([t for t in self.bf16_v if t is not None])
        return k, v

    def is_bf16_layer(self, li: int) -> bool:
        """Whether layer ``li`` (this pool's index) is kept in the KV dtype (`bf16_k` / `bf16_v`)."""
        return li in self.bf16_layer_indices

    # -- the step (owned by `OscarStep`) ------------------------------------------------------
    @property
    def oscar_runtime(self) -> Any:
        """The `OscarRuntime` that owns page state (held by the step owner)."""
        return self.oscar_step.runtime

    @property
    def page_map(self) -> torch.Tensor:
        """page -> staging page (device int32; -1: read the packed pool)."""
        return self.oscar_step.page_map

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
        if li in self.bf16_layer_indices:
            self.oscar_write_bf16(li, loc, k, v)
        elif self.use_kernels:
            self._write_and_seal_kernels(li, loc, k, v)
        else:
            p = self.page_size
            if loc.numel():
                pages = loc // p
                scratch_map = self.oscar_step.scratch_map
                slot = self.page_map[pages].to(torch.int64)
                direct = scratch_map[pages] >= 0
                # Padding writes (page 0) go to the sink staging page, never read.
                slot = torch.where(slot < 0, self.num_staging, slot)
                off = loc % p
                keep = ~direct
                self.stage_k[li][slot[keep], :, off[keep], :] = k[keep].to(self.dtype)
                self.stage_v[li][slot[keep], :, off[keep], :] = v[keep].to(self.dtype)
                if bool(direct.any()):
                    sp = scratch_map[pages[direct]].to(torch.int64)
                    self.scratch_k[sp, :, off[direct], :] = k[direct].to(self.dtype)
                    self.scratch_v[sp, :, off[direct], :] = v[direct].to(self.dtype)
            for page, s in self.oscar_step.seal_host:
                self._seal(li, page, self.stage_k[li][s], self.stage_v[li][s])
            for page, s in self.oscar_step.direct_host:
                self._seal(li, page, self.scratch_k[s], self.scratch_v[s])
        self.oscar_step.end_layer(li, self.layer_num)

    def oscar_prepare_write(self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor,
                            layer_id_override: Any = None, dcp_kv_mask: Any = None
                            ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The checks and views shared by every write: ``(layer index, int64 slots, k [T, H, D], v)``.
        Begins the step (`OscarStep.begin`) if the backend has not."""
        from sglang.srt.mem_cache.memory_pool import unwrap_write_loc

        if dcp_kv_mask is not None:
            raise RuntimeError("OScaR pool: decode context parallelism is not supported")
        loc = unwrap_write_loc(loc_info)[0].reshape(-1).to(torch.int64)
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        li = layer_id - self.start_layer
        self.oscar_step.begin()
        h, d, p = self.head_num, self.head_dim, self.page_size
        k = cache_k.reshape(-1, h, d)
        v = cache_v.reshape(-1, h, d)
        if loc.numel() and self._check_writes:  # host tensors: a cheap bookkeeping check
            pages = loc // p
            bad = (self.page_map[pages] < 0) & (self.oscar_step.scratch_map[pages] < 0) & (pages > 0)
            if bool(bad.any()):
                page = int(pages[bad][0])
                raise RuntimeError(
                    f"OScaR: write into page {page}, which the runtime does not hold open "
                    f"(state {self.oscar_runtime.page_info(page).state}); a sealed page is never written again"
                )
        return li, loc, k, v

    def oscar_write_bf16(self, li: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """A layer kept in the KV dtype: its K/V rows at their slots, as SGLang's MHA pool (slot 0,
        the padding page's, takes padding writes; nothing to seal). Device ops only (CUDA graphs)."""
        self.bf16_k[li][loc] = k.to(self.dtype)
        self.bf16_v[li][loc] = v.to(self.dtype)

    def oscar_seal_after_fused_write(self, li: int) -> None:
        """After a decode launch that wrote the step's tokens itself (the fused write): seal the
        step's plan and close the layer, as ``set_kv_buffer`` does after its own write."""
        self._seal_kernels(li)
        self.oscar_step.end_layer(li, self.layer_num)

    # -- the key-rotation plan (reference.key_rotation_plan) --------------------------------
    def oscar_set_key_rotation(self, plan: list[tuple[bool, ...]] | None) -> None:
        """Install the key-rotation plan of this pool's layers (one flag per KV head this rank
        holds), before anything is written: a layer whose plan rotates no head is stored as KIVI
        (no token scale, values unrotated), one that rotates some heads' keys gives the kernels
        its flags (`PagedLayer.key_rotated`). A row may be a `reference.LayerKeys`: the layer's KIVI
        decision made over every tensor-parallel rank's heads (a layer whose rotated heads are all
        on other ranks is then mixed here, all flags off). None: every head's keys follow the
        rotation."""
        if plan is not None:
            plan = [ref.layer_keys(row) for row in plan]
            if len(plan) != self.layer_num or any(len(row) != self.head_num for row in plan):
                raise ValueError(f"the key-rotation plan must have {self.layer_num} layers of {self.head_num} flags, "
                                 f"got {[len(row) for row in plan]}")
        if self.oscar_runtime.stats().sealed_pages or self.oscar_runtime.stats().open_pages:
            raise RuntimeError("the key-rotation plan is installed before the first write (pages already hold keys)")
        cfg = self.oscar_config
        self.key_rotation_plan = plan
        self._key_flags = [None] * self.layer_num
        if plan is not None:
            for li, row in enumerate(plan):
                mixed = ref.mixed_key_rotation(cfg, row)
                if mixed is not None:
                    self._key_flags[li] = torch.tensor(mixed, dtype=torch.int32, device=self.device)

    def layer_plan(self, li: int) -> tuple[bool, ...] | None:
        """The key-rotation flags of layer ``li`` (None: every head follows the rotation)."""
        return None if self.key_rotation_plan is None else self.key_rotation_plan[li]

    def layer_rotates_values(self, li: int) -> bool:
        return ref.rotates_values(self.oscar_config, self.layer_plan(li))

    def layer_scales_tokens(self, li: int) -> bool:
        return self.scale_cols > 0 and ref.scales_tokens(self.oscar_config, self.layer_plan(li))

    def layer_scale(self, li: int) -> torch.Tensor | None:
        """Layer ``li``'s packed token scales, None when it stores none (token scaling off, or a
        layer the plan stores as KIVI: its buffer is allocated but never read)."""
        return self.scales[li] if self.scales is not None and self.layer_scales_tokens(li) else None

    def layer_stage_scale(self, li: int) -> torch.Tensor | None:
        """Layer ``li``'s staging token scales (kernel path), None as for `layer_scale`."""
        return self.stage_scale[li] if self.stage_scale is not None and self.layer_scales_tokens(li) else None

    def key_rotation_summary(self) -> dict[str, Any]:
        """What `/server_info` shows: the rule, its threshold, and the plan's head counts."""
        cfg = self.oscar_config
        plan = self.key_rotation_plan
        quantized = [li for li in range(self.layer_num) if li not in self.bf16_layer_indices]
        heads = len(quantized) * self.head_num  # layers kept in the KV dtype rotate nothing
        rotated = heads if plan is None and cfg.rotation else (
            sum(sum(plan[li]) for li in quantized) if plan is not None else 0)
        return {"rule": cfg.key_rotation if cfg.rotation else "off",
                "min_alignment": cfg.key_rotation_min_alignment,
                "rotated_heads": int(rotated), "heads": heads,
                "kivi_layers": [self.start_layer + li for li in quantized
                                if plan is not None and ref.kivi_layer(cfg, plan[li])],
                "plan": None if plan is None else [[int(x) for x in row] for row in plan]}

    def paged_layer(self, li: int) -> Any:
        """Layer ``li`` as the attention kernels read it (`oscar_sgl.kernels.PagedLayer`)."""
        from ..kernels import PagedLayer

        cfg = self.oscar_config
        return PagedLayer(k_codes=self.k_codes[li], k_params=self.k_params[li], v_codes=self.v_codes[li],
                          v_params=self.v_params[li], scale=self.layer_scale(li),
                          staging_k=self.stage_k[li], staging_v=self.stage_v[li], page_to_staging=self.page_map,
                          bits=cfg.bits, k_group=cfg.k_group, v_group=cfg.v_group, rotation=self.layer_rotates_values(li),
                          key_rotated=self._key_flags[li], k_ranges=self.k_ranges[li] if self.k_ranges is not None else None)

    def oscar_graph_seal(self, li: int) -> None:
        """The captured seal launch of layer ``li`` over the step's fixed CUDA-graph plan buffer."""
        self._seal_kernels(li, plan=self.oscar_step.graph_plan)

    def _write_and_seal_kernels(self, li: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Kernel path: one write launch (rotate, s_t, BF16 staging; padding tokens skipped by the
        map) and one seal launch for every page of the step's plan."""
        from .. import kernels as K

        if loc.numel():
            k, v = k.contiguous(), v.contiguous()
            rot = dict(rotation=self.layer_rotates_values(li), key_rotated=self._key_flags[li])
            K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.page_map,
                             staging_k=self.stage_k[li], staging_v=self.stage_v[li],
                             staging_scale=self.layer_stage_scale(li), **rot)
            if self.oscar_step.direct_plan is not None:  # this step's direct pages: into the shared scratch
                K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.oscar_step.scratch_map,
                                 staging_k=self.scratch_k, staging_v=self.scratch_v,
                                 staging_scale=self.scratch_scale if self.layer_scales_tokens(li) else None, **rot)
        self._seal_kernels(li)
        if self.oscar_step.direct_plan is not None:
            self._seal_kernels(li, plan=self.oscar_step.direct_plan, scratch=True)

    def _seal_kernels(self, li: int, plan: torch.Tensor | None = None, scratch: bool = False) -> None:
        """One seal launch for every page of the step's plan (kernel path); `scratch`: the plan
        names scratch pages (direct seals)."""
        from .. import kernels as K

        cfg = self.oscar_config
        plan = self.oscar_step.seal_plan if plan is None else plan
        if scratch:
            sk, sv = self.scratch_k, self.scratch_v
            ss = self.scratch_scale if self.layer_scales_tokens(li) else None
        else:
            sk, sv = self.stage_k[li], self.stage_v[li]
            ss = self.layer_stage_scale(li)
        if plan is not None:
            K.oscar_seal(plan=plan, staging_k=sk, staging_v=sv, staging_scale=ss,
                         k_codes=self.k_codes[li], k_params=self.k_params[li], v_codes=self.v_codes[li],
                         v_params=self.v_params[li], scale=self.layer_scale(li),
                         bits=cfg.bits, k_group=cfg.k_group, v_group=cfg.v_group, offset=cfg.offset, clip=cfg.clip,
                         k_ranges=self.k_ranges[li] if self.k_ranges is not None else None)

    def oscar_warm_up(self, li: int, *, num_q_heads: int, dtype: torch.dtype, position: bool,
                      window_left: int | None = None) -> None:
        """Kernel path: compile the prefill-path launches of layer ``li`` (the write into staging
        and into the direct-seal scratch, both seals, the query rotation, extend over pages read
        pre-dequantized and in registers) before a request needs them. Writes nothing the pool
        keeps: the token goes to page 0, which SGLang never allocates and neither map names (the
        write skips it), the seal plan's one row names no page (skipped), and the extend reads
        page 0 into its own output."""
        from .. import kernels as K
        from ..kernels.extend import warm_up_extend

        h, d, dev = self.head_num, self.head_dim, self.device
        k = torch.zeros(1, h, d, dtype=dtype, device=dev)
        v = torch.zeros(1, h, d, dtype=dtype, device=dev)
        loc = torch.zeros(1, dtype=torch.int64, device=dev)
        rot = dict(rotation=self.layer_rotates_values(li), key_rotated=self._key_flags[li])
        K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.page_map, staging_k=self.stage_k[li],
                         staging_v=self.stage_v[li], staging_scale=self.layer_stage_scale(li), **rot)
        K.oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=self.oscar_step.scratch_map, staging_k=self.scratch_k,
                         staging_v=self.scratch_v,
                         staging_scale=self.scratch_scale if self.layer_scales_tokens(li) else None, **rot)
        plan = torch.tensor([[-1, 0]], dtype=torch.int32).to(dev)
        self._seal_kernels(li, plan=plan)
        self._seal_kernels(li, plan=plan, scratch=True)
        warm_up_extend(layer=self.paged_layer(li), num_q_heads=num_q_heads, dtype=dtype, position=position,
                       window_left=window_left)

    def _seal(self, li: int, page: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize one page `[H, P, D]` of layer `li` into the packed arrays (reference path)."""
        kb, vb = ref.seal(k, v, self.oscar_config, self.layer_plan(li))
        self.k_codes[li][page] = kb.codes
        self.k_params[li][page] = kb.params
        if self.k_ranges is not None:
            self.k_ranges[li][page] = kb.ranges
        self.v_codes[li][page] = vb.codes
        self.v_params[li][page] = vb.params
        if kb.scale is not None:
            self.scales[li][page] = kb.scale

    # -- reads (for the backend) ----------------------------------------------------------
    def sealed_blocks(self, li: int, pages: torch.Tensor) -> tuple[ref.KBlock, ref.VBlock]:
        """Sealed pages `pages` (oldest first) of layer `li` as one reference block each."""
        h, p = self.head_num, self.page_size
        n = pages.numel()

        def cat_tokens(x: torch.Tensor) -> torch.Tensor:  # [n, H, m, ...] -> [H, n*m, ...]
            return x.transpose(0, 1).reshape(h, n * x.shape[2], *x.shape[3:])

        scale = None
        if self.layer_scale(li) is not None:
            scale = self.scales[li][pages].reshape(n * p, self.scale_cols)
        kb = ref.KBlock(codes=cat_tokens(self.k_codes[li][pages]), params=cat_tokens(self.k_params[li][pages]),
                        scale=scale,
                        ranges=cat_tokens(self.k_ranges[li][pages]) if self.k_ranges is not None else None)
        vb = ref.VBlock(codes=cat_tokens(self.v_codes[li][pages]), params=cat_tokens(self.v_params[li][pages]))
        plan = self.layer_plan(li)
        if plan is not None:  # as `reference.seal` marks the blocks it packs
            kb.key_rotated = plan if self.oscar_config.rotation else (False,) * len(plan)
            vb.rotated = ref.rotates_values(self.oscar_config, plan) or not self.oscar_config.rotation
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

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """A layer kept in the KV dtype: its slot-indexed K; any other layer is packed (refused)."""
        li = layer_id - self.start_layer
        if li in self.bf16_layer_indices:
            return self.bf16_k[li]
        return self._no_plain()

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        li = layer_id - self.start_layer
        if li in self.bf16_layer_indices:
            return self.bf16_v[li]
        return self._no_plain()

    get_kv_buffer = _no_plain
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


def pool_base() -> type:
    """`OscarKVPool`: `OscarKVPoolMixin` over SGLang's `MHATokenToKVPool` (resolved on first use:
    importing this module imports no SGLang)."""
    return sglang_subclass(OscarKVPoolMixin, "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", "OscarKVPool")


def __getattr__(name: str) -> Any:
    if name == "OscarKVPool":
        return pool_base()
    raise AttributeError(name)
