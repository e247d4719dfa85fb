"""benches/kernels/mma_operand_check.py: which tensor-core instruction an MMA on each operand type
becomes, compiled for sm_89 and sm_90 on the CPU (Triton's own ptxas; no GPU). Session 49's finding
rests on it: sm_90 runs e4m3 ``mma.sync`` as two fp16 HMMAs (its fp8 tensor cores are reached only
through ``wgmma``), so INT2 codes as fp8 operands would not halve the decode tile's MMAs there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches" / "kernels"))
pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere", reason="this Triton has no Gluon mma_v2")
check = pytest.importorskip("mma_operand_check")


def _opcodes(lines: list[str]) -> list[str]:
    return [line.split(" ", 1)[0] for line in lines]


def test_fp16_and_int8_run_natively_on_sm_90_and_e4m3_as_two_fp16_mmas():
    assert _opcodes(check.mma_lines("fp16", 90)) == ["HMMA.16816.F32"]
    assert _opcodes(check.mma_lines("int8", 90)) == ["IMMA.16832.S8.S8.SAT"]
    assert _opcodes(check.mma_lines("e4m3", 90)) == ["HMMA.16816.F32", "HMMA.16816.F32"]
    # the same instruction written in PTX: ptxas emulates it the same way on sm_90
    assert _opcodes(check.ptx_e4m3_lines(90)) == ["HMMA.16816.F32", "HMMA.16816.F32"]


def test_sm_89_runs_e4m3_natively_so_the_check_tells_the_two_apart():
    assert _opcodes(check.mma_lines("e4m3", 89)) == ["QMMA.16832.F32.E4M3.E4M3"]
    assert _opcodes(check.ptx_e4m3_lines(89)) == ["QMMA.16832.F32.E4M3.E4M3"]


def test_an_unknown_operand_type_is_refused():
    with pytest.raises(ValueError, match="operand type must be one of"):
        check.mma_lines("bf8", 90)
