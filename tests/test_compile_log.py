"""OSCAR_SGL_COMPILE_LOG: every Triton compile of a process is logged (a real compile for sm_90,
which Triton runs to a cubin without a GPU), and the log is summarised per kernel."""

from __future__ import annotations

import json

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from oscar_sgl import compile_log


def _add_kernel(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y_ptr + o, tl.load(x_ptr + o) + 1.0)


# a compiled JIT function even where the suite runs kernels in Triton's interpreter (TRITON_INTERPRET)
_ADD = JITFunction(_add_kernel)


@pytest.fixture
def listener_restored():
    from triton import knobs

    before = knobs.compilation.listener
    yield
    knobs.compilation.listener = before
    compile_log._installed = None


def _compile(n: int):
    src = ASTSource(_ADD, {"x_ptr": "*fp32", "y_ptr": "*fp32", "N": "constexpr"}, {"N": n})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})


def test_every_compile_is_logged_with_its_constants(tmp_path, monkeypatch, listener_restored):
    log = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(compile_log.ENV, str(log))
    assert compile_log.install_from_env()
    assert compile_log.install_from_env()  # idempotent: one listener, not two
    _compile(64)
    _compile(64)  # the same specialization: Triton's cache
    _compile(128)
    recs = compile_log.read(log)
    assert [(r["kernel"], r["cache_hit"]) for r in recs] == [("_add_kernel", False), ("_add_kernel", True), ("_add_kernel", False)]
    assert "64" in json.dumps(recs[0]["constants"]) and "128" in json.dumps(recs[2]["constants"])
    assert all(r["seconds"] >= 0 and r["time"] > 0 for r in recs)
    s = compile_log.summarize(recs, split_at=recs[1]["time"])
    assert s["all"]["compiles"] == 2 and s["all"]["cache_hits"] == 1
    assert s["all"]["kernels"]["_add_kernel"]["compiles"] == 2
    assert (s["before"]["compiles"], s["before"]["cache_hits"], s["after"]["compiles"]) == (1, 1, 1)


def test_nothing_is_installed_without_the_variable(monkeypatch, listener_restored):
    from triton import knobs

    monkeypatch.delenv(compile_log.ENV, raising=False)
    before = knobs.compilation.listener
    assert not compile_log.install_from_env()
    assert knobs.compilation.listener is before


def test_a_broken_log_line_is_skipped(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"kernel": "k", "cache_hit": false, "seconds": 1.5, "time": 1}\nnot json\n')
    assert compile_log.summarize(compile_log.read(p))["all"] == {
        "compiles": 1, "seconds": 1.5, "cache_hits": 0, "kernels": {"k": {"compiles": 1, "seconds": 1.5}}}
    assert compile_log.read(tmp_path / "missing.jsonl") == []


def test_the_cli_summarises_a_server_compile_log(tmp_path, capsys):
    """`oscar-sgl compiles FILE`: per kernel, compiles (cache misses) and their seconds, over a real
    server's log (the H200 run of session 18, in benches/results); a missing or empty file is one
    error line naming the variable."""
    from pathlib import Path

    from oscar_sgl.cli import main

    log = Path(__file__).resolve().parents[1] / "benches/results/serving_compiles_c683189/compile-int2.jsonl"
    assert main(["compiles", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("28 Triton compiles, 28.84 s; 0 cache hits"), out[0]
    assert out[2].split() == ["_decode_stage1_kernel", "4", "15.80"], out[2]
    for bad, why in ((tmp_path / "none.jsonl", "no compile log"), (tmp_path / "empty.jsonl", "no compile record")):
        if why == "no compile record":
            bad.write_text("\n")
        with pytest.raises(SystemExit) as e:
            main(["compiles", str(bad)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert why in err and "OSCAR_SGL_COMPILE_LOG" in err and err.count("\n") == 1, err
