"""The torch reference: rotation, quantizer, packing, blocks and attention (docs/LAYOUT.md)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oscar_sgl import OscarConfig
from oscar_sgl.config import PAPER_FORMAT
from oscar_sgl import reference as ref


def sylvester(d: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(d)


@pytest.mark.parametrize("d", [1, 2, 64, 128, 256])
def test_hadamard_is_normalized_sylvester(d):
    x = torch.randn(5, d)
    torch.testing.assert_close(ref.hadamard(x), x @ sylvester(d), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref.hadamard(ref.hadamard(x)), x, rtol=1e-5, atol=1e-5)


def test_hadamard_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        ref.hadamard(torch.randn(3, 96))


def test_rotation_preserves_dot_products():
    q, k = torch.randn(4, 128), torch.randn(9, 128)
    torch.testing.assert_close(ref.hadamard(q) @ ref.hadamard(k).T, q @ k.T, rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 4]), d=st.sampled_from([8, 64, 256]), rows=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(bits, d, rows, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (rows, d), generator=g, dtype=torch.uint8)
    packed = ref.pack_codes(q, bits)
    assert packed.shape == (rows, d * bits // 8)
    assert torch.equal(ref.unpack_codes(packed, bits), q)


def test_pack_is_little_endian_along_channels():
    q = torch.tensor([[1, 2, 3, 0, 3, 3, 3, 3]], dtype=torch.uint8)
    assert ref.pack_codes(q, 2).tolist() == [[1 | 2 << 2 | 3 << 4, 0xFF]]
    q4 = torch.tensor([[0xA, 0x3]], dtype=torch.uint8)
    assert ref.pack_codes(q4, 4).tolist() == [[0x3A]]


@settings(max_examples=80, deadline=None)
@given(bits=st.sampled_from([2, 4]), scale=st.sampled_from([1e-3, 1.0, 30.0, 1000.0]), seed=st.integers(0, 2**31 - 1))
def test_quantizer_error_within_half_step(bits, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 32, generator=g) * scale + torch.randn(7, 1, generator=g) * scale
    q, sc, off = ref.quantize_groups(x, bits, dim=1)
    assert int(q.max()) <= (1 << bits) - 1
    xh = q.float() * sc.float() + off.float()
    step = sc.float()
    # Half a step from rounding the code, half a step from rounding the zero point, fp16 params.
    bound = step * 1.0 + x.abs().amax(dim=1, keepdim=True) * 2e-3
    assert bool(((xh - x).abs() <= bound).all())


@pytest.mark.parametrize("value", [0.0, 1.5, -3.25])
def test_constant_group_is_exact_and_finite(value):
    x = torch.full((3, 32), value)
    q, sc, off = ref.quantize_groups(x, 2, dim=1)
    xh = q.float() * sc.float() + off.float()
    assert torch.isfinite(xh).all()
    torch.testing.assert_close(xh, x)


def test_quantizer_rejects_non_finite():
    x = torch.randn(2, 32)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        ref.quantize_groups(x, 2, dim=1)


@pytest.mark.parametrize("scope, cols", [("layer", 1), ("head", 3)])
def test_token_scales_shape_and_zero_rule(scope, cols):
    k = torch.randn(3, 40, 64)
    k[:, 5] = 0
    s = ref.token_scales(k, scope)
    assert s.shape == (40, cols)
    assert bool((s[5] == 1).all())
    if scope == "layer":
        torch.testing.assert_close(s[:, 0], k.permute(1, 0, 2).reshape(40, -1).norm(dim=1).where(s[:, 0] != 1, torch.ones(40)))


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("method", ["kivi", "rotation-only", "scaling-only", "oscar"])
def test_block_shapes_and_bytes(bits, method):
    cfg = OscarConfig.for_method(method, bits=bits, **PAPER_FORMAT)  # the group format's shapes
    h, n, d = 3, 128, 64
    kb, vb = ref.seal(torch.randn(h, n, d), torch.randn(h, n, d), cfg)
    assert kb.codes.shape == (h, n, d * bits // 8) and kb.codes.dtype == torch.uint8
    assert kb.params.shape == (h, n // 32, 2, d) and kb.params.dtype == torch.float16
    assert vb.codes.shape == (h, n, d * bits // 8)
    assert vb.params.shape == (h, n, 2, d // 32) and vb.params.dtype == torch.float16
    assert (kb.scale is not None) == cfg.token_scaling
    assert kb.nbytes() + vb.nbytes() == pytest.approx(n * cfg.bytes_per_token(h, d))


@pytest.mark.parametrize("bits, bound", [(2, 0.45), (4, 0.1)])
def test_round_trip_error(bits, bound):
    cfg = OscarConfig(bits=bits, page_size=64)
    k, v = torch.randn(2, 64, 128), torch.randn(2, 64, 128)
    kh, vh = ref.quantize_dequantize(k, v, cfg)
    assert ((kh - k).norm() / k.norm()).item() < bound
    assert ((vh - v).norm() / v.norm()).item() < bound


def test_scaling_rescues_a_tiny_token():
    """TNI: a sink-like tiny token in a group of large ones is flattened by kivi, kept by scaling."""
    k = torch.randn(1, 32, 64) * 10
    k[0, 0] = torch.randn(64) * 0.05
    v = torch.randn(1, 32, 64)
    err = {}
    for method in ("kivi", "scaling-only"):
        kh, _ = ref.quantize_dequantize(k, v, OscarConfig.for_method(method, **PAPER_FORMAT))
        err[method] = ((kh[0, 0] - k[0, 0]).norm() / k[0, 0].norm()).item()
    assert err["scaling-only"] < 0.6 * err["kivi"]


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group", [1, 3])
def test_decode_attention_matches_dense_attention_over_restored_kv(bits, group):
    """The kernel-style computation (rotated basis, s on logits) equals plain attention over
    restore_k/restore_v: the identity the HF cache relies on."""
    cfg = OscarConfig(bits=bits, page_size=64)
    h, d = 2, 64
    q = torch.randn(h * group, d)
    blocks = [ref.seal(torch.randn(h, 64, d), torch.randn(h, 64, d), cfg) for _ in range(2)]
    kt, vt = torch.randn(h, 5, d), torch.randn(h, 5, d)
    out = ref.decode_attention(q, [b[0] for b in blocks], [b[1] for b in blocks], kt, vt, cfg, sm_scale=d**-0.5)
    k = torch.cat([ref.restore_k(b[0], cfg, d) for b in blocks] + [kt], dim=1)
    v = torch.cat([ref.restore_v(b[1], cfg, d) for b in blocks] + [vt], dim=1)
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    p = torch.softmax(torch.einsum("hd,hnd->hn", q, k) * d**-0.5, dim=-1)
    dense = torch.einsum("hn,hnd->hd", p, v)
    torch.testing.assert_close(out, dense, rtol=1e-4, atol=1e-4)


def _dense_causal(q, k, v, sm_scale):
    """Plain causal attention in the model basis: `q` `[t, Hq, D]` are the last t of the n
    positions of `k`, `v` `[H, n, D]`."""
    t, hq, _ = q.shape
    n = k.shape[1]
    group = hq // k.shape[0]
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    logits = torch.einsum("thd,hnd->thn", q, k) * sm_scale
    mask = torch.arange(n)[None, :] > torch.arange(n - t, n)[:, None]
    p = torch.softmax(logits.masked_fill(mask[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("thn,hnd->thd", p, v)


def _history(cfg, h, d, sealed, exact, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = [ref.seal(torch.randn(h, 32, d, generator=g) * 3, torch.randn(h, 32, d, generator=g), cfg) for _ in range(sealed)]
    return [b[0] for b in blocks], [b[1] for b in blocks], torch.randn(h, exact, d, generator=g), torch.randn(h, exact, d, generator=g)


@pytest.mark.parametrize("method", ["oscar", "kivi", "scaling-only"])
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize(
    "sealed, exact, t",
    [(0, 9, 9), (2, 13, 5), (1, 4, 4), (2, 1, 1), (1, 0, 7)],
    ids=["fresh-prompt", "prefix-hit-open-page", "prefix-hit", "decode", "queries-in-sealed-tokens"],
)
def test_extend_attention_matches_dense_causal_attention_over_restored_kv(method, bits, sealed, exact, t):
    """Kernel-style extend (rotated basis, s on the logits) equals masked softmax attention over
    restore_k/restore_v followed by the exact tokens, causal over positions."""
    cfg = OscarConfig.for_method(method, bits=bits, page_size=32, norm_scope="head" if method == "scaling-only" else "layer")
    h, group, d = 2, 3, 64
    kbs, vbs, ke, ve = _history(cfg, h, d, sealed, exact, seed=bits + sealed + exact)
    q = torch.randn(t, h * group, d)
    out = ref.extend_attention(q, kbs, vbs, ke, ve, cfg, sm_scale=d**-0.5)
    k = torch.cat([ref.restore_k(b, cfg, d) for b in kbs] + [ke], dim=1)
    v = torch.cat([ref.restore_v(b, cfg, d) for b in vbs] + [ve], dim=1)
    assert out.shape == (t, h * group, d) and out.dtype == torch.float32
    torch.testing.assert_close(out, _dense_causal(q, k, v, d**-0.5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits", [2, 4])
def test_extend_attention_row_is_decode_attention_over_its_prefix(bits):
    """Query i of an extend step equals one decode step at its position: the same sealed blocks,
    the exact tokens up to and including its own."""
    cfg = OscarConfig(bits=bits, page_size=32)
    h, group, d, m, t = 2, 2, 64, 11, 6
    kbs, vbs, ke, ve = _history(cfg, h, d, 2, m, seed=bits)
    q = torch.randn(t, h * group, d)
    out = ref.extend_attention(q, kbs, vbs, ke, ve, cfg, sm_scale=0.125)
    for i in range(t):
        own = m - t + i + 1
        dec = ref.decode_attention(q[i], kbs, vbs, ke[:, :own], ve[:, :own], cfg, sm_scale=0.125)
        torch.testing.assert_close(out[i], dec, rtol=1e-5, atol=1e-5)


def test_extend_attention_rejects_more_queries_than_tokens():
    cfg = OscarConfig(bits=2, page_size=32)
    kbs, vbs, ke, ve = _history(cfg, 1, 64, 1, 2)
    with pytest.raises(ValueError, match="35 queries over a sequence of 34 tokens"):
        ref.extend_attention(torch.randn(35, 1, 64), kbs, vbs, ke, ve, cfg, sm_scale=0.125)
