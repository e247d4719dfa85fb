"""`OscarKVPool`: SGLang's MHA pool with OScaR pages (docs/LAYOUT.md, paged layout).

Per layer (leading axis = SGLang page id; page 0 is SGLang's padding page and is never read):

    k_codes  u8  [num_pages, H, P, D*b/8]      v_codes  u8  [num_pages, H, P, D*b/8]
    k_params f16 [num_pages, H, P/G_K, 2, D]   v_params f16 [num_pages, H, P, 2, D/G_V]
    scale    f32 [num_pages, P, S]             (absent when S = 0)
    stage_k, stage_v  model dtype [num_staging, H, P, D]   BF16 staging of open pages (model basis)

A page is *open* while a request writes it: its tokens live in a staging page. The write that fills
its last slot seals it (rotate, scale, quantize, pack) and frees the staging page. A write that
covers a whole page seals it directly, without staging. Pages SGLang frees (request end, abort,
radix eviction) give their staging page back through the allocator hook in `plugin.py`.

On CPU the seal is `oscar_sgl.reference.seal` (the oracle); on CUDA it is the Triton seal kernel
path of `oscar_sgl.kernels` (see `backend.py`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import OscarConfig
from .. import reference as ref


def cell_size_bytes(cfg: OscarConfig, num_kv_heads: int, head_dim: int, num_layers: int) -> int:
    """Bytes per token over all layers, what SGLang's pool sizer divides the KV budget by."""
    return int(math.ceil(cfg.bytes_per_token(num_kv_heads, head_dim) * num_layers))


def bf16_cell_size_bytes(num_kv_heads: int, head_dim: int, num_layers: int) -> int:
    return 2 * num_kv_heads * head_dim * 2 * num_layers


def pool_class_for(cfg: OscarConfig, *, max_running_requests: int | None, enable_metrics: bool = False) -> type:
    """A subclass of `OscarKVPool` bound to `cfg`: SGLang constructs the pool class itself, with its
    own fixed keyword arguments."""
    return type("OscarKVPool", (pool_base(),), {"oscar_config": cfg, "oscar_max_requests": max_running_requests,
                                            "oscar_enable_metrics": enable_metrics})


def _mha_base() -> type:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool



def _make_pool_class() -> type:
    base = _mha_base()

    class OscarKVPoolImpl(base):  # type: ignore[misc, valid-type]
        oscar_config: OscarConfig = OscarConfig()
        oscar_max_requests: int | None = None
        oscar_enable_metrics: bool = False

        def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                     layer_num: int, device: str, enable_memory_saver: bool, **kwargs: Any) -> None:
            cfg = self.oscar_config
            if page_size != cfg.residual:
                raise ValueError(f"OScaR pool: SGLang page size {page_size} != --oscar-page-size {cfg.residual}")
            kwargs.pop("enable_kv_cache_copy", None)
            kwargs.pop("quant_method", None)
            kwargs["post_capture_active"] = False
            cfg.check_shape(head_num, head_dim)
            self.num_pages = (size + page_size + page_size - 1) // page_size
            self.scale_cols = cfg.scale_columns(head_num)
            requests = self.oscar_max_requests or 64
            # A request has at most one open page, plus the one it fills and seals in the same step.
            self.num_staging = max(2, min(self.num_pages, 2 * requests + 2))
            super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device,
                             enable_memory_saver, enable_kv_cache_copy=False, **kwargs)
            self.oscar_reset()
            self._gauges = None
            if self.oscar_enable_metrics:
                from .metrics import PrometheusGauges

                self._gauges = PrometheusGauges()
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
            self.stage_k = z((self.num_staging, h, p, d), self.dtype)
            self.stage_v = z((self.num_staging, h, p, d), self.dtype)
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

            k = nb(self.k_codes) + nb(self.k_params) + nb(self.scales) + nb(self.stage_k)
            v = nb(self.v_codes) + nb(self.v_params) + nb(self.stage_v)
            return k, v

        # -- page state ---------------------------------------------------------------------
        def oscar_reset(self) -> None:
            """Every page free, every staging page free (allocator `clear()`)."""
            self.page_staging = torch.full((self.num_pages,), -1, dtype=torch.int64)
            self.page_sealed = torch.zeros(self.num_pages, dtype=torch.bool)
            self.staging_free = list(range(self.num_staging - 1, -1, -1))
            self._plan: tuple[Any, ...] | None = None
            self.stats = {"seals": 0, "seals_last_step": 0, "direct_seals": 0, "staging_peak": 0}

        def oscar_release_pages(self, page_ids: torch.Tensor) -> None:
            """SGLang freed these pages: their staging pages come back, their sealed state ends."""
            ids = page_ids.to("cpu", torch.int64).reshape(-1)
            ids = ids[(ids > 0) & (ids < self.num_pages)]
            if ids.numel() == 0:
                return
            stg = self.page_staging[ids]
            for s in stg[stg >= 0].tolist():
                self.staging_free.append(int(s))
            self.page_staging[ids] = -1
            self.page_sealed[ids] = False

        def oscar_page_states(self) -> dict[str, int]:
            open_pages = int((self.page_staging >= 0).sum())
            return {
                "sealed": int(self.page_sealed.sum()),
                "open": open_pages,
                "staging_in_use": self.num_staging - len(self.staging_free),
                "staging_total": self.num_staging,
            }

        def _alloc_staging(self) -> int:
            if not self.staging_free:
                raise RuntimeError(
                    f"OScaR staging exhausted ({self.num_staging} pages): more open pages than "
                    "2 x --max-running-requests + 2; raise --max-running-requests"
                )
            s = self.staging_free.pop()
            self.stats["staging_peak"] = max(self.stats["staging_peak"], self.num_staging - len(self.staging_free))
            return s

        def _plan_write(self, loc: torch.Tensor) -> tuple[Any, ...]:
            """Once per step (first layer): which page each token goes to, which pages seal."""
            p = self.page_size
            loc = loc.to("cpu", torch.int64).reshape(-1)
            keep = loc >= p  # page 0 is the padding sink
            tok = torch.nonzero(keep).reshape(-1)
            pages, offs = loc[tok] // p, loc[tok] % p
            uniq, inv, counts = torch.unique(pages, return_inverse=True, return_counts=True)
            full_here = counts == p  # this write covers the whole page: seal directly
            seal_staged: list[tuple[int, int]] = []
            direct: list[tuple[int, torch.Tensor]] = []
            for i, (page, c) in enumerate(zip(uniq.tolist(), counts.tolist())):
                if self.page_sealed[page]:
                    raise RuntimeError(f"OScaR: write into sealed page {page} (a sealed page is never written again)")
                if bool(full_here[i]):
                    idx = tok[inv == i]
                    order = torch.argsort(offs[inv == i])
                    direct.append((page, idx[order]))
                    continue
                if self.page_staging[page] < 0:
                    self.page_staging[page] = self._alloc_staging()
            staged = ~full_here[inv]
            stok = tok[staged]
            spage = pages[staged]
            sidx = self.page_staging[spage]
            soff = offs[staged]
            fills = set((pages[staged][soff == p - 1]).tolist())
            for page in fills:
                seal_staged.append((page, int(self.page_staging[page])))
            dev = self.device
            return (loc.numel(), stok.to(dev), sidx.to(dev), soff.to(dev),
                    [(pg, ix.to(dev)) for pg, ix in direct], seal_staged)

        # -- writes -------------------------------------------------------------------------
        def set_kv_buffer(self, layer: Any, loc_info: Any, cache_k: torch.Tensor, cache_v: torch.Tensor,
                          k_scale: Any = None, v_scale: Any = None, layer_id_override: Any = None,
                          dcp_kv_mask: Any = None) -> None:
            from sglang.srt.mem_cache.memory_pool import unwrap_write_loc

            if dcp_kv_mask is not None:
                raise RuntimeError("OScaR pool: decode context parallelism is not supported")
            loc = unwrap_write_loc(loc_info)[0]
            layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
            li = layer_id - self.start_layer
            if li == 0 or self._plan is None or self._plan[0] != loc.numel():
                self._plan = self._plan_write(loc)
            n, stok, sidx, soff, direct, seal_staged = self._plan
            h, d = self.head_num, self.head_dim
            k = cache_k.reshape(-1, h, d)
            v = cache_v.reshape(-1, h, d)
            if stok.numel():
                self.stage_k[li][sidx, :, soff, :] = k[stok].to(self.dtype)
                self.stage_v[li][sidx, :, soff, :] = v[stok].to(self.dtype)
            for page, idx in direct:
                self._seal(li, page, k[idx].transpose(0, 1), v[idx].transpose(0, 1))
            for page, s in seal_staged:
                self._seal(li, page, self.stage_k[li][s], self.stage_v[li][s])
            if li == self.layer_num - 1:
                sealed_now = [pg for pg, _ in direct] + [pg for pg, _ in seal_staged]
                for page, s in seal_staged:
                    self.page_staging[page] = -1
                    self.staging_free.append(s)
                if sealed_now:
                    self.page_sealed[torch.tensor(sealed_now, dtype=torch.int64)] = True
                self.stats["seals"] += len(sealed_now)
                self.stats["seals_last_step"] = len(sealed_now)
                self.stats["direct_seals"] += len(direct)
                self._plan = None
                if self._gauges is not None:
                    self._gauges.update(self)

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
            stg = self.page_staging.to(slots.device)[pages]
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
