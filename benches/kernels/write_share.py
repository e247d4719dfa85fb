"""The new token's write inside the default decode step, per Gluon default variant, side by side.

For each format, shape and variant (set as the launcher's Gluon default: ``decode.GLUON_DEFAULT_VARIANT``,
or ``GLUON_DEFAULT_PAGE_VARIANT`` for page-grid key ranges; where ``decode.gluon_share_rule`` takes the
open-share variant, the launcher runs that one instead, and each line names what ran and at how many
splits), six launches over the same pool and split count, CUDA graphs over distinct copies:

- ``step``: the default decode launch as the backend runs it (the write, the query rotation and the
  merge fused);
- ``split``: the same with the write as a launch of its own before the stage 1
  (``_DecodeTuning.split_write``): the stage 1 compiled without the write's code, as ``nowrite``;
- ``splitrot``: the same with the query rotation in the write's launch too (``split_rotation``);
- ``splitpdl``: ``split`` with the stage 1 a programmatic dependent launch (``split_pdl``: it starts
  while the write runs; its open-page programs wait for the write's stores);
- ``nowrite``: the same launch without the write (step - nowrite: the kernels.md "write" column);
- ``skipwrite``: the write compiled in but every new token sent to the padding page (the write's own
  work is step - skipwrite).

Each variant is timed ``--repeats`` times, interleaved, so run-to-run drift shows. Needs a CUDA GPU
and SGLang importable (as ``bench_decode.py``). From the repo root:

    python3 benches/kernels/write_share.py --variants dnp_r128fslwnkv --formats group,page --shapes 64x4096,32x8192

Prints one ``RESULT`` line per (format, shape, variant, repeat); ``--out FILE`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=None, help="comma-separated keys of GLUON_VARIANTS (default: the launcher's "
                    "default of each format); BASE+SHARE also sets the variant gluon_share_rule takes")
    ap.add_argument("--formats", default="group", help="comma-separated: group (the paper's, G_K = G_V = 32) and/or "
                    "page (the INT2 server default: page-grid key ranges, G_K 16, G_V 64)")
    ap.add_argument("--shapes", default="64x4096,32x8192,8x32768", help="BxCTX,... (requests x tokens)")
    ap.add_argument("--bits", default="2", help="comma-separated bit widths")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scale-cols", default="1", help="comma-separated token-scale columns of the pool: 1 (the layer norm "
                    "scope, the default: one program per request computes s_t over every head's key) or 8 (per KV head)")
    ap.add_argument("--budget", type=float, default=24e9, help="bytes of distinct KV copies per launch's graph")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    bench = runpy.run_path(str(Path(__file__).with_name("bench_decode.py")))  # its helpers, not its main
    import torch
    from oscar_sgl.kernels import decode, gluon_decode

    formats = {"group": dict(k_group=32, v_group=32, key_page=False), "page": dict(k_group=16, v_group=64, key_page=True)}
    for f in args.formats.split(","):
        if f not in formats:
            raise SystemExit(f"--formats: group and/or page, got {f!r}")
    variants = args.variants.split(",") if args.variants else [None]
    for v in variants:
        for name in (v or "").split("+"):
            if name:
                gluon_decode.gluon_variant(name)  # unknown names fail here, before any timing
    for cols in (int(c) for c in args.scale_cols.split(",")):
        if cols not in (1, bench["H"]):
            raise SystemExit(f"--scale-cols: 1 or {bench['H']}, got {cols}")
    saved = {k: getattr(decode, k) for k in ("GLUON_DEFAULT_VARIANT", "GLUON_DEFAULT_SHARE_VARIANT",
                                             "GLUON_DEFAULT_PAGE_VARIANT", "GLUON_DEFAULT_PAGE_SHARE_VARIANT")}
    rows = []
    for fmt_name, cols, bits in ((f, int(c), int(b)) for f in args.formats.split(",")
                                 for c in args.scale_cols.split(",") for b in args.bits.split(",")):
        fmt = formats[fmt_name]
        bench["OscarSetup"].__init__.__globals__["SCALE_COLS"] = cols
        for shape in args.shapes.split(","):
            b, ctx = (int(x) for x in shape.split("x"))
            st = ws = None
            for _ in range(args.repeats):
                for v in variants:
                    for k, val in saved.items():
                        setattr(decode, k, val)
                    if v is not None:
                        base, _, share = v.partition("+")
                        prefix = "GLUON_DEFAULT_PAGE_" if fmt["key_page"] else "GLUON_DEFAULT_"
                        setattr(decode, prefix + "VARIANT", base)
                        if share:
                            setattr(decode, prefix + "SHARE_VARIANT", share)
                    launcher = bench["launcher_tuning"](bits, b, **fmt)
                    # the fused step is the reference form; the launcher's own (split or not) is named below
                    tune = dataclasses.replace(launcher, split_write=False, split_rotation=False, split_pdl=False)
                    if st is None:
                        st, ws, _, copies = bench["_default_launch_setup"](bits, b, ctx, args.budget, tune, **fmt)
                    splits = decode.tuning_num_splits(tune, b, bench["H"])
                    if ws[0].shape[2] != splits + 1:
                        ws = decode.decode_workspace(b, bench["HQ"], bench["H"], bench["D"], splits, bench["DEV"])
                    ran = (tune.gluon_variant if tune.gluon else "triton") + (" + split_pdl" if launcher.split_pdl else "")
                    t = {}
                    for mode in ("fused", "splitwrite", "splitrot", "splitpdl", "nowrite", "skipwrite"):
                        if mode.startswith("split") and not (tune.gluon and gluon_decode.gluon_variant(tune.gluon_variant).fused):
                            t[mode] = float("nan")  # the split launch is a fused Gluon variant's option
                            continue
                        try:
                            st.call(0, tuning=tune, ws=ws, mode=mode)()
                            torch.cuda.synchronize()
                            if mode == "fused":
                                ref = st.out.clone()
                            elif mode.startswith("split"):
                                agree = bench["rel_rms"](st.out, ref)
                                if agree > 1e-5:
                                    raise SystemExit(f"{mode} disagrees with the fused step: {agree:.2e} relative RMS")
                            t[mode] = bench["time_calls"]([st.call(c, tuning=tune, ws=ws, mode=mode) for c in range(copies)])["us"]
                        except Exception as e:  # noqa: BLE001 - a form that fails (e.g. in graph capture) is reported
                            if mode == "fused":
                                raise
                            print(f"FAILED {mode} ({fmt_name} INT{bits} ({b},{ctx})): {type(e).__name__}: {str(e)[:300]}", flush=True)
                            t[mode] = float("nan")
                    us, split, splitrot, splitpdl = t["fused"], t["splitwrite"], t["splitrot"], t["splitpdl"]
                    nowrite, skip = t["nowrite"], t["skipwrite"]
                    rows.append({"format": fmt_name, "scale_cols": cols, "bits": bits, "batch": b, "ctx": ctx,
                                 "variant": v or "default", "ran": ran, "num_splits": splits, "step_us": us,
                                 "split_write_us": split, "split_rotation_us": splitrot, "split_pdl_us": splitpdl, "nowrite_us": nowrite, "write_us": us - nowrite,
                                 "skipwrite_us": skip})
                    print(f"RESULT {fmt_name} INT{bits} S={cols} ({b},{ctx}) {v or 'default'} (ran {ran}, {splits} splits): "
                          f"step {us:.1f} us, split write {split:.1f} us ({split / us:.3f}x the step), + rotation {splitrot:.1f} us "
                          f"({splitrot / us:.3f}x), pdl {splitpdl:.1f} us ({splitpdl / us:.3f}x), without write "
                          f"{nowrite:.1f} us, write {us - nowrite:.2f} us ({(us - nowrite) / us * 100:.1f} %), write compiled "
                          f"in but storing nothing {skip:.1f} us", flush=True)
            del st, ws
            torch.cuda.empty_cache()
    for k, val in saved.items():
        setattr(decode, k, val)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
