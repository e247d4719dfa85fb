"""Launch and stop a real SGLang server on this CPU machine, for the server tests and
`scripts/sglang_demo.py`, through the package's supported CPU path: `python -m oscar_sgl serve ...`
(`oscar-sgl serve`, `oscar_sgl/serve.py`), which runs `sglang.launch_server` with what SGLang 0.5.23
needs on a CPU without sgl_kernel (the bundled stand-in, `SGLANG_USE_CPU_ENGINE=1`, and for TP its
NCCL and thread-binding settings). The plug-in reaches SGLang through the installed wheel's
`sglang.srt.plugins` entry point.

- The server runs in a new temporary folder (`oscar-sglang-*`, never the repository root) that
  holds its log and is removed when the server stops; with one OpenMP thread, `--sleep-on-idle`,
  `--skip-server-warmup` and a bounded `--max-total-tokens`.
- It runs in its own session; `stop` sends SIGTERM to the server, then SIGKILL to its process
  group, so the launcher, scheduler(s) and detokenizer all go.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Sequence

from oscar_sgl.serve import ServerEndpoint, free_server_port


def server_env() -> dict[str, str]:
    """The server processes import the same `oscar_sgl` as this process (the installed wheel in CI,
    the checkout's python/ with an editable install), one OpenMP thread, no model hub."""
    import oscar_sgl

    env = dict(os.environ)
    pkg_root = Path(oscar_sgl.__file__).resolve().parent.parent
    if "site-packages" not in pkg_root.parts:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(pkg_root)] + ([old] if old else []))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def free_port() -> int:
    """A free port below the ephemeral range (`oscar_sgl.serve.free_server_port`)."""
    return free_server_port()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two greedy completions share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass
class Server(ServerEndpoint):
    proc: subprocess.Popen
    port: int
    log_path: Path
    tmp: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def wait_healthy(self, timeout: float) -> "Server":
        """Wait (bounded) for `/health` 200; on exit or timeout, stop and raise with the log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(1.0)
        self._fail(f"server not healthy on port {self.port} after {timeout:.0f}s")

    def _fail(self, what: str) -> NoReturn:
        log = self.log()
        # The first error in the log is usually the cause; what follows it (other ranks, shutdown)
        # can push it out of the tail.
        first = next((i for i, line in enumerate(log.splitlines()) if line.startswith("Traceback")
                      or " ERROR " in line or "Error:" in line), None)
        head = "" if first is None else "\n".join(log.splitlines()[first:first + 60]) + "\n[...]\n"
        tail = log[-4000:]
        self.stop()
        raise RuntimeError(f"{what} ({' '.join(self.extra.get('cmd', []))}):\n{head}{tail}")

    def stop(self, timeout: float = 30) -> None:
        """Stop the server (`ServerEndpoint.stop_process`), then remove its temporary folder and the
        log in it."""
        self.stop_process(timeout)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(cmd: Sequence[str], port: int, env: dict[str, str] | None = None, cwd: Path | None = None) -> Server:
    """Start `cmd` in its own session, in `cwd` (default: the new temporary folder `oscar-sglang-*`
    that holds its log and goes when the server stops); does not wait."""
    tmp = Path(tempfile.mkdtemp(prefix="oscar-sglang-"))
    log_path = tmp / f"server-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(cmd), cwd=cwd or tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Server(proc, port, log_path, tmp, {"cmd": list(cmd)})


def start_cpu_server(model_path: str, *extra_args: str, max_total_tokens: int = 4096, dtype: str = "float32",
                     env: dict[str, str] | None = None) -> Server:
    """`python -m oscar_sgl serve --model-path M --device cpu ...` on a free port, not yet healthy."""
    port = free_port()
    cmd = [sys.executable, "-m", "oscar_sgl", "serve", "--model-path", model_path, "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", str(max_total_tokens),
           "--sleep-on-idle", "--skip-server-warmup", "--dtype", dtype, *extra_args]
    return start(cmd, port, {**server_env(), **(env or {})})


def launch(model_path: str, *extra_args: str, startup_timeout: float = 240, **kwargs: Any) -> Server:
    """Start the CPU server and wait (bounded) for `/health` 200. Raises with the log tail on failure."""
    return start_cpu_server(model_path, *extra_args, **kwargs).wait_healthy(startup_timeout)


def converted_model() -> str:
    """The default SmolLM2 as an HF folder (converted once, cached)."""
    from oscar_sgl.model import convert_default

    return str(convert_default())
