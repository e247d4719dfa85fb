"""GPU-harness stand-in for `sgl_kernel` (SGLang 0.5.23's compiled kernel package).

Why: `sglang-kernel==0.4.10`'s `.so` does not load under the lent H200's torch 2.11 (C++ ABI), and the
machine reaches no registry. SGLang's CUDA path imports `sgl_kernel` at module load for dense
Llama/Qwen models and calls only a few of its ops (../../../shared/spec/SGLANG-GPU.md section 2). This
package computes those ops for real (Triton on CUDA, torch elsewhere; `ops.py`, tested against torch
references in `tests/test_serving_harness.py`) and answers every other name with a stub that raises a
clear error when called, so a path we did not map fails loudly instead of computing something wrong.

It is used by `benches/serving/` for the BF16 **and** the OScaR servers alike. The oscar-sgl wheel never
ships it, and `benches/serving/serve.py` puts it on the server's `PYTHONPATH` only when no real
`sgl_kernel` is importable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

from .ops import (  # noqa: F401  (the ops SGLang calls)
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
    silu_and_mul,
)

STAND_IN = True
__version__ = "0.4.10"

#: Every name SGLang resolved to a stub so far (the harness prints it: what the stand-in did not compute).
STUBBED: set[str] = set()


class _Missing:
    """An `sgl_kernel` name the stand-in does not compute: importable (SGLang imports many names at
    module load and never calls them on our paths), attribute chains stay stubs, a call raises."""

    def __init__(self, name: str) -> None:
        self._name = name
        STUBBED.add(name)

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{self._name} was called, but this is oscar-sgl's GPU-harness stand-in "
            "(benches/serving/stand_in), which computes only rmsnorm, fused_add_rmsnorm, gemma_rmsnorm, "
            "gemma_fused_add_rmsnorm, silu_and_mul, gelu_tanh_and_mul, gelu_and_mul and utils.is_arch_support_pdl; this SGLang path needs "
            "the real sglang-kernel package"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in stub {self._name}>"


def _stub_module(fullname: str) -> types.ModuleType:
    mod = types.ModuleType(fullname)
    short = fullname.split(".", 1)[1]
    mod.__getattr__ = lambda attr: _Missing(f"{short}.{attr}") if not attr.startswith("__") else _raise(attr)  # type: ignore[method-assign]
    mod.__path__ = []  # a package: its submodules come from the finder too
    return mod


def _raise(attr: str) -> Any:
    raise AttributeError(attr)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import sgl_kernel.X` for any X that is not a real file here: a stub module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + ".") or fullname in sys.modules:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _stub_module(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# After the path finder, so real files here (`ops.py`, `utils.py`) win.
sys.meta_path.append(_SubmoduleFinder())


def weak_ref_tensor(tensor: Any) -> Any:
    raise NotImplementedError(
        "sgl_kernel.weak_ref_tensor: SGLang calls it only to capture prefill CUDA graphs, which the "
        "GPU harness turns off for BF16 as --kv-cache oscar does (--disable-prefill-cuda-graph)"
    )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
