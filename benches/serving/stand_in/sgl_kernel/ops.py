"""The `sgl_kernel` ops SGLang 0.5.23 calls for dense Llama/Qwen/Gemma models, computed for real.

Semantics follow sglang-kernel 0.4.10 (FlashInfer's norms): statistics and products in fp32, one
rounding to the input dtype at the end; the fused variants are in place (``residual <- input +
residual`` rounded to the dtype, ``input <- norm(input + residual)`` from the unrounded fp32 sum).
The Gemma variants scale by ``1 + weight``. On CUDA (or under ``TRITON_INTERPRET=1``) one Triton
program normalizes one row; elsewhere the torch references below run (they are also the tests'
oracle).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch-only hosts
    triton = None


def _use_triton(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


if triton is not None:

    @triton.jit
    def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, stride_x, stride_r, stride_o, eps,
                        FUSED_ADD: tl.constexpr, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        if FUSED_ADD:
            x += tl.load(res_ptr + row * stride_r + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(res_ptr + row * stride_r + cols, x.to(res_ptr.dtype.element_ty), mask=m)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        if GEMMA:
            w += 1.0
        rrms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(out_ptr + row * stride_o + cols, (x * rrms * w).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_o, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < d
        g = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + d + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError(f"sgl_kernel stand-in: {name} must be 2-D with contiguous rows, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}")
    return t


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
          out: torch.Tensor | None, gemma: bool) -> torch.Tensor:
    _rows(x, "input")
    if residual is not None:
        _rows(residual, "residual")
        if residual.shape != x.shape:
            raise ValueError(f"sgl_kernel stand-in: residual {tuple(residual.shape)} != input {tuple(x.shape)}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"sgl_kernel stand-in: weight {tuple(weight.shape)} does not match hidden size {x.shape[1]}")
    if out is None:
        out = x if residual is not None else torch.empty_like(x)
    if x.shape[0] == 0:
        return out
    if _use_triton(x):
        block = triton.next_power_of_2(x.shape[1])
        _rmsnorm_kernel[(x.shape[0],)](
            x, residual if residual is not None else x, weight, out, x.shape[1], x.stride(0),
            residual.stride(0) if residual is not None else 0, out.stride(0), float(eps),
            FUSED_ADD=residual is not None, GEMMA=gemma, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        )
        return out
    y, r = rmsnorm_reference(x, weight, eps, residual=residual, gemma=gemma)
    if residual is not None:
        residual.copy_(r)
    out.copy_(y)
    return out


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual: torch.Tensor | None = None,
                      gemma: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normalized, new residual or None), in fp32 then rounded once, without touching the inputs."""
    xf = x.float() + (residual.float() if residual is not None else 0.0)
    w = weight.float() + (1.0 if gemma else 0.0)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w
    return y.to(x.dtype), (xf.to(residual.dtype) if residual is not None else None)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: Any = None, *, gemma: bool = False) -> torch.Tensor:
    return _norm(input, None, weight, eps, out, gemma=gemma)


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: Any = None, *, gemma: bool = False) -> None:
    _norm(input, residual, weight, eps, input, gemma=gemma)


# sgl_kernel's Gemma norms: the same signatures, scaling by 1 + weight.
gemma_rmsnorm = functools.partial(rmsnorm, gemma=True)
gemma_fused_add_rmsnorm = functools.partial(fused_add_rmsnorm, gemma=True)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    return (torch.nn.functional.silu(g) * u).to(x.dtype)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: Any = None) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` with ``d = input.shape[-1] // 2``."""
    if input.shape[-1] % 2:
        raise ValueError(f"sgl_kernel stand-in: silu_and_mul needs an even last dimension, got {input.shape[-1]}")
    d = input.shape[-1] // 2
    if out is None:
        out = input.new_empty(*input.shape[:-1], d)
    x2, o2 = input.reshape(-1, 2 * d), out.view(-1, d)
    if x2.shape[0] == 0:
        return out
    if _use_triton(input):
        _rows(x2, "input")
        block = min(1024, triton.next_power_of_2(d))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](x2, o2, d, x2.stride(0), o2.stride(0), BLOCK=block)
    else:
        o2.copy_(silu_and_mul_reference(x2))
    return out


def gelu_and_mul_reference(x: torch.Tensor, approximate: str) -> torch.Tensor:
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    return (torch.nn.functional.gelu(g, approximate=approximate) * u).to(x.dtype)


def _gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None, approximate: str) -> torch.Tensor:
    name = "gelu_tanh_and_mul" if approximate == "tanh" else "gelu_and_mul"
    if input.shape[-1] % 2:
        raise ValueError(f"sgl_kernel stand-in: {name} needs an even last dimension, got {input.shape[-1]}")
    d = input.shape[-1] // 2
    if out is None:
        out = input.new_empty(*input.shape[:-1], d)
    if out.shape != (*input.shape[:-1], d):
        raise ValueError(f"sgl_kernel stand-in: {name} out {tuple(out.shape)} != {(*input.shape[:-1], d)}")
    # fp32 then rounded once, in torch on every device (gemma's MLP: a small share of a step)
    out.copy_(gelu_and_mul_reference(input, approximate))
    return out


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: Any = None) -> torch.Tensor:
    """``gelu_tanh(input[..., :d]) * input[..., d:]`` (gemma's MLP), ``d = input.shape[-1] // 2``."""
    return _gelu_and_mul(input, out, "tanh")


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: Any = None) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` (erf form), ``d = input.shape[-1] // 2``."""
    return _gelu_and_mul(input, out, "none")
