"""oscar-sgl: OScaR INT2/INT4 KV-cache quantization for the SGLang server.

`import oscar_sgl` needs only torch: transformers (for `OscarCache`) and SGLang (for the plugin) are
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import LAYOUT_VERSION, METHODS, OscarConfig, OscarConfigError

__version__ = "0.1.0"

__all__ = ["LAYOUT_VERSION", "METHODS", "OscarCache", "OscarConfig", "OscarConfigError", "__version__"]

if TYPE_CHECKING:
    from .hf_cache import OscarCache


def __getattr__(name: str) -> Any:
    if name == "OscarCache":
        from .hf_cache import OscarCache

        return OscarCache
    raise AttributeError(f"module 'oscar_sgl' has no attribute {name!r}")
