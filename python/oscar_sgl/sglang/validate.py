"""Startup validation: every configuration OScaR cannot serve fails here, with a message that names
the flag or the model property, never later inside a kernel.

Two stages:
- `config_from_namespace` + `check_server_args`: in the launcher, right after argument parsing
  (flags only, no model);
- `check_model`: in each scheduler process when the KV pool is built (the model config is known).
"""

from __future__ import annotations

import os
from typing import Any

from ..config import OscarConfig, OscarConfigError

#: The attribute that carries the OScaR settings on SGLang's `ServerArgs`. It is a plain dict in the
#: record's `__dict__`, which `ServerArgs.__reduce__` pickles to every worker process.
SERVER_ARGS_ATTR = "_oscar_kv_cache"


class OscarStartupError(OscarConfigError):
    """A server configuration OScaR cannot run with (raised at startup)."""


#: `OscarConfig` field -> (the server flag that sets it, its attribute on SGLang's namespace).
FLAGS: dict[str, tuple[str, str]] = {
    "bits": ("--oscar-bits", "oscar_bits"),
    "k_group": ("--oscar-k-group", "oscar_k_group"),
    "v_group": ("--oscar-v-group", "oscar_v_group"),
    "residual": ("--oscar-page-size", "oscar_page_size"),
    "norm_scope": ("--oscar-norm-scope", "oscar_norm_scope"),
}


def config_from_namespace(ns: Any) -> OscarConfig | None:
    """The `OscarConfig` the `--oscar-*` flags describe, or None when `--kv-cache` is not `oscar`
    (then any `--oscar-*` flag given is an error). Unset flags are None (False for switches) and
    take `OscarConfig`'s defaults."""
    if getattr(ns, "kv_cache", "default") != "oscar":
        given = [name for name, value in vars(ns).items() if name.startswith("oscar_") and value not in (None, False)]
        if given:
            raise OscarStartupError(f"--{given[0].replace('_', '-')} needs --kv-cache oscar")
        return None
    values = {field: getattr(ns, dest) for field, (_, dest) in FLAGS.items() if getattr(ns, dest, None) is not None}
    try:
        return OscarConfig.from_flags(
            {field: flag for field, (flag, _) in FLAGS.items()}, zero_residual=False,
            rotation=not getattr(ns, "oscar_no_rotation", False),
            token_scaling=not getattr(ns, "oscar_no_token_scaling", False), **values,
        )
    except OscarConfigError as e:
        raise OscarStartupError(str(e)) from None


def check_server_args(ns: Any, cfg: OscarConfig) -> None:
    """Reject the SGLang features that would drop or mis-handle OScaR's scales (flags only)."""
    page = getattr(ns, "page_size", None)
    if page is not None and page != cfg.residual:
        raise OscarStartupError(
            f"--page-size must equal --oscar-page-size ({cfg.residual}) with --kv-cache oscar, got {page}: "
            "an OScaR page is the unit of sealing (omit --page-size and it follows --oscar-page-size)"
        )
    if getattr(ns, "oscar_cuda_graph", False) and str(getattr(ns, "device", None) or "cuda").startswith("cpu"):
        raise OscarStartupError(
            "--oscar-cuda-graph needs a CUDA device (it keeps CUDA graphs of decode steps), got --device cpu"
        )
    backend = getattr(ns, "attention_backend", None)
    if backend not in (None, "oscar"):
        raise OscarStartupError(
            f"--attention-backend must be oscar with --kv-cache oscar (omit it), got {backend}"
        )
    for name in ("prefill_attention_backend", "decode_attention_backend"):
        value = getattr(ns, name, None)
        if value not in (None, "oscar"):
            raise OscarStartupError(
                f"--{name.replace('_', '-')} must be omitted with --kv-cache oscar "
                f"(it would read the packed pool as BF16), got {value}"
            )
    kv_dtype = getattr(ns, "kv_cache_dtype", "auto")
    if kv_dtype not in (None, "auto", "bfloat16", "bf16", "float16", "float32"):
        raise OscarStartupError(
            f"--kv-cache-dtype must be omitted with --kv-cache oscar (OScaR replaces it), got {kv_dtype}"
        )
    rejected = [
        (bool(getattr(ns, "enable_hierarchical_cache", False)), "--enable-hierarchical-cache (HiCache)",
         "its host tier copies K/V only and would drop the per-page scales"),
        (getattr(ns, "disaggregation_mode", "null") not in (None, "null"), "--disaggregation-mode (PD disaggregation)",
         "the KV transfer moves scales only for MXFP8"),
        (getattr(ns, "speculative_algorithm", None) is not None, "--speculative-algorithm",
         "speculative paths write through set_kv_buffer_prefix_valid and move slots without scales"),
        (bool(getattr(ns, "enable_kv_cache_sharding", False)), "--enable-kv-cache-sharding",
         "page sharding splits a page across ranks; an OScaR page is quantized whole"),
        (bool(getattr(ns, "enable_page_major_kv_layout", False)), "--enable-page-major-kv-layout",
         "the page-major envelope is a different byte layout"),
        (bool(getattr(ns, "enable_unified_memory", False)), "--enable-unified-memory",
         "the unified pool builds its own KV buffers"),
    ]
    for bad, flag, why in rejected:
        if bad:
            raise OscarStartupError(f"{flag} cannot be combined with --kv-cache oscar: {why}")
    check_cpu_tensor_parallel(ns)


def check_cpu_tensor_parallel(ns: Any) -> None:
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
    raise OscarStartupError(
        f"--tp-size {ns.tp_size} with --device cpu and --kv-cache oscar needs SGLANG_NCCL_SO_PATH=none: "
        "this CUDA build of torch ships libnccl.so.2, so SGLang 0.5.23 would build a PyNccl communicator on the CPU and fail "
        "('Expected a cuda device, but got: cpu'); SGLANG_NCCL_SO_PATH=none (a path that does "
        "not load) makes SGLang all-reduce through torch.distributed (gloo), and on a machine with "
        "fewer NUMA nodes than ranks set SGLANG_CPU_OMP_THREADS_BIND to one core list per rank "
        "(e.g. '0|1|0')"
    )


def check_model(cfg: OscarConfig, model_config: Any, *, tp_size: int, use_mla: bool,
                is_hybrid_swa: bool, is_hybrid_linear: bool) -> None:
    """Reject models OScaR cannot serve. `model_config` is SGLang's `ModelConfig`."""
    if use_mla:
        raise OscarStartupError(
            "--kv-cache oscar supports multi-head / grouped-query attention pools only; this model "
            "uses MLA (latent KV), which OScaR does not quantize"
        )
    if is_hybrid_swa:
        raise OscarStartupError("--kv-cache oscar does not support hybrid sliding-window models (SWA pool)")
    if is_hybrid_linear:
        raise OscarStartupError("--kv-cache oscar does not support hybrid linear-attention / Mamba models")
    total_kv = model_config.get_total_num_kv_heads()
    if total_kv % tp_size != 0:
        raise OscarStartupError(
            f"--kv-cache oscar needs whole KV heads on every tensor-parallel rank: the model has "
            f"{total_kv} KV heads, which do not divide across --tp-size {tp_size} (replicated KV heads "
            "would give each replica its own token scales)"
        )
    head_dim = model_config.head_dim
    v_head_dim = getattr(model_config, "v_head_dim", head_dim) or head_dim
    if v_head_dim != head_dim:
        raise OscarStartupError(f"--kv-cache oscar needs equal K and V head dims, got {head_dim} and {v_head_dim}")
    try:
        cfg.check_shape(total_kv // tp_size, head_dim)
    except OscarConfigError as e:
        raise OscarStartupError(f"--kv-cache oscar cannot serve this model: {e}") from None
