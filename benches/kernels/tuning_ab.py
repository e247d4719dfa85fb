"""Two decode tunings side by side: the launcher's own, with fields set as ``--a`` and as ``--b`` says.

For each format, bit width and shape, the default decode step (the write, the query rotation and the
merge as the backend runs them, ``bench_decode``'s ``fused`` call) over the same pool (an arm whose
split count differs, e.g. ``long_gluon``'s, gets a workspace of its own: ``decode.tuning_num_splits``),
CUDA graphs over distinct KV copies, once with the launcher's tuning (``decode._launch_tuning``)
changed by ``--a`` and once by ``--b``, ``--repeats`` times interleaved (run-to-run drift shows). The
two outputs must agree (relative RMS <= ``--agree``) or the script stops. Needs a CUDA GPU and SGLang
importable (as ``bench_decode.py``). From the repo root, e.g. the merge launch as a programmatic
dependent of the stage 1 against the plain launch:

    python3 benches/kernels/tuning_ab.py --a merge_pdl=False --b merge_pdl=True --shapes 1x32768,8x32768

Prints one ``RESULT`` line per (format, bits, shape, repeat); ``--out DIR`` also writes ``ab.json`` and
``ab.md`` (the median of the repeats per arm, b / a).

``--a-gluon FILE``: arm a also runs the Gluon stage 1 of another source, ``FILE`` an earlier
``gluon_decode.py`` (``git show REV:triton_kernels/gluon_decode.py > FILE``) put in place of the
installed one while arm a's calls are built, run and captured: one kernel's code against another's
(then ``--a`` may be empty and ``--b`` ``''``, the launcher's tuning on both arms).
``gluon_variant=+h`` / ``-h`` in ``--a`` / ``--b``: the launcher's variant for the shape with the
suffix added / removed (the ``lane_fwht`` form against the plain one at every shape of a run).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib.util
import json
import runpy
import statistics
import sys
from pathlib import Path


def parse_fields(text: str, fields: dict) -> dict:
    """``"name=value,name=value"`` -> {name: value} over ``_DecodeTuning``'s fields (values as Python
    literals: True, 3, 'dnp_r128fslwnkv', None)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"{item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value  # a bare word: a string (a variant name)
    return out


def variant_suffix(fields: dict, launcher) -> dict:
    """``gluon_variant=+S`` / ``-S``: the launcher's own variant with the suffix ``S`` added / taken
    off (e.g. ``+h``, the ``lane_fwht`` form, whatever variant the shape's rule picks)."""
    v = fields.get("gluon_variant")
    if not isinstance(v, str) or v[:1] not in "+-" or not v:
        return fields
    name, suffix = launcher.gluon_variant, v[1:]
    if v[0] == "+":
        name = name if name.endswith(suffix) else name + suffix
    else:
        name = name.removesuffix(suffix)
    return {**fields, "gluon_variant": name}


def load_gluon_source(path: Path):
    """``path`` (a ``gluon_decode.py``) as a module of its own, beside the installed one."""
    spec = importlib.util.spec_from_file_location("oscar_sgl.kernels._gluon_decode_arm_a", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def gluon_source(decode, mod):
    """``decode``'s Gluon stage 1 taken from ``mod`` (None: unchanged) inside the block."""
    if mod is None:
        yield
        return
    saved = decode.gluon_decode
    decode.gluon_decode = mod
    try:
        yield
    finally:
        decode.gluon_decode = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default="", help="FIELD=VALUE,... of decode._DecodeTuning set on the launcher's tuning (arm a)")
    ap.add_argument("--b", required=True, help="the same for arm b ('' : the launcher's tuning)")
    ap.add_argument("--formats", default="group", help="comma-separated: group (the paper's, G_K = G_V = 32), "
                    "page (the INT2 server default: page-grid key ranges, G_K 16, G_V 64), page32 (page-grid key "
                    "ranges, G_K 32, G_V 64)")
    ap.add_argument("--shapes", default="1x32768,8x32768", help="BxCTX,... (requests x tokens)")
    ap.add_argument("--bits", default="2,4", help="comma-separated bit widths")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=8e9, help="bytes of distinct KV copies per launch's graph")
    ap.add_argument("--agree", type=float, default=1e-5, help="largest relative RMS between the arms' outputs")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--a-gluon", type=Path, default=None, metavar="FILE",
                    help="arm a's Gluon stage 1 from this gluon_decode.py instead of the installed one")
    args = ap.parse_args()
    bench = runpy.run_path(str(Path(__file__).with_name("bench_decode.py")))  # its helpers, not its main
    import torch
    from oscar_sgl.kernels import decode

    fields = {f.name: f for f in dataclasses.fields(decode._DecodeTuning)}
    arm = {"a": parse_fields(args.a, fields), "b": parse_fields(args.b, fields)}
    source = {"a": load_gluon_source(args.a_gluon) if args.a_gluon else None, "b": None}
    formats = {"group": dict(k_group=32, v_group=32, key_page=False), "page": dict(k_group=16, v_group=64, key_page=True),
               "page32": dict(k_group=32, v_group=64, key_page=True)}
    for f in args.formats.split(","):
        if f not in formats:
            raise SystemExit(f"--formats: any of {', '.join(formats)}, got {f!r}")
    rows = []
    for fmt_name in args.formats.split(","):
        fmt = formats[fmt_name]
        for bits in (int(b) for b in args.bits.split(",")):
            for shape in args.shapes.split(","):
                b, ctx = (int(x) for x in shape.split("x"))
                launcher = bench["launcher_tuning"](bits, b, **fmt)
                tunes = {k: dataclasses.replace(launcher, **variant_suffix(v, launcher)) for k, v in arm.items()}
                st, ws, _, copies = bench["_default_launch_setup"](bits, b, ctx, args.budget, launcher, **fmt)
                wss, splits = {}, {}
                for k, t in tunes.items():  # an arm of another split count gets a workspace of its own
                    splits[k] = decode.tuning_num_splits(t, b, bench["H"])
                    wss[k] = ws if splits[k] + 1 == ws[0].shape[2] else decode.decode_workspace(
                        b, bench["HQ"], bench["H"], bench["D"], splits[k], bench["DEV"])
                outs = {}
                for k, t in tunes.items():
                    with gluon_source(decode, source[k]):
                        st.call(0, tuning=t, ws=wss[k])()
                    torch.cuda.synchronize()
                    outs[k] = st.out.clone()
                agree = bench["rel_rms"](outs["b"], outs["a"])
                if agree > args.agree:
                    raise SystemExit(f"{fmt_name} INT{bits} ({b},{ctx}): the arms disagree, relative RMS {agree:.2e}")
                times = {"a": [], "b": []}
                for rep in range(args.repeats):
                    for k, t in tunes.items():
                        with gluon_source(decode, source[k]):
                            times[k].append(bench["time_calls"]([st.call(c, tuning=t, ws=wss[k]) for c in range(copies)])["us"])
                    print(f"RESULT {fmt_name} INT{bits} ({b},{ctx}) repeat {rep}: a {times['a'][-1]:.1f} us, "
                          f"b {times['b'][-1]:.1f} us ({times['b'][-1] / times['a'][-1]:.3f}x a)", flush=True)
                ran = launcher.gluon_variant if launcher.gluon else "triton"
                ma, mb = statistics.median(times["a"]), statistics.median(times["b"])
                rows.append({"format": fmt_name, "bits": bits, "batch": b, "ctx": ctx, "ran": ran,
                             "num_splits": splits["a"] if splits["a"] == splits["b"] else f"{splits['a']} / {splits['b']}",
                             "a_us": times["a"], "b_us": times["b"],
                             "a_median_us": ma, "b_median_us": mb, "b_over_a": mb / ma, "agree_rel_rms": agree})
                del st, ws, wss
                torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab.json").write_text(json.dumps({"a": args.a, "b": args.b, "gpu": torch.cuda.get_device_name(),
                                                      "a_gluon": str(args.a_gluon) if args.a_gluon else None,
                                                      "rows": rows}, indent=1))
        a_name = (args.a or "the launcher") + (f", Gluon stage 1 of {args.a_gluon.name}" if args.a_gluon else "")
        lines = [f"Decode step, arm a (`{a_name}`) against arm b (`{args.b or 'the launcher'}`), "
                 f"{torch.cuda.get_device_name()}, medians of {args.repeats} interleaved repeats (us)", "",
                 "| format | bits | B | ctx | stage 1 | splits | a us | b us | b / a | outputs' relative RMS |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['format']} | {r['bits']} | {r['batch']} | {r['ctx']} | {r['ran']} | {r['num_splits']} | "
                         f"{r['a_median_us']:.1f} | {r['b_median_us']:.1f} | {r['b_over_a']:.3f} | {r['agree_rel_rms']:.1e} |")
        (args.out / "ab.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
