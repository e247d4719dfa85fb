"""`oscar-sgl serve ARGS...`: runs `python -m sglang.launch_server ARGS...` (every argument passed
through, its exit code returned), plus what SGLang 0.5.23 needs to serve on a CPU.

Without `--device cpu` nothing is added: the command is `python -m sglang.launch_server ARGS...`.
With `--device cpu` (as `--device cpu` or `--device=cpu`; the last one given wins, as in argparse),
only variables the caller has not set are set, and one `oscar-sgl:` line on stderr says which:

- `SGLANG_USE_CPU_ENGINE=1`: SGLang's CPU mode. Without it `--device cpu` dies importing `vllm`
  (rotary_embedding/base.py takes vllm's `rotary_embedding` on any platform it does not recognise).
- When no `sgl_kernel` is installed (`importlib.util.find_spec("sgl_kernel") is None`; PyPI has no
  CPU build): the bundled stand-in `oscar_sgl/_cpu_stand_in/sgl_kernel` goes first on PYTHONPATH,
  which the spawned scheduler, detokenizer and TP ranks inherit. It defines the names SGLang's CPU
  path imports at module load and raises if one is called (see its docstring). A real sgl_kernel is
  never shadowed: the stand-in is then not put on the path, and refuses to load if it finds one.
- With more than one rank (`--tp-size`, `--pp-size`, `--dp-size` and their long aliases):
  `SGLANG_NCCL_SO_PATH=none` (PyPI's CUDA build of torch ships libnccl.so.2, and SGLang would build
  a PyNccl communicator on the CPU, "Expected a cuda device"; `none` selects its gloo fallback);
  `SGLANG_CPU_OMP_THREADS_BIND` with one core list per rank when the machine has fewer NUMA nodes
  than ranks (SGLang asserts otherwise); and, with the stand-in (SGLang then binds no threads),
  `OMP_NUM_THREADS` = the cores of one rank, so the ranks do not oversubscribe the cores.

The server runs as `python -c <bootstrap> ARGS...`, which runs `sglang.launch_server` as `__main__`
exactly as `-m` does but without the working directory on `sys.path` (so a checkout's folders,
e.g. `triton_kernels/`, never shadow installed packages) and without SGLang's hint to use
`sglang serve` instead (that command would not get the CPU settings above).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import random
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

STAND_IN_ROOT = Path(__file__).resolve().parent / "_cpu_stand_in"

_BOOTSTRAP = (
    "import runpy, sys, warnings\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "warnings.filterwarnings('ignore', message=\"'python -m sglang.launch_server' is still supported\")\n"
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)"
)
_RANK_FLAGS = (("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size"),
               ("--dp-size", "--data-parallel-size"))


def _last_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last `NAME VALUE` / `NAME=VALUE` among `names` (argparse: the last wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def ranks(argv: Sequence[str]) -> int:
    """dp × tp × pp, the process count SGLang binds CPU threads for (numa_utils.init_threads_binding)."""
    n = 1
    for names in _RANK_FLAGS:
        value = _last_value(argv, names)
        if value is None:
            continue
        try:
            n *= max(int(value), 1)
        except ValueError:
            pass  # SGLang's own parser says what is wrong with it
    return n


def stand_in_names() -> list[str]:
    """The names the bundled stand-in defines (read from its source, without importing it)."""
    import ast

    tree = ast.parse((STAND_IN_ROOT / "sgl_kernel" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_NAMES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("the bundled sgl_kernel stand-in defines no _NAMES")


def _numa_nodes(cores: set[int]) -> int:
    """NUMA nodes that hold at least one of `cores` (1 when sysfs says nothing)."""
    nodes = 0
    for cpulist in Path("/sys/devices/system/node").glob("node[0-9]*/cpulist"):
        ids: set[int] = set()
        for part in cpulist.read_text().strip().split(","):
            if part:
                lo, _, hi = part.partition("-")
                ids.update(range(int(lo), int(hi or lo) + 1))
        nodes += bool(ids & cores)
    return max(nodes, 1)


def _core_lists(cores: list[int], n: int) -> list[list[int]]:
    """`n` disjoint core lists of equal size, or one core each, round robin, when there are fewer cores."""
    if len(cores) < n:
        return [[cores[i % len(cores)]] for i in range(n)]
    per = len(cores) // n
    return [cores[i * per:(i + 1) * per] for i in range(n)]


def cpu_environment(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """(the variables to set, the log line) for `sglang.launch_server argv`; ({}, None) unless `--device cpu`."""
    if _last_value(argv, ("--device",)) != "cpu":
        return {}, None
    env: dict[str, str] = {}
    stand_in = importlib.util.find_spec("sgl_kernel") is None
    if "SGLANG_USE_CPU_ENGINE" not in environ:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if stand_in:
        old = environ.get("PYTHONPATH")
        parts = old.split(os.pathsep) if old else []
        if str(STAND_IN_ROOT) not in parts:
            env["PYTHONPATH"] = os.pathsep.join([str(STAND_IN_ROOT), *parts])
    n = ranks(argv)
    if n > 1:
        cores = sorted(os.sched_getaffinity(0))
        lists = _core_lists(cores, n)
        if "SGLANG_NCCL_SO_PATH" not in environ:
            env["SGLANG_NCCL_SO_PATH"] = "none"
        if "SGLANG_CPU_OMP_THREADS_BIND" not in environ and _numa_nodes(set(cores)) < n:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, c)) for c in lists)
        if stand_in and "OMP_NUM_THREADS" not in environ:
            env["OMP_NUM_THREADS"] = str(len(lists[0]))
    shown = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    head = ("CPU serving without sgl_kernel: using the bundled stand-in for "
            f"{len(stand_in_names())} import-only names" if stand_in else "CPU serving with the installed sgl_kernel")
    if not stand_in and not shown:
        return env, None
    line = f"oscar-sgl: {head}"
    if shown:
        line += "; set " + " ".join(f"{k}={v}" for k, v in shown.items())
        if n > 1:
            line += f" ({n} ranks)"
    if stand_in and platform.machine().lower() in ("aarch64", "arm64"):
        line += ("; on arm64 SGLang 0.5.23 calls torch.ops.sgl_kernel.init_cpu_threads_env at startup, "
                 "which needs the real sgl_kernel")
    return env, line


def command(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-c", _BOOTSTRAP, *argv]


def main(argv: Sequence[str]) -> int:
    """Replace this process by the server (same PID, so signals and the exit code are the server's)."""
    updates, line = cpu_environment(argv, os.environ)
    if line:
        print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    cmd = command(argv)
    os.execve(cmd[0], cmd, {**os.environ, **updates})
    return 127  # not reached


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_server_port(low: int = 10000, high: int = 21999, span: int = 16, attempts: int = 200) -> int:
    """A port for a server started later, whose `port .. port + span - 1` are all free now, below
    both the kernel's ephemeral range and the 22000-29999 SGLang draws its NCCL port from.

    A port from `bind(("", 0))` lies in the ephemeral range, which the kernel also hands to every
    outgoing connection: a TP server's gloo and TCPStore connections can take it in the minute
    before uvicorn binds it, and the server then exits with uvicorn's startup failure (3) after
    sending its own post-warmup request to whoever holds the port. SGLang keeps its NCCL port out
    of that range for the same reason (`get_free_port_below_ephemeral`).
    """
    high = min(high, _ephemeral_low() - 1) - span
    rng = random.SystemRandom()
    for _ in range(attempts):
        port = rng.randint(low, high)
        try:
            for p in range(port, port + span):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("0.0.0.0", p))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {span} consecutive free ports between {low} and {high + span}")


class ServerEndpoint:
    """HTTP access to, and the stopping of, a server started in its own session (what the tests and
    `benches/serving` share): a subclass provides `proc`, `port` and `log_path`."""

    proc: Any  # subprocess.Popen
    port: int
    log_path: Path

    def stop_process(self, timeout: float = 30) -> None:
        """SIGTERM to the server (the session leader: SGLang's launcher stops its scheduler and
        detokenizer), SIGKILL to the whole process group after `timeout` or once the leader has gone
        (stragglers such as multiprocessing's resource tracker). (SIGTERM to the whole group at once
        makes SGLang's launcher see a crashed scheduler and wait 5 s for crash diagnostics.)"""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, timeout: float = 60) -> Any:
        """GET `path`: the JSON body, or the text when it is not JSON."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            body = r.read().decode()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def post(self, path: str, payload: dict[str, Any], timeout: float = 300) -> Any:
        """POST `payload` as JSON to `path`: the JSON body, or the text when it is not JSON (e.g.
        `/flush_cache`)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read().decode()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body
