"""The write path: rotated BF16 K/V and s_t land in the right staging slots; query rotation."""

from __future__ import annotations

import pytest
import torch
from support.kernel_data import DEVICE, gpu, needs_cuda

from oscar_sgl import reference as R
from oscar_sgl.config import OscarConfig
from oscar_sgl.kernels import oscar_rotate_q, oscar_write_kv


def _check_write(cfg: OscarConfig, *, h: int, hq: int, d: int, p: int, t: int, device=DEVICE, seed=0, key_rotated=None):
    """``key_rotated``: per-KV-head key-rotation flags (`reference.key_rotation_plan`), given to the
    launch as `PagedLayer.key_rotated` is."""
    gen = torch.Generator().manual_seed(seed)
    npages, ns = 9, 4
    k = (torch.randn(t, h, d, generator=gen) * (torch.rand(t, 1, 1, generator=gen) * 3 + 0.1)).bfloat16()
    v = torch.randn(t, h, d, generator=gen).bfloat16()
    q = torch.randn(t, hq, d, generator=gen).bfloat16()
    k[0] = 0  # a zero key: s stored as 1
    p2s = torch.full((npages,), -1, dtype=torch.int32)
    p2s[3], p2s[7], p2s[2] = 1, 0, 3
    # tokens spread over open pages 3, 7, 2 and one token of sealed page 5 (must not be written)
    slots = [3 * p + i % p for i in range(t - 1)]
    slots = [s if i % 3 else 7 * p + (i * 5) % p for i, s in enumerate(slots)] + [5 * p + 1]
    slots[1] = 2 * p + p - 1
    loc = torch.tensor(slots, dtype=torch.int64)
    assert len(set(slots)) == len(slots)
    s_cols = cfg.scale_columns(h)
    stg_k = torch.full((ns, h, p, d), float("nan"), dtype=torch.bfloat16)
    stg_v = torch.full((ns, h, p, d), float("nan"), dtype=torch.bfloat16)
    stg_s = torch.full((ns, p, s_cols), float("nan")) if s_cols else None
    d_stg = [x.to(device) if x is not None else None for x in (stg_k, stg_v, stg_s)]
    q_rot = oscar_write_kv(
        k=k.to(device), v=v.to(device), loc=loc.to(device), page_to_staging=p2s.to(device),
        staging_k=d_stg[0], staging_v=d_stg[1], staging_scale=d_stg[2], rotation=cfg.rotation, q=q.to(device),
        key_rotated=None if key_rotated is None else torch.tensor(key_rotated, dtype=torch.int32, device=device),
    )  # fmt: skip
    got_k, got_v = d_stg[0].cpu(), d_stg[1].cpu()
    got_s = d_stg[2].cpu() if s_cols else None
    k_rot = R.rotate_keys(k.float(), cfg, key_rotated, head_axis=1)  # [T, H, D] fp32
    v_rot = R.rotate(v.float(), cfg)
    s_ref = R.token_scales(k_rot.transpose(0, 1), cfg.norm_scope) if s_cols else None  # [T, S]
    written = torch.zeros(ns, p, dtype=torch.bool)
    for i, slot in enumerate(slots):
        page, off = divmod(slot, p)
        stg = int(p2s[page])
        if stg < 0:
            continue
        written[stg, off] = True
        assert torch.equal(got_k[stg, :, off], k_rot[i].bfloat16()), f"staged key of token {i} differs"
        assert torch.equal(got_v[stg, :, off], v_rot[i].bfloat16()), f"staged value of token {i} differs"
        if s_cols:
            # the sum of squares runs in another order than torch's (fp32): ulp-level differences
            torch.testing.assert_close(got_s[stg, off], s_ref[i], rtol=1e-5, atol=0)
    # nothing else was touched (the sealed page's token in particular)
    assert torch.isnan(got_k.permute(0, 2, 1, 3)[~written].float()).all()
    assert torch.isnan(got_v.permute(0, 2, 1, 3)[~written].float()).all()
    if s_cols:
        assert torch.isnan(got_s[~written]).all()
        page0, off0 = divmod(slots[0], p)
        assert (got_s[int(p2s[page0]), off0] == 1.0).all(), "a zero key must store s = 1"
    q_want = R.rotate_keys(q.float().reshape(t, h, hq // h, d), cfg, key_rotated, head_axis=1).reshape(t, hq, d)
    assert torch.equal(q_rot.cpu(), q_want), "rotated queries differ from the reference"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("h,hq", [(1, 3), (3, 12), (8, 32)])
def test_write_stages_rotated_kv_and_scales(d, h, hq):
    if d == 256 and h == 8 and DEVICE.type == "cpu":
        pytest.skip("the interpreter run stays short: (H=8, D=256) runs on the GPU (same test) and at D=128 here")
    _check_write(OscarConfig(page_size=32), h=h, hq=hq, d=d, p=32, t=11, seed=d + h)


@pytest.mark.parametrize("method,scope", [("oscar", "head"), ("kivi", "layer"), ("rotation-only", "layer"), ("scaling-only", "head")])
def test_write_ablations(method, scope):
    cfg = OscarConfig.for_method(method, page_size=64, norm_scope=scope)
    _check_write(cfg, h=2, hq=4, d=64, p=64, t=9, seed=5)


@pytest.mark.parametrize("scope", ["layer", "head"])
@pytest.mark.parametrize("h,hq,flags", [(3, 12, (True, False, True)), (2, 2, (False, True)), (4, 8, (False, False, False, True))])
def test_write_with_a_per_head_key_rotation_plan(scope, h, hq, flags):
    """Only the flagged heads' keys (and the queries of their query heads) are rotated; values
    are rotated in every head; s_t is the norm of the keys as stored (the reference's)."""
    _check_write(OscarConfig(page_size=32, norm_scope=scope), h=h, hq=hq, d=64, p=32, t=9, seed=h + hq, key_rotated=flags)


def test_rotate_q_with_a_per_head_plan_and_bad_flags():
    q = torch.randn(3, 6, 64).bfloat16()
    flags = (True, False, False)
    out = oscar_rotate_q(q=q.to(DEVICE), key_rotated=torch.tensor(flags, dtype=torch.int32, device=DEVICE)).cpu()
    want = R.rotate_keys(q.float().reshape(3, 3, 2, 64), OscarConfig(), flags, head_axis=1).reshape(3, 6, 64)
    assert torch.equal(out, want)
    assert torch.equal(out[:, :2], R.hadamard(q[:, :2])) and torch.equal(out[:, 2:], q[:, 2:].float())
    with pytest.raises(ValueError, match="int32"):
        oscar_rotate_q(q=q.to(DEVICE), key_rotated=torch.ones(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="multiple"):
        oscar_rotate_q(q=q.to(DEVICE), key_rotated=torch.ones(4, dtype=torch.int32, device=DEVICE))


def test_rotate_q_is_the_reference_rotation():
    q = torch.randn(5, 6, 128).bfloat16()
    out = oscar_rotate_q(q=q.to(DEVICE)).cpu()
    assert torch.equal(out, R.hadamard(q))
    assert torch.equal(oscar_rotate_q(q=q.to(DEVICE), rotation=False).cpu(), q.float())


def test_write_rejects_non_int32_map():
    cfg_h, d = 2, 64
    with pytest.raises(TypeError, match="int32"):
        oscar_write_kv(
            k=torch.zeros(1, cfg_h, d), v=torch.zeros(1, cfg_h, d), loc=torch.zeros(1, dtype=torch.int64),
            page_to_staging=torch.zeros(4, dtype=torch.int64), staging_k=torch.zeros(1, cfg_h, 32, d, dtype=torch.bfloat16),
            staging_v=torch.zeros(1, cfg_h, 32, d, dtype=torch.bfloat16), staging_scale=torch.zeros(1, 32, 1),
        )  # fmt: skip


@gpu
@needs_cuda
def test_write_gpu_real_size():
    _check_write(OscarConfig(page_size=128), h=8, hq=32, d=128, p=128, t=64, device=torch.device("cuda"), seed=1)
    _check_write(OscarConfig(page_size=128), h=8, hq=32, d=256, p=128, t=7, device=torch.device("cuda"), seed=2)
    flags = (True, False, True, True, False, False, True, False)
    _check_write(OscarConfig(page_size=128), h=8, hq=32, d=128, p=128, t=33, device=torch.device("cuda"), seed=3, key_rotated=flags)
