"""Launch and stop a real `python -m sglang.launch_server` on this CPU machine, for the e2e test
and `scripts/sglang_demo.py`.

- The plug-in reaches SGLang through the `sglang.srt.plugins` entry point. Until the installed
  oscar-sgl wheel declares it, `entry_point/` holds a test-only dist-info that does (it is put on
  PYTHONPATH only when no installed distribution provides the entry point `oscar`).
- `stand_in/sgl_kernel`: the names SGLang's CPU path imports but never calls; each raises if called.
- The server runs from a neutral working directory (never the repository root), with one OpenMP
  thread, `--sleep-on-idle`, `--skip-server-warmup` and a bounded `--max-total-tokens`.
- It is stopped by its PID (SIGTERM, then SIGKILL of its process group after a bounded wait).
- Tensor parallelism on the CPU (`cpu_tp_env`): SGLang's own settings, nothing of ours.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _has_installed_entry_point() -> bool:
    return any(ep.name == "oscar" for ep in entry_points(group="sglang.srt.plugins"))


def server_env() -> dict[str, str]:
    """The server processes import the same `oscar_sgl` as this process (the installed wheel in CI,
    the checkout's python/ with an editable install) plus the test-only `sgl_kernel` stand-in."""
    import oscar_sgl

    env = dict(os.environ)
    pkg_root = Path(oscar_sgl.__file__).resolve().parent.parent
    paths = [] if "site-packages" in pkg_root.parts else [str(pkg_root)]
    paths.append(str(HERE / "stand_in"))
    if not _has_installed_entry_point():
        paths.append(str(HERE / "entry_point"))
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", SGLANG_USE_CPU_ENGINE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def cpu_tp_env(tp_size: int) -> dict[str, str]:
    """What `--device cpu --tp-size N` needs from SGLang 0.5.23 on this machine (validate.py,
    `check_cpu_tensor_parallel`, says why): no PyNccl (PyPI's CUDA torch ships libnccl.so.2, which
    SGLang would try to use on the CPU), so the TP all-reduce goes through torch.distributed on gloo;
    and one OpenMP core list per rank, since this machine has fewer NUMA nodes than ranks (the ranks
    share the cores round-robin)."""
    cores = sorted(os.sched_getaffinity(0))
    return {"SGLANG_NCCL_SO_PATH": "none",
            "SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(cores[i % len(cores)]) for i in range(tp_size))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path
    cwd: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, timeout: float = 60) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            body = r.read().decode()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def post(self, path: str, payload: dict[str, Any], timeout: float = 300) -> Any:
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())

    def stop(self, timeout: float = 30) -> None:
        """Stop by PID: SIGTERM to the launcher, then SIGKILL to its process group if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # The scheduler / detokenizer children share the launcher's process group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(model_path: str, *extra_args: str, startup_timeout: float = 240, max_total_tokens: int = 4096,
           cwd: Path | None = None, env: dict[str, str] | None = None) -> Server:
    """Start the server and wait (bounded) for `/health` 200. Raises with the log tail on failure."""
    port = free_port()
    cwd = cwd or Path(tempfile.mkdtemp(prefix="oscar-sglang-"))
    log_path = cwd / f"server-{port}.log"
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", str(max_total_tokens),
           "--sleep-on-idle", "--skip-server-warmup", "--dtype", "float32", *extra_args]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=cwd, env={**server_env(), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = Server(proc, port, log_path, cwd, {"cmd": cmd})
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            urllib.request.urlopen(server.url + "/health", timeout=5)
            return server
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"server not healthy after {startup_timeout}s:\n{server.log()[-4000:]}")


def converted_model() -> str:
    """The default SmolLM2 as an HF folder (converted once, cached)."""
    from oscar_sgl.model import convert_default

    return str(convert_default())
