"""The Triton seal kernel writes exactly the bytes of the torch reference and of the Rust packer."""

from __future__ import annotations

import pytest
import torch
from support.kernel_data import DEVICE, gpu, needs_cuda, random_kv

from oscar_sgl import reference as R
from oscar_sgl.config import PAPER_FORMAT, OscarConfig
from oscar_sgl.kernels import oscar_seal
from oscar_sgl.kernels.seal import _SealTuning

try:
    from oscar_sgl import _core
except ImportError:  # the Rust extension is not built in this environment
    _core = None


def _staging(cfg: OscarConfig, *, h: int, d: int, p: int, ns: int, kinds: dict[int, str], seed: int):
    """Staging pages as the write path leaves them: rotated BF16 K/V and fp32 s_t."""
    gen = torch.Generator().manual_seed(seed)
    stg_k = torch.empty(ns, h, p, d, dtype=torch.bfloat16)
    stg_v = torch.empty(ns, h, p, d, dtype=torch.bfloat16)
    s_cols = cfg.scale_columns(h)
    stg_s = torch.empty(ns, p, s_cols) if s_cols else None
    for i in range(ns):
        k, v = random_kv(h, p, d, kind=kinds.get(i, "normal"), gen=gen)
        k_rot = R.rotate(k, cfg)
        stg_k[i] = k_rot.bfloat16()
        stg_v[i] = R.rotate(v, cfg).bfloat16()
        if s_cols:
            stg_s[i] = R.token_scales(k_rot, cfg.norm_scope)
    return stg_k, stg_v, stg_s


def _pool(cfg: OscarConfig, *, h: int, d: int, p: int, npages: int):
    """A destination pool full of garbage (codes 0xA5, params and scales NaN)."""
    nbytes = d * cfg.bits // 8
    s_cols = cfg.scale_columns(h)
    page_keys = cfg.key_ranges == "page"
    ranges = {"k_ranges": torch.full((npages, h, p // cfg.k_group, 2, d), 0xA5, dtype=torch.uint8)} if page_keys else {}
    return ranges | dict(
        k_codes=torch.full((npages, h, p, nbytes), 0xA5, dtype=torch.uint8),
        k_params=torch.full((npages, h, 1 if page_keys else p // cfg.k_group, 2, d), float("nan"), dtype=torch.float16),
        v_codes=torch.full((npages, h, p, nbytes), 0xA5, dtype=torch.uint8),
        v_params=torch.full((npages, h, p, 2, d // cfg.v_group), float("nan"), dtype=torch.float16),
        scale=torch.full((npages, p, s_cols), float("nan")) if s_cols else None,
    )


def _run_and_check(cfg, *, h, d, p, kinds=None, seed=0, device=DEVICE, tuning=None):
    ns, npages = 4, 7
    stg_k, stg_v, stg_s = _staging(cfg, h=h, d=d, p=p, ns=ns, kinds=kinds or {}, seed=seed)
    pool = _pool(cfg, h=h, d=d, p=p, npages=npages)
    before = {k: (v.clone() if v is not None else None) for k, v in pool.items()}
    # page 0 is the padding page of SGLang, a -1 row is plan padding
    plan = torch.tensor([[5, 2], [1, 0], [-1, 3], [3, 3]], dtype=torch.int32)
    dev = {k: (v.to(device) if v is not None else None) for k, v in pool.items()}
    oscar_seal(
        plan=plan.to(device),
        staging_k=stg_k.to(device),
        staging_v=stg_v.to(device),
        staging_scale=stg_s.to(device) if stg_s is not None else None,
        **dev,
        bits=cfg.bits,
        k_group=cfg.k_group,
        v_group=cfg.v_group,
        offset=cfg.offset,
        clip=cfg.clip,
        _tuning=tuning,
    )
    got = {k: (v.cpu() if v is not None else None) for k, v in dev.items()}
    sealed = {5: 2, 1: 0, 3: 3}
    for page in range(npages):
        if page not in sealed:  # untouched
            for name, t in got.items():
                if t is not None:
                    assert torch.equal(t[page].view(torch.uint8), before[name][page].view(torch.uint8)), (name, page)
            continue
        i = sealed[page]
        kb = R.pack_k(stg_k[i], stg_s[i] if stg_s is not None else None, cfg)
        vb = R.pack_v(stg_v[i], cfg)
        assert torch.equal(got["k_codes"][page], kb.codes), f"key codes differ on page {page}"
        assert torch.equal(got["k_params"][page].view(torch.int16), kb.params.view(torch.int16)), f"key params differ on page {page}"
        if kb.ranges is not None:
            assert torch.equal(got["k_ranges"][page], kb.ranges), f"key ranges differ on page {page}"
        assert torch.equal(got["v_codes"][page], vb.codes), f"value codes differ on page {page}"
        assert torch.equal(got["v_params"][page].view(torch.int16), vb.params.view(torch.int16)), f"value params differ on page {page}"
        assert not torch.isnan(got["k_params"][page]).any() and not torch.isnan(got["v_params"][page]).any()
        if stg_s is not None:
            assert torch.equal(got["scale"][page], stg_s[i])
        if _core is not None:
            x = stg_k[i].float()
            if stg_s is not None:
                x = x / R._broadcast_scale(stg_s[i], h)
            if kb.ranges is not None:
                codes, params, ranges = _core.pack_k_page(x.contiguous().numpy().tobytes(), shape=(h, p, d), bits=cfg.bits,
                                                          k_group=cfg.k_group, page_size=p)
                assert bytes(ranges) == got["k_ranges"][page].numpy().tobytes(), "key ranges differ from the Rust packer"
            else:
                codes, params = _core.pack(x.contiguous().numpy().tobytes(), shape=(h, p, d), bits=cfg.bits, part="k",
                                           group=cfg.k_group, offset=cfg.offset, clip=cfg.clip_keys)
            assert bytes(codes) == got["k_codes"][page].numpy().tobytes(), "key codes differ from the Rust packer"
            assert bytes(params) == got["k_params"][page].numpy().tobytes(), "key params differ from the Rust packer"
            codes, params = _core.pack(stg_v[i].float().contiguous().numpy().tobytes(), shape=(h, p, d), bits=cfg.bits, part="v",
                                       group=cfg.v_group, offset=cfg.offset, clip=cfg.clip_values)
            assert bytes(codes) == got["v_codes"][page].numpy().tobytes(), "value codes differ from the Rust packer"
            assert bytes(params) == got["v_params"][page].numpy().tobytes(), "value params differ from the Rust packer"


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize(
    "d,h,p,k_group,scope",
    [(64, 3, 32, 32, "layer"), (128, 2, 64, 32, "head"), (256, 1, 32, 32, "layer"), (64, 2, 128, 64, "layer"), (128, 1, 128, 128, "layer")],
)
def test_seal_bytes_match_reference(bits, d, h, p, k_group, scope):
    cfg = OscarConfig(bits=bits, k_group=k_group, v_group=32, page_size=p, norm_scope=scope)
    _run_and_check(cfg, h=h, d=d, p=p, seed=bits * 1000 + d)


@pytest.mark.parametrize("values,num_warps", [(16, 1), (64, 2), (512, 4), (4096, 8)])
@pytest.mark.parametrize("fmt", ["page", "paper"])
def test_seal_tile_sizes_change_nothing(fmt, values, num_warps):
    """The program tiling (values per program: key channels x page, value tokens x channels) and the
    warps are a launch choice: every tiling writes the reference's bytes, in both key-range formats."""
    cfg = OscarConfig(bits=2, page_size=64) if fmt == "page" else OscarConfig(bits=4, page_size=64, **PAPER_FORMAT)
    assert (cfg.key_ranges == "page") == (fmt == "page")
    _run_and_check(cfg, h=2, d=64, p=64, seed=11, tuning=_SealTuning(values=values, num_warps=num_warps))


def test_seal_refuses_a_bad_tuning():
    cfg = OscarConfig(bits=2, page_size=32)
    with pytest.raises(ValueError, match="power of two"):
        _run_and_check(cfg, h=1, d=64, p=32, tuning=_SealTuning(values=1000))


@pytest.mark.parametrize("method", ["kivi", "rotation-only", "scaling-only"])
def test_seal_bytes_match_reference_for_ablations(method):
    cfg = OscarConfig.for_method(method, bits=2, page_size=32)
    _run_and_check(cfg, h=2, d=64, p=32, seed=7)


@pytest.mark.parametrize("bits", [2, 4])
def test_seal_constant_and_zero_groups(bits):
    """All-zero pages, constant pages and constant channels/groups inside a page: no NaN, same bytes."""
    cfg = OscarConfig(bits=bits, page_size=64)
    _run_and_check(cfg, h=2, d=64, p=64, kinds={0: "zero", 1: "signed_zero", 2: "constant", 3: "mixed"}, seed=3)


@pytest.mark.parametrize("bits", [2, 4])
def test_seal_groups_of_signed_zeros(bits):
    """Groups holding both -0.0 and +0.0 (no rotation keeps them zeros): min/max are taken after
    canonicalizing -0.0 to +0.0 (docs/LAYOUT.md §1), so the stored offset is +0.0 everywhere."""
    cfg = OscarConfig.for_method("kivi", bits=bits, page_size=32)
    _run_and_check(cfg, h=2, d=64, p=32, kinds={0: "signed_zero", 1: "signed_zero", 2: "signed_zero", 3: "signed_zero"}, seed=5)


@pytest.mark.parametrize("bits", [2, 4])
def test_seal_sign_of_zero_offsets(bits):
    """Offsets that are zeros keep the reference's sign (their fp16 bytes differ): ``-zero * scale``
    with a zero point that rounds to +0 is -0.0, and a group whose minimum is +0.0 has zero point
    -0.0 and offset +0.0. (Triton 3.6 compiles ``-x`` as ``0 - x``, which loses the first; found on
    the H200 with 3.6, while the interpreter of 3.8 negates exactly.)"""
    cfg = OscarConfig.for_method("kivi", bits=bits, page_size=32)
    h, d, p = 1, 64, 32
    k = torch.randn(h, p, d) * 0.1
    k[0, :, 0] = torch.linspace(-0.05, 3.95, p)  # zero point rne(0.19 or 0.04) = +0 -> offset -0.0
    k[0, :, 1] = torch.linspace(0.0, 1.0, p)  # minimum +0.0 -> zero point -0.0 -> offset +0.0
    v = torch.randn(h, p, d) * 0.1
    v[0, 0, :32] = torch.linspace(-0.05, 3.95, 32)
    v[0, 1, :32] = torch.linspace(0.0, 1.0, 32)
    stg_k, stg_v = k.bfloat16()[None], v.bfloat16()[None]
    pool = {n: t.to(DEVICE) if t is not None else None for n, t in _pool(cfg, h=h, d=d, p=p, npages=2).items()}
    oscar_seal(plan=torch.tensor([[1, 0]], dtype=torch.int32, device=DEVICE), staging_k=stg_k.to(DEVICE), staging_v=stg_v.to(DEVICE),
               staging_scale=None, **pool, bits=bits, k_group=32, v_group=32)  # fmt: skip
    kb, vb = R.pack_k(stg_k[0], None, cfg), R.pack_v(stg_v[0], cfg)
    assert kb.params[0, 0, 1, 0].view(torch.int16) == -0x8000 and kb.params[0, 0, 1, 1].view(torch.int16) == 0  # the data does what it says
    assert torch.equal(pool["k_params"][1].cpu().view(torch.int16), kb.params.view(torch.int16))
    assert torch.equal(pool["v_params"][1].cpu().view(torch.int16), vb.params.view(torch.int16))


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("offset,clip", [("min", "none"), ("integer", "both"), ("min", "both"), ("min", "keys"), ("integer", "values")])
def test_seal_bytes_match_reference_seal_options(bits, offset, clip):
    FMT = {"k_group": 32, "v_group": 32, "key_ranges": "group"}  # noqa: N806  (free key ranges: clip keys)
    """The seal-time quantizer options (docs/OSCAR.md §2.3): the kernel's bytes equal the reference's
    and the Rust packer's, constant and zero groups included; and they are not today's bytes (the
    options reach the kernel)."""
    cfg = OscarConfig(bits=bits, page_size=32, offset=offset, clip=clip, **FMT)  # type: ignore[arg-type]
    _run_and_check(cfg, h=2, d=64, p=32, kinds={0: "mixed", 1: "constant"}, seed=bits + 17)
    stg_k, stg_v, stg_s = _staging(cfg, h=1, d=64, p=32, ns=1, kinds={}, seed=1)
    default = OscarConfig(bits=bits, page_size=32, **PAPER_FORMAT)
    assert not torch.equal(R.pack_k(stg_k[0], stg_s[0], cfg).params, R.pack_k(stg_k[0], stg_s[0], default).params) or \
        not torch.equal(R.pack_v(stg_v[0], cfg).params, R.pack_v(stg_v[0], default).params)


def test_seal_rejects_bad_seal_options():
    cfg = OscarConfig(bits=2, page_size=32)
    stg_k, stg_v, stg_s = _staging(cfg, h=1, d=64, p=32, ns=1, kinds={}, seed=0)
    for bad in (dict(offset="mean"), dict(clip="all")):
        with pytest.raises(ValueError, match="offset must be 'integer' or 'min' and clip"):
            oscar_seal(plan=torch.tensor([[0, 0]], dtype=torch.int32), staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s,
                       **_pool(cfg, h=1, d=64, p=32, npages=1), bits=2, k_group=32, v_group=32, **bad)  # fmt: skip


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("d,h,p,k_group,v_group,clip", [(64, 3, 32, 16, 64, "values"), (128, 2, 64, 16, 32, "none"),
                                                        (64, 1, 32, 32, 16, "none")])
def test_seal_bytes_match_reference_page_ranges(bits, d, h, p, k_group, v_group, clip):
    """Page-grid key ranges (key_ranges="page"): the page grids, the groups' indices and the codes
    equal the reference's and the Rust packer's, constant and mixed pages included."""
    cfg = OscarConfig(bits=bits, page_size=p, k_group=k_group, v_group=v_group, key_ranges="page", offset="min",
                      clip=clip)  # type: ignore[arg-type]
    _run_and_check(cfg, h=h, d=d, p=p, kinds={0: "mixed", 1: "constant", 2: "zero"}, seed=bits + d)


def test_seal_page_ranges_refuse_key_clipping():
    cfg = OscarConfig(bits=2, page_size=32, key_ranges="page")
    stg_k, stg_v, stg_s = _staging(cfg, h=1, d=64, p=32, ns=1, kinds={}, seed=0)
    with pytest.raises(ValueError, match="clips key groups"):
        oscar_seal(plan=torch.tensor([[0, 0]], dtype=torch.int32), staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s,
                   **_pool(cfg, h=1, d=64, p=32, npages=1), bits=2, k_group=32, v_group=32, clip="keys")  # fmt: skip
    pool = _pool(cfg, h=1, d=64, p=32, npages=1)
    pool["k_params"] = torch.zeros((1, 1, 1, 2, 64), dtype=torch.float16)[:, :, :, :, :32]
    with pytest.raises(ValueError, match="k_params must be contiguous"):
        oscar_seal(plan=torch.tensor([[0, 0]], dtype=torch.int32), staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s,
                   **pool, bits=2, k_group=32, v_group=32)  # fmt: skip


def test_seal_v_group_16_and_64():
    for v_group in (16, 64):
        cfg = OscarConfig(bits=4, v_group=v_group, page_size=32)
        _run_and_check(cfg, h=1, d=128, p=32, seed=v_group)


def test_rust_packer_is_compared_when_built():
    if _core is None:
        pytest.skip("oscar_sgl._core (the Rust golden packer) is not built here; the seal bytes were checked against the torch reference only")
    assert hasattr(_core, "pack") and hasattr(_core, "unpack")


def test_seal_rejects_bad_plan_dtype():
    cfg = OscarConfig(bits=2, page_size=32)
    stg_k, stg_v, stg_s = _staging(cfg, h=1, d=64, p=32, ns=1, kinds={}, seed=0)
    with pytest.raises(TypeError, match="int32"):
        oscar_seal(plan=torch.tensor([[0, 0]]), staging_k=stg_k, staging_v=stg_v, staging_scale=stg_s,
                   **_pool(cfg, h=1, d=64, p=32, npages=1), bits=2, k_group=32, v_group=32)  # fmt: skip


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
def test_seal_bytes_match_reference_gpu_real_size(bits):
    """Llama-3.1-8B layer shape (8 KV heads, D=128, P=128): the compiled kernel, bit for bit."""
    cfg = OscarConfig(bits=bits, page_size=128)
    _run_and_check(cfg, h=8, d=128, p=128, kinds={1: "mixed"}, seed=11, device=torch.device("cuda"))


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("offset,clip", [("min", "none"), ("integer", "both"), ("min", "both")])
def test_seal_bytes_match_reference_gpu_seal_options(bits, offset, clip):
    """The seal-time quantizer options, compiled, at the Llama-3.1-8B layer shape, bit for bit."""
    # in the paper's key groups: clip 'both' clips key groups, which page-grid ranges do not store
    cfg = OscarConfig(bits=bits, page_size=128, k_group=32, v_group=32, key_ranges="group", offset=offset,
                      clip=clip)  # type: ignore[arg-type]
    _run_and_check(cfg, h=8, d=128, p=128, kinds={1: "mixed", 2: "constant"}, seed=12, device=torch.device("cuda"))


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("d,k_group,v_group", [(128, 16, 128), (64, 16, 64), (256, 16, 64)])
def test_seal_bytes_match_reference_gpu_page_ranges(bits, d, k_group, v_group):
    """Page-grid key ranges, compiled, P = 128, bit for bit."""
    cfg = OscarConfig(bits=bits, page_size=128, k_group=k_group, v_group=v_group, key_ranges="page", offset="min",
                      clip="values")  # type: ignore[arg-type]
    _run_and_check(cfg, h=8 if d == 128 else 2, d=d, p=128, kinds={1: "mixed", 2: "constant"}, seed=13,
                   device=torch.device("cuda"))
