"""Extend attention: new tokens over a cached (sealed / open) prefix plus themselves, causal."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from support.kernel_data import ATTN_BOUND_FP32_OUT, DEVICE, build_pool, gpu, needs_cuda, rel_rms

from oscar_sgl import reference as R
from oscar_sgl.config import OscarConfig
from oscar_sgl.kernels import extend as kextend
from oscar_sgl.kernels import oscar_extend_attention, oscar_write_kv


def _run(cfg, *, h, group, d, p, cases, device=DEVICE, seed=0, use_write_q=False, tune=None, position=False, return_out=False,
         host_indptr=False, key_rotated=None, window_left=None):
    """cases: (prefix_len, new_tokens) per request. ``tune``: fields of the launcher's default
    ``_ExtendTuning`` to override (``block_m``, ``num_warps``, ``dequantize``). Returns the relative
    RMS error against the reference, with ``return_out`` ``(output, error)``. ``host_indptr``: pass
    ``kv_indptr_host`` as the server does. ``key_rotated``: the layer's key-rotation flags
    (``build_pool``). ``window_left``: a sliding-window layer's window.

    ``position=False`` (``--oscar-prefill exact``): the pool holds the prefix (full pages sealed, a
    partial last page in staging); the new tokens come from the step's own k/v.
    ``position=True``: the pool holds the whole sequence as the server's pool does when attention
    runs (the write and the seals of the step done): every page below the last token's page sealed,
    the page holding the prefix's end also still in staging when the step filled it; the new
    tokens' k/v are the pool's own (BF16)."""
    gen = torch.Generator().manual_seed(seed)
    if position:
        lens = [pre + n for pre, n in cases]
        also = {b: pre // p for b, (pre, n) in enumerate(cases) if pre % p and pre // p < (pre + n - 1) // p}
        pool = build_pool(cfg, h=h, d=d, p=p, lens=lens, device=device, seed=seed, stage_also=also, key_rotated=key_rotated)
    else:
        sealed_last = {b for b, (pre, _) in enumerate(cases) if pre and pre % p == 0}
        pool = build_pool(cfg, h=h, d=d, p=p, lens=[max(pre, 1) for pre, _ in cases], last_sealed=sealed_last,
                          device=device, seed=seed, key_rotated=key_rotated)
    qs, ks, vs, qo = [], [], [], [0]
    for b, (pre, n) in enumerate(cases):
        qs.append(torch.randn(n, h * group, d, generator=gen).bfloat16())
        if position:
            k_raw, v_raw = pool.raw[b]
            ks.append(k_raw[:, pre:].transpose(0, 1).bfloat16().contiguous())
            vs.append(v_raw[:, pre:].transpose(0, 1).bfloat16().contiguous())
        else:
            ks.append(torch.randn(n, h, d, generator=gen).bfloat16())
            vs.append(torch.randn(n, h, d, generator=gen).bfloat16())
        qo.append(qo[-1] + n)
    q, k, v = (torch.cat(x).to(device) for x in (qs, ks, vs))
    out = torch.full(q.shape, float("nan"), device=device)
    q_rot = None
    if use_write_q:
        # the write launch of the step also rotates the queries (staging writes go to page 0, sealed)
        q_rot = oscar_write_kv(
            k=k, v=v, loc=torch.zeros(k.shape[0], dtype=torch.int64, device=device), page_to_staging=pool.layer.page_to_staging,
            staging_k=pool.layer.staging_k, staging_v=pool.layer.staging_v, staging_scale=pool.staging_scale,
            rotation=pool.layer.rotation, q=q, key_rotated=pool.layer.key_rotated,
        )  # fmt: skip
    sm = 1.0 / math.sqrt(d)
    tuning = dataclasses.replace(kextend._default_tuning(h * group, h, d), **tune) if tune else None
    oscar_extend_attention(
        q=q, k=k, v=v, qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device), **pool.pool_kwargs(),
        kv_indptr=pool.kv_indptr, kv_page_indices=pool.kv_page_indices,
        prefix_lens=torch.tensor([pre for pre, _ in cases], dtype=torch.int32, device=device),
        sm_scale=sm, q_rot=q_rot, out=out, position=position, _tuning=tuning,
        kv_indptr_host=pool.kv_indptr.tolist() if host_indptr else None, window_left=window_left,
    )  # fmt: skip
    refs = []
    for b, (pre, n) in enumerate(cases):
        if position:  # codes below each query's own page, its own page exact
            below = (pre + n - 1) // p
            kbs, vbs = pool.k_blocks[b][:below], pool.v_blocks[b][:below]
            _, k_st, v_st = pool.also_staged.get(b, (None, pool.k_tail[b], pool.v_tail[b]))
            k_open, v_open = k_st[:, : pre % p], v_st[:, : pre % p]
            until = [x // p * p for x in range(pre, pre + n)]
        else:  # the prefix as cached, then the step's own tokens, exact
            kbs, vbs, k_open, v_open = pool.prefix(b, pre)
            until = None
        k_exact = torch.cat((k_open, ks[b].float().transpose(0, 1)), dim=1)
        v_exact = torch.cat((v_open, vs[b].float().transpose(0, 1)), dim=1)
        refs.append(R.extend_attention(qs[b].float(), kbs, vbs, k_exact, v_exact, cfg, sm,
                                       exact_from=pre // p * p, sealed_until=until, key_rotated=key_rotated,
                                       window_left=window_left))
    err = rel_rms(out, torch.cat(refs))
    return (out, err) if return_out else err


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("d,group,p", [(64, 1, 32), (128, 4, 64), (64, 3, 32)])
def test_extend_by_position_matches_reference(bits, d, group, p):
    """Each row reads codes below its own page and its own page exactly (the server's default):
    a fresh prompt over several pages; a page-aligned prefix; a prefix ending inside a page that
    the chunk fills (staged and sealed) and crosses two more; a chunk inside the prefix's page;
    one token; a chunk ending on a page boundary."""
    cfg = OscarConfig(bits=bits, page_size=p)
    cases = [(0, 2 * p + 5), (p, p + 3), (p + 13, 2 * p + 1), (p + 3, 7), (2 * p, 1), (5, 2 * p - 5)]
    err = _run(cfg, h=2, group=group, d=d, p=p, cases=cases, seed=bits + d + group + 1, position=True)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("position", [True, False])
@pytest.mark.parametrize("flags,dequantize", [((True, False), True), ((False, True), False), ((False, False), True)])
def test_extend_with_a_per_head_key_rotation_plan(flags, dequantize, position):
    """A layer whose plan rotates some heads' keys, or none (stored as KIVI): both read paths
    (pre-dequantized pages, in registers), both boundaries, the queries rotated by the launcher or
    by the step's write launch."""
    cfg = OscarConfig(bits=2, page_size=32)
    cases = [(0, 70), (32, 35), (45, 20), (5, 1)]
    for use_write_q in (False, True):
        err = _run(cfg, h=2, group=3, d=64, p=32, cases=cases, seed=50 + sum(flags), position=position,
                   tune=dict(dequantize=dequantize), key_rotated=flags, use_write_q=use_write_q and not position)
        assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e} (write launch rotates q: {use_write_q})"


@pytest.mark.parametrize("position", [True, False])
@pytest.mark.parametrize("dequantize,d,group", [(True, 64, 3), (False, 64, 4), (None, 256, 2)])
def test_extend_sliding_window(position, dequantize, d, group):
    """A sliding-window layer (``window_left``): row x sees positions x - window_left .. x only, in
    the sealed pages (pre-dequantized or in registers; pages below every row's window are neither
    dequantized nor read), the open page's staged tokens and the step's own tokens. Windows smaller
    than a page, across pages, on a tile boundary, longer than every sequence; and the window
    changes the answer."""
    p = 32
    cfg = OscarConfig(bits=2, page_size=p)
    cases = [(0, 2 * p + 5), (3 * p + 13, 40), (2 * p, 9), (p + 3, 1), (5, p)]
    kw = dict(h=1 if d == 256 else 2, group=group, d=d, p=p, cases=cases, seed=60 + d, position=position,
              tune=dict(dequantize=dequantize), return_out=True)
    full, _ = _run(cfg, **kw)
    for window in (0, 7, p + 5, 2 * p, 10 * p):
        out, err = _run(cfg, **kw, window_left=window)
        assert err < ATTN_BOUND_FP32_OUT, f"window {window}: relative RMS {err:.2e}"
        if window < 2 * p:
            assert rel_rms(out, full) > 0.05, f"window {window} changed nothing"
        else:
            # a window past every sequence: the same answer (to fp32 rounding: on a GPU the masked
            # kernel is another compilation, 9e-6 measured)
            assert window < 10 * p or rel_rms(out, full) < 1e-4


def test_extend_by_position_row_boundaries_inside_one_program():
    """Rows of one program on both sides of a page boundary (32 tokens per program, pages of 32,
    prefix 20: a boundary after 12 rows), GQA 8, several programs per request."""
    cfg = OscarConfig(bits=2, page_size=32)
    err = _run(cfg, h=1, group=8, d=64, p=32, cases=[(20, 90), (0, 33)], seed=21, position=True,
               tune=dict(block_m=256))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_extend_by_position_is_chunking_invariant():
    """One 100-token sequence in one chunk, in chunks of 40 / 60, and token by token: each token's
    output is the same (what makes the server's answer independent of --chunked-prefill-size)."""
    cfg = OscarConfig(bits=2, page_size=32)
    h, group, d, p, n = 2, 2, 64, 32, 100
    pool = build_pool(cfg, h=h, d=d, p=p, lens=[n], seed=22, stage_also={0: 1})  # page 1: prefix 40 ends in it
    gen = torch.Generator().manual_seed(23)
    q = torch.randn(n, h * group, d, generator=gen).bfloat16().to(DEVICE)
    k_all = pool.raw[0][0].transpose(0, 1).bfloat16().contiguous().to(DEVICE)
    v_all = pool.raw[0][1].transpose(0, 1).bfloat16().contiguous().to(DEVICE)
    sm = 1.0 / math.sqrt(d)

    def chunk(pre, m):
        i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=DEVICE)  # noqa: E731
        return oscar_extend_attention(
            q=q[pre:pre + m].contiguous(), k=k_all[pre:pre + m].contiguous(), v=v_all[pre:pre + m].contiguous(),
            qo_indptr=i32([0, m]), **pool.pool_kwargs(), kv_indptr=pool.kv_indptr,
            kv_page_indices=pool.kv_page_indices, prefix_lens=i32([pre]), sm_scale=sm, position=True,
        )  # fmt: skip

    whole = chunk(0, n)
    # a chunk that starts inside page 1 (tokens 40..99): its prefix's tokens of page 1 come from
    # staging (BF16) where the whole chunk read its own k/v (BF16 too): the same values
    halves = torch.cat((chunk(0, 40), chunk(40, 60)))
    assert torch.equal(whole[:32], halves[:32])  # rows of page 0: the same reads, the same tiles
    assert rel_rms(halves, whole) < 1e-2
    one_by_one = torch.cat([chunk(i, 1) for i in range(96, 100)])
    assert rel_rms(one_by_one, whole[96:]) < 1e-2


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("d,group,p", [(64, 1, 32), (128, 4, 64), (64, 3, 32)])
def test_extend_matches_reference(bits, d, group, p):
    cfg = OscarConfig(bits=bits, page_size=p)
    # --oscar-prefill exact: fresh prompt; a sealed prefix; a sealed + open (partial) prefix; one
    # new token after 2 pages
    cases = [(0, 37), (p, 5), (p + 13, 20), (2 * p, 1), (2 * p, 3)]
    err = _run(cfg, h=2, group=group, d=d, p=p, cases=cases, seed=bits + d + group)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_extend_fresh_prompt_is_exact_attention():
    """No cached prefix: plain causal attention on the BF16 inputs (only fp32 accumulation and the
    bf16 probabilities of the P.V product differ from an fp32 softmax)."""
    cfg = OscarConfig(bits=2, page_size=32)
    err = _run(cfg, h=1, group=4, d=128, p=32, cases=[(0, 50), (0, 1)], seed=9)
    assert err < 3e-3, f"relative RMS {err:.2e}"


@pytest.mark.parametrize("method", ["kivi", "scaling-only"])
def test_extend_ablations(method):
    cfg = OscarConfig.for_method(method, bits=2, page_size=32)
    err = _run(cfg, h=1, group=2, d=64, p=32, cases=[(45, 9), (32, 3)], seed=10, use_write_q=True)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_extend_with_fused_query_rotation():
    cfg = OscarConfig(bits=4, page_size=32)
    err = _run(cfg, h=2, group=2, d=64, p=32, cases=[(70, 6), (0, 4)], seed=11, use_write_q=True)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_extend_tiles_of_several_tokens_per_program():
    """Rows are (token, head) pairs of one KV head: several tokens and heads per program, GQA 8."""
    cfg = OscarConfig(bits=2, page_size=32)
    err = _run(cfg, h=1, group=8, d=64, p=32, cases=[(64, 21), (33, 5)], seed=14, tune=dict(block_m=32))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


def test_extend_rejects_a_block_that_splits_a_query_group():
    cfg = OscarConfig(bits=2, page_size=32)
    with pytest.raises(ValueError, match="multiple of 8"):
        _run(cfg, h=1, group=8, d=64, p=32, cases=[(32, 2)], seed=15, tune=dict(block_m=4))


@pytest.mark.parametrize("position", [True, False])
def test_extend_dequantized_pages_equal_register_dequantization(position):
    """The sealed pages read pre-dequantized from the scratch (the default while it fits) give the
    outputs of dequantizing each tile in registers: the same fp16 operands, products and softmax.
    Mixed requests: fresh, page-aligned and mid-page prefixes, one token."""
    cfg = OscarConfig(bits=2, page_size=32)
    cases = [(0, 70), (32, 33), (45, 20), (64, 1)]
    outs = []
    for dequantize in (True, False):
        outs.append(_run(cfg, h=2, group=4, d=64, p=32, cases=cases, seed=31, position=position,
                         tune=dict(dequantize=dequantize), return_out=True))
    assert torch.equal(outs[0][0], outs[1][0]) or rel_rms(outs[0][0], outs[1][0]) < 1e-5
    assert outs[0][1] < ATTN_BOUND_FP32_OUT and outs[1][1] < ATTN_BOUND_FP32_OUT


@pytest.mark.parametrize("position", [True, False])
@pytest.mark.parametrize("bits,k_group", [(2, 16), (4, 32)])
def test_extend_page_key_ranges(position, bits, k_group):
    """Page-grid key ranges (key_ranges="page"): sealed pages read pre-dequantized and in registers,
    both against the reference, with and without a window."""
    cfg = OscarConfig(bits=bits, page_size=32, k_group=k_group, v_group=64, key_ranges="page", offset="min", clip="values")
    cases = [(0, 40), (32, 33), (45, 20), (96, 1)]
    for window in (None, 40):
        outs = []
        for dequantize in (True, False):
            outs.append(_run(cfg, h=2, group=4, d=64, p=32, cases=cases, seed=33 + k_group, position=position,
                             tune=dict(dequantize=dequantize), return_out=True, window_left=window))
        assert outs[0][1] < ATTN_BOUND_FP32_OUT and outs[1][1] < ATTN_BOUND_FP32_OUT, (outs[0][1], outs[1][1], window)
        assert rel_rms(outs[0][0], outs[1][0]) < 1e-5


def test_extend_falls_back_to_registers_past_the_scratch_budget(monkeypatch):
    """A batch whose scratch would exceed ``DEQUANTIZE_SCRATCH_BYTES`` dequantizes in registers
    (no launch of the dequantize kernel) and still matches the reference."""
    cfg = OscarConfig(bits=4, page_size=32)
    launched = []
    real = kextend._dequantize_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(kextend, "_dequantize_kernel", Spy())
    err = _run(cfg, h=1, group=2, d=64, p=32, cases=[(40, 30)], seed=32, position=True)
    assert err < ATTN_BOUND_FP32_OUT and len(launched) == 1
    monkeypatch.setattr(kextend, "DEQUANTIZE_SCRATCH_BYTES", kextend.dequantize_scratch_bytes(2, 1, 32, 64))
    err = _run(cfg, h=1, group=2, d=64, p=32, cases=[(40, 30)], seed=32, position=True)  # 3 pages > 2
    assert err < ATTN_BOUND_FP32_OUT and len(launched) == 1


def test_the_default_launch_shape_follows_the_way_pages_are_read():
    auto = kextend._default_tuning(32, 8, 128)
    assert kextend._launch_shape(auto, True, 4, 128, 128) == (64, 4, 64)  # pre-dequantized pages
    assert kextend._launch_shape(auto, False, 4, 128, 128) == (128, 8, 32)  # in registers
    assert kextend._launch_shape(auto, True, 4, 128, 32) == (64, 4, 32)  # pages of 32 tokens
    assert kextend._launch_shape(auto, True, 2, 256, 64) == (32, 8, 32)  # head_dim 256: untuned
    assert kextend._launch_shape(auto, True, 128, 64, 64)[0] == 128  # a GQA group larger than the rows
    pinned = dataclasses.replace(auto, block_m=32, num_warps=2, block_n=32)
    assert kextend._launch_shape(pinned, True, 4, 128, 128) == (32, 2, 32)


def test_scratch_groups_split_a_batch_by_the_budget():
    # pages per request 3, 2, 9, 1, 1: budget 5 -> [0, 2) fits, 2 alone does not, [3, 5) fits
    assert kextend.scratch_groups([0, 3, 5, 14, 15, 16], 5) == [(0, 2, True), (2, 3, False), (3, 5, True)]
    assert kextend.scratch_groups([0, 3, 5], 100) == [(0, 2, True)]
    assert kextend.scratch_groups([0, 0, 0], 0) == [(0, 2, True)]  # no pages: nothing to dequantize


@pytest.mark.parametrize("host", [True, False])
def test_extend_splits_a_batch_past_the_scratch_budget(monkeypatch, host):
    """Requests whose pages together pass the budget run as groups (a request alone past it in
    registers): the same outputs as one launch, with or without the host copy of kv_indptr."""
    cfg = OscarConfig(bits=2, page_size=32)
    cases = [(40, 30), (0, 70), (96, 5), (33, 1)]
    whole, err = _run(cfg, h=2, group=2, d=64, p=32, cases=cases, seed=34, position=True, return_out=True)
    monkeypatch.setattr(kextend, "DEQUANTIZE_SCRATCH_BYTES", kextend.dequantize_scratch_bytes(3, 2, 32, 64))
    split, err_split = _run(cfg, h=2, group=2, d=64, p=32, cases=cases, seed=34, position=True, return_out=True,
                            host_indptr=host)
    assert err < ATTN_BOUND_FP32_OUT and err_split < ATTN_BOUND_FP32_OUT
    assert torch.equal(whole, split) or rel_rms(split, whole) < 1e-5


def test_extend_d256():
    cfg = OscarConfig(bits=2, page_size=32)
    err = _run(cfg, h=1, group=2, d=256, p=32, cases=[(40, 17)], seed=12)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("block_m,num_warps,block_n", [(None, None, None), (128, 8, 32), (32, 4, 32), (128, 8, 64), (64, 4, 128)])
@pytest.mark.parametrize("dequantize", [None, False])
@pytest.mark.parametrize("position", [True, False])
def test_extend_gpu_real_sizes(bits, block_m, num_warps, block_n, dequantize, position):
    cfg = OscarConfig(bits=bits, page_size=128)
    cases = [(0, 300), (1024, 200), (128 * 3 + 50, 129), (2048, 1)]
    tune = {} if block_m is None else dict(block_m=block_m, num_warps=num_warps, block_n=block_n)
    err = _run(cfg, h=8, group=4, d=128, p=128, cases=cases, device=torch.device("cuda"), seed=13,
               tune=dict(tune, dequantize=dequantize), position=position)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("dequantize", [None, False])
@pytest.mark.parametrize("position", [True, False])
def test_extend_gpu_page_key_ranges(bits, dequantize, position):
    """Page-grid key ranges at the Llama-3.1-8B attention shape (G_K = 16, G_V = 128), compiled."""
    cfg = OscarConfig(bits=bits, page_size=128, k_group=16, v_group=128, key_ranges="page", offset="min", clip="values")
    cases = [(0, 300), (1024, 200), (128 * 3 + 50, 129), (2048, 1)]
    err = _run(cfg, h=8, group=4, d=128, p=128, cases=cases, device=torch.device("cuda"), seed=14,
               tune=dict(dequantize=dequantize), position=position)
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"


@gpu
@needs_cuda
@pytest.mark.parametrize("position", [True, False])
def test_extend_gpu_dequantized_pages_close_to_registers(position):
    """On the GPU the two ways of reading sealed pages differ only in the tensor-core instructions'
    accumulation order."""
    cfg = OscarConfig(bits=2, page_size=128)
    cases = [(0, 700), (1024, 200), (128 * 3 + 50, 129), (2048, 1)]
    outs = [_run(cfg, h=8, group=4, d=128, p=128, cases=cases, device=torch.device("cuda"), seed=33, position=position,
                 tune=dict(dequantize=dq), return_out=True)[0] for dq in (True, False)]
    assert rel_rms(outs[0], outs[1]) < 2e-3


@gpu
@needs_cuda
@pytest.mark.parametrize("dequantize", [None, False])
@pytest.mark.parametrize("position", [True, False])
def test_extend_gpu_per_head_key_rotation_plan(dequantize, position):
    """Real sizes, a plan rotating five of the eight heads' keys: both read paths give the reference."""
    cfg = OscarConfig(bits=2, page_size=128)
    cases = [(0, 300), (1024, 200), (128 * 3 + 50, 129), (2048, 1)]
    err = _run(cfg, h=8, group=4, d=128, p=128, cases=cases, device=torch.device("cuda"), seed=14, position=position,
               tune=dict(dequantize=dequantize), key_rotated=(True, False, True, True, False, True, True, False))
    assert err < ATTN_BOUND_FP32_OUT, f"relative RMS {err:.2e}"
