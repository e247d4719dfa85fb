"""What OScaR supports: the one table, and one check per context.

Every configuration OScaR cannot run is refused here, at the earliest point that knows enough
(flag parsing, model load, pool build), never deep inside a kernel. Every refusal is an
`OscarConfigError` (a `ValueError`) whose message has one style::

    <the flag or property at fault> <what it must be>, got <value>[: <why>][; <what to do>]

e.g. ``--oscar-bits must be 2 or 4, got 3`` or ``the model's KV heads (3) must divide across
--tp-size 2, got 3 % 2 = 1: ...``. Command-line front ends print it as ``error: <message>`` with
exit status 2.

| requirement | why | checked by |
|---|---|---|
| bits 2 or 4 | the packed formats of docs/LAYOUT.md | `check_fields` (every `OscarConfig`) |
| k_group, v_group powers of two | group reductions and packing | `check_fields` |
| page size (R) a positive multiple of k_group | no key group straddles a seal | `check_fields` |
| norm scope `layer` or `head` | docs/OSCAR.md §2.2 | `check_fields` |
| offset `integer` or `min`; clip `none`, `keys`, `values` or `both` | the seal-time quantizers of docs/OSCAR.md §2.3 | `check_fields` |
| every int below 2^31 | the Rust core takes u32/i32 | `check_fields` |
| KV heads > 0; head_dim a power of two (rotation on) | Walsh-Hadamard transform | `check_layer_shape` (all contexts) |
| v_group divides head_dim; head_dim*bits a whole number of bytes | value groups, packing | `check_layer_shape` |
| full or sliding-window attention layers (no linear attention); no MLA | latent / recurrent state is not K/V | `check_quality_model` (OscarCache, `oscar-sgl eval`, `plan --model`) |
| `key_rotation` 'weights': the model's weights, not only its config | the per-head choice is computed from them | `OscarCache`; the server's `key_rotation_plan_from_sglang` (model load) |
| `key_rotation_min_alignment` a finite positive number | the rule's threshold on rho | `check_fields` |
| `--oscar-*` flags only with `--kv-cache oscar` | nothing would read them | `check_server_flags` |
| `--page-size` = `--oscar-page-size`; attention backend `oscar`; no `--kv-cache-dtype` | an OScaR page is the unit of sealing; other backends read BF16 | `check_server_flags` |
| no HiCache, PD disaggregation, speculative decoding, KV sharding, page-major layout, unified memory | each moves or writes K/V without the per-page scales | `check_server_flags` |
| CPU TP > 1 with a CUDA torch: `SGLANG_NCCL_SO_PATH` set | SGLang would build PyNccl on the CPU | `check_server_flags` |
| MHA/GQA model: no MLA, no linear attention; sliding-window layers only in SGLang's single-pool mode (`--disable-hybrid-swa-memory`, SGLang's own choice for gemma-2/3) | one OScaR pool for every layer, sliding layers masked to their window in the kernels, or kept in the KV dtype with `--oscar-sliding-layers bf16` (SGLang's SWA pool is a second, BF16-layout pool with its own allocator; docs/OSCAR.md §7) | `check_server_model` |
| causal decoder attention layers without logit soft-capping, attention sinks or other extra attention arguments | the kernels compute plain causal softmax attention (a sliding window is a launch argument) | `check_attention_layer` (backend build, every forward); sinks and extra arguments: the backend (build, every forward) |
| KV heads divide across TP ranks; K and V head dims equal | whole heads per rank, one token scale per rank | `check_server_model` |
| kernel path: head_dim*bits a whole number of 32-bit words; v_group a multiple of 32/bits; k_group >= 16; page size a multiple of 32 | the kernels' word loads and 32-token tiles | `check_kernel_shape` (pool build and every launch) |
| kernel path: bf16/fp16 model on CUDA; on a CPU only under `TRITON_INTERPRET=1`; `OSCAR_SGL_GLUON_DECODE` unset, 0 or 1 | the kernels stage BF16; Triton needs a GPU or its interpreter | `check_kernel_device` (pool build) |

This module imports nothing from oscar_sgl but `errors`, and neither torch nor SGLang at import.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

from .errors import OscarConfigError

__all__ = [
    "CLIP_CHOICES",
    "KEY_RANGES_CHOICES",
    "INT_FIELD_LIMIT",
    "OFFSET_CHOICES",
    "OscarConfigError",
    "check_fields",
    "check_kernel_device",
    "check_kernel_shape",
    "check_layer_shape",
    "check_quality_model",
    "quality_layer_types",
    "check_server_flags",
    "check_server_model",
]

#: Every int field stays below this, so it fits the Rust core's u32/i32 arguments.
INT_FIELD_LIMIT = 2**31

#: `OscarConfig.offset` and `OscarConfig.clip` values (docs/OSCAR.md §2.3).
OFFSET_CHOICES = ("integer", "min")
CLIP_CHOICES = ("none", "keys", "values", "both")
KEY_RANGES_CHOICES = ("group", "page")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


# --------------------------------------------------------------------------------------------
# Every context: the configuration and the layer shape
# --------------------------------------------------------------------------------------------


def check_fields(values: Mapping[str, object], name: Callable[[str], str] = str) -> None:
    """Raise `OscarConfigError` for the first `OscarConfig` field value OScaR cannot run with.
    Messages say ``name(field)`` for each field they mention (a flag name for front ends)."""
    ints: dict[str, int] = {}
    for field in ("bits", "k_group", "v_group", "page_size"):
        value = values[field]
        if isinstance(value, bool) or not isinstance(value, int):
            raise OscarConfigError(f"{name(field)} must be an int, got {value!r}")
        if value >= INT_FIELD_LIMIT:
            raise OscarConfigError(f"{name(field)} must be below 2^31, got {value}")
        ints[field] = value
    bits, k_group, v_group, page_size = (ints[f] for f in ("bits", "k_group", "v_group", "page_size"))
    if bits not in (2, 4):
        raise OscarConfigError(f"{name('bits')} must be 2 or 4, got {bits}")
    if not _is_pow2(k_group):
        raise OscarConfigError(f"{name('k_group')} must be a positive power of two, got {k_group}")
    if not _is_pow2(v_group):
        raise OscarConfigError(f"{name('v_group')} must be a positive power of two, got {v_group}")
    if page_size <= 0 or page_size % k_group != 0:
        raise OscarConfigError(
            f"{name('page_size')} must be a positive multiple of {name('k_group')} ({k_group}), got {page_size}: "
            "a page is sealed whole, and no key group may straddle a seal"
        )
    if values["norm_scope"] not in ("layer", "head"):
        raise OscarConfigError(f"{name('norm_scope')} must be 'layer' or 'head', got {values['norm_scope']!r}")
    if values.get("key_rotation", "all") not in ("all", "weights"):
        raise OscarConfigError(f"{name('key_rotation')} must be 'all' or 'weights', got {values['key_rotation']!r}")
    tau = values.get("key_rotation_min_alignment", 1.0)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau <= 0:
        raise OscarConfigError(f"{name('key_rotation_min_alignment')} must be a finite positive number, got {tau!r}")
    if values.get("sliding_layers", "quantized") not in ("quantized", "bf16"):
        raise OscarConfigError(
            f"{name('sliding_layers')} must be 'quantized' or 'bf16', got {values['sliding_layers']!r}"
        )
    for field, choices in (("offset", OFFSET_CHOICES), ("clip", CLIP_CHOICES), ("key_ranges", KEY_RANGES_CHOICES)):
        value = values.get(field, choices[0])
        if value not in choices:
            raise OscarConfigError(f"{name(field)} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    if values.get("key_ranges", "group") == "page" and values.get("clip", "none") in ("keys", "both"):
        raise OscarConfigError(
            f"{name('clip')} {values['clip']!r} clips key groups, which {name('key_ranges')} 'page' (the INT2 default) "
            f"does not store as free ranges (a key group's range is a pair of indices into its page's grid): use "
            f"{name('clip')} 'values' or 'none' with it, or {name('key_ranges')} 'group'"
        )


def check_layer_shape(cfg: Any, num_kv_heads: int, head_dim: int) -> None:
    """Whether `cfg` (an `OscarConfig`) can quantize a layer of ``num_kv_heads`` x ``head_dim``."""
    if num_kv_heads <= 0:
        raise OscarConfigError(f"the model's KV heads must be positive, got {num_kv_heads}")
    if cfg.rotation and not _is_pow2(head_dim):
        raise OscarConfigError(f"the model's head_dim must be a power of two for the Walsh-Hadamard rotation, got {head_dim}")
    if head_dim % cfg.v_group != 0:
        raise OscarConfigError(f"the value group (v_group {cfg.v_group}) must divide the model's head_dim, got {head_dim}: "
                               "choose a smaller v_group (--oscar-v-group, --v-group)")
    if (head_dim * cfg.bits) % 8 != 0:
        raise OscarConfigError(f"the model's head_dim must pack into whole bytes at {cfg.bits} bits, got {head_dim}")


# --------------------------------------------------------------------------------------------
# Quality tool: OscarCache, `oscar-sgl eval`, `oscar-sgl plan --model`
# --------------------------------------------------------------------------------------------


def _text_config(hf_config: Any) -> Any:
    return hf_config.get_text_config(decoder=True) if hasattr(hf_config, "get_text_config") else hf_config


#: The attention layer types OscarCache stores (transformers' `config.layer_types` names).
QUALITY_LAYER_TYPES = ("full_attention", "sliding_attention")


def quality_layer_types(hf_config: Any) -> tuple[list[str], int | None]:
    """``(layer type per layer, sliding window)`` of a transformers config: every layer
    "full_attention" when the config has no `layer_types`; the window is None without sliding layers.

    Raises:
        OscarConfigError: a layer type OscarCache cannot store (linear attention, Mamba, ...), or
            sliding layers without a positive `sliding_window`.
    """
    text_cfg = _text_config(hf_config)
    layers = int(text_cfg.num_hidden_layers)
    types = list(getattr(text_cfg, "layer_types", None) or ["full_attention"] * layers)
    unknown = sorted(set(types) - set(QUALITY_LAYER_TYPES))
    if unknown:
        raise OscarConfigError(
            f"the model's layers must be full or sliding-window attention, got {unknown}: OscarCache stores K/V, "
            "and those layers keep another state"
        )
    if len(types) != layers:
        raise OscarConfigError(f"the model's layer_types must name each of its {layers} layers, got {len(types)}")
    if "sliding_attention" not in types:
        return types, None
    window = getattr(text_cfg, "sliding_window", None)
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise OscarConfigError(f"the model's sliding_window must be a positive int with sliding layers, got {window!r}")
    return types, window


def check_quality_model(cfg: Any, hf_config: Any) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a transformers config that `cfg` can quantize;
    `cfg` None checks the model alone."""
    text_cfg = _text_config(hf_config)
    quality_layer_types(hf_config)
    if getattr(text_cfg, "kv_lora_rank", None):
        raise OscarConfigError("the model's attention must be MHA/GQA, got MLA (kv_lora_rank): latent KV is not K/V")
    layers = int(text_cfg.num_hidden_layers)
    heads = int(getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads)
    head_dim = int(getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads)
    if cfg is not None:
        check_layer_shape(cfg, heads, head_dim)
    return layers, heads, head_dim


# --------------------------------------------------------------------------------------------
# Server start: flags in the launcher, the model in each scheduler process
# --------------------------------------------------------------------------------------------

#: SGLang features that write, move or copy K/V without OScaR's per-page scales:
#: (namespace attribute, its value when off, the flag, why).
_REFUSED_FEATURES: tuple[tuple[str, object, str, str], ...] = (
    ("enable_hierarchical_cache", False, "--enable-hierarchical-cache (HiCache)",
     "its host tier copies K/V only and would drop the per-page scales"),
    ("disaggregation_mode", "null", "--disaggregation-mode (PD disaggregation)",
     "the KV transfer moves scales only for MXFP8"),
    ("speculative_algorithm", None, "--speculative-algorithm",
     "speculative paths write through set_kv_buffer_prefix_valid and move slots without scales"),
    ("enable_kv_cache_sharding", False, "--enable-kv-cache-sharding",
     "page sharding splits a page across ranks; an OScaR page is quantized whole"),
    ("enable_page_major_kv_layout", False, "--enable-page-major-kv-layout",
     "the page-major envelope is a different byte layout"),
    ("enable_unified_memory", False, "--enable-unified-memory", "the unified pool builds its own KV buffers"),
    ("enable_deterministic_inference", False, "--enable-deterministic-inference",
     "SGLang's deterministic mode runs only its own attention backends (fa3, flashinfer, triton, ...); "
     "OScaR's default --oscar-prefill position already gives the same answer cold, warm and at any "
     "--chunked-prefill-size, and what remains batch-dependent is SGLang's own matmuls (README, "
     "'The same answer whether cached or not')"),
)


def check_server_flags(ns: Any, cfg: Any) -> None:
    """The SGLang flags (an argparse namespace) `--kv-cache oscar` cannot serve with; `cfg` is the
    `OscarConfig` the `--oscar-*` flags gave."""
    page = getattr(ns, "page_size", None)
    if page is not None and page != cfg.page_size:
        raise OscarConfigError(
            f"--page-size must equal --oscar-page-size ({cfg.page_size}) with --kv-cache oscar, got {page}: "
            "an OScaR page is the unit of sealing; omit --page-size and it follows --oscar-page-size"
        )
    if getattr(ns, "oscar_cuda_graph", False) and str(getattr(ns, "device", None) or "cuda").startswith("cpu"):
        raise OscarConfigError(
            "--oscar-cuda-graph needs a CUDA device, got --device cpu: it keeps CUDA graphs of decode steps"
        )
    backend = getattr(ns, "attention_backend", None)
    if backend not in (None, "oscar"):
        raise OscarConfigError(f"--attention-backend must be omitted with --kv-cache oscar, got {backend}: "
                               "only the oscar backend reads the packed pool")
    for name in ("prefill_attention_backend", "decode_attention_backend"):
        value = getattr(ns, name, None)
        if value not in (None, "oscar"):
            raise OscarConfigError(f"--{name.replace('_', '-')} must be omitted with --kv-cache oscar, got {value}: "
                                   "it would read the packed pool as BF16")
    kv_dtype = getattr(ns, "kv_cache_dtype", "auto")
    if kv_dtype not in (None, "auto", "bfloat16", "bf16", "float16", "float32"):
        raise OscarConfigError(f"--kv-cache-dtype must be omitted with --kv-cache oscar, got {kv_dtype}: OScaR replaces it")
    for attr, off, flag, why in _REFUSED_FEATURES:
        if getattr(ns, attr, off) not in (off, None, False):
            raise OscarConfigError(f"{flag} must be off with --kv-cache oscar: {why}")
    _check_cpu_tensor_parallel(ns)


def _check_cpu_tensor_parallel(ns: Any) -> None:
    """`--device cpu --tp-size N` (N > 1) with a CUDA build of torch (PyPI's default) crashes in
    SGLang 0.5.23 before the model loads: `init_model_parallel_group` asks for a PyNccl communicator
    for every TP group (parallel_state.py, `use_pynccl = not (_is_npu or _is_xpu or ...)`), which
    loads `libnccl.so.2` when it can (pynccl_wrapper.py `find_nccl_library`) and then enters
    `torch.cuda.device("cpu")` (pynccl.py) -> "Expected a cuda device, but got: cpu". SGLang's own
    fallback (a CPU build of torch, or an NCCL library that does not load) disables PyNccl and
    all-reduces through `torch.distributed` on the gloo group; `SGLANG_NCCL_SO_PATH` pointing at no
    library selects that fallback. Say so here, at startup, instead of deep in a scheduler."""
    if getattr(ns, "device", None) != "cpu" or int(getattr(ns, "tp_size", 1) or 1) <= 1:
        return
    if os.environ.get("SGLANG_NCCL_SO_PATH"):
        return
    import ctypes

    import torch

    if torch.version.cuda is None:
        return
    try:
        ctypes.CDLL("libnccl.so.2")
    except OSError:
        return
    raise OscarConfigError(
        f"--tp-size {ns.tp_size} with --device cpu and --kv-cache oscar needs SGLANG_NCCL_SO_PATH=none: "
        "this CUDA build of torch ships libnccl.so.2, so SGLang 0.5.23 would build a PyNccl communicator on the CPU and fail "
        "('Expected a cuda device, but got: cpu'); SGLANG_NCCL_SO_PATH=none (a path that does "
        "not load) makes SGLang all-reduce through torch.distributed (gloo), and on a machine with "
        "fewer NUMA nodes than ranks set SGLANG_CPU_OMP_THREADS_BIND to one core list per rank "
        "(e.g. '0|1|0'); `oscar-sgl serve` sets both"
    )


def check_server_model(cfg: Any, model_config: Any, *, tp_size: int, use_mla: bool,
                       is_hybrid_swa: bool, is_hybrid_linear: bool) -> None:
    """The models `--kv-cache oscar` cannot serve. `model_config` is SGLang's `ModelConfig`."""
    if use_mla:
        raise OscarConfigError("the model's attention must be MHA/GQA with --kv-cache oscar, got MLA: "
                               "latent KV is not K/V, which OScaR quantizes")
    if is_hybrid_swa:
        raise OscarConfigError(
            "the model's sliding-window layers need --disable-hybrid-swa-memory with --kv-cache oscar: SGLang 0.5.23 "
            "would build an SWAKVPool for them (a full-attention sub-pool plus a BF16 SWA sub-pool with its own "
            "allocator and full-to-SWA index mapping), and the oscar backend reads one OScaR pool; with "
            "--disable-hybrid-swa-memory (SGLang's own choice for gemma-2/3) every layer is stored in the OScaR pool and "
            "the sliding layers attend to their window only"
        )
    if is_hybrid_linear:
        raise OscarConfigError("the model's layers must all be full attention with --kv-cache oscar, got hybrid "
                               "linear-attention / Mamba layers")
    total_kv = model_config.get_total_num_kv_heads()
    if total_kv % tp_size != 0:
        raise OscarConfigError(
            f"the model's KV heads must divide across --tp-size {tp_size} with --kv-cache oscar, got {total_kv}: "
            "each rank holds whole KV heads (replicated heads would get each replica its own token scales)"
        )
    head_dim = model_config.head_dim
    v_head_dim = getattr(model_config, "v_head_dim", head_dim) or head_dim
    if v_head_dim != head_dim:
        raise OscarConfigError(f"the model's V head dim must equal its K head dim ({head_dim}) with --kv-cache oscar, "
                               f"got {v_head_dim}")
    check_layer_shape(cfg, total_kv // tp_size, head_dim)


def check_attention_layer(layer: Any) -> None:
    """What the `oscar` backend computes for one of SGLang's `RadixAttention` layers: causal decoder
    self-attention, over every position or a sliding window (`sliding_window_size`); refused are
    logit soft-capping (gemma-2, grok) and bidirectional / encoder-only attention, which it would
    otherwise silently compute as plain causal attention. Called for every layer of the loaded model
    when the backend is built, and again by each forward (a layer the model scan did not see)."""
    name = f"layer {getattr(layer, 'layer_id', '?')}"
    cap = getattr(layer, "logit_cap", 0.0) or 0.0
    if float(cap) > 0.0:
        raise OscarConfigError(
            f"the model's attention must not soft-cap its logits with --kv-cache oscar, got logit_cap={cap} at {name}: "
            "the OScaR kernels compute plain softmax attention; serve this model with --kv-cache default")
    kind = getattr(getattr(layer, "attn_type", None), "value", "decoder")
    if kind != "decoder":
        raise OscarConfigError(f"the model's attention must be causal decoder attention with --kv-cache oscar, got "
                               f"{kind!r} at {name}")


# --------------------------------------------------------------------------------------------
# Kernel launch (and the pool build that will launch them)
# --------------------------------------------------------------------------------------------


def check_kernel_shape(*, bits: int, k_group: int, v_group: int, page_size: int, head_dim: int) -> None:
    """What the Triton kernels support (launchers are called with plain ints, so the rules that
    `check_fields` and `check_layer_shape` apply to an `OscarConfig` are checked again here)."""
    if bits not in (2, 4):
        raise OscarConfigError(f"--oscar-bits must be 2 or 4 on the OScaR kernels, got {bits}")
    if not _is_pow2(head_dim):
        raise OscarConfigError(f"the model's head_dim must be a power of two on the OScaR kernels, got {head_dim}")
    if not _is_pow2(v_group) or head_dim % v_group:
        raise OscarConfigError(f"--oscar-v-group must be a power of two dividing head_dim ({head_dim}) on the OScaR "
                               f"kernels, got {v_group}")
    cpw = 32 // bits
    if (head_dim * bits) % 32:
        raise OscarConfigError(f"the model's head_dim must be a whole number of 32-bit words at {bits} bits on the "
                               f"OScaR kernels, got {head_dim}")
    if v_group % cpw:
        raise OscarConfigError(f"--oscar-v-group must be a multiple of {cpw} at {bits} bits on the OScaR kernels, "
                               f"got {v_group}")
    if k_group < 16 or not _is_pow2(k_group) or page_size % k_group:
        raise OscarConfigError(f"--oscar-k-group must be a power of two >= 16 dividing the page size ({page_size}) on "
                               f"the OScaR kernels, got {k_group}")
    if page_size % 32:
        raise OscarConfigError(f"--oscar-page-size must be a multiple of 32 on the OScaR kernels, got {page_size}: "
                               "extend attention walks sealed pages in 32-token tiles")


def check_kernel_device(*, device_type: str, dtype: Any, interpreting: bool) -> None:
    """Where the kernel path can run: bf16/fp16 models on CUDA, anything else only in Triton's CPU
    interpreter (tests)."""
    import torch

    if device_type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        raise OscarConfigError(
            f"--dtype must be bfloat16 or float16 on the OScaR kernel path (CUDA), got {dtype}; "
            "or set OSCAR_SGL_USE_KERNELS=0 for the torch reference path"
        )
    if device_type != "cuda" and not interpreting:
        raise OscarConfigError(
            f"OSCAR_SGL_USE_KERNELS=1 on a {device_type} device needs TRITON_INTERPRET=1 (set before anything imports "
            "triton); unset OSCAR_SGL_USE_KERNELS for the torch reference path"
        )
    import os

    gluon = os.environ.get("OSCAR_SGL_GLUON_DECODE", "1")
    if gluon not in ("0", "1"):
        raise OscarConfigError(
            f"OSCAR_SGL_GLUON_DECODE must be 0 (decode on the Triton stage 1 only) or 1 (the default: the Gluon "
            f"stage 1 where it was measured faster), got {gluon!r}"
        )
