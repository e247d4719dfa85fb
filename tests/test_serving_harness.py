"""The GPU serving harness (benches/serving) on the CPU: the `sgl_kernel` stand-in's ops against torch
references (Triton's interpreter here, CUDA on the GPU machine: `run_gpu.sh gputests`), its stubs, the
CuTe import shim, the flags and environment the servers get, the model config and the result writer."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "benches" / "serving"
STAND_IN = SERVING / "stand_in"
sys.path.insert(0, str(SERVING))

import bench  # noqa: E402
import serve  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def sk():
    """The stand-in `sgl_kernel`, imported from benches/serving/stand_in for this module only."""
    if importlib.util.find_spec("sgl_kernel") is not None and "sgl_kernel" not in sys.modules:
        pytest.skip("a real sgl_kernel is installed: the harness would not use the stand-in here")
    sys.path.insert(0, str(STAND_IN))
    try:
        import sgl_kernel

        assert sgl_kernel.STAND_IN
        yield sgl_kernel
    finally:
        sys.path.remove(str(STAND_IN))
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 64), (7, 576), (3, 4096)])
@pytest.mark.parametrize("gemma", [False, True])
def test_rmsnorm_matches_reference(sk, dtype, rows, hidden, gemma):
    x = torch.randn(rows, hidden, dtype=dtype, device=DEVICE) * 3
    w = torch.randn(hidden, dtype=dtype, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    fn = sk.gemma_rmsnorm if gemma else sk.rmsnorm
    got = fn(x, w, 1e-6, out=out)
    assert got.data_ptr() == out.data_ptr()
    want = ((x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6))
            * (w.double() + (1.0 if gemma else 0.0))).to(dtype)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # and without `out`: a fresh tensor, the input untouched
    x0 = x.clone()
    torch.testing.assert_close(fn(x, w, 1e-6), want, rtol=tol, atol=tol)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm_is_in_place_like_sgl_kernel(sk, dtype, gemma):
    x = torch.randn(5, 576, dtype=dtype, device=DEVICE)
    r = torch.randn(5, 576, dtype=dtype, device=DEVICE)
    w = torch.randn(576, dtype=dtype, device=DEVICE)
    want_y, want_r = sk.ops.rmsnorm_reference(x, w, 1e-5, residual=r, gemma=gemma)
    s = (x.double() + r.double())
    exact = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * (w.double() + float(gemma))).to(dtype)
    (sk.gemma_fused_add_rmsnorm if gemma else sk.fused_add_rmsnorm)(x, r, w, 1e-5)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(r, s.to(dtype), rtol=tol, atol=tol)  # residual <- input + residual
    torch.testing.assert_close(x, exact, rtol=tol, atol=tol)        # input <- norm(sum)
    torch.testing.assert_close(x, want_y, rtol=tol, atol=tol)
    torch.testing.assert_close(r, want_r, rtol=tol, atol=tol)


@pytest.mark.parametrize("gemma", [False, True])
def test_norms_torch_path_on_cpu_tensors(sk, monkeypatch, gemma):
    """Without CUDA and without the interpreter the stand-in computes the norms with torch: the same
    in-place contract and values as the reference."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(4, 192, dtype=torch.bfloat16) * 3
    r = torch.randn(4, 192, dtype=torch.bfloat16)
    w = torch.randn(192, dtype=torch.bfloat16)
    want_y, _ = sk.ops.rmsnorm_reference(x, w, 1e-6, gemma=gemma)
    assert torch.equal((sk.gemma_rmsnorm if gemma else sk.rmsnorm)(x, w, 1e-6), want_y)
    want_y, want_r = sk.ops.rmsnorm_reference(x, w, 1e-6, residual=r, gemma=gemma)
    (sk.gemma_fused_add_rmsnorm if gemma else sk.fused_add_rmsnorm)(x, r, w, 1e-6)
    assert torch.equal(x, want_y) and torch.equal(r, want_r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 128), (9, 2 * 1536), (2, 3, 2 * 200)])
def test_silu_and_mul_matches_reference(sk, dtype, shape):
    x = torch.randn(*shape, dtype=dtype, device=DEVICE) * 4
    d = shape[-1] // 2
    want = (torch.nn.functional.silu(x[..., :d].double()) * x[..., d:].double()).to(dtype)
    out = torch.full((*shape[:-1], d), float("nan"), dtype=dtype, device=DEVICE)
    got = sk.silu_and_mul(x, out)
    assert got.data_ptr() == out.data_ptr()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(sk.silu_and_mul(x), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tanh", [True, False])
def test_gelu_and_mul_matches_reference(sk, dtype, tanh):
    """gemma's MLP: gelu (tanh form, or erf) of the first half times the second, against the formula."""
    import math

    x = torch.randn(5, 2 * 640, dtype=dtype, device=DEVICE) * 3
    g, u = x[..., :640].double(), x[..., 640:].double()
    if tanh:
        gelu = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    else:
        gelu = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
    want = (gelu * u).to(dtype)
    out = torch.full((5, 640), float("nan"), dtype=dtype, device=DEVICE)
    got = (sk.gelu_tanh_and_mul if tanh else sk.gelu_and_mul)(x, out)
    assert got.data_ptr() == out.data_ptr()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="even last dimension"):
        sk.gelu_tanh_and_mul(torch.randn(2, 7, device=DEVICE))


def test_bad_shapes_are_refused(sk):
    with pytest.raises(ValueError, match="weight"):
        sk.rmsnorm(torch.randn(2, 8, device=DEVICE), torch.randn(9, device=DEVICE))
    with pytest.raises(ValueError, match="even last dimension"):
        sk.silu_and_mul(torch.randn(2, 7, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous rows"):
        sk.rmsnorm(torch.randn(8, 4, device=DEVICE).t(), torch.randn(8, device=DEVICE))


def test_unmapped_names_import_and_raise_clearly_when_called(sk):
    from sgl_kernel import int8_scaled_mm
    from sgl_kernel.kvcacheio import transfer_kv_all_layer
    from sgl_kernel.scalar_type import scalar_types

    uint4b8 = scalar_types.uint4b8  # attribute chains at import time stay stubs
    for fn in (int8_scaled_mm, transfer_kv_all_layer, uint4b8):
        with pytest.raises(NotImplementedError, match="GPU-harness stand-in"):
            fn(1)
    with pytest.raises(NotImplementedError, match="prefill CUDA graphs"):
        sk.weak_ref_tensor(torch.zeros(1))
    from sgl_kernel.utils import is_arch_support_pdl

    assert is_arch_support_pdl() is False
    assert {"int8_scaled_mm", "kvcacheio.transfer_kv_all_layer"} <= sk.STUBBED


def test_stand_in_metadata_satisfies_sglangs_version_check():
    import importlib.metadata as md

    dist = next(d for d in md.distributions(path=[str(STAND_IN)]) if d.metadata["Name"] == "sglang-kernel")
    assert dist.version == "0.4.10"


def test_dual_gemm_shim_only_without_cutlass():
    pytest.importorskip("sglang")
    code = ("import importlib.util, sglang.kernels.ops.gemm.cutedsl_dual_gemm as m; "
            "print(importlib.util.find_spec('cutlass') is None, getattr(m, 'OSCAR_HARNESS_SHIM', False), "
            "m.can_use_dual_gemm(1, 4096, 14336, m.DualGemmQuantMode.UNQUANT), m.MAX_DUAL_GEMM_DECODE_TOKENS, "
            "m.DualGemmQuantMode.UNQUANT.is_quantized)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STAND_IN), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    no_cutlass, shim, can, max_tokens, quantized = r.stdout.split()
    assert shim == no_cutlass  # the shim answers exactly when cutlass is missing
    assert (can, max_tokens, quantized) == ("False", "16", "False")
    # Without the harness's PYTHONPATH the real module is imported (and fails here on `cutlass`).
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode == 0) == (no_cutlass == "False"), r.stderr[-2000:]


def test_harness_env_adds_the_stand_in_only_without_a_real_sgl_kernel():
    env, used = serve.harness_env({"PATH": os.environ["PATH"], "PYTHONPATH": "/x"})
    assert used == (not serve.real_sgl_kernel_importable())
    if used:
        assert env["PYTHONPATH"].split(os.pathsep) == [str(STAND_IN), "/x"]
        assert env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"


def test_the_wheel_never_ships_the_stand_in():
    wheel = os.environ.get("OSCAR_SGL_WHEEL")
    if not wheel:
        pytest.skip("OSCAR_SGL_WHEEL not set (scripts/test.sh sets it to the built wheel)")
    names = zipfile.ZipFile(wheel).namelist()
    # (the wheel's own import-only CPU stand-in lives under oscar_sgl/_cpu_stand_in/: tests/test_serve.py)
    assert not [n for n in names if n.startswith(("sgl_kernel", "sglang_kernel", "benches/"))
                or "sitecustomize" in n or n.endswith("sgl_kernel/ops.py")]


def test_model_config_is_the_llama_31_8b_shape(tmp_path):
    from transformers import AutoConfig

    d = serve.write_model_config(tmp_path / "m")
    c = AutoConfig.from_pretrained(d)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.hidden_size) == (32, 32, 8, 4096)
    assert c.hidden_size // c.num_attention_heads == 128 and c.vocab_size == 128256


@pytest.mark.parametrize("kv, bits, graphs", [("default", 16, True), ("default", 16, False), ("oscar", 2, True),
                                              ("oscar", 4, False)])
def test_server_flags_parse_with_sglangs_own_parser(kv, bits, graphs):
    pytest.importorskip("sglang")
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs

    from oscar_sgl.sglang import plugin

    plugin.register()
    HookRegistry.apply_hooks()
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    a = p.parse_args(serve.server_args("/m", kv_cache=kv, bits=bits, cuda_graph=graphs))
    assert a.mem_fraction_static == 0.5 and a.disable_prefill_cuda_graph and a.load_format == "dummy"
    assert a.kv_cache == kv and a.disable_decode_cuda_graph == (kv == "default" and not graphs)
    if kv == "oscar":
        assert a.oscar_bits == bits and a.oscar_cuda_graph == graphs
        assert a.oscar_key_rotation == "all"  # dummy weights: the per-head rule would read noise
        trained = p.parse_args(serve.server_args("/m", kv_cache=kv, bits=bits, cuda_graph=graphs, dummy=False))
        assert trained.oscar_key_rotation is None  # trained weights: the server's default rule
    else:
        assert a.attention_backend == "triton"
    with pytest.raises(ValueError, match="kv_cache"):
        serve.server_args("/m", kv_cache="fp8")


# SGLang 0.5.23's decode log line, as `metrics_reporter.py` formats it.
LINE = ("[2026-12-01 21:00:00] Decode batch, #running-req: 61, #token: 2014234, token usage: 0.96, "
        "cuda graph: True, gen throughput (token/s): 3512.25, #queue-req: 0, ")


def test_decode_log_parser_agrees_with_sglangs_own_regex():
    pytest.importorskip("sglang")
    import re

    from sglang.srt.debug_utils.log_parser import _PATTERN_DECODE

    m = re.search(_PATTERN_DECODE, LINE)
    (ours,) = bench.decode_lines(LINE)
    assert ours == {"running": float(m["num_running_req"]), "tokens": float(m["num_token"]),
                    "usage": float(m["token_usage"]), "tps": float(m["gen_throughput"]), "queue": float(m["queue_req"])}
    log = "\n".join([LINE.replace("3512.25", str(v)) for v in (100.0, 3000.0, 3400.0, 3600.0)]
                    + [LINE.replace("#running-req: 61", "#running-req: 5")])
    assert bench.steady_throughput(bench.decode_lines(log), 61) == 3400.0  # first line dropped, median
    assert bench.steady_throughput(bench.decode_lines(log), 7) is None
    assert bench.retractions(log + "\n[..] KV cache pool is full. Retract requests. #retracted_reqs: 3") == 1


def _run(name, kv, bits, graphs, pool, workloads):
    return {"name": name, "kv_cache": kv, "bits": bits, "cuda_graph": graphs, "pool_tokens": pool,
            "stand_in": True, "workloads": workloads}


def test_report_writes_the_issue_schema_and_a_plot(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    gc = {"workload": "graph-check", "output_ids": [[1, 2], [3, 4]], "output_logprobs": [[-0.1, -0.2], [-0.3, -0.4]],
          "speed": {"1": {"output_tok_s": 50.0, "client_output_tok_s": 40.0}}}
    ld = {"workload": "long-decode", "pool_tokens": 446521, "max_running": 13, "max_concurrent_32k": 13,
          "concurrency": 13, "output_tok_s": 1500.0, "retractions": 0, "decode_lines": [{"running": 13.0}]}
    sw = [{"workload": "sweep", "concurrency": c, "output_tok_s": 100.0 * c} for c in (1, 8)]
    (runs / "bf16.json").write_text(json.dumps(_run("bf16", "default", 16, True, 446521, [ld, *sw])))
    (runs / "int2.json").write_text(json.dumps(_run("int2", "oscar", 2, True, 2106624,
                                                    [{**ld, "pool_tokens": 2106624, "max_running": 61}, *sw, gc])))
    gc2 = {**gc, "output_ids": [[1, 2], [3, 5]]}
    (runs / "int2-eager.json").write_text(json.dumps(_run("int2-eager", "oscar", 2, False, 2106624, [gc2])))
    res = tmp_path / "results"
    assert bench.main(["report", str(runs), "--results", str(res), "--commit", "abc123"]) == 0
    doc = json.loads((res / "serving.json").read_text())
    assert doc["gpu"] == "NVIDIA H200" and doc["commit"] == "abc123"
    keys = {(r["kv_cache"], r["bits"], r["workload"], r.get("concurrency")) for r in doc["rows"]}
    assert {("default", 16, "capacity", None), ("oscar", 2, "capacity", None), ("default", 16, "long-decode", 13),
            ("oscar", 2, "sweep", 8), ("oscar", 2, "decode-batch", 1)} <= keys
    for r in doc["rows"]:
        assert r["kv_cache"] in ("default", "oscar") and r["bits"] in (16, 2, 4) and isinstance(r["pool_tokens"], int)
        assert "decode_lines" not in r and "output_ids" not in r
    assert doc["cuda_graph_vs_eager_int2"] == {"prompts": 2, "identical_ids": 1, "max_abs_logprob_diff": 0.0}
    assert (res / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pool_tokens_reads_sglangs_server_info_shape():
    info = {"internal_states": [{"memory_usage": {"token_capacity": 2106624}, "oscar": {"page_size": 128}}]}
    assert bench.pool_tokens(info) == 2106624
    assert bench.pool_tokens({"max_total_num_tokens": 7}) == 7
    with pytest.raises(KeyError):
        bench.pool_tokens({"internal_states": [{}]})
    assert bench.Ids(1000 + 50).make(3, 5) == bench.Ids(1050).make(3, 5) != bench.Ids(1050).make(4, 5)


def test_prefill_log_parser_reads_sglangs_prefill_line():
    """`bench.prefill_lines` on the line SGLang 0.5.23's scheduler logs (metrics_reporter:
    "Prefill batch, #new-seq: ..., #new-token: ..., #cached-token: ..."), with its timestamp."""
    line = ("[2026-12-04 15:58:19] Prefill batch, #new-seq: 20, #new-token: 7680, #cached-token: 215040, "
            "token usage: 0.21, #running-req: 1, #queue-req: 27, #pending-token: 0, ")
    other = "[2026-12-04 15:58:20] Decode batch, #running-req: 21, #token: 1, token usage: 0.21, ..."
    assert bench.prefill_lines(line + "\n" + other + "\n" + line.replace("20,", "6,")) == [
        {"at": "2026-12-04 15:58:19", "seqs": 20, "new": 7680, "cached": 215040},
        {"at": "2026-12-04 15:58:19", "seqs": 6, "new": 7680, "cached": 215040}]


def test_trace_summary_counts_self_time_and_gpu_busy_time(tmp_path):
    """`trace_summary.summarize` on a torch-profiler Chrome trace: nested host ops count their own
    time only (a parent's minus its children's), GPU kernels by name and their union as busy time.
    The host part from a real CPU profile; the GPU part from events of the same schema."""
    import gzip

    import trace_summary

    a = torch.randn(192, 192)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step[EXTEND]"):
            for _ in range(3):
                torch.softmax(a @ a, -1)
    path = tmp_path / "t.trace.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    # two kernels overlapping by 5 us on a GPU stream, one more later
    events += [{"ph": "X", "cat": "kernel", "name": "k1", "ts": 0.0, "dur": 10.0, "pid": 9, "tid": 7},
               {"ph": "X", "cat": "kernel", "name": "k2", "ts": 5.0, "dur": 10.0, "pid": 9, "tid": 8},
               {"ph": "X", "cat": "kernel", "name": "k1", "ts": 100.0, "dur": 4.0, "pid": 9, "tid": 7}]
    gz = tmp_path / "t.trace.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = trace_summary.summarize(gz, top=50)
    assert s["gpu"]["busy_us"] == 19.0 and s["gpu"]["kernel_us"] == 24.0 and s["gpu"]["kernels"] == 3
    assert s["gpu"]["top"][0] == {"name": "k1", "us": 14.0, "count": 2}
    host = {r["name"]: r for r in s["host"]["self_top"]}
    step = next(e for e in events if e.get("name") == "step[EXTEND]" and e.get("cat") == "user_annotation")
    mm = [e for e in events if e.get("name") == "aten::matmul" and e.get("cat") == "cpu_op"]
    assert host["aten::matmul"]["count"] == 3 == len(mm)
    # the annotation's self time is its span minus the ops inside it
    inside = sum(float(e["dur"]) for e in events if e.get("cat") == "cpu_op" and e.get("tid") == step["tid"]
                 and float(e["ts"]) >= float(step["ts"]) and float(e["ts"]) + float(e["dur"]) <= float(step["ts"]) + float(step["dur"])
                 and e.get("name") in ("aten::matmul", "aten::softmax"))
    assert host["step[EXTEND]"]["us"] == pytest.approx(float(step["dur"]) - inside, abs=0.5)
    assert host["step[EXTEND]"]["us"] < float(step["dur"])
