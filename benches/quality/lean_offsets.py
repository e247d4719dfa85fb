"""What the Gluon kernel's lean INT2 dequantization (``GluonVariant.lean_dequant``) costs in quality,
measured on the CPU with the torch reference: ``eval ppl`` three times on the same windows, the
reference's dequantization replaced by the kernels' fp16 arithmetic.

- ``fp32``: the reference as it is (``code * scale + offset`` in fp32);
- ``fp16``: what the default kernels compute, ``fp16(code * scale + offset)`` (one rounding: the
  HSUB2 gives the exact code, the HFMA2 rounds once);
- ``lean``: what ``_dequant_pairs_lean`` computes, ``fp16((M + code) * scale + fp16(offset - M *
  scale))`` with ``M`` = 16 for the even channels of a code word's halves and 4 for the odd ones
  (code ``i`` of a half at mantissa bit 6 or 8): the folded offset rounded to fp16 once.

Keys and values alike (the kernel dequantizes both that way), INT2, in the paper's format (group key
ranges) or, with ``--format page``, the INT2 server default's (``config.INT2_FORMAT``: page-grid key
ranges, G_K 16, G_V 64, offset min, clip values; the Gluon default's format there since session 29).
The channel order of the rotated head dim is the layout's: channel ``c`` is code ``c % 8`` of its
half, so ``M`` follows ``c % 2``.

    OMP_NUM_THREADS=2 python benches/quality/lean_offsets.py --text ../shared/eval-data/austen_emma.txt \\
        --windows 4 --json benches/results/quality_lean_offsets.json [--format page]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from oscar_sgl import cli
from oscar_sgl import reference as R
from oscar_sgl.config import INT2_FORMAT

_ORIG = {"unpack_k": R.unpack_k, "unpack_v": R.unpack_v}


def _magic(d: int) -> torch.Tensor:
    """M per channel of the rotated head dim: 16 where the code sits at mantissa bit 6, 4 at bit 8."""
    return torch.where(torch.arange(d) % 2 == 0, 16.0, 4.0)


def _dequant(q: torch.Tensor, sc: torch.Tensor, off: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """fp16 dequantization as the kernels round it (``m`` None: the default form; else the lean one
    with ``m`` broadcast over the channels). The products are exact in fp32 (11 x 5 bits)."""
    if m is None:
        return (q * sc + off).half().float()
    o2 = (off - m * sc).half().float()
    return ((m + q) * sc + o2).half().float()


def _patched(mode: str):
    def unpack_k(block, cfg, head_dim):
        h, n, _ = block.codes.shape
        q = R.unpack_codes(block.codes, cfg.bits).to(torch.float32).reshape(h, n // cfg.k_group, cfg.k_group, head_dim)
        sc, off = R.key_group_params(block, cfg)
        m = _magic(head_dim) if mode == "lean" else None
        return _dequant(q, sc, off, m).reshape(h, n, head_dim)

    def unpack_v(block, cfg, head_dim):
        h, n, _ = block.codes.shape
        g = head_dim // cfg.v_group
        q = R.unpack_codes(block.codes, cfg.bits).to(torch.float32).reshape(h, n, g, cfg.v_group)
        sc = block.params[:, :, 0, :, None].to(torch.float32)
        off = block.params[:, :, 1, :, None].to(torch.float32)
        m = _magic(head_dim).reshape(g, cfg.v_group) if mode == "lean" else None
        return _dequant(q, sc, off, m).reshape(h, n, head_dim)

    return unpack_k, unpack_v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--score-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True)
    ap.add_argument("--format", choices=("paper", "page"), default="paper",
                    help="paper: group key ranges, G_K = G_V = 32, offset integer, clip none (the paper's); page: "
                         "config.INT2_FORMAT (page-grid key ranges, G_K 16, G_V 64, offset min, clip values)")
    args = ap.parse_args()
    if args.format == "page":
        f = INT2_FORMAT
        fmt_args = ["--key-ranges", str(f["key_ranges"]), "--k-group", str(f["k_group"]), "--v-group",
                    str(f["v_group"]), "--offset", str(f["offset"]), "--clip", str(f["clip"])]
    else:
        fmt_args = ["--key-ranges", "group", "--k-group", "32", "--v-group", "32", "--offset", "integer", "--clip",
                    "none"]
    out = {"text": args.text, "format": args.format, "format_args": fmt_args, "windows": args.windows,
           "prefix_tokens": args.prefix_tokens,
           "score_tokens": args.score_tokens, "modes": {}}
    for mode in ("fp32", "fp16", "lean"):
        if mode == "fp32":
            R.unpack_k, R.unpack_v = _ORIG["unpack_k"], _ORIG["unpack_v"]
        else:
            R.unpack_k, R.unpack_v = _patched(mode)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ppl.json"
            rc = cli.main(["eval", "ppl", "--text", args.text, "--windows", str(args.windows), "--prefix-tokens",
                           str(args.prefix_tokens), "--score-tokens", str(args.score_tokens), "--bits", "2",
                           "--methods", "oscar", *fmt_args, "--threads", str(args.threads), "--no-progress",
                           "--json", str(path)])
            if rc:
                return rc
            out["modes"][mode] = json.loads(path.read_text())
        print(f"{mode}: done", file=sys.stderr)
    R.unpack_k, R.unpack_v = _ORIG["unpack_k"], _ORIG["unpack_v"]
    rows = []
    for mode, rep in out["modes"].items():
        res = rep["results"][0]
        rows.append({"mode": mode, "ppl": [w["ppl"] for w in res["per_window"]],
                     "kl": [w["kl"] for w in res["per_window"]],
                     "base": [w["ppl"] for w in rep["baseline"]["per_window"]],
                     "effective_bits": res["effective_bits"]})
    out["summary"] = rows
    Path(args.json).write_text(json.dumps(out, indent=1))
    fp16 = rows[1]["ppl"]
    for r in rows:
        rel = [100 * (a / b - 1) for a, b in zip(r["ppl"], fp16)]
        print(f"{r['mode']:5s} effective bits {r['effective_bits']:.3f}  PPL per window "
              + " ".join(f"{p:.4f}" for p in r["ppl"]) + "  vs fp16 (%): " + " ".join(f"{x:+.4f}" for x in rel)
              + "  KL " + " ".join(f"{k:.5f}" for k in r["kl"]))
    print("full precision PPL per window: " + " ".join(f"{p:.4f}" for p in rows[0]["base"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
