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
from oscar_sgl.errors import OscarConfigError  # noqa: E402
from oscar_sgl.sglang.plugin import SERVER_ARGS_ATTR  # noqa: E402
from oscar_sgl.supported import check_server_model  # noqa: E402

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
    want = OscarConfig(bits=4, k_group=16, page_size=64, norm_scope="head").to_dict()
    assert getattr(sa, SERVER_ARGS_ATTR) == want
    # Worker processes get the record through pickle (ServerArgs.__reduce__).
    clone = pickle.loads(pickle.dumps(sa))
    assert getattr(clone, SERVER_ARGS_ATTR) == want
    assert plugin.oscar_config_of(clone) == OscarConfig(**want)


def test_oscar_prefill_flag_defaults_to_position_and_reaches_workers(parse):
    sa = parse("--kv-cache", "oscar")
    assert plugin.prefill_mode_of(sa) == "position"
    sa = parse("--kv-cache", "oscar", "--oscar-prefill", "exact")
    clone = pickle.loads(pickle.dumps(sa))
    assert plugin.prefill_mode_of(clone) == "exact"
    with pytest.raises(SystemExit):
        parse("--kv-cache", "oscar", "--oscar-prefill", "chunked")
    from oscar_sgl.errors import OscarConfigError
    from oscar_sgl.sglang.pool import PoolSettings

    with pytest.raises(OscarConfigError, match="--oscar-prefill must be one of position, exact"):
        PoolSettings(prefill="chunk")


def test_ablation_flags_reach_the_config(parse):
    sa = parse("--kv-cache", "oscar", "--oscar-no-rotation", "--oscar-no-token-scaling")
    assert plugin.oscar_config_of(sa) == OscarConfig(rotation=False, token_scaling=False)
    assert plugin.oscar_config_of(sa).method == "kivi"


def test_seal_quantizer_flags_reach_the_config(parse):
    """--oscar-offset / --oscar-clip (docs/OSCAR.md §2.3) land in the pickled config the pool reads;
    unset, they are the defaults."""
    sa = parse("--kv-cache", "oscar", "--oscar-offset", "min", "--oscar-clip", "values")
    want = OscarConfig(offset="min", clip="values")
    assert plugin.oscar_config_of(pickle.loads(pickle.dumps(sa))) == want
    assert plugin.oscar_config_of(parse("--kv-cache", "oscar", "--oscar-clip", "both", "--oscar-key-ranges", "group")).clip_keys
    default = plugin.oscar_config_of(parse("--kv-cache", "oscar"))
    assert (default.offset, default.clip) == ("min", "values")  # the INT2 default
    int4 = plugin.oscar_config_of(parse("--kv-cache", "oscar", "--oscar-bits", "4"))
    assert (int4.offset, int4.clip, int4.key_ranges, int4.k_group, int4.v_group) == ("integer", "none", "group", 32, 32)
    kivi = plugin.oscar_config_of(parse("--kv-cache", "oscar", "--oscar-no-rotation", "--oscar-no-token-scaling"))
    assert (kivi.offset, kivi.clip, kivi.key_ranges, kivi.k_group, kivi.v_group) == ("integer", "none", "group", 32, 32)
    for bad in (("--oscar-offset", "mean"), ("--oscar-clip", "all")):
        with pytest.raises(SystemExit):
            parse("--kv-cache", "oscar", *bad)


def test_key_ranges_flag_reaches_the_config(parse, capsys):
    """--oscar-key-ranges page (docs/LAYOUT.md §1) lands in the pickled config; with key clipping it
    is refused at flag parsing, naming both flags."""
    sa = parse("--kv-cache", "oscar", "--oscar-key-ranges", "page", "--oscar-k-group", "16", "--oscar-v-group", "64")
    assert plugin.oscar_config_of(pickle.loads(pickle.dumps(sa))) == OscarConfig(key_ranges="page", k_group=16, v_group=64)
    assert plugin.oscar_config_of(parse("--kv-cache", "oscar")).key_ranges == "page"
    assert plugin.oscar_config_of(parse("--kv-cache", "oscar", "--oscar-bits", "4")).key_ranges == "group"
    with pytest.raises(SystemExit):
        parse("--kv-cache", "oscar", "--oscar-key-ranges", "pages")
    with pytest.raises(SystemExit):
        parse("--kv-cache", "oscar", "--oscar-key-ranges", "page", "--oscar-clip", "keys")
    err = capsys.readouterr().err
    assert "--oscar-clip 'keys' clips key groups, which --oscar-key-ranges 'page'" in err, err[-500:]


def test_key_rotation_flags_reach_the_config(parse, capsys):
    """--oscar-key-rotation (default: the weights rule, as OscarCache) and its threshold land in
    the pickled config; a bad threshold is refused at flag parsing, naming the flag."""
    assert plugin.oscar_config_of(parse("--kv-cache", "oscar")).key_rotation == "weights"
    sa = parse("--kv-cache", "oscar", "--oscar-key-rotation", "all")
    assert plugin.oscar_config_of(pickle.loads(pickle.dumps(sa))).key_rotation == "all"
    sa = parse("--kv-cache", "oscar", "--oscar-key-rotation-min-alignment", "1.1")
    assert plugin.oscar_config_of(pickle.loads(pickle.dumps(sa))).key_rotation_min_alignment == 1.1
    with pytest.raises(SystemExit):
        parse("--kv-cache", "oscar", "--oscar-key-rotation", "some")
    err = _startup_error(parse, capsys, "--kv-cache", "oscar", "--oscar-key-rotation-min-alignment", "-1")
    assert "--oscar-key-rotation-min-alignment must be a finite positive number, got -1.0" in err


def test_sliding_layers_flag_reaches_the_config_and_the_pool(parse, monkeypatch):
    """--oscar-sliding-layers (default quantized) lands in the pickled config; with bf16 the pool
    class SGLang resolves keeps the loaded model's sliding-window layers (and says so in the log),
    and a model without any is told that the flag changes nothing."""
    import logging
    from types import SimpleNamespace

    import torch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.runtime_context import get_parallel

    assert plugin.oscar_config_of(parse("--kv-cache", "oscar")).sliding_layers == "quantized"
    sa = parse("--kv-cache", "oscar", "--oscar-sliding-layers", "bf16")
    assert plugin.oscar_config_of(pickle.loads(pickle.dumps(sa))).sliding_layers == "bf16"
    with pytest.raises(SystemExit):
        parse("--kv-cache", "oscar", "--oscar-sliding-layers", "fp8")
    hook = next(fn for target, kind, fn in plugin.HOOKS if target.endswith("_resolve_kv_pool_class"))

    def resolve(windows):
        model = torch.nn.ModuleList([RadixAttention(2, 64, 0.125, 1, layer_id=i, sliding_window_size=w)
                                     for i, w in enumerate(windows)])
        kvc = SimpleNamespace(server_args=sa, model=model, use_mla_backend=False, is_hybrid_swa=False,
                              mambaish_config=None, model_config=SimpleNamespace(
                                  get_num_kv_heads=lambda tp: 1, head_dim=64, num_attention_heads=2,
                                  attention_arch=None, is_encoder_decoder=False))
        with get_parallel().override(attn_tp_size=1, tp_rank=0):
            return hook(None, kvc, kind="mha", default=object)

    # SGLang's argument parsing reconfigures the root logger (pytest's caplog handler is gone): a
    # handler of our own on the plug-in's logger
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger(plugin.__name__)
    monkeypatch.setattr(log, "level", logging.INFO)
    monkeypatch.setattr(log, "handlers", [*log.handlers, handler])  # the old list comes back after the test

    import oscar_sgl.supported as supported

    monkeypatch.setattr(supported, "check_server_model", lambda *a, **k: None)  # tested on their own
    assert resolve([511, -1, 511, -1]).oscar_settings.bf16_layers == (0, 2)
    assert "2 sliding-window layers kept in the KV dtype: [0, 2]" in lines[-1], lines
    assert resolve([-1, -1]).oscar_settings.bf16_layers == ()
    assert "--oscar-sliding-layers bf16 changes nothing" in lines[-1], lines


def test_decode_cuda_graphs_on_by_default_on_cuda_and_prefill_graphs_always_off(parse):
    sa = parse("--kv-cache", "oscar")  # --device cpu: the reference path has no graph path
    assert sa.disable_decode_cuda_graph and sa.disable_prefill_cuda_graph
    for extra in ((), ("--oscar-cuda-graph",)):  # the old opt-in flag is still accepted
        sa = parse("--kv-cache", "oscar", *extra, "--device", "cuda")  # parsing touches no GPU
        assert not sa.disable_decode_cuda_graph and sa.disable_prefill_cuda_graph
    sa = parse("--kv-cache", "oscar", "--device", "cuda", "--disable-decode-cuda-graph")
    assert sa.disable_decode_cuda_graph

def test_oscar_cuda_graph_on_cpu_is_one_line(parse, capsys):
    assert "needs a CUDA device" in _startup_error(parse, capsys, "--kv-cache", "oscar", "--oscar-cuda-graph",
                                                   "--device", "cpu")


def test_default_kv_cache_is_untouched(parse):
    sa = parse()
    assert getattr(sa, SERVER_ARGS_ATTR, None) is None
    assert sa.attention_backend is None
    assert plugin.oscar_config_of(sa) is None


def _startup_error(parse, capsys, *argv: str) -> str:
    """What SGLang's own parsing + our from_cli_args hook print for `argv`; they must exit with 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--kv-cache", "oscar", "--oscar-bits", "3"], "error: --oscar-bits must be 2 or 4, got 3"),
        (["--kv-cache", "oscar", "--oscar-page-size", "48", "--oscar-k-group", "32"],
         "error: --oscar-page-size must be a positive multiple of --oscar-k-group (32), got 48: a page is sealed "
         "whole, and no key group may straddle a seal"),
        (["--kv-cache", "oscar", "--oscar-residual", "0"],  # the old name of --oscar-page-size
         "error: --oscar-page-size must be a positive multiple of --oscar-k-group (16), got 0: a page is sealed "
         "whole, and no key group may straddle a seal"),
        (["--kv-cache", "oscar", "--oscar-v-group", "24"], "error: --oscar-v-group must be a positive power of two, got 24"),
        (["--kv-cache", "oscar", "--oscar-k-group", "4294967296"],
         "error: --oscar-k-group must be below 2^31, got 4294967296"),
        (["--oscar-k-group", "32"], "error: --oscar-k-group needs --kv-cache oscar, got --kv-cache default"),
        (["--kv-cache", "default", "--oscar-norm-scope", "head"],
         "error: --oscar-norm-scope needs --kv-cache oscar, got --kv-cache default"),
        (["--oscar-no-rotation"], "error: --oscar-no-rotation needs --kv-cache oscar, got --kv-cache default"),
        (["--oscar-offset", "min"], "error: --oscar-offset needs --kv-cache oscar, got --kv-cache default"),
        (["--kv-cache", "default", "--oscar-clip", "values"], "error: --oscar-clip needs --kv-cache oscar, got --kv-cache default"),
        (["--oscar-cuda-graph", "--device", "cuda"], "error: --oscar-cuda-graph needs --kv-cache oscar, got --kv-cache default"),
        (["--kv-cache", "oscar", "--page-size", "16"],
         "error: --page-size must equal --oscar-page-size (128) with --kv-cache oscar, got 16: an OScaR page is the "
         "unit of sealing; omit --page-size and it follows --oscar-page-size"),
        (["--kv-cache", "oscar", "--oscar-cuda-graph", "--device", "cpu"],
         "error: --oscar-cuda-graph needs a CUDA device, got --device cpu: it keeps CUDA graphs of decode steps"),
        (["--kv-cache", "oscar", "--attention-backend", "torch_native"],
         "error: --attention-backend must be omitted with --kv-cache oscar, got torch_native: only the oscar "
         "backend reads the packed pool"),
        (["--kv-cache", "oscar", "--decode-attention-backend", "triton"],
         "error: --decode-attention-backend must be omitted with --kv-cache oscar, got triton: it would read the "
         "packed pool as BF16"),
        (["--kv-cache", "oscar", "--kv-cache-dtype", "fp8_e4m3"],
         "error: --kv-cache-dtype must be omitted with --kv-cache oscar, got fp8_e4m3: OScaR replaces it"),
        (["--kv-cache", "oscar", "--enable-hierarchical-cache"],
         "error: --enable-hierarchical-cache (HiCache) must be off with --kv-cache oscar: its host tier "
         "copies K/V only and would drop the per-page scales"),
        (["--kv-cache", "oscar", "--disaggregation-mode", "prefill"],
         "error: --disaggregation-mode (PD disaggregation) must be off with --kv-cache oscar: the KV "
         "transfer moves scales only for MXFP8"),
        (["--oscar-prefill", "exact"], "error: --oscar-prefill needs --kv-cache oscar, got --kv-cache default"),
        (["--kv-cache", "oscar", "--enable-deterministic-inference"],
         "error: --enable-deterministic-inference must be off with --kv-cache oscar: SGLang's deterministic mode "
         "runs only its own attention backends (fa3, flashinfer, triton, ...); OScaR's default --oscar-prefill "
         "position already gives the same answer cold, warm and at any --chunked-prefill-size, and what remains "
         "batch-dependent is SGLang's own matmuls (README, 'The same answer whether cached or not')"),
        (["--kv-cache", "oscar", "--speculative-algorithm", "EAGLE"],
         "error: --speculative-algorithm must be off with --kv-cache oscar: speculative paths write "
         "through set_kv_buffer_prefix_valid and move slots without scales"),
    ],
)
def test_bad_flags_print_one_line_and_exit_2(parse, capsys, argv, line):
    assert _startup_error(parse, capsys, *argv) == line + "\n"


#: The server commands of issue 11 item 3, run as a user runs them (real launcher, plug-in found
#: through its entry point, the real converted model) and the one line each must print. `-W
#: ignore::UserWarning` silences SGLang's own import-time warnings ("Triton is not supported on
#: current platform", ...), which it prints before any plug-in runs, so stderr holds only our line.
SERVER_COMMANDS = [
    (["--kv-cache", "oscar", "--oscar-bits", "3"], "error: --oscar-bits must be 2 or 4, got 3"),
    (["--kv-cache", "oscar", "--oscar-page-size", "100"],
     "error: --oscar-page-size must be a positive multiple of --oscar-k-group (16), got 100: a page is sealed "
     "whole, and no key group may straddle a seal"),
    (["--kv-cache", "oscar", "--oscar-k-group", "7"], "error: --oscar-k-group must be a positive power of two, got 7"),
    (["--oscar-bits", "3"], "error: --oscar-bits needs --kv-cache oscar, got --kv-cache default"),
    (["--kv-cache", "oscar", "--oscar-page-size", "0"],
     "error: --oscar-page-size must be a positive multiple of --oscar-k-group (16), got 0: a page is sealed "
     "whole, and no key group may straddle a seal"),
]


def test_server_commands_print_their_line_and_exit_2(parse, capsys):
    """Every command of `SERVER_COMMANDS` through SGLang's own parsing and our hook, in this process."""
    for argv, line in SERVER_COMMANDS:
        assert _startup_error(parse, capsys, *argv) == line + "\n", argv


#: Through the real launcher: one command whose flag value is refused and one whose flag needs
#: `--kv-cache oscar`, the two ways our hook refuses (each run imports SGLang, ~14-19 s of CI; the
#: other three of `SERVER_COMMANDS` refuse on the same path, checked in process above).
@pytest.mark.parametrize("argv, line", [SERVER_COMMANDS[0], SERVER_COMMANDS[3]])
def test_launch_server_bad_flags_one_line_no_traceback(argv, line):
    from sglang_support.harness import converted_model, server_env

    cmd = [sys.executable, "-W", "ignore::UserWarning", "-m", "sglang.launch_server",
           "--model-path", converted_model(), "--device", "cpu", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=server_env(), cwd="/")
    assert (out.returncode, out.stderr, out.stdout) == (2, line + "\n", ""), out.stderr[-3000:]


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
    check_server_model(cfg, mc, tp_size=tp, **args)


def test_model_checks(tmp_path):
    mc = _model_config(tmp_path)  # SmolLM2: 9 query heads, 3 KV heads, head_dim 64
    _check(mc)
    _check(mc, tp=3)  # whole KV heads per rank
    with pytest.raises(OscarConfigError, match="the model's KV heads must divide across --tp-size 2 with --kv-cache "
                       "oscar, got 3"):
        _check(mc, tp=2)
    with pytest.raises(OscarConfigError, match="MLA"):
        _check(mc, use_mla=True)
    with pytest.raises(OscarConfigError, match="sliding-window layers need --disable-hybrid-swa-memory with "
                       "--kv-cache oscar"):
        _check(mc, is_hybrid_swa=True)
    with pytest.raises(OscarConfigError, match="linear-attention"):
        _check(mc, is_hybrid_linear=True)


def test_attention_layer_checks():
    """SGLang's own `RadixAttention` layers: causal decoder attention with or without a sliding
    window is served; logit soft-capping and non-causal attention are refused, naming the layer."""
    from sglang.srt.layers.radix_attention import AttentionType, RadixAttention

    from oscar_sgl.sglang.backend import window_of
    from oscar_sgl.supported import check_attention_layer

    full = RadixAttention(4, 64, 0.125, 2, layer_id=0)
    sliding = RadixAttention(4, 64, 0.125, 2, layer_id=1, sliding_window_size=511)
    for layer in (full, sliding):
        check_attention_layer(layer)
    assert window_of(full) is None and window_of(sliding) == 511
    with pytest.raises(OscarConfigError, match="must not soft-cap its logits with --kv-cache oscar, got "
                       "logit_cap=50.0 at layer 3"):
        check_attention_layer(RadixAttention(4, 64, 0.125, 2, layer_id=3, logit_cap=50.0))
    with pytest.raises(OscarConfigError, match="must be causal decoder attention with --kv-cache oscar, got "
                       "'encoder_only' at layer 2"):
        check_attention_layer(RadixAttention(4, 64, 0.125, 2, layer_id=2, attn_type=AttentionType.ENCODER_ONLY))


def test_model_head_dim_not_pow2(tmp_path):
    mc = _model_config(tmp_path, num_attention_heads=12, num_key_value_heads=4, head_dim=48)
    assert mc.head_dim == 48
    with pytest.raises(OscarConfigError, match="the model's head_dim must be a power of two"):
        _check(mc, cfg=OscarConfig(v_group=16))


def test_help_lists_the_flags():
    """`python -m sglang.launch_server --help` through the real entry point (plugin discovery)."""
    from sglang_support.harness import server_env

    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True,
                         text=True, timeout=300, env=server_env(), cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--kv-cache {default,oscar}", "--oscar-bits {2,4}", "--oscar-k-group G_K", "--oscar-v-group G_V",
                 "--oscar-page-size R", "--oscar-norm-scope {layer,head}", "--oscar-cuda-graph", "--oscar-no-rotation",
                 "--oscar-no-token-scaling", "--oscar-prefill {position,exact}", "--oscar-offset {integer,min}",
                 "--oscar-clip {none,keys,values,both}", "--oscar-key-ranges {group,page}",
                 "--oscar-sliding-layers {quantized,bf16}"):
        assert flag in out.stdout, flag
    # Every OScaR flag says its default (argparse wraps help lines, so compare without whitespace).
    flat = "".join(out.stdout.split())
    for shown in ("Codewidthofthepacked", "(default:2)", "(default:16atINT2,32atINT4)", "(default:64atINT2,32atINT4)",
                  "(default:128)", "(default:layer)", "(default:minatINT2,integeratINT4)", "(default:valuesatINT2,noneatINT4)",
                  "(default:pageatINT2,groupatINT4", "(default:quantized,whatmeasuresbestperbyte",
                  "Default:rotationon", "Default:tokenscalingon", "decodeCUDAgraphsareonbydefaultonCUDA"):
        assert shown in flat, shown


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


def test_cpu_tensor_parallel_needs_sglang_fallback(parse, monkeypatch, capsys):
    """`--device cpu --tp-size 3` with PyPI's CUDA torch: SGLang would build a PyNccl communicator on
    the CPU and crash in a scheduler; we say what to set at startup instead. With the setting, the
    same flags parse (test_sglang_tp.py runs that server)."""
    if not _loads_nccl():
        pytest.skip("this torch has no loadable libnccl.so.2: SGLang falls back to gloo by itself")
    monkeypatch.delenv("SGLANG_NCCL_SO_PATH", raising=False)
    err = _startup_error(parse, capsys, "--kv-cache", "oscar", "--tp-size", "3")
    assert err.startswith("error: --tp-size 3 with --device cpu and --kv-cache oscar needs SGLANG_NCCL_SO_PATH=none: ")
    assert err.count("\n") == 1
    parse("--tp-size", "3")  # without --kv-cache oscar the plug-in stays out of the way
    assert parse("--kv-cache", "oscar").tp_size == 1  # TP = 1 needs nothing
    monkeypatch.setenv("SGLANG_NCCL_SO_PATH", "none")
    sa = parse("--kv-cache", "oscar", "--tp-size", "3")
    assert sa.tp_size == 3 and sa.attention_backend == "oscar"


def test_prompts_that_would_kill_the_scheduler_are_refused():
    """`check_prompt_ids` (the `TokenizerManager._validate_one_request` hook of `--kv-cache oscar`
    servers): SGLang 0.5.23 accepts an empty text prompt and token ids outside the vocabulary, then
    its scheduler raises in the forward and the whole server stops (found by the soak; the server-level
    regression is `test_sglang_soak.py`). A ValueError there is SGLang's HTTP 400."""
    from oscar_sgl.sglang.plugin import check_prompt_ids

    check_prompt_ids([0, 5, 49151], 49152)
    check_prompt_ids(None, 49152)  # input_embeds: not ours to check
    with pytest.raises(ValueError, match="the prompt is empty"):
        check_prompt_ids([], 49152)
    with pytest.raises(ValueError, match="token id 49152, outside the model's vocabulary \\[0, 49152\\)"):
        check_prompt_ids([1, 49152, 2], 49152)
    with pytest.raises(ValueError, match="token id -3"):
        check_prompt_ids([1, -3], 49152)
