"""OscarCache on the real SmolLM2 (GQA: 9 query heads over 3 KV heads, head_dim 64)."""

import pytest
import torch
from transformers import DynamicCache

from oscar_sgl import OscarCache, OscarConfig, OscarConfigError
from oscar_sgl import reference as ref


@pytest.mark.parametrize("cfg", [OscarConfig(bits=2), OscarConfig(bits=2, key_ranges="page", k_group=16, v_group=64)],
                         ids=["default", "page-ranges"])
def test_generates_and_reports_true_memory(smollm2, emma_ids, cfg):
    model, tok = smollm2
    cache = OscarCache(model, cfg)
    prompt = emma_ids[:, :300]
    with torch.inference_mode():
        out = model.generate(prompt, past_key_values=cache, max_new_tokens=12, do_sample=False)
    assert out.shape[1] == 312
    assert tok.decode(out[0, 300:]).strip()
    # 311 tokens went through the cache (the last generated one is never fed back).
    mem = cache.memory()
    assert mem["tokens"] == 311
    cache.flush()
    mem = cache.memory()
    layers, heads, d = 30, 3, 64
    sealed = 256  # two blocks of R=128
    assert mem["packed_bytes"] == pytest.approx(layers * sealed * cfg.bytes_per_token(heads, d))
    # The tail is kept in the model dtype (fp32 here): 311 - 256 tokens, K and V.
    assert mem["tail_bytes"] == layers * 2 * (311 - sealed) * heads * d * 4
    assert mem["effective_bits"] == pytest.approx(cfg.effective_bits(heads, d))
    assert mem["bf16_bytes"] / mem["packed_bytes"] > 311 / 256 * 16 / 3.1


def test_each_token_quantized_exactly_once(smollm2, emma_ids):
    model, _ = smollm2
    cache = OscarCache(model, OscarConfig(bits=2, page_size=32))
    layer = cache.layers[0]
    with torch.inference_mode():
        model(emma_ids[:, :40], past_key_values=cache)
        cache.flush()
        first = list(layer.k_blocks[0])
        assert layer.sealed_k_tokens == 32 and layer.k_tail.shape[2] == 8
        for i in range(40, 80):
            model(emma_ids[:, i : i + 1], past_key_values=cache)
    # Earlier blocks are the very same objects: never re-quantized.
    assert layer.k_blocks[0][: len(first)] == first
    assert all(a is b for a, b in zip(layer.k_blocks[0], first))
    # Lazy flush: the step's own tokens stay exact until the next update.
    assert layer.sealed_k_tokens == 64 and layer.k_tail.shape[2] == 16
    assert sum(b.num_tokens for b in layer.k_blocks[0]) == layer.sealed_k_tokens


def test_sealed_blocks_hold_the_reference_bytes(smollm2, emma_ids):
    """What the cache stores is exactly the reference's packing of the model's own post-RoPE keys."""
    model, _ = smollm2
    cfg = OscarConfig(bits=4)
    exact = DynamicCache(config=model.config)
    cache = OscarCache(model, cfg)
    with torch.inference_mode():
        model(emma_ids[:, :128], past_key_values=exact)
        model(emma_ids[:, :128], past_key_values=cache)
    cache.flush()
    k = exact.layers[5].keys[0]
    kb, vb = ref.seal(k, exact.layers[5].values[0], cfg)
    got_k, got_v = cache.layers[5].k_blocks[0][0], cache.layers[5].v_blocks[0][0]
    assert torch.equal(got_k.codes, kb.codes) and torch.equal(got_k.params, kb.params)
    assert torch.equal(got_v.codes, vb.codes) and torch.equal(got_v.params, vb.params)


def test_int4_close_to_full_precision_logits(smollm2, emma_ids):
    model, _ = smollm2
    ids = emma_ids[:, :256]
    with torch.inference_mode():
        full = model(ids).logits[0, -1]
        cache = OscarCache(model, OscarConfig(bits=4))
        model(ids[:, :128], past_key_values=cache)
        cache.flush()
        q = model(ids[:, 128:], past_key_values=cache).logits[0, -1]
    assert torch.argmax(q) == torch.argmax(full)
    assert ((q - full).norm() / full.norm()).item() < 0.05


def test_rejects_unsupported_model_shape_at_construction(smollm2):
    model, _ = smollm2
    cfg = model.config.__class__(**{**model.config.to_dict(), "head_dim": 48})
    with pytest.raises(OscarConfigError, match="power of two"):
        OscarCache(cfg, OscarConfig())


def test_batch_of_two_sequences(smollm2, emma_ids):
    model, _ = smollm2
    ids = torch.cat([emma_ids[:, :64], emma_ids[:, 500:564]])
    cache = OscarCache(model, OscarConfig(bits=4, page_size=32))
    with torch.inference_mode():
        out = model(ids, past_key_values=cache).logits
        ref_out = model(ids).logits
    torch.testing.assert_close(out, ref_out)  # prefill attention is exact
    cache.flush()
    assert len(cache.layers[0].k_blocks) == 2 and cache.layers[0].sealed_k_tokens == 64
