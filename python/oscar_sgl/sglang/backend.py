"""The `oscar` attention backend: attention over an `OscarKVPool`.

The Canalized (Walsh-Hadamard) rotation lives here, so model code is untouched: q and k arrive
after RoPE and are rotated inside; v is rotated on the way into a sealed page (the seal); the
attention output is accumulated in the rotated basis and un-rotated once.

What a query at position x sees (block flush with R = page size, docs/LAYOUT.md and docs/OSCAR.md
§4), by `--oscar-prefill`:

* `position` (the default): the pages below the page holding x as codes (dequantized, logits times
  s_t) and the tokens of its own page up to x exactly (BF16 staging of the tokens written before
  the step, then this step's own K/V). That is what a decode step sees
  (`oscar_sgl.reference.decode_attention`, which the CPU path calls) and what `OscarCache` computes
  for page-sized chunks, so a token's attention depends on its position only: the same prompt gives
  the same answer cold, after a prefix-cache hit, at any --chunked-prefill-size and in any batch.
  Pages that this step fills before x are sealed by `set_kv_buffer` before the attention runs.
* `exact`: one boundary for the whole step, the page holding the step's first token s0: the pages
  sealed before the step as codes, everything after exactly. A fresh prompt then keeps exact
  attention (and is sealed afterwards), while a prefix-cache hit attends to the sealed shared pages:
  the answer depends on the cache state and the chunking.

Two paths with the same semantics: the torch reference (CPU default) and the Triton kernels of
`oscar_sgl.kernels` (CUDA default; CPU with `OSCAR_SGL_USE_KERNELS=1 TRITON_INTERPRET=1`, see
`pool.kernels_wanted`): per layer one `oscar_write_kv` launch (rotated BF16 staging + s_t), one
`oscar_seal` launch for every page of the step's seal plan, then `oscar_decode_attention` or
`oscar_extend_attention`, which read a page from staging while the page -> staging map names a slot
(open pages, and pages sealed in this very step) and from the packed pool otherwise (pages sealed
before this step). The kernel path stages K/V in BF16, so it matches the reference to BF16
rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import reference as ref
from ..errors import OscarConfigError
from ..supported import check_attention_layer as check_layer
from .classes import sglang_subclass
from .step import OscarStep


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def window_of(layer: Any) -> int | None:
    """A sliding-window layer's window (SGLang's `RadixAttention.sliding_window_size`: the query at
    position x sees positions x - window .. x), None for a full-attention layer (SGLang's -1)."""
    w = getattr(layer, "sliding_window_size", -1)
    return int(w) if w is not None and int(w) >= 0 else None


def _check_extra(layer: Any, kwargs: dict[str, Any]) -> None:
    """What a model passes to attention beyond q, k, v (gpt-oss: `sinks`): the kernels compute
    plain softmax attention, so any such argument is refused by name, never ignored."""
    extra = sorted(k for k, v in kwargs.items() if v is not None)
    if extra:
        raise OscarConfigError(
            f"the model's attention passes {', '.join(extra)} at layer {getattr(layer, 'layer_id', '?')}, which "
            "--kv-cache oscar does not compute (plain softmax attention); serve this model with --kv-cache default")


def _host_lens(fb: Any) -> list[int]:
    """The batch's sequence lengths as host ints: SGLang's host copy when it has one (no device sync)."""
    cpu = getattr(fb, "seq_lens_cpu", None)
    return [int(x) for x in (cpu if cpu is not None else fb.seq_lens).tolist()]


class OscarAttnBackendMixin:
    """Over SGLang's torch-native backend (for its metadata handling); every forward is ours. Step
    state lives in the pool's step owner (`self.step`, an `OscarStep`), never here."""

    def __init__(self, model_runner: Any) -> None:
        super().__init__(model_runner)  # type: ignore[call-arg]
        pool = self.token_to_kv_pool
        if not hasattr(pool, "oscar_config"):
            raise OscarConfigError(
                "--attention-backend oscar needs --kv-cache oscar, got the attention backend alone: "
                "only the OScaR KV pool has the packed pages it reads"
            )
        self.cfg = pool.oscar_config
        self.step: OscarStep = pool.oscar_step
        model = getattr(model_runner, "model", None)
        attention_layers: list[Any] = []
        if model is not None:
            # Every attention layer of the loaded model, checked before the first request; the
            # sliding-window ones are recorded for /server_info (each forward reads its layer's window).
            from sglang.srt.layers.radix_attention import RadixAttention

            for name, m in model.named_modules():
                if isinstance(getattr(m, "sinks", None), torch.Tensor):  # gpt-oss: learned softmax sinks
                    raise OscarConfigError(
                        f"the model's attention must not have attention sinks with --kv-cache oscar, got {name}.sinks: "
                        "the OScaR kernels compute plain softmax attention; serve this model with --kv-cache default")
                if isinstance(m, RadixAttention):
                    check_layer(m)
                    attention_layers.append(m)
                    w = window_of(m)
                    if w is not None and pool.start_layer <= m.layer_id < pool.start_layer + pool.layer_num:
                        pool.sliding_windows[m.layer_id] = w
        if self.cfg.rotation and self.cfg.key_rotation == "weights" and pool.key_rotation_plan is None:
            # The rule reads the weights this rank loaded (before any write or CUDA-graph capture).
            from .plan import key_rotation_plan_from_sglang, kivi_layers_over_ranks

            plan, self.key_alignment = key_rotation_plan_from_sglang(
                getattr(model_runner, "model", None), self.cfg, start_layer=pool.start_layer, num_layers=pool.layer_num,
                num_kv_heads=pool.head_num, head_dim=pool.head_dim)
            pool.oscar_set_key_rotation(kivi_layers_over_ranks(plan))
        # --oscar-prefill: each query's sealed boundary by its position (True) or the prefix's end
        self.position = pool.oscar_settings.prefill == "position"
        self.warm_up = None
        if attention_layers and pool.use_kernels and torch.device(pool.device).type == "cuda" and not _interpreting():
            dtype = getattr(getattr(model_runner, "model_config", None), "dtype", None)
            self.warm_up = self.warm_up_kernels(attention_layers, dtype if isinstance(dtype, torch.dtype) else pool.dtype)

    def warm_up_kernels(self, layers: list[Any], dtype: torch.dtype) -> dict[str, Any]:
        """Compile the prefill-path kernels once per kind of layer (value rotation, per-head key
        plan, token scales, sliding window, query heads) at startup, so that no request waits for a
        Triton compile in the middle of serving (the decode kernels compile when SGLang captures
        its CUDA graphs, or at its warm-up request). `OscarKVPool.oscar_warm_up` says why nothing
        cached is touched. Returns what was compiled, for /server_info and the log."""
        import logging
        import time

        pool = self.token_to_kv_pool
        t0 = time.monotonic()
        kinds: dict[tuple[Any, ...], int] = {}
        for m in layers:
            li = m.layer_id - pool.start_layer
            if not 0 <= li < pool.layer_num or pool.is_bf16_layer(li):
                continue
            window = window_of(m)
            kind = (pool.layer_rotates_values(li), pool.paged_layer(li).key_rotated is not None,
                    pool.layer_scales_tokens(li), window is not None, m.tp_q_head_num)
            if kind not in kinds:
                kinds[kind] = li
                pool.oscar_warm_up(li, num_q_heads=m.tp_q_head_num, dtype=dtype, position=self.position, window_left=window)
        if torch.device(pool.device).type == "cuda":
            torch.cuda.synchronize(torch.device(pool.device))
        info = {"layer_kinds": len(kinds), "layers": sorted(kinds.values()), "seconds": round(time.monotonic() - t0, 2)}
        pool.oscar_warm_up_info = info
        logging.getLogger(__name__).info("oscar: prefill kernels compiled for %d layer kind(s) in %.1f s",
                                         info["layer_kinds"], info["seconds"])
        return info

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)  # type: ignore[misc]
        # The step's page events go to the Rust runtime here, once, before the first layer.
        self.step.start_forward()

    # -- CUDA graphs (decode; on by default on CUDA) -------------------------------------------
    # SGLang 0.5.23's protocol: init_cuda_graph_state once; per captured or replayed step,
    # init_forward_metadata_out_graph (eager, host work) then init_forward_metadata_in_graph
    # (recorded); forward_decode runs only while capturing. Out of the graph: the runtime call
    # and the page -> staging map update, and the step's seal plan copied into a fixed-size plan
    # buffer (unused rows -1). In the graph: each request's page list gathered from
    # req_to_token into a fixed [max_bs, max_pages] table and the lengths copied; per layer the
    # fused decode launch (write + attention) and one seal launch over the plan buffer.

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any) -> None:
        pool = self.token_to_kv_pool
        if not pool.use_kernels:
            raise OscarConfigError("--disable-decode-cuda-graph is needed on the torch reference path "
                                   "(OSCAR_SGL_USE_KERNELS=0, or no CUDA device): OScaR decode CUDA graphs "
                                   "capture the kernel path")
        p, dev = pool.page_size, pool.device
        r2t = self.req_to_token_pool.req_to_token
        self._g_max_pages = -(-r2t.shape[1] // p)
        self._g_first = torch.arange(self._g_max_pages, dtype=torch.int64, device=r2t.device) * p
        self._g_kv_indptr = (torch.arange(max_bs + 1, dtype=torch.int32) * self._g_max_pages).to(dev)
        self._g_pages = torch.zeros(max_bs * self._g_max_pages, dtype=torch.int32, device=dev)
        self._g_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self._g_workspaces: dict[int, Any] = {}
        # a decode step fills at most one page per request; twice that leaves room for a carried plan
        self.step.graph_plan_init(2 * max_bs)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        if not forward_batch.forward_mode.is_decode():
            raise RuntimeError("--kv-cache oscar captures decode steps only (prefill CUDA graphs stay off)")
        self.step.graph_plan_stage()  # begins the step; every layer of it runs inside the graph

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        fb = forward_batch
        bs = fb.req_pool_indices.shape[0]
        r2t = self.req_to_token_pool.req_to_token
        self._g_seq_lens[:bs].copy_(fb.seq_lens)
        rows = fb.req_pool_indices.to(torch.int64)
        pages = r2t[rows[:, None], self._g_first[None, :]].to(torch.int64) // self.token_to_kv_pool.page_size
        self._g_pages[: bs * self._g_max_pages].copy_(pages.reshape(-1))

    def _forward_decode_graph(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: Any) -> torch.Tensor:
        """The captured body of one layer: no host work, every buffer fixed per batch size."""
        from .. import kernels as K

        pool = self.token_to_kv_pool
        li = layer.layer_id - pool.start_layer
        hq, h, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        q_ = q.reshape(-1, hq, d)
        if pool.is_bf16_layer(li):
            pool.oscar_write_bf16(li, fb.out_cache_loc.reshape(-1).to(torch.int64), k.reshape(-1, h, d), v.reshape(-1, h, d))
            return self._bf16_decode(q_, li, layer, fb.req_pool_indices, self._g_seq_lens[:q_.shape[0]]).reshape(-1, hq * d)
        bs = q_.shape[0]
        ws = self._g_workspaces.get(bs)
        paged = pool.paged_layer(li)
        if ws is None:  # first seen in the warm-up runs before the capture
            # the split count of the stage 1 the launcher picks for this layer (Triton or Gluon)
            splits = K.decode_num_splits(bs, h, d, pool.page_size, layer=paged, num_q_heads=hq, device=q.device)
            ws = self._g_workspaces[bs] = K.decode_workspace(bs, hq, h, d, splits, q.device)
        out = K.oscar_decode_attention(
            q=q_.contiguous(), layer=paged,
            kv_indptr=self._g_kv_indptr[: bs + 1], kv_page_indices=self._g_pages, seq_lens=self._g_seq_lens[:bs],
            sm_scale=layer.scaling, new_k=k.reshape(-1, h, d), new_v=v.reshape(-1, h, d), new_loc=fb.out_cache_loc.reshape(-1),
            staging_scale=pool.layer_stage_scale(li),
            workspace=ws, window_left=window_of(layer),
        )
        pool.oscar_graph_seal(li)
        return out.reshape(-1, hq * d)

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any,
                       forward_batch: Any, save_kv_cache: bool = True, **kwargs: Any) -> torch.Tensor:
        _check_extra(layer, kwargs)
        fb = forward_batch
        seq, pre = _host_lens(fb), getattr(fb, "extend_prefix_lens_cpu", None)
        pre = list(pre) if pre is not None else fb.extend_prefix_lens.tolist()
        return self._forward(q, k, v, layer, fb, pre, seq, save_kv_cache, decode=False)

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any,
                       forward_batch: Any, save_kv_cache: bool = True, **kwargs: Any) -> torch.Tensor:
        _check_extra(layer, kwargs)
        if self.step.in_graph:
            check_layer(layer)
            if not save_kv_cache or k is None or v is None:
                raise RuntimeError("--oscar-cuda-graph: a decode step that does not write its K/V cannot be captured")
            return self._forward_decode_graph(q, k, v, layer, forward_batch)
        seq = _host_lens(forward_batch)
        pre = [s - 1 for s in seq]
        return self._forward(q, k, v, layer, forward_batch, pre, seq, save_kv_cache, decode=True)

    def _forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: Any,
                 pre: list[int], seq: list[int], save_kv_cache: bool, decode: bool) -> torch.Tensor:
        if layer.is_cross_attention:
            raise NotImplementedError("--kv-cache oscar: cross-attention is not supported")
        check_layer(layer)
        pool = self.token_to_kv_pool
        if pool.is_bf16_layer(layer.layer_id - pool.start_layer):
            return self._forward_bf16(q, k, v, layer, fb, pre, seq, save_kv_cache, decode)
        if pool.use_kernels:
            return self._forward_kernels(q, k, v, layer, fb, pre, seq, save_kv_cache, decode)
        li = layer.layer_id - pool.start_layer
        p = pool.page_size
        hq, h, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        req_to_token = self.req_to_token_pool.req_to_token
        rows = fb.req_pool_indices.tolist()
        self.step.begin()  # no-op after init_forward_metadata (one runtime call per step)
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, fb.out_cache_loc, k, v)
        # The BF16 tokens of each request's open page. A page the write just filled is sealed, but
        # keeps its staging page until the next step, so it is still read exactly here.
        prev: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for r, s0 in zip(rows, pre):
            start = s0 // p * p
            prev.append(pool.open_tokens(li, req_to_token[r, start:s0].to(torch.int64)) if s0 > start else None)
        k_new = k.reshape(-1, h, d)
        v_new = v.reshape(-1, h, d)
        q_ = q.reshape(-1, hq, d)
        out = torch.empty(q_.shape[0], hq, d, dtype=q.dtype, device=q.device)
        at = 0
        window = window_of(layer)
        for i, (r, s0, s1) in enumerate(zip(rows, pre, seq)):
            n = s1 - s0
            if self.position and not decode:
                out[at:at + n] = self._extend_by_pages(q_[at:at + n], k_new[at:at + n], v_new[at:at + n],
                                                       prev[i], r, s0, s1, li, layer.scaling, window).to(q.dtype)
                at += n
                continue
            k_fp = k_new[at:at + n].transpose(0, 1).float()
            v_fp = v_new[at:at + n].transpose(0, 1).float()
            if prev[i] is not None:
                k_fp = torch.cat((prev[i][0].float(), k_fp), dim=1)
                v_fp = torch.cat((prev[i][1].float(), v_fp), dim=1)
            # Decode, and extend with --oscar-prefill exact: the pages sealed before this step as
            # codes, everything from there on exactly.
            n_sealed = s0 // p
            pages = req_to_token[r, 0:n_sealed * p:p].to(torch.int64) // p
            blocks = pool.sealed_blocks(li, pages) if n_sealed else None
            kbs, vbs = ([blocks[0]], [blocks[1]]) if blocks is not None else ([], [])
            plan = pool.layer_plan(li)
            if decode:
                out[at] = ref.decode_attention(q_[at], kbs, vbs, k_fp, v_fp, self.cfg, layer.scaling,
                                               key_rotated=plan, window_left=window).to(q.dtype)
            else:
                out[at:at + n] = ref.extend_attention(q_[at:at + n], kbs, vbs, k_fp, v_fp, self.cfg,
                                                      layer.scaling, key_rotated=plan, window_left=window).to(q.dtype)
            at += n
        return out.reshape(-1, hq * d)

    # -- layers kept in the KV dtype (`--oscar-sliding-layers bf16`, sliding.py) ---------------
    def _bf16_decode(self, q: torch.Tensor, li: int, layer: Any, rows: torch.Tensor,
                     seq_lens: torch.Tensor) -> torch.Tensor:
        from .sliding import window_decode

        pool = self.token_to_kv_pool
        return window_decode(q, pool.bf16_k[li], pool.bf16_v[li], self.req_to_token_pool.req_to_token, rows,
                             seq_lens, self._bf16_window(layer), layer.scaling)

    def _bf16_window(self, layer: Any) -> int:
        window = window_of(layer)
        if window is None:  # the pool keeps exactly the model's sliding layers (plugin._bf16_layers)
            raise RuntimeError(f"OScaR: layer {layer.layer_id} is kept in the KV dtype but has no sliding window")
        return window

    def _forward_bf16(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: Any,
                      pre: list[int], seq: list[int], save_kv_cache: bool, decode: bool) -> torch.Tensor:
        """A sliding layer kept in the KV dtype: write its rows at the step's slots, attend over
        each request's window (`sliding.window_decode` / `window_extend`); no seal."""
        from .sliding import window_extend

        pool = self.token_to_kv_pool
        li = layer.layer_id - pool.start_layer
        hq, d = layer.tp_q_head_num, layer.qk_head_dim
        self.step.begin()
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, fb.out_cache_loc, k, v)
        q_ = q.reshape(-1, hq, d)
        if decode:
            return self._bf16_decode(q_, li, layer, fb.req_pool_indices.to(q.device),
                                     fb.seq_lens.to(q.device)).reshape(-1, hq * d)
        cached = getattr(self, "_bf16_rows", None)  # the batch's rows, read once per forward batch
        if cached is None or cached[0] is not fb:
            cached = self._bf16_rows = (fb, fb.req_pool_indices.tolist())
        rows = cached[1]
        return window_extend(q_, pool.bf16_k[li], pool.bf16_v[li], self.req_to_token_pool.req_to_token, rows, pre,
                             seq, self._bf16_window(layer), layer.scaling).reshape(-1, hq * d)

    def _extend_by_pages(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         prev: tuple[torch.Tensor, torch.Tensor] | None, r: int, s0: int, s1: int, li: int,
                         sm_scale: float, window: int | None = None) -> torch.Tensor:
        """Reference path, `--oscar-prefill position`: one request's new tokens s0..s1-1, page by
        page. The queries of page b are `reference.extend_attention` of a whole page (P rows, zero
        where the chunk has no token) over the sealed pages below b and the page's P tokens (exact,
        zero past the chunk's last one; causally masked): the same shapes, hence the same fp32
        bits, for a token however its prompt was chunked, cached or batched. (A row-count-dependent
        rounding would not stay small: it moves keys across INT2 rounding boundaries, and those
        flipped codes change the next layers' keys, benches/results/determinism.md.)"""
        pool = self.token_to_kv_pool
        p = pool.page_size
        r2t = self.req_to_token_pool.req_to_token
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        h, d = k.shape[1], k.shape[2]
        for b in range(s0 // p, (s1 - 1) // p + 1):
            lo, hi = max(s0, b * p), min(s1, (b + 1) * p)  # the chunk's tokens in page b
            q_page = q.new_zeros((p,) + tuple(q.shape[1:]), dtype=torch.float32)
            q_page[lo - b * p:hi - b * p] = q[lo - s0:hi - s0].float()
            kv_page = [torch.zeros(h, p, d, dtype=torch.float32, device=q.device) for _ in range(2)]
            if b * p < s0 and prev is not None:  # the prefix's tokens of its open page: staging
                kv_page[0][:, :s0 - b * p] = prev[0].float()
                kv_page[1][:, :s0 - b * p] = prev[1].float()
            kv_page[0][:, lo - b * p:hi - b * p] = k[lo - s0:hi - s0].transpose(0, 1).float()
            kv_page[1][:, lo - b * p:hi - b * p] = v[lo - s0:hi - s0].transpose(0, 1).float()
            kbs: list = []
            vbs: list = []
            if b:
                kb, vb = pool.sealed_blocks(li, r2t[r, 0:b * p:p].to(torch.int64) // p)
                kbs, vbs = [kb], [vb]
            o = ref.extend_attention(q_page, kbs, vbs, kv_page[0], kv_page[1], self.cfg, sm_scale,
                                     key_rotated=pool.layer_plan(li), window_left=window)
            out[lo - s0:hi - s0] = o[lo - b * p:hi - b * p]
        return out

    # -- the kernel path (CUDA; CPU with OSCAR_SGL_USE_KERNELS=1 TRITON_INTERPRET=1) ------------
    def _kernel_meta(self, fb: Any, pre: list[int], seq: list[int], decode: bool) -> dict[str, Any]:
        """Per forward batch (built at its first layer, reused by the others): each request's pages,
        oldest first, as the kernels' int32 `kv_indptr` / `kv_page_indices`."""
        return self.step.batch_meta((fb, decode), lambda: self._build_kernel_meta(fb, pre, seq, decode))

    def _build_kernel_meta(self, fb: Any, pre: list[int], seq: list[int], decode: bool) -> dict[str, Any]:
        pool = self.token_to_kv_pool
        p, dev = pool.page_size, pool.device
        r2t = self.req_to_token_pool.req_to_token
        # Decode reads every page of the request (the current token is in staging); extend reads
        # the prefix pages and, by position, the pages its own tokens filled before its last one
        # (its own tokens come from k/v). Host lengths, device gathers: no sync.
        if decode:
            npages = [-(-n // p) for n in seq]
        elif self.position:
            npages = [max(-(-a // p), (b - 1) // p) for a, b in zip(pre, seq)]
        else:
            npages = [-(-a // p) for a in pre]
        total = sum(npages)
        if total:
            rows = fb.req_pool_indices.to(device=r2t.device, dtype=torch.int64)
            reps = torch.tensor(npages, dtype=torch.int64).to(r2t.device)
            row_of = torch.repeat_interleave(rows, reps, output_size=total)
            first = [i * p for n in npages for i in range(n)]
            kv_pages = (r2t[row_of, torch.tensor(first, dtype=torch.int64).to(r2t.device)].to(torch.int64) // p
                        ).to(device=dev, dtype=torch.int32)
        else:
            kv_pages = torch.zeros(0, dtype=torch.int32, device=dev)
        i32 = lambda xs: torch.tensor(xs, dtype=torch.int32).to(dev)  # noqa: E731
        cum = [0]
        for n in npages:
            cum.append(cum[-1] + n)
        meta: dict[str, Any] = {"kv_indptr": i32(cum), "kv_page_indices": kv_pages}
        if decode:
            meta["seq_lens"] = i32(seq)
        else:
            new = [b - a for a, b in zip(pre, seq)]
            qo = [0]
            for n in new:
                qo.append(qo[-1] + n)
            meta.update(qo_indptr=i32(qo), prefix_lens=i32(pre), max_new_tokens=max(new, default=0), kv_indptr_host=cum)
        return meta

    def _forward_kernels(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: Any,
                         pre: list[int], seq: list[int], save_kv_cache: bool, decode: bool) -> torch.Tensor:
        from .. import kernels as K

        pool = self.token_to_kv_pool
        li = layer.layer_id - pool.start_layer
        hq, h, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        self.step.begin()
        fused = decode and save_kv_cache and k is not None and v is not None
        if fused:
            # Decode: the write path runs inside the attention launch (one launch per layer);
            # the step's seal plan (pages this write fills included) runs after it.
            li, loc, k_new, v_new = pool.oscar_prepare_write(layer, fb.out_cache_loc, k, v)
        elif save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, fb.out_cache_loc, k, v)  # write launch + seal launch
        meta = self._kernel_meta(fb, pre, seq, decode)
        q_ = q.reshape(-1, hq, d).contiguous()
        common = dict(layer=pool.paged_layer(li), kv_indptr=meta["kv_indptr"], kv_page_indices=meta["kv_page_indices"],
                      sm_scale=layer.scaling, window_left=window_of(layer))
        if fused:
            out = K.oscar_decode_attention(
                q=q_, seq_lens=meta["seq_lens"], new_k=k_new, new_v=v_new, new_loc=loc,
                staging_scale=pool.layer_stage_scale(li), **common,
            )
            pool.oscar_seal_after_fused_write(li)
        elif decode:
            out = K.oscar_decode_attention(q=q_, seq_lens=meta["seq_lens"], **common)
        else:
            out = K.oscar_extend_attention(
                q=q_, k=k.reshape(-1, h, d).contiguous(), v=v.reshape(-1, h, d).contiguous(),
                qo_indptr=meta["qo_indptr"], prefix_lens=meta["prefix_lens"],
                max_new_tokens=meta["max_new_tokens"], kv_indptr_host=meta["kv_indptr_host"], position=self.position, **common,
            )
        return out.reshape(-1, hq * d)


def backend_class() -> type:
    """`OscarAttnBackend`: the mixin over SGLang's `TorchNativeAttnBackend`."""
    return sglang_subclass(OscarAttnBackendMixin,
                           "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend",
                           "OscarAttnBackend")


def create_oscar_backend(runner: Any) -> Any:
    """The factory SGLang's attention registry calls with the model runner."""
    return backend_class()(runner)
