"""benches/kernels/mma_operand_check.py: which tensor-core instruction an MMA on each operand type
becomes, compiled for sm_89 and sm_90 on the CPU (Triton's own ptxas; no GPU). Session 49's finding
rests on it: sm_90 runs e4m3 ``mma.sync`` as two fp16 HMMAs (its fp8 tensor cores are reached only
through ``wgmma``), so INT2 codes as fp8 operands would not halve the decode tile's MMAs there.

The compiles run in a process of their own, without ``TRITON_INTERPRET``: in a pytest process where
Triton's interpreter has run kernels, a Gluon compile can find ``tl.tensor`` still patched by it (CI's
lane of many test files did: "'InterpreterBuilder' object has no attribute 'get_dot_operand_layout'")."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "benches" / "kernels" / "mma_operand_check.py"
sys.path.insert(0, str(_SCRIPT.parent))
pytest.importorskip("triton.experimental.gluon.language.nvidia.ampere", reason="this Triton has no Gluon mma_v2")
check = pytest.importorskip("mma_operand_check")


@functools.cache
def _compiled(arch: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(_SCRIPT), "--arch", str(arch), "--json"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _opcodes(lines: list[str]) -> list[str]:
    return [line.split(" ", 1)[0] for line in lines]


def test_fp16_and_int8_run_natively_on_sm_90_and_e4m3_as_two_fp16_mmas():
    out = _compiled(90)
    assert out["arch"] == 90
    assert _opcodes(out["mma"]["fp16"]) == ["HMMA.16816.F32"]
    assert _opcodes(out["mma"]["int8"]) == ["IMMA.16832.S8.S8.SAT"]
    assert _opcodes(out["mma"]["e4m3"]) == ["HMMA.16816.F32", "HMMA.16816.F32"]
    # the same instruction written in PTX: ptxas emulates it the same way on sm_90
    assert _opcodes(out["ptx_e4m3"]) == ["HMMA.16816.F32", "HMMA.16816.F32"]


def test_sm_89_runs_e4m3_natively_so_the_check_tells_the_two_apart():
    out = _compiled(89)
    assert _opcodes(out["mma"]["e4m3"]) == ["QMMA.16832.F32.E4M3.E4M3"]
    assert _opcodes(out["ptx_e4m3"]) == ["QMMA.16832.F32.E4M3.E4M3"]


def test_an_unknown_operand_type_is_refused():
    with pytest.raises(ValueError, match="operand type must be one of"):
        check.mma_lines("bf8", 90)
