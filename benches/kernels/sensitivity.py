"""Sensitivity experiments on the Gluon decode step: how much time a change to the stored layout
would save, timed before the layout is built (issue 14; benches/results/kernels_gluon_design.md §17).

Each patch edits a copy of the installed ``oscar_sgl`` package so that the Gluon stage 1 does the
work it would do if the bytes were stored another way, on today's bytes: **its results are wrong**
(the step's output is not checked; only its time counts). The copy lives in a temporary directory
that goes first on ``PYTHONPATH`` for one ``bench_decode.py --gluon --gluon-step`` run per patch
set; nothing in the repository or the installed package changes. The bytes each tile reads are the
same as today's (the probes load the same code words and the same tile's params, differently).

Patches, with the instruction counts per 32-token tile of the sealed-tile loop (sm_90 SASS compiled on the CPU with
Triton 3.6, ``gluon_compile_check.py`` on a patched copy), ``dnp_r128fslwk`` (the default) INT2 / INT4:
``none`` 715 / 769.

- ``pairs``: the byte permutes that pair code and key-param words (``_pair_words``: the values' code
  words of tokens (2t, 2t + 1) into the halves an MMA operand register takes, the key params of
  channels (c, c + HALF)) are skipped, as if layout v2 stored them paired: 48 -> 8 PRMT, 692 / 736
  (``dnp_r128fslwnk``, the lean INT2 form: 680 -> 640).
- ``vparams``: the value (scale, offset) of a token pair loaded as one f16x2 word each instead of
  four 2-byte loads paired by integer operations (``_tile_small`` / ``_tile_raw``), as if stored
  paired per token pair: 41 -> 33 global loads, but 716 / 756 instructions (the pairing was cheap).
- ``vfold``: the values' scales folded into the probabilities, as a layout v2 whose value codes sit
  in MMA fragment order with group-pure row tiles would allow (``_VFOLD_PROBE``): the codes go into
  the MMA as the LOP3 makes them (no PRMT, HSUB2 or HFMA2 for the values); each half of V^T's rows
  (groups 0-1, 2-3) takes its own B operand, the probabilities times the group's token-pair scales
  (columns 0-3 / 4-7: the GQA group of 4 leaves 4 of the 8 columns free), 8 HMUL2 per tile; the
  offsets (an MMA of their token pairs) and the magic's column sums (an MMA of ones per B operand)
  go to small accumulators. 629 / 662 (``dnp_r128fslwnk`` 628 at INT2), 4 spilled words per tile
  at the 128-register cap. Only the register path without prefetch (``dnp_*``) takes the probe.
- ``pairs+vfold``: 613 / 644 (-14 % / -16 %; ``dnp_r128fslwnk`` 598 at INT2).

Page-grid key ranges (G_K 16, G_V 64: the INT2 server default's format; ``--bench-args "--gluon-format
page"``), its Gluon default ``dnp_r128fslw`` on 16-token tiles, INT2 / INT4: none 542 / 550, ``vfold``
484 / 490 (one B operand: two value groups per row), ``pairs+vfold`` 452 / 456 (-17 %); on 32-token
tiles (two key groups each) 925 -> 853 -> 782 at INT2.
- ``hadd2``: session 22's experiment: the exact codes' HSUB2 (``_PAIR_ASM``) left out.

Timed on an H100 in session 28 (benches/results/kernels_gluon_s28/sens*): ``vfold`` -8 % to +3 %,
``pairs+vfold`` -7 % to +5 % of the step time, ``pairs`` 0-3 %; layout v2 was not built.

On the device, after ``bash benches/serving/run_gpu.sh setup`` (PYTHONPATH=/tmp/site:$PWD/python):

    python3 benches/kernels/sensitivity.py --patches none,pairs,vfold,pairs+vfold \\
        --variants dnp_r128fslwk,dnp_r128fslwnk --shapes 8x32768,16x65536,32x8192,64x4096 --out $OUT/sens

writes ``gluon_<patches>.json`` / ``.md`` per patch set (bench_decode.py's) and ``sensitivity.md``:
each variant's step time per patch set and the share it saves against ``none``, side by side.
``--check`` only applies the patches and compiles nothing (CI: the patches still apply).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_PAIR_WORDS = '''        lo = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, b], dtype=gl.int32,
                                       is_pure=True, pack=1)
        hi = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=gl.int32,
                                       is_pure=True, pack=1)
        return lo, hi'''
_VPARAM_LOADS = '''        vs0 = gl.load(vp_base + off_p)
        vs1 = gl.load(vp_base + 2 * NG + off_p)
        vo0 = gl.load(vp_base + NG + off_p)
        vo1 = gl.load(vp_base + 3 * NG + off_p)'''
_VPARAM_PACK = '''            vs0 = _pack_f16(vs0, vs1)
            vo0 = _pack_f16(vo0, vo1)'''
_HSUB2_PAIR = 'sub.rn.f16x2 t, t, $3;'

#: ``vfold``: the values folded into the probabilities on a layout v2 (see ``_values_fold_probe``'s
#: docstring), timed on today's bytes. Inserted before ``_attend``; ``_attend`` takes the tile's value
#: params pointer (``vpw``) from the register path without prefetch (the ``dnp_*`` variants) and runs
#: the probe there, the unchanged value path elsewhere.
_VFOLD_PROBE = '''    @gluon.jit
    def _values_fold_probe(vw0, vw1, vpw, vo0, b_p, acc, D: gl.constexpr, BITS: gl.constexpr, BLOCK_N: gl.constexpr,
                           BLOCK_H: gl.constexpr, LV: gl.constexpr, MMA: gl.constexpr, NG: gl.constexpr):
        """SENSITIVITY (vfold): the values' work if a layout v2 stored their codes in MMA fragment order
        with group-pure row tiles (rows 0-63: groups 0-1, 64-127: groups 2-3) and their params paired
        by token pairs: codes straight from the LOP3 (magic + code: no PRMT, HSUB2 or HFMA2); the scales
        on the probabilities, one B operand per half of the rows whose columns 0-3 / 4-7 carry the two
        groups (the GQA group of 4 leaves 4 of the 8 columns free); the offsets (an MMA of the offsets'
        token pairs) and the magic's column sums (an MMA of ones per B operand) into small accumulators,
        here added to the running sum's partials to keep them. With two value groups per row (NG 2,
        G_V = 64 at D = 128) one B operand serves both row halves. On today's bytes: wrong results."""
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        HALF: gl.constexpr = 16 // BITS
        NP: gl.constexpr = BLOCK_N // 2
        L4: gl.constexpr = gl.SliceLayout(1, LV)  # [WPLV, HALF, 8, NP]
        v_i = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L4))))
        v_i4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(v_i, 0), 2), 3)  # [1, HALF, 1, 1]
        xa = gl.expand_dims(gl.convert_layout(vw0, gl.SliceLayout(1, L4), assert_trivial=True), 1)
        xb = gl.expand_dims(gl.convert_layout(vw1, gl.SliceLayout(1, L4), assert_trivial=True), 1)
        xa, ia = gl.broadcast(xa, v_i4)
        xb, ib = gl.broadcast(xb, v_i4)
        a_e, a_o = _code_pairs(xa, ia, BITS, False)
        b_e, b_o = _code_pairs(xb, ib, BITS, False)
        vt_a = gl.convert_layout(gl.reshape(gl.join(a_e, a_o), [D // 2, BLOCK_N]), A_OP, assert_trivial=True)
        vt_b = gl.convert_layout(gl.reshape(gl.join(b_e, b_o), [D // 2, BLOCK_N]), A_OP, assert_trivial=True)
        p16 = gl.convert_layout(b_p.to(gl.float16), B_OP)  # the MMA's B operand, as today
        p_e, p_o = gl.split(gl.permute(gl.reshape(p16, [NP, 2, BLOCK_H]), [0, 2, 1]))
        p_pk = _pack_f16(p_e, p_o)  # [NP, BLOCK_H]: f16x2 of tokens (2tp, 2tp + 1), the B registers
        LPK: gl.constexpr = p_pk.type.layout
        tp = gl.arange(0, NP, layout=gl.SliceLayout(1, LPK))
        col = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, LPK))
        s_off = tp[:, None] * (2 * NG) + col[None, :] // 4  # NG words per token of today's params
        s01 = gl.load(vpw + s_off)
        pa = gl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [p_pk, s01], dtype=gl.int32,
                                       is_pure=True, pack=1)
        pa_lo, pa_hi = _halves_f16(pa)
        b01 = gl.convert_layout(gl.reshape(gl.permute(gl.join(pa_lo, pa_hi), [0, 2, 1]), [BLOCK_N, BLOCK_H]), B_OP)
        if NG > 2:  # groups 2-3 on rows 64-127: a B operand of their own
            s23 = gl.load(vpw + 2 + s_off)
            pb = gl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [p_pk, s23], dtype=gl.int32,
                                           is_pure=True, pack=1)
            pb_lo, pb_hi = _halves_f16(pb)
            b23 = gl.convert_layout(gl.reshape(gl.permute(gl.join(pb_lo, pb_hi), [0, 2, 1]), [BLOCK_N, BLOCK_H]),
                                    B_OP)
        else:
            b23 = b01
        acc_a, acc_b = gl.split(gl.permute(gl.reshape(acc, [2, D // 2, BLOCK_H]), [1, 2, 0]))
        acc_a = mma_v2(vt_a, b01, gl.convert_layout(acc_a, MMA, assert_trivial=True))
        acc_b = mma_v2(vt_b, b23, gl.convert_layout(acc_b, MMA, assert_trivial=True))
        acc = gl.convert_layout(gl.reshape(gl.permute(gl.join(acc_a, acc_b), [2, 0, 1]), [D, BLOCK_H]), MMA,
                                assert_trivial=True)
        # the magic's column sums (A of ones) and the offsets (A: the offsets' token pairs, rows 0-7)
        ones = gl.full([16, BLOCK_N], 1.0, gl.float16, A_OP)
        extra = mma_v2(ones, b01, gl.zeros([16, BLOCK_H], gl.float32, MMA))
        if NG > 2:
            extra = mma_v2(ones, b23, extra)
        LZ: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, LV))  # [2, 8, NP]: rows 8-15 of A zero
        hh = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, LZ)))
        LZW: gl.constexpr = gl.SliceLayout(0, LZ)  # [8, NP]: lane (g, t) the offsets' pairs of its row g
        zg = gl.arange(0, 8, layout=gl.SliceLayout(1, LZW))
        ztp = gl.arange(0, NP, layout=gl.SliceLayout(0, LZW))
        zw = gl.load(vpw + NG // 2 + ztp[None, :] * (2 * NG) + zg[:, None] // (8 // NG))
        z3 = gl.expand_dims(zw, 0)
        hh3 = gl.expand_dims(gl.expand_dims(hh, 1), 2)
        z3, hh3 = gl.broadcast(z3, hh3)
        z3 = gl.where(hh3 == 0, z3, 0)
        z_lo, z_hi = _halves_f16(z3)
        a_z = gl.convert_layout(gl.reshape(gl.join(z_lo, z_hi), [16, BLOCK_N]), A_OP, assert_trivial=True)
        extra = mma_v2(a_z, p16, extra)
        return acc, extra

'''
_ATTEND_DEF = "    @gluon.jit\n    def _attend(b_q,"
_ATTEND_SIG = ("                LEAN: gl.constexpr = False, LQP: gl.constexpr = None, KG2: gl.constexpr = False):\n"
               "        \"\"\"One online-softmax step over a sealed tile")
_ATTEND_VALUES = """        b_vt = _tile_values(vw0, vw1, vs0, vs1, vo0, vo1, D, BITS, BLOCK_N, LV, MMA, PACKED, LEAN)
        acc = mma_v2(b_vt, gl.convert_layout(b_p.to(gl.float16), B_OP), acc)
        return m_new, l_i, acc"""
_ATTEND_PROBE = """        if vpw is None:
            b_vt = _tile_values(vw0, vw1, vs0, vs1, vo0, vo1, D, BITS, BLOCK_N, LV, MMA, PACKED, LEAN)
            acc = mma_v2(b_vt, gl.convert_layout(b_p.to(gl.float16), B_OP), acc)
        else:  # SENSITIVITY (vfold)
            acc, extra = _values_fold_probe(vw0, vw1, vpw, vo0, b_p, acc, D, BITS, BLOCK_N, BLOCK_H, LV, MMA, NG)
            # keeps the small MMAs (a kernel on layout v2 carries them as accumulators of their own)
            l_i = l_i + gl.convert_layout(_tile_sum(extra, 16, LAZY), l_i.type.layout)
        return m_new, l_i, acc"""
_DNP_CALL = """                m_i, l_i, acc = _attend(b_q, kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1, m_i, l_i,
                                        acc, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, PACKED,
                                        it * BLOCK_N, lo, WINDOW, LAZY, LEAN, LQP, BLOCK_N > G_K)
            if LAZY:
                l_i = _row_total(l_i, MMA)
        elif STAGES == 0:  # \"regs1\""""
_DNP_CALL_PROBE = _DNP_CALL.replace(
    "                m_i, l_i, acc = _attend(",
    "                vpw = vp_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + ((page * H + i_h) * P + (it % TPP) * BLOCK_N) * (D // G_V)\n"
    "                m_i, l_i, acc = _attend(", 1).replace("BLOCK_N > G_K)\n", "BLOCK_N > G_K, vpw, D // G_V)\n", 1)

#: name -> [(the exact source text, what replaces it)] in kernels/gluon_decode.py
PATCHES: dict[str, list[tuple[str, str]]] = {
    "pairs": [(_PAIR_WORDS, "        return a, b  # SENSITIVITY (pairs): the words as if stored paired")],
    "vparams": [
        (_VPARAM_LOADS, "        vwp = vp_base.to(gl.pointer_type(gl.int32), bitcast=True)  # SENSITIVITY (vparams)\n"
                        "        vs0 = gl.load(vwp + off_p // 2)\n        vs1 = vs0\n"
                        "        vo0 = gl.load(vwp + (NG + off_p) // 2)\n        vo1 = vo0"),
        (_VPARAM_PACK, "            pass  # SENSITIVITY (vparams): loaded as f16x2 words"),
    ],
    "hadd2": [(_HSUB2_PAIR, "")],
    "vfold": [
        (_ATTEND_DEF, _VFOLD_PROBE + _ATTEND_DEF),
        (_ATTEND_SIG, _ATTEND_SIG.replace("KG2: gl.constexpr = False):",
                                         "KG2: gl.constexpr = False, vpw=None, NG: gl.constexpr = 4):")),
        (_ATTEND_VALUES, _ATTEND_PROBE),
        (_DNP_CALL, _DNP_CALL_PROBE),
    ],
}


def _installed_package() -> Path:
    spec = importlib.util.find_spec("oscar_sgl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sensitivity.py: oscar_sgl is not importable (PYTHONPATH, or the wheel)")
    return Path(next(iter(spec.submodule_search_locations)))


def patched_copy(patches: list[str], dest: Path, source: Path | None = None) -> Path:
    """A copy of the package at ``dest/oscar_sgl`` with ``patches`` applied to its Gluon kernel
    (ValueError naming the patch whose source text is not there: the kernel changed)."""
    src = source or _installed_package()
    pkg = dest / "oscar_sgl"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    kernel = pkg / "kernels" / "gluon_decode.py"
    text = kernel.read_text()
    for name in patches:
        if name not in PATCHES:
            raise ValueError(f"unknown patch {name!r}: one of {', '.join(PATCHES)}")
        for old, new in PATCHES[name]:
            n = text.count(old)
            if n != 1:
                raise ValueError(f"patch {name!r}: its source text is {'not' if n == 0 else f'{n} times'} in "
                                 f"{kernel.name} (the kernel changed; update benches/kernels/sensitivity.py)")
            text = text.replace(old, new)
    kernel.write_text(text)
    return pkg


def _sets(spec: str) -> list[list[str]]:
    return [[] if s == "none" else s.split("+") for s in spec.split(",")]


def _label(patches: list[str]) -> str:
    return "+".join(patches) or "none"


def report(runs: dict[str, dict]) -> str:
    """``sensitivity.md``: per shape, bits and variant, the step time of each patch set and the share
    saved against ``none`` (bench_decode.py --gluon's JSON rows)."""
    base = runs.get("none")
    lines = ["| B | ctx | bits | variant | " + " | ".join(f"{k} us" + ("" if k == "none" else " (saved)") for k in runs)
             + " |", "|---|---|---|---|" + "---|" * len(runs)]
    for row in (base or next(iter(runs.values())))["rows"]:
        for col in row["columns"]:
            cells = []
            for label, run in runs.items():
                other = next((r for r in run["rows"] if (r["batch"], r["ctx"], r["bits"]) ==
                              (row["batch"], row["ctx"], row["bits"])), None)
                us = None if other is None else other["columns"].get(col, {}).get("us")
                ref = row["columns"][col].get("us") if base else None
                saved = "" if label == "none" or us is None or not ref else f" ({(1 - us / ref) * 100:.1f} %)"
                cells.append("-" if us is None else f"{us:.1f}{saved}")
            lines.append(f"| {row['batch']} | {row['ctx']} | {row['bits']} | {col} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rows(gluon_json: dict) -> list[dict]:
    """bench_decode.py --gluon's JSON (``{"meta", "rows"}``, a row's timed columns ``"default"`` and
    ``"gluon:<variant>"`` each ``{"us", ...}``) as rows ``{batch, ctx, bits, columns: {name: {us}}}``."""
    rows = []
    for r in gluon_json["rows"]:
        cols = {k: {"us": v.get("us")} for k, v in r.items()
                if (k == "default" or k.startswith("gluon:")) and isinstance(v, dict) and "us" in v}
        rows.append({"batch": r["batch"], "ctx": r["ctx"], "bits": r["bits"], "columns": cols})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--patches", default="none,pairs,vfold,pairs+vfold",
                    help="comma-separated patch sets, each 'none' or patch names joined by '+' (default: %(default)s)")
    ap.add_argument("--variants", default="dnp_r128fslwk,dnp_r128fslwnk")
    ap.add_argument("--shapes", default="8x32768,16x65536,32x8192,64x4096")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "sens")
    ap.add_argument("--bench-args", default="",
                    help="more bench_decode.py arguments for every run, e.g. \"--gluon-format page\"")
    ap.add_argument("--check", action="store_true", help="apply every patch set to a copy and stop (no GPU)")
    args = ap.parse_args(argv)
    sets = _sets(args.patches)
    if args.check:
        for s in sets:
            with tempfile.TemporaryDirectory() as d:
                patched_copy(s, Path(d))
            print(f"sensitivity.py: {_label(s)} applies")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict] = {}
    for s in sets:
        label = _label(s)
        with tempfile.TemporaryDirectory() as d:
            patched_copy(s, Path(d))
            env = dict(os.environ, PYTHONPATH=d + os.pathsep + os.environ.get("PYTHONPATH", ""))
            out = Path(d) / "bench"
            cmd = [sys.executable, str(Path(__file__).with_name("bench_decode.py")), "--gluon", "--gluon-step",
                   "--gluon-variants", args.variants, "--shapes", args.shapes, "--out", str(out),
                   *shlex.split(args.bench_args)]
            print(f"sensitivity.py: {label}: {' '.join(cmd)}", flush=True)
            rc = subprocess.run(cmd, env=env).returncode
            if rc != 0 or not (out / "gluon.json").exists():
                print(f"sensitivity.py: {label}: the benchmark failed (rc {rc})")
                continue
            for f in ("gluon.json", "gluon.md"):
                shutil.copy(out / f, args.out / f"{Path(f).stem}_{label}{Path(f).suffix}")
            runs[label] = {"rows": _rows(json.loads((out / "gluon.json").read_text()))}
    if not runs:
        return 5
    (args.out / "sensitivity.md").write_text(report(runs))
    print((args.out / "sensitivity.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
