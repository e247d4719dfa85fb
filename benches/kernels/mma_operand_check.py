"""Which tensor-core instruction Gluon's ``mma_v2`` becomes on sm_90 for each operand type, compiled
on the CPU (``triton.compile`` to a cubin; no GPU needed).

A one-warp ``m16n8`` tile with the reduction over one k-step of the operand type (16 for fp16, 32 for
8-bit types), its SASS MMA lines printed per type. Session 49 asked it whether 8-bit operands (INT2
codes as e4m3 or int8) would halve the decode tile's MMAs: on Triton 3.6, e4m3 operands are upcast
and run as two fp16 ``HMMA.16816``, and ptxas makes the same of an e4m3 ``mma.sync`` written in PTX
(sm_90 has e4m3 tensor cores only through ``wgmma``); int8 operands run as one ``IMMA.16832``.

    PYTHONPATH=<triton 3.6> python benches/kernels/mma_operand_check.py [--arch 89] [--json]

(Compile it in a process of its own: Triton's CPU interpreter can leave its patches on ``tl.tensor``
after a kernel run, and a Gluon compile in that process then fails; tests/test_mma_operand_check.py
runs it as a subprocess for that reason.)
"""

from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

#: operand type -> (pointer type, k of one MMA step, operand k_width, accumulator type, output pointer type)
TYPES = {
    "fp16": ("*fp16", 16, 2, "fp32", "*fp32"),
    "e4m3": ("*fp8e4nv", 32, 4, "fp32", "*fp32"),
    "int8": ("*i8", 32, 4, "int32", "*i32"),
}


@gluon.jit
def _mma_tile(a_ptr, b_ptr, o_ptr, KD: gl.constexpr, KW: gl.constexpr, INT_ACC: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    lb: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    ra = gl.arange(0, 16, layout=gl.SliceLayout(1, la))
    ca = gl.arange(0, KD, layout=gl.SliceLayout(0, la))
    a = gl.load(a_ptr + ra[:, None] * KD + ca[None, :])
    rb = gl.arange(0, KD, layout=gl.SliceLayout(1, lb))
    cb = gl.arange(0, 8, layout=gl.SliceLayout(0, lb))
    b = gl.load(b_ptr + rb[:, None] * 8 + cb[None, :])
    if INT_ACC:
        acc = gl.zeros([16, 8], gl.int32, mma)
    else:
        acc = gl.zeros([16, 8], gl.float32, mma)
    acc = mma_v2(a, b, acc)
    ro = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    co = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + ro[:, None] * 8 + co[None, :], acc)


def mma_lines(kind: str, arch: int = 90) -> list[str]:
    """The SASS lines with an MMA opcode of ``_mma_tile`` on ``kind`` operands, compiled for ``arch``."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.tools.disasm import get_sass

    if kind not in TYPES:
        raise ValueError(f"operand type must be one of {sorted(TYPES)}, got {kind!r}")
    ptr, kd, kw, acc, out = TYPES[kind]
    sig = {"a_ptr": ptr, "b_ptr": ptr, "o_ptr": out, "KD": "constexpr", "KW": "constexpr", "INT_ACC": "constexpr"}
    src = GluonASTSource(_mma_tile, sig, {"KD": kd, "KW": kw, "INT_ACC": acc == "int32"}, {})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 1})
    return [line.split("\t", 1)[-1].strip().rstrip(";") for line in get_sass(kernel.asm["cubin"]).splitlines()
            if "MMA" in line.split("\t", 1)[-1].split(" ", 1)[0]]


#: one ``mma.sync`` on e4m3 operands in PTX (``m16n8k32``, PTX ISA: sm_89 and later), as a kernel
#: would write it by hand where Gluon upcasts: what ptxas itself makes of it
_E4M3_PTX = """.version 8.7
.target sm_{arch}
.address_size 64
.visible .entry e4m3_mma(.param .u64 p)
{{
  .reg .b32 a<4>, b<2>;
  .reg .f32 d<4>;
  .reg .u64 rp;
  ld.param.u64 rp, [p];
  ld.global.v4.b32 {{a0, a1, a2, a3}}, [rp];
  ld.global.v2.b32 {{b0, b1}}, [rp+16];
  mov.f32 d0, 0f00000000; mov.f32 d1, 0f00000000; mov.f32 d2, 0f00000000; mov.f32 d3, 0f00000000;
  mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{d0, d1, d2, d3}};
  st.global.v4.f32 [rp+32], {{d0, d1, d2, d3}};
  ret;
}}
"""


def ptx_e4m3_lines(arch: int = 90) -> list[str]:
    """The SASS MMA lines ptxas (Triton's own) makes of one hand-written e4m3 ``mma.sync``."""
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas
    from triton.tools.disasm import get_sass

    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(_E4M3_PTX.format(arch=arch))
        done = subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}", str(ptx), "-o", str(cubin)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"ptxas refused the e4m3 mma.sync for sm_{arch}: {done.stderr.strip()[-500:]}")
        sass = get_sass(cubin.read_bytes())
    return [line.split("\t", 1)[-1].strip().rstrip(";") for line in sass.splitlines()
            if "MMA" in line.split("\t", 1)[-1].split(" ", 1)[0]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability to compile for (default 90)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead: {triton, arch, mma: {type: "
                    "[SASS lines]}, ptx_e4m3: [SASS lines]}")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps({"triton": triton.__version__, "arch": args.arch,
                          "mma": {kind: mma_lines(kind, args.arch) for kind in TYPES},
                          "ptx_e4m3": ptx_e4m3_lines(args.arch)}))
        return 0
    print(f"triton {triton.__version__}, sm_{args.arch}: one m16n8 tile, one k-step of each operand type")
    for kind, (_, kd, *_rest) in TYPES.items():
        lines = mma_lines(kind, args.arch)
        print(f"{kind} (k = {kd}): {len(lines)} MMA instruction(s): " + "; ".join(lines))
    lines = ptx_e4m3_lines(args.arch)
    print(f"e4m3 mma.sync m16n8k32 written in PTX, through ptxas: {len(lines)} MMA instruction(s): " + "; ".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
