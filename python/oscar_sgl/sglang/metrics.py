"""OScaR numbers a server reports: in `/server_info` (`internal_states[i]["oscar"]`) always, and as
Prometheus gauges on `/metrics` when the server runs with `--enable-metrics`.

Gauges (multiprocess mode "mostrecent", like SGLang's own): `oscar:kv_bytes_per_token`,
`oscar:bf16_bytes_per_token`, `oscar:compression_ratio`, `oscar:pages{state=sealed|open|free}`,
`oscar:seals_per_step`, `oscar:seals_total`, `oscar:staging_pages_in_use`, `oscar:staging_pages_total`.
"""

from __future__ import annotations

from typing import Any

from .pool import bf16_cell_size_bytes


def snapshot(pool: Any) -> dict[str, Any]:
    """What a user wants to see about an `OscarKVPool` right now (plain JSON types)."""
    cfg = pool.oscar_config
    h, d, layers = pool.head_num, pool.head_dim, pool.layer_num
    packed = cfg.bytes_per_token(h, d) * layers
    bf16 = bf16_cell_size_bytes(h, d, layers)
    st = pool.oscar_runtime.stats()
    usable = pool.num_pages - 1  # page 0 is SGLang's padding page
    return {
        "config": cfg.to_dict(),
        "layout_version": 1,
        "kv_bytes_per_token": packed,
        "bf16_bytes_per_token": bf16,
        "compression_ratio": bf16 / packed,
        "effective_bits": cfg.effective_bits(h, d),
        "page_size": pool.page_size,
        "pages": {"sealed": int(st.sealed_pages), "open": int(st.open_pages),
                  "free": max(0, usable - int(st.sealed_pages) - int(st.open_pages))},
        "tree_pages": int(st.tree_pages),
        "locked_pages": int(st.locked_pages),
        "token_capacity": pool.size,
        "bf16_tokens_same_bytes": int(pool.size * packed / bf16),
        "staging_pages_in_use": int(st.staging_in_use),
        "staging_pages_total": int(st.staging_capacity),
        "staging_pages_peak": int(st.staging_high_water),
        "seals_total": int(st.seals_total),
        "seals_last_step": int(st.seals_last_step),
        "max_seals_per_step": int(st.max_seals_per_step),
        "runtime_steps": int(st.steps),
        "stored_compression_ratio": float(st.compression_ratio),
    }


class PrometheusGauges:
    """Created in the scheduler process when `--enable-metrics` is on; updated once per step."""

    def __init__(self) -> None:
        from prometheus_client import Gauge

        def g(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Gauge(name=name, documentation=doc, labelnames=labels, multiprocess_mode="mostrecent")

        self.bytes = g("oscar:kv_bytes_per_token", "OScaR packed KV bytes per token (all layers).")
        self.bf16 = g("oscar:bf16_bytes_per_token", "BF16 KV bytes per token (all layers), for comparison.")
        self.ratio = g("oscar:compression_ratio", "BF16 bytes / OScaR packed bytes per token.")
        self.pages = g("oscar:pages", "OScaR pages by state.", ("state",))
        self.seals = g("oscar:seals_per_step", "Pages sealed in the last step.")
        self.seals_total = g("oscar:seals_total", "Pages sealed since start.")
        self.staging = g("oscar:staging_pages_in_use", "BF16 staging pages in use.")
        self.staging_total = g("oscar:staging_pages_total", "BF16 staging pages allocated.")

    def update(self, pool: Any) -> None:
        s = snapshot(pool)
        self.bytes.set(s["kv_bytes_per_token"])
        self.bf16.set(s["bf16_bytes_per_token"])
        self.ratio.set(s["compression_ratio"])
        for state, n in s["pages"].items():
            self.pages.labels(state=state).set(n)
        self.seals.set(s["seals_last_step"])
        self.seals_total.set(s["seals_total"])
        self.staging.set(s["staging_pages_in_use"])
        self.staging_total.set(s["staging_pages_total"])
