"""GPU-harness import shim (benches/serving): on PYTHONPATH of the harness's servers only.

`sglang/srt/layers/dual_gemm.py` (`DualGemm._select_mode`, reached from every CUDA Llama MLP) imports
`sglang.kernels.ops.gemm.cutedsl_dual_gemm`, which imports the CuTe DSL (`cutlass`, package
nvidia-cutlass-dsl). That kernel is Blackwell-only (`can_use_dual_gemm` is False on Hopper), and the lent
H200 image has no `cutlass`. When `cutlass` is not importable, this finder answers that one module with
its Hopper truth: the same constants and enum, `can_use_dual_gemm() -> False`, and kernels that raise.
Where `cutlass` exists the real module loads untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from enum import IntEnum
from typing import Any

DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (DualGemmQuantMode.DYNAMIC_PER_TENSOR, DualGemmQuantMode.DYNAMIC_PER_TOKEN)

    @property
    def is_per_token(self) -> bool:
        return self in (DualGemmQuantMode.STATIC_PER_TOKEN, DualGemmQuantMode.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(*args: Any, **kwargs: Any) -> bool:
    return False


def _no_kernel(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"{DUAL_GEMM}: the Blackwell CuTe DSL kernel is not available (no `cutlass`); "
                              "can_use_dual_gemm() is False here, so SGLang should never call it")


class _DualGemmShim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != DUAL_GEMM or importlib.util.find_spec("cutlass") is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module.MAX_DUAL_GEMM_DECODE_TOKENS = 16
        module.DualGemmQuantMode = DualGemmQuantMode
        module.can_use_dual_gemm = can_use_dual_gemm
        module.dual_gemm_swiglu = module.dual_gemm_swiglu_fp8 = _no_kernel
        module.OSCAR_HARNESS_SHIM = True


if not any(isinstance(f, _DualGemmShim) for f in sys.meta_path):
    sys.meta_path.insert(0, _DualGemmShim())
