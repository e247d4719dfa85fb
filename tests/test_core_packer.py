"""The Rust golden packer (`oscar_sgl._core`) against the torch reference, byte for byte.

docs/LAYOUT.md is the contract; `oscar_sgl.reference` is its readable oracle. Any difference in a
code byte or a float16 parameter bit fails here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from oscar_sgl import _core, reference
from oscar_sgl.config import PAPER_FORMAT, OscarConfig
from oscar_sgl.errors import LayoutError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fill(rng: np.random.Generator, shape: tuple[int, ...], mode: str, magnitude: float) -> np.ndarray:
    """fp32 test data: gaussian at one magnitude, with constant / all-zero / outlier structure."""
    x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    if mode == "zeros":
        x[:] = 0.0
    elif mode == "mixed":
        # Every kind of group in one block: zero, constant, tiny, huge outliers, and plain.
        flat = x.reshape(-1)
        n = flat.size
        for _ in range(8):
            a = int(rng.integers(0, n))
            b = min(n, a + int(rng.integers(1, 200)))
            kind = int(rng.integers(0, 4))
            if kind == 0:
                flat[a:b] = 0.0
            elif kind == 1:
                flat[a:b] = np.float32(rng.standard_normal() * magnitude)
            elif kind == 2:
                flat[a:b] *= np.float32(1e-6)
            else:
                flat[a:b] *= np.float32(100.0)
    elif mode == "integers":
        # Values on the code grid exercise round-half-to-even ties.
        x = (rng.integers(-8, 8, size=shape).astype(np.float32) * np.float32(0.5) * np.float32(magnitude))
    # `-0.0` is folded into `+0.0` by the packer (pack.rs module docs); the torch reduction's choice
    # between the two zeros depends on its vectorisation, so the reference is fed canonical zeros.
    return x + np.float32(0.0)


@st.composite
def k_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    bits = draw(st.sampled_from([2, 4]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    heads = draw(st.integers(1, 8))
    k_group = draw(st.sampled_from([32, 64, 128]))
    groups = draw(st.integers(1, 2 if head_dim * heads > 512 else 3))
    mode = draw(st.sampled_from(["gauss", "mixed", "zeros", "integers"]))
    magnitude = draw(st.sampled_from([1e-4, 1e-2, 1.0, 30.0, 1e3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return _fill(rng, (heads, k_group * groups, head_dim), mode, magnitude), bits, k_group


@st.composite
def v_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    bits = draw(st.sampled_from([2, 4]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    heads = draw(st.integers(1, 8))
    v_group = draw(st.sampled_from([16, 32, 64]))
    tokens = draw(st.integers(1, 67))
    mode = draw(st.sampled_from(["gauss", "mixed", "zeros", "integers"]))
    magnitude = draw(st.sampled_from([1e-4, 1e-2, 1.0, 30.0, 1e3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return _fill(rng, (heads, tokens, head_dim), mode, magnitude), bits, v_group


def _rust_k(x: np.ndarray, bits: int, k_group: int, offset: str = "integer", clip: bool = False) -> tuple[bytes, bytes]:
    h, n, d = x.shape
    return _core.pack(x.tobytes(), shape=(h, n, d), bits=bits, part="k", group=k_group, offset=offset, clip=clip)


def _rust_v(x: np.ndarray, bits: int, v_group: int, offset: str = "integer", clip: bool = False) -> tuple[bytes, bytes]:
    h, n, d = x.shape
    return _core.pack(x.tobytes(), shape=(h, n, d), bits=bits, part="v", group=v_group, offset=offset, clip=clip)


def _cfg(bits: int, k_group: int = 32, v_group: int = 32, offset: str = "integer", clip: str = "none") -> OscarConfig:
    return OscarConfig(bits=bits, k_group=k_group, v_group=v_group, page_size=k_group, offset=offset, clip=clip,  # type: ignore[arg-type]
                       key_ranges="group")


#: The seal-time quantizer options (docs/OSCAR.md §2.3): (offset, clip searched).
_OPTIONS = st.tuples(st.sampled_from(["integer", "min"]), st.booleans())


@SETTINGS
@given(k_cases())
def test_pack_k_matches_reference(case: tuple[np.ndarray, int, int]) -> None:
    x, bits, k_group = case
    codes, params = _rust_k(x, bits, k_group)
    ref = reference.pack_k(torch.from_numpy(x), None, _cfg(bits, k_group=k_group))
    assert codes == ref.codes.numpy().tobytes()
    assert params == ref.params.numpy().tobytes()


@SETTINGS
@given(v_cases())
def test_pack_v_matches_reference(case: tuple[np.ndarray, int, int]) -> None:
    x, bits, v_group = case
    codes, params = _rust_v(x, bits, v_group)
    ref = reference.pack_v(torch.from_numpy(x), _cfg(bits, v_group=v_group))
    assert codes == ref.codes.numpy().tobytes()
    assert params == ref.params.numpy().tobytes()


@SETTINGS
@given(k_cases(), st.sampled_from(["layer", "head"]))
def test_pack_k_after_token_scaling(case: tuple[np.ndarray, int, int], scope: str) -> None:
    """The reference divides by s inside pack_k; the Rust packer takes k/s (the same fp32 division)."""
    k, bits, k_group = case
    kt = torch.from_numpy(k)
    s = reference.token_scales(kt, scope)
    divided = (kt / reference._broadcast_scale(s, kt.shape[0])).contiguous().numpy()
    codes, params = _rust_k(divided, bits, k_group)
    ref = reference.pack_k(kt, s, _cfg(bits, k_group=k_group))
    assert codes == ref.codes.numpy().tobytes()
    assert params == ref.params.numpy().tobytes()


@SETTINGS
@given(st.one_of(k_cases().map(lambda c: ("k", c)), v_cases().map(lambda c: ("v", c))), _OPTIONS)
def test_pack_options_match_reference(case: tuple[str, tuple[np.ndarray, int, int]], options: tuple[str, bool]) -> None:
    """Keys or values with the seal-time quantizer options (docs/OSCAR.md §2.3), byte for byte."""
    part, (x, bits, group) = case
    offset, clip = options
    if part == "k":
        codes, params = _rust_k(x, bits, group, offset, clip)
        ref = reference.pack_k(torch.from_numpy(x), None, _cfg(bits, k_group=group, offset=offset, clip="keys" if clip else "values"))
    else:
        codes, params = _rust_v(x, bits, group, offset, clip)
        ref = reference.pack_v(torch.from_numpy(x), _cfg(bits, v_group=group, offset=offset, clip="values" if clip else "keys"))
    assert (codes, params) == (ref.codes.numpy().tobytes(), ref.params.numpy().tobytes())


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("offset,clip", [("integer", "none"), ("min", "none"), ("integer", "both"), ("min", "both")])
def test_every_option_combination_matches_reference(bits: int, offset: str, clip: str) -> None:
    """Every (offset, clip) pair at both widths on one fixed block of 2 heads x 64 tokens x 128
    channels (gaussian, heavy tails, a constant and a zero channel): keys and values, byte for byte.
    The options change the bytes (so a packer that ignored them fails here), and the clip search
    never raises the reconstruction error of a group it searches."""
    rng = np.random.default_rng(bits * 10 + len(offset) + len(clip))
    x = (rng.standard_normal((2, 64, 128)) * rng.standard_exponential((2, 64, 128)) ** 2).astype(np.float32)
    x[:, :, 3] = np.float32(0.75)
    x[:, :, 5] = 0.0
    xt = torch.from_numpy(x)
    cfg, plain = _cfg(bits, offset=offset, clip=clip), _cfg(bits, offset=offset)
    kb, vb = reference.pack_k(xt, None, cfg), reference.pack_v(xt, cfg)
    assert _rust_k(x, bits, 32, offset, cfg.clip_keys) == (kb.codes.numpy().tobytes(), kb.params.numpy().tobytes())
    assert _rust_v(x, bits, 32, offset, cfg.clip_values) == (vb.codes.numpy().tobytes(), vb.params.numpy().tobytes())
    default_k = reference.pack_k(xt, None, _cfg(bits))
    assert (offset, clip) == ("integer", "none") or not torch.equal(kb.params, default_k.params)
    if clip != "none":
        # Per group, the searched error (in the score's own fixed point, so exactly what was minimised) is <= the unclipped one.
        g = xt.reshape(2, 2, 32, 128)
        lo, hi = g.amin(2, keepdim=True), g.amax(2, keepdim=True)
        qmax = float((1 << bits) - 1)
        c_lo, c_hi = reference.clip_range(g, lo, hi, qmax, offset, 2)
        searched = reference.clip_score(g, c_lo, c_hi, hi - lo, qmax, offset, 2)
        unclipped = reference.clip_score(g, lo, hi, hi - lo, qmax, offset, 2)
        assert (searched <= unclipped).all() and (searched < unclipped).any()
        assert (c_hi - c_lo < hi - lo).any()


def test_bad_offset_raises_layout_error() -> None:
    x = np.ones((1, 32, 64), dtype=np.float32)
    with pytest.raises(LayoutError, match="offset must be 'integer' or 'min', got \"mean\""):
        _core.pack(x.tobytes(), part="k", shape=(1, 32, 64), bits=2, group=32, offset="mean")


# Small blocks of arbitrary finite fp32 (subnormals, huge, tiny, ties) drawn value by value.
_finite = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-(2.0**100), max_value=2.0**100)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([2, 4]), st.integers(1, 3), st.data(), _OPTIONS)
def test_exact_floats_k_and_v(bits: int, heads: int, data: st.DataObject, options: tuple[str, bool]) -> None:
    d, n = 8, 8
    offset, clip = options
    vals = data.draw(st.lists(_finite, min_size=heads * n * d, max_size=heads * n * d))
    x = np.asarray(vals, dtype=np.float32).reshape(heads, n, d) + np.float32(0.0)
    xt = torch.from_numpy(x)
    cfg = _cfg(bits, k_group=4, v_group=4, offset=offset, clip="both" if clip else "none")
    # Groups whose range overflows fp32 are rejected by the packer (pack.rs); skip them here.
    assume(np.isfinite(x.max(axis=1) - x.min(axis=1)).all())
    assume(np.isfinite(x.reshape(heads, n, 2, 4).max(-1) - x.reshape(heads, n, 2, 4).min(-1)).all())
    codes, params = _rust_k(x, bits, 4, offset, clip)
    ref = reference.pack_k(xt, None, cfg)
    assert (codes, params) == (ref.codes.numpy().tobytes(), ref.params.numpy().tobytes())
    codes, params = _rust_v(x, bits, 4, offset, clip)
    refv = reference.pack_v(xt, cfg)
    assert (codes, params) == (refv.codes.numpy().tobytes(), refv.params.numpy().tobytes())


def _step_bound(scale: np.ndarray, offset: np.ndarray, bits: int) -> np.ndarray:
    """Half a quantization step, plus what float16 rounding of scale and offset can add."""
    qmax = (1 << bits) - 1
    fp16_ulp = 2.0**-11
    return scale * 0.5 * (1 + 1e-5) + qmax * (scale * fp16_ulp + 2.0**-25) + np.abs(offset) * fp16_ulp + 2.0**-25


@SETTINGS
@given(k_cases())
def test_round_trip_k(case: tuple[np.ndarray, int, int]) -> None:
    x, bits, k_group = case
    assume(np.abs(x).max() < 6e4)
    h, n, d = x.shape
    codes, params = _rust_k(x, bits, k_group)
    y = np.frombuffer(
        _core.unpack(codes, params, shape=(h, n, d), bits=bits, part="k", group=k_group), dtype=np.float32
    ).reshape(h, n, d)
    # Same result as the reference dequantizer, bit for bit.
    ref = reference.unpack_k(reference.pack_k(torch.from_numpy(x), None, _cfg(bits, k_group=k_group)), _cfg(bits, k_group=k_group), d)
    assert y.tobytes() == ref.numpy().tobytes()
    # Within half a step of x: the step is the group's fp32 scale (max - min) / qmax.
    g = x.reshape(h, n // k_group, k_group, d)
    scale = (g.max(axis=2) - g.min(axis=2)) / np.float32((1 << bits) - 1)
    offset = g.min(axis=2)
    bound = _step_bound(scale, offset, bits)[:, :, None, :]
    err = np.abs(y.reshape(g.shape) - g)
    assert (err <= bound).all(), float((err - bound).max())


@SETTINGS
@given(v_cases())
def test_round_trip_v(case: tuple[np.ndarray, int, int]) -> None:
    x, bits, v_group = case
    assume(np.abs(x).max() < 6e4)
    h, n, d = x.shape
    codes, params = _rust_v(x, bits, v_group)
    y = np.frombuffer(
        _core.unpack(codes, params, shape=(h, n, d), bits=bits, part="v", group=v_group), dtype=np.float32
    ).reshape(h, n, d)
    ref = reference.unpack_v(reference.pack_v(torch.from_numpy(x), _cfg(bits, v_group=v_group)), _cfg(bits, v_group=v_group), d)
    assert y.tobytes() == ref.numpy().tobytes()
    g = x.reshape(h, n, d // v_group, v_group)
    scale = (g.max(axis=3) - g.min(axis=3)) / np.float32((1 << bits) - 1)
    bound = _step_bound(scale, g.min(axis=3), bits)[..., None]
    err = np.abs(y.reshape(g.shape) - g)
    assert (err <= bound).all(), float((err - bound).max())


def test_negative_zero_folds_to_positive_zero() -> None:
    x = np.zeros((1, 32, 64), dtype=np.float32)
    x[0, 5, 3] = 1.0
    neg = x.copy()
    neg[0, ::2, :] = np.where(neg[0, ::2, :] == 0, np.float32(-0.0), neg[0, ::2, :])
    assert np.signbit(neg).any()
    assert _rust_k(neg, 2, 32) == _rust_k(x, 2, 32)
    assert _rust_v(neg, 2, 32) == _rust_v(x, 2, 32)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(bits=3, group=32),
        dict(bits=2, group=24),
        dict(bits=2, group=64),  # 32 tokens are not a whole group of 64
    ],
)
def test_bad_shapes_raise_layout_error(kwargs: dict[str, int]) -> None:
    x = np.ones((1, 32, 64), dtype=np.float32)
    with pytest.raises(LayoutError):
        _core.pack(x.tobytes(), part="k", shape=(1, 32, 64), **kwargs)
    with pytest.raises(LayoutError, match="part must be 'k' or 'v', got \"q\""):
        _core.pack(x.tobytes(), part="q", shape=(1, 32, 64), bits=2, group=32)
    with pytest.raises(LayoutError, match="part must be 'k' or 'v'"):
        _core.unpack(b"", b"", part="", shape=(1, 32, 64), bits=2, group=32)


def test_non_finite_and_short_buffers_raise() -> None:
    x = np.ones((1, 32, 64), dtype=np.float32)
    x[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        _core.pack(x.tobytes(), shape=(1, 32, 64), bits=2, part="v", group=32)
    with pytest.raises(LayoutError):
        _core.pack(b"\0" * 12, shape=(1, 32, 64), bits=2, part="v", group=32)
    with pytest.raises(LayoutError):
        _core.unpack(b"\0" * 3, b"", shape=(1, 32, 64), bits=2, part="k", group=32)


@settings(max_examples=200, deadline=None)
@given(
    bits=st.sampled_from([2, 4]),
    kv_heads=st.integers(1, 64),
    head_dim=st.sampled_from([32, 64, 80, 96, 128, 256, 512]),
    k_group=st.sampled_from([8, 16, 32, 64, 128, 256]),
    v_group=st.sampled_from([8, 16, 32]),
    token_scaling=st.booleans(),
    scope=st.sampled_from(["layer", "head"]),
)
def test_bytes_per_token_equals_config(
    bits: int, kv_heads: int, head_dim: int, k_group: int, v_group: int, token_scaling: bool, scope: str
) -> None:
    cfg = OscarConfig(bits=bits, k_group=k_group, v_group=v_group, page_size=k_group, rotation=False, token_scaling=token_scaling, norm_scope=scope,  # type: ignore[arg-type]
                      key_ranges="group")
    assume(head_dim % v_group == 0)
    kw = dict(shape=(kv_heads, head_dim), bits=bits, k_group=k_group, v_group=v_group, scale_columns=cfg.scale_columns(kv_heads))
    assert _core.format_cost(**kw) == (cfg.bytes_per_token(kv_heads, head_dim), cfg.effective_bits(kv_heads, head_dim))


def test_plan_memory_llama_shape() -> None:
    rows = _core.plan_memory(
        layers=32, kv_heads=8, head_dim=128, page_size=128, staging_pages=64, budget_bytes=40 << 30,
        k_group=32, v_group=32, scale_columns=1,
    )
    by = {r[0]: r for r in rows}
    assert list(by) == ["bf16", "fp8", "int4", "int2"]
    bf16, int2 = by["bf16"], by["int2"]
    assert bf16[1] == 32 * 8 * 128 * 4
    assert int2[1] == 32 * OscarConfig(**PAPER_FORMAT).bytes_per_token(8, 128)
    # INT2 holds ~5.3x the tokens of BF16 minus what the 64 BF16 staging pages cost.
    staging_tokens_bf16 = 64 * 128
    expected = (bf16[5] + 128 - staging_tokens_bf16) * (bf16[1] / int2[1])
    assert math.isclose(int2[5], expected, rel_tol=2e-3)


# --------------------------------------------------------------------------------------------
# Page-grid key ranges (OscarConfig.key_ranges == "page", docs/LAYOUT.md §1)
# --------------------------------------------------------------------------------------------


@st.composite
def page_k_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int]:
    bits = draw(st.sampled_from([2, 4]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    heads = draw(st.integers(1, 4))
    k_group = draw(st.sampled_from([16, 32]))
    page = k_group * draw(st.sampled_from([1, 2, 4]))
    pages = draw(st.integers(1, 2))
    mode = draw(st.sampled_from(["gauss", "mixed", "zeros", "integers"]))
    magnitude = draw(st.sampled_from([1e-4, 1e-2, 1.0, 30.0, 1e3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return _fill(rng, (heads, page * pages, head_dim), mode, magnitude), bits, k_group, page


def _page_cfg(bits: int, k_group: int, page: int) -> OscarConfig:
    return OscarConfig(bits=bits, k_group=k_group, page_size=page, key_ranges="page")


@SETTINGS
@given(page_k_cases())
def test_pack_k_page_matches_reference(case: tuple[np.ndarray, int, int, int]) -> None:
    x, bits, k_group, page = case
    h, n, d = x.shape
    try:
        codes, grid, ranges = _core.pack_k_page(x.tobytes(), shape=(h, n, d), bits=bits, k_group=k_group, page_size=page)
    except LayoutError as e:  # a page minimum (or step) beyond fp16: the reference refuses it too
        assert "fp16 range of the page grid" in str(e) and np.abs(x).max() > 65504
        with pytest.raises(ValueError, match="fp16 range of the page grid"):
            reference.pack_k(torch.from_numpy(x), None, _page_cfg(bits, k_group, page))
        return
    ref = reference.pack_k(torch.from_numpy(x), None, _page_cfg(bits, k_group, page))
    assert ref.ranges is not None and ref.params.shape == (h, n // page, 2, d)
    assert codes == ref.codes.numpy().tobytes()
    assert grid == ref.params.numpy().tobytes()
    assert ranges == ref.ranges.numpy().tobytes()
    # Both dequantize alike, and the reference's blocks say what they cost.
    y = np.frombuffer(_core.unpack_k_page(codes, grid, ranges, shape=(h, n, d), bits=bits, k_group=k_group, page_size=page),
                      dtype="<f4").reshape(h, n, d)
    np.testing.assert_array_equal(y, reference.unpack_k(ref, _page_cfg(bits, k_group, page), d).numpy())
    assert ref.nbytes() == h * n * d * bits // 8 + h * (n // page) * 2 * d * 2 + h * (n // k_group) * 2 * d


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([2, 4]), st.integers(1, 3), st.data())
def test_pack_k_page_exact_floats(bits: int, heads: int, data: st.DataObject) -> None:
    d, n = 8, 16
    vals = data.draw(st.lists(_finite, min_size=heads * n * d, max_size=heads * n * d))
    x = np.asarray(vals, dtype=np.float32).reshape(heads, n, d) + np.float32(0.0)
    cfg = OscarConfig(bits=bits, k_group=4, page_size=8, v_group=8, key_ranges="page")
    try:
        codes, grid, ranges = _core.pack_k_page(x.tobytes(), shape=(heads, n, d), bits=bits, k_group=4, page_size=8)
    except LayoutError as e:
        # Ranges overflowing fp32, or page minima / steps beyond fp16: the reference refuses them too.
        with pytest.raises(ValueError):
            reference.pack_k(torch.from_numpy(x), None, cfg)
        assert "fp16" in str(e) or "overflows" in str(e)
        return
    ref = reference.pack_k(torch.from_numpy(x), None, cfg)
    assert ref.ranges is not None
    assert (codes, grid, ranges) == (ref.codes.numpy().tobytes(), ref.params.numpy().tobytes(), ref.ranges.numpy().tobytes())


def test_page_ranges_error_bound_and_cost() -> None:
    """Every key lies within half its group's step (plus one grid step where the fp16 page base
    rounded above the minimum) of its dequantized value, and the group ranges are what the grid
    makes of the group's min / max: [lo, hi] rounded outward."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 256, 64)) * np.linspace(0.1, 3.0, 64)).astype(np.float32)
    x[0, 5, 3] = 40.0  # one outlier widens its page grid only
    cfg = _page_cfg(2, 16, 128)
    blk = reference.pack_k(torch.from_numpy(x), None, cfg)
    y = reference.unpack_k(blk, cfg, 64).numpy()
    scale, offset = (t.numpy() for t in reference.key_group_params(blk, cfg))
    scale_t, offset_t = np.repeat(scale[:, :, 0], 16, axis=1), np.repeat(offset[:, :, 0], 16, axis=1)
    # The page base is the fp16 rounding of the page minimum (up to half an fp16 ulp above it), and
    # its top, base + 255 * step, the fp16 rounding of the step (up to 255 half ulps of the step below
    # the maximum): keys beyond clamp to the grid's ends.
    # The group's grid is made in fp16 (u = step / 3, scale = (b - a) * u, offset = base + a * step,
    # each rounded): its ends move by up to half an fp16 ulp per operation, |offset| * 2^-11 and
    # (b - a) * step * 2^-10 <= 255 * step * 2^-10.
    step = np.repeat(blk.params[:, :, 1].float().numpy(), 128, axis=1)
    tol = np.abs(np.repeat(blk.params[:, :, 0].float().numpy(), 128, axis=1)) * 2.0**-11 + 255 * step * 2.0**-11 + 1e-6
    tol = tol + (np.abs(offset_t) + 255 * step) * 2.0**-10
    assert np.all(np.abs(y - x) <= scale_t / 2 * (1 + 1e-5) + tol)
    assert np.all(x >= offset_t - tol) and np.all(x <= offset_t + 3 * scale_t * (1 + 1e-6) + tol)
    # The outlier's group is coarse, the other groups of its channel and page are not.
    assert scale[0, 0, 0, 3] > 10 * np.median(scale[0, 1:8, 0, 3])
    # 2 + 16 / 16 + 32 / 128 bits per key, 2 + 32 / 64 per value, token scales 32 / (2 * 3 * 64).
    assert OscarConfig(k_group=16, v_group=64, key_ranges="page").effective_bits(3, 64) == pytest.approx(2.875 + 1 / 12)
    for kw in ({"key_ranges": "page"}, {"key_ranges": "page", "k_group": 16, "v_group": 64}, {}):
        c = OscarConfig(**kw)  # type: ignore[arg-type]
        rust = _core.format_cost(shape=(3, 64), bits=2, k_group=c.k_group, v_group=c.v_group, scale_columns=1,
                                 key_grid_page=c.page_size if c.key_ranges == "page" else 0)
        assert rust == (c.bytes_per_token(3, 64), c.effective_bits(3, 64))


def test_page_ranges_config_errors() -> None:
    from oscar_sgl.config import OscarConfigError

    with pytest.raises(OscarConfigError, match="key_ranges must be one of 'group', 'page'"):
        OscarConfig(key_ranges="pages")  # type: ignore[arg-type]
    for clip in ("keys", "both"):
        with pytest.raises(OscarConfigError, match="clips key groups"):
            OscarConfig(key_ranges="page", clip=clip)  # type: ignore[arg-type]
    assert OscarConfig(key_ranges="page", offset="integer", clip="values").label == "oscar+clip-values+page-ranges"
    with pytest.raises(LayoutError, match="whole pages"):
        _core.pack_k_page(np.zeros((1, 24, 8), np.float32).tobytes(), shape=(1, 24, 8), bits=2, k_group=4, page_size=16)
    with pytest.raises(LayoutError, match="key page grid"):
        _core.unpack_k_page(b"\0" * 32, b"\0" * 2, b"\0" * 32, shape=(1, 16, 8), bits=2, k_group=4, page_size=16)
