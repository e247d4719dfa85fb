"""Launch and stop real `python -m sglang.launch_server` processes on the GPU machine (benches/serving).

What the lent H200 needs besides SGLang and our wheel (../../../shared/spec/SGLANG-GPU.md):
- `stand_in/` on the server's PYTHONPATH, only when no real `sgl_kernel` is importable: the
  `sgl_kernel` stand-in (real ops for the names dense models call, a raising stub for every other
  name), its `sglang-kernel` dist-info (SGLang checks the version at startup) and `sitecustomize.py`
  (the Hopper answer for the Blackwell-only CuTe DSL dual-GEMM module when `cutlass` is missing).
- `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python` whenever the stand-in is used: SGLang's bundled
  Rust radix core misreads tensors under the H200's torch 2.11 (`insert value must be an int64
  tensor, got Uint8`); its Python core serves, prefix hits included. Users on torch 2.14 keep Rust.
The BF16 and the OScaR servers get exactly the same environment and common flags.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oscar_sgl.serve import ServerEndpoint, free_server_port

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "stand_in"

#: The Llama-3.1-8B architecture (public config values), served with `--load-format dummy` weights.
LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "torch_dtype": "bfloat16", "initializer_range": 0.02,
}


def write_model_config(dest: Path, config: dict[str, Any] | None = None) -> Path:
    """A model folder SGLang can serve with `--load-format dummy --skip-tokenizer-init`: config.json only."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config or LLAMA_31_8B, indent=1) + "\n")
    return dest


def real_sgl_kernel_importable(env: dict[str, str] | None = None) -> bool:
    """Whether a real `sgl_kernel` loads in a fresh interpreter with `env` (the .so may exist and
    still fail to load, as sglang-kernel 0.4.10 does under torch 2.11)."""
    if importlib.util.find_spec("sgl_kernel") is None:
        return False
    r = subprocess.run([sys.executable, "-c", "import sgl_kernel"], env=env, capture_output=True, timeout=120)
    return r.returncode == 0


def harness_env(base: dict[str, str] | None = None) -> tuple[dict[str, str], bool]:
    """(environment for the servers, whether the stand-in is in it)."""
    env = dict(os.environ if base is None else base)
    use = not real_sgl_kernel_importable(env)
    if use:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(STAND_IN)] + ([old] if old else []))
        env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env, use


def server_args(model_dir: str, *, kv_cache: str, bits: int = 16, cuda_graph: bool = True,
                mem_fraction: float = 0.5, dummy: bool = True, extra: tuple[str, ...] = ()) -> list[str]:
    """The flags of one run. Common to both formats: the same memory fraction, sampling and grammar
    backends, no prefill CUDA graphs (`--kv-cache oscar` turns them off; the BF16 baseline follows so
    both capture the same decode graphs), cache reports and metrics. With dummy weights OScaR runs
    `--oscar-key-rotation all` (the per-head rule reads trained weights; on random ones it would pick
    an arbitrary plan)."""
    a = ["--model-path", model_dir, "--mem-fraction-static", str(mem_fraction), "--sampling-backend", "pytorch",
         "--grammar-backend", "none", "--disable-prefill-cuda-graph", "--enable-cache-report",
         "--decode-log-interval", "10"]
    if dummy:
        a += ["--load-format", "dummy", "--skip-tokenizer-init"]
    if kv_cache == "default":
        a += ["--attention-backend", "triton"]
        if not cuda_graph:
            a += ["--disable-decode-cuda-graph"]
    elif kv_cache == "oscar":
        a += ["--kv-cache", "oscar", "--oscar-bits", str(bits)]
        if dummy:  # the key-rotation rule on random weights describes no model: every head rotated
            a += ["--oscar-key-rotation", "all"]
        if cuda_graph:
            a += ["--oscar-cuda-graph"]
    else:
        raise ValueError(f"kv_cache must be 'default' or 'oscar', got {kv_cache!r}")
    return a + list(extra)


def free_port() -> int:
    """A free port below the ephemeral range (`oscar_sgl.serve.free_server_port`)."""
    return free_server_port()


@dataclass
class Server(ServerEndpoint):
    proc: subprocess.Popen
    port: int
    log_path: Path
    cmd: list[str]
    started_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def post(self, path: str, payload: dict[str, Any], timeout: float = 600) -> Any:
        return super().post(path, payload, timeout)

    def stop(self, timeout: float = 60) -> None:
        self.stop_process(timeout)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(args: list[str], *, log_path: Path, env: dict[str, str], startup_timeout: float = 400,
           python: str = sys.executable) -> Server:
    """Start `python -m sglang.launch_server ARGS --port P` and wait (bounded) for /health."""
    port = free_port()
    cmd = [python, "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port), *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=log_path.parent)
    server = Server(proc, port, log_path, cmd)
    while time.monotonic() - t0 < startup_timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()[-6000:]}")
        try:
            urllib.request.urlopen(server.url + "/health", timeout=5)
            server.started_s = time.monotonic() - t0
            return server
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"server not healthy after {startup_timeout}s:\n{server.log()[-6000:]}")
