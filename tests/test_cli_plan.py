"""`oscar-sgl plan`: token capacity per KV format from the Rust memory planner."""

import re
import subprocess
import sys


def _plan(*args):
    return subprocess.run([sys.executable, "-m", "oscar_sgl", "plan", *args], capture_output=True, text=True, timeout=300)


def test_plan_llama_shape():
    r = _plan("--shape", "32,8,128", "--gpu-mem-gb", "80")
    assert r.returncode == 0, r.stderr
    tokens = {m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"^(bf16|fp8|int4|int2)\s+\S+\s+\S+\s+([\d,]+)", r.stdout, re.M)}
    assert set(tokens) == {"bf16", "fp8", "int4", "int2"}
    # 131072 B/token BF16 over 32 layers; INT2 packs 772 B per layer = 5.31x, less the BF16 staging.
    assert abs(tokens["bf16"] - 80e9 / 131072) <= 2 * 128  # whole pages, SGLang's padding page taken out
    assert 4.5 < tokens["int2"] / tokens["bf16"] < 5.31
    assert 2.8 < tokens["int4"] / tokens["bf16"] < 3.19
    assert abs(tokens["fp8"] - 2 * tokens["bf16"]) <= 2 * 128


def test_plan_rejects_bad_input():
    r = _plan("--shape", "32,8", "--gpu-mem-gb", "80")
    assert r.returncode == 2 and "LAYERS,KV_HEADS,HEAD_DIM" in r.stderr
    r = _plan("--shape", "32,8,96", "--gpu-mem-gb", "80")
    assert r.returncode == 2 and "power of two" in r.stderr
    r = _plan("--shape", "32,8,128", "--gpu-mem-gb", "-1")
    assert r.returncode == 2 and "--gpu-mem-gb must be positive" in r.stderr
