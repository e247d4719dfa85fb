"""The page form's group grid in the decode / extend kernels (`common.page_u_words`,
`common.page_words`) has the bits of `reference.page_group_grid` (docs/LAYOUT.md §1: u = h(step /
qmax), scale = h((b - a) * u), offset = h(base + h(a * step)), every operation rounded to fp16):
the fp32 path (CPU interpreter, and any GPU without inline PTX) and the f16x2 instructions (GPU),
bit for bit, over random and edge-case grids (subnormal and zero steps, large bases, a = b, the
ends 0 and 255)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from support.kernel_data import DEVICE, gpu, needs_cuda

from oscar_sgl import reference as R
from oscar_sgl.kernels import common as C

N, M = 64, 32  # key groups x channel pairs


@triton.jit
def _grid_kernel(ra_ptr, rb_ptr, sw_ptr, bw_ptr, s_ptr, o_ptr, N: tl.constexpr, M: tl.constexpr, QMAX: tl.constexpr,
                 USE_ASM: tl.constexpr):
    o = tl.arange(0, N)[:, None] * M + tl.arange(0, M)[None, :]
    ra = tl.load(ra_ptr + o)
    rb = tl.load(rb_ptr + o)
    sw = tl.load(sw_ptr + tl.arange(0, M))
    bw = tl.load(bw_ptr + tl.arange(0, M))
    s_w, o_w = C.page_words(ra, rb, C.page_u_words(sw, QMAX), sw, bw, QMAX, USE_ASM)
    tl.store(s_ptr + o, s_w)
    tl.store(o_ptr + o, o_w)


def _grid(seed: int) -> tuple[torch.Tensor, ...]:
    """fp16 base / step [2M] (channel pairs in memory order) and uint8 a <= b [N, 2M]."""
    g = torch.Generator().manual_seed(seed)
    mag = 10.0 ** torch.empty(2 * M).uniform_(-4, 3, generator=g)
    base = (torch.randn(2 * M, generator=g) * mag).half()
    step = (torch.rand(2 * M, generator=g) * mag / 64).half()
    step[:4] = torch.tensor([0.0, 2.0**-24, 3 * 2.0**-20, 2.0**-14], dtype=torch.float16)  # zero and subnormal steps
    base[4:8] = torch.tensor([-60000.0, 30000.0, 2.0**-20, -0.0], dtype=torch.float16)
    step[4:6] = torch.tensor([15.0, 100.0], dtype=torch.float16)  # base + 255 * step stays finite
    a = torch.randint(0, 256, (N, 2 * M), generator=g)
    b = torch.minimum(a + torch.randint(0, 256, (N, 2 * M), generator=g), torch.tensor(255))
    a[0], b[0], a[1], b[1] = 0, 255, 255, 255  # the ends, and a = b
    return base, step, a.to(torch.uint8), b.to(torch.uint8)


def _words(x: torch.Tensor) -> torch.Tensor:
    """[..., 2M] 16-bit values -> [..., M] int32 words (channel 2m in the low half)."""
    return x.contiguous().view(torch.int16).view(torch.int32)


def _run(bits: int, seed: int, device: torch.device, use_asm: bool) -> None:
    base, step, a, b = _grid(seed)
    qmax = (1 << bits) - 1
    ra = torch.stack((a[:, 0::2], a[:, 1::2]), dim=-1).reshape(N, 2 * M).view(torch.int16)  # (a_2m, a_2m+1) bytes
    rb = torch.stack((b[:, 0::2], b[:, 1::2]), dim=-1).reshape(N, 2 * M).view(torch.int16)
    s_w = torch.empty(N, M, dtype=torch.int32, device=device)
    o_w = torch.empty(N, M, dtype=torch.int32, device=device)
    _grid_kernel[(1,)](ra.to(device), rb.to(device), _words(step).to(device), _words(base).to(device), s_w, o_w,
                       N=N, M=M, QMAX=qmax, USE_ASM=use_asm)
    scale, offset = R.page_group_grid(base.float()[None], step.float()[None], a.float(), b.float(), float(qmax))
    assert torch.isfinite(scale).all() and torch.isfinite(offset).all()
    got_s = s_w.cpu().view(torch.int16).view(torch.float16)
    got_o = o_w.cpu().view(torch.int16).view(torch.float16)
    for what, got, want in (("scale", got_s, scale.half()), ("offset", got_o, offset.half())):
        bad = got.view(torch.int16) != want.view(torch.int16)
        assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} differ, e.g. {got[bad][:4]} vs {want[bad][:4]}"


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_page_grid_params_bits_of_the_reference(bits, seed):
    _run(bits, seed, DEVICE, C.use_asm(DEVICE))


def test_reference_grid_is_fp16_arithmetic():
    """`reference.page_group_grid` in fp32-then-fp16 equals fp16 arithmetic done in float64 and
    rounded once (the double rounding is innocuous): the spec's claim, checked on the same grids."""
    for seed in (0, 1):
        base, step, a, b = _grid(seed)
        for qmax in (3.0, 15.0):
            scale, offset = R.page_group_grid(base.float()[None], step.float()[None], a.float(), b.float(), qmax)

            def h(t: torch.Tensor) -> torch.Tensor:
                return t.half().double()

            u = h(step.double() / qmax)
            want_s = h((b.double() - a.double()) * u[None])
            want_o = h(base.double()[None] + h(a.double() * step.double()[None]))
            assert torch.equal(scale.double(), want_s) and torch.equal(offset.double(), want_o)


@gpu
@needs_cuda
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("use_asm", [True, False])
def test_page_grid_params_gpu_asm_and_fp32_paths(bits, use_asm):
    """Compiled: the f16x2 instructions and the fp32 path give the reference's bits."""
    for seed in range(4):
        _run(bits, seed, torch.device("cuda"), use_asm)
