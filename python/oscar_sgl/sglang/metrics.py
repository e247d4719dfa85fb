"""OScaR numbers a server reports: in `/server_info` (`internal_states[i]["oscar"]`) always, and as
Prometheus gauges on `/metrics` when the server runs with `--enable-metrics`.

Both describe the state after the last scheduler step: the events SGLang logs while it processes a
step's results (finished requests' pages released, radix inserts, unlocks) reach the Rust runtime
right then (`after_step`: `OscarStep.flush`, from a hook on `Scheduler.process_batch_result` and
before `/server_info` answers), not at the next step's forward.

Gauges (multiprocess mode "mostrecent", like SGLang's own), each labelled `tp_rank` (every
tensor-parallel rank has its own pool, runtime and token scales): `oscar:kv_bytes_per_token`,
`oscar:bf16_bytes_per_token`, `oscar:compression_ratio`, `oscar:pages{state=sealed|open|free}`,
`oscar:seals_per_step`, `oscar:seals_total`, `oscar:staging_pages_in_use`, `oscar:staging_pages_total`,
`oscar:kv_heads` (this rank's KV heads), `oscar:token_scale_columns` (fp32 token scales per token
and layer on this rank: 1 for the `layer` scope, one per KV head for `head`) and
`oscar:key_rotated_heads` (the (layer, KV head) pairs of this rank whose keys its key-rotation plan
rotates; `/server_info` has the plan itself, `key_rotation`).
"""

from __future__ import annotations

from typing import Any


def bf16_cell_size_bytes(num_kv_heads: int, head_dim: int, num_layers: int) -> int:
    """BF16 K and V bytes per token over all layers (what SGLang's default pool stores)."""
    return 2 * num_kv_heads * head_dim * 2 * num_layers


def after_step(pool: Any, alloc: Any = None) -> None:
    """Once per scheduler step, after SGLang processed its results: the events logged since the
    forward reach the runtime (`OscarStep.flush`), then the Prometheus gauges are updated."""
    pool.oscar_step.flush()
    if pool.oscar_gauges is not None:
        pool.oscar_gauges.update(snapshot(pool, alloc))


def snapshot(pool: Any, alloc: Any = None) -> dict[str, Any]:
    """What a user wants to see about an `OscarKVPool` (and its allocator, when given) right now
    (plain JSON types)."""
    cfg = pool.oscar_config
    h, d, layers = pool.head_num, pool.head_dim, pool.layer_num
    kept = len(getattr(pool, "bf16_layer_indices", ()))  # --oscar-sliding-layers bf16
    packed = cfg.bytes_per_token(h, d) * (layers - kept) + kept * 2 * h * d * pool.dtype.itemsize
    bf16 = bf16_cell_size_bytes(h, d, layers)
    st = pool.oscar_runtime.stats()
    # The pages SGLang's allocator hands out (page 0 is its padding page).
    usable = int(alloc.num_pages) if alloc is not None else pool.num_pages - 1
    capacity = int(alloc.size) if alloc is not None else pool.size
    return {
        "config": cfg.to_dict(),
        "layout_version": 1,
        "kv_bytes_per_token": packed,
        "bf16_bytes_per_token": bf16,
        "compression_ratio": bf16 / packed,
        # bits per cached K/V value over every layer (layers kept in the KV dtype count at its width)
        "effective_bits": 8 * packed / (2 * h * d * layers),
        "page_size": pool.page_size,
        "prefill": pool.oscar_settings.prefill,
        "tp_rank": int(pool.oscar_settings.tp_rank),
        "tp_size": int(pool.oscar_settings.tp_size),
        # This rank's KV heads: under TP the `layer` norm scope is the norm over these heads only.
        "kv_heads": h,
        "token_scale_columns": int(cfg.scale_columns(h)),
        # The key-rotation plan this rank computed from its weights (`--oscar-key-rotation`): layers
        # with no rotated head store no token scale (their allocated scale bytes stay unused).
        "key_rotation": pool.key_rotation_summary(),
        # Sliding-window layers (SGLang's single-pool mode, e.g. gemma-3): stored in this pool like
        # every layer, their attention masked to the window (SGLang's sliding_window_size).
        "sliding_window_layers": {str(k): int(w) for k, w in sorted(getattr(pool, "sliding_windows", {}).items())},
        # --oscar-sliding-layers: with "bf16" the sliding layers kept in the KV dtype (sliding.py)
        "sliding_layers": cfg.sliding_layers,
        "bf16_layers": sorted(int(pool.start_layer) + li for li in getattr(pool, "bf16_layer_indices", ())),
        "pages": {"sealed": int(st.sealed_pages), "open": int(st.open_pages),
                  "free": max(0, usable - int(st.sealed_pages) - int(st.open_pages))},
        "tree_pages": int(st.tree_pages),
        "locked_pages": int(st.locked_pages),
        "token_capacity": capacity,
        "bf16_tokens_same_bytes": int(capacity * packed / bf16),
        "staging_pages_in_use": int(st.staging_in_use),
        "staging_pages_total": int(st.staging_capacity),
        "staging_pages_peak": int(st.staging_high_water),
        "seals_total": int(st.seals_total),
        # Pages a prefill chunk opened and filled in one step, sealed from the one-layer scratch
        # (no staging page): most prefill pages.
        "direct_seals_total": int(st.direct_seals_total),
        "scratch_pages": int(getattr(pool, "num_scratch", 0)),
        "seals_last_step": int(st.seals_last_step),
        "max_seals_per_step": int(st.max_seals_per_step),
        "runtime_steps": int(st.steps),
        "stored_compression_ratio": float(st.compression_ratio),
        # The prefill kernels compiled at startup (CUDA; None elsewhere): layer kinds, seconds.
        "kernel_warm_up": getattr(pool, "oscar_warm_up_info", None),
    }


class PrometheusGauges:
    """Created in the scheduler process when `--enable-metrics` is on; updated once per scheduler step,
    after SGLang processed the step's results (`after_step`), so they show the state after the step."""

    def __init__(self, tp_rank: int = 0) -> None:
        from prometheus_client import Gauge

        self.rank = str(tp_rank)

        def g(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Gauge(name=name, documentation=doc, labelnames=labels + ("tp_rank",),
                         multiprocess_mode="mostrecent")

        self.bytes = g("oscar:kv_bytes_per_token", "OScaR packed KV bytes per token (all layers, this rank).")
        self.bf16 = g("oscar:bf16_bytes_per_token", "BF16 KV bytes per token (all layers, this rank), for comparison.")
        self.ratio = g("oscar:compression_ratio", "BF16 bytes / OScaR packed bytes per token.")
        self.pages = g("oscar:pages", "OScaR pages by state.", ("state",))
        self.seals = g("oscar:seals_per_step", "Pages sealed in the last step.")
        self.seals_total = g("oscar:seals_total", "Pages sealed since start.")
        self.staging = g("oscar:staging_pages_in_use", "BF16 staging pages in use.")
        self.staging_total = g("oscar:staging_pages_total", "BF16 staging pages allocated.")
        self.heads = g("oscar:kv_heads", "KV heads in this rank's pool.")
        self.scale_cols = g("oscar:token_scale_columns", "fp32 token scales per token and layer on this rank.")
        self.rotated = g("oscar:key_rotated_heads", "(layer, KV head) pairs of this rank whose keys are rotated.")

    def update(self, s: dict[str, Any]) -> None:
        """Set every gauge from a `snapshot`."""
        r = self.rank
        self.bytes.labels(tp_rank=r).set(s["kv_bytes_per_token"])
        self.bf16.labels(tp_rank=r).set(s["bf16_bytes_per_token"])
        self.ratio.labels(tp_rank=r).set(s["compression_ratio"])
        for state, n in s["pages"].items():
            self.pages.labels(state=state, tp_rank=r).set(n)
        self.seals.labels(tp_rank=r).set(s["seals_last_step"])
        self.seals_total.labels(tp_rank=r).set(s["seals_total"])
        self.staging.labels(tp_rank=r).set(s["staging_pages_in_use"])
        self.staging_total.labels(tp_rank=r).set(s["staging_pages_total"])
        self.heads.labels(tp_rank=r).set(s["kv_heads"])
        self.scale_cols.labels(tp_rank=r).set(s["token_scale_columns"])
        self.rotated.labels(tp_rank=r).set(s["key_rotation"]["rotated_heads"])
