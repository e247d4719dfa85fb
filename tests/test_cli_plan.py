"""`oscar-sgl plan`: token capacity per KV format from the Rust memory planner."""

import re
import subprocess
import sys

import pytest


#: A valid shape and budget: each bad-input case changes or adds one flag.
LLAMA = ["--shape", "32,8,128"]
LLAMA_80GB = [*LLAMA, "--gpu-mem-gb", "80"]


def _plan(*args):
    return subprocess.run([sys.executable, "-m", "oscar_sgl", "plan", *args], capture_output=True, text=True, timeout=300)


def test_plan_llama_shape():
    r = _plan(*LLAMA_80GB)
    assert r.returncode == 0, r.stderr
    tokens = {m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"^(bf16|fp8|int4|int2)\s+\S+\s+\S+\s+([\d,]+)", r.stdout, re.M)}
    assert set(tokens) == {"bf16", "fp8", "int4", "int2"}
    # 131072 B/token BF16 over 32 layers; INT2 packs 772 B per layer = 5.31x, less the BF16 staging.
    assert abs(tokens["bf16"] - 80e9 / 131072) <= 2 * 128  # whole pages, SGLang's padding page taken out
    assert 4.5 < tokens["int2"] / tokens["bf16"] < 5.31
    assert 2.8 < tokens["int4"] / tokens["bf16"] < 3.19
    assert abs(tokens["fp8"] - 2 * tokens["bf16"]) <= 2 * 128


@pytest.mark.parametrize(
    "args, line",
    [
        *[([*LLAMA, "--gpu-mem-gb", gb], f"error: --gpu-mem-gb must be a positive number of GB below 1.84e+10, got {gb}")
          for gb in ("inf", "1e30", "nan", "-1", "lots")],
        (LLAMA, "error: the following arguments are required: --gpu-mem-gb"),
        (["--shape=-1,8,128", "--gpu-mem-gb", "80"],
         "error: --shape must be LAYERS,KV_HEADS,HEAD_DIM, three positive integers below 2^31, got -1,8,128"),
        (["--shape", "32,8", "--gpu-mem-gb", "80"],
         "error: --shape must be LAYERS,KV_HEADS,HEAD_DIM, three positive integers below 2^31, got 32,8"),
        (["--shape", "32,8,4294967296", "--gpu-mem-gb", "80"],
         "error: --shape must be LAYERS,KV_HEADS,HEAD_DIM, three positive integers below 2^31, got 32,8,4294967296"),
        (["--shape", "32,8,96", "--gpu-mem-gb", "80"],
         "error: --shape must describe a KV cache OScaR can quantize and the planner can count: the model's "
         "head_dim must be a power of two for the Walsh-Hadamard rotation, got 96"),
        (["--shape", "2000000000,2000000000,1073741824", "--gpu-mem-gb", "80"],
         "error: --shape must describe a KV cache OScaR can quantize and the planner can count: the byte count of "
         "one page overflows 64 bits (the shape or page size is too large)"),
        ([*LLAMA_80GB, "--page-size", "100"],
         "error: --page-size must be a positive multiple of --k-group (16), got 100: a page is sealed whole, and "
         "no key group may straddle a seal"),
        ([*LLAMA_80GB, "--page-size", "0"],
         "error: --page-size must be a positive integer below 2^31, got 0"),
        ([*LLAMA_80GB, "--k-group", "7"],
         "error: --k-group must be a positive power of two, got 7"),
        ([*LLAMA_80GB, "--max-running-requests", "99999999999"],
         "error: --max-running-requests must be a positive integer below 2^31, got 99999999999"),
        ([*LLAMA_80GB, "--norm-scope", "rank"],
         "error: --norm-scope must be one of 'layer', 'head', got 'rank'"),
        (["--model", "/nonexistent-model", "--gpu-mem-gb", "80"],
         "error: --model must be a local Hugging Face model folder, 'default' or 'gemma-3-270m': /nonexistent-model has no "
         "config.json (no model is fetched from a hub)"),
        (["--model", "default", *LLAMA_80GB],
         "error: --shape must not be combined with --model: give one or the other"),
    ],
)
def test_plan_bad_input_is_one_line(args, line):
    r = _plan(*args)
    assert (r.returncode, r.stderr, r.stdout) == (2, line + "\n", "")


def test_plan_says_why_nothing_fits():
    """--model default at 0.5 GB: the BF16 staging pool of 128 requests alone (0.773 GB) exceeds the budget."""
    r = _plan("--model", "default", "--gpu-mem-gb", "0.5")
    assert r.returncode == 0, r.stderr
    assert "SmolLM2-135M-Instruct  (30 layers, 3 KV heads, head_dim 64)" in r.stdout
    assert "note: int4, int2: no token fits, because the BF16 staging pool alone (0.773 GB: 262 pages for " \
           "--max-running-requests 128 and --max-prefill-tokens 16384) exceeds the 0.5 GB budget; raise --gpu-mem-gb " \
           "or lower those two" in r.stdout
    r = _plan(*LLAMA, "--gpu-mem-gb", "0.0001")  # 100 kB: not two BF16 pages of 128 tokens
    assert r.returncode == 0, r.stderr
    assert "note: bf16, fp8: no token fits, because the 0.0001 GB budget holds fewer than two pages of 128 " \
           "tokens (one is SGLang's padding page); raise --gpu-mem-gb or lower --page-size" in r.stdout
    assert "note: int4, int2: no token fits, because the BF16 staging pool alone (4.4 GB: " in r.stdout
    r = _plan("--model", "default", "--gpu-mem-gb", "80")
    assert r.returncode == 0 and "note:" not in r.stdout, r.stdout
