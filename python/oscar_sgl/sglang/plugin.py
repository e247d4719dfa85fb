"""`register()`: the `sglang.srt.plugins` entry point of oscar-sgl.

SGLang runs every general plugin in each of its processes (launcher, scheduler, detokenizer, DP
controller) before anything else, then applies the registered hooks. So `register()` is cheap and
idempotent and this module imports nothing heavy at module level: each hook imports its own
dependencies when it first runs.

Registered into pyproject as::

    [project.entry-points."sglang.srt.plugins"]
    oscar = "oscar_sgl.sglang.plugin:register"
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

#: Every SGLang object we hook: (dotted target, hook type name, hook). `tests/test_sglang_plugin.py`
#: imports each target, because SGLang's registry only *logs* a missing one.
HOOKS: list[tuple[str, str, Callable[..., Any]]] = []

_registered = False

KV_CACHE_CHOICES = ("default", "oscar")
BACKEND_NAME = "oscar"

#: The attribute that carries the OScaR settings on SGLang's `ServerArgs`. It is a plain dict in the
#: record's `__dict__`, which `ServerArgs.__reduce__` pickles to every worker process.
SERVER_ARGS_ATTR = "_oscar_kv_cache"
#: The same for `--oscar-prefill` (a serving choice, not part of the stored format `OscarConfig`).
SERVER_ARGS_PREFILL_ATTR = "_oscar_prefill"

#: `OscarConfig` field -> (the server flag that sets it, its attribute on SGLang's namespace).
FLAGS: dict[str, tuple[str, str]] = {
    "bits": ("--oscar-bits", "oscar_bits"),
    "k_group": ("--oscar-k-group", "oscar_k_group"),
    "v_group": ("--oscar-v-group", "oscar_v_group"),
    "page_size": ("--oscar-page-size", "oscar_page_size"),
    "norm_scope": ("--oscar-norm-scope", "oscar_norm_scope"),
    "offset": ("--oscar-offset", "oscar_offset"),
    "clip": ("--oscar-clip", "oscar_clip"),
    "key_ranges": ("--oscar-key-ranges", "oscar_key_ranges"),
    "key_rotation": ("--oscar-key-rotation", "oscar_key_rotation"),
    "key_rotation_min_alignment": ("--oscar-key-rotation-min-alignment", "oscar_key_rotation_min_alignment"),
    "sliding_layers": ("--oscar-sliding-layers", "oscar_sliding_layers"),
}


def _hook(target: str, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        HOOKS.append((target, kind, fn))
        return fn

    return deco


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--kv-cache` and the `--oscar-*` flags. Their defaults are `OscarConfig`'s (the format
    flags' by --oscar-bits and method), shown in the help; on the namespace an unset flag is None (False for switches), so `config_from_namespace` can
    tell a flag that was given from a default and refuse any `--oscar-*` flag without `--kv-cache oscar`."""
    from ..config import CLIP_CHOICES, INT2_FORMAT, KEY_RANGES_CHOICES, OFFSET_CHOICES, PAPER_FORMAT, OscarConfig
    from .pool import PREFILL_MODES

    d, fmt2, paper = OscarConfig(), INT2_FORMAT, PAPER_FORMAT
    g = parser.add_argument_group("OScaR KV cache (oscar-sgl plug-in)")
    g.add_argument(
        "--kv-cache", choices=KV_CACHE_CHOICES, default="default",
        help="KV-cache format (default: default, SGLang's own). 'oscar': OScaR INT2/INT4 (Walsh-Hadamard "
        "rotation + token scaling, packed pages, BF16 staging for open pages); implies --attention-backend "
        "oscar and --page-size = --oscar-page-size. The --oscar-* flags need it.",
    )
    g.add_argument("--oscar-bits", type=int, metavar="{2,4}",
                   help=f"Code width of the packed K/V, 2 or 4 bits (default: {d.bits}).")
    g.add_argument("--oscar-k-group", type=int, metavar="G_K",
                   help="Tokens per key quantization group (per head and channel), a power of two dividing "
                   f"--oscar-page-size (default: {fmt2['k_group']} at INT2, {paper['k_group']} at INT4).")
    g.add_argument("--oscar-v-group", type=int, metavar="G_V",
                   help="Channels per value quantization group, a power of two dividing head_dim "
                   f"(default: {fmt2['v_group']} at INT2, {paper['v_group']} at INT4).")
    g.add_argument("--oscar-page-size", "--oscar-residual", dest="oscar_page_size", type=int, metavar="R",
                   help="Tokens per OScaR page = the BF16 residual window R, a positive multiple of --oscar-k-group "
                   f"(default: {d.page_size}). SGLang's --page-size follows it.")
    g.add_argument("--oscar-norm-scope", choices=("layer", "head"),
                   help="Token-scale scope: 'layer' (one norm over all KV heads of the layer) or 'head' "
                   f"(default: {d.norm_scope}). Under tensor parallelism 'layer' means the heads of this rank.")
    g.add_argument("--oscar-offset", choices=OFFSET_CHOICES,
                   help="Seal-time offset of a quantization group: 'integer' (an integer zero point, the paper) or "
                   f"'min' (the group minimum) (default: {fmt2['offset']} at INT2, {paper['offset']} at INT4). Seal time only: decode and the page layout "
                   "are unchanged (docs/OSCAR.md §2.3).")
    g.add_argument("--oscar-clip", choices=CLIP_CHOICES,
                   help="Seal-time MSE clip search (each group's range shrunk to 1 .. 3/4 of its width, the least "
                   f"squared error kept) for the key groups, the value groups, both or none (default: {fmt2['clip']} at INT2, "
                   f"{paper['clip']} at INT4).")
    g.add_argument("--oscar-key-ranges", choices=KEY_RANGES_CHOICES,
                   help="How a key group's range is stored: 'group' (an fp16 scale/offset pair per group, the paper) "
                   "or 'page' (two uint8 indices into a per-page fp16 grid: half the bits per group, so "
                   f"--oscar-k-group 16 costs what 32 costs as 'group') (default: {fmt2['key_ranges']} at INT2, "
                   f"{paper['key_ranges']} at INT4; docs/OSCAR.md §2.3).")
    g.add_argument("--oscar-key-rotation", choices=("weights", "all"),
                   help="Which KV heads' keys are rotated: 'weights' chooses per (layer, KV head) from the loaded "
                   "weights (keys stay unrotated where the channels that carry their energy are not the ones the "
                   "queries read; a layer with no rotated head is stored as KIVI) or 'all' (the paper) "
                   f"(default: {d.key_rotation}; docs/OSCAR.md §7). 'weights' needs unquantized q/k projections.")
    g.add_argument("--oscar-key-rotation-min-alignment", type=float, metavar="RHO",
                   help="With --oscar-key-rotation weights: rotate a KV head's keys when its query/key channel "
                   f"alignment is at least RHO (default: {d.key_rotation_min_alignment}).")
    g.add_argument("--oscar-sliding-layers", choices=("quantized", "bf16"),
                   help="What a hybrid model's sliding-window layers (gemma-2/3, served in SGLang's single-pool mode) "
                   "store: 'quantized' (the OScaR format, attention masked to the window) or 'bf16' (the KV dtype, as "
                   "SGLang's own pool: every token of those layers at full size, attention in torch) (default: "
                   f"{d.sliding_layers}, what measures best per byte; docs/OSCAR.md §7). Full-attention layers are "
                   "always quantized; a model without sliding layers is unaffected.")
    g.add_argument("--oscar-prefill", choices=PREFILL_MODES,
                   help="What a prefill token attends to. 'position' (default): the pages below its own page "
                   "as INT codes and its own page exactly, as in decode, so a prompt gets the same answer cold, "
                   "after a prefix-cache hit, at any --chunked-prefill-size and in any batch. 'exact': the "
                   "pages cached before the step as codes and everything after exactly: slightly better "
                   "quality on a fresh prompt, but the answer then depends on the cache state and the chunking.")
    g.add_argument("--oscar-cuda-graph", action="store_true",
                   help="No effect, kept for compatibility: with --kv-cache oscar decode CUDA graphs are on by "
                   "default on CUDA (prefill graphs stay off); SGLang's --disable-decode-cuda-graph turns them off.")
    g.add_argument("--oscar-no-rotation", action="store_true",
                   help="Ablation: skip the Walsh-Hadamard rotation of q/k/v ('scaling-only' in `oscar-sgl eval "
                   "ppl`; 'kivi' with --oscar-no-token-scaling, which also takes KIVI's format, that of INT4, as "
                   "the format flags' defaults). Lower quality. Default: rotation on.")
    g.add_argument("--oscar-no-token-scaling", action="store_true",
                   help="Ablation: skip the omni-token scaling of the keys, storing no fp32 token scales "
                   "('rotation-only' in `oscar-sgl eval ppl`). Lower quality. Default: token scaling on.")


def config_from_namespace(ns: Any) -> Any:
    """The `OscarConfig` the `--oscar-*` flags describe, or None when `--kv-cache` is not `oscar`
    (then any `--oscar-*` flag given is an error). Unset flags are None (False for switches) and
    take `OscarConfig`'s defaults. Raises `OscarConfigError` naming the flag."""
    from ..config import OscarConfig, OscarConfigError

    if getattr(ns, "kv_cache", "default") != "oscar":
        given = [name for name, value in vars(ns).items() if name.startswith("oscar_") and value not in (None, False)]
        if given:
            raise OscarConfigError(f"--{given[0].replace('_', '-')} needs --kv-cache oscar, got --kv-cache "
                                   f"{getattr(ns, 'kv_cache', 'default')}")
        return None
    values = {field: getattr(ns, dest) for field, (_, dest) in FLAGS.items() if getattr(ns, dest, None) is not None}
    return OscarConfig.from_flags(
        {field: flag for field, (flag, _) in FLAGS.items()},
        rotation=not getattr(ns, "oscar_no_rotation", False),
        token_scaling=not getattr(ns, "oscar_no_token_scaling", False), **values,
    )


def oscar_config_of(server_args: Any):
    """The `OscarConfig` a (possibly unpickled) `ServerArgs` carries, or None."""
    from ..config import OscarConfig

    d = getattr(server_args, SERVER_ARGS_ATTR, None)
    return None if d is None else OscarConfig(**d)


def prefill_mode_of(server_args: Any) -> str:
    """`--oscar-prefill` of a (possibly unpickled) `ServerArgs` (the default when not set)."""
    from .pool import PREFILL_MODES

    return getattr(server_args, SERVER_ARGS_PREFILL_ATTR, None) or PREFILL_MODES[0]


@_hook("sglang.srt.server_args.ServerArgs.add_cli_args", "AROUND")
def _around_add_cli_args(original: Callable[..., Any], parser: argparse.ArgumentParser) -> Any:
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    result = original(parser)
    add_flags(parser)
    return result


@_hook("sglang.srt.server_args.ServerArgs.from_cli_args", "AROUND")
def _around_from_cli_args(original: Callable[..., Any], cls: type, args: argparse.Namespace) -> Any:
    from ..cli import usage_error
    from ..errors import OscarConfigError
    from ..supported import check_server_flags

    try:  # right after argparse, before anything heavy: one line and exit 2, like an argparse error
        cfg = config_from_namespace(args)
        if cfg is not None:
            check_server_flags(args, cfg)
    except OscarConfigError as e:
        usage_error(str(e))
    if cfg is not None:
        from .pool import PREFILL_MODES

        args.attention_backend = BACKEND_NAME
        args.page_size = cfg.page_size
        if getattr(args, "max_running_requests", None) is None:
            # The staging pool holds the open page of every running request: SGLang's own default
            # (thousands, from the pool size) would let it run more requests than staging holds.
            from .pool import DEFAULT_MAX_RUNNING_REQUESTS

            args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        # Prefill steps have no graph path (their runtime call and seal plan vary with the chunk);
        # decode steps have one (backend.py), on by default since it served on an H200 with outputs
        # identical to eager steps (benches/results/serving.md). SGLang's own
        # --disable-decode-cuda-graph / --disable-cuda-graph turn it off.
        # On a CPU, or with OSCAR_SGL_USE_KERNELS=0, the pool runs the torch reference: no graph path.
        from .pool import kernels_wanted

        off = ["disable_prefill_cuda_graph"]
        device = str(getattr(args, "device", None) or "cuda")
        if not device.startswith("cuda") or not kernels_wanted("cuda"):
            off.append("disable_decode_cuda_graph")
        for name in off:
            if hasattr(args, name):
                setattr(args, name, True)
    server_args = original(cls, args)
    if cfg is not None:
        # An underscore name outside the Struct's fields: allowed on the sealed record and pickled
        # with its __dict__ to every worker process.
        setattr(server_args, SERVER_ARGS_ATTR, cfg.to_dict())
        setattr(server_args, SERVER_ARGS_PREFILL_ATTR, getattr(args, "oscar_prefill", None) or PREFILL_MODES[0])
    return server_args


# --------------------------------------------------------------------------------------------
# Requests (the launcher's tokenizer manager)
# --------------------------------------------------------------------------------------------


def check_prompt_ids(input_ids: Any, vocab_size: int) -> None:
    """Refuse (ValueError: HTTP 400) a prompt SGLang 0.5.23 would accept and then crash its scheduler
    on, killing the whole server: an empty prompt (`"text": ""` tokenizes to no token; the CPU
    forward of a 0-token extend raises in the rotary embedding), or a token id outside
    ``[0, vocab_size)`` (`"input_ids": [..., 49152]`: the embedding lookup raises IndexError on a
    CPU; on CUDA an out-of-range gather is undefined). SGLang itself refuses only `"input_ids": []`."""
    if input_ids is None:  # input_embeds / multimodal requests: nothing to check here
        return
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty (0 tokens): send at least one token")
    lo, hi = min(input_ids), max(input_ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"input_ids contains token id {bad}, outside the model's vocabulary [0, {vocab_size})")


@_hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "AROUND")
def _around_validate_one_request(original: Callable[..., Any], self: Any, obj: Any, input_ids: Any,
                                 *args: Any, **kwargs: Any) -> Any:
    """Every generate request (text or input_ids, single or batch) passes here after tokenization;
    with --kv-cache oscar, requests that would kill the scheduler get a 400 instead (found by the
    server soak, benches/results/reliability.md). Other servers are left as SGLang makes them."""
    if oscar_config_of(self.server_args) is not None:
        vocab = getattr(self.model_config, "vocab_size", None)
        if vocab:
            check_prompt_ids(input_ids, int(vocab))
    return original(self, obj, input_ids, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# Pool sizing and construction (scheduler processes)
# --------------------------------------------------------------------------------------------


@_hook("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size", "AROUND")
def _around_compute_cell_size(original: Callable[..., Any], self: Any, kvc: Any, num_layers: int) -> int:
    cfg = oscar_config_of(kvc.server_args)
    if cfg is None:
        return original(self, kvc, num_layers)
    import torch

    from .pool import cell_size_bytes

    from sglang.srt.runtime_context import get_parallel

    heads = kvc.model_config.get_num_kv_heads(get_parallel().attn_tp_size)
    return cell_size_bytes(cfg, heads, kvc.model_config.head_dim, num_layers,
                           bf16_layers=len(_bf16_layers(cfg, kvc)),
                           element_size=torch._utils._element_size(kvc.kv_cache_dtype))


def _bf16_layers(cfg: Any, kvc: Any) -> tuple[int, ...]:
    """The layer ids the pool keeps in the KV dtype: the loaded model's sliding-window layers with
    `--oscar-sliding-layers bf16`, none otherwise (sliding.py)."""
    if cfg.sliding_layers != "bf16":
        return ()
    from .sliding import sliding_windows_of

    return tuple(sorted(sliding_windows_of(getattr(kvc, "model", None))))


@_hook("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator.__init__", "AFTER")
def _after_pool_configurator_init(result: Any, self: Any, kvc: Any, *args: Any, **kwargs: Any) -> Any:
    """Charge the BF16 staging pool (open pages) to the KV budget before SGLang divides the rest by
    the packed cell size: without this a GPU server would allocate the staging on top of its budget."""
    cfg = oscar_config_of(kvc.server_args)
    if cfg is None:
        return result
    import torch

    from sglang.srt.runtime_context import get_parallel

    from .pool import staging_bytes_upper_bound

    elem = max(2, torch._utils._element_size(kvc.kv_cache_dtype))
    reserve = staging_bytes_upper_bound(
        cfg, num_kv_heads=kvc.model_config.get_num_kv_heads(get_parallel().attn_tp_size),
        head_dim=kvc.model_config.head_dim,
        num_layers=kvc.layer_info.num_effective_layers - len(_bf16_layers(cfg, kvc)),
        max_running_requests=getattr(kvc.server_args, "max_running_requests", None),
        max_prefill_tokens=_prefill_tokens(kvc.server_args), element_size=elem,
    )
    self._fixed_overhead_bytes = int(getattr(self, "_fixed_overhead_bytes", 0) or 0) + reserve
    return result


@_hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class", "AROUND")
def _around_resolve_kv_pool_class(original: Callable[..., Any], self: Any, *, kind: str, default: type) -> type:
    cfg = oscar_config_of(self.server_args)
    if cfg is None:
        return original(self, kind=kind, default=default)
    if kind != "mha":
        return original(self, kind=kind, default=default)
    from sglang.srt.runtime_context import get_parallel

    from ..supported import check_server_model
    from .pool import pool_class_for

    check_server_model(
        cfg, self.model_config, tp_size=get_parallel().attn_tp_size, use_mla=bool(self.use_mla_backend),
        is_hybrid_swa=bool(self.is_hybrid_swa), is_hybrid_linear=self.mambaish_config is not None,
    )
    parallel = get_parallel()
    kept = _bf16_layers(cfg, self)
    if cfg.sliding_layers == "bf16":
        import logging

        log = logging.getLogger(__name__)
        if kept:
            log.info("oscar: --oscar-sliding-layers bf16: %d sliding-window layers kept in the KV dtype: %s",
                     len(kept), list(kept))
        else:
            log.warning("oscar: --oscar-sliding-layers bf16 changes nothing: the model has no sliding-window layer")
    return pool_class_for(
        cfg,
        max_running_requests=getattr(self.server_args, "max_running_requests", None),
        enable_metrics=bool(getattr(self.server_args, "enable_metrics", False)),
        max_prefill_tokens=_prefill_tokens(self.server_args),
        tp_rank=int(parallel.tp_rank), tp_size=int(parallel.attn_tp_size),
        prefill=prefill_mode_of(self.server_args), bf16_layers=kept,
    )


def _prefill_tokens(server_args: Any) -> int | None:
    """Most tokens one prefill batch writes (what the direct-seal scratch must hold): SGLang bounds a
    batch by --max-prefill-tokens and each request's chunk by --chunked-prefill-size."""
    vals = [getattr(server_args, n, None) for n in ("max_prefill_tokens", "chunked_prefill_size")]
    vals = [int(v) for v in vals if isinstance(v, int) and v > 0]
    return max(vals) if vals else None


@_hook("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
       "_build_full_attention_backend_from_str", "BEFORE")
def _before_build_backend(*args: Any, **kwargs: Any) -> None:
    if kwargs.get("backend_str") == BACKEND_NAME:
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        if BACKEND_NAME not in ATTENTION_BACKENDS:
            from .backend import create_oscar_backend

            ATTENTION_BACKENDS[BACKEND_NAME] = create_oscar_backend
    return None


@_hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_token_to_kv_pool_allocator",
       "AROUND")
def _around_build_allocator(original: Callable[..., Any], self: Any, **kwargs: Any) -> Any:
    """Over an OScaR pool, SGLang's paged allocator becomes `OscarPagedAllocator`: the same free
    list and decisions, every page event forwarded to the pool's Rust runtime once per step."""
    pool = kwargs.get("token_to_kv_pool")
    if kwargs.get("token_to_kv_pool_allocator") is not None or not hasattr(pool, "oscar_config"):
        return original(self, **kwargs)
    from sglang.srt.runtime_context import get_disagg, get_parallel, get_schedule

    from .allocator import OscarPagedAllocator

    if get_parallel().attn_dcp_size != 1:
        from ..errors import OscarConfigError

        raise OscarConfigError(f"--dcp-size must be 1 with --kv-cache oscar, got {get_parallel().attn_dcp_size}: "
                               "decode context parallelism splits a page's tokens across ranks")
    return OscarPagedAllocator(
        kwargs["sizes"].max_total_num_tokens,
        page_size=get_schedule().page_size,
        dtype=self.kv_cache_dtype,
        device=self.device,
        kvcache=pool,
        need_sort=get_disagg().disaggregation_mode in ("decode", "prefill"),
        step=pool.oscar_step,
    )


@_hook("sglang.srt.mem_cache.kv_cache_builder.build_kv_cache", "AFTER")
def _after_build_kv_cache(result: Any, *args: Any, **kwargs: Any) -> Any:
    """The radix cache's locks, unlocks and inserts reach the runtime (only sealed pages are shared)."""
    alloc = getattr(result, "token_to_kv_pool_allocator", None)
    cache = getattr(result, "tree_cache", None)
    if alloc is not None and hasattr(alloc, "record_share") and cache is not None \
            and hasattr(cache, "path_device_indices") and hasattr(cache, "inc_lock_ref"):
        from .allocator import attach_radix_cache

        attach_radix_cache(cache, alloc)
    return result


# --------------------------------------------------------------------------------------------
# Metrics (server info; Prometheus gauges live in the pool, see metrics.py)
# --------------------------------------------------------------------------------------------


@_hook("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_memory_usage",
       "AFTER")
def _after_add_memory_usage(result: Any, self: Any, state: dict, *args: Any, **kwargs: Any) -> Any:
    alloc = self.scheduler.token_to_kv_pool_allocator
    pool = alloc.get_kvcache()
    if hasattr(pool, "oscar_step"):
        from .metrics import after_step, snapshot

        after_step(pool, alloc)  # events logged since the last step's results (none, usually)
        state["oscar"] = snapshot(pool, alloc)
    return result


@_hook("sglang.srt.managers.scheduler.Scheduler.process_batch_result", "AFTER")
def _after_process_batch_result(result: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """After a step's results are processed (finished requests released, radix inserts, unlocks):
    the runtime gets those events now and the gauges show the state after the step."""
    alloc = self.token_to_kv_pool_allocator
    pool = alloc.get_kvcache()
    if hasattr(pool, "oscar_step"):
        from .metrics import after_step

        after_step(pool, alloc)
    return result


def register() -> None:
    """Register the OScaR hooks with SGLang's HookRegistry (cheap, idempotent)."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from ..compile_log import install_from_env

    install_from_env()  # OSCAR_SGL_COMPILE_LOG (a diagnostic; nothing without the variable)
    for target, kind, fn in HOOKS:
        HookRegistry.register(target, fn, HookType[kind])
    _registered = True
