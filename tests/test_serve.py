"""`oscar-sgl serve`: what it adds for `--device cpu` (and only then), the bundled sgl_kernel
stand-in (never shadowing a real one), and that every argument and the exit code are SGLang's.
The servers themselves run in test_readme_serving.py and the other server tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oscar_sgl import serve

OSCAR_SGL = Path(sys.executable).with_name("oscar-sgl")


@pytest.fixture
def no_sgl_kernel():
    """This machine's situation (PyPI has no CPU sgl_kernel); skip where a real one is installed."""
    import importlib.util

    if importlib.util.find_spec("sgl_kernel") is not None:
        pytest.skip("a real sgl_kernel is installed here: the stand-in is not used")


@pytest.fixture
def real_sgl_kernel(tmp_path, monkeypatch):
    """An importable `sgl_kernel` package ahead on sys.path, as a real installation would be."""
    pkg = tmp_path / "site" / "sgl_kernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    return pkg.parent


@pytest.mark.parametrize("argv", [[], ["--model-path", "m"], ["--device", "cuda"], ["--device=cuda"],
                                  ["--device", "cpu", "--device", "cuda"], ["--", "--device", "cpu"]])
def test_nothing_added_without_device_cpu(argv):
    assert serve.cpu_environment(argv, {}) == ({}, None)


@pytest.mark.parametrize("argv", [["--device", "cpu"], ["--device=cpu"], ["--device", "cuda", "--device", "cpu"]])
def test_cpu_without_sgl_kernel(argv, no_sgl_kernel):
    env, line = serve.cpu_environment(["--model-path", "m", *argv], {"PYTHONPATH": "/a"})
    assert env == {"SGLANG_USE_CPU_ENGINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(serve.STAND_IN_ROOT), "/a"])}
    assert line == ("oscar-sgl: CPU serving without sgl_kernel: using the bundled stand-in for 10 import-only "
                    "names; set SGLANG_USE_CPU_ENGINE=1")
    assert len(serve.stand_in_names()) == 10


def test_callers_settings_win(no_sgl_kernel):
    pythonpath = os.pathsep.join([str(serve.STAND_IN_ROOT), "/a"])
    environ = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": pythonpath, "SGLANG_NCCL_SO_PATH": "/x.so",
               "SGLANG_CPU_OMP_THREADS_BIND": "0|0", "OMP_NUM_THREADS": "3"}
    env, line = serve.cpu_environment(["--device", "cpu", "--tp-size", "2"], environ)
    assert env == {}  # nothing overridden, the stand-in not added twice
    assert line == "oscar-sgl: CPU serving without sgl_kernel: using the bundled stand-in for 10 import-only names"


def test_real_sgl_kernel_is_never_shadowed(real_sgl_kernel):
    env, line = serve.cpu_environment(["--device", "cpu"], {})
    assert env == {"SGLANG_USE_CPU_ENGINE": "1"}
    assert line == "oscar-sgl: CPU serving with the installed sgl_kernel; set SGLANG_USE_CPU_ENGINE=1"
    assert serve.cpu_environment(["--device", "cpu"], {"SGLANG_USE_CPU_ENGINE": "1"}) == ({}, None)


def test_tensor_parallel_on_cpu(no_sgl_kernel):
    cores = sorted(os.sched_getaffinity(0))
    env, line = serve.cpu_environment(["--device", "cpu", "--tensor-parallel-size=3"], {})
    assert env["SGLANG_NCCL_SO_PATH"] == "none"
    lists = serve._core_lists(cores, 3)
    assert env["OMP_NUM_THREADS"] == str(len(lists[0]))
    if serve._numa_nodes(set(cores)) < 3:
        assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "|".join(",".join(map(str, c)) for c in lists)
        assert f"SGLANG_CPU_OMP_THREADS_BIND={env['SGLANG_CPU_OMP_THREADS_BIND']}" in line
    assert line.endswith(f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} (3 ranks)"), line
    # dp x tp x pp ranks, as SGLang counts them for thread binding; one rank needs none of this.
    assert serve.ranks(["--tp-size", "2", "--pp-size", "3", "--data-parallel-size", "2"]) == 12
    assert serve.ranks(["--tp-size", "x"]) == 1  # SGLang's own parser reports it
    assert "SGLANG_NCCL_SO_PATH" not in serve.cpu_environment(["--device", "cpu", "--tp-size", "1"], {})[0]


def test_core_lists():
    assert serve._core_lists([0, 1], 3) == [[0], [1], [0]]  # fewer cores than ranks: shared round robin
    assert serve._core_lists([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3]]


def _stand_in_import(pythonpath: list[str]) -> subprocess.CompletedProcess:
    code = ("import sys, sgl_kernel; print(sgl_kernel.__file__); print('torch' in sys.modules)\n"
            "try:\n    sgl_kernel.rotate_input_ids_cpu()\nexcept RuntimeError as e:\n    print(e)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)})


def test_stand_in_imports_and_raises_if_called(no_sgl_kernel):
    r = _stand_in_import([str(serve.STAND_IN_ROOT)])
    assert r.returncode == 0, r.stderr
    path, torch_loaded, message = r.stdout.splitlines()
    assert Path(path).is_relative_to(serve.STAND_IN_ROOT)
    assert torch_loaded == "False"  # it registers nothing under torch.ops.sgl_kernel
    assert message.startswith("sgl_kernel.rotate_input_ids_cpu was called, but this is oscar-sgl's import-only stand-in")


def test_stand_in_refuses_to_shadow_a_real_sgl_kernel(real_sgl_kernel):
    r = _stand_in_import([str(serve.STAND_IN_ROOT), str(real_sgl_kernel)])
    assert r.returncode == 1
    assert "a real sgl_kernel is installed" in r.stderr and f"remove {serve.STAND_IN_ROOT}" in r.stderr, r.stderr


def _serve(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_") and k != "PYTHONPATH"}
    return subprocess.run([str(OSCAR_SGL), "serve", *argv], capture_output=True, text=True, timeout=300, cwd="/",
                          env=env)


def test_serve_passes_everything_through_to_sglang(no_sgl_kernel):
    pytest.importorskip("sglang")
    r = _serve("--device", "cpu", "--help")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--kv-cache {default,oscar}" in r.stdout and "--oscar-bits" in r.stdout  # SGLang's parser + the plug-in
    launcher = [line for line in r.stderr.splitlines() if line.startswith("oscar-sgl:")]
    assert launcher == ["oscar-sgl: CPU serving without sgl_kernel: using the bundled stand-in for 10 import-only "
                        "names; set SGLANG_USE_CPU_ENGINE=1"], r.stderr[-3000:]
    assert "is still supported" not in r.stderr  # SGLang's hint to use `sglang serve` instead is not shown
    # The exit code is SGLang's, and so is the refusal; without --device cpu nothing of ours is said.
    r = _serve("--model-path", "m", "--no-such-flag")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "unrecognized arguments: --no-such-flag" in r.stderr and "oscar-sgl:" not in r.stderr, r.stderr[-3000:]


def test_free_server_port_is_below_the_ephemeral_range_and_skips_ports_in_use(monkeypatch):
    import socket

    low_ephemeral = serve._ephemeral_low()
    for _ in range(20):
        port = serve.free_server_port()
        assert 10000 <= port and port + 16 <= min(22000, low_ephemeral), port
        for p in (port, port + 15):  # the span is free: a server and its derived ports can bind
            with socket.socket() as s:
                s.bind(("0.0.0.0", p))
    # A port whose span holds a listener is never returned.
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy_port = busy.getsockname()[1]
        busy.listen()
        monkeypatch.setattr(serve, "_ephemeral_low", lambda: 40000)
        picks = iter([busy_port - 3, *range(busy_port + 1, busy_port + 200)])
        monkeypatch.setattr(serve.random.SystemRandom, "randint", lambda self, a, b: next(picks))
        port = serve.free_server_port(low=1024, high=39999)
        assert port > busy_port, (port, busy_port)  # busy_port - 3 was drawn first and passed over
    with pytest.raises(RuntimeError, match="no 16 consecutive free ports"):
        monkeypatch.setattr(serve.random.SystemRandom, "randint", lambda self, a, b: busy_port - 1)
        with socket.socket() as busy:
            busy.bind(("0.0.0.0", busy_port))
            busy.listen()
            serve.free_server_port(low=1024, high=65000, attempts=3)
