"""The Gluon decode stage 1 (``_DecodeTuning.gluon``, issue 14 item 1): against the torch reference
and the default Triton kernel on the same pools (GPU), its refusals and the rotating merge launch
it relies on (CPU and GPU).

The ``gpu`` tests ran on an H100 and an H200 (benches/results/kernels_gluon_gpu_a464603/,
kernels_gluon_variants_dc03213/). The Gluon stage 1 is opt-in (a whole step with its separate write
and merge launches loses to the fused Triton step at short contexts): the tests at the end check the
write it runs as a separate launch and that the default stays the Triton stage 1."""

from __future__ import annotations

import dataclasses
import functools
import math
import types

import numpy as np
import pytest
import torch
from support.kernel_data import (ATTN_BOUND_BF16_OUT, ATTN_BOUND_FP32_OUT, DEVICE, HAS_CUDA, build_pool, check_graph_replays, gpu,
                                 lens_before_write, needs_cuda, needs_interpreter, reference_decode, rel_rms, variant_bound)

from oscar_sgl import reference as R
from oscar_sgl.config import INT2_FORMAT, PAPER_FORMAT
from oscar_sgl.config import OscarConfig as _OscarConfig
from oscar_sgl.kernels import decode as kdecode
from oscar_sgl.kernels import gluon_decode, oscar_decode_attention


def OscarConfig(**kw):  # noqa: N802
    """The Gluon stage 1 reads the paper's format (fp16 key pairs): every config here is in it."""
    return _OscarConfig(**{**PAPER_FORMAT, **kw})

_GLUON_REASON = gluon_decode.gluon_available(torch.device("cuda")) if HAS_CUDA else "needs a CUDA GPU"
needs_gluon = pytest.mark.skipif(_GLUON_REASON is not None, reason=f"the Gluon stage 1 cannot run here: {_GLUON_REASON}")


def _decode(pool, q, *, gluon: bool, out=None, tune=None, **kw):
    """One decode launch; ``tune``: fields of the default ``_DecodeTuning`` to override."""
    b, hq, d = q.shape
    h, p = pool.layer.staging_k.shape[1], pool.layer.staging_k.shape[2]
    tuning = dataclasses.replace(kdecode._default_tuning(b, h, d, p), gluon=gluon, **(tune or {}))
    return oscar_decode_attention(
        q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
        seq_lens=pool.seq_lens, sm_scale=1.0 / math.sqrt(d), out=out, _tuning=tuning, **kw,
    )  # fmt: skip


# (KV heads, GQA group, page size, lengths, requests whose full last page is sealed, norm scope)
_SHAPES = {
    "llama8b_32q8kv": (8, 4, 128, [4096 + 77, 128, 1, 8192, 129, 3 * 128], {1, 5}, "layer"),
    "gqa16_4": (4, 4, 64, [1000, 64, 63, 65, 2 * 64 + 3], {1}, "layer"),
    "group8_head_scope": (2, 8, 128, [700, 256, 5], {1}, "head"),
}


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("shape", list(_SHAPES))
@pytest.mark.parametrize("block_n", [32, 16])
def test_gluon_decode_matches_reference_and_triton(bits, shape, block_n, nan_empty):
    """Head_dim 128 on CUDA: the Gluon stage 1 (+ the rotating merge launch) against the fp32 torch
    reference (the bound of the Triton kernel's tests) and against the default Triton kernel on the
    same pool (both dequantize to fp16 with one rounding and round probabilities to fp16; only the
    summation order differs)."""
    h, g, p, lens, last_sealed, scope = _SHAPES[shape]
    d = 128
    cfg = OscarConfig(bits=bits, page_size=p, norm_scope=scope)
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed=last_sealed, kinds={len(lens) - 1: "mixed"},
                      device=torch.device("cuda"), seed=bits * 10 + len(shape))
    q = torch.randn(len(lens), h * g, d).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(d))
    out = _decode(pool, q, gluon=True, out=torch.full(q.shape, float("nan"), device="cuda"), tune=dict(block_n=block_n))
    err = rel_rms(out, ref)
    assert err < ATTN_BOUND_FP32_OUT, f"Gluon vs reference: relative RMS {err:.2e}"
    tri = _decode(pool, q, gluon=False, out=torch.empty(q.shape, device="cuda"))
    assert rel_rms(out, tri) < 1e-3, f"Gluon vs Triton: relative RMS {rel_rms(out, tri):.2e}"
    out16 = _decode(pool, q, gluon=True, tune=dict(block_n=block_n))  # allocated here: the dtype of q
    assert out16.dtype == torch.bfloat16 and rel_rms(out16, ref) < ATTN_BOUND_BF16_OUT


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
def test_gluon_decode_split_counts_and_constant_groups(bits, nan_empty):
    """Several split counts (empty splits included) agree, and constant / all-zero groups stay
    finite and match the reference."""
    cfg = OscarConfig(bits=bits, page_size=128)
    pool = build_pool(cfg, h=2, d=128, p=128, lens=[5 * 128 + 7, 3, 256, 300], last_sealed={2},
                      kinds={0: "zero", 1: "constant", 3: "mixed"}, device=torch.device("cuda"), seed=bits)  # fmt: skip
    q = torch.randn(4, 8, 128).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(128))
    outs = [_decode(pool, q, gluon=True, out=torch.empty(q.shape, device="cuda"), tune=dict(num_splits=n)) for n in (1, 3, 16)]
    for o in outs:
        assert rel_rms(o, ref) < ATTN_BOUND_FP32_OUT
    for o in outs[1:]:
        assert rel_rms(o, outs[0]) < 1e-3


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("variant", [v for v in gluon_decode.GLUON_VARIANTS if v != gluon_decode.DEFAULT_GLUON_VARIANT])
def test_gluon_variants_match_reference(variant, bits, nan_empty):
    """Every stage-1 variant of the sweep (cp.async rings of 2-4 tiles, register caps, key params
    folded into the query) against the
    torch reference and the default variant: two layer shapes (32-token tiles at group 4, 16-token
    tiles at group 8 / head scope) and split counts 1 and 16, so splits with fewer tiles than the
    ring's depth (and empty ones) are covered."""
    for shape, block_n in (("llama8b_32q8kv", 32), ("group8_head_scope", 16)):
        h, g, p, lens, last_sealed, scope = _SHAPES[shape]
        cfg = OscarConfig(bits=bits, page_size=p, norm_scope=scope)
        pool = build_pool(cfg, h=h, d=128, p=p, lens=lens, last_sealed=last_sealed, kinds={len(lens) - 1: "mixed"},
                          device=torch.device("cuda"), seed=bits * 7 + block_n)
        q = torch.randn(len(lens), h * g, 128).bfloat16().cuda()
        ref = reference_decode(pool, q, 1.0 / math.sqrt(128))
        base = _decode(pool, q, gluon=True, out=torch.empty(q.shape, device="cuda"), tune=dict(block_n=block_n))
        for n in (None, 1, 16):
            tune = dict(block_n=block_n, gluon_variant=variant, **({} if n is None else {"num_splits": n}))
            out = _decode(pool, q, gluon=True, out=torch.full(q.shape, float("nan"), device="cuda"), tune=tune)
            err = rel_rms(out, ref)
            # the lean INT2 dequantization's rounding adds to the kernel's own (H100, session 25: 5.25e-3
            # at llama8b_32q8kv for every lean variant), so it gets LEAN_BOUND here too
            bound = _bound(variant, bits, ATTN_BOUND_FP32_OUT)
            assert err < bound, f"{variant} {shape} splits={n} vs reference: relative RMS {err:.2e}"
            if n is None:  # same splits as regs1: the streaming alone changes nothing; folding the key
                # params into the query rounds q * scale to fp16 instead of each key, and other open-page
                # tiles round the open page's probabilities to bf16 against other running maxima (the
                # Triton bound)
                var = gluon_decode.GLUON_VARIANTS[variant]
                same = (var.keys == "dequant" and var.staging_block is None and not var.direct_staging
                        and not var.spread_open)
                bound = _bound(variant, bits, 1e-5 if same else 1e-3)
                assert rel_rms(out, base) < bound, f"{variant} vs regs1: relative RMS {rel_rms(out, base):.2e}"


_bound = variant_bound  # bound, or LEAN_BOUND for a lean variant at INT2 (support/kernel_data.py)


def _source_paths() -> dict[str, str]:
    """One variant per distinct kernel source path (a register cap alone compiles the same source):
    {path: variant name}."""
    seen: dict[tuple, str] = {}
    for name, v in gluon_decode.GLUON_VARIANTS.items():
        seen.setdefault((tuple(sorted(v.constexprs().items())), v.staging_block, v.fused), name)
    return {name: name for name in seen.values()}


@functools.cache
def _numpy_check_module():
    """The numpy stand-in, loaded once per process (its memo of the Triton kernels' outputs lives there)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benches" / "kernels" / "gluon_numpy_check.py"
    spec = importlib.util.spec_from_file_location("gluon_numpy_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant", list(_source_paths()))
def test_gluon_source_runs_right_on_the_cpu(variant):
    """The Gluon stage 1's own source, executed on the CPU with numpy standing in for ``gl``
    (benches/kernels/gluon_numpy_check.py: loads, reshapes, joins, the inline PTX's fp16
    arithmetic, ``mma_v2`` a matmul, cp.async groups that land only at their wait), merged by the
    rotating merge launch: against the torch reference and the Triton kernel on the same pool and
    splits. Every distinct source path of ``GLUON_VARIANTS`` (register prefetch or not, cp.async
    rings, folded keys, params paired at load, 16-token and direct open-page tiles, the fused step),
    also with sliding windows: the addresses, fragment channel maps, masks of a partly filled open
    page and of a window, and the partials' contract are
    checked here, in CI; layouts and the compiled code only on a GPU (the ``gpu`` tests above)."""
    chk = _numpy_check_module()
    var = gluon_decode.GLUON_VARIANTS[variant]
    # spread open pages: other programs' running maxima round the open tiles' bf16 probabilities;
    # a lazy running maximum (up to LAZY_TAU behind the tile's) rounds the exponentials' arguments
    # and the fp16 probabilities at other points
    bound_tri = (1e-3 if var.keys != "dequant" else 3e-4 if var.lazy_rescale else 1e-4 if var.spread_open
                 else 1e-5)
    for bits, (h, g, p, lens, sealed, scope, block_n, splits) in ((2, (2, 4, 128, [300, 128, 5], {1}, "layer", 32, 3)),
                                                                  (4, (1, 8, 64, [200, 64], {1}, "head", 16, 2))):
        err, agree = chk.check(bits, h, g, p, lens, sealed, scope, block_n, splits, bits, variant)
        assert err < ATTN_BOUND_FP32_OUT, f"{variant} INT{bits} vs reference: relative RMS {err:.2e}"
        assert agree < _bound(variant, bits, bound_tri), f"{variant} INT{bits} vs the Triton kernel: relative RMS {agree:.2e}"
    # a sliding window (past a sealed page and a tile boundary, into the open page; a one-token request):
    # where the open page dominates, 16-token open-page tiles round its probabilities against other maxima
    same_open = var.staging_block is None and not var.direct_staging and not var.spread_open
    for window in (5, 71):
        err, agree = chk.check(2, 1, 4, 64, [1, 63, 3 * 64, 2 * 64 + 3, 4 * 64 + 5], {2}, "layer", 16, 3, 32, variant,
                               window_left=window)
        assert err < ATTN_BOUND_FP32_OUT, f"{variant} window {window} vs reference: relative RMS {err:.2e}"
        assert agree < _bound(variant, 2, bound_tri if same_open else 1e-3), f"{variant} window {window} vs Triton: {agree:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
def test_gluon_min_tiles_leaves_the_last_programs_of_a_large_grid_empty_on_the_cpu():
    """``GluonVariant.min_tiles`` (8 here): 16 splits over requests of 300, 1500 and 40 tokens give
    the long request 6 programs of 8 sealed tiles (of 44), the 300-token one one program, and the
    splits between them and the open page's spread tiles no tile at all; the empty partials
    (log-sum-exp -inf) fall out of the merge: the same attention as the reference and the Triton
    kernel, also in a sliding window and at INT4."""
    chk = _numpy_check_module()
    variant = "dnp_r128fslwnkm8"
    assert gluon_decode.gluon_variant(variant).min_tiles == 8
    for bits in (2, 4):
        lse = []
        err, agree = chk.check(bits, 2, 4, 128, [300, 1500, 40], {1}, "layer", 32, 16, bits, variant, partials=lse)
        empty = torch.isinf(lse[0][:, :, :16]).all(dim=1)  # [request, sealed split]: no tile in any head
        # 1500 tokens: 44 sealed tiles, 8 per program (splits 0-5), and the open page's 92 tokens in 16-token
        # tiles, all but the last spread over splits 15, 14, .., 11 (spread_open); 300 tokens: 8 sealed tiles
        # (split 0), the open page's 44 tokens: two tiles on splits 15 and 14
        assert empty[1].tolist() == [False] * 6 + [True] * 5 + [False] * 5, empty[1]
        assert empty[0].tolist() == [False] + [True] * 13 + [False] * 2, empty[0]
        assert err < ATTN_BOUND_FP32_OUT, f"INT{bits} vs reference: relative RMS {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"INT{bits} vs the Triton kernel: relative RMS {agree:.2e}"
    err, agree = chk.check(2, 1, 4, 64, [1, 63, 9 * 64 + 5], {2}, "layer", 16, 8, 32, variant, window_left=300)
    assert err < ATTN_BOUND_FP32_OUT and agree < _bound(variant, 2, 1e-3), (err, agree)
    with pytest.raises(ValueError, match="min_tiles must be in"):
        gluon_decode.GluonVariant("bad", min_tiles=-1)


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant,fmt,block_n", [  # each ring form on several formats, each format on one form
    ("dnp_r128fslwt3", {"v_group": 16}, 32), ("dnp_r128fslwnkt3", {"v_group": 64}, 16),
    ("dnp_r128fslwt2x2", {"v_group": 128}, 32), ("dnp_r128fslwnkt3", {"k_group": 64}, 32),
    ("dnp_r128fslwt2x2", {"k_group": 16}, 16), ("dnp_r128fslwt3", {"v_group": 64}, 16)])
def test_gluon_tma_ring_reads_every_group_size_right_on_the_cpu(variant, fmt, block_n):
    """The TMA ring's views over other value and key group sizes than the paper format's (the value
    params' slot view and its broadcast from D/G_V groups to the 8 lane rows, a key group spanning
    two tiles or exactly one 16-token tile), with the folded keys: the numpy stand-in against the
    reference and the Triton kernel, INT2 and INT4. (The lean INT2 rounding grows with the value
    group: 7.5e-3 from the reference at G_V = 64, 5.8e-3 at 128, 3.9e-3 at 16; hence its bound.)"""
    chk = _numpy_check_module()
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 64, [3 * 64 + 5, 64, 64 + 30], {1, 2}, "layer", block_n, 3, bits + 40,
                               variant, fmt=fmt)
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"{variant} {fmt} INT{bits} vs reference: {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"{variant} {fmt} INT{bits} vs Triton: relative RMS {agree:.2e}"


#: The INT2 server default's format (config.INT2_FORMAT): page-grid key ranges, G_K 16, G_V 64.
_PAGE_FORMAT = {"k_group": 16, "v_group": 64, "offset": "min", "clip": "values", "key_ranges": "page"}
#: The variants that read page-grid key ranges (``check_gluon_key_page``), one per key form.
_PAGE_VARIANTS = ["dnp_r128fslw", "dnp_r128fslwk", "dnp_r128fslwnk", "dnp_r128fslwm", "dnp_r128fslwnp", "dnp_r128fslwnpe",
                  "dnp_r128fslwnpx", "dnp_r128fslwnpv", "dnp_r128fslwnpxv", "dnp_r128fslwnpb"]


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant", _PAGE_VARIANTS)
def test_gluon_reads_page_grid_key_ranges_right_on_the_cpu(variant):
    """Page-grid key ranges (the INT2 server default's format, 16-token tiles: one key group each):
    the key params made in the kernel from the page grid and the group's index bytes
    (``_page_key_param_pairs``), dequantized as they are or folded into the query, the numpy
    stand-in against the reference and the Triton kernel's page-grid path, INT2 and INT4, three
    splits over sealed pages, a mixed page and the open ones."""
    chk = _numpy_check_module()
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 128, [300, 128, 5], {1}, "layer", 16, 3, bits + 50, variant,
                               fmt=_PAGE_FORMAT)
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"{variant} INT{bits} vs reference: {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"{variant} INT{bits} vs Triton: relative RMS {agree:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
def test_gluon_64_token_tiles_run_right_on_the_cpu():
    """``GluonVariant.block_n`` 64 (``dnp_r128fslwn64``): 64-token sealed tiles over two key groups of
    32 (each half of the tile's rows dequantized with its own group's params), the numpy stand-in
    against the reference and the Triton kernel on the same tiles, INT2 and INT4, sealed, mixed and
    open pages over three splits (a request shorter than one tile, one of exactly one page, one
    whose last sealed tile ends mid-range), and in a sliding window that starts inside a tile. The
    source path is ``dnp_r128fslwn``'s (test_gluon_source_runs_right_on_the_cpu at 32 tokens)."""
    chk = _numpy_check_module()
    name = "dnp_r128fslwn64"
    assert gluon_decode.GLUON_VARIANTS[name].block_n == 64
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 128, [300, 128, 5, 700], {1, 3}, "layer", 64, 3, bits + 60, name)
        assert err < _bound(name, bits, ATTN_BOUND_FP32_OUT), f"{name} INT{bits} vs reference: {err:.2e}"
        assert agree < _bound(name, bits, 3e-4), f"{name} INT{bits} vs Triton: relative RMS {agree:.2e}"
    err, agree = chk.check(2, 1, 4, 128, [1, 63, 3 * 128, 2 * 128 + 3, 4 * 128 + 5], {2}, "layer", 64, 3, 33, name,
                           window_left=100)
    assert err < _bound(name, 2, ATTN_BOUND_FP32_OUT), f"{name} window vs reference: {err:.2e}"
    assert agree < _bound(name, 2, 1e-3), f"{name} window vs Triton: relative RMS {agree:.2e}"


def test_gluon_64_token_tiles_are_checked():
    """A 64-token Gluon variant needs what two key groups per tile need (dequantized keys paired from
    words, no TMA ring); the launcher runs it on its own tile whatever the tuning's ``block_n``."""
    with pytest.raises(ValueError, match="two key groups of 32"):
        gluon_decode.GluonVariant("x", prefetch=False, packed=True, pair_words=True, keys="mma", block_n=64)
    with pytest.raises(ValueError, match="block_n must be 16, 32, 64"):
        gluon_decode.GluonVariant("x", block_n=128)
    with pytest.raises(ValueError, match="block_n in \\(16, 32, 64\\)"):
        gluon_decode.check_gluon_shape(bits=2, head_dim=128, k_group=16, v_group=32, block_n=64, group=4)
    assert {n for n, v in gluon_decode.GLUON_VARIANTS.items() if v.block_n == 64} == {
        "dnp_r128fslwn64", "dnp_r144fslwn64", "dnp_r168fslwn64"}


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant,fmt", [("dnp_r128fslw", "page"), ("dnp_r128fslwn", "page"),
                                         ("dnp_r128fslwnp", "page"), ("dnp_r128fslwnpv", "page"),
                                         ("dnp_r128fslwnpb", "page"), ("dnp_r128fslw", "group16")])
def test_gluon_two_key_groups_per_tile_run_right_on_the_cpu(variant, fmt):
    """32-token tiles over key groups of 16 tokens (``_attend(KG2)``: each half of the tile's rows
    dequantized with its own group's params), page-grid ranges (the INT2 server default's format)
    and fp16 group pairs at G_K 16: the numpy stand-in against the reference and the Triton kernel,
    INT2 and INT4, three splits over sealed pages, a mixed page and the open ones."""
    chk = _numpy_check_module()
    form = _PAGE_FORMAT if fmt == "page" else {"k_group": 16}
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 128, [300, 128, 5], {1}, "layer", 32, 3, bits + 60, variant, fmt=form)
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"{variant} INT{bits} vs reference: {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"{variant} INT{bits} vs Triton: relative RMS {agree:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@pytest.mark.parametrize("bits", [2, 4])
def test_page_pairs_made_where_the_words_are_made_are_the_same_pairs(bits):
    """``GluonVariant.page_pairs`` (``_page_key_param_pairs_spread``: the lane that makes a page-grid
    param word pairs it, ``u`` made once for both key groups of a tile, from the split asm
    ``_page_u_asm`` + ``_PAGE_GROUP_ASM``) gives the (scale, offset) pairs of
    ``_page_key_param_pairs`` (the words handed over, then paired by every lane row) bit for bit:
    every 32-token tile (two key groups of 16) and 16-token tile (one) of three sealed pages, two
    KV heads, the Gluon source run by the numpy stand-in (its asm emulated with the same fp16
    roundings; the asm's own arithmetic is checked against the reference in
    tests/test_kernels_page_grid.py and on a GPU by this file's gpu tests)."""
    chk = _numpy_check_module()
    fns = chk.kernel_functions({"pid": (0, 0, 0), "grid": (1, 1, 1)})
    h, d, p = 2, 128, 128
    cfg = OscarConfig(bits=bits, page_size=p, **_PAGE_FORMAT)
    pool = build_pool(cfg, h=h, d=d, p=p, lens=[3 * p + 5], seed=bits + 3, device=torch.device("cpu"))
    args = kdecode.named_pool_arguments(pool.layer)
    kp = chk.Ptr(args["kp_ptr"].detach().cpu().reshape(-1).view(torch.float16).numpy())
    kr = chk.Ptr(args["kr_ptr"].detach().cpu().reshape(-1).numpy())
    g_k = _PAGE_FORMAT["k_group"]
    pages = [int(x) for x in pool.kv_page_indices[:3]]
    assert len(set(pages)) == 3, pages
    for page in pages:
        for i_h in range(h):
            for t0 in range(0, p, 2 * g_k):
                want = (fns["_page_key_param_pairs"](page, t0, i_h, kp, kr, h, d, bits, p, g_k, None)
                        + fns["_page_key_param_pairs"](page, t0 + g_k, i_h, kp, kr, h, d, bits, p, g_k, None))
                two = fns["_page_key_param_pairs_spread"](page, t0, i_h, kp, kr, h, d, bits, p, g_k, None, 2)
                one = fns["_page_key_param_pairs_spread"](page, t0 + g_k, i_h, kp, kr, h, d, bits, p, g_k, None, 1)
                got = (two[0], two[1], two[2], two[3])
                for w, gt in zip(want, got):
                    assert np.array_equal(chk._a(w), chk._a(gt)), (page, i_h, t0)
                assert np.array_equal(chk._a(one[0]), chk._a(want[2])) and np.array_equal(chk._a(one[3]), chk._a(want[3]))
                assert np.count_nonzero(chk._a(want[0])) > 0  # real scales, not an all-zero page


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
def test_gluon_page_default_tiles_take_a_sliding_window_on_the_cpu():
    """The page-grid default (``GLUON_DEFAULT_PAGE_VARIANT`` on 32-token tiles over two key groups)
    on a sliding-window layer: a window that starts inside a sealed page, past tile boundaries, INT2
    and INT4, the numpy stand-in against the reference and the Triton kernel."""
    chk = _numpy_check_module()
    variant, bn = kdecode.GLUON_DEFAULT_PAGE_VARIANT, kdecode.GLUON_DEFAULT_PAGE_BLOCK_N
    for bits in (2, 4):
        err, agree = chk.check(bits, 1, 4, 128, [1, 127, 384, 259, 517], {2}, "layer", bn, 3, bits + 30, variant,
                               window_left=135, fmt=_PAGE_FORMAT)
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"INT{bits} window vs reference: {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"INT{bits} window vs Triton: relative RMS {agree:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("k_group", [32, 64])
def test_gluon_reads_wider_page_grid_key_groups_right_on_the_cpu(k_group):
    """Page-grid key ranges over key groups of 32 and 64 tokens on 32-token tiles (one group per
    tile, or half of one): the numpy stand-in against the reference and the Triton kernel."""
    chk = _numpy_check_module()
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 128, [300, 128, 5], {1}, "layer", 32, 3, bits + 70, "dnp_r128fslw",
                               fmt={**_PAGE_FORMAT, "k_group": k_group})
        assert err < ATTN_BOUND_FP32_OUT, f"G_K {k_group} INT{bits} vs reference: {err:.2e}"
        assert agree < 1e-3, f"G_K {k_group} INT{bits} vs Triton: relative RMS {agree:.2e}"


@pytest.mark.parametrize("bits", [2, 4])
def test_page_grid_u_in_three_f16x2_operations_is_the_reference_quotient(bits):
    """The Gluon page-grid path's ``u = h(step / qmax)`` (``page_u_f16``: a product with h(1/qmax),
    the residual by one FMA, one corrective FMA, every operation rounded to fp16) is the
    reference's fp32 quotient rounded to fp16 for every finite fp16 step >= 0, subnormals
    included; the product alone (no correction) is not."""
    qmax = (1 << bits) - 1
    step = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16)
    want = (step.float() / qmax).half()
    got = gluon_decode.page_u_f16(step, qmax)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    once = (step.double() * torch.tensor(1.0 / qmax, dtype=torch.float16).double()).half()
    assert not torch.equal(once.view(torch.int16), want.view(torch.int16))
    c, m = gluon_decode.page_u_constants(qmax)
    assert torch.tensor([c & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.float16).item() == pytest.approx(1 / qmax, rel=1e-3)
    assert torch.tensor([m >> 16], dtype=torch.int32).to(torch.int16).view(torch.float16).item() == -qmax


def test_gluon_refuses_page_grid_key_ranges_where_a_variant_reads_fp16_pairs(nan_empty):
    """A variant that loads the key params as fp16 pairs (the fp16 loads or a TMA ring) is refused
    with the variants that read page-grid ranges, before any launch (so also where Gluon cannot run)."""
    cfg = OscarConfig(bits=2, page_size=32, **_PAGE_FORMAT)
    pool = build_pool(cfg, h=1, d=128, p=32, lens=[40], seed=8)
    q = torch.randn(1, 4, 128).bfloat16().to(DEVICE)
    for variant in ("dnp_r128fs", "dnp_r128fslwt3"):
        with pytest.raises(ValueError, match=f"Gluon variant '{variant}' reads fp16 key params only; page-grid key "
                                             f"ranges .* without a TMA ring: .*dnp_r128fslw,"):
            _decode(pool, q, gluon=True, tune=dict(block_n=16, gluon_variant=variant))
    # 32-token tiles over G_K 16 (two key groups per tile): dequantized keys paired from words only
    cfg16 = OscarConfig(bits=2, page_size=32, k_group=16)
    pool16 = build_pool(cfg16, h=1, d=128, p=32, lens=[40], seed=8)
    for pl, variant in ((pool, "dnp_r128fslwk"), (pool16, "dnp_r128fslwk"), (pool16, "dnp_r128fs"), (pool16, "regs1"),
                        (pool16, "dnp_r128fslwt3")):
        with pytest.raises(ValueError, match=f"Gluon variant '{variant}' takes one key group per tile; 32-token tiles "
                                             f"over key groups of 16 need .*: dnp_r128fsw, dnp_r128fslw, dnp_r128fslwn, "
                                             f"dnp_r128fslwnp, dnp_r128fslwnpe, dnp_r128fslwnpx, dnp_r128fslwn64, "
                                             f"dnp_r144fslwn64, dnp_r168fslwn64, dnp_r128fslwnpv, dnp_r128fslwnpxv, dnp_r128fslwnpb, "
                                             f"dnp_r128fslwnpbh, dnp_r128fslwnpvh, dnp_r128fslwnpxvh$"):
            _decode(pl, q, gluon=True, tune=dict(block_n=32, gluon_variant=variant))
    with pytest.raises(ValueError, match="block_n in \\(16, 32, 64\\) dividing k_group=8 \\(or twice it"):
        gluon_decode.check_gluon_shape(bits=2, head_dim=128, k_group=8, v_group=64, block_n=32, group=4)


def _check_g16_format_on_cuda(variant: str, bits: int, form: dict, block_n: int, seed: int) -> None:
    """The Gluon stage 1 (``variant``, ``block_n``-token tiles) on a Llama-shaped pool in format
    ``form`` (key groups of 16, or 32) against the reference and the Triton stage 1 (32-token tiles),
    split counts 1, the default and 16, a sealed, a mixed and open pages."""
    h, g, p, lens, last_sealed, scope = _SHAPES["llama8b_32q8kv"]
    cfg = OscarConfig(bits=bits, page_size=p, norm_scope=scope, **form)
    pool = build_pool(cfg, h=h, d=128, p=p, lens=lens, last_sealed=last_sealed, kinds={len(lens) - 1: "mixed"},
                      device=torch.device("cuda"), seed=seed)
    q = torch.randn(len(lens), h * g, 128).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(128))
    tri = _decode(pool, q, gluon=False, out=torch.empty(q.shape, device="cuda"))
    for n in (None, 1, 16):
        tune = dict(block_n=block_n, gluon_variant=variant, **({} if n is None else {"num_splits": n}))
        out = _decode(pool, q, gluon=True, out=torch.full(q.shape, float("nan"), device="cuda"), tune=tune)
        err = rel_rms(out, ref)
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"{variant} splits={n} vs reference: {err:.2e}"
        assert rel_rms(out, tri) < _bound(variant, bits, 1e-3), f"{variant} splits={n} vs Triton: {rel_rms(out, tri):.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant", ["dnp_r128fslwnpv", "dnp_r128fslwnpvh", "dnp_r128fslwnpxv", "dnp_r128fslwnpb"])
def test_gluon_page_key_groups_of_32_run_right_on_the_cpu(variant):
    """Page-grid key ranges at G_K 32 on 32-token tiles (one key group per tile; the default rule's
    Gluon variants for them since session 47, and the next-tile L2 prefetch form): the numpy stand-in
    against the reference and the Triton kernel, INT2 and INT4, three splits over sealed pages, a
    mixed page and the open ones (the stand-in also checks every L2 prefetch address)."""
    chk = _numpy_check_module()
    for bits in (2, 4):
        err, agree = chk.check(bits, 2, 4, 128, [300, 128, 5], {1}, "layer", 32, 3, bits + 70, variant,
                               fmt={**_PAGE_FORMAT, "k_group": 32})
        assert err < _bound(variant, bits, ATTN_BOUND_FP32_OUT), f"{variant} INT{bits} vs reference: {err:.2e}"
        assert agree < _bound(variant, bits, 1e-3), f"{variant} INT{bits} vs Triton: relative RMS {agree:.2e}"


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("variant", _PAGE_VARIANTS)
def test_gluon_page_grid_key_ranges_match_reference(variant, bits, nan_empty):
    """On CUDA: the Gluon stage 1 over page-grid key ranges on 16-token tiles (one key group each)."""
    _check_g16_format_on_cuda(variant, bits, _PAGE_FORMAT, 16, seed=bits * 13)


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("variant,fmt", [("dnp_r128fslw", "page"), ("dnp_r128fslwn", "page"), ("dnp_r128fslwnp", "page"),
                                         ("dnp_r128fslwnpv", "page"), ("dnp_r128fslwnpb", "page"),
                                         ("dnp_r128fslw", "group16")])
def test_gluon_two_key_groups_per_tile_match_reference(variant, fmt, bits, nan_empty):
    """On CUDA: 32-token Gluon tiles over key groups of 16 tokens (two groups per tile), page-grid
    ranges and fp16 group pairs."""
    _check_g16_format_on_cuda(variant, bits, _PAGE_FORMAT if fmt == "page" else {"k_group": 16}, 32, seed=bits * 17)


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("variant", ["dnp_r128fslwnpv", "dnp_r128fslwnpvh", "dnp_r128fslwnpxv", "dnp_r128fslwnpb"])
def test_gluon_page_key_groups_of_32_match_reference(variant, bits, nan_empty):
    """On CUDA: 32-token Gluon tiles over page-grid key groups of 32 tokens (one group per tile),
    the default rule's variants for them since session 47."""
    _check_g16_format_on_cuda(variant, bits, {**_PAGE_FORMAT, "k_group": 32}, 32, seed=bits * 19)


#: The fused step's cases (INT2 layer norm; INT4 head norm with the merge in the launch; a per-head
#: key-rotation plan; 16 KV heads: the layer norm's rotation of every head's key in two chunks).
_STEP_CASES = [(2, "layer", None, False, 8), (4, "head", None, True, 8),
               (2, "layer", (True, False) * 4, True, 8), (2, "layer", (True, False) * 8, False, 16)]


def _step_cases() -> list[tuple]:
    """(variant, *case) of the whole-step CPU test. What a fused variant adds to the step around its
    sealed-tile loop (the query rotation, the new token's write into the open page, the open page's
    tiles, the partials' inverse rotation, the merge) depends on its open-page handling only: the
    open-page tile size and form, the open page spread over the splits or not, which program writes,
    whether the open-page program shares the sealed tiles, a TMA ring. The default variant runs every
    case; one variant per other open-page form runs one case (alternating, so each case runs on
    several forms). The sealed-tile loops of all variants run in test_gluon_source_runs_right_on_the_cpu
    (~3 s each; a step case is ~12 s) and every fused variant's step on a GPU."""
    cases = [(kdecode.GLUON_DEFAULT_VARIANT, *c) for c in _STEP_CASES]
    seen = {_open_page_form(kdecode.GLUON_DEFAULT_VARIANT)}
    for name, var in gluon_decode.GLUON_VARIANTS.items():
        if var.fused and _open_page_form(name) not in seen:
            seen.add(_open_page_form(name))
            cases.append((name, *_STEP_CASES[len(seen) % 2]))
    return cases


def _open_page_form(name: str) -> tuple:
    v = gluon_decode.GLUON_VARIANTS[name]
    return v.staging_block, v.direct_staging, v.spread_open, v.open_first, v.open_share, bool(v.tma), v.early_loads


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("variant,bits,scope,flags,merge,heads", _step_cases())
def test_gluon_fused_step_runs_right_on_the_cpu(variant, bits, scope, flags, merge, heads):
    """A whole step of a ``fused`` variant (the query rotation, the new token's write and the
    partials' inverse rotation inside the Gluon launch, then the plain merge), its source executed
    by the numpy stand-in: it stages exactly the keys and values the fused Triton step stages (the
    padding request's token not at all), the same token scales, and its output agrees with the Triton
    step's (1e-3, the GPU test's bound: 16-token open-page tiles round probabilities against other
    maxima) and with the same variant unfused (write launch, stage 1 on rotated queries, rotating
    merge) to 1e-6; also with a per-head key-rotation plan, and with the merge in the launch (the
    last program of each (request, KV head) merges; its counters are left at zero), and with 16 KV
    heads (the layer norm's rotation of every head's key in two chunks of 8).
    test_gluon_source_runs_right_on_the_cpu covers the fused variants' in-launch merge at few splits."""
    kw = {} if heads == 8 else {"h": heads, "g": 2, "lens": (300, 97, 64)}
    same, st, err, err_unfused = _numpy_check_module().check_step(bits, scope, flags, variant, merge=merge, **kw)
    assert same, "the fused write staged other bits than the Triton step's"
    assert st <= 2.4e-7, f"token scales differ by {st:.1e} (relative)"
    assert err < _bound(variant, bits, 1e-3), f"vs the Triton step: relative RMS {err:.2e}"
    assert err_unfused < 1e-6, f"vs the unfused path: relative RMS {err_unfused:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
def test_gluon_page_default_step_runs_right_on_the_cpu():
    """The page-grid default's whole step (``GLUON_DEFAULT_PAGE_VARIANT`` on
    ``GLUON_DEFAULT_PAGE_BLOCK_N``-token tiles over two key groups of 16, the INT2 server default's
    format, layer norm, the merge by the launcher's rule), its source executed by the numpy stand-in:
    the same staged bits and token scales as the fused Triton step, its output within the variant's
    bound of the Triton step's and 1e-6 of the same variant unfused; one request's new token opens a
    fresh page."""
    assert kdecode.gluon_block_n(32, INT2_FORMAT["k_group"], True) == kdecode.GLUON_DEFAULT_PAGE_BLOCK_N
    same, st, err, err_unfused = _numpy_check_module().check_step(
        2, "layer", None, kdecode.GLUON_DEFAULT_PAGE_VARIANT, fmt=INT2_FORMAT, block_n=kdecode.GLUON_DEFAULT_PAGE_BLOCK_N,
        lens=(300, 129, 200, 64))  # request 1's new token opens a fresh page (slot 0; lens_before_write)
    assert same, "the fused write staged other bits than the Triton step's"
    assert st <= 2.4e-7, f"token scales differ by {st:.1e} (relative)"
    assert err < _bound(kdecode.GLUON_DEFAULT_PAGE_VARIANT, 2, 1e-3), f"vs the Triton step: relative RMS {err:.2e}"
    assert err_unfused < 1e-6, f"vs the unfused path: relative RMS {err_unfused:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("fmt,merge,split", [(None, True, "write"), ("page", False, "write"), (None, False, "rotation")])
def test_gluon_split_write_step_runs_right_on_the_cpu(fmt, merge, split):
    """``_DecodeTuning.split_write`` (the write as a launch of its own, then the fused variant without
    it: the query rotation, the partials rotated back, the merge in the launch or after it; with
    ``split_rotation`` the query rotation in the write's launch), for the paper format's and the
    page-grid format's defaults, sources executed by the numpy stand-in: the same staged bits as the
    fused Triton step, output within 1e-6 of the fused step."""
    variant = kdecode.GLUON_DEFAULT_VARIANT if fmt is None else kdecode.GLUON_DEFAULT_PAGE_VARIANT
    kw = {} if fmt is None else {"fmt": INT2_FORMAT, "block_n": kdecode.GLUON_DEFAULT_PAGE_BLOCK_N}
    same, st, err, _, err_split, same_split = _numpy_check_module().check_step(
        2, "layer", None, variant, merge=merge, split_write=split, **kw)
    assert same and same_split, "a write staged other bits than the Triton step's"
    assert err < _bound(variant, 2, 1e-3), f"the fused step vs the Triton step: relative RMS {err:.2e}"
    assert err_split < 1e-6, f"split write vs the fused step: relative RMS {err_split:.2e}"


def test_gluon_variants_are_checked(nan_empty):
    """The sweep's variant names and knobs: unknown names and out-of-range knobs are refused with
    the allowed values, before any launch (so also where Gluon cannot run)."""
    assert gluon_decode.DEFAULT_GLUON_VARIANT == "regs1" and gluon_decode.GLUON_VARIANTS["regs1"].stages == 0
    assert {v.stages for v in gluon_decode.GLUON_VARIANTS.values()} == {0, 2, 3, 4}
    with pytest.raises(ValueError, match="unknown Gluon stage-1 variant 'cp9'; known: regs1"):
        gluon_decode.gluon_variant("cp9")
    with pytest.raises(ValueError, match="stages must be 0 .* or 2..4"):
        gluon_decode.GluonVariant("x", stages=1)
    with pytest.raises(ValueError, match="keys must be one of dequant, fold, magic, mma, mma_magic, got 'free'"):
        gluon_decode.GluonVariant("x", keys="free")
    with pytest.raises(ValueError, match="maxnreg must be in \\[24, 255\\]"):
        gluon_decode.GluonVariant("x", maxnreg=300)
    with pytest.raises(ValueError, match="prefetch=False is the register path"):
        gluon_decode.GluonVariant("x", stages=3, prefetch=False)
    with pytest.raises(ValueError, match="packed pairs the params"):
        gluon_decode.GluonVariant("x", keys="fold", packed=True)
    with pytest.raises(ValueError, match="keys='mma' folds the key params the packed form pairs"):
        gluon_decode.GluonVariant("x", keys="mma")
    with pytest.raises(ValueError, match="keys='mma_magic' folds the key params the packed form pairs"):
        gluon_decode.GluonVariant("x", keys="mma_magic")
    with pytest.raises(ValueError, match="tma must be 0 \\(off\\) or a ring of 2..4 slots .* got tma=3"):
        gluon_decode.GluonVariant("x", tma=3)
    with pytest.raises(ValueError, match="got tma=5"):
        gluon_decode.GluonVariant("x", prefetch=False, packed=True, pair_words=True, tma=5)
    with pytest.raises(ValueError, match="staging_block must be 16, 32 or None, got 8"):
        gluon_decode.GluonVariant("x", staging_block=8)
    with pytest.raises(ValueError, match="fused takes the step's other parts into the register path"):
        gluon_decode.GluonVariant("x", stages=2, fused=True)
    with pytest.raises(ValueError, match="page_pairs is how the register path pairs page-grid key params made from words"):
        gluon_decode.GluonVariant("x", packed=True, page_pairs=True)
    with pytest.raises(ValueError, match="page_pairs is how the register path pairs"):
        gluon_decode.GluonVariant("x", prefetch=False, packed=True, pair_words=True, tma=3, page_pairs=True)
    assert kdecode._DecodeTuning(32, 32, 1, True, 1.0).gluon_variant == "regs1"


def test_gluon_decode_refuses_what_it_does_not_support(nan_empty):
    """Clear errors before any launch (so also where Gluon cannot run): head dims whose fragments would split a code word, value groups narrower than a lane's channels, tiles
    that split a key group."""
    cfg = OscarConfig(bits=2, page_size=32)
    pool = build_pool(cfg, h=1, d=64, p=32, lens=[40], seed=5)
    q = torch.randn(1, 4, 64).bfloat16().to(DEVICE)
    with pytest.raises(ValueError, match="head_dim a multiple of 128"):
        _decode(pool, q, gluon=True)
    cfg = OscarConfig(bits=4, page_size=32, v_group=8)
    pool = build_pool(cfg, h=1, d=128, p=32, lens=[40], seed=6)
    q = torch.randn(1, 4, 128).bfloat16().to(DEVICE)
    with pytest.raises(ValueError, match="v_group a multiple of head_dim/8 = 16"):
        _decode(pool, q, gluon=True)
    cfg = OscarConfig(bits=4, page_size=32, k_group=16)
    pool = build_pool(cfg, h=1, d=128, p=32, lens=[40], seed=7)
    with pytest.raises(ValueError, match="Gluon variant 'regs1' takes one key group per tile; 32-token tiles over key "
                                         "groups of 16"):
        _decode(pool, q, gluon=True, tune=dict(block_n=32))
    with pytest.raises(ValueError, match="unknown Gluon stage-1 variant 'cp9'"):
        _decode(pool, q, gluon=True, tune=dict(block_n=16, gluon_variant="cp9"))


def test_rotating_merge_launch_equals_merge_then_rotation(nan_empty):
    """``merge_launch(rotation=True)`` (the Gluon path's merge: partials in the rotated basis) is
    the plain weighted-sum merge followed by the inverse Walsh-Hadamard rotation, empty splits
    (lse = -inf) included."""
    gen = torch.Generator().manual_seed(11)
    b, hq, n, d = 2, 4, 5, 64
    part_o = torch.randn(b, hq, n, d, generator=gen).to(DEVICE)
    part_lse = (torch.randn(b, hq, n, generator=gen) * 4).to(DEVICE)
    part_lse[0, 1, 2] = float("-inf")
    plain = torch.empty(b, hq, d, device=DEVICE)
    kdecode.merge_launch(part_o, part_lse, plain)
    rotated = torch.empty(b, hq, d, device=DEVICE)
    kdecode.merge_launch(part_o, part_lse, rotated, rotation=True)
    expect = R.hadamard(plain.float().cpu())
    assert torch.allclose(rotated.cpu(), expect, rtol=1e-5, atol=1e-5)
    # and the weighted sum itself, from the log-sum-exps (base 2)
    w = torch.softmax(part_lse.cpu() * math.log(2), dim=-1)
    assert torch.allclose(plain.cpu(), (w[..., None] * part_o.cpu()).sum(2), rtol=1e-5, atol=1e-5)


def test_default_tuning_never_picks_gluon():
    """The default stage 1 is the Triton one at every batch size (the Gluon stage 1 only through
    ``_tuning``): a whole Gluon step loses at short contexts, and a CUDA graph cannot switch by length."""
    for b in (1, 4, 16, 17, 64, 512):
        assert not kdecode._default_tuning(b, 8, 128, 128).gluon


def _step_with_write(cfg, *, gluon, tune=None, lens=(300, 97, 1000, 64), h=8, g=4, seed=41, key_rotated=None):
    """One decode step with the new token's write (new_k/new_v/new_loc) on a fresh pool; the last
    request is padding (its token goes to page 0, mapped to -1; it attends to its cached tokens
    only). ``key_rotated``: the layer's key-rotation flags (``build_pool``). Returns (pool, output)."""
    d, p = 128, cfg.page_size
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens_before_write(lens, p), device=torch.device("cuda"), seed=seed,
                      key_rotated=key_rotated)
    pool.seq_lens = torch.tensor(list(lens[:-1]) + [lens[-1] - 1], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(seed + 1)
    k_new = torch.randn(len(lens), h, d, generator=gen).bfloat16().cuda()
    v_new = torch.randn(len(lens), h, d, generator=gen).bfloat16().cuda()
    q = torch.randn(len(lens), h * g, d, generator=gen).bfloat16().cuda()
    last = [int(pool.kv_page_indices[int(pool.kv_indptr[b + 1]) - 1]) for b in range(len(lens))]
    loc = torch.tensor([last[b] * p + (n - 1) % p for b, n in enumerate(lens[:-1])] + [5], device="cuda")
    kw = dict(q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
              seq_lens=pool.seq_lens, sm_scale=1.0 / math.sqrt(d), new_k=k_new, new_v=v_new, new_loc=loc,
              staging_scale=pool.staging_scale, out=torch.full(q.shape, float("nan"), device="cuda"))
    if gluon is None:  # the launcher's own choice
        return pool, oscar_decode_attention(**kw)
    tuning = dataclasses.replace(kdecode._default_tuning(len(lens), h, d, p), gluon=gluon, **(tune or {}))
    return pool, oscar_decode_attention(**kw, _tuning=tuning)


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("key_page,share,split,mixed", [(False, False, False, True), (False, True, True, False),
                                                        (True, False, False, False), (True, True, True, False)])
def test_gluon_lane_butterflies_change_no_bit(bits, key_page, share, split, mixed, nan_empty):
    """The ``lane_fwht`` forms of the four Gluon defaults (suffix h: the query rotation, the partial's
    inverse rotation and the write's butterflies by lane shuffles in a layout of their own, compiled
    for the GPU) give the plain forms' output and staged new tokens bit for bit: the whole step with
    the write (fused, or a launch of its own as the launcher runs it from 192 pairs at INT2), both
    formats, a layer whose keys are rotated in some heads only (the query rotation's row mask), a
    padding request."""
    cfg = _OscarConfig(bits=bits, page_size=128, **INT2_FORMAT) if key_page else OscarConfig(bits=bits, page_size=128)
    if key_page:
        base = kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT if share else kdecode.GLUON_DEFAULT_PAGE_VARIANT
    else:
        base = kdecode.GLUON_DEFAULT_SHARE_VARIANT if share else kdecode.GLUON_DEFAULT_VARIANT
    lens = (300, 97, 1000, 64, 129, 500, 257, 33)
    flags = (True, False, True, True, False, True, True, False) if mixed else None
    outs, staged = [], []
    for v in (base, base + "h"):
        tune = dict(gluon_variant=v, block_n=32, split_write=split, split_pdl=split, **({"fit": True} if share else {}))
        pool, out = _step_with_write(cfg, gluon=True, lens=lens, tune=tune, key_rotated=flags)
        outs.append(out)
        staged.append([t.clone() for t in (pool.layer.staging_k, pool.layer.staging_v, pool.staging_scale)
                       if t is not None])
    assert not torch.isnan(outs[0]).any()
    assert torch.equal(outs[0], outs[1]), base
    for a, b in zip(*staged):
        assert torch.equal(a, b), base


@gpu
@needs_gluon
@pytest.mark.parametrize("bits,key_page,batch", [(2, False, 4), (4, False, 40), (2, True, 40), (4, True, 4)])
@pytest.mark.parametrize("split", ["write", "rotation", "pdl"])
def test_gluon_split_write_equals_the_fused_step(bits, key_page, batch, split, nan_empty):
    """``_DecodeTuning.split_write`` (the write as a launch of its own before the fused Gluon stage 1;
    ``split_rotation``: with the query rotation; ``split_pdl``: the stage 1 a programmatic dependent
    launch, only its open-page programs waiting for the write's stores): the same staged keys and
    values (token scales within an ulp) as the fused step and the same output to 1e-6, the padding
    request skipped; the formats' defaults, with the merge in the launch (40 requests) and after it (4)."""
    cfg = _OscarConfig(bits=bits, page_size=128, **INT2_FORMAT) if key_page else OscarConfig(bits=bits, page_size=128)
    variant = kdecode.GLUON_DEFAULT_PAGE_VARIANT if key_page else kdecode.GLUON_DEFAULT_VARIANT
    tune = dict(gluon_variant=variant, block_n=kdecode.GLUON_DEFAULT_PAGE_BLOCK_N if key_page else 32)
    gen = torch.Generator().manual_seed(batch)
    lens = tuple(int(x) for x in torch.randint(2, 1500, (batch,), generator=gen))
    a, out_fused = _step_with_write(cfg, gluon=True, lens=lens, tune=tune)
    b, out_split = _step_with_write(cfg, gluon=True, lens=lens,
                                    tune=dict(tune, split_write=True, split_rotation=split == "rotation",
                                              split_pdl=split == "pdl"))
    assert torch.equal(a.layer.staging_k.view(torch.int16), b.layer.staging_k.view(torch.int16))
    assert torch.equal(a.layer.staging_v.view(torch.int16), b.layer.staging_v.view(torch.int16))
    torch.testing.assert_close(a.staging_scale, b.staging_scale, rtol=2.4e-7, atol=0)
    assert rel_rms(out_split, out_fused) < 1e-6


@gpu
@needs_gluon
@pytest.mark.parametrize("bits,scope,flags", [(2, "layer", None), (4, "head", None),
                                              (2, "layer", (True, False, True, True, False, True, True, False))])
@pytest.mark.parametrize("variant", ["regs1", "d16f", "dnp_r128f", "d16fs", "dnp_r128fs", "regs1s", "dnp_r128fsl",
                                     "dnp_r128fsw", "dnp_r128fslw", "dnp_r128fslwn", "dnp_r128fslwk",
                                     "dnp_r128fslwnk", "dnp_r128fslwt3", "dnp_r128fslwnkt3", "dnp_r128fslwt2x2",
                                     "dnp_r128fslwnkt2x2", "dnp_r128fslwm", "dnp_r128fslwnm", "dnp_r128fslwko",
                                     "dnp_r128fslwk2", "dnp_r128fslwnk2", "dnp_r128fslwkx", "dnp_r128fslwnke",
                                     "dnp_r128fslwnkx", "dnp_r128fslwnkv", "dnp_r128fslwnkxv", "dnp_r128fslwnkb",
                                     "dnp_r128fslwnkvh", "dnp_r128fslwnkxvh"])
def test_gluon_step_with_the_write_equals_the_fused_triton_step(variant, bits, scope, flags, nan_empty):
    """With the step's write, the Gluon path runs the write launch (+ query rotation), stage 1 and
    the merge (``fused`` variants: stage 1 with the query rotation, the write and the partials'
    inverse rotation, then the plain merge): it stages exactly the keys and values (token scales
    within an ulp) the Triton stage 1's fused write stages, skips the padding request, and its
    attention agrees with the Triton step's; also with a per-head key-rotation plan (``flags``)."""
    cfg = OscarConfig(bits=bits, page_size=128, norm_scope=scope)
    a, out_g = _step_with_write(cfg, gluon=True, key_rotated=flags, tune=dict(gluon_variant=variant))
    b, out_t = _step_with_write(cfg, gluon=False, key_rotated=flags)
    assert torch.equal(a.layer.staging_k.view(torch.int16), b.layer.staging_k.view(torch.int16))
    assert torch.equal(a.layer.staging_v.view(torch.int16), b.layer.staging_v.view(torch.int16))
    # s_t: the two launches reduce the squares in different orders (warps), as in
    # test_kernels_decode.test_decode_fused_write_equals_the_write_launch: within one fp32 ulp
    torch.testing.assert_close(a.staging_scale, b.staging_scale, rtol=2e-7, atol=0)
    assert not torch.isnan(out_g).any()
    err = rel_rms(out_g.float(), out_t.float())
    assert err < _bound(variant, bits, 1e-3), f"Gluon vs Triton step: relative RMS {err:.2e}"


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("variant", ["regs1", "d16f", "dnp_r128f", "dnp_r128fs", "regs1s", "dnp_r128fsl",
                                     "dnp_r128fslw", "dnp_r128fslwk", "dnp_r128fslwt3", "dnp_r128fslwt2x2",
                                     "dnp_r128fslwk2", "dnp_r128fslwkx"])
def test_gluon_sliding_window(variant, bits, nan_empty):
    """A sliding-window layer on the Gluon stage 1 (``window_left``): windows inside the open page,
    across sealed pages, on a tile boundary and past the start, a request whose last page is
    sealed, against the reference; the same launch without the window is another answer."""
    p, h, g = 128, 2, 4
    cfg = OscarConfig(bits=bits, page_size=p)
    lens = [1, p - 1, 3 * p, 2 * p + 3, 4 * p + 5]
    pool = build_pool(cfg, h=h, d=128, p=p, lens=lens, last_sealed={2}, device=torch.device("cuda"), seed=9 * bits)
    q = torch.randn(len(lens), h * g, 128).bfloat16().cuda()
    tune = dict(gluon_variant=variant, num_splits=3)
    full = _decode(pool, q, gluon=True, out=torch.empty(q.shape, device="cuda"), tune=tune)
    for window in (0, 5, p - 1, p + 7, 2 * p, 10 * p):
        out = _decode(pool, q, gluon=True, out=torch.full(q.shape, float("nan"), device="cuda"), window_left=window,
                      tune=tune)
        err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(128), window_left=window))
        assert err < ATTN_BOUND_FP32_OUT, f"{variant} window {window}: relative RMS {err:.2e}"
        if window < 2 * p:
            assert rel_rms(full[2:], out[2:]) > 0.05, f"window {window} changed nothing"


@gpu
@needs_gluon
@pytest.mark.parametrize("variant", ["d16f", "dnp_r128f", "dnp_r128fs", "dnp_r128fsl", "dnp_r128fslw",
                                     "dnp_r128fslwn", "dnp_r128fslwnk", "dnp_r128fslwt3", "dnp_r128fslwnkt3",
                                     "dnp_r128fslwnkt2x2", "dnp_r128fslwk", "dnp_r128fslwko", "dnp_r128fslwk2",
                                     "dnp_r128fslwkx", "dnp_r128fslwnkv", "dnp_r128fslwnkxv"])
@pytest.mark.parametrize("group", [1, 4, 16])
def test_gluon_fused_step_merges_in_the_launch(variant, group, nan_empty):
    """Few splits (3, as at 32+ requests): a ``fused`` variant merges in its own launch, as the
    Triton step does: one launch per step. With the write, against the Triton step; then steps on
    one workspace whose partials are NaN again before each (a merge that read a partial before its
    program stored it would show) and whose counters the previous step must have reset (as for a
    CUDA-graph replay), each against the Triton kernel, with a bf16 output as the backend passes."""
    cfg = OscarConfig(bits=2, page_size=128)
    tune = dict(gluon_variant=variant, num_splits=3)
    _, out_t = _step_with_write(cfg, gluon=False, g=group, tune=dict(num_splits=3))
    pool, out_g = _step_with_write(cfg, gluon=True, g=group, tune=tune)
    assert not torch.isnan(out_g).any()
    # folded keys (keys "mma" / "mma_magic") round q * scale to fp16 instead of each key: H100,
    # session 26, 1.0047e-3 from the Triton step at group 1 for dnp_r128fslwk (the default) and
    # dnp_r128fslwko alike; bench_decode's agreement threshold (2e-3) bounds them
    fold = gluon_decode.GLUON_VARIANTS[variant].keys in ("mma", "mma_magic")
    assert rel_rms(out_g.float(), out_t.float()) < _bound(variant, 2, 2e-3 if fold else 1e-3)
    b, hq, d = out_g.shape
    ws = kdecode.decode_workspace(b, hq, 8, d, 3, "cuda")
    for seed in (5, 6, 7):
        q = torch.randn(b, hq, d, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda()
        ws[0].fill_(float("nan"))
        ws[1].fill_(float("nan"))
        out = _decode(pool, q, gluon=True, out=torch.full(q.shape, float("nan"), device="cuda").bfloat16(), workspace=ws,
                      tune=tune)
        ref = _decode(pool, q, gluon=False, out=torch.empty(q.shape, device="cuda"), tune=dict(num_splits=3))
        assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
        assert rel_rms(out.float(), ref) < ATTN_BOUND_BF16_OUT
        assert int(ws[2].abs().sum()) == 0, "the merge counters were not reset"


@gpu
@needs_cuda
def test_the_default_decode_runs_the_fused_triton_step(nan_empty):
    """Without ``_tuning`` a launch of 8 (request, KV head) pairs (2 requests at 4 KV heads, under
    ``GLUON_DEFAULT_PAIRS``' 16; from 16 the Gluon step is the default) at head_dim 128 runs the fused
    Triton step with the open page spread over short sealed programs (``SPREAD_OPEN``, the default
    below 16 pairs): its output is bit-identical to the explicit Triton tuning's with that spread
    (and, where Gluon runs, not to the Gluon one's)."""
    cfg = OscarConfig(bits=2, page_size=128)
    lens = (1000, 300)
    assert len(lens) * 4 < kdecode.GLUON_DEFAULT_PAIRS[0]
    _, out_default = _step_with_write(cfg, gluon=None, h=4, lens=lens)
    _, out_triton = _step_with_write(cfg, gluon=False, h=4, lens=lens, tune=dict(spread_open=kdecode.SPREAD_OPEN))
    assert torch.equal(out_default, out_triton)
    if _GLUON_REASON is None:
        _, out_gluon = _step_with_write(cfg, gluon=True, h=4, lens=lens)
        assert not torch.equal(out_default, out_gluon)


def _default_rule_args(**over):
    kw = dict(batch=8, num_kv_heads=8, group=4, head_dim=128, bits=2, k_group=32, v_group=32, key_page=False, block_n=32,
              device=torch.device("cuda"), capability=(9, 0))
    return {**kw, **over}


def test_the_gluon_default_rule(monkeypatch):
    """Where the default decode takes the Gluon stage 1 (``gluon_default_reason``): from 16 to 1024
    (request, KV head) pairs, group key ranges or page-grid ones at G_K 16, a shape the Gluon stage 1 reads, sm_90, Triton
    3.6's Gluon, unless OSCAR_SGL_GLUON_DECODE=0; every other case names why not. Here (CPU) the
    launcher's own tuning stays on the Triton stage 1."""
    monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV, raising=False)
    # with this machine's Triton: the Gluon availability decides (a 3.6 with Gluon, or the reason)
    assert kdecode.gluon_default_reason(**_default_rule_args()) == gluon_decode.gluon_available(None)
    monkeypatch.setattr(gluon_decode, "gluon_available", lambda device=None: None)
    reason = kdecode.gluon_default_reason
    assert reason(**_default_rule_args()) is None
    assert reason(**_default_rule_args(batch=15, num_kv_heads=1, group=16)) is not None
    assert reason(**_default_rule_args(batch=4, num_kv_heads=4, group=8)) is None  # 16 pairs
    assert reason(**_default_rule_args(batch=4)) is None  # 32 pairs: 4 requests at 8 KV heads
    assert reason(**_default_rule_args(batch=3)) is None  # 24 pairs
    assert reason(**_default_rule_args(batch=2)) is None  # 16 pairs: 2 requests at 8 KV heads
    assert "8 (request, KV head) pairs" in reason(**_default_rule_args(batch=1))
    assert "1032 (request, KV head) pairs" in reason(**_default_rule_args(batch=129))
    assert reason(**_default_rule_args(batch=63)) is None
    assert reason(**_default_rule_args(batch=128)) is None
    # page-grid key ranges (G_K 16): Gluon tiles of GLUON_DEFAULT_PAGE_BLOCK_N tokens (32: two key
    # groups each, since session 29) at the bit widths GLUON_DEFAULT_PAGE_BITS names (INT2 and INT4),
    # else Triton
    page = dict(key_page=True, k_group=16, v_group=64)
    assert kdecode.GLUON_DEFAULT_PAGE_BITS == (2, 4) and kdecode.GLUON_DEFAULT_PAGE_BLOCK_N == 32
    for bits in (2, 4):
        assert reason(**_default_rule_args(**page, block_n=32, bits=bits)) is None, bits
    # G_K 32 (one key group per 32-token tile) since session 47; wider groups stay on Triton
    assert kdecode.GLUON_DEFAULT_PAGE_K_GROUPS == (16, 32)
    for bits in (2, 4):
        assert reason(**_default_rule_args(**{**page, "k_group": 32}, block_n=32, bits=bits)) is None, bits
    assert "measured at k_group 16 and 32 only" in reason(**_default_rule_args(**{**page, "k_group": 64}, bits=4))
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_BITS", (4,))
    assert "page-grid key ranges (key_ranges='page') at 2 bits" in reason(**_default_rule_args(**page, block_n=32))
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_BITS", ())
    assert "page-grid" in reason(**_default_rule_args(**page, block_n=32, bits=4))
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_BITS", (2, 4))
    # a page variant that takes one key group per tile refuses the 32-token tile (the rule says why)
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_VARIANT", "dnp_r128fslwnk")
    assert "one key group per tile" in reason(**_default_rule_args(**page, block_n=32))
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_VARIANT", "dnp_r128fslwn")
    assert kdecode.gluon_block_n(32, 16, True) == 32 and kdecode.gluon_block_n(32, 32, True) == 32
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_BLOCK_N", 16)
    assert kdecode.gluon_block_n(32, 16, True) == 16 and kdecode.gluon_block_n(32, 32, True) == 32
    monkeypatch.setattr(kdecode, "GLUON_DEFAULT_PAGE_BLOCK_N", 32)
    assert kdecode.gluon_block_n(32, 16, False) == 32 and kdecode.gluon_block_n(64, 16, True) == 64
    assert "head_dim" in reason(**_default_rule_args(head_dim=64))
    assert "v_group" in reason(**_default_rule_args(v_group=8))
    assert "16 query heads" in reason(**_default_rule_args(group=32))
    assert "sm_80" in reason(**_default_rule_args(capability=(8, 0)))
    assert "sm_100" in reason(**_default_rule_args(capability=(10, 0)))
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "0")
    assert kdecode.GLUON_DEFAULT_ENV in reason(**_default_rule_args())
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0"):
        reason(**_default_rule_args())
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "1")
    assert reason(**_default_rule_args()) is None
    # the launcher's tuning on a CPU device: the Triton stage 1 with the default's split rule
    tune = kdecode._launch_tuning(8, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                                  device=torch.device("cpu"))
    assert tune == kdecode._default_tuning(8, 8, 128, 128) and not tune.gluon
    assert gluon_decode.gluon_variant(kdecode.GLUON_DEFAULT_VARIANT).fused
    fmt = dict(k_group=32, v_group=32, key_page=False)
    layer = types.SimpleNamespace(bits=2, k_ranges=None, **{k: v for k, v in fmt.items() if k != "key_page"})
    for batch in (1, 8, 64, 128):
        assert kdecode.decode_num_splits(batch, 8, 128, 128, layer=layer, num_q_heads=32, device="cpu") == \
            kdecode.decode_num_splits(batch, 8, 128, 128)
    # where the rule allows it (as on an H200): the Gluon variant; below 512 pairs the Triton split
    # count (16 programs per SM), from 512 on whole waves of the Gluon program's 16 resident per SM
    # (the Triton tuning balances waves of its 8 there); decode_num_splits follows
    _real_reason = kdecode.gluon_default_reason
    monkeypatch.setattr(kdecode, "gluon_default_reason", lambda **kw: None)
    for batch, waves in ((4, 16.0), (8, 16.0), (63, 16.0), (64, None), (96, None), (128, None)):
        t = kdecode._launch_tuning(batch, 8, 128, 128, group=4, bits=2, device=torch.device("cuda"), **fmt)
        resident = kdecode.GLUON_RESIDENT
        share = kdecode.gluon_share_rule(batch, 8, waves=waves, resident=resident)
        want = kdecode.GLUON_DEFAULT_SHARE_VARIANT if share else kdecode.GLUON_DEFAULT_VARIANT
        assert t.gluon and t.gluon_variant == kdecode.gluon_lane_form(want, batch * 8), batch
        assert (t.waves, t.resident, t.fit) == (waves, resident, share), batch
        assert t.block_n == kdecode._default_tuning(batch, 8, 128, 128).block_n
        # the write as a launch of its own, the stage 1 its programmatic dependent: INT2, GLUON_SPLIT_WRITE_PAIRS
        lo, hi = kdecode.GLUON_SPLIT_WRITE_PAIRS
        assert t.split_write == t.split_pdl == (2 in kdecode.GLUON_SPLIT_WRITE_BITS and lo <= batch * 8 <= hi), batch
        t4 = kdecode._launch_tuning(batch, 8, 128, 128, group=4, bits=4, device=torch.device("cuda"), **fmt)
        assert t4.split_write == (4 in kdecode.GLUON_SPLIT_WRITE_BITS and lo <= batch * 8 <= hi), batch
        n = kdecode.decode_num_splits(batch, 8, 128, 128, layer=layer, num_q_heads=32, device="cuda")
        assert n == kdecode.pick_num_splits(batch, 8, waves=waves, resident=resident, fit=share)
    # the page-grid format's tuning: the same splits on the page default's 32-token Gluon tiles
    monkeypatch.setattr(kdecode, "gluon_default_reason", _real_reason)
    monkeypatch.setattr(gluon_decode, "gluon_available", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for bits in (2, 4):
        t = kdecode._launch_tuning(8, 8, 128, 128, group=4, bits=bits, k_group=16, v_group=64, key_page=True,
                                   device=torch.device("cuda"))
        assert (t.gluon, t.block_n) == (True, kdecode.GLUON_DEFAULT_PAGE_BLOCK_N), bits
        assert t.gluon_variant == kdecode.GLUON_DEFAULT_PAGE_VARIANT
        gluon_decode.check_gluon_key_page(t.gluon_variant)
        gluon_decode.check_gluon_key_groups(t.gluon_variant, block_n=t.block_n, k_group=16)
        assert t.resident == kdecode.GLUON_RESIDENT
        page_layer = types.SimpleNamespace(bits=bits, k_ranges=object(), k_group=16, v_group=64)
        n = kdecode.decode_num_splits(8, 8, 128, 128, layer=page_layer, num_q_heads=32, device="cuda")
        assert n == kdecode.pick_num_splits(8, 8, waves=16.0, resident=t.resident, fit=t.fit), bits
    # formats and shapes the default was not measured on keep the Triton stage 1: group key ranges at
    # G_K 16 (32-token tiles span two groups; the default variant takes one), head_dim 256 (64-token
    # Triton tiles)
    for kw in (dict(head_dim=128, k_group=16, v_group=32, key_page=False),
               dict(head_dim=256, k_group=32, v_group=32, key_page=False),
               dict(head_dim=256, k_group=16, v_group=64, key_page=True)):
        d = kw.pop("head_dim")
        for bits in (2, 4):
            t = kdecode._launch_tuning(8, 8, d, 128, group=4, bits=bits, device=torch.device("cuda"), **kw)
            assert not t.gluon and t == kdecode._default_tuning(8, 8, d, 128), (d, kw, bits)
        kw["head_dim"] = d
    assert kdecode._default_tuning(64, 8, 128, 128).waves is None  # the Triton tuning balances from 512 pairs
    assert kdecode._default_tuning(64, 8, 128, 128).resident == kdecode.RESIDENT_PROGRAMS_PER_SM == 8
    # on an H200's 132 SMs (requests at 8 KV heads: Gluon's whole waves of 16 vs Triton's of 8):
    # 64 requests 4 vs 2 splits, 72: 7 vs 7, 96: 8 vs 4, 100: 5 vs 5, 128: 2 vs 1 (measured best
    # of the counts timed: kernels_gluon_s22/splits.md)
    for batch, gluon, triton_ in ((64, 4, 2), (72, 7, 7), (96, 8, 4), (100, 5, 5), (128, 2, 1)):
        n = kdecode.pick_num_splits(batch, 8, num_sms=132, waves=None, resident=kdecode.GLUON_RESIDENT)
        assert n == gluon, batch
        assert kdecode.pick_num_splits(batch, 8, num_sms=132, waves=None) == triton_, batch


def test_the_gluon_default_takes_the_lane_butterflies_from_128_pairs(monkeypatch):
    """``gluon_lane_form``: each of the four Gluon defaults has a ``lane_fwht`` form (suffix ``h``)
    that differs from it by that flag only; the launcher takes it from ``GLUON_LANE_FWHT_PAIRS``
    (128) (request, KV head) pairs on, in both formats, whether the open share runs or not, and
    the plain form below (measured slower at 16-32 pairs); variants without such a form are kept."""
    import dataclasses

    assert kdecode.GLUON_LANE_FWHT_PAIRS == 128
    for base in (kdecode.GLUON_DEFAULT_VARIANT, kdecode.GLUON_DEFAULT_SHARE_VARIANT, kdecode.GLUON_DEFAULT_PAGE_VARIANT,
                 kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT):
        lanes = gluon_decode.gluon_variant(base + "h")
        assert lanes.lane_fwht and lanes.constexprs()["LANE_FWHT"]
        assert dataclasses.replace(lanes, name=base, lane_fwht=False) == gluon_decode.gluon_variant(base)
        assert kdecode.gluon_lane_form(base, 127) == base and kdecode.gluon_lane_form(base, 128) == base + "h"
        assert kdecode.gluon_lane_form(base, 1024) == base + "h"
    assert kdecode.gluon_lane_form("regs1", 512) == "regs1"  # no lane form: unchanged
    with pytest.raises(ValueError, match="lane_fwht"):
        gluon_decode.GluonVariant("x", lane_fwht=True)  # the butterflies are the fused step's
    monkeypatch.setattr(kdecode, "gluon_default_reason", lambda **kw: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(multi_processor_count=132, major=9, minor=0))
    for batch in (2, 8, 15, 16, 20, 32, 64, 128):
        for key_page, fmt in ((False, dict(k_group=32, v_group=32)), (True, dict(k_group=16, v_group=64))):
            for bits in (2, 4):
                t = kdecode._launch_tuning(batch, 8, 128, 128, group=4, bits=bits, key_page=key_page,
                                           device=torch.device("cuda"), **fmt)
                assert gluon_decode.gluon_variant(t.gluon_variant).lane_fwht == (batch >= 16), (batch, key_page, bits)


def test_the_lane_butterfly_adds_what_the_reference_adds_on_the_cpu():
    """``_fwht_lanes`` (``lane_fwht``: the upper index bits' stages as lane shuffles, here the numpy
    stand-in's shuffle, the partner at the flipped index bit its layout puts on that lane bit) gives
    ``_fwht_rows``'s bits exactly (the same additions in the same order), for the rows it runs on:
    the new token (1 row), the GQA group's query rows (4), the accumulator's padded rows (8, SHIFT 3),
    the write's heads (8); head_dim 64 and 128. A wrong lane mask or sign fails it."""
    G = _numpy_check_module()
    fns = G.kernel_functions({"pid": (0, 0, 0), "grid": (1, 1, 1)})
    rng = np.random.default_rng(42)
    for rows, d, shift in ((1, 128, 0), (4, 128, 0), (8, 128, 3), (8, 128, 0), (1, 64, 0), (4, 64, 0), (8, 64, 3)):
        x = G.T(rng.standard_normal((rows, d)).astype(np.float32) * 7)
        log2d = d.bit_length() - 1
        ref = np.asarray(G._a(fns["_fwht_rows"](x, rows, d, log2d, shift)))
        got = np.asarray(G._a(fns["_fwht_lanes"](x, rows, d, log2d, shift)))
        assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), ref.view(np.int32)), (rows, d, shift)
        # and the transform itself: H x (unnormalized) up to fp32 rounding
        h = np.array([[(-1) ** bin(i & j).count("1") for j in range(d)] for i in range(d)], np.float64)
        xs = np.asarray(G._a(x), np.float64)
        if shift == 0:
            np.testing.assert_allclose(got, xs @ h.T, rtol=1e-5, atol=1e-4)


def test_the_gluon_default_shares_the_sealed_tiles_where_its_last_wave_would_be_partial(monkeypatch):
    """``gluon_share_rule`` on an H100 / H200's 132 SMs, requests at 8 KV heads: the Gluon default's
    grid (``splits + 1`` programs per pair) fits whole waves of 16 resident programs, or its last wave
    holds at most ``GLUON_SHARE_MIN_TAIL`` of the slots (16 requests: 64 of 2112, 3.0 %; measured
    faster than the open share there), and the default variant runs; from a last wave of 6.1 %
    (20 requests) the open-share variant runs at the one-wave split count, in both formats, and the
    backend's workspace (``decode_num_splits``) is sized for that count. The share variants read
    what the defaults read (same checks) and differ from them only by ``open_share``."""
    import dataclasses

    for share, base in ((kdecode.GLUON_DEFAULT_SHARE_VARIANT, kdecode.GLUON_DEFAULT_VARIANT),
                        (kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT, kdecode.GLUON_DEFAULT_PAGE_VARIANT)):
        v, b = gluon_decode.gluon_variant(share), gluon_decode.gluon_variant(base)
        assert v.open_share and dataclasses.replace(v, name=base, open_share=False) == b
    gluon_decode.check_gluon_key_page(kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT)
    gluon_decode.check_gluon_key_groups(kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT, block_n=32, k_group=16)
    monkeypatch.setattr(kdecode, "gluon_default_reason", lambda **kw: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(multi_processor_count=132, major=9, minor=0))
    slots = 132 * kdecode.GLUON_RESIDENT
    unshared = (3, 4, 8, 12, 14, 16, 18, 22, 24, 25, 30)  # last wave empty, or <= 5 % of the slots
    shared = (2, 20, 32, 40, 48, 56, 64, 72, 96, 100, 128)
    for batch in unshared + shared:
        waves = 16.0 if batch * 8 < 512 else None
        n = kdecode.pick_num_splits(batch, 8, waves=waves, resident=kdecode.GLUON_RESIDENT)
        tail = batch * 8 * (n + 1) / slots % 1
        assert kdecode.gluon_share_rule(batch, 8, waves=waves, resident=kdecode.GLUON_RESIDENT) == (batch in shared)
        assert (tail > kdecode.GLUON_SHARE_MIN_TAIL) == (batch in shared), (batch, tail)
        for key_page, fmt in ((False, dict(k_group=32, v_group=32)), (True, dict(k_group=16, v_group=64))):
            t = kdecode._launch_tuning(batch, 8, 128, 128, group=4, bits=2, key_page=key_page,
                                       device=torch.device("cuda"), **fmt)
            want = ((kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT if key_page else kdecode.GLUON_DEFAULT_SHARE_VARIANT)
                    if batch in shared else
                    (kdecode.GLUON_DEFAULT_PAGE_VARIANT if key_page else kdecode.GLUON_DEFAULT_VARIANT))
            want = kdecode.gluon_lane_form(want, batch * 8)
            assert (t.gluon_variant, t.fit) == (want, batch in shared), (batch, key_page)
            layer = types.SimpleNamespace(bits=2, k_ranges=object() if key_page else None, **fmt)
            splits = kdecode.decode_num_splits(batch, 8, 128, 128, layer=layer, num_q_heads=32, device="cuda")
            if batch in shared:  # every program of the launch in one wave
                assert splits == kdecode.pick_num_splits(batch, 8, resident=kdecode.GLUON_RESIDENT, fit=True)
                assert batch * 8 * (splits + 1) <= slots
                # (2 requests: the one-wave count, 131, is capped at pick_num_splits' 128)
                assert slots < batch * 8 * (splits + 2) or splits == 128
            else:
                assert splits == n
    # the split counts the H200 runs measured (benches/results/kernels_gluon_s32/share/)
    assert [kdecode.pick_num_splits(b, 8, resident=16, fit=True) for b in (20, 32, 48, 64, 96, 128)] == [12, 7, 4, 3, 1, 1]


@gpu
@needs_gluon
def test_the_default_decode_takes_the_gluon_step_from_64_pairs(monkeypatch, nan_empty):
    """8 requests at 8 KV heads (64 pairs) on an sm_90 GPU: the launcher's own choice is the Gluon
    step (``GLUON_DEFAULT_VARIANT``, bit-identical to asking for it), for the paper format, and for
    page-grid key ranges (``GLUON_DEFAULT_PAGE_VARIANT`` on ``GLUON_DEFAULT_PAGE_BLOCK_N``-token tiles)
    at the bit widths ``GLUON_DEFAULT_PAGE_BITS`` names (INT2 and INT4; else the Triton step), where
    it agrees with the fused Triton step; with OSCAR_SGL_GLUON_DECODE=0 the fused Triton step
    (bit-identical to the explicit Triton tuning)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon default is taken on sm_90 only")
    monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV, raising=False)
    lens = (300, 97, 1000, 64, 129, 500, 257, 33)
    cfg = OscarConfig(bits=2, page_size=128)
    _, out_default = _step_with_write(cfg, gluon=None, lens=lens)
    _, out_gluon = _step_with_write(cfg, gluon=True, lens=lens, tune=dict(gluon_variant=kdecode.GLUON_DEFAULT_VARIANT))
    _, out_triton = _step_with_write(cfg, gluon=False, lens=lens)
    assert torch.equal(out_default, out_gluon)
    assert not torch.equal(out_default, out_triton)
    assert rel_rms(out_default, out_triton) < _bound(kdecode.GLUON_DEFAULT_VARIANT, 2, 1e-3)
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "0")
    _, out_off = _step_with_write(cfg, gluon=None, lens=lens)
    assert torch.equal(out_off, out_triton)
    monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV)
    for bits in (2, 4):
        page_cfg = _OscarConfig(bits=bits, page_size=128, **INT2_FORMAT)  # page-grid ranges, G_K 16, G_V 64
        _, out_page = _step_with_write(page_cfg, gluon=None, lens=lens)
        _, out_page_triton = _step_with_write(page_cfg, gluon=False, lens=lens)
        if bits in kdecode.GLUON_DEFAULT_PAGE_BITS:  # the Gluon default (32-token tiles: two key groups each)
            tune = dict(gluon_variant=kdecode.GLUON_DEFAULT_PAGE_VARIANT, block_n=kdecode.GLUON_DEFAULT_PAGE_BLOCK_N)
            _, out_page_expected = _step_with_write(page_cfg, gluon=True, lens=lens, tune=tune)
            err = rel_rms(out_page, out_page_triton)
            assert err < _bound(kdecode.GLUON_DEFAULT_PAGE_VARIANT, bits, 1e-3), (bits, err)
        else:
            out_page_expected = out_page_triton
        assert torch.equal(out_page, out_page_expected), bits
        monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "0")
        _, out_page_off = _step_with_write(page_cfg, gluon=None, lens=lens)
        assert torch.equal(out_page_off, out_page_triton), bits
        monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV)


@gpu
@needs_gluon
@pytest.mark.parametrize("bits,batch,key_page", [(2, 64, False), (4, 96, False), (2, 32, True), (4, 16, False),
                                                 (2, 2, False), (4, 3, True), (2, 3, False)])
def test_the_default_decode_picks_its_gluon_variant_and_split_count_by_waves(bits, batch, key_page, monkeypatch,
                                                                             nan_empty):
    """2, 3, 16, 32, 64 and 96 requests at 8 KV heads (16-768 pairs) on an sm_90 GPU: the launcher's
    own choice is the Gluon step, from 512 pairs balanced over whole waves of ``GLUON_RESIDENT``
    programs per SM; where that grid's last wave would be a partial one (``gluon_share_rule``: on 132
    SMs at 2, 32, 64 and 96 requests, not at 3 and 16) the open-share variant at the one-wave split
    count; at INT2 within ``GLUON_SPLIT_WRITE_PAIRS`` (32 and 64 requests here) the write as a launch of
    its own, the stage 1 its programmatic dependent. The split count
    ``decode_num_splits(..., layer=...)`` reports (what the backend sizes its graph workspace with) is
    the one it runs; the output is bit-identical to asking for that tuning and agrees with the fused
    Triton step; the paper format and the server's (page-grid key ranges)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon default is taken on sm_90 only")
    monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV, raising=False)
    gen = torch.Generator().manual_seed(batch)
    lens = tuple(int(x) for x in torch.randint(2, 1500, (batch,), generator=gen))
    cfg = _OscarConfig(bits=bits, page_size=128, **INT2_FORMAT) if key_page else OscarConfig(bits=bits, page_size=128)
    h, d, p = 8, 128, 128
    pool, out_default = _step_with_write(cfg, gluon=None, lens=lens)
    tune = kdecode._launch_tuning(batch, h, d, p, group=4, bits=bits, k_group=cfg.k_group, v_group=cfg.v_group,
                                  key_page=key_page, device=torch.device("cuda"))
    waves = kdecode._default_tuning(batch, h, d, p).waves
    share = kdecode.gluon_share_rule(batch, h, waves=waves, resident=kdecode.GLUON_RESIDENT)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert share == (batch not in (3, 16))
    base = kdecode.GLUON_DEFAULT_PAGE_VARIANT if key_page else kdecode.GLUON_DEFAULT_VARIANT
    shared = kdecode.GLUON_DEFAULT_PAGE_SHARE_VARIANT if key_page else kdecode.GLUON_DEFAULT_SHARE_VARIANT
    want = kdecode.gluon_lane_form(shared if share else base, batch * h)
    assert tune.gluon and tune.gluon_variant == want and tune.fit == share
    assert tune.waves == waves and tune.resident == kdecode.GLUON_RESIDENT
    splits = kdecode.decode_num_splits(batch, h, d, p, layer=pool.layer, num_q_heads=4 * h, device=torch.device("cuda"))
    assert splits == kdecode.pick_num_splits(batch, h, waves=waves, resident=kdecode.GLUON_RESIDENT, fit=share)
    lo, hi = kdecode.GLUON_SPLIT_WRITE_PAIRS
    split = bits in kdecode.GLUON_SPLIT_WRITE_BITS and lo <= batch * h <= hi
    assert tune.split_write == tune.split_pdl == split and not tune.split_rotation
    explicit = dict(gluon_variant=tune.gluon_variant, resident=kdecode.GLUON_RESIDENT, fit=share, block_n=tune.block_n,
                    split_write=split, split_pdl=split)
    _, out_explicit = _step_with_write(cfg, gluon=True, lens=lens, tune=explicit)
    _, out_split = _step_with_write(cfg, gluon=True, lens=lens, tune={**explicit, "fit": False, "num_splits": splits})
    _, out_triton = _step_with_write(cfg, gluon=False, lens=lens)
    assert torch.equal(out_default, out_explicit) and torch.equal(out_default, out_split)
    assert not torch.isnan(out_default).any()
    err = rel_rms(out_default.float(), out_triton.float())
    # the lean INT2 default's rounding (LEAN_BOUND; H100, session 28: 6.8e-3 at 64 requests, INT2)
    assert err < _bound(tune.gluon_variant, bits, 1e-3), \
        f"default ({tune.gluon_variant}, {splits} splits) vs Triton step: relative RMS {err:.2e}"


@pytest.mark.skipif(gluon_decode.GLUON_IMPORT_ERROR is not None,
                    reason=f"triton.experimental.gluon does not import here: {gluon_decode.GLUON_IMPORT_ERROR}")
@needs_interpreter
@pytest.mark.parametrize("bits,fmt,long_min,variant", [(2, None, 250, ""), (4, None, 1, ""), (2, "page", 250, ""),
                                                       (4, None, 10**6, "dnp_r128fslwnkv"),
                                                       (2, "page", 250, "dnp_r128fslwnpb"),
                                                       (2, None, 250, "dnp_r128fslwnkb"),
                                                       (2, "page", 250, "dnp_r128fslwnpbh"),
                                                       (4, None, 250, "dnp_r128fslwnkbh")])
def test_long_requests_take_a_gluon_launch_of_their_own_on_the_cpu(bits, fmt, long_min, variant):
    """``_DecodeTuning.long_gluon``: the launcher's step (its own code; the Gluon launch's source in
    the numpy stand-in, the Triton stage 1 and the merge in the interpreter) hands the requests of at
    least ``long_min`` tokens to a Gluon launch at another split count than the Triton one's, in one
    workspace: the long requests' outputs are the Gluon step's, the short ones' the Triton step's
    (1e-6: the merge's block is wider), the staged keys and values the Triton step's bits; every
    request on either side (long_min 1 and 10**6), both formats, the default (lane) and plain forms,
    and the forms with the next tile's lines prefetched into L2 (kernels_s48), plain and lane (kernels_s49)."""
    same, err_long, err_short, splits = _numpy_check_module().check_dual(
        bits, variant, long_min, fmt=INT2_FORMAT if fmt else None, lens=(300, 1000, 97, 64))
    assert same, "the dual step staged other bits than the Triton step's"
    assert splits[0] != splits[1], splits
    assert err_long < 1e-6, f"long requests vs the Gluon step: relative RMS {err_long:.2e}"
    assert err_short < 1e-6, f"short requests vs the Triton step: relative RMS {err_short:.2e}"


def test_long_gluon_refuses_what_it_cannot_run(nan_empty):
    """``long_gluon`` names what it does not take before any launch: a negative or non-integer token
    count, with the Gluon stage 1 itself (``gluon``), an unfused long variant, an unknown one; the
    two-count merge refuses the rotated-basis merge and a short count outside the rows."""
    cfg = OscarConfig(bits=2, page_size=128)
    pool = build_pool(cfg, h=2, d=128, p=128, lens=[300, 40], device=torch.device("cpu"), seed=3)
    q = torch.randn(2, 8, 128).bfloat16()
    for tune, err, match in ((dict(long_gluon=-1), ValueError, "token count"),
                             (dict(long_gluon=2.5), ValueError, "token count"),
                             (dict(long_gluon=100, gluon=True), ValueError, "Triton stage 1 only"),
                             (dict(long_gluon=100, long_variant="regs1"), ValueError, "fused Gluon variant"),
                             (dict(long_gluon=100, long_variant="nope"), ValueError, "nope")):
        gluon = tune.pop("gluon", False)
        with pytest.raises(err, match=match):
            _decode(pool, q, gluon=gluon, tune=tune)
    part_o = torch.zeros(1, 4, 9, 128)
    part_lse = torch.zeros(1, 4, 9)
    lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="n_short"):
        kdecode.merge_launch(part_o, part_lse, torch.empty(1, 4, 128), dual=(lens, 3, 10))
    with pytest.raises(ValueError, match="rotated-basis"):
        kdecode.merge_launch(part_o, part_lse, torch.empty(1, 4, 128), rotation=True, dual=(lens, 3, 4))


def test_single_requests_hand_long_ones_to_the_gluon_stage_1(monkeypatch):
    """The launcher's rule (with ``LONG_GLUON_TOKENS`` set): below the Gluon default's pairs (a
    single request at 8 KV heads) where the Gluon stage 1 can run (sm_90, Triton 3.6's Gluon, a
    format and shape it reads), the Triton
    stage 1 with ``spread_open`` keeps the requests shorter than ``LONG_GLUON_TOKENS`` and hands the
    others to a Gluon launch at ``long_waves`` programs per SM (197 splits on 132 SMs); the
    workspace holds the larger count (``decode_num_splits``). Not with OSCAR_SGL_GLUON_DECODE=0,
    elsewhere than sm_90, nor at head_dim 256; from 16 pairs the Gluon default as before."""
    monkeypatch.delenv(kdecode.GLUON_DEFAULT_ENV, raising=False)
    monkeypatch.setattr(gluon_decode, "gluon_available", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=132, major=9, minor=0))
    if not kdecode.LONG_GLUON_TOKENS:  # off until timed on a GPU (its docstring): the rule as it would run
        monkeypatch.setattr(kdecode, "LONG_GLUON_TOKENS", 65536)
    for key_page, fmt in ((False, dict(k_group=32, v_group=32)), (True, dict(k_group=16, v_group=64))):
        for bits in (2, 4):
            t = kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=bits, key_page=key_page,
                                       device=torch.device("cuda"), **fmt)
            assert not t.gluon and t.spread_open == kdecode.SPREAD_OPEN, (key_page, bits)
            assert t.long_gluon == kdecode.LONG_GLUON_TOKENS and t.long_variant == "" and t.long_waves == 12.0
            assert kdecode.pick_num_splits(1, 8, waves=t.waves) == 128
            assert kdecode.long_gluon_splits(t, 1, 8) == 197 == kdecode.tuning_num_splits(t, 1, 8)
            layer = types.SimpleNamespace(bits=bits, k_ranges=object() if key_page else None, **fmt)
            assert kdecode.decode_num_splits(1, 8, 128, 128, layer=layer, num_q_heads=32, device="cuda") == 197
            t2 = kdecode._launch_tuning(2, 8, 128, 128, group=4, bits=bits, key_page=key_page,
                                        device=torch.device("cuda"), **fmt)
            assert t2.gluon and t2.long_gluon == 0
    t = kdecode._launch_tuning(1, 8, 256, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                               device=torch.device("cuda"))
    assert t.long_gluon == 0  # head_dim 256: the Gluon stage 1 does not read it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    t = kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                               device=torch.device("cuda"))
    assert t.long_gluon == 0 and t.spread_open == kdecode.SPREAD_OPEN
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "0")
    t = kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                               device=torch.device("cuda"))
    assert t.long_gluon == 0
    monkeypatch.setenv(kdecode.GLUON_DEFAULT_ENV, "1")
    monkeypatch.setattr(kdecode, "LONG_GLUON_TOKENS", 0)
    t = kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                               device=torch.device("cuda"))
    assert t.long_gluon == 0 and kdecode.tuning_num_splits(t, 1, 8) == 128


@gpu
@needs_gluon
@pytest.mark.parametrize("bits,key_page", [(2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("prefetch_next", ["", "b", "bh"])
def test_long_gluon_step_equals_each_launch_alone(bits, key_page, prefetch_next, nan_empty):
    """``long_gluon`` on the GPU (the Gluon launch a programmatic dependent of the Triton one): the
    requests of at least 1000 tokens get the output of the Gluon step alone at the same split count,
    the others that of the Triton step alone (separate merge), both within 1e-6 (the merge's wider
    block); the staged new tokens are the Triton step's bits (the padding request's token nowhere).
    With the default long variant, and (``prefetch_next``) with the format's form that prefetches the
    next tile's lines into L2 (kernels_s48: the faster one timed alone; "bh": its lane form, kernels_s49)."""
    cfg = _OscarConfig(bits=bits, page_size=128, **INT2_FORMAT) if key_page else OscarConfig(bits=bits, page_size=128)
    lens = (3000, 300, 1500, 999, 64)
    long_variant = f"dnp_r128fslwn{'p' if key_page else 'k'}{prefetch_next}" if prefetch_next else ""
    dual = dict(long_gluon=1000, long_waves=24.0, long_variant=long_variant)
    a, out_dual = _step_with_write(cfg, gluon=False, lens=lens, tune=dual)
    b, out_tri = _step_with_write(cfg, gluon=False, lens=lens, tune=dict(fused_merge=False))
    variant = long_variant or kdecode.gluon_lane_form(
        kdecode.GLUON_DEFAULT_PAGE_VARIANT if key_page else kdecode.GLUON_DEFAULT_VARIANT, kdecode.GLUON_LANE_FWHT_PAIRS)
    t = dataclasses.replace(kdecode._default_tuning(len(lens), 8, 128, 128), **dual)
    _, out_glu = _step_with_write(cfg, gluon=True, lens=lens, tune=dict(
        gluon_variant=variant, waves=24.0, resident=kdecode.GLUON_RESIDENT, fused_merge=False,
        block_n=kdecode.gluon_block_n(32, cfg.k_group, key_page)))
    assert kdecode.long_gluon_splits(t, len(lens), 8) != kdecode.pick_num_splits(len(lens), 8, waves=t.waves)
    long = torch.tensor([n >= 1000 for n in lens[:-1]] + [False], device="cuda")
    assert rel_rms(out_dual[long], out_glu[long]) < 1e-6
    assert rel_rms(out_dual[~long], out_tri[~long]) < 1e-6
    assert torch.equal(a.layer.staging_k.view(torch.int16), b.layer.staging_k.view(torch.int16))
    assert torch.equal(a.layer.staging_v.view(torch.int16), b.layer.staging_v.view(torch.int16))


@gpu
@needs_gluon
@pytest.mark.parametrize("bits", [2, 4])
def test_long_gluon_replays_across_its_threshold_from_one_cuda_graph(bits, nan_empty):
    """One CUDA graph of a ``long_gluon`` step serves both sides of its threshold: captured with every
    request short, replayed for a step where the first request reaches ``long_gluon`` tokens (and a
    step back below it), it gives what eager launches give (outputs and staged bytes): the choice is
    the device's, per request."""
    tuning = dataclasses.replace(kdecode._default_tuning(3, 8, 128, 128), long_gluon=1002, long_waves=24.0)
    ws = kdecode.decode_workspace(3, 32, 8, 128, kdecode.tuning_num_splits(tuning, 3, 8), "cuda")

    def step(pool, q, **kw):
        return oscar_decode_attention(q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr,
                                      kv_page_indices=pool.kv_page_indices, seq_lens=pool.seq_lens,
                                      sm_scale=1.0 / math.sqrt(128), _tuning=tuning, **kw)

    # request 0 at 1001 tokens (short), 1002 (long), 1001 again
    check_graph_replays(OscarConfig(bits=bits, page_size=128), [1000, 300, 129], [1, 2, 1], step,
                        lambda pool, q, **kw: step(pool, q, workspace=ws, **kw), seed=22)


@pytest.mark.parametrize("bits", [2, 4])
def test_long_gluon_leaves_sliding_window_layers_on_the_triton_stage_1(bits, nan_empty):
    """A sliding-window layer under a ``long_gluon`` tuning (a hybrid model's local layers at one batch
    size): every request stays on the Triton stage 1 (no Gluon launch: the window bounds the tiles),
    at the Triton split count inside the workspace sized for the Gluon one, and the output is the
    Triton step's with the same window (1e-6: the merge reads rows of the larger count)."""
    cfg = OscarConfig(bits=bits, page_size=128)
    lens = [700, 300, 129]
    pool = build_pool(cfg, h=2, d=128, p=128, lens=lens, device=torch.device(DEVICE), seed=31 + bits)
    q = torch.randn(3, 8, 128, generator=torch.Generator().manual_seed(bits)).bfloat16().to(DEVICE)
    tune = dataclasses.replace(kdecode._default_tuning(3, 2, 128, 128), long_gluon=1, long_waves=40.0)
    n = kdecode.tuning_num_splits(tune, 3, 2)
    assert n > kdecode.pick_num_splits(3, 2, waves=tune.waves)
    kw = dict(q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
              seq_lens=pool.seq_lens, sm_scale=1.0 / math.sqrt(128), window_left=200)
    out = oscar_decode_attention(**kw, out=torch.full(q.shape, float("nan"), device=DEVICE), _tuning=tune,
                                 workspace=kdecode.decode_workspace(3, 8, 2, 128, n, DEVICE))
    ref = oscar_decode_attention(**kw, out=torch.full(q.shape, float("nan"), device=DEVICE),
                                 _tuning=dataclasses.replace(tune, long_gluon=0, fused_merge=False))
    assert rel_rms(out, ref) < 1e-6
