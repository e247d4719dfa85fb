"""`sgl_kernel.utils` names SGLang's Triton attention backend imports (stand-in)."""

from __future__ import annotations

from typing import Any


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch: the stand-in's kernels never use it, so False is the truth."""
    return False


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from . import _Missing

    return _Missing(f"utils.{name}")
