"""The SGLang plug-in's registration and startup validation, through SGLang's real argument parsing.

`prepare_server_args` is SGLang 0.5.23's own parser + `ServerArgs.from_cli_args`; the hooks are
applied with SGLang's `HookRegistry`, exactly as `load_plugins()` does in every server process.
"""

from __future__ import annotations

import json
import pickle
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from oscar_sgl.config import OscarConfig  # noqa: E402
from oscar_sgl.sglang import plugin  # noqa: E402
from oscar_sgl.sglang.validate import SERVER_ARGS_ATTR, OscarStartupError, check_model  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "/nonexistent-model-path"  # argument parsing never opens the model


@pytest.fixture(scope="module")
def parse():
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import prepare_server_args

    plugin.register()
    HookRegistry.apply_hooks()

    def run(*argv: str):
        return prepare_server_args(["--model-path", MODEL, "--device", "cpu", *argv])

    return run


@pytest.mark.parametrize("target", [t for t, _, _ in plugin.HOOKS])
def test_every_hook_target_exists(target):
    """SGLang's registry only logs a missing target: an upgrade that renames one must fail here."""
    obj = pkgutil.resolve_name(target)
    assert callable(obj), target


def test_register_is_cheap_and_idempotent():
    code = (
        "import sys; import oscar_sgl.sglang.plugin as p; import oscar_sgl.sglang as s; "
        "bad = [m for m in ('torch', 'sglang', 'sglang.srt.server_args') if m in sys.modules]; "
        "assert not bad, bad; p.register(); p.register(); "
        "from sglang.srt.plugins.hook_registry import HookRegistry as H; "
        "n = sum(len(v) for k, v in H._hooks.items() if k in {t for t, _, _ in p.HOOKS}); "
        "assert n == len(p.HOOKS), n; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(HERE.parent / "python")})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_oscar_flags_parse_and_reach_workers(parse):
    sa = parse("--kv-cache", "oscar", "--oscar-bits", "4", "--oscar-page-size", "64", "--oscar-k-group", "16",
               "--oscar-norm-scope", "head")
    assert sa.attention_backend == "oscar"
    assert sa.page_size == 64
    want = OscarConfig(bits=4, k_group=16, residual=64, norm_scope="head").to_dict()
    assert getattr(sa, SERVER_ARGS_ATTR) == want
    # Worker processes get the record through pickle (ServerArgs.__reduce__).
    clone = pickle.loads(pickle.dumps(sa))
    assert getattr(clone, SERVER_ARGS_ATTR) == want
    assert plugin.oscar_config_of(clone) == OscarConfig(**want)


def test_decode_cuda_graphs_on_by_default_on_cuda_and_prefill_graphs_always_off(parse):
    sa = parse("--kv-cache", "oscar")  # --device cpu: the reference path has no graph path
    assert sa.disable_decode_cuda_graph and sa.disable_prefill_cuda_graph
    for extra in ((), ("--oscar-cuda-graph",)):  # the old opt-in flag is still accepted
        sa = parse("--kv-cache", "oscar", *extra, "--device", "cuda")  # parsing touches no GPU
        assert not sa.disable_decode_cuda_graph and sa.disable_prefill_cuda_graph
    sa = parse("--kv-cache", "oscar", "--device", "cuda", "--disable-decode-cuda-graph")
    assert sa.disable_decode_cuda_graph
    with pytest.raises(OscarStartupError, match="needs a CUDA device"):
        parse("--kv-cache", "oscar", "--oscar-cuda-graph", "--device", "cpu")


def test_default_kv_cache_is_untouched(parse):
    sa = parse()
    assert getattr(sa, SERVER_ARGS_ATTR, None) is None
    assert sa.attention_backend is None
    assert plugin.oscar_config_of(sa) is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--oscar-bits", "3"], "--oscar-bits must be 2 or 4"),
        (["--oscar-page-size", "48", "--oscar-k-group", "32"], "--oscar-page-size must be a non-negative multiple of k_group=32"),
        (["--oscar-k-group", "24"], "--oscar-k-group must be a positive power of two"),
        (["--page-size", "16"], "--page-size 16 differs from --oscar-page-size 128"),
        (["--attention-backend", "torch_native"], "needs the oscar attention backend"),
        (["--enable-hierarchical-cache"], "HiCache"),
        (["--disaggregation-mode", "prefill"], "PD disaggregation"),
        (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm"),
    ],
)
def test_bad_flags_fail_at_startup(parse, argv, message):
    with pytest.raises(OscarStartupError) as e:
        parse("--kv-cache", "oscar", *argv)
    assert message in str(e.value)


def test_kv_cache_rejects_unknown_value(parse):
    with pytest.raises(SystemExit):
        parse("--kv-cache", "int2")


def _model_config(tmp_path: Path, **overrides):
    """SGLang's real ModelConfig over a copy of the converted SmolLM2 config with `overrides`."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang_support.harness import converted_model

    src = Path(converted_model())
    dst = tmp_path / "model"
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(overrides)
    (dst / "config.json").write_text(json.dumps(cfg))
    return ModelConfig(str(dst))


def _check(mc, cfg=OscarConfig(), tp=1, **kw):
    args = dict(use_mla=False, is_hybrid_swa=False, is_hybrid_linear=False)
    args.update(kw)
    check_model(cfg, mc, tp_size=tp, **args)


def test_model_checks(tmp_path):
    mc = _model_config(tmp_path)  # SmolLM2: 9 query heads, 3 KV heads, head_dim 64
    _check(mc)
    _check(mc, tp=3)  # whole KV heads per rank
    with pytest.raises(OscarStartupError, match="do not divide across --tp-size 2"):
        _check(mc, tp=2)
    with pytest.raises(OscarStartupError, match="MLA"):
        _check(mc, use_mla=True)
    with pytest.raises(OscarStartupError, match="sliding-window"):
        _check(mc, is_hybrid_swa=True)
    with pytest.raises(OscarStartupError, match="linear-attention"):
        _check(mc, is_hybrid_linear=True)


def test_model_head_dim_not_pow2(tmp_path):
    mc = _model_config(tmp_path, num_attention_heads=12, num_key_value_heads=4, head_dim=48)
    assert mc.head_dim == 48
    with pytest.raises(OscarStartupError, match="head_dim must be a power of two"):
        _check(mc, cfg=OscarConfig(v_group=16))


def test_help_lists_the_flags():
    """`python -m sglang.launch_server --help` through the real entry point (plugin discovery)."""
    from sglang_support.harness import server_env

    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True,
                         text=True, timeout=300, env=server_env(), cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--kv-cache {default,oscar}", "--oscar-bits", "--oscar-k-group", "--oscar-v-group",
                 "--oscar-page-size", "--oscar-norm-scope"):
        assert flag in out.stdout, flag


def _loads_nccl() -> bool:
    import ctypes

    import torch

    if torch.version.cuda is None:
        return False
    try:
        ctypes.CDLL("libnccl.so.2")
    except OSError:
        return False
    return True


def test_cpu_tensor_parallel_needs_sglang_fallback(parse, monkeypatch):
    """`--device cpu --tp-size 3` with PyPI's CUDA torch: SGLang would build a PyNccl communicator on
    the CPU and crash in a scheduler; we say what to set at startup instead. With the setting, the
    same flags parse (test_sglang_tp.py runs that server)."""
    if not _loads_nccl():
        pytest.skip("this torch has no loadable libnccl.so.2: SGLang falls back to gloo by itself")
    monkeypatch.delenv("SGLANG_NCCL_SO_PATH", raising=False)
    with pytest.raises(OscarStartupError, match="SGLANG_NCCL_SO_PATH=none"):
        parse("--kv-cache", "oscar", "--tp-size", "3")
    parse("--tp-size", "3")  # without --kv-cache oscar the plug-in stays out of the way
    assert parse("--kv-cache", "oscar").tp_size == 1  # TP = 1 needs nothing
    monkeypatch.setenv("SGLANG_NCCL_SO_PATH", "none")
    sa = parse("--kv-cache", "oscar", "--tp-size", "3")
    assert sa.tp_size == 3 and sa.attention_backend == "oscar"
