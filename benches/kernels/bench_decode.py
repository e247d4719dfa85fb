"""Decode-attention benchmark on one GPU: OScaR INT2/INT4 (Triton) vs SGLang 0.5.23's Triton BF16
decode kernel (same page size) and torch SDPA on contiguous BF16 KV.

Shapes: Llama-3.1-8B attention (32 query heads, 8 KV heads, head_dim 128), page size 128, at
(batch, context) = (1,131072) (1,32768) (8,32768) (32,8192) (64,4096) (16,65536). Every request has
``context`` tokens: ``context/128 - 1`` sealed pages and one open (full) BF16 page in staging.

Timing: each measured callable is captured ``C`` times back to back in one CUDA graph (C copies of
the KV data, so that one replay streams at least ~4x the L2 size from HBM and nothing is timed out
of L2), ``triton.testing.do_bench(graph.replay, quantiles=[0.5, 0.2, 0.8])``, divided by ``C``.
Bandwidth is counted on the bytes each call must move (KV bytes read, partial results written and
read back, queries, outputs). Also measured: the write path of one decode step (rotate + s_t + BF16
staging write of the new token, with the query rotation fused), the seal kernel's bandwidth, and
the HBM copy bandwidth. Results: JSON + PNG + Markdown under ``--out``.

Run on the device machine through ``benches/kernels/run_gpu.sh``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from oscar_sgl.config import INT2_FORMAT, OscarConfig
from oscar_sgl.kernels import PagedLayer, decode_workspace, oscar_decode_attention, oscar_extend_attention, oscar_seal, oscar_write_kv
from oscar_sgl.kernels import decode as _dec
from oscar_sgl.kernels import extend as _ext

HQ, H, D, P = 32, 8, 128, 128
SHAPES = [(1, 131072), (1, 32768), (8, 32768), (32, 8192), (64, 4096), (16, 65536)]
QUANTILES = [0.5, 0.2, 0.8]
L2_BYTES = 60 * 2**20
DEV = torch.device("cuda")


_T0 = time.monotonic()


def log(*a):
    print(f"[{time.monotonic() - _T0:6.1f} s]", *a, flush=True)


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------


def time_calls(calls, rep_ms: int = 60) -> dict:
    """Median / p20 / p80 microseconds of one call, the calls (one per data copy) replayed from a
    CUDA graph. Falls back to plain launches (and says so) when capture fails."""
    for c in calls:  # compile / warm up outside the capture
        c()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c in calls:
                c()
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                for c in calls:
                    c()
        torch.cuda.current_stream().wait_stream(s)
        fn, how = g.replay, "cuda_graph"
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        log(f"    graph capture failed ({type(e).__name__}: {e}); timing plain launches")

        def fn():
            for c in calls:
                c()

        how = "launches"
    ms = do_bench(fn, warmup=10, rep=rep_ms, quantiles=QUANTILES)
    n = len(calls)
    return {"us": ms[0] * 1e3 / n, "us_p20": ms[1] * 1e3 / n, "us_p80": ms[2] * 1e3 / n, "method": how, "calls_per_replay": n}


def copies_for(bytes_per_call: float, budget: float) -> int:
    """Data copies so that one graph replay streams >= 4x L2 (capped by a memory budget)."""
    want = max(1, math.ceil(4 * L2_BYTES / max(bytes_per_call, 1)))
    fit = max(1, int(budget // max(bytes_per_call, 1)))
    return max(1, min(want, fit, 32))


def hbm_copy_bandwidth() -> float:
    x = torch.empty(2**30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=10, rep=100, quantiles=[0.5])
    ms = ms[0] if isinstance(ms, (list, tuple)) else ms
    del x, y
    return 2 * 2**30 / (ms * 1e-3) / 1e12


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------------------------------------------------
# OScaR pool (random but well-scaled data; the GPU tests check the numbers)
# ------------------------------------------------------------------------------------------------


#: token-scale columns of the pools OscarSetup builds: 1, the layer norm scope (the default); H,
#: per KV head (``--oscar-norm-scope head``). benches/kernels/write_share.py --scale-cols sets it.
SCALE_COLS = 1


class OscarSetup:
    def __init__(self, bits: int, batch: int, ctx: int, copies: int, seed: int = 0, k_group: int = 32, v_group: int = 32,
                 key_page: bool = False):
        g = torch.Generator(device=DEV).manual_seed(seed)
        self.bits, self.batch, self.ctx, self.copies = bits, batch, ctx, copies
        self.k_group, self.v_group, self.key_page = k_group, v_group, key_page
        self.cfg = OscarConfig(bits=bits, page_size=P, k_group=k_group, v_group=v_group,
                               key_ranges="page" if key_page else "group")
        pages_req = -(-ctx // P)  # the last page holds ctx - (pages_req - 1) * P tokens (open, in staging)
        npages = copies * batch * pages_req + 1
        nbytes = D * bits // 8
        self.k_codes = torch.randint(0, 256, (npages, H, P, nbytes), dtype=torch.uint8, device=DEV, generator=g)
        self.v_codes = torch.randint(0, 256, (npages, H, P, nbytes), dtype=torch.uint8, device=DEV, generator=g)
        kp = torch.empty(npages, H, 1 if key_page else P // k_group, 2, D, device=DEV)
        kp[:, :, :, 0].uniform_(0.005, 0.05, generator=g)
        kp[:, :, :, 1].uniform_(-0.1, 0.0, generator=g)
        if key_page:  # page grids (base, step) and sorted (a, b) indices per key group
            kp[:, :, :, 0].uniform_(-0.1, 0.0, generator=g)
            kp[:, :, :, 1].uniform_(1e-4, 1e-3, generator=g)
            ab = torch.randint(0, 256, (npages, H, P // k_group, 2, D), device=DEV, generator=g, dtype=torch.int32)
            self.k_ranges = torch.sort(ab, dim=3).values.to(torch.uint8).contiguous()
        else:
            self.k_ranges = None
        vp = torch.empty(npages, H, P, 2, D // v_group, device=DEV)
        vp[:, :, :, 0].uniform_(0.05, 0.5, generator=g)
        vp[:, :, :, 1].uniform_(-1.0, 0.0, generator=g)
        self.k_params, self.v_params = kp.half(), vp.half()
        self.scale = torch.empty(npages, P, SCALE_COLS, device=DEV).uniform_(0.5, 50.0, generator=g)
        ns = copies * batch
        self.staging_k = (torch.randn(ns, H, P, D, device=DEV, generator=g) * 0.3).bfloat16()
        self.staging_v = torch.randn(ns, H, P, D, device=DEV, generator=g).bfloat16()
        self.staging_scale = torch.ones(ns, P, SCALE_COLS, device=DEV)
        self.p2s = torch.full((npages,), -1, dtype=torch.int32, device=DEV)
        perm = torch.randperm(npages - 1, device=DEV, generator=g) + 1
        self.indptr, self.pages, self.seq_lens = [], [], []
        for c in range(copies):
            pg = perm[c * batch * pages_req : (c + 1) * batch * pages_req].to(torch.int32)
            last = pg.view(batch, pages_req)[:, -1]
            self.p2s[last.long()] = torch.arange(c * batch, (c + 1) * batch, dtype=torch.int32, device=DEV)
            self.pages.append(pg.contiguous())
            self.indptr.append(torch.arange(0, (batch + 1) * pages_req, pages_req, dtype=torch.int32, device=DEV))
            self.seq_lens.append(torch.full((batch,), ctx, dtype=torch.int32, device=DEV))
        # the step's new token of every request: the last slot of its (open) last page
        self.new_loc = [(pg.view(batch, pages_req)[:, -1].to(torch.int64) * P + (ctx - 1) % P) for pg in self.pages]
        self.new_k = torch.randn(batch, H, D, device=DEV, generator=g).bfloat16()
        self.new_v = torch.randn(batch, H, D, device=DEV, generator=g).bfloat16()
        self.q = torch.randn(batch, HQ, D, device=DEV, generator=g).bfloat16()
        self.q_rot = torch.randn(batch, HQ, D, device=DEV, generator=g)
        self.out = torch.empty(batch, HQ, D, device=DEV, dtype=torch.bfloat16)

    def pool(self):
        return dict(layer=PagedLayer(k_codes=self.k_codes, k_params=self.k_params, v_codes=self.v_codes,
                                     v_params=self.v_params, scale=self.scale, staging_k=self.staging_k,
                                     staging_v=self.staging_v, page_to_staging=self.p2s, bits=self.bits,
                                     k_group=self.k_group, v_group=self.v_group, k_ranges=self.k_ranges))  # fmt: skip

    def kv_bytes(self) -> int:
        """HBM bytes of one call's KV: sealed pages (codes + params + s_t) and the open BF16 page."""
        sealed = self.batch * (-(-self.ctx // P) - 1)
        k_params = 2 * D * 2 + (P // self.k_group) * 2 * D if self.key_page else (P // self.k_group) * 2 * D * 2
        per_page = H * (2 * P * D * self.bits // 8 + k_params + P * 2 * (D // self.v_group) * 2) + P * 4
        tail = self.batch * H * (self.ctx - (-(-self.ctx // P) - 1) * P) * D * 2 * 2
        return sealed * per_page + tail

    def call(self, copy: int, *, tuning, ws, mode: str = "fused"):
        """One decode launch as the backend runs it (``fused``: query rotation, the new token's write
        and the merge in the launch), without the write (``nowrite``), or the unfused two-launch
        path of the first version (``unfused``: queries rotated beforehand, separate merge launch),
        or with the write as a launch of its own before the stage 1 (``splitwrite``:
        ``_DecodeTuning.split_write``, a fused Gluon variant only; ``splitrot``: the query rotation
        in that launch too; ``splitpdl``: the stage 1 a programmatic dependent launch),
        or with the queries rotated beforehand and the tuning as given (``qrot``: the ``--gluon``
        comparison, whose Gluon stage 1 fuses neither the write nor the rotation).
        ``tuning``: the launcher's ``_DecodeTuning``; the workspace ``ws`` sets the split count."""
        pool = self.pool()
        kw = dict(q=self.q, **pool, kv_indptr=self.indptr[copy], kv_page_indices=self.pages[copy],
                  seq_lens=self.seq_lens[copy], sm_scale=1 / math.sqrt(D), out=self.out, workspace=ws,
                  _tuning=tuning)  # fmt: skip
        if mode in ("fused", "skipwrite"):
            # skipwrite: the write compiled in and every new token sent to the padding page 0, which
            # maps to no staging slot, so the launch runs the write's lookups but stores nothing
            loc = self.new_loc[copy] if mode == "fused" else torch.zeros_like(self.new_loc[copy])
            kw.update(new_k=self.new_k, new_v=self.new_v, new_loc=loc, staging_scale=self.staging_scale)
        elif mode in ("splitwrite", "splitrot", "splitpdl"):  # the write in a launch of its own (splitrot: with
            # the query rotation; splitpdl: the stage 1 a programmatic dependent launch)
            kw.update(new_k=self.new_k, new_v=self.new_v, new_loc=self.new_loc[copy], staging_scale=self.staging_scale,
                      _tuning=dataclasses.replace(tuning, split_write=True, split_rotation=mode == "splitrot",
                                                  split_pdl=mode == "splitpdl"))
        elif mode == "unfused":
            kw.update(q_rot=self.q_rot, _tuning=dataclasses.replace(tuning, fused_merge=False))
        elif mode == "qrot":
            kw.update(q_rot=self.q_rot)
        elif mode != "nowrite":
            raise ValueError(mode)

        def run():
            oscar_decode_attention(**kw)

        return run


@triton.jit
def _stream_kernel(kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr, kv_indptr_ptr, page_idx_ptr, seq_lens_ptr, sink_ptr,
                   H: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Reads exactly the sealed-page bytes stage 1 reads (same tiles and split of pages), no math."""
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_s = tl.program_id(2)
    n_split = tl.num_programs(2)
    W: tl.constexpr = D * BITS // 32
    NG: tl.constexpr = D // 32
    TPP: tl.constexpr = P // BLOCK_N
    seq_len = tl.load(seq_lens_ptr + i_b)
    kv_start = tl.load(kv_indptr_ptr + i_b).to(tl.int64)
    n_tiles = (tl.cdiv(seq_len, P) - 1) * TPP
    per = tl.cdiv(n_tiles, n_split)
    t_lo = i_s * per
    t_hi = tl.minimum(t_lo + per, n_tiles)
    acc = tl.zeros([BLOCK_N], tl.int32)
    o_w = tl.arange(0, W)
    for it in range(t_lo, t_hi):
        page = tl.load(page_idx_ptr + kv_start + it // TPP).to(tl.int64)
        t0 = (it % TPP) * BLOCK_N
        o_row = (page * H + i_h) * P + t0 + tl.arange(0, BLOCK_N)
        kwv = tl.load(kw_ptr + o_row[:, None] * W + o_w[None, :])
        vwv = tl.load(vw_ptr + o_row[:, None] * W + o_w[None, :])
        vpv = tl.load(vp_ptr + o_row[:, None] * NG + tl.arange(0, NG)[None, :])
        o_g = (page * H + i_h) * (P // 32) + t0 // 32 + tl.arange(0, BLOCK_N // 32)
        kpv = tl.xor_sum(tl.load(kp_ptr + o_g[:, None] * D + tl.arange(0, D)[None, :]), axis=0)
        sv = tl.load(scale_ptr + page * P + t0 + tl.arange(0, BLOCK_N)).to(tl.int32, bitcast=True)
        acc ^= tl.xor_sum(kwv ^ vwv, axis=1) ^ tl.xor_sum(vpv, axis=1) ^ sv ^ tl.xor_sum(kpv, axis=0)
    tl.store(sink_ptr + (i_b * H + i_h) * n_split + i_s, tl.xor_sum(acc, axis=0))


def stream_only(st, splits, block_n, num_warps, num_stages, copies) -> dict:
    sink = torch.empty(st.batch * H * splits, dtype=torch.int32, device=DEV)
    kp = st.k_params.flatten(-2).view(torch.int32)
    vp = st.v_params.flatten(-2).view(torch.int32)

    def mk(c):
        return lambda: _stream_kernel[(st.batch, H, splits)](
            st.k_codes.view(torch.int32), kp, st.v_codes.view(torch.int32), vp, st.scale, st.indptr[c], st.pages[c],
            st.seq_lens[c], sink, H=H, D=D, BITS=st.bits, P=P, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip

    t = time_calls([mk(c) for c in range(copies)])
    sealed = st.batch * (st.ctx // P - 1)
    nbytes = sealed * (H * (2 * P * D * st.bits // 8 + (P // 32) * 2 * D * 2 + P * 2 * (D // 32) * 2) + P * 4)
    return {**t, "bytes": nbytes, "TBps": nbytes / (t["us"] * 1e-6) / 1e12}


def bench_gluon(bits: int, batch: int, ctx: int, budget: float, variants: tuple[str, ...] = ("regs1",),
                waves: tuple[float, ...] = (), mode: str = "qrot", max_splits: int = 128, fmt: str = "group",
                block_n: int | None = None, fit: bool = False, page_rules: tuple[tuple[str, int], ...] = ()) -> dict:
    """``--gluon``: the Gluon stage 1 (``_DecodeTuning.gluon``; issue 14 item 1, first step) side by
    side with the default Triton kernel on the same data, both with the queries rotated beforehand
    and no write (the Gluon path fuses neither): default = stage 1 (+ the merge, fused or not, as
    the default decides); gluon = Gluon stage 1 + the merge launch with the inverse rotation. Also
    the Triton path with the separate merge launch (``fused_merge=False``), the Gluon path's launch
    structure. ``agree``: relative RMS of the Gluon output against the default's. ``variants``: the
    Gluon stage-1 variants (``gluon_decode.GLUON_VARIANTS``), each its own column ``gluon:<name>``
    at the default's split count, and ``gluon:<name>@w<W>`` at the split count of ``W`` programs
    per SM for each of ``waves`` (at most ``max_splits`` splits: the default rule's 128 caps a
    single request at 8 KV heads to 1032 programs whatever ``waves`` asks); the first variant at the default splits is also reported as
    ``gluon`` (its speedup and agreement). ``mode="fused"`` (``--gluon-step``): the whole decode
    step of a layer instead, the new token's write and the query rotation included (fused into
    the Triton stage 1; a separate write launch before the Gluon stage 1), as the backend runs it.
    ``fmt="page"`` (``--gluon-format page``): the INT2 server default's format (page-grid key
    ranges, G_K 16, G_V 64) instead of the paper's, the Gluon columns at 16-token tiles (one key
    group per tile), the Triton ones at their default 32. ``block_n`` (``--gluon-block-n``): the
    Gluon columns' tile instead (32 at ``fmt="page"``: two key groups per tile). ``fit``
    (``--gluon-fit``): also ``gluon:<name>@fit`` at ``pick_num_splits(fit=True)``'s split count (all
    programs in one wave of the Gluon default's resident programs: for ``open_share`` variants).
    ``page_rules`` (``--gluon-page-rule``, with ``fmt="page"``): for each ``(variant, block_n)`` also
    ``gluon:rule <variant>@<block_n>``, the launcher's own choice (split count included) were its
    page-grid rule to take the Gluon stage 1 at INT2 and INT4 with that variant on ``block_n``-token
    tiles (``decode.GLUON_DEFAULT_PAGE_BITS`` / ``_VARIANT`` / ``gluon_block_n`` patched for the column):
    a candidate for the INT2 server default timed as the backend would run it."""
    form = dict(k_group=16, v_group=64, key_page=True) if fmt == "page" else {}
    probe = OscarSetup(bits, batch, ctx, 1, **form)
    per_call = probe.kv_bytes()
    del probe
    copies = copies_for(per_call, budget)
    st = OscarSetup(bits, batch, ctx, copies, **form)
    default = _dec._default_tuning(batch, H, D, P)
    gbn = {"block_n": block_n} if block_n else ({"block_n": 16} if fmt == "page" else {})
    splits = _dec.pick_num_splits(batch, H, waves=default.waves)
    ws = decode_workspace(batch, HQ, H, D, splits, DEV)
    res = {"batch": batch, "ctx": ctx, "bits": bits, "copies": copies, "num_splits": splits, "kv_bytes": per_call,
           "mode": mode, "format": fmt, "gluon_block_n": gbn.get("block_n", default.block_n)}
    outs = {}
    labels = list(variants) + [f"{v}@w{w:g}" for w in waves for v in variants] + [f"{v}@fit" for v in variants if fit]
    res["variants"] = labels
    cols = [("default", default, ws), ("triton_merge_launch", dataclasses.replace(default, fused_merge=False), ws)]
    cols += [(f"gluon:{v}", dataclasses.replace(default, gluon=True, gluon_variant=v, **gbn), ws) for v in variants]
    for w in waves:
        n = _dec.pick_num_splits(batch, H, waves=w, max_splits=max_splits)
        res.setdefault("num_splits_by_waves", {})[f"{w:g}"] = n
        ws_w = decode_workspace(batch, HQ, H, D, n, DEV)
        cols += [(f"gluon:{v}@w{w:g}", dataclasses.replace(default, gluon=True, gluon_variant=v, waves=w, **gbn), ws_w)
                 for v in variants]
    if fit:  # the workspace sets the split count (oscar_decode_attention: num_splits None)
        n = _dec.pick_num_splits(batch, H, resident=_dec.GLUON_RESIDENT, fit=True, max_splits=max_splits)
        res["num_splits_fit"] = n
        ws_f = decode_workspace(batch, HQ, H, D, n, DEV)
        cols += [(f"gluon:{v}@fit", dataclasses.replace(default, gluon=True, gluon_variant=v, **gbn), ws_f)
                 for v in variants]
    # the launcher's own choice for this launch (the Gluon default where it takes it, at its split count)
    lt = launcher_tuning(bits, batch, k_group=st.k_group, v_group=st.v_group, key_page=st.key_page)
    n = _dec.tuning_num_splits(lt, batch, H)
    res["launcher"] = {"gluon": lt.gluon_variant if lt.gluon else None, "num_splits": n}
    labels.append("launcher")
    cols.append(("gluon:launcher", lt, decode_workspace(batch, HQ, H, D, n, DEV)))
    for v, bn in page_rules:
        with _page_rule(v, bn):
            rt = launcher_tuning(bits, batch, k_group=st.k_group, v_group=st.v_group, key_page=st.key_page)
            n = _dec.tuning_num_splits(rt, batch, H)
        label = f"rule {v}@{bn}"
        res.setdefault("page_rules", {})[label] = {"gluon": rt.gluon_variant if rt.gluon else None,
                                                    "block_n": rt.block_n, "num_splits": n}
        labels.append(label)
        cols.append((f"gluon:{label}", rt, decode_workspace(batch, HQ, H, D, n, DEV)))
    for name, tune, wsc in cols:
        try:
            st.call(0, tuning=tune, ws=wsc, mode=mode)()
            torch.cuda.synchronize()
            outs[name] = st.out.clone()
            t = time_calls([st.call(c, tuning=tune, ws=wsc, mode=mode) for c in range(copies)])
            res[name] = {**t, "TBps": per_call / (t["us"] * 1e-6) / 1e12}
            log(f"    {name:20s}: {t['us']:8.2f} us  {res[name]['TBps']:.2f} TB/s (KV bytes only)")
        except Exception as e:  # noqa: BLE001 - reported, the other variants still run
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
            log(f"    {name}: FAILED {res[name]['error']}")
    for v in labels:
        k = f"gluon:{v}"
        if k in outs and "default" in outs:
            res.setdefault("agree_rel_rms_by_variant", {})[v] = rel_rms(outs[k], outs["default"])
            log(f"    {k} vs default: relative RMS {res['agree_rel_rms_by_variant'][v]:.2e}")
        if "us" in res.get(k, {}) and "us" in res.get("default", {}):
            res.setdefault("speedup_by_variant", {})[v] = res["default"]["us"] / res[k]["us"]
    first = f"gluon:{variants[0]}"
    res["gluon"] = res.get(first, {})
    if variants[0] in res.get("agree_rel_rms_by_variant", {}):
        res["agree_rel_rms"] = res["agree_rel_rms_by_variant"][variants[0]]
    if variants[0] in res.get("speedup_by_variant", {}):
        res["speedup_vs_default"] = res["speedup_by_variant"][variants[0]]
    del st
    torch.cuda.empty_cache()
    return res


def gluon_markdown(rows: list[dict], meta: dict) -> str:
    """Times per shape: default, Triton + merge launch, and one column per Gluon variant (us and
    "x default" = default / variant); then the worst agreement with the default over the variants."""
    variants = next((r["variants"] for r in rows if "variants" in r), ["regs1"])
    head = " | ".join(f"{v} us (x default)" for v in variants)
    out = [f"Gluon stage 1 variants vs the default Triton kernel ({meta['gpu']}, triton {meta['triton']}, commit {meta['commit']}, "
           f"{meta['date']}); " + ("the whole decode step (write and query rotation included)"
                                    if meta.get("gluon_mode") == "fused" else "queries rotated beforehand, no write")
           + ("; format: page-grid key ranges, G_K 16, G_V 64 (the INT2 server default)"
              if meta.get("gluon_format") == "page" else "")
           + (f"; the Gluon columns at {meta['gluon_block_n']}-token tiles" if meta.get("gluon_block_n") else "")
           + "; times in us (CUDA graphs over distinct KV copies). 'default': the Triton stage 1's tuning "
           "(`_default_tuning`), which the launcher replaces by the Gluon default where `gluon_default_reason` "
           "allows (session 21).", "",
           f"| B | ctx | bits | default us | Triton + merge launch us | {head} | best | max rel RMS vs default |",
           "|---|---|---|---|---|" + "---|" * len(variants) + "---|---|"]
    for r in rows:
        def us(k):
            return f"{r[k]['us']:.1f}" if "us" in r.get(k, {}) else "failed"
        cells = []
        for v in variants:
            sp = r.get("speedup_by_variant", {}).get(v)
            cells.append(f"{us('gluon:' + v)} ({sp:.2f})" if sp is not None else us("gluon:" + v))
        sps = r.get("speedup_by_variant", {})
        best = max(sps, key=sps.get) if sps else "-"
        ags = r.get("agree_rel_rms_by_variant", {})
        ag = f"{max(ags.values()):.1e}" if ags else "-"
        out.append(f"| {r['batch']} | {r['ctx']} | {r['bits']} | {us('default')} | {us('triton_merge_launch')} | {' | '.join(cells)} | {best} | {ag} |")
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _page_rule(variant: str, block_n: int):
    """The launcher's page-grid rule as a candidate would set it (``bench_gluon``'s ``page_rules``):
    the Gluon stage 1 at INT2 and INT4 with ``variant`` on ``block_n``-token tiles at G_K 16."""
    saved = (_dec.GLUON_DEFAULT_PAGE_BITS, _dec.GLUON_DEFAULT_PAGE_VARIANT, _dec.gluon_block_n)
    orig_block_n = _dec.gluon_block_n

    def block_n_rule(bn, k_group, key_page):
        return block_n if key_page and k_group == 16 and bn == 32 else orig_block_n(bn, k_group, key_page)

    _dec.GLUON_DEFAULT_PAGE_BITS, _dec.GLUON_DEFAULT_PAGE_VARIANT, _dec.gluon_block_n = (2, 4), variant, block_n_rule
    try:
        yield
    finally:
        _dec.GLUON_DEFAULT_PAGE_BITS, _dec.GLUON_DEFAULT_PAGE_VARIANT, _dec.gluon_block_n = saved


def launcher_tuning(bits: int, batch: int, *, k_group: int, v_group: int, key_page: bool):
    """What ``oscar_decode_attention`` runs without ``_tuning`` for this launch on this device
    (``decode._launch_tuning``: the Triton stage 1, or the Gluon one where the default takes it)."""
    return _dec._launch_tuning(batch, H, D, P, group=HQ // H, bits=bits, k_group=k_group, v_group=v_group,
                               key_page=key_page, device=torch.device(DEV))


def bench_oscar(bits: int, batch: int, ctx: int, variants, budget: float, extras: bool | str = True) -> dict:
    probe = OscarSetup(bits, batch, ctx, 1)
    per_call = probe.kv_bytes()
    del probe
    copies = copies_for(per_call, budget)
    st = OscarSetup(bits, batch, ctx, copies)
    res = {"kv_bytes": per_call, "copies": copies, "variants": []}
    ref_out = None
    tunes = []
    default = _dec._default_tuning(batch, H, D, P)
    for bn, nw, ns, waves, mr, tr in variants:
        is_default = bn == 0
        if is_default:  # the launcher's default configuration (what the backend runs: Gluon where it takes it)
            tune = launcher_tuning(bits, batch, k_group=st.k_group, v_group=st.v_group, key_page=st.key_page)
        else:
            tune = dataclasses.replace(default, block_n=bn, num_warps=nw, num_stages=ns, waves=float(waves), maxnreg=mr or None,
                                       transposed=bool(tr))
        splits = _dec.tuning_num_splits(tune, batch, H)
        ws = decode_workspace(batch, HQ, H, D, splits, DEV)
        desc = {"block_n": tune.block_n, "num_warps": tune.num_warps, "num_stages": tune.num_stages, "waves": tune.waves,
                "maxnreg": tune.maxnreg, "transposed": tune.transposed, "default": is_default,
                "gluon": (tune.gluon_variant + (" + split_pdl" if tune.split_pdl else "")) if tune.gluon else None,
                # _DecodeTuning.long_gluon: the requests of at least that many tokens on a Gluon launch
                # of their own (the workspace's split count is the larger: that launch's)
                "long_gluon": (f"{tune.long_gluon}: {tune.long_variant or 'default'} @ "
                               f"{_dec.long_gluon_splits(tune, batch, H)} splits, Triton @ "
                               f"{_dec.pick_num_splits(batch, H, waves=tune.waves, resident=tune.resident, fit=tune.fit)}")
                if tune.long_gluon else None}
        try:
            st.call(0, tuning=tune, ws=ws)()
            torch.cuda.synchronize()
            o = st.out.clone()
            if ref_out is None:
                ref_out = o
            agree = rel_rms(o, ref_out)
            t = time_calls([st.call(c, tuning=tune, ws=ws) for c in range(copies)])
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
            log(f"    variant {desc}: FAILED {type(e).__name__}: {str(e)[:200]}")
            res["variants"].append({**desc, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        part_bytes = 2 * batch * HQ * (splits + 1) * (D + 1) * 4
        total = per_call + part_bytes + batch * HQ * D * (4 + 2)
        v = {**desc, "num_splits": splits, "agree_rel_rms": agree, "bytes": total, "TBps": total / (t["us"] * 1e-6) / 1e12, **t}
        res["variants"].append(v)
        tunes.append((v, tune))
        tag = " (default)" if is_default else ""
        log(f"    bn={tune.block_n:3d} nw={tune.num_warps} ns={tune.num_stages} mr={tune.maxnreg} tr={int(tune.transposed)} "
            f"splits={splits:3d}{tag}: {t['us']:8.2f} us  {v['TBps']:.2f} TB/s  (agree {agree:.1e})")
    ok = [v for v in res["variants"] if "error" not in v and v["agree_rel_rms"] < 2e-3]
    res["best"] = min(ok, key=lambda v: v["us"]) if ok else None
    if res["best"] is not None and extras:
        # where the time goes: the fused launch without the write (the write's marginal cost), the
        # unfused path (rotated queries + stage 1 + separate merge launch), the merge launch alone
        b = res["best"]
        splits = b["num_splits"]
        ws = decode_workspace(batch, HQ, H, D, splits, DEV)
        cfg_b = dict(tuning=next(tune for v, tune in tunes if v is b), ws=ws)
        res["nowrite_us"] = time_calls([st.call(c, mode="nowrite", **cfg_b) for c in range(copies)])["us"]
        # the same launch with the write compiled in but storing nothing (every new token on the padding
        # page): what the write's own work costs, apart from how its code changes the compiled kernel
        res["skipwrite_us"] = time_calls([st.call(c, mode="skipwrite", **cfg_b) for c in range(copies)])["us"]
        res["unfused_us"] = time_calls([st.call(c, mode="unfused", **cfg_b) for c in range(copies)])["us"]

        def stage2():
            _dec.merge_launch(ws[0][:, :, : splits + 1], ws[1][:, :, : splits + 1], st.out)

        ws[0].zero_()
        ws[1].zero_()
        # 20 back-to-back launches per replay over the same partials (L2-resident, as right after
        # stage 1 wrote them): the merge's cost inside a step, launch gaps included
        res["stage2_us"] = time_calls([stage2] * 20)["us"]
        # an all-sealed variant of the same call (no open page): the tail split's cost
        st.p2s.fill_(-1)
        # the same bytes streamed by a kernel that only loads them (same grid, tiles, pipelining):
        # what this access pattern can get out of HBM, against which stage 1's time is judged
        res["stream_only"] = stream_only(st, splits, b["block_n"], b["num_warps"], 3, copies)
        res["all_sealed_us"] = time_calls([st.call(c, mode="nowrite", **cfg_b) for c in range(copies)])["us"]
    del st
    torch.cuda.empty_cache()
    return res


#: The key-range formats `--formats` times side by side: (name, k_group, v_group, page-grid key ranges).
FORMATS = (("group G_K32 G_V32 (default)", 32, 32, False), ("page G_K16 G_V128", 16, 128, True),
           ("page G_K16 G_V64", 16, 64, True), ("group G_K16 G_V128", 16, 128, False),
           ("page G_K32 G_V64", 32, 64, True))


def _default_launch_setup(bits: int, batch: int, ctx: int, budget: float, default, **fmt):
    """Distinct KV copies of one format within ``budget`` bytes and the workspace of the default
    launch's split count: ``(setup, workspace, KV bytes per call, copies)``."""
    probe = OscarSetup(bits, batch, ctx, 1, **fmt)
    per_call = probe.kv_bytes()
    del probe
    copies = copies_for(per_call, budget)
    st = OscarSetup(bits, batch, ctx, copies, **fmt)
    ws = decode_workspace(batch, HQ, H, D, _dec.tuning_num_splits(default, batch, H), DEV)
    return st, ws, per_call, copies


#: The INT2 format the server runs by default (``config.INT2_FORMAT``: page-grid key ranges, G_K 16,
#: G_V 64), in `FORMATS`' form: the report's 'INT2, server format' column (the decode table's INT2
#: rows are the paper's format, G_K = G_V = 32).
SERVED_INT2_FORMAT = (f"page G_K{INT2_FORMAT['k_group']} G_V{INT2_FORMAT['v_group']} (INT2 server default)",
                      INT2_FORMAT["k_group"], INT2_FORMAT["v_group"], INT2_FORMAT["key_ranges"] == "page")


def bench_formats(bits: int, batch: int, ctx: int, budget: float, formats=FORMATS) -> list[dict]:
    """The default decode launch (fused write, default tuning) over pools of each of ``formats``
    (`FORMATS` entries), same shape, CUDA graphs over distinct copies: what page-grid key ranges cost
    or save."""
    rows = []
    for name, kg, vg, page in formats:
        default = launcher_tuning(bits, batch, k_group=kg, v_group=vg, key_page=page)
        st, ws, per_call, copies = _default_launch_setup(bits, batch, ctx, budget, default, k_group=kg, v_group=vg, key_page=page)
        t = time_calls([st.call(c, tuning=default, ws=ws) for c in range(copies)])
        eff = st.cfg.effective_bits(H, D)
        rows.append({"format": name, "k_group": kg, "v_group": vg, "key_page": page, "bits": bits, "batch": batch, "ctx": ctx,
                     "stage1": f"gluon:{default.gluon_variant}{' + split_pdl' if default.split_pdl else ''}" if default.gluon else "triton", "effective_bits": eff, "kv_bytes": per_call, "copies": copies, "TBps": per_call / (t["us"] * 1e-6) / 1e12, **t})
        log(f"    {name:28s} INT{bits} B={batch} ctx={ctx}: {t['us']:8.2f} us  {eff:.3f} b  {rows[-1]['TBps']:.2f} TB/s")
        del st
        torch.cuda.empty_cache()
    return rows


#: SGLang 0.5.23's decode CUDA-graph batch sizes at --max-running-requests 128 (its server log)
CAPTURE_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128)


def bench_merge_chunk(bits: int, batch: int, ctx: int, budget: float) -> list[dict]:
    """The default decode launch with the fused merge's chunk fixed (the default) and by the split
    count (``_DecodeTuning.merge_chunk="splits"``, the rule before session 18), INT2 default and
    paper formats, CUDA graphs over distinct copies, side by side."""
    rows = []
    default = _dec._default_tuning(batch, H, D, P)
    splits = _dec.tuning_num_splits(default, batch, H)
    for name, kg, vg, page in (("paper G_K32 G_V32", 32, 32, False), ("page G_K16 G_V64", 16, 64, True)):
        st, ws, _, copies = _default_launch_setup(bits, batch, ctx, budget, default, k_group=kg, v_group=vg, key_page=page)
        for rule in (None, "splits"):
            tune = dataclasses.replace(default, merge_chunk=rule)
            t = time_calls([st.call(c, tuning=tune, ws=ws) for c in range(copies)])
            rows.append({"format": name, "bits": bits, "batch": batch, "ctx": ctx, "splits": splits,
                         "chunk_rule": rule or "fixed", **t})
            log(f"    merge chunk {rule or 'fixed':6s} {name:18s} INT{bits} B={batch} ctx={ctx} splits={splits}: {t['us']:8.2f} us")
        del st
        torch.cuda.empty_cache()
    return rows


def count_capture_compiles(bits: int, ctx: int = 256) -> list[dict]:
    """Stage-1 compiles (and their seconds) when the default decode launch meets every batch size of
    `CAPTURE_BATCHES`, per merge-chunk rule, each from an empty Triton cache (the compile log of
    `oscar_sgl.compile_log`, in this process)."""
    import tempfile

    from triton import knobs

    rows = []
    for rule in (None, "splits"):
        recs: list[dict] = []
        before = knobs.compilation.listener

        def listener(*, src, metadata, metadata_group, times, cache_hit, _recs=recs):
            if getattr(src, "name", "") == "_decode_stage1_kernel":
                _recs.append({"hit": cache_hit, "s": times.total / 1e6})

        knobs.compilation.listener = listener
        old_dir = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="merge-chunk-")
        _dec._decode_stage1_kernel.device_caches.clear()
        try:
            for b in CAPTURE_BATCHES:
                st = OscarSetup(bits, b, ctx, 1, k_group=16, v_group=64, key_page=True)
                tune = dataclasses.replace(_dec._default_tuning(b, H, D, P), merge_chunk=rule)
                splits = _dec.tuning_num_splits(tune, b, H)
                st.call(0, tuning=tune, ws=decode_workspace(b, HQ, H, D, splits, DEV))()
                torch.cuda.synchronize()
                del st
        finally:
            knobs.compilation.listener = before
            if old_dir is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old_dir
        compiled = [r for r in recs if not r["hit"]]
        rows.append({"chunk_rule": rule or "fixed", "bits": bits, "batches": len(CAPTURE_BATCHES),
                     "compiles": len(compiled), "seconds": round(sum(r["s"] for r in compiled), 2)})
        log(f"    capture batches, merge chunk {rule or 'fixed'}: {len(compiled)} stage-1 compiles, {rows[-1]['seconds']} s")
    return rows


def merge_chunk_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"Fused-merge chunk fixed vs by split count ({_run_label('--merge-chunk', meta)}): the default fused decode launch, CUDA graphs over "
           "distinct KV copies; H = 8, Hq = 32, D = 128.", "",
           "| B | ctx | bits | splits | format | fixed us | by splits us | fixed / by splits |", "|---|---|---|---|---|---:|---:|---:|"]
    timed = [r for r in rows if "us" in r]
    for r in timed:
        if r["chunk_rule"] != "fixed":
            continue
        o = next(x for x in timed if x["chunk_rule"] == "splits" and
                 (x["format"], x["batch"], x["ctx"], x["bits"]) == (r["format"], r["batch"], r["ctx"], r["bits"]))
        out.append(f"| {r['batch']} | {r['ctx']} | {r['bits']} | {r['splits']} | {r['format']} | {r['us']:.1f} | {o['us']:.1f} | "
                   f"{r['us'] / o['us']:.3f} |")
    counts = [r for r in rows if "compiles" in r]
    if counts:
        out += ["", "Stage-1 compiles over the batch sizes of a server's decode CUDA graphs (INT2 default format, empty "
                "Triton cache each):", "", "| merge chunk | batch sizes | compiles | seconds |", "|---|---:|---:|---:|"]
        out += [f"| {r['chunk_rule']} | {r['batches']} | {r['compiles']} | {r['seconds']} |" for r in counts]
    return "\n".join(out) + "\n"


def _run_label(flag: str, meta: dict) -> str:
    """What a rows-only table's title says about its run: the command flag, GPU, Triton, commit, date."""
    return f"`bench_decode.py {flag}`; {meta['gpu']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}"


def formats_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"Decode with each key-range format ({_run_label('--formats', meta)}): the default fused decode launch (write, query rotation, split-KV "
           "attention, merge), CUDA graphs over distinct KV copies; effective bits at this shape (H = 8, D = 128); "
           "SDPA BF16 timed in the same run.", "",
           "| B | ctx | bits | format | eff. bits | us | TB/s (KV bytes) | x default format | SDPA us | x SDPA |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next(x for x in rows if x["batch"] == r["batch"] and x["ctx"] == r["ctx"] and x["bits"] == r["bits"]
                    and x["format"].startswith("group G_K32"))
        sdpa = r.get("sdpa_us")
        out.append(f"| {r['batch']} | {r['ctx']} | {r['bits']} | {r['format']} | {r['effective_bits']:.3f} | {r['us']:.1f} | "
                   f"{r['TBps']:.2f} | {base['us'] / r['us']:.2f} | {sdpa:.1f} | {sdpa / r['us']:.2f} |" if sdpa else
                   f"| {r['batch']} | {r['ctx']} | {r['bits']} | {r['format']} | {r['effective_bits']:.3f} | {r['us']:.1f} | "
                   f"{r['TBps']:.2f} | {base['us'] / r['us']:.2f} | - | - |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# baselines
# ------------------------------------------------------------------------------------------------


def bench_sglang(batch: int, ctx: int, budget: float) -> dict:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    per_call = batch * ctx * H * D * 2 * 2
    copies = copies_for(per_call, budget)
    slots = copies * batch * ctx + P
    k_buf = (torch.randn(slots, H, D, device=DEV) * 0.3).bfloat16()
    v_buf = torch.randn(slots, H, D, device=DEV).bfloat16()
    q = torch.randn(batch, HQ, D, device=DEV).bfloat16()
    o = torch.empty(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
    indptr = torch.arange(0, (batch + 1) * ctx, ctx, dtype=torch.int32, device=DEV)
    # pages of one request in a shuffled page order, slots inside a page consecutive (page_size=P)
    n_pg = copies * batch * ctx // P
    perm = torch.randperm(n_pg, device=DEV) + 1
    indices = [(perm[c * batch * ctx // P : (c + 1) * batch * ctx // P].repeat_interleave(P) * P
                + torch.arange(P, device=DEV).repeat(batch * ctx // P)).to(torch.int32) for c in range(copies)]  # fmt: skip
    res = {"kv_bytes": per_call, "copies": copies, "splits": {}}
    for splits in (8, 16, 32, 64):
        logits = torch.empty(batch, HQ, splits, D, device=DEV)
        lse = torch.empty(batch, HQ, splits, device=DEV)
        nsplit = torch.full((batch,), splits, dtype=torch.int32, device=DEV)

        def mk(c, logits=logits, lse=lse, nsplit=nsplit, splits=splits):
            return lambda: decode_attention_fwd(q, k_buf, v_buf, o, indptr, indices[c], logits, lse, nsplit, splits,
                                                1 / math.sqrt(D), 1.0, 1.0, page_size=P)  # fmt: skip

        try:
            t = time_calls([mk(c) for c in range(copies)])
        except Exception as e:  # noqa: BLE001
            log(f"    sglang splits={splits}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        total = per_call + 2 * batch * HQ * splits * (D + 1) * 4 + batch * HQ * D * 4
        res["splits"][splits] = {**t, "bytes": total, "TBps": total / (t["us"] * 1e-6) / 1e12}
        log(f"    sglang splits={splits:3d}: {t['us']:8.2f} us  {res['splits'][splits]['TBps']:.2f} TB/s")
    if res["splits"]:
        best = min(res["splits"], key=lambda s: res["splits"][s]["us"])
        res["best_splits"] = best
        res["us"] = res["splits"][best]["us"]
        # numerical sanity against SDPA on the same data (first copy)
        kk = k_buf[indices[0].long()].view(batch, ctx, H, D).transpose(1, 2)
        vv = v_buf[indices[0].long()].view(batch, ctx, H, D).transpose(1, 2)
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, None].float(), kk.float(), vv.float(), enable_gqa=True)[:, :, 0]
        mk(0)()
        res["rel_rms_vs_fp32"] = rel_rms(o, ref)
        del kk, vv
    del k_buf, v_buf
    torch.cuda.empty_cache()
    return res


def bench_sdpa(batch: int, ctx: int, budget: float) -> dict:
    per_call = batch * ctx * H * D * 2 * 2
    copies = copies_for(per_call, budget)
    ks = [(torch.randn(batch, H, ctx, D, device=DEV) * 0.3).bfloat16() for _ in range(copies)]
    vs = [torch.randn(batch, H, ctx, D, device=DEV).bfloat16() for _ in range(copies)]
    q = torch.randn(batch, HQ, 1, D, device=DEV).bfloat16()
    F = torch.nn.functional

    def mk(c):
        return lambda: F.scaled_dot_product_attention(q, ks[c], vs[c], enable_gqa=True)

    t = time_calls([mk(c) for c in range(copies)])
    total = per_call + 2 * batch * HQ * D * 2
    del ks, vs
    torch.cuda.empty_cache()
    return {"kv_bytes": per_call, "copies": copies, "bytes": total, "TBps": total / (t["us"] * 1e-6) / 1e12, **t}


def bench_authors(build_dir: str, batch: int, ctx: int, group: int) -> dict:
    """The OScaR authors' CUDA kernel at one shape (benches/peers/oscar_authors.py), in a process of
    its own: an illegal memory access there must not take this process's CUDA context with it."""
    import subprocess

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers", "oscar_authors.py")
    cmd = [sys.executable, script, "bench", "--build-dir", build_dir, "--batch", str(batch), "--ctx", str(ctx), "--group", str(group)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"group": group, "error": "timed out after 180 s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"group": group, "error": f"rc {p.returncode}: " + (p.stderr or p.stdout)[-1500:]}


# ------------------------------------------------------------------------------------------------
# write path and seal
# ------------------------------------------------------------------------------------------------


def bench_write(batch: int) -> dict:
    npages = 4 * batch + 1
    stg_k = torch.empty(batch, H, P, D, device=DEV, dtype=torch.bfloat16)
    stg_v = torch.empty_like(stg_k)
    stg_s = torch.empty(batch, P, 1, device=DEV)
    p2s = torch.full((npages,), -1, dtype=torch.int32, device=DEV)
    pages = torch.arange(1, batch + 1, device=DEV) * 4
    p2s[pages] = torch.arange(batch, dtype=torch.int32, device=DEV)
    loc = (pages * P + 37).to(torch.int64)
    k = torch.randn(batch, H, D, device=DEV).bfloat16()
    v = torch.randn(batch, H, D, device=DEV).bfloat16()
    q = torch.randn(batch, HQ, D, device=DEV).bfloat16()
    q_rot = torch.empty(batch, HQ, D, device=DEV)

    def run():
        oscar_write_kv(k=k, v=v, loc=loc, page_to_staging=p2s, staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s, q=q, q_rot_out=q_rot)

    return time_calls([run] * 20)


# (batch, cached prefix, new tokens): prefix-cache hits, then fresh prompts (prefill chunks)
EXTEND_SHAPES = [(1, 32768, 1024), (4, 8192, 512), (16, 4096, 128), (1, 0, 8192), (4, 0, 2048), (1, 8192, 8192)]
# (block_m, num_warps, block_n, dequantize, num_stages); block_m 0 = the launcher's default, None =
# its automatic choice. The last one is the first extend default (128 rows, 8 warps, 32-token tiles
# dequantized in registers): its time is the "registers" column.
EXTEND_VARIANTS = [(0, 0, None, None, None), (128, 8, 64, True, None), (64, 4, 64, True, 2), (64, 4, 128, True, None),
                   (32, 4, 64, True, None), (128, 8, 32, False, None)]


def _extend_inputs(bits: int, batch: int, prefix: int, new: int, **fmt):
    """One prefill chunk's inputs: a pool with pages for the prefix and the chunk (every page below
    the chunk's last sealed), the chunk's q/k/v, offsets, prefix lengths and output buffer."""
    st = OscarSetup(bits, batch, prefix + new, 1, seed=3, **fmt)
    st.p2s.fill_(-1)
    g = torch.Generator(device=DEV).manual_seed(4)
    t = batch * new
    q = torch.randn(t, HQ, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(t, H, D, device=DEV, generator=g).bfloat16()
    v = torch.randn(t, H, D, device=DEV, generator=g).bfloat16()
    qo = torch.arange(0, t + 1, new, dtype=torch.int32, device=DEV)
    pre = torch.full((batch,), prefix, dtype=torch.int32, device=DEV)
    out = torch.empty(t, HQ, D, device=DEV, dtype=torch.bfloat16)
    return st, g, t, q, k, v, qo, pre, out


def bench_extend(bits: int, batch: int, prefix: int, new: int, variants=EXTEND_VARIANTS) -> dict:
    """A prefill chunk: ``new`` tokens per request over a sealed ``prefix`` (every page packed; 0: a
    fresh prompt) and causally over themselves, in both ``--oscar-prefill`` modes, side by side with
    SGLang's Triton extend kernel over BF16 KV of the same prefix (token-level indices, as its Triton
    backend passes them). ``position`` (the default): each row reads the chunk's pages below its own
    as codes (sealed before the launch in the server; random codes here), its own page from k/v;
    ``exact``: every new token from k/v (BF16). ``variants``: the tilings timed (the first the
    launcher's default, the last the 'registers' column)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    st, g, t, q, k, v, qo, pre, out = _extend_inputs(bits, batch, prefix, new)

    def oscar(**kw):
        oscar_extend_attention(q=q, k=k, v=v, qo_indptr=qo, **st.pool(), kv_indptr=st.indptr[0],
                               kv_page_indices=st.pages[0], prefix_lens=pre, sm_scale=1 / math.sqrt(D),
                               max_new_tokens=new, out=out, **kw)  # fmt: skip

    res = {"batch": batch, "prefix": prefix, "new": new, "bits": bits, "variants": []}
    for bm, nw, bn, dq, ns in variants:  # block_m 0: the launcher's default
        kw = {} if bm == 0 else {"_tuning": dataclasses.replace(_ext._default_tuning(HQ, H, D), block_m=bm, num_warps=nw,
                                                                  block_n=bn, dequantize=dq, num_stages=ns)}
        cfg = {"block_m": bm, "num_warps": nw, "block_n": bn, "dequantize": dq, "num_stages": ns}
        try:
            tv = time_calls([lambda kw=kw: oscar(**kw)])
        except Exception as e:  # noqa: BLE001
            res["variants"].append({**cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        res["variants"].append({**cfg, **tv})
    ok = [v for v in res["variants"] if "us" in v]
    res["oscar"] = min(ok, key=lambda v: v["us"])
    res["oscar_default_us"] = ok[0]["us"] if ok and ok[0]["block_m"] == 0 else None
    res["oscar_registers_us"] = res["variants"][-1].get("us")  # the default tiling, dequantizing in registers
    res["default_dequantizes"] = _ext.dequantize_scratch_bytes(st.pages[0].shape[0] // batch, H, P, D) <= _ext.DEQUANTIZE_SCRATCH_BYTES
    res["default_groups"] = len(_ext.scratch_groups(st.indptr[0].tolist(), _ext.DEQUANTIZE_SCRATCH_BYTES // _ext.dequantize_scratch_bytes(1, H, P, D)))
    try:  # --oscar-prefill exact, the default tuning
        res["oscar_exact"] = time_calls([lambda: oscar(position=False)])
    except Exception as e:  # noqa: BLE001
        res["oscar_exact"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    kb = torch.randn(batch * prefix + 1, H, D, device=DEV, generator=g).bfloat16()
    vb = torch.randn(batch * prefix + 1, H, D, device=DEV, generator=g).bfloat16()
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEV) * prefix
    kv_indices = torch.arange(1, batch * prefix + 1, dtype=torch.int64, device=DEV)
    o_sg = torch.empty(t, HQ, D, device=DEV, dtype=torch.bfloat16)

    def sglang():
        extend_attention_fwd(q, k, v, o_sg, kb, vb, qo, kv_indptr, kv_indices, None, True, None, new, 1.0, 1.0,
                             sm_scale=1 / math.sqrt(D))  # fmt: skip

    try:
        res["sglang"] = time_calls([sglang])
        res["vs_sglang"] = res["sglang"]["us"] / res["oscar"]["us"]
        if res["oscar_default_us"]:
            res["vs_sglang_default"] = res["sglang"]["us"] / res["oscar_default_us"]
    except Exception:  # noqa: BLE001
        res["sglang"] = {"error": traceback.format_exc()[-1500:]}
    return res


def bench_seal(bits: int, n_pages: int = 1024, offset: str = "integer", clip: str = "none", k_group: int = 32,
               v_group: int = 32, key_page: bool = False, seal=None, **seal_kwargs) -> dict:
    """``seal`` (default ``oscar_seal``) over ``n_pages`` random staging pages into distinct pool
    pages, CUDA graphs; ``seal_kwargs`` go to it (``_tuning``)."""
    seal = oscar_seal if seal is None else seal
    stg_k = torch.randn(n_pages, H, P, D, device=DEV).bfloat16()
    stg_v = torch.randn(n_pages, H, P, D, device=DEV).bfloat16()
    stg_s = torch.rand(n_pages, P, 1, device=DEV) + 0.5
    nbytes = D * bits // 8
    pool = dict(
        k_codes=torch.empty(n_pages + 1, H, P, nbytes, dtype=torch.uint8, device=DEV),
        k_params=torch.empty(n_pages + 1, H, 1 if key_page else P // k_group, 2, D, dtype=torch.float16, device=DEV),
        v_codes=torch.empty(n_pages + 1, H, P, nbytes, dtype=torch.uint8, device=DEV),
        v_params=torch.empty(n_pages + 1, H, P, 2, D // v_group, dtype=torch.float16, device=DEV),
        scale=torch.empty(n_pages + 1, P, 1, device=DEV),
    )
    if key_page:
        pool["k_ranges"] = torch.empty(n_pages + 1, H, P // k_group, 2, D, dtype=torch.uint8, device=DEV)
    plan = torch.stack([torch.randperm(n_pages, device=DEV) + 1, torch.arange(n_pages, device=DEV)], dim=1).to(torch.int32).contiguous()

    def run():
        seal(plan=plan, staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s, **pool, bits=bits, k_group=k_group,
             v_group=v_group, offset=offset, clip=clip, **seal_kwargs)

    t = time_calls([run])
    read = stg_k.numel() * 2 * 2 + stg_s.numel() * 4
    k_params = 2 * D * 2 + (P // k_group) * 2 * D if key_page else (P // k_group) * 2 * D * 2
    written = n_pages * (H * (2 * P * nbytes + k_params + P * 2 * (D // v_group) * 2) + P * 4)
    return {"pages": n_pages, "bytes": read + written, "TBps": (read + written) / (t["us"] * 1e-6) / 1e12, "us_per_page": t["us"] / n_pages, **t}


#: `--extend-formats`: the formats whose prefill cost is compared (name, k_group, v_group, page-grid
#: key ranges, seal offset, seal clip): the paper's and the accurate INT2 preset (README).
EXTEND_FORMATS = (("paper G_K32 G_V32", 32, 32, False, "integer", "none"),
                  ("preset page G_K16 G_V64 min clip", 16, 64, True, "min", "values"),
                  ("page G_K16 G_V64", 16, 64, True, "integer", "none"))


def bench_extend_formats(bits: int, batch: int, prefix: int, new: int) -> list[dict]:
    """One prefill step of ``batch`` requests with ``new`` tokens over a sealed ``prefix``, per
    `EXTEND_FORMATS` entry: the default extend launch (``oscar_extend_attention``, the server's
    position mode) and the seal launch of the pages the step fills (``batch * new / P``), CUDA graphs."""
    rows = []
    for name, kg, vg, page, offset, clip in EXTEND_FORMATS:
        st, _, _, q, k, v, qo, pre, out = _extend_inputs(bits, batch, prefix, new, k_group=kg, v_group=vg, key_page=page)
        host = st.indptr[0].tolist()

        def ext():
            oscar_extend_attention(q=q, k=k, v=v, qo_indptr=qo, **st.pool(), kv_indptr=st.indptr[0],
                                   kv_page_indices=st.pages[0], prefix_lens=pre, sm_scale=1 / math.sqrt(D),
                                   max_new_tokens=new, out=out, kv_indptr_host=host)  # fmt: skip

        te = time_calls([ext])
        del st, q, k, v, out
        torch.cuda.empty_cache()
        n_seal = max(1, batch * new // P)
        ts = bench_seal(bits, n_pages=n_seal, offset=offset, clip=clip, k_group=kg, v_group=vg, key_page=page)
        rows.append({"format": name, "k_group": kg, "v_group": vg, "key_page": page, "offset": offset, "clip": clip,
                     "bits": bits, "batch": batch, "prefix": prefix, "new": new, "extend_us": te["us"],
                     "seal_pages": n_seal, "seal_us": ts["us"], "seal_us_per_page": ts["us_per_page"]})
        log(f"    {name:34s} INT{bits} B={batch} prefix={prefix} new={new}: extend {te['us']:9.1f} us, "
            f"seal {n_seal} pages {ts['us']:8.1f} us")
        torch.cuda.empty_cache()
    return rows


def extend_formats_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"One prefill step per format ({_run_label('--extend-formats', meta)}): the default extend launch over a sealed prefix and the seal "
           "launch of the pages the step fills, CUDA graphs; H = 8, Hq = 32, D = 128.", "",
           "| bits | B | prefix | new | format | extend us | x paper | seal us (pages) | x paper |",
           "|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        base = next(x for x in rows if (x["bits"], x["batch"], x["prefix"], x["new"]) == (r["bits"], r["batch"], r["prefix"], r["new"]))
        out.append(f"| {r['bits']} | {r['batch']} | {r['prefix']} | {r['new']} | {r['format']} | {r['extend_us']:.1f} | "
                   f"{r['extend_us'] / base['extend_us']:.2f} | {r['seal_us']:.1f} ({r['seal_pages']}) | "
                   f"{r['seal_us'] / base['seal_us']:.2f} |")
    return "\n".join(out) + "\n"


def parse_seal_tilings(spec: str) -> list[tuple[int, int]]:
    """``--seal-tilings VALUESxWARPS,...`` -> [(values, num_warps)] (``seal._SealTuning``)."""
    out = []
    for item in filter(None, spec.split(",")):
        v, _, w = item.partition("x")
        if not (v.isdigit() and w.isdigit()):
            raise ValueError(f"--seal-tilings wants VALUESxWARPS items such as 2048x4, got {item!r}")
        out.append((int(v), int(w)))
    return out


def load_seal_module(path: str):
    """A seal module from a file (e.g. ``git show REV:triton_kernels/seal.py > FILE``), imported as
    ``oscar_sgl.kernels._seal_prev`` so that its relative imports resolve to today's ``common.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("oscar_sgl.kernels._seal_prev", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def bench_seal_tilings(bits: int, n_pages: int, tilings: list[tuple[int, int]], prev=None) -> list[dict]:
    """The seal launch of ``n_pages`` pages per `EXTEND_FORMATS` entry: the default tiling, each of
    ``tilings`` (``_SealTuning(values, num_warps)``) and ``prev`` (an older seal module, its default),
    side by side in one run."""
    from oscar_sgl.kernels.seal import _SealTuning

    rows = []
    for name, kg, vg, page, offset, clip in EXTEND_FORMATS:
        fmt = dict(offset=offset, clip=clip, k_group=kg, v_group=vg, key_page=page)
        cols = [("default", {})] + [(f"{v}x{w}", {"_tuning": _SealTuning(values=v, num_warps=w)}) for v, w in tilings]
        if prev is not None:
            cols.append(("prev", {"seal": prev.oscar_seal}))
        for col, kw in cols:
            try:
                t = bench_seal(bits, n_pages=n_pages, **fmt, **kw)
                r = {"us": t["us"], "us_per_page": t["us_per_page"], "TBps": t["TBps"]}
            except Exception:  # noqa: BLE001
                r = {"error": traceback.format_exc()[-1200:]}
            rows.append({"format": name, "bits": bits, "pages": n_pages, "tiling": col, **r})
            log(f"    seal {name:34s} INT{bits} {n_pages} pages {col:8s}: " + (f"{r['us']:9.1f} us" if "us" in r else "FAILED"))
            torch.cuda.empty_cache()
    return rows


def seal_tilings_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"Seal launch per format and program tiling ({_run_label('--seal-tilings', meta)}; previous kernel: "
           f"{meta.get('seal_prev') or 'none'}): "
           "random staging pages into distinct pool pages, CUDA graphs; H = 8, P = 128, D = 128.", "",
           "| bits | pages | format | tiling | us | us / page | x default |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        base = next((x for x in rows if (x["bits"], x["pages"], x["format"], x["tiling"]) == (r["bits"], r["pages"], r["format"], "default")), None)
        if "us" not in r:
            out.append(f"| {r['bits']} | {r['pages']} | {r['format']} | {r['tiling']} | failed | | |")
            continue
        ratio = f"{r['us'] / base['us']:.2f}" if base and "us" in base else ""
        out.append(f"| {r['bits']} | {r['pages']} | {r['format']} | {r['tiling']} | {r['us']:.1f} | {r['us_per_page']:.3f} | {ratio} |")
    return "\n".join(out) + "\n"


SEAL_OPTIONS = (("integer", "none"), ("min", "none"), ("integer", "values"), ("min", "values"), ("integer", "keys"),
                ("min", "both"))


def seal_markdown(rows: list[dict], meta: dict) -> str:
    """The seal kernel's time per page for each seal-time option, against the default's."""
    base = {r["bits"]: r["us_per_page"] for r in rows if (r["offset"], r["clip"]) == ("integer", "none")}
    lines = [f"Seal kernel by seal-time option ({meta['gpu']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}); "
             "1024 pages of 8 KV heads x 128 tokens x head_dim 128, CUDA graphs.", "",
             "| bits | offset | clip | us / page | TB/s | x default time |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['bits']} | {r['offset']} | {r['clip']} | {r['us_per_page']:.3f} | {r['TBps']:.2f} | "
                     f"{r['us_per_page'] / base[r['bits']]:.2f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------

#: Issue 14's targets (H200, Llama-3.1-8B attention shapes, ratios measured side by side in one run):
#: INT2 decode vs SDPA BF16 per shape, INT4 decode vs SDPA BF16 at every shape, INT2 decode vs
#: SGLang's Triton BF16 decode at every shape, faster than the authors' CUDA kernel (both groups) at
#: every shape, extend at least as fast as SGLang's BF16 extend at every shape, the write path's
#: share of a step.
TARGETS = {"sdpa": {(8, 32768): 4.0, (16, 65536): 4.0, (1, 131072): 3.0}, "sdpa_int4": 2.5, "sglang": 5.0, "authors": 1.0,
           "extend": 1.0, "write_share": 0.03}


def summarize(res: dict) -> list[dict]:
    rows = []
    for sh in res["shapes"]:
        b, ctx = sh["batch"], sh["ctx"]
        sd = sh.get("sdpa", {}).get("us")
        sg = sh.get("sglang", {}).get("us")
        wr_sep = res["write"].get(str(b), {}).get("us")
        for bits in (2, 4):
            o = sh.get(f"int{bits}", {})
            best = o.get("best")
            if not best:
                continue
            dflt = [v["us"] for v in o.get("variants", []) if v.get("default") and "us" in v]
            row = {"batch": b, "ctx": ctx, "bits": bits, "oscar_us": best["us"], "oscar_TBps": best["TBps"],
                   "default_us": dflt[0] if dflt else None,
                   "config": {k: best.get(k) for k in ("block_n", "num_warps", "num_stages", "num_splits", "maxnreg", "transposed", "gluon")},
                   "stream_only_us": (o.get("stream_only") or {}).get("us"), "stream_only_TBps": (o.get("stream_only") or {}).get("TBps"),
                   "sdpa_us": sd, "sglang_us": sg, "vs_sdpa": sd / best["us"] if sd else None,
                   "vs_sglang": sg / best["us"] if sg else None, "stage2_us": o.get("stage2_us"),
                   "all_sealed_us": o.get("all_sealed_us"), "nowrite_us": o.get("nowrite_us"), "unfused_us": o.get("unfused_us"),
                   "skipwrite_us": o.get("skipwrite_us"),
                   "write_separate_launch_us": wr_sep}  # fmt: skip
            # the write runs inside the decode launch: its cost is the launch's time over the same
            # launch without it (clamped at 0: the difference can sit inside the timing noise)
            row["write_us"] = max(0.0, best["us"] - o["nowrite_us"]) if o.get("nowrite_us") else None
            row["write_share"] = row["write_us"] / best["us"] if row["write_us"] is not None else None
            # the write's own work: the launch over the same launch with the write compiled in but
            # storing nothing (session 33, H100: the whole "write" difference at 32-64 requests is
            # ptxas's other schedule of the sealed-tile loop, not the write's loads and stores)
            row["write_work_us"] = max(0.0, best["us"] - o["skipwrite_us"]) if o.get("skipwrite_us") else None
            if bits == 2:
                # the same step over the format the server stores INT2 in by default (page-grid key ranges)
                sv = sh.get("int2_served") or {}
                row["served_us"] = sv.get("us")
                row["served_TBps"] = sv.get("TBps")
                row["served_effective_bits"] = sv.get("effective_bits")
                row["served_stage1"] = sv.get("stage1")
                row["served_vs_sdpa"] = sd / sv["us"] if sd and sv.get("us") else None
                row["served_error"] = None if "us" in sv or not sv else sv.get("error", "")[-300:]
                t_sd = TARGETS["sdpa"].get((b, ctx))
                row["target_vs_sdpa"] = t_sd
                row["met_vs_sdpa"] = None if (t_sd is None or row["vs_sdpa"] is None) else row["vs_sdpa"] >= t_sd
                row["target_vs_sglang"] = TARGETS["sglang"]
                row["met_vs_sglang"] = None if row["vs_sglang"] is None else row["vs_sglang"] >= TARGETS["sglang"]
            if bits == 4:
                row["target_vs_sdpa"] = TARGETS["sdpa_int4"]
                row["met_vs_sdpa"] = None if row["vs_sdpa"] is None else row["vs_sdpa"] >= TARGETS["sdpa_int4"]
            row["met_write_share"] = None if row["write_share"] is None else row["write_share"] <= TARGETS["write_share"]
            if bits == 2:
                for group in (32, 128):
                    a = sh.get(f"authors_g{group}")
                    if a is not None:
                        row[f"authors_g{group}_us"] = a.get("us")
                        row[f"authors_g{group}_error"] = None if "us" in a else a.get("error", "")[-300:]
                        row[f"vs_authors_g{group}"] = a["us"] / best["us"] if "us" in a else None
            rows.append(row)
    return rows


def plot(rows: list[dict], meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, title in ((axes[0], "vs_sdpa", "vs torch SDPA (contiguous BF16)"), (axes[1], "vs_sglang", "vs SGLang 0.5.23 Triton decode (BF16, page 128)")):
        for bits, mk in ((2, "o"), (4, "s")):
            pts = sorted((r["ctx"], r[key], r["batch"]) for r in rows if r["bits"] == bits and r[key])
            if not pts:
                continue
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=mk, s=60, label=f"OScaR INT{bits}")
            for x, y, b in pts:
                ax.annotate(f"B={b}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens per request)")
        ax.set_ylabel("speedup (time ratio)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"Decode attention, Llama-3.1-8B layer (32q/8kv, D=128) on {meta['gpu']}; commit {meta['commit'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _span(values: list[float], fmt: str = "{:.2f}x") -> str:
    """``lo-hi`` of the measured ratios (one value: itself), or 'not measured'."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "not measured"
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} - {fmt.format(hi)}"


def targets_table(res: dict, rows: list[dict]) -> list[dict]:
    """Issue 14's targets (``TARGETS``) against this run: one dict per target with the measured
    value or span, the target and whether every measured shape meets it (None: nothing measured)."""
    out = []

    def add(measure: str, vals: list[float | None], target: str, ok: list[bool | None]):
        known = [x for x in ok if x is not None]
        out.append({"measure": measure, "measured": _span(vals), "target": target,
                    "met": (all(known) if known else None), "shapes": len(known)})

    int2 = [r for r in rows if r["bits"] == 2]
    int4 = [r for r in rows if r["bits"] == 4]
    for (b, ctx), t in TARGETS["sdpa"].items():
        rs = [r for r in int2 if (r["batch"], r["ctx"]) == (b, ctx)]
        add(f"INT2 decode vs SDPA BF16 at ({b}, {ctx})", [r["vs_sdpa"] for r in rs], f">= {t:g}x",
            [None if r["vs_sdpa"] is None else r["vs_sdpa"] >= t for r in rs])
    for (b, ctx), t in TARGETS["sdpa"].items():
        rs = [r for r in int2 if (r["batch"], r["ctx"]) == (b, ctx) and r.get("served_vs_sdpa") is not None]
        add(f"INT2 decode in the server's default format vs SDPA BF16 at ({b}, {ctx})", [r["served_vs_sdpa"] for r in rs],
            f">= {t:g}x", [r["served_vs_sdpa"] >= t for r in rs])
    add("INT2 decode vs SGLang Triton BF16 (every shape)", [r["vs_sglang"] for r in int2], f">= {TARGETS['sglang']:g}x",
        [None if r["vs_sglang"] is None else r["vs_sglang"] >= TARGETS["sglang"] for r in int2])
    add("INT4 decode vs SDPA BF16 (every shape)", [r["vs_sdpa"] for r in int4], f">= {TARGETS['sdpa_int4']:g}x",
        [None if r["vs_sdpa"] is None else r["vs_sdpa"] >= TARGETS["sdpa_int4"] for r in int4])
    for group in (32, 128):
        ran = [r for r in int2 if f"authors_g{group}_us" in r]
        vals = [r[f"vs_authors_g{group}"] for r in ran if r[f"vs_authors_g{group}"] is not None]
        add(f"INT2 decode vs the authors' CUDA kernel, their group {group} (every shape)", vals,
            "> 1x (faster)", [v > TARGETS["authors"] for v in vals])
        failed = len(ran) - len(vals)
        if failed:  # their error is in the peer table; such a shape decides nothing
            out[-1]["measured"] += f"; their kernel failed at {failed} of {len(ran)} shapes"
    ext = [e for e in res.get("extend", []) if "oscar" in e]
    add("extend (the server's launch) vs SGLang BF16 extend (every shape, INT2 and INT4)",
        [e.get("vs_sglang_default") for e in ext], f">= {TARGETS['extend']:g}x",
        [None if e.get("vs_sglang_default") is None else e["vs_sglang_default"] >= TARGETS["extend"] for e in ext])
    shares = [r["write_share"] for r in rows]
    out.append({"measure": "write path share of a decode step (every shape)",
                "measured": _span([None if s is None else 100 * s for s in shares], "{:.1f} %"),
                "target": f"<= {100 * TARGETS['write_share']:g} %",
                "met": None if all(s is None for s in shares) else all(s <= TARGETS["write_share"] for s in shares if s is not None),
                "shapes": sum(s is not None for s in shares)})
    return out


def floors_table(res: dict, rows: list[dict]) -> list[dict]:
    """Per decode row and speed target (issue 14): the step time the target allows against
    what the same run measured for a kernel that does no math. 'stream-only' is stage 1's grid and
    tiles loading exactly the sealed-page bytes (``stream_only``); the copy floor is the step's bytes
    at the run's HBM copy bandwidth. ``allowed / stream-only`` is what the target leaves for everything
    else a step does (dequantization, MMAs, softmax, the merge, the write, the launch) over the loads
    alone: 1.10 means 10 % more than the bare loads take."""
    copy = res.get("hbm_copy_TBps")
    out = []
    for r in rows:
        targets = []
        if r.get("target_vs_sdpa") and r.get("sdpa_us"):
            targets.append((r["sdpa_us"] / r["target_vs_sdpa"], f"{r['target_vs_sdpa']:g}x SDPA"))
        if r.get("target_vs_sglang") and r.get("sglang_us"):
            targets.append((r["sglang_us"] / r["target_vs_sglang"], f"{r['target_vs_sglang']:g}x SGLang"))
        stream = r.get("stream_only_us")
        step_bytes = r["oscar_TBps"] * 1e12 * r["oscar_us"] * 1e-6 if r.get("oscar_TBps") else None
        for allowed, name in sorted(targets):
            out.append({
                "batch": r["batch"], "ctx": r["ctx"], "bits": r["bits"], "step_us": r["oscar_us"], "target": name,
                "allowed_us": allowed, "met": r["oscar_us"] <= allowed, "stream_only_us": stream,
                "allowed_over_stream": allowed / stream if stream else None,
                "step_over_stream": r["oscar_us"] / stream if stream else None,
                "merge_launch_us": r.get("stage2_us"),
                "copy_floor_us": step_bytes / (copy * 1e12) * 1e6 if step_bytes and copy else None,
            })  # fmt: skip
    return out


def floors_markdown(res: dict, rows: list[dict]) -> list[str]:
    """The section under the target table: each speed target against the bare loads' time."""
    fl = floors_table(res, rows)
    if not fl:
        return []

    def f(x, fmt=".1f"):
        return "-" if x is None else format(x, fmt)

    lines = ["", "## What each speed target leaves for the math", "",
             "The step time each speed target allows (SDPA's / SGLang's time over the target ratio; a row per target), "
             "against two floors of the same run for a step that did no math at all: 'stream-only', stage 1's grid "
             "and tiles loading exactly the sealed-page bytes and nothing else (a Triton kernel: what this access "
             "pattern gets out of HBM), and the step's bytes at the measured copy bandwidth. 'allowed / stream-only' "
             "is what the target leaves above the bare loads for everything else the step does: dequantization, "
             "MMAs, softmax, the merge, the write and the launch. The merge runs inside the default launch; as a launch "
             "of its own ('stage 2') it takes the time in its column.", "",
             "| B | ctx | bits | step us | target | step us it allows | met | stream-only us | "
             "allowed / stream-only | step / stream-only (today) | merge as its own launch us | bytes at copy "
             "bandwidth us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in fl:
        lines.append(f"| {x['batch']} | {x['ctx']} | {x['bits']} | {x['step_us']:.1f} | {x['target']} | "
                     f"{x['allowed_us']:.1f} | {'yes' if x['met'] else 'no'} | {f(x['stream_only_us'])} | "
                     f"{f(x['allowed_over_stream'], '.2f')} | {f(x['step_over_stream'], '.2f')} | "
                     f"{f(x['merge_launch_us'])} | {f(x['copy_floor_us'])} |")
    missed = [x for x in fl if not x["met"] and x["allowed_over_stream"]]
    if missed:
        allow = [x["allowed_over_stream"] for x in missed]
        today = [x["step_over_stream"] for x in missed]
        tight = sum(a < 1.2 for a in allow)
        lines += ["", f"The {len(missed)} missed rows allow {min(allow):.2f}x - {max(allow):.2f}x the stream-only time "
                  f"(today's steps take {min(today):.2f}x - {max(today):.2f}x it). {tight} of them allow less than "
                  "1.2x: there the step's math would have to hide almost wholly under loads that already run at this "
                  "access pattern's bandwidth, or the loads would have to get closer to the copy floor."]
    return lines


def markdown(res: dict, rows: list[dict]) -> str:
    m = res["meta"]
    lines = [
        "# OScaR kernels on one GPU: decode, extend, seal, side by side with SDPA, SGLang and the authors' kernel",
        "",
        "Regenerated by one command on the GPU machine (`bash benches/kernels/regenerate.sh`, which runs "
        f"`{m.get('command', 'benches/kernels/bench_decode.py')}`); the history of earlier runs, experiments and "
        "profiles is in [kernels_history.md](kernels_history.md).",
        "",
        f"GPU {m['gpu']}, torch {m['torch']}, triton {m['triton']}, CUDA {m['cuda']}, python {m['python']}, "
        f"commit `{m['commit']}`{' (+ uncommitted kernel changes)' if m.get('dirty') else ''}, {m['date']}. "
        f"HBM copy bandwidth measured {res['hbm_copy_TBps']:.2f} TB/s (read + write).",
        *(["", f"Rendered again on {m['rendered']['date']} at commit `{m['rendered']['commit']}` from this run's "
               f"kernels.json by `{m['rendered']['command']}` (no GPU): the same measurements in today's report."]
          if m.get("rendered") else []),
        "",
        "Times are medians of CUDA-graph replays (`triton.testing.do_bench`, quantiles 0.5/0.2/0.8), "
        "each replay streaming >= 4x L2 of distinct KV copies. OScaR = the one decode launch the backend runs "
        "(query rotation, the new token's K/V write + s_t, split-KV attention and the merge); 'write' is its time "
        "minus the same launch without the write (compiled without it: ptxas then schedules the sealed-tile loop "
        "differently); 'write work' its time minus the same launch with the write compiled in but storing nothing "
        "(every new token sent to the padding page), the cost of the write's own loads and stores; 'unfused' is the first version's path (queries rotated by a "
        "separate launch, stage 1, separate merge launch 'stage 2').",
        "",
        "OScaR us = " + ("the launcher's default launch, as the backend runs it (stage 1: Triton, or 'gluon:VARIANT' in the "
                         "config column where the Gluon default takes it; ' + split_pdl': the write in a launch of its own before it, "
                         "the stage 1 its programmatic dependent; ' + from N tokens gluon': a single request's Triton stage 1 hands "
                         "requests of N tokens or more to a Gluon launch of their own, its programmatic dependent, decided on "
                         "the device per request; the splits column is then the workspace's, the Gluon launch's)." if m.get("variants") == "default" else
                         "the fastest of the stage-1 sweep (" + str(m.get("variants")) + "), 'default us' the launcher's default.")
        + " Format: the paper's (K/V groups of 32 tokens / channels, fp16 group pairs), INT2 and INT4.",
        "",
        "## Targets (issue 14), this run",
        "",
        "| measure | measured | target | met |",
        "|---|---|---|---|",
        *(f"| {t['measure']} | {t['measured']} | {t['target']} | "
          f"{'-' if t['met'] is None else ('yes' if t['met'] else 'no')} |" for t in targets_table(res, rows)),
        *floors_markdown(res, rows),
        "",
        "## Decode",
        "",
        "| B | ctx | bits | OScaR us | default us | TB/s | unfused us | stage 2 us | stream-only TB/s | SDPA us | x SDPA | SGLang us | x SGLang | write us | write share | write work us | config (bn, warps, stages, splits, maxnreg, transposed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for r in rows:
        c = r["config"]
        lines.append(
            f"| {r['batch']} | {r['ctx']} | {r['bits']} | {r['oscar_us']:.1f} | {r['default_us'] or nan:.1f} | {r['oscar_TBps']:.2f} | "
            f"{r['unfused_us'] or nan:.1f} | {r['stage2_us'] or nan:.1f} | {r['stream_only_TBps'] or nan:.2f} | "
            f"{r['sdpa_us'] or nan:.1f} | {r['vs_sdpa'] or nan:.2f} | {r['sglang_us'] or nan:.1f} | "
            f"{r['vs_sglang'] or nan:.2f} | {nan if r['write_us'] is None else r['write_us']:.2f} | {nan if r['write_share'] is None else r['write_share'] * 100:.1f}% | "
            f"{nan if r.get('write_work_us') is None else r['write_work_us']:.2f} | "
            f"{c['block_n']}, {c['num_warps']}, {c['num_stages']}, {c['num_splits']}, {c['maxnreg'] or '-'}, {int(bool(c['transposed']))}"
            f"{', gluon:' + c['gluon'] if c.get('gluon') else ''}"
            f"{'' if not c.get('long_gluon') else ' + from ' + c['long_gluon'].split(':')[0] + ' tokens gluon (long_gluon' + c['long_gluon'].split(':', 1)[1] + ')'}"
            f"{' (taken at this length)' if c.get('long_gluon') and r['ctx'] >= int(c['long_gluon'].split(':')[0]) else ''} |"
        )
    served = [r for r in rows if r["bits"] == 2 and (r.get("served_us") or r.get("served_error"))]
    if served:
        lines += ["", "## INT2 in the server's default format", "",
                  "The decode table's INT2 rows use the paper's format; the server stores INT2 by default in "
                  f"`config.INT2_FORMAT` ({SERVED_INT2_FORMAT[0].removesuffix(' (INT2 server default)')}: page-grid key "
                  "ranges: a (base, step) grid per channel and page, 8-bit (a, b) indices per channel and key group). The same "
                  "launch (the launcher's default, write fused, CUDA graphs over distinct copies) over that pool:", "",
                  "| B | ctx | server format us | effective bits | stage 1 | x SDPA | paper format us | server / paper time |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in served:
            if not r.get("served_us"):
                lines.append(f"| {r['batch']} | {r['ctx']} | failed | - | - | - | {r['oscar_us']:.1f} | - |")
                continue
            lines.append(f"| {r['batch']} | {r['ctx']} | {r['served_us']:.1f} | {r['served_effective_bits']:.3f} | "
                         f"{r['served_stage1']} | {r['served_vs_sdpa'] or nan:.2f} | {r['oscar_us']:.1f} | "
                         f"{r['served_us'] / r['oscar_us']:.2f} |")
    peer = [r for r in rows if r["bits"] == 2 and ("authors_g32_us" in r or "authors_g128_us" in r)]
    if peer:
        lines += ["", "## The OScaR authors' CUDA kernel", "", "INT2 against the OScaR authors' CUDA kernel (benches/peers/oscar_authors.py: fp16, k-channel, token norm on, "
                  "ctx - 256 tokens packed + 128 in their fp16 residual block; same timing harness). 'failed' gives their error.", "",
                  "| B | ctx | OScaR (ours, group 32) us | authors group 32 us | x authors g32 | authors group 128 us | x authors g128 |",
                  "|---|---|---|---|---|---|---|"]
        for r in peer:
            cells = []
            for group in (32, 128):
                us = r.get(f"authors_g{group}_us")
                cells += [f"{us:.1f}", f"{r[f'vs_authors_g{group}']:.2f}"] if us else ["failed", "-"]
            lines.append(f"| {r['batch']} | {r['ctx']} | {r['oscar_us']:.1f} | " + " | ".join(cells) + " |")
    ext = [e for e in res.get("extend", []) if "oscar" in e]
    if ext:
        lines += ["", "## Extend", "", "Extend / prefill chunk (new tokens over a sealed prefix + themselves, causal; prefix 0: a fresh "
                  "prompt) with --oscar-prefill position (the default) and exact (default tuning) vs SGLang's Triton "
                  "extend kernel on BF16 KV. 'default': the launch the server runs (sealed pages pre-dequantized into "
                  "a scratch, in 'groups' launches of requests that fit its budget, 'dq': whether every request does); "
                  "'registers': the first default (32-token tiles dequantized in registers); 'best': of the sweep "
                  "(block_m, warps, block_n, dq, stages):", "",
                  "| bits | B | prefix | new | default us | dq (groups) | registers us | best us | best config | exact us | SGLang us | x SGLang (default) | x SGLang (best) | exact / default |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def r1(x):
            return "-" if x is None else f"{x:.1f}"

        for e in ext:
            sg = e.get("sglang", {}).get("us")
            dflt = e.get("oscar_default_us")
            ex = e.get("oscar_exact", {}).get("us")
            b = e["oscar"]
            cfg = "default" if b["block_m"] == 0 else f"({b['block_m']}, {b['num_warps']}, {b['block_n']}, {b['dequantize']}, {b.get('num_stages')})"
            lines.append(f"| {e['bits']} | {e['batch']} | {e['prefix']} | {e['new']} | {r1(dflt)} | "
                         f"{e.get('default_dequantizes')} ({e.get('default_groups')}) | "
                         f"{r1(e.get('oscar_registers_us'))} | {b['us']:.1f} | {cfg} | {r1(ex)} | {r1(sg)} | "
                         f"{e.get('vs_sglang_default') and round(e['vs_sglang_default'], 2)} | "
                         f"{e.get('vs_sglang') and round(e['vs_sglang'], 2)} | {ex and dflt and round(ex / dflt, 2)} |")
    lines += ["", "## Seal", "", "Seal: " + ", ".join(f"INT{b}: {s['TBps']:.2f} TB/s ({s['us_per_page']:.2f} us/page of 8 heads)" for b, s in res["seal"].items())]
    return "\n".join(lines) + "\n"


def render_again(json_path: str, out_dir: str, command: str) -> str:
    """kernels.md from a stored run's kernels.json (``--report-from``): the run's measurements in
    today's report, its header naming when, at which commit and by which command it was rendered.
    Where ``ncu/ncu_*.txt`` lie next to the JSON, their section is appended as regenerate.sh does."""
    import glob
    import subprocess

    res = json.load(open(json_path))
    if not isinstance(res, dict) or not res.get("shapes") or "meta" not in res:
        raise ValueError(f"{json_path}: not a kernels.json of bench_decode.py (no meta / shapes)")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("OSCAR_COMMIT", "unknown")
    res["meta"]["rendered"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit, "command": command}
    text = markdown(res, summarize(res))
    reports = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(json_path)), "ncu", "ncu_*.txt")))
    if reports:
        import ncu_report

        profiles = []
        for r in reports:
            try:
                profiles.append(ncu_report.load(r))
            except ncu_report.NcuReportError as exc:
                print(f"bench_decode.py: skipped {exc}", file=sys.stderr)
        if profiles:
            text += "\n" + ncu_report.section(profiles, res)
    path = os.path.join(out_dir, "kernels.md")
    open(path, "w").write(text)
    return path


# Decode stage-1 sweep: (block_n, warps, stages, waves, maxnreg, transposed) around the launcher's
# _default_tuning (block_n 0 = that default, measured as the backend runs it): more and fewer
# programs per SM, 64-token tiles on two warps, and the plain form on the default tiles (the form
# head dims above 128 run).
VARIANTS = [(0, 0, 3, 0, 0, 0), (32, 1, 3, 24, 0, 1), (32, 1, 3, 12, 0, 1), (64, 2, 3, 4, 0, 1), (32, 1, 3, 16, 0, 0)]


def parse_variant(text: str) -> tuple[int, int, int, int, int, int]:
    """``bn:nw:ns:waves[:maxnreg[:transposed]]`` -> the 6-tuple of ``VARIANTS`` (maxnreg 0: no cap)."""
    fields = text.split(":")
    if not 4 <= len(fields) <= 6:
        raise SystemExit(f"variant {text!r}: expected bn:nw:ns:waves[:maxnreg[:transposed]]")
    bn, nw, ns, waves, mr, tr = (int(x) for x in (fields + ["0", "0"])[:6])
    return bn, nw, ns, waves, mr, tr


def _rows_mode(out: str, meta: dict, name: str, to_markdown, jobs: list) -> None:
    """A rows-only mode: each job returns rows (a failure is logged, the others still run), NAME.json
    is rewritten after every job, NAME.md written and logged at the end."""
    rows: list[dict] = []
    for job in jobs:
        try:
            rows += job()
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
        json.dump({"meta": meta, "rows": rows}, open(os.path.join(out, f"{name}.json"), "w"), indent=1)
    md = to_markdown(rows, meta)
    open(os.path.join(out, f"{name}.md"), "w").write(md)
    log(md)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--report-from", default="", metavar="KERNELS_JSON", help="no measurement and no GPU: write kernels.md to --out again from a stored run's kernels.json with today's report (and its 'Where the time goes' section from the ncu/ reports next to it, as regenerate.sh appends it)")
    ap.add_argument("--quick", action="store_true", help="the launchers' defaults only: the default decode launch (no stage-1 sweep) and two extend tilings (default, registers); benches/kernels/regenerate.sh runs this")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--variants", default="", help="bn:nw:ns:waves[:maxnreg[:transposed]],... (overrides the sweep; bn 0: the default)")
    ap.add_argument("--extend-only", action="store_true", help="only the extend / prefill shapes (both --oscar-prefill modes vs SGLang)")
    ap.add_argument("--decode-only", action="store_true", help="only the OScaR decode variants (no baselines, write, seal, extend)")
    ap.add_argument("--authors", default="", metavar="BUILD_DIR", help="add the OScaR authors' CUDA kernel (built by benches/peers/build_oscar_authors.sh into BUILD_DIR) as a column, INT2 at their group 128 and at our group 32")
    ap.add_argument("--seal-only", action="store_true", help="only the seal kernel, for every seal-time quantizer option (offset x clip, docs/OSCAR.md §2.3); writes seal.json / seal.md")
    ap.add_argument("--formats", action="store_true", help="only the default decode launch over each key-range format (FORMATS: fp16 group pairs vs page-grid ranges at G_K 16 and 32) and SDPA, INT2 and INT4 at --shapes; writes formats.json / formats.md")
    ap.add_argument("--extend-formats", default="", metavar="BxPREFIXxNEW,...", help="only one prefill step (extend launch + seal of the filled pages) per key-range format and seal quantizer (EXTEND_FORMATS) at these shapes; writes extend_formats.json / .md")
    ap.add_argument("--merge-chunk", action="store_true", help="only the default decode launch with the fused merge's chunk fixed (default) vs by split count, at --shapes, INT2 and INT4, plus the stage-1 compiles over a server's CUDA-graph batch sizes per rule; writes merge_chunk.json / .md")
    ap.add_argument("--seal-tilings", default="", metavar="VALUESxWARPS,...", help="only the seal launch per key-range format (EXTEND_FORMATS) at --seal-pages, default tiling and these (seal._SealTuning); writes seal_tilings.json / .md")
    ap.add_argument("--seal-pages", default="144,1024", help="with --seal-tilings: pages per launch (comma-separated)")
    ap.add_argument("--seal-prev", default="", metavar="FILE", help="with --seal-tilings: also an older seal module's default launch (git show REV:triton_kernels/seal.py > FILE), column 'prev'")
    ap.add_argument("--gluon", action="store_true", help="only the Gluon stage 1 (issue 14, first step) side by side with the default kernel, INT2 and INT4 at --shapes; writes gluon.json / gluon.md")
    ap.add_argument("--gluon-variants", default="regs1", help="with --gluon: comma-separated keys of gluon_decode.GLUON_VARIANTS (or 'all'), each timed as its own column")
    ap.add_argument("--gluon-step", action="store_true", help="with --gluon: time the whole decode step (the new token's write and the query rotation included: fused into the Triton stage 1, a separate launch before the Gluon one) instead of stage 1 + merge on rotated queries")
    ap.add_argument("--gluon-max-splits", type=int, default=128, help="with --gluon-waves: the most splits per (request, KV head) a <variant>@w<W> column may get (default 128, the default rule's cap)")
    ap.add_argument("--gluon-format", choices=("group", "page"), default="group", help="with --gluon: the pool's format: 'group' (the paper's: fp16 key group pairs, G_K = G_V = 32; default) or 'page' (the INT2 server default: page-grid key ranges, G_K 16, G_V 64; the Gluon columns at 16-token tiles)")
    ap.add_argument("--gluon-block-n", type=int, choices=(16, 32), default=None, help="with --gluon: the Gluon columns' tile (default: 16 at --gluon-format page, one key group per tile; 32 there: two key groups per tile; else the default's 32)")
    ap.add_argument("--gluon-fit", action="store_true", help="with --gluon: also time every variant at the split count whose programs fit one wave (pick_num_splits(fit=True): for open_share variants), columns <variant>@fit")
    ap.add_argument("--gluon-page-rule", default="", metavar="VARIANT:BLOCK_N,...", help="with --gluon --gluon-format page: also the launcher's choice were its page-grid rule to take the Gluon stage 1 at INT2 and INT4 with VARIANT on BLOCK_N-token tiles (16 or 32), one column 'rule VARIANT@BLOCK_N' each")
    ap.add_argument("--gluon-waves", default="", help="with --gluon: also time every variant at these programs-per-SM counts (comma-separated; their split counts), columns <variant>@w<W>")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.report_from:
        try:
            path = render_again(args.report_from, args.out, " ".join(["python3", "benches/kernels/bench_decode.py", *sys.argv[1:]]))
        except (OSError, ValueError) as exc:  # a missing file, not JSON (json's error is a ValueError), not a kernels.json
            raise SystemExit(f"bench_decode.py --report-from: {exc}") from None
        print(f"bench_decode.py: wrote {path}")
        return
    props = torch.cuda.get_device_properties(0)
    meta = {
        "gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "commit": os.environ.get("OSCAR_COMMIT", "unknown"),
        "dirty": os.environ.get("OSCAR_DIRTY", "") == "1", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "shape": {"q_heads": HQ, "kv_heads": H, "head_dim": D, "page": P, "k_group": 32, "v_group": 32},
    }  # fmt: skip
    meta["command"] = " ".join(["python3", "benches/kernels/bench_decode.py", *sys.argv[1:]])
    log("meta", json.dumps(meta))
    if args.seal_only:
        rows = []
        for bits in (2, 4):
            for offset, clip in SEAL_OPTIONS:
                r = {"bits": bits, "offset": offset, "clip": clip, **bench_seal(bits, offset=offset, clip=clip)}
                rows.append(r)
                log(f"seal INT{bits} offset={offset} clip={clip}: {r['us_per_page']:.3f} us/page, {r['TBps']:.2f} TB/s")
        json.dump({"meta": meta, "rows": rows}, open(os.path.join(args.out, "seal.json"), "w"), indent=1)
        md = seal_markdown(rows, meta)
        open(os.path.join(args.out, "seal.md"), "w").write(md)
        log(md)
        return
    if args.merge_chunk:
        shapes = SHAPES if args.shapes == "all" else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        _rows_mode(args.out, meta, "merge_chunk", merge_chunk_markdown,
                   [lambda: count_capture_compiles(2)] +
                   [lambda b=b, ctx=ctx, bits=bits: bench_merge_chunk(bits, b, ctx, 24e9) for b, ctx in shapes for bits in (2, 4)])
        return
    if args.seal_tilings or args.seal_prev:
        tilings = parse_seal_tilings(args.seal_tilings)
        prev = load_seal_module(args.seal_prev) if args.seal_prev else None
        meta["seal_prev"] = args.seal_prev
        _rows_mode(args.out, meta, "seal_tilings", seal_tilings_markdown,
                   [lambda n=n, bits=bits: bench_seal_tilings(bits, n, tilings, prev) for n in (int(x) for x in args.seal_pages.split(","))
                    for bits in (2, 4)])
        return
    if args.extend_formats:
        shapes = [tuple(int(x) for x in spec.split("x")) for spec in args.extend_formats.split(",")]
        _rows_mode(args.out, meta, "extend_formats", extend_formats_markdown,
                   [lambda b=b, pre=pre, new=new, bits=bits: bench_extend_formats(bits, b, pre, new)
                    for b, pre, new in shapes for bits in (2, 4)])
        return
    if args.formats:
        shapes = SHAPES if args.shapes == "all" else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        sdpa: dict[tuple[int, int], float] = {}

        def formats_job(b: int, ctx: int, bits: int) -> list[dict]:
            if (b, ctx) not in sdpa:
                sdpa[b, ctx] = bench_sdpa(b, ctx, 24e9)["us"]
                log(f"SDPA B={b} ctx={ctx}: {sdpa[b, ctx]:.2f} us")
            return [dict(r, sdpa_us=sdpa[b, ctx]) for r in bench_formats(bits, b, ctx, 24e9)]

        _rows_mode(args.out, meta, "formats", formats_markdown,
                   [lambda b=b, ctx=ctx, bits=bits: formats_job(b, ctx, bits) for b, ctx in shapes for bits in (2, 4)])
        return
    if args.gluon:
        from oscar_sgl.kernels import gluon_decode

        gvars = tuple(gluon_decode.GLUON_VARIANTS) if args.gluon_variants == "all" else tuple(args.gluon_variants.split(","))
        for v in gvars:
            gluon_decode.gluon_variant(v)  # unknown names: ValueError before any device work
        meta["gluon_variants"] = list(gvars)
        gwaves = tuple(float(w) for w in args.gluon_waves.split(",") if w)
        if any(w <= 0 for w in gwaves):
            raise ValueError(f"--gluon-waves must be positive programs per SM, got {args.gluon_waves}")
        meta["gluon_waves"] = list(gwaves)
        if args.gluon_max_splits < 1:
            raise ValueError(f"--gluon-max-splits must be >= 1, got {args.gluon_max_splits}")
        meta["gluon_max_splits"] = args.gluon_max_splits
        meta["gluon_mode"] = "fused" if args.gluon_step else "qrot"
        meta["gluon_format"] = args.gluon_format
        if args.gluon_format == "page":
            for v in gvars:
                gluon_decode.check_gluon_key_page(v)
        meta["gluon_block_n"] = args.gluon_block_n or (16 if args.gluon_format == "page" else 32)
        for v in gvars:
            gluon_decode.check_gluon_key_groups(v, block_n=meta["gluon_block_n"],
                                                k_group=16 if args.gluon_format == "page" else 32)
        rules = []
        for item in filter(None, args.gluon_page_rule.split(",")):
            v, _, bn = item.partition(":")
            if args.gluon_format != "page" or bn not in ("16", "32"):
                raise ValueError(f"--gluon-page-rule takes VARIANT:16 or VARIANT:32 with --gluon-format page, got {item!r}")
            gluon_decode.gluon_variant(v)
            gluon_decode.check_gluon_key_page(v)
            gluon_decode.check_gluon_key_groups(v, block_n=int(bn), k_group=16)
            rules.append((v, int(bn)))
        meta["gluon_page_rules"] = [f"{v}@{bn}" for v, bn in rules]
        shapes = SHAPES if args.shapes == "all" else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        rows = []
        for b, ctx in shapes:
            for bits in (2, 4):
                log(f"Gluon vs default INT{bits} B={b} ctx={ctx}")
                try:
                    rows.append(bench_gluon(bits, b, ctx, 24e9, gvars, gwaves, meta["gluon_mode"],
                                            args.gluon_max_splits, args.gluon_format, args.gluon_block_n,
                                            args.gluon_fit, tuple(rules)))
                except Exception:  # noqa: BLE001
                    log(traceback.format_exc())
                    rows.append({"batch": b, "ctx": ctx, "bits": bits, "error": traceback.format_exc()[-2000:]})
                json.dump({"meta": meta, "rows": rows}, open(os.path.join(args.out, "gluon.json"), "w"), indent=1)
        md = gluon_markdown(rows, meta)
        open(os.path.join(args.out, "gluon.md"), "w").write(md)
        log(md)
        return
    res = {"meta": meta, "shapes": [], "write": {}, "seal": {}}
    res["hbm_copy_TBps"] = hbm_copy_bandwidth()
    log(f"HBM copy: {res['hbm_copy_TBps']:.2f} TB/s")
    if args.variants:
        variants = [parse_variant(v) for v in args.variants.split(",")]
    elif args.quick:
        variants = [VARIANTS[0]]
        meta["variants"] = "default"
    else:
        variants = VARIANTS
    shapes = SHAPES if args.shapes == "all" else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    budget = 24e9  # bytes of KV copies per measured callable
    if args.extend_only:
        shapes = []
    for b, ctx in shapes:
        sh = {"batch": b, "ctx": ctx}
        for bits in (2, 4):
            log(f"OScaR INT{bits} B={b} ctx={ctx}")
            try:
                sh[f"int{bits}"] = bench_oscar(bits, b, ctx, variants, budget, extras=not args.decode_only)
            except Exception:  # noqa: BLE001
                log(traceback.format_exc())
                sh[f"int{bits}"] = {"error": traceback.format_exc()[-2000:]}
        if args.decode_only:
            res["shapes"].append(sh)
            json.dump(res, open(os.path.join(args.out, "kernels.json"), "w"), indent=1)
            continue
        log(f"OScaR INT2, the server's default format, B={b} ctx={ctx}")
        try:
            sh["int2_served"] = bench_formats(2, b, ctx, budget, formats=(SERVED_INT2_FORMAT,))[0]
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
            sh["int2_served"] = {"error": traceback.format_exc()[-2000:]}
        log(f"SGLang B={b} ctx={ctx}")
        try:
            sh["sglang"] = bench_sglang(b, ctx, budget)
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
            sh["sglang"] = {"error": traceback.format_exc()[-2000:]}
        log(f"SDPA B={b} ctx={ctx}")
        try:
            sh["sdpa"] = bench_sdpa(b, ctx, budget)
            log(f"    sdpa: {sh['sdpa']['us']:.2f} us {sh['sdpa']['TBps']:.2f} TB/s")
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
            sh["sdpa"] = {"error": traceback.format_exc()[-2000:]}
        if args.authors:
            for group in (32, 128):
                log(f"authors' CUDA kernel INT2 group {group} B={b} ctx={ctx}")
                a = bench_authors(args.authors, b, ctx, group)
                sh[f"authors_g{group}"] = a
                log(f"    authors g{group}: " + (f"{a['us']:8.2f} us  {a['TBps']:.2f} TB/s  rel_rms vs exact {a['rel_rms_vs_exact']:.3f}"
                                               if "us" in a else "FAILED " + a["error"][-600:]))
        res["shapes"].append(sh)
        json.dump(res, open(os.path.join(args.out, "kernels.json"), "w"), indent=1)
    if args.decode_only:
        return
    for b in sorted({b for b, _ in shapes}):
        res["write"][str(b)] = bench_write(b)
        log(f"write path B={b}: {res['write'][str(b)]['us']:.2f} us")
    for bits in () if args.extend_only else (2, 4):
        res["seal"][str(bits)] = bench_seal(bits)
        log(f"seal INT{bits}: {res['seal'][str(bits)]['TBps']:.2f} TB/s, {res['seal'][str(bits)]['us_per_page']:.3f} us/page")
    res["extend"] = []
    for bits in (2, 4):
        for b, pre, new in EXTEND_SHAPES:
            try:
                # --quick: the launcher's default and the 'registers' tiling only (not the sweep)
                e = bench_extend(bits, b, pre, new, [EXTEND_VARIANTS[0], EXTEND_VARIANTS[-1]] if args.quick else EXTEND_VARIANTS)
                log(f"extend INT{bits} B={b} prefix={pre} new={new}: OScaR {e['oscar']['us']:.1f} us, "
                    f"SGLang BF16 {e.get('sglang', {}).get('us', float('nan')):.1f} us")
            except Exception:  # noqa: BLE001
                e = {"batch": b, "prefix": pre, "new": new, "bits": bits, "error": traceback.format_exc()[-1500:]}
                log(e["error"])
            res["extend"].append(e)
    rows = summarize(res)
    res["summary"] = rows
    json.dump(res, open(os.path.join(args.out, "kernels.json"), "w"), indent=1)
    open(os.path.join(args.out, "kernels.md"), "w").write(markdown(res, rows))
    try:
        plot(rows, meta, os.path.join(args.out, "kernels.png"))
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
    log(markdown(res, rows))


if __name__ == "__main__":
    sys.exit(main())
