"""The README's CPU server commands work as typed: each is taken from README.md's code blocks and
run verbatim by `bash -c` after `source .venv/bin/activate` (the venv `scripts/setup.sh` made in
this repository's root), in the repository root, with the environment of a new shell (none of
the test run's PYTHONPATH, OpenMP, SGLang or Triton settings). It must answer `/health` on the port
the line names (else 30000) within STARTUP_TIMEOUT and complete one request; then it is stopped.

- the first code line with `--device cpu` and `--kv-cache oscar` (the one-process OScaR server),
- the first with `--device cpu` and `--kv-cache default` (the plain BF16 server to compare with),
- the first with `--device cpu`, `--kv-cache oscar` and `--tp-size` (the TP command).
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang_support.harness import start  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
STARTUP_TIMEOUT = 300
# What a new shell does not have: the test run's own settings (test.sh, conftest.py).
NOT_IN_A_NEW_SHELL = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "TRITON_INTERPRET", "OSCAR_SGL_WHEEL")


def readme_code_lines() -> list[str]:
    lines, fenced = [], False
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.strip())
    return lines


def readme_command(*needles: str) -> str:
    for line in readme_code_lines():
        if all(n in line for n in needles):
            return line
    raise AssertionError(f"README.md has no code line with {' and '.join(needles)}")


def _port(line: str) -> int:
    m = re.search(r"--port[= ](\d+)", line)
    return int(m.group(1)) if m else 30000


def _new_shell_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in NOT_IN_A_NEW_SHELL and not k.startswith(("SGLANG_", "OSCAR_SGL_"))}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def run_readme_line(line: str) -> tuple[dict, dict, str]:
    """(one completion, /server_info, log) of the server the line starts; stops it (process group)."""
    if not (VENV / "bin" / "activate").exists():
        pytest.skip(f"no {VENV} (made by scripts/setup.sh): the README's commands run after `source .venv/bin/activate`")
    port = _port(line)
    with socket.socket() as s:
        # As the server binds (uvicorn sets SO_REUSEADDR): only a listener, not the TIME_WAIT
        # connections of an earlier server on this port, makes it fail.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            pytest.fail(f"port {port}, named by the README line, is in use ({exc}); free it to run this test:\n{line}")
    server = start(["bash", "-c", f"source {VENV}/bin/activate && {line}"], port, _new_shell_env(), cwd=ROOT)
    with server:
        server.wait_healthy(STARTUP_TIMEOUT)
        out = server.post("/v1/completions", {"model": "default", "prompt": "The capital of France is",
                                              "max_tokens": 8, "temperature": 0})
        info = server.get("/server_info")
        log = server.log()
    deadline = time.monotonic() + 10
    while _group_alive(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(server.proc.pid), "a server process outlived stop()"
    assert not server.tmp.exists()
    return out, info, log


def _launcher_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("oscar-sgl:")]


def _check_completion(out: dict) -> None:
    text = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] > 0 and text.strip(), out


def test_readme_cpu_oscar_command():
    line = readme_command("--device cpu", "--kv-cache oscar")
    assert "--tp-size" not in line, f"the README's first --device cpu --kv-cache oscar line is the TP one: {line}"
    out, info, log = run_readme_line(line)
    _check_completion(out)
    oscar = info["internal_states"][0]["oscar"]
    assert oscar["tp_size"] == 1 and oscar["kv_bytes_per_token"] < oscar["bf16_bytes_per_token"] / 4, oscar
    assert len(_launcher_lines(log)) == 1, _launcher_lines(log)


def test_readme_cpu_default_command():
    out, info, log = run_readme_line(readme_command("--device cpu", "--kv-cache default"))
    _check_completion(out)
    assert "oscar" not in info["internal_states"][0], info["internal_states"][0].keys()
    assert info["kv_cache_dtype"] == "auto" and info["attention_backend"] != "oscar", info
    assert len(_launcher_lines(log)) == 1, _launcher_lines(log)


def test_readme_cpu_tp_command():
    out, info, log = run_readme_line(readme_command("--device cpu", "--kv-cache oscar", "--tp-size"))
    _check_completion(out)
    oscar = info["internal_states"][0]["oscar"]
    assert oscar["tp_size"] > 1, oscar
    launcher = _launcher_lines(log)
    assert len(launcher) == 1 and "SGLANG_NCCL_SO_PATH=none" in launcher[0], launcher
