"""The new token's write inside the default decode step, per Gluon default variant, side by side.

For each shape and variant (set as ``decode.GLUON_DEFAULT_VARIANT`` for the launcher; where
``decode.gluon_share_rule`` takes the open-share variant, the launcher runs that one instead, and each
line names what ran and at how many splits), the default
decode launch as the backend runs it (``bench_decode.bench_oscar``: the write, the query rotation
and the merge fused) against the same launch without the write; the difference is the write's
marginal cost. Each variant is timed ``--repeats`` times, interleaved, so run-to-run drift shows.
Needs a CUDA GPU and SGLang importable (as ``bench_decode.py``). From the repo root:

    python3 benches/kernels/write_share.py --variants dnp_r128fs,dnp_r128fslwk --shapes 64x4096,32x8192,8x32768

Prints one ``RESULT`` line per (shape, variant, repeat); ``--out FILE`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import runpy
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="dnp_r128fs,dnp_r128fslwk", help="comma-separated keys of GLUON_VARIANTS; "
                    "BASE+SHARE also sets the variant gluon_share_rule takes (decode.GLUON_DEFAULT_SHARE_VARIANT)")
    ap.add_argument("--shapes", default="64x4096,32x8192,8x32768", help="BxCTX,... (requests x tokens)")
    ap.add_argument("--bits", default="2", help="comma-separated bit widths")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scale-cols", default="1", help="comma-separated token-scale columns of the pool: 1 (the layer norm "
                    "scope, the default: one program per request computes s_t over every head's key) or 8 (per KV head)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    bench = runpy.run_path(str(Path(__file__).with_name("bench_decode.py")))  # its helpers, not its main
    from oscar_sgl.kernels import decode, gluon_decode

    variants = args.variants.split(",")
    for v in variants:
        for name in v.split("+"):
            gluon_decode.gluon_variant(name)  # unknown names fail here, before any timing
    share_default = decode.GLUON_DEFAULT_SHARE_VARIANT
    rows = []
    for cols in (int(c) for c in args.scale_cols.split(",")):
        if cols not in (1, bench["H"]):
            raise SystemExit(f"--scale-cols: 1 or {bench['H']}, got {cols}")
    for cols, bits in ((int(c), int(b)) for c in args.scale_cols.split(",") for b in args.bits.split(",")):
        bench["OscarSetup"].__init__.__globals__["SCALE_COLS"] = cols
        for shape in args.shapes.split(","):
            b, ctx = (int(x) for x in shape.split("x"))
            for _ in range(args.repeats):
                for v in variants:
                    base, _, share = v.partition("+")
                    decode.GLUON_DEFAULT_VARIANT = base
                    decode.GLUON_DEFAULT_SHARE_VARIANT = share or share_default
                    r = bench["bench_oscar"](bits, b, ctx, [bench["VARIANTS"][0]], 24e9, extras="write")
                    us, nowrite, skip = r["best"]["us"], r["nowrite_us"], r["skipwrite_us"]
                    ran, splits = r["best"]["gluon"] or "triton", r["best"]["num_splits"]
                    rows.append({"scale_cols": cols, "bits": bits, "batch": b, "ctx": ctx, "variant": v, "ran": ran,
                                 "num_splits": splits, "step_us": us, "nowrite_us": nowrite, "write_us": us - nowrite,
                                 "skipwrite_us": skip,
                                 "unfused_us": r["unfused_us"]})
                    print(f"RESULT INT{bits} S={cols} ({b},{ctx}) {v} (ran {ran}, {splits} splits): step {us:.1f} us, "
                          f"without write {nowrite:.1f} us, "
                          f"write {us - nowrite:.2f} us ({(us - nowrite) / us * 100:.1f} %), write compiled in but storing nothing "
                          f"{skip:.1f} us, unfused {r['unfused_us']:.1f}",
                          flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
