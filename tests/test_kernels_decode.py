"""Decode attention over sealed INT2/INT4 pages plus the open BF16 page, against the torch reference."""

from __future__ import annotations

import math

import pytest
import torch
from test_kernels_support import ATTN_BOUND_BF16_OUT, ATTN_BOUND_FP32_OUT, DEVICE, build_pool, gpu, needs_cuda, reference_decode, rel_rms

from oscar_sgl import reference as R
from oscar_sgl.config import OscarConfig
from oscar_sgl.kernels import oscar_decode_attention, oscar_write_kv

# bits x head_dim x GQA ratio, page sizes cycling through 32 / 64 / 128
_GRID = [(b, d, g) for b in (2, 4) for d in (64, 128, 256) for g in (1, 3, 4, 8)]
CASES = [(b, d, g, (32, 64, 128)[i % 3]) for i, (b, d, g) in enumerate(_GRID)]


def _lens(p: int) -> list[int]:
    # length 1, one below / at / one above a page boundary (the 4th request's full last page is
    # sealed, the 3rd's is still open), and several pages with a partial open page
    return [1, p - 1, p, p, p + 1, 2 * p + 3]


def _decode(pool, q, *, out=None, **kw):
    return oscar_decode_attention(
        q=q, **pool.pool_kwargs(), kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
        seq_lens=pool.seq_lens, sm_scale=1.0 / math.sqrt(q.shape[-1]), out=out, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("bits,d,group,p", CASES)
def test_decode_matches_reference(bits, d, group, p, nan_empty):
    h = 2 if d < 256 else 1
    cfg = OscarConfig(bits=bits, residual=p)
    pool = build_pool(cfg, h=h, d=d, p=p, lens=_lens(p), last_sealed={3}, seed=bits * 100 + d + group)
    q = torch.randn(len(_lens(p)), h * group, d).bfloat16().to(DEVICE)
    out = torch.full(q.shape, float("nan"), device=DEVICE)
    _decode(pool, q, out=out, num_splits=2)
    err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(d)))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_decode_bf16_output_and_default_splits(nan_empty):
    cfg = OscarConfig(bits=2, residual=64)
    pool = build_pool(cfg, h=2, d=128, p=64, lens=_lens(64), last_sealed={3}, seed=1)
    q = torch.randn(6, 8, 128).bfloat16().to(DEVICE)
    out = _decode(pool, q)  # allocated (NaN-poisoned by the fixture), dtype of q
    assert out.dtype == torch.bfloat16
    err = rel_rms(out, reference_decode(pool, q, 1.0 / math.sqrt(128)))
    assert err < ATTN_BOUND_BF16_OUT, f"relative RMS {err:.2e}"


def test_decode_split_count_does_not_change_the_result(nan_empty):
    cfg = OscarConfig(bits=4, residual=32)
    pool = build_pool(cfg, h=1, d=64, p=32, lens=[5 * 32 + 7, 3, 64], last_sealed={2}, seed=2)
    q = torch.randn(3, 4, 64).bfloat16().to(DEVICE)
    outs = [_decode(pool, q, out=torch.empty(q.shape, device=DEVICE), num_splits=n) for n in (1, 3, 8)]
    # probabilities are rounded to fp16 against each split's running max, so different splits
    # round differently: agreement at the fp16 level, far below the reference bound
    for o in outs[1:]:
        assert rel_rms(o, outs[0]) < 1e-3


@pytest.mark.parametrize("bits", [2, 4])
def test_decode_constant_and_zero_groups(bits, nan_empty):
    """All-zero and constant pages, constant channels/groups: finite and still the reference."""
    cfg = OscarConfig(bits=bits, residual=32)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[70, 64, 40], kinds={0: "zero", 1: "constant", 2: "mixed"}, last_sealed={1}, seed=3)
    q = torch.randn(3, 4, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), num_splits=2)
    ref = reference_decode(pool, q, 1.0 / 8)
    assert torch.isfinite(ref).all()
    err = rel_rms(out, ref)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("method,scope", [("kivi", "layer"), ("rotation-only", "layer"), ("scaling-only", "head"), ("oscar", "head")])
def test_decode_ablations(method, scope, nan_empty):
    cfg = OscarConfig.for_method(method, bits=2, residual=32, norm_scope=scope)
    pool = build_pool(cfg, h=2, d=64, p=32, lens=[100, 31, 64], last_sealed={2}, seed=4)
    q = torch.randn(3, 6, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), num_splits=2)
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("bits,k_group,v_group,p,block_n", [(2, 64, 64, 64, 32), (4, 128, 32, 128, 64), (2, 32, 16, 64, 64), (4, 32, 64, 128, 128)])
def test_decode_group_sizes_and_tiles(bits, k_group, v_group, p, block_n, nan_empty):
    """Key groups larger and smaller than the tile, value groups of 16..64 channels."""
    cfg = OscarConfig(bits=bits, k_group=k_group, v_group=v_group, residual=p)
    pool = build_pool(cfg, h=1, d=64, p=p, lens=[3 * p + 5, p], last_sealed={1}, seed=20 + k_group + v_group)
    q = torch.randn(2, 4, 64).bfloat16().to(DEVICE)
    out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), num_splits=2, block_n=block_n)
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_decode_after_write_with_fused_query_rotation(nan_empty):
    """One decode step as the backend runs it: the write launch stages the new token and rotates
    the query; decode reads the rotated query; then compare with the reference."""
    cfg = OscarConfig(bits=2, residual=32)
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
        k=k_new.to(DEVICE), v=v_new.to(DEVICE), loc=loc, page_to_staging=pool.page_to_staging,
        staging_k=pool.staging_k, staging_v=pool.staging_v, staging_scale=pool.staging_scale, q=q.to(DEVICE),
    )  # fmt: skip
    out = _decode(pool, q.to(DEVICE), out=torch.empty(q.shape, device=DEVICE), q_rot=q_rot, num_splits=2)
    for b in range(2):
        # the reference takes its tail in the model basis: the staged BF16 values, rotated back
        k_staged = R.hadamard(k_new[b].float()).bfloat16().float()  # [H, D]
        v_staged = R.hadamard(v_new[b].float()).bfloat16().float()
        pool.k_tail[b] = torch.cat([pool.k_tail[b], R.hadamard(k_staged)[:, None]], dim=1)
        pool.v_tail[b] = torch.cat([pool.v_tail[b], R.hadamard(v_staged)[:, None]], dim=1)
    err = rel_rms(out, reference_decode(pool, q, 1.0 / 8))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_decode_cuda_graph_shape_does_not_depend_on_lengths(nan_empty):
    """Same launch (batch, splits, workspace) serves other lengths: nothing about lengths is baked in."""
    cfg = OscarConfig(bits=2, residual=32)
    for seed, lens in ((6, [33, 1]), (7, [200, 64])):
        pool = build_pool(cfg, h=1, d=64, p=32, lens=lens, seed=seed)
        q = torch.randn(2, 2, 64).bfloat16().to(DEVICE)
        ws = (torch.empty(2, 2, 4, 64, device=DEVICE), torch.empty(2, 2, 4, device=DEVICE))
        out = _decode(pool, q, out=torch.empty(q.shape, device=DEVICE), num_splits=3, workspace=ws)
        assert rel_rms(out, reference_decode(pool, q, 1.0 / 8)) < ATTN_BOUND_FP32_OUT


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("block_n,num_warps", [(32, 4), (64, 4), (64, 2)])
def test_decode_gpu_real_sizes(bits, block_n, num_warps, nan_empty):
    """Llama-3.1-8B attention shape on CUDA with the inline-PTX dequantization."""
    p, h, g, d = 128, 8, 4, 128
    cfg = OscarConfig(bits=bits, residual=p)
    lens = [4096 + 77, 128, 1, 8192, 129, 3 * 128]
    pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, last_sealed={1, 5}, kinds={4: "mixed"}, device=torch.device("cuda"), seed=8)
    q = torch.randn(len(lens), h * g, d).bfloat16().cuda()
    ref = reference_decode(pool, q, 1.0 / math.sqrt(d))
    out = _decode(pool, q, out=torch.empty(q.shape, device="cuda"), block_n=block_n, num_warps=num_warps)
    err = rel_rms(out, ref)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"
    out16 = _decode(pool, q, block_n=block_n, num_warps=num_warps)
    assert rel_rms(out16, ref) < ATTN_BOUND_BF16_OUT
