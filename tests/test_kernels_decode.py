"""Decode attention over sealed INT2/INT4 pages plus the open BF16 page, against the torch reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from support.kernel_data import (ATTN_BOUND_BF16_OUT, ATTN_BOUND_FP32_OUT, DEVICE, build_pool, check_graph_replays,
                                 default_decode_bound, gpu, needs_cuda, reference_decode, rel_rms)

from oscar_sgl import reference as R
from oscar_sgl.config import PAPER_FORMAT, OscarConfig, OscarConfigError
from oscar_sgl.kernels import decode as kdecode
from oscar_sgl.kernels import decode_num_splits, decode_workspace, oscar_decode_attention, oscar_write_kv

# bits x head_dim x GQA ratio, page sizes cycling through 32 / 64 / 128
_GRID = [(b, d, g) for b in (2, 4) for d in (64, 128, 256) for g in (1, 3, 4, 8)]
CASES = [(b, d, g, (32, 64, 128)[i % 3]) for i, (b, d, g) in enumerate(_GRID)]


def _lens(p: int) -> list[int]:
    # length 1, one below / at / one above a page boundary (the 4th request's full last page is
    # sealed, the 3rd's is still open), and several pages with a partial open page
    return [1, p - 1, p, p, p + 1, 2 * p + 3]


def _decode(pool, q, *, out=None, tune=None, **kw):
    """One decode launch over ``pool``; ``tune``: fields of the launcher's default ``_DecodeTuning``
    to override (``num_splits``, ``block_n``, ``transposed``, ...); ``kw`` may replace ``layer``."""
    tuning = None
    if tune:
        b, hq, d = q.shape
        h, p = pool.layer.staging_k.shape[1], pool.layer.staging_k.shape[2]
        tuning = dataclasses.replace(kdecode._default_tuning(b, h, d, p), **tune)
    return oscar_decode_attention(
        q=q, kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
        seq_lens=pool.seq_lens, sm_scale=1.0 / math.sqrt(q.shape[-1]), out=out, _tuning=tuning, **{**pool.pool_kwargs(), **kw},
    )  # fmt: skip


@pytest.mark.parametrize("bits,d,group,p", CASES)
def test_decode_matches_reference(bits, d, group, p, nan_empty):
    h = 2 if d < 256 else 1
    # INT2: the default (page-grid) format, and the paper's at half the GQA ratios
    cfg = OscarConfig(bits=bits, page_size=p, **(PAPER_FORMAT if bits == 2 and group in (1, 4) else {}))
    pool = build_pool(cfg, h=h, d=d, p=p, lens=_lens(p), last_sealed={3}, seed=bits * 100 + d + group)
    q = torch.randn(len(_lens(p)), h * group, d).bfloat16().to(DEVICE)
    out = torch.full(q.shape, float("nan"), device=DEVICE)
    _decode(pool, q, out=out, tune=dict(num_splits=2))
    err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(d)))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_decode_bf16_output_and_default_splits(nan_empty):
    cfg = OscarConfig(bits=2, page_size=64)
    pool = build_pool(cfg, h=2, d=128, p=64, lens=_lens(64), last_sealed={3}, seed=1)
    q = torch.randn(6, 8, 128).bfloat16().to(DEVICE)
    out = _decode(pool, q)  # allocated (NaN-poisoned by the fixture), dtype of q
    assert out.dtype == torch.bfloat16
    err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(128)))
    assert err < ATTN_BOUND_BF16_OUT, f"relative RMS {err:.2e}"


def test_decode_split_count_does_not_change_the_result(nan_empty):
    cfg = OscarConfig(bits=4, page_size=32)
    pool = build_pool(cfg, h=1, d=64, p=32, lens=[5 * 32 + 7, 3, 64], last_sealed={2}, seed=2)
    q = torch.randn(3, 4, 64).bfloat16().to(DEVICE)
    outs = [_decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=n)) for n in (1, 3, 8)]
    # probabilities are rounded to fp16 against each split's running max, so different splits
    # round differently: agreement at the fp16 level, far below the reference bound
    for o in outs[1:]:
        assert rel_rms(o, outs[0]) < 1e-3


@pytest.mark.parametrize("bits", [2, 4])
def test_decode_constant_and_zero_groups(bits, nan_empty):
    """All-zero and constant pages, constant channels/groups: finite and still the reference."""
    cfg = OscarConfig(bits=bits, page_size=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[70, 64, 40], kinds={0: "zero", 1: "constant", 2: "mixed"}, last_sealed={1}, seed=3)
    q = torch.randn(3, 4, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=2))
    ref = reference_decode(pool, q, 1.0 / 8)
    assert torch.isfinite(ref).all()
    err = rel_rms(out, ref)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("method,scope", [("kivi", "layer"), ("rotation-only", "layer"), ("scaling-only", "head"), ("oscar", "head")])
def test_decode_ablations(method, scope, nan_empty):
    cfg = OscarConfig.for_method(method, bits=2, page_size=32, norm_scope=scope)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[100, 31, 64], last_sealed={2}, seed=4)
    q = torch.randn(3, 6, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=2))
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("bits,k_group,v_group,p,block_n", [(2, 64, 64, 64, 32), (4, 128, 32, 128, 64), (2, 32, 16, 64, 64), (4, 32, 64, 128, 128)])
def test_decode_group_sizes_and_tiles(bits, k_group, v_group, p, block_n, nan_empty):
    """Key groups larger and smaller than the tile, value groups of 16..64 channels."""
    cfg = OscarConfig(bits=bits, k_group=k_group, v_group=v_group, page_size=p)
    pool = build_pool(cfg, h=1, d=64, p=p, lens=[3 * p + 5, p], last_sealed={1}, seed=20 + k_group + v_group)
    q = torch.randn(2, 4, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=2, block_n=block_n))
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("bits,k_group,v_group,p,block_n,transposed",
                         [(2, 16, 64, 64, 32, True), (4, 16, 32, 32, 16, False), (2, 32, 64, 64, 64, False), (2, 16, 16, 32, 16, True)])
def test_decode_page_key_ranges(bits, k_group, v_group, p, block_n, transposed, nan_empty):
    """Page-grid key ranges (key_ranges="page"): the key params made in the kernel from each page's
    grid and the groups' indices, tiles of one and several key groups, both stage-1 forms and a
    window; a Gluon variant that loads fp16 key params (``regs1``, the opt-in default) refuses them,
    naming the variants that read them (test_kernels_decode_gluon.py runs those)."""
    cfg = OscarConfig(bits=bits, k_group=k_group, v_group=v_group, page_size=p, key_ranges="page")
    pool = build_pool(cfg, h=2, d=64, p=p, lens=[3 * p + 5, p, 1], last_sealed={1}, kinds={0: "mixed"},
                      seed=40 + k_group + v_group)
    q = torch.randn(3, 8, 64).bfloat16().to(DEVICE)
    for window in (None, p + 7):
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), window_left=window,
                      tune=dict(num_splits=2, block_n=block_n, transposed=transposed))
        err = rel_rms(out, reference_decode(pool, q, 1.0 / 8, window_left=window))
        assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e} (window {window})"
    with pytest.raises(ValueError, match="Gluon variant 'regs1' reads fp16 key params only; page-grid key ranges .* "
                                         "without a TMA ring: dnp_r128fsw"):
        _decode(pool, q, tune=dict(gluon=True))


@pytest.mark.parametrize("bits,d,group", [(2, 64, 4), (4, 64, 1), (2, 128, 8), (4, 64, 3), (2, 64, 16)])
def test_decode_transposed_and_plain_forms(bits, d, group, nan_empty):
    """The transposed form (tokens as the M side of the products, query heads padded to 8 columns,
    register double-buffered loop: the default up to head_dim 128) and the plain form (query heads
    as rows, the default above): the reference, and each other up to fp16 rounding, for one split
    (long loops: the prefetch of a tile's next page, the masked prefetch past the end) and several
    (empty splits)."""
    p = 32
    cfg = OscarConfig(bits=bits, page_size=p)
    pool = build_pool(cfg, h=2, d=d, p=p, lens=[1, p + 1, 5 * p + 3, 2 * p], last_sealed={3}, seed=30 + bits + group)
    q = torch.randn(4, 2 * group, d).bfloat16().to(DEVICE)
    ref = reference_decode(pool, q, 1.0 / math.sqrt(d))
    for splits in (1, 3):
        plain = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=splits, block_n=16, transposed=False))
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=splits, block_n=16, transposed=True))
        assert rel_rms(out, ref) < ATTN_BOUND_FP32_OUT
        assert rel_rms(out, plain) < 1e-3


@pytest.mark.parametrize("bits,group,block_n", [(2, 4, 16), (4, 3, 32)])
def test_decode_rising_logits_rescale_the_running_sums(bits, group, block_n, nan_empty):
    """Logits that keep growing along the sequence and then jump by more than fp16 can hold
    unrescaled (2^36): the running max moves tile after tile and every split's acc / l are rescaled
    on the way; the transposed form gives the reference and the plain form."""
    p = 32
    cfg = OscarConfig(bits=bits, page_size=p)
    pool = build_pool(cfg, h=1, d=64, p=p, lens=[9 * p + 5, 4 * p], kinds={0: "rising", 1: "rising"}, last_sealed={1}, seed=40 + bits)
    q = torch.randn(2, group, 64, generator=torch.Generator().manual_seed(bits)).bfloat16().to(DEVICE)
    ref = reference_decode(pool, q, 1.0 / 8)
    for splits in (1, 2):
        plain = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=splits, block_n=block_n, transposed=False))
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=splits, block_n=block_n, transposed=True))
        assert rel_rms(out, ref) < ATTN_BOUND_FP32_OUT
        assert rel_rms(out, plain) < 1e-3


def test_decode_after_write_with_fused_query_rotation(nan_empty):
    """One decode step as the backend runs it: the write launch stages the new token and rotates
    the query; decode reads the rotated query; then compare with the reference."""
    cfg = OscarConfig(bits=2, page_size=32)
    p, h, d, g = 32, 2, 64, 4
    lens = [40, 96]  # the new token is the last one of each request
    pool = build_pool(cfg, h=h, d=d, p=p, lens=[n - 1 for n in lens], seed=5)
    # give each request room for its new token on its (open) last page
    pool.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    last_pages = [int(pool.kv_page_indices[int(pool.kv_indptr[b + 1]) - 1]) for b in range(2)]
    k_new = torch.randn(2, h, d).bfloat16()
    v_new = torch.randn(2, h, d).bfloat16()
    q = torch.randn(2, h * g, d).bfloat16()
    loc = torch.tensor([pg * p + (n - 1) % p for pg, n in zip(last_pages, lens)], device=DEVICE)
    q_rot = oscar_write_kv(
        k=k_new.to(DEVICE), v=v_new.to(DEVICE), loc=loc, page_to_staging=pool.layer.page_to_staging,
        staging_k=pool.layer.staging_k, staging_v=pool.layer.staging_v, staging_scale=pool.staging_scale, q=q.to(DEVICE),
    )  # fmt: skip
    out = _decode(pool, q.to(DEVICE), out=torch.empty(q.shape, device=DEVICE), q_rot=q_rot, tune=dict(num_splits=2))
    for b in range(2):
        # the reference takes its tail in the model basis: the staged BF16 values, rotated back
        k_staged = R.hadamard(k_new[b].float()).bfloat16().float()  # [H, D]
        v_staged = R.hadamard(v_new[b].float()).bfloat16().float()
        pool.k_tail[b] = torch.cat([pool.k_tail[b], R.hadamard(k_staged)[:, None]], dim=1)
        pool.v_tail[b] = torch.cat([pool.v_tail[b], R.hadamard(v_staged)[:, None]], dim=1)
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("method,scope", [("oscar", "layer"), ("oscar", "head"), ("kivi", "layer")])
def test_decode_fused_write_equals_the_write_launch(method, scope, nan_empty):
    """The decode launch with the write fused (new_k/new_v/new_loc, query rotation in-kernel,
    merge in-kernel) stages exactly the bytes the separate write launch stages, skips a padding
    request (page 0, mapped to -1), and gives the same attention as write launch + decode."""
    cfg = OscarConfig.for_method(method, bits=2, page_size=32, norm_scope=scope)
    p, h, d, g = 32, 2, 64, 4
    lens = [40, 96, 64]  # request 2 is a padding row: its token goes to page 0
    pools = [build_pool(cfg, h=h, d=d, p=p, lens=[n - 1 for n in lens], seed=9) for _ in range(2)]
    gen = torch.Generator().manual_seed(10)
    k_new = torch.randn(3, h, d, generator=gen).bfloat16().to(DEVICE)
    v_new = torch.randn(3, h, d, generator=gen).bfloat16().to(DEVICE)
    q = torch.randn(3, h * g, d, generator=gen).bfloat16().to(DEVICE)
    outs = []
    for fused, pool in zip((False, True), pools):
        pool.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        last = [int(pool.kv_page_indices[int(pool.kv_indptr[b + 1]) - 1]) for b in range(3)]
        loc = torch.tensor([last[0] * p + 39 % p, last[1] * p + 95 % p, 0 * p + 5], device=DEVICE)
        out = torch.full(q.shape, float("nan"), device=DEVICE)
        if fused:
            _decode(pool, q, out=out, new_k=k_new, new_v=v_new, new_loc=loc, staging_scale=pool.staging_scale,
                    tune=dict(num_splits=2, fused_merge=True))
        else:
            q_rot = oscar_write_kv(k=k_new, v=v_new, loc=loc, page_to_staging=pool.layer.page_to_staging,
                                   staging_k=pool.layer.staging_k, staging_v=pool.layer.staging_v,
                                   staging_scale=pool.staging_scale, q=q, rotation=cfg.rotation)
            _decode(pool, q, out=out, q_rot=q_rot, tune=dict(num_splits=2, fused_merge=False))
        outs.append(out)
    a, b = pools
    assert torch.equal(a.layer.staging_k.view(torch.int16), b.layer.staging_k.view(torch.int16))
    assert torch.equal(a.layer.staging_v.view(torch.int16), b.layer.staging_v.view(torch.int16))
    if a.staging_scale is not None:
        torch.testing.assert_close(a.staging_scale, b.staging_scale, rtol=2e-7, atol=0)
    assert rel_rms(outs[1][:2], outs[0][:2]) < 1e-6


@pytest.mark.parametrize("bits,group,flags", [(2, 4, (True, False)), (4, 3, (False, True)), (2, 1, (False, False))])
def test_decode_with_a_per_head_key_rotation_plan(bits, group, flags, nan_empty):
    """A layer whose key-rotation plan (`reference.key_rotation_plan`) rotates some heads' keys
    and not others, or none (a layer stored as KIVI: no token scale, values unrotated): the fused
    launch (write, query rotation, attention, merge) and the write launch + decode both give the
    reference, and stage the same bytes."""
    cfg = OscarConfig(bits=bits, page_size=32)
    p, h, d = 32, 2, 64
    lens = [40, 96, 30]  # the new token lands on each request's open last page
    pools = [build_pool(cfg, h=h, d=d, p=p, lens=[n - 1 for n in lens], seed=40 + bits, key_rotated=flags) for _ in range(2)]
    assert (pools[0].layer.key_rotated is None) == (not any(flags) or all(flags))
    assert (pools[0].layer.scale is None) == (not any(flags))
    gen = torch.Generator().manual_seed(41)
    k_new = torch.randn(3, h, d, generator=gen).bfloat16()
    v_new = torch.randn(3, h, d, generator=gen).bfloat16()
    q = torch.randn(3, h * group, d, generator=gen).bfloat16()
    outs = []
    for fused, pool in zip((False, True), pools):
        pool.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        last = [int(pool.kv_page_indices[int(pool.kv_indptr[b + 1]) - 1]) for b in range(3)]
        loc = torch.tensor([pg * p + (n - 1) % p for pg, n in zip(last, lens)], device=DEVICE)
        out = torch.full(q.shape, float("nan"), device=DEVICE)
        kw = dict(new_k=k_new.to(DEVICE), new_v=v_new.to(DEVICE), new_loc=loc, staging_scale=pool.staging_scale)
        if fused:
            _decode(pool, q.to(DEVICE), out=out, **kw, tune=dict(num_splits=2, fused_merge=True))
        else:
            q_rot = oscar_write_kv(k=kw["new_k"], v=kw["new_v"], loc=loc, page_to_staging=pool.layer.page_to_staging,
                                   staging_k=pool.layer.staging_k, staging_v=pool.layer.staging_v,
                                   staging_scale=pool.staging_scale, q=q.to(DEVICE), rotation=pool.layer.rotation,
                                   key_rotated=pool.layer.key_rotated)
            _decode(pool, q.to(DEVICE), out=out, q_rot=q_rot, tune=dict(num_splits=2, fused_merge=False))
        outs.append(out)
    a, b = pools
    assert torch.equal(a.layer.staging_k.view(torch.int16), b.layer.staging_k.view(torch.int16))
    assert torch.equal(a.layer.staging_v.view(torch.int16), b.layer.staging_v.view(torch.int16))
    assert rel_rms(outs[1], outs[0]) < 1e-6
    # the reference takes its tail in the model basis: the staged BF16 values, rotated back
    for i in range(3):
        k_st = R.rotate_keys(k_new[i][:, None].float(), cfg, flags).bfloat16().float()
        v_st = (R.hadamard(v_new[i][:, None].float()) if any(flags) else v_new[i][:, None].float()).bfloat16().float()
        a.k_tail[i] = torch.cat([a.k_tail[i], R.rotate_keys(k_st, cfg, flags)], dim=1)
        a.v_tail[i] = torch.cat([a.v_tail[i], R.hadamard(v_st) if any(flags) else v_st], dim=1)
    err = rel_rms(outs[1], reference_decode(a, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"
    # the plan matters: the same pool read as if every head's keys were rotated is another answer
    if any(flags) and not all(flags):
        wrong = _decode(a, q.to(DEVICE), out=torch.empty(q.shape, device=DEVICE),
                        layer=dataclasses.replace(a.layer, key_rotated=None), tune=dict(num_splits=2))
        assert rel_rms(wrong, outs[1]) > 0.05


@pytest.mark.parametrize("bits,d,group,p,splits", [(2, 64, 4, 32, 2), (4, 64, 3, 64, 3), (2, 256, 2, 32, 2)])
def test_decode_sliding_window(bits, d, group, p, splits, nan_empty):
    """A sliding-window layer (``window_left``): the query at position n - 1 sees positions
    n - 1 - window_left .. n - 1 only. Windows inside the open page, across sealed pages, on a tile
    boundary and past the start; the transposed (head_dim 64) and plain (256) forms; a request
    whose last page is sealed (the packed last-page path); and the same launch without the window
    is another answer. (The Gluon stage 1's windows: tests/test_kernels_decode_gluon.py.)"""
    h = 2 if d < 256 else 1
    # INT2: the default (page-grid) format, and the paper's at half the GQA ratios
    cfg = OscarConfig(bits=bits, page_size=p, **(PAPER_FORMAT if bits == 2 and group in (1, 4) else {}))
    lens = [1, p - 1, 3 * p, 2 * p + 3, 4 * p + 5]
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed={2}, seed=7 * bits + d)
    q = torch.randn(len(lens), h * group, d).bfloat16().to(DEVICE)
    full = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=splits))
    for window in (0, 5, p - 1, p + 7, 2 * p, 10 * p):
        out = torch.full(q.shape, float("nan"), device=DEVICE)
        _decode(pool, q, out=out, window_left=window, tune=dict(num_splits=splits))
        want = reference_decode(pool, q, 1.0 / math.sqrt(d), window_left=window)
        err = rel_rms(out, want)
        assert err < ATTN_BOUND_FP32_OUT, f"window {window}: relative RMS {err:.2e}"
        if window < 2 * p:
            assert rel_rms(full[2:], out[2:]) > 0.05, f"window {window} changed nothing"
        else:
            assert rel_rms(full[:2], out[:2]) < 1e-6
    with pytest.raises(TypeError, match="window_left must be an int"):
        _decode(pool, q, window_left=4.0)


def test_decode_refuses_bad_key_rotation_flags(nan_empty):
    cfg = OscarConfig(bits=2, page_size=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[40], seed=42)
    q = torch.randn(1, 4, 64).bfloat16().to(DEVICE)
    for bad in (torch.ones(3, dtype=torch.int32), torch.ones(2, dtype=torch.bool)):
        with pytest.raises(ValueError, match="key_rotated must be"):
            _decode(pool, q, layer=dataclasses.replace(pool.layer, key_rotated=bad.to(DEVICE)))


@pytest.mark.parametrize("merge_chunk", [None, "splits", 1, 4, 16])
def test_decode_fused_merge_leaves_counters_zero_and_matches_the_merge_launch(nan_empty, merge_chunk):
    """Replays reuse the workspace: the in-kernel merge must leave every counter at zero, and it
    must give the separate merge launch's result, at any merge chunk (the default's, fixed for
    every split count; the split count's; chunks smaller and larger than the 6 partials)."""
    cfg = OscarConfig(bits=4, page_size=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[7 * 32 + 5, 1, 64], last_sealed={2}, seed=11)
    q = torch.randn(3, 6, 64).bfloat16().to(DEVICE)
    ws = decode_workspace(3, 6, 2, 64, 5, DEVICE)
    ref = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=5, fused_merge=False))
    for _ in range(2):
        # the workspace sets the split count (5)
        out = _decode(pool, q, out=torch.full(q.shape, float("nan"), device=DEVICE), workspace=ws,
                      tune=dict(fused_merge=True, merge_chunk=merge_chunk))
        assert int(ws[2].abs().sum()) == 0
        assert rel_rms(out, ref) < 1e-6


def test_decode_cuda_graph_shape_does_not_depend_on_lengths(nan_empty):
    """Same launch (batch, splits, workspace) serves other lengths: nothing about lengths is baked in."""
    cfg = OscarConfig(bits=2, page_size=32)
    for seed, lens in ((6, [33, 1]), (7, [200, 64])):
        pool = build_pool(cfg, h=1, d=64, p=32, lens=lens, seed=seed)
        q = torch.randn(2, 2, 64).bfloat16().to(DEVICE)
        ws = decode_workspace(2, 2, 1, 64, 3, DEVICE)
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), workspace=ws)
        assert rel_rms(out, reference_decode(pool, q, 1.0 / 8)) < ATTN_BOUND_FP32_OUT


def test_decode_num_splits_sizes_the_default_workspace(nan_empty):
    """``decode_num_splits`` is the split count of a launch without a workspace: a workspace sized
    with it (what a CUDA-graph caller keeps) gives the same bytes out."""
    cfg = OscarConfig(bits=2, page_size=32)
    b, h, g, d, p = 4, 2, 2, 64, 32
    pool = build_pool(cfg, h=h, d=d, p=p, lens=[3 * p + 7, 40, 1, 2 * p], last_sealed={3}, seed=14)
    q = torch.randn(b, h * g, d).bfloat16().to(DEVICE)
    ws = decode_workspace(b, h * g, h, d, decode_num_splits(b, h, d, p), DEVICE)
    eager = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE))
    kept = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), workspace=ws)
    assert torch.equal(eager, kept)
    assert rel_rms(eager, reference_decode(pool, q, 1.0 / 8)) < ATTN_BOUND_FP32_OUT


def test_tuning_num_splits_sizes_a_fixed_split_count_workspace(nan_empty):
    """A tuning whose ``num_splits`` is set (``tuning_ab.py``'s ``num_splits=``) launches that many
    splits whatever the default: ``tuning_num_splits`` sizes its workspace for them, so a workspace
    made that way takes the launch (it was the default's, too small above it), with the same output
    as the launch without a workspace."""
    cfg = OscarConfig(bits=2, page_size=32)
    b, h, g, d, p = 2, 2, 2, 64, 32
    pool = build_pool(cfg, h=h, d=d, p=p, lens=[5 * p + 3, 2 * p], seed=16)
    q = torch.randn(b, h * g, d).bfloat16().to(DEVICE)
    base = kdecode._default_tuning(b, h, d, p)
    default = kdecode.tuning_num_splits(base, b, h)
    fixed = dataclasses.replace(base, num_splits=default + 3)
    assert kdecode.tuning_num_splits(fixed, b, h) == default + 3
    ws = decode_workspace(b, h * g, h, d, kdecode.tuning_num_splits(fixed, b, h), DEVICE)
    eager = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=default + 3))
    kept = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), workspace=ws, tune=dict(num_splits=default + 3))
    assert torch.equal(eager, kept)
    small = decode_workspace(b, h * g, h, d, default, DEVICE)
    with pytest.raises(ValueError, match="workspace partial_out must be"):
        _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), workspace=small, tune=dict(num_splits=default + 3))


def test_decode_refuses_unsupported_shapes():
    """The configuration rules come from ``oscar_sgl.supported`` (one message wherever they fail);
    a tile of a tuning override that does not fit the page is a ValueError of its own."""
    cfg = OscarConfig(bits=2, page_size=32)
    pool = build_pool(cfg, h=1, d=64, p=32, lens=[40], seed=15)
    q = torch.randn(1, 2, 64).bfloat16().to(DEVICE)
    kw = dict(kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices, seq_lens=pool.seq_lens, sm_scale=0.125)
    with pytest.raises(OscarConfigError, match="^--oscar-v-group must be a multiple of 16 at 2 bits on the OScaR kernels, got 8$"):
        oscar_decode_attention(q=q, layer=dataclasses.replace(pool.layer, v_group=8), **kw)
    with pytest.raises(OscarConfigError, match="--oscar-k-group must be a power of two >= 16"):
        oscar_decode_attention(q=q, layer=dataclasses.replace(pool.layer, k_group=8), **kw)
    with pytest.raises(ValueError, match="block_n=48"):
        _decode(pool, q, tune=dict(block_n=48))


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("block_n,transposed", [(32, True), (64, False), (None, None)])
def test_decode_gpu_page_key_ranges(bits, block_n, transposed, nan_empty):
    """Page-grid key ranges at the Llama-3.1-8B attention shape (G_K = 16, G_V = 128), compiled."""
    p, h, g, d = 128, 8, 4, 128
    cfg = OscarConfig(bits=bits, page_size=p, k_group=16, v_group=128, key_ranges="page", offset="min", clip="values")
    lens = [4096 + 77, 128, 1, 2048, 129]
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed={1}, kinds={4: "mixed"}, device=torch.device("cuda"), seed=9)
    q = torch.randn(len(lens), h * g, d).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(d))
    tune = None if block_n is None else dict(block_n=block_n, transposed=transposed)
    out = _decode(pool, q, out=torch.empty(q.shape, device="cuda"), tune=tune)
    err = rel_rms(out, ref)
    # the default (None): on sm_90 the Gluon page default, lean at INT2 (its own bound)
    assert err < (ATTN_BOUND_FP32_OUT if tune else default_decode_bound(bits, cfg=cfg)), f"relative RMS {err:.2e}"


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize(
    "block_n,num_warps,transposed",
    [(32, 4, False), (64, 4, False), (64, 2, False), (32, 1, False), (32, 1, True), (64, 2, True), (16, 1, True), (None, None, None)],
)
def test_decode_gpu_real_sizes(bits, block_n, num_warps, transposed, nan_empty):
    """Llama-3.1-8B attention shape on CUDA with the inline-PTX dequantization, both stage-1 forms
    at several tiles and warps, and the default (None)."""
    p, h, g, d = 128, 8, 4, 128
    cfg = OscarConfig(bits=bits, page_size=p)
    lens = [4096 + 77, 128, 1, 8192, 129, 3 * 128]
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed={1, 5}, kinds={4: "mixed"}, device=torch.device("cuda"), seed=8)
    q = torch.randn(len(lens), h * g, d).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(d))
    tune = None if block_n is None else dict(block_n=block_n, num_warps=num_warps, transposed=transposed)
    out = _decode(pool, q, out=torch.empty(q.shape, device="cuda"), tune=tune)
    err = rel_rms(out, ref)
    # the default (None): INT2 stores page-grid key ranges (config.INT2_FORMAT), which on sm_90 take
    # the Gluon page default, lean at INT2 (its own bound)
    assert err < (ATTN_BOUND_FP32_OUT if tune else default_decode_bound(bits, cfg=cfg)), f"relative RMS {err:.2e}"
    out16 = _decode(pool, q, tune=tune)
    assert rel_rms(out16, ref) < ATTN_BOUND_BF16_OUT


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
def test_decode_gpu_per_head_key_rotation_plan(bits, nan_empty):
    """Real sizes (8 KV heads x 128, GQA 4, 128-token pages), the default launch (query rotation
    fused; 64 pairs: the Gluon default on sm_90, lean at INT2): a plan rotating five of the eight
    heads' keys gives the reference."""
    flags = (True, False, True, True, False, True, True, False)
    cfg = OscarConfig(bits=bits, page_size=128)
    lens = [1, 127, 128, 129, 3000, 9000, 257, 64]
    pool = build_pool(cfg, h=8, d=128, p=128, lens=lens, last_sealed={2}, seed=60 + bits, key_rotated=flags)
    q = torch.randn(len(lens), 32, 128).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.full(q.shape, float("nan"), device=DEVICE))
    err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(128)))
    assert err < default_decode_bound(bits, cfg=cfg), f"relative RMS {err:.2e}"


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
def test_decode_fused_launch_replays_from_a_cuda_graph(bits, nan_empty):
    """The backend's decode launch (query rotation, write, attention, merge) captured once in a CUDA
    graph and replayed for two consecutive steps with new lengths, slots, tokens and queries in the
    captured buffers gives what eager launches give: outputs and staged bytes."""
    ws = decode_workspace(3, 8 * 4, 8, 128, 7, "cuda")
    check_graph_replays(OscarConfig(bits=bits, page_size=128), [1000, 300, 129], [1, 2],
                        lambda pool, q, **kw: _decode(pool, q, tune=dict(num_splits=7), **kw),
                        lambda pool, q, **kw: _decode(pool, q, workspace=ws, tune=dict(fused_merge=True), **kw))
    assert int(ws[2].abs().sum()) == 0


@pytest.mark.parametrize("bits", [2, 4])
def test_merge_one_pass_equals_the_chunked_merge_with_many_empty_splits(bits, nan_empty):
    """``merge_one_pass``: the separate merge reading all log-sum-exps in one load and the non-empty
    splits' rows in another gives the chunked merge's output to fp32 rounding (another summation
    order), within the reference's bound, with most splits empty (short requests over 70 splits,
    over two 64-partial chunks of the chunked merge), a request with one sealed tile and an empty
    one; the fused stage-1 merge ignores it; the rotated-basis merge and more than
    ``ONE_PASS_MAX_PARTS`` partials are refused by name."""
    cfg = OscarConfig(bits=bits, page_size=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[5 * 32 + 7, 32 + 3, 9, 12 * 32], last_sealed={3}, seed=61)
    q = torch.randn(4, 8, 64).bfloat16().to(DEVICE)
    # one stage 1 (the launcher, merge_one_pass on), then the chunked merge launch over its partials
    workspace = kdecode.decode_workspace(4, 8, 2, 64, 70, DEVICE)
    one = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), workspace=workspace,
                  tune=dict(num_splits=70, fused_merge=False, merge_one_pass=True))
    part_o, part_lse = workspace[0], workspace[1]
    assert part_o.shape[2] == 71 and torch.isinf(part_lse).float().mean() > 0.5  # most partials empty
    chunked = torch.empty(q.shape, device=DEVICE)
    kdecode.merge_launch(part_o, part_lse, chunked)
    assert torch.allclose(one, chunked, rtol=1e-5, atol=1e-6), (one - chunked).abs().max()
    assert rel_rms(one, reference_decode(pool, q, 1.0 / 8)) < ATTN_BOUND_FP32_OUT
    # the fused merge (in the last stage-1 program) does not take it: the same output either way
    fused = dict(num_splits=4, fused_merge=True)
    assert torch.equal(_decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(fused, merge_one_pass=True)),
                       _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=fused))
    part_o = torch.zeros(1, 2, kdecode.ONE_PASS_MAX_PARTS + 1, 64, device=DEVICE)
    part_lse = torch.full(part_o.shape[:3], float("-inf"), device=DEVICE)
    with pytest.raises(ValueError, match="merge_one_pass.*257"):
        kdecode.merge_launch(part_o, part_lse, torch.empty(1, 2, 64, device=DEVICE), one_pass=True)
    with pytest.raises(ValueError, match="merge_one_pass.*rotation"):
        kdecode.merge_launch(part_o[:, :, :8], part_lse[:, :, :8], torch.empty(1, 2, 64, device=DEVICE), rotation=True,
                             one_pass=True)


def test_the_launcher_merges_in_one_pass_from_many_partials_on(nan_empty, monkeypatch):
    """``merge_one_pass`` None (the launcher's default): the separate merge runs in one pass from
    ``MERGE_ONE_PASS_PARTS`` partials per (request, query head) to ``ONE_PASS_MAX_PARTS``, never in
    the rotated basis; the launch passes that choice to its merge launch, and its output is the forced
    arm's, bit for bit, on both sides of the threshold."""
    taken = []
    real_merge = kdecode.merge_launch

    def recording_merge(*args, **kwargs):
        taken.append(kwargs.get("one_pass"))
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(kdecode, "merge_launch", recording_merge)
    lo, hi = kdecode.MERGE_ONE_PASS_PARTS, kdecode.ONE_PASS_MAX_PARTS
    assert [kdecode.merge_one_pass_default(n) for n in (2, lo - 1, lo, hi, hi + 1)] == [False, False, True, True, False]
    assert not kdecode.merge_one_pass_default(lo, rotation=True)
    assert kdecode._DecodeTuning(block_n=32, block_t=32, num_warps=1, transposed=True, waves=None).merge_one_pass is None
    pool = build_pool(OscarConfig(bits=2, page_size=32), h=1, d=64, p=32, lens=[5 * 32 + 7], seed=62)
    q = torch.randn(1, 4, 64).bfloat16().to(DEVICE)
    for splits, one_pass in ((lo - 2, False), (lo - 1, True)):  # splits + 1 partials
        arms = [_decode(pool, q, out=torch.empty(q.shape, device=DEVICE),
                        tune=dict(num_splits=splits, fused_merge=False, merge_one_pass=flag)) for flag in (None, one_pass)]
        assert torch.equal(arms[0], arms[1]), splits
        assert taken[-2:] == [one_pass, one_pass], (splits, taken)


def test_merge_pdl_runs_where_grid_dependency_control_does_and_is_refused_elsewhere(nan_empty, monkeypatch):
    """``_DecodeTuning.merge_pdl`` (the separate merge launch as a programmatic dependent of stage 1):
    the launcher takes it on sm_90+ outside the interpreter (``merge_pdl_reason`` None) with the Gluon
    stage 1, never with the Triton one, on a CPU or on an older GPU; asked for where it cannot run, the launch is refused with a ValueError naming it
    before any kernel runs; where it can, the output is the plain merge launch's, bit for bit."""
    cfg = OscarConfig(bits=2, page_size=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[6 * 32 + 3, 40], seed=31)
    q = torch.randn(2, 8, 64).bfloat16().to(DEVICE)
    plain = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=4, fused_merge=False))
    reason = kdecode.merge_pdl_reason(DEVICE)
    if reason is None:
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=4, fused_merge=False, merge_pdl=True))
        assert torch.equal(out, plain)
    else:
        with pytest.raises(ValueError, match="merge_pdl"):
            _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(num_splits=4, fused_merge=False, merge_pdl=True))
    assert rel_rms(plain, reference_decode(pool, q, 1.0 / 8)) < ATTN_BOUND_FP32_OUT
    # the rule: why not, by device and capability (the interpreter, a CPU, sm_80); sm_90 and sm_100 allow it
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in kdecode.merge_pdl_reason(torch.device("cuda"), capability=(9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "CUDA" in kdecode.merge_pdl_reason(torch.device("cpu"))
    assert "sm_80" in kdecode.merge_pdl_reason(torch.device("cuda"), capability=(8, 0))
    if kdecode.gdc_wait is not None:  # a Triton with grid dependency control
        assert kdecode.merge_pdl_reason(torch.device("cuda"), capability=(9, 0)) is None
        assert kdecode.merge_pdl_reason(torch.device("cuda"), capability=(10, 0)) is None
    tune = kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                                  device=torch.device("cpu"))
    assert not tune.merge_pdl
    # where it may run: with the Gluon stage 1 (as on an H100 / H200 at 2-128 requests), not the Triton one
    monkeypatch.setattr(kdecode, "merge_pdl_reason", lambda device, capability=None: None)
    assert not kdecode._launch_tuning(1, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                                      device=torch.device("cpu")).merge_pdl
    monkeypatch.setattr(kdecode, "gluon_default_reason", lambda **kw: None)
    for batch in (1, 8, 200):
        t = kdecode._launch_tuning(batch, 8, 128, 128, group=4, bits=2, k_group=32, v_group=32, key_page=False,
                                   device=torch.device("cpu"))
        assert t.gluon and t.merge_pdl == kdecode.MERGE_PDL


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("gluon", [False, True])
def test_decode_merge_as_a_dependent_launch_equals_the_plain_merge_in_graphs(bits, gluon, nan_empty):
    """Real sizes (8 KV heads, GQA 4, head_dim 128, a 9000-token request beside short ones), the Triton
    stage 1 and the Gluon default's: the separate merge as a programmatic dependent launch
    (``merge_pdl``) gives the plain merge launch's output bit for bit (which is within the
    reference's bound), eagerly and from a CUDA graph replayed with new queries and lengths, and it
    is what the launcher runs on sm_90 with the Gluon stage 1."""
    from oscar_sgl.kernels import gluon_decode

    dev = torch.device("cuda")
    reason = kdecode.merge_pdl_reason(dev) or (gluon_decode.gluon_available(dev) if gluon else None)
    if reason is not None:
        pytest.skip(reason)
    p, h, g, d = 128, 8, 4, 128
    cfg = OscarConfig(bits=bits, page_size=p)  # INT2: the server's page-grid key ranges; INT4: the paper's groups
    lens = [9000, 300, 1]
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, device=dev, seed=21)
    base = dict(num_splits=24, fused_merge=False)
    if gluon:
        page = cfg.key_ranges == "page"
        base.update(gluon=True, gluon_variant=kdecode.GLUON_DEFAULT_PAGE_VARIANT if page else kdecode.GLUON_DEFAULT_VARIANT,
                    block_n=kdecode.gluon_block_n(32, cfg.k_group, page))
    gen = torch.Generator(device="cuda").manual_seed(22)
    qs = [torch.randn(3, h * g, d, device="cuda", generator=gen).bfloat16() for _ in range(2)]
    len_sets = [lens, [8990, 290, 1]]  # the second step: shorter, within the same pages
    plain = []
    for q, n in zip(qs, len_sets):
        pool.seq_lens = torch.tensor(n, dtype=torch.int32, device="cuda")
        plain.append(_decode(pool, q, out=torch.empty(q.shape, device="cuda"), tune=base))
        out = _decode(pool, q, out=torch.empty(q.shape, device="cuda"), tune=dict(base, merge_pdl=True))
        assert torch.equal(out, plain[-1]) and not torch.isnan(out).any()
    pool.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    bound = default_decode_bound(bits, cfg=cfg) if gluon else ATTN_BOUND_FP32_OUT
    assert rel_rms(plain[0], reference_decode(pool, qs[0], 1.0 / math.sqrt(d))) < bound
    pool.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q_s, out_s = qs[0].clone(), torch.empty(qs[0].shape, device="cuda")
    ws = decode_workspace(3, h * g, h, d, 24, "cuda")
    kw = dict(out=out_s, workspace=ws, tune=dict(base, merge_pdl=True))
    _decode(pool, q_s, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _decode(pool, q_s, **kw)
    for q, n, ref in zip(qs, len_sets, plain):
        q_s.copy_(q)
        pool.seq_lens.copy_(torch.tensor(n, dtype=torch.int32))
        out_s.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_s, ref)
    tune = kdecode._launch_tuning(3, h, d, p, group=g, bits=bits, k_group=cfg.k_group, v_group=cfg.v_group,
                                  key_page=cfg.key_ranges == "page", device=dev)
    assert tune.merge_pdl == (kdecode.MERGE_PDL and tune.gluon)


@pytest.mark.parametrize("bits,transposed", [(2, True), (4, False)])
def test_decode_spread_open_page_over_short_sealed_programs(bits, transposed, nan_empty):
    """``spread_open``: where every sealed program holds at most that many sealed tiles and the last
    page is open, the last sealed programs read the open page's tiles before the new token's and
    the open-page program the last one. Requests of 3 sealed pages + 50 open tokens (three 16-token
    tiles before the last), 1 + 17 (one), 5 tokens (none), and a sealed last page (no spread); at 4
    splits the first two hold 2 and 1 sealed tiles per program: spread at ``spread_open=2``, only the
    second at 1; the output agrees with the plain launch and the reference, with the write fused
    (the new tokens' tile stays with the program that writes it) and with a window (never spread)."""
    cfg = OscarConfig(bits=bits, page_size=64)
    lens = [64 * 3 + 50, 64 + 17, 5, 128]
    pool = build_pool(cfg, h=2, d=64, p=64, lens=lens, last_sealed={3}, seed=41)
    q = torch.randn(4, 8, 64).bfloat16().to(DEVICE)
    base = dict(num_splits=4, block_t=16, transposed=transposed, fused_merge=False)
    plain = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=base)
    ref = reference_decode(pool, q, 1.0 / 8)
    assert rel_rms(plain, ref) < ATTN_BOUND_FP32_OUT
    for spread in (1, 2):
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(base, spread_open=spread))
        # the open tiles' probabilities are rounded to bf16 against another program's running max:
        # agreement at the bf16 level (as other split counts), far below the reference bound
        assert rel_rms(out, plain) < 1e-3, spread
        assert rel_rms(out, ref) < ATTN_BOUND_FP32_OUT, spread
        # requests that do not spread (5 tokens; a sealed last page) take the plain launch's path
        assert torch.equal(out[2:], plain[2:]), spread
        if spread == 1:  # request 0 holds 2 sealed tiles per program: not spread at 1
            assert torch.equal(out[0], plain[0])
        else:  # spread: its open tiles were read by other programs (other roundings)
            assert not torch.equal(out[0], plain[0])
        assert not torch.equal(out[1], plain[1]), spread
    # the write fused: the new token (the last tile's) is staged by the open-page program, which alone
    # reads that tile; same staged bytes, same output as the plain launch at the bf16 level
    wpool = build_pool(cfg, h=2, d=64, p=64, lens=[n - 1 for n in lens[:2]], seed=42)
    wpool.seq_lens = torch.tensor(lens[:2], dtype=torch.int32, device=DEVICE)
    last = [int(wpool.kv_page_indices[int(wpool.kv_indptr[b + 1]) - 1]) for b in range(2)]
    loc = torch.tensor([pg * 64 + (n - 1) % 64 for pg, n in zip(last, lens[:2])], device=DEVICE)
    gen = torch.Generator().manual_seed(43)
    k_new, v_new = (torch.randn(2, 2, 64, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    qw = q[:2].contiguous()
    kw = dict(new_k=k_new, new_v=v_new, new_loc=loc, staging_scale=wpool.staging_scale)
    w_plain = _decode(wpool, qw, out=torch.empty(qw.shape, device=DEVICE), tune=base, **kw)
    staged = wpool.layer.staging_k.clone()
    w_spread = _decode(wpool, qw, out=torch.empty(qw.shape, device=DEVICE), tune=dict(base, spread_open=2), **kw)
    assert torch.equal(wpool.layer.staging_k.view(torch.int16), staged.view(torch.int16))
    assert rel_rms(w_spread, w_plain) < 1e-3 and not torch.equal(w_spread, w_plain)
    # windowed: spread_open is not applied (the launcher passes 0), same output as the plain launch
    win = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=dict(base, spread_open=2), window_left=70)
    assert torch.equal(win, _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), tune=base, window_left=70))
    with pytest.raises(ValueError, match="spread_open"):
        _decode(pool, q, tune=dict(base, spread_open=-1))
    # the launcher's rule: the Triton stage 1 below the Gluon default's pairs (single requests at 8 KV
    # heads) spreads (SPREAD_OPEN, measured in session 37); from 16 pairs on it does not, whichever
    # stage 1 runs there
    fmt = dict(group=4, bits=bits, k_group=cfg.k_group, v_group=cfg.v_group, key_page=cfg.key_ranges == "page",
               device=torch.device("cpu"))
    assert kdecode.SPREAD_OPEN > 0
    for batch, heads, want in ((1, 8, kdecode.SPREAD_OPEN), (5, 3, kdecode.SPREAD_OPEN), (2, 8, 0), (64, 8, 0)):
        tune = kdecode._launch_tuning(batch, heads, 128, 128, **fmt)
        assert not tune.gluon and tune.spread_open == want, (batch, heads)
    # and the default launch of these 4 requests x 2 KV heads takes it: within the reference bound
    default = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE))
    assert rel_rms(default, ref) < ATTN_BOUND_FP32_OUT


def test_balanced_split_count_fills_whole_waves():
    """``pick_num_splits(waves=None)`` (the default from 512 (request, KV head) pairs on): the split
    counts measured best on an H200 (132 SMs; benches/results/kernels_splits_8f465df/splits.md), the
    old count where it was already right, and waves at least 95 % full or the fullest within four."""
    from oscar_sgl.kernels import pick_num_splits

    got = {b: pick_num_splits(b, 8, num_sms=132, waves=None) for b in (64, 67, 72, 96, 128, 256, 512, 4096)}
    assert got == {64: 2, 67: 7, 72: 7, 96: 4, 128: 1, 256: 1, 512: 1, 4096: 1}
    for pairs in range(1, 5000, 7):
        s = pick_num_splits(pairs, 1, num_sms=132, waves=None)
        w = pairs * s / (132 * 8)
        assert s >= 1 and (s == 1 or w <= 4.0)
        fills = [pairs * t / 1056 / math.ceil(pairs * t / 1056) for t in range(1, 129) if t == 1 or pairs * t / 1056 <= 4.0]
        assert w / math.ceil(w) >= min(1 / 1.05, max(fills)) - 1e-9, (pairs, s)
    # The rule by launch size: balanced from 512 pairs on, 16 programs per SM below (unchanged).
    assert kdecode._default_tuning(64, 8, 128, 128).waves is None
    assert kdecode._default_tuning(63, 8, 128, 128).waves == 16.0
    # Without a GPU it counts 8 "SMs" (the interpreter runs programs one after the other).
    if not torch.cuda.is_available():
        assert pick_num_splits(64, 8, waves=None) == 1


def test_fitting_split_count_runs_one_wave():
    """``pick_num_splits(fit=True)``: the most splits whose ``splits + 1`` programs per pair (the
    open-page program of ``GluonVariant.open_share`` takes a sealed share too) fit one wave of the
    SMs' resident programs; the counts session 27 timed on an H100 (132 SMs, 16 Gluon programs per
    SM): 65, 32, 21, 15, 7, 3 splits at 32-512 pairs. At least 1, at most ``max_splits``."""
    from oscar_sgl.kernels import pick_num_splits

    res = kdecode.GLUON_RESIDENT
    got = {b: pick_num_splits(b, 8, num_sms=132, resident=res, fit=True) for b in (4, 8, 12, 16, 32, 64, 128, 4096)}
    assert got == {4: 65, 8: 32, 12: 21, 16: 15, 32: 7, 64: 3, 128: 1, 4096: 1}
    for pairs in range(1, 3000, 7):
        s = pick_num_splits(pairs, 1, num_sms=132, resident=res, fit=True)
        assert s == 1 or pairs * (s + 1) <= 132 * res < pairs * (s + 2) or s == 128, (pairs, s)
    assert pick_num_splits(1, 1, num_sms=132, resident=res, fit=True) == 128
    assert pick_num_splits(1, 1, num_sms=132, resident=res, fit=True, waves=None) == 128  # waves unused
