"""One decode launch per stage-1 configuration at one shape, for Nsight Compute.

    ncu --clock-control none --kernel-name regex:_decode_stage1 --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight ... python3 benches/kernels/profile_decode.py --shape 8x32768 --config 32:1:3:16:0:1

Each configuration (``default``: the launcher's own tuning for the shape, Triton or the Gluon default
as the backend runs it (``regenerate.sh`` profiles this one); ``bn:nw:ns:waves[:maxnreg[:transposed]]`` as in
``bench_decode.py --variants``; block_n 0 = the Triton stage 1's default tuning; ``gluon`` or ``gluon:VARIANT``: the opt-in Gluon stage 1 at the
default split count, ``VARIANT`` a key of ``gluon_decode.GLUON_VARIANTS``, default ``regs1``) is launched twice (compile + warm-up, then the profiled launch; ``--mode fused``: the whole step with the write),
on the same random pool as the benchmark. ``run_gpu_profile.sh`` runs it under ncu for several
configurations and keeps each report as text.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import DEV, HQ, D, H, P, OscarSetup, parse_variant  # noqa: E402

from oscar_sgl.config import INT2_FORMAT  # noqa: E402
from oscar_sgl.kernels import decode as _dec  # noqa: E402
from oscar_sgl.kernels import decode_workspace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8x32768")
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--config", default="0:0:3:0")
    ap.add_argument("--mode", choices=("nowrite", "fused"), default="nowrite",
                    help="the launch without the new token's write (stage 1 on rotated queries, default) or the whole "
                         "decode step as the backend runs it (the write, query rotation and merge fused)")
    ap.add_argument("--waves", type=float, default=None,
                    help="with a gluon config: the split count of pick_num_splits(waves=W) instead of the launcher's "
                         "(as bench_decode.py's <variant>@w<W> columns)")
    ap.add_argument("--format", choices=("group", "page"), default="group",
                    help="the pool's key-range format: 'group' (the paper's, G_K = G_V = 32; default) or 'page' (the INT2 "
                         "server default, config.INT2_FORMAT: page-grid key ranges, G_K 16, G_V 64)")
    args = ap.parse_args()
    batch, ctx = (int(x) for x in args.shape.split("x"))
    page = args.format == "page"
    fmt = dict(k_group=INT2_FORMAT["k_group"], v_group=INT2_FORMAT["v_group"], key_page=True) if page else \
        dict(k_group=32, v_group=32, key_page=False)
    tune = _dec._default_tuning(batch, H, D, P)
    bn = 0
    if args.config == "default":  # what the backend's launch picks for this batch (Triton or the Gluon default)
        tune = _dec._launch_tuning(batch, H, D, P, group=HQ // H, bits=args.bits, **fmt, device=torch.device(DEV))
        if args.waves is not None:
            tune = dataclasses.replace(tune, waves=args.waves, fit=False)
    elif args.config.startswith("gluon"):
        variant = args.config.partition(":")[2] or "regs1"
        # the launcher's split rule for the Gluon default (waves of its resident programs from 512 pairs)
        lt = _dec._launch_tuning(batch, H, D, P, group=HQ // H, bits=args.bits, **fmt, device=torch.device(DEV))
        tune = dataclasses.replace(tune, gluon=True, gluon_variant=variant, waves=lt.waves, resident=lt.resident,
                                   block_n=_dec.gluon_block_n(tune.block_n, fmt["k_group"], fmt["key_page"]))
        if args.waves is not None:
            tune = dataclasses.replace(tune, waves=args.waves, fit=False)
    else:
        bn, nw, ns, waves, mr, tr = parse_variant(args.config)
    if bn != 0:
        tune = dataclasses.replace(tune, block_n=bn, num_warps=nw, num_stages=ns, waves=float(waves), maxnreg=mr or None,
                                   transposed=bool(tr))
    splits = _dec.tuning_num_splits(tune, batch, H)
    st = OscarSetup(args.bits, batch, ctx, 1, **fmt)
    ws = decode_workspace(batch, HQ, H, D, splits, DEV)
    run = st.call(0, tuning=tune, ws=ws, mode=args.mode)
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    print(f"profiled ({args.mode}): INT{args.bits} format={args.format} B={batch} ctx={ctx} bn={tune.block_n} nw={tune.num_warps} ns={tune.num_stages} "
          f"splits={splits} maxnreg={tune.maxnreg} transposed={tune.transposed} gluon={tune.gluon} "
          f"variant={tune.gluon_variant if tune.gluon else 'triton'} sm_scale={1 / math.sqrt(D):.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
