"""`oscar_sgl.supported`: one table, one check per context, one exception type and one message style."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import transformers

from oscar_sgl import OscarConfig, supported
from oscar_sgl.errors import OscarConfigError

#: What every refusal starts with: the flag, the model property or the variable at fault.
SUBJECT = re.compile(r"^(--[a-z0-9-]+|the model's |the value group |OSCAR_SGL_USE_KERNELS=|OSCAR_SGL_GLUON_DECODE )")


def _refusal(fn, *args, **kwargs) -> str:
    with pytest.raises(OscarConfigError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert SUBJECT.match(msg), msg
    assert "\n" not in msg
    return msg


def test_the_table_names_every_check():
    doc = supported.__doc__ or ""
    checks = [name for name in supported.__all__ if name.startswith("check_")]
    assert len(checks) == 7
    for name in checks:
        assert f"`{name}`" in doc, name


def test_quality_tool_takes_sliding_layers_refuses_linear_and_mla():
    gemma = transformers.Gemma3TextConfig()  # 5 sliding layers per full one: stored, not refused
    assert supported.check_quality_model(OscarConfig(), gemma) == (26, 4, 256)
    hybrid_linear = transformers.Gemma3TextConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    msg = _refusal(supported.check_quality_model, OscarConfig(), hybrid_linear)
    assert msg.startswith("the model's layers must be full or sliding-window attention, got ['linear_attention']")
    no_window = transformers.Gemma3TextConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    no_window.sliding_window = None
    msg = _refusal(supported.check_quality_model, OscarConfig(), no_window)
    assert msg == "the model's sliding_window must be a positive int with sliding layers, got None"
    msg = _refusal(supported.check_quality_model, None, transformers.DeepseekV3Config())
    assert "MLA" in msg
    llama = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, hidden_size=256)
    assert supported.check_quality_model(OscarConfig(v_group=32), llama) == (2, 2, 32)
    msg = _refusal(supported.check_quality_model, OscarConfig(), llama)  # the INT2 default v_group, 64
    assert msg == ("the value group (v_group 64) must divide the model's head_dim, got 32: choose a smaller v_group "
                   "(--oscar-v-group, --v-group)")


def test_server_flags_refusals_share_one_style():
    cfg = OscarConfig()
    for ns in (SimpleNamespace(page_size=16), SimpleNamespace(attention_backend="triton"),
               SimpleNamespace(kv_cache_dtype="fp8_e4m3"), SimpleNamespace(enable_hierarchical_cache=True),
               SimpleNamespace(disaggregation_mode="decode"), SimpleNamespace(enable_unified_memory=True),
               SimpleNamespace(oscar_cuda_graph=True, device="cpu"), SimpleNamespace(enable_deterministic_inference=True)):
        _refusal(supported.check_server_flags, ns, cfg)
    supported.check_server_flags(SimpleNamespace(page_size=128, attention_backend=None, disaggregation_mode="null"), cfg)


def test_kernel_rules():
    ok = dict(bits=2, k_group=32, v_group=32, page_size=128, head_dim=128)
    supported.check_kernel_shape(**ok)
    for bad, part in [({"head_dim": 8, "v_group": 8}, "32-bit words"), ({"head_dim": 96}, "power of two"),
                      ({"bits": 3}, "--oscar-bits"), ({"bits": 4, "v_group": 4}, "--oscar-v-group"),
                      ({"k_group": 8}, "--oscar-k-group"), ({"page_size": 48, "k_group": 16}, "multiple of 32")]:
        assert part in _refusal(supported.check_kernel_shape, **{**ok, **bad})
    supported.check_kernel_device(device_type="cuda", dtype=torch.bfloat16, interpreting=False)
    supported.check_kernel_device(device_type="cpu", dtype=torch.float32, interpreting=True)
    assert _refusal(supported.check_kernel_device, device_type="cuda", dtype=torch.float32,
                    interpreting=False).startswith("--dtype must be bfloat16 or float16")
    assert "TRITON_INTERPRET=1" in _refusal(supported.check_kernel_device, device_type="cpu", dtype=torch.float32,
                                            interpreting=False)


def test_the_gluon_decode_switch_is_checked_at_pool_build(monkeypatch):
    """OSCAR_SGL_GLUON_DECODE: unset, 0 or 1; anything else is refused where the pool is built
    (model load), naming the variable, not at the first decode step."""
    from oscar_sgl.kernels import decode as kdecode

    assert kdecode.GLUON_DEFAULT_ENV == "OSCAR_SGL_GLUON_DECODE"
    for ok in ("0", "1"):
        monkeypatch.setenv("OSCAR_SGL_GLUON_DECODE", ok)
        supported.check_kernel_device(device_type="cuda", dtype=torch.bfloat16, interpreting=False)
    for bad in ("", "true", "2"):
        monkeypatch.setenv("OSCAR_SGL_GLUON_DECODE", bad)
        assert "OSCAR_SGL_GLUON_DECODE must be 0" in _refusal(supported.check_kernel_device, device_type="cuda",
                                                              dtype=torch.bfloat16, interpreting=False)


def test_config_fields_and_layer_shape():
    assert _refusal(OscarConfig.from_flags, {"bits": "--oscar-bits"}, bits=3) == "--oscar-bits must be 2 or 4, got 3"
    with pytest.raises(OscarConfigError, match=r"^page_size must be a positive multiple of k_group \(16\), got 0"):
        OscarConfig(page_size=0)
    assert _refusal(OscarConfig().check_shape, 2, 96).startswith("the model's head_dim must be a power of two")
    assert _refusal(OscarConfig().check_shape, 0, 64) == "the model's KV heads must be positive, got 0"
