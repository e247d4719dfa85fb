"""Compile the Gluon decode stage 1 for sm_90 without a GPU and count what its sealed-tile loop does
through shared memory (issue 14 item 1; benches/results/kernels_gluon_design.md).

Needs Triton 3.6 (the H200's version; the Gluon API is experimental and changes between releases)
and torch; no GPU: ``triton.compile`` runs the whole pipeline to a cubin on the CPU, and the
``cuobjdump`` / ``nvdisasm`` shipped in the Triton wheel disassemble it. Run from the repo root:

    PYTHONPATH=python python benches/kernels/gluon_compile_check.py [--variants all] [--sass-dir DIR]

For each (variant of ``GLUON_VARIANTS`` named by --variants, bits, block_n, GQA group) it prints
registers, stack (spilled state), static and dynamic shared memory and local memory of the cubin,
and per loop of the SASS (the sealed-tile loop, the open-page loop) the count of instructions,
shared-memory instructions (STS / LDS / LDSM / STSM), cp.async (LDGSTS, its barriers), shuffles,
MMAs, global loads and the dequantization's LOP3 / HADD2 / HFMA2. The register-prefetch variants'
sealed-tile loop has no shared-memory instruction at all; the cp.async rings read each tile back
with LDS.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from triton.experimental.gluon import language as gl

from oscar_sgl.kernels import gluon_decode as G

SIGNATURE = {
    "qrot_ptr": "*fp32", "kw_ptr": "*i32", "kp_ptr": "*fp16", "vw_ptr": "*i32", "vp_ptr": "*fp16", "scale_ptr": "*fp32",
    "stg_k_ptr": "*bf16", "stg_v_ptr": "*bf16", "p2s_ptr": "*i32", "kv_indptr_ptr": "*i32", "page_idx_ptr": "*i32",
    "seq_lens_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
    "q_ptr": "*bf16", "new_k_ptr": "*bf16", "new_v_ptr": "*bf16", "new_loc_ptr": "*i64", "stg_scale_ptr": "*fp32",
    "krot_ptr": "*i32", "counter_ptr": "*i32", "out_ptr": "*bf16", "stride_qb": "i32", "stride_qh": "i32", "stride_kb": "i32",
    "stride_kh": "i32", "stride_vb": "i32", "stride_vh": "i32", "stride_ob": "i32", "stride_oh": "i32", "sm_scale_log2": "fp32",
    "window_left": "i32", "kr_ptr": "*i16", "long_min": "i32",
}  # fmt: skip


def compile_stage1(*, bits: int, block_n: int, group: int, d: int = 128, h: int = 8, p: int = 128, k_group: int = 32,
                   v_group: int = 32, s_cols: int = 1, block_t: int = 32, variant: str = "regs1", window: bool = False,
                   key_page: bool = False, rot_q: bool | None = None, write: bool | None = None,
                   launch_dependents: bool = False, dual: bool = False):
    """The Gluon stage 1 (``variant``: a key of ``GLUON_VARIANTS``) compiled for sm_90
    (``triton.compile``; no GPU needed); ``key_page``: page-grid key ranges. A fused variant compiles
    the whole step; ``rot_q`` / ``write`` False leave its query rotation / write out (the launcher's
    ``split_write`` form: neither; the "without write" launch of the benchmarks: no write);
    ``launch_dependents``: the separate merge launch its programmatic dependent (``merge_pdl``);
    ``dual``: the long requests' launch after the Triton stage 1 (``_DecodeTuning.long_gluon``)."""
    var = G.gluon_variant(variant)
    if key_page:
        G.check_gluon_key_page(variant)
    block_h = max(8, 1 << (group - 1).bit_length())
    block_g = max(1, 1 << (group - 1).bit_length())
    G.check_gluon_shape(bits=bits, head_dim=d, k_group=k_group, v_group=v_group, block_n=block_n, group=group)
    G.check_gluon_key_groups(variant, block_n=block_n, k_group=k_group)
    const = dict(H=h, GROUP=group, BLOCK_H=block_h, D=d, BITS=bits, P=p, G_K=k_group, G_V=v_group, S=s_cols,
                 BLOCK_N=block_n, BLOCK_T=var.staging_block or block_t, **var.constexprs(),
                 # a fused variant compiles the whole step (query rotation, write, rotated-back partials, merge)
                 ROT_Q=var.fused if rot_q is None else var.fused and rot_q,
                 WRITE=var.fused if write is None else var.fused and write, ROT_OUT=var.fused, ROTATE=True, LOG2D=d.bit_length() - 1,
                 INV_SQRT_D=d ** -0.5, KEY_MASK=False, BLOCK_HK=h, MERGE=var.fused, BLOCK_G=block_g,
                 CHUNK=max(1, 2048 // (block_g * d)), WINDOW=window, KEY_PAGE=key_page, LAUNCH_DEPENDENTS=launch_dependents,
                 DUAL=dual, **G.gluon_layouts(bits=bits, head_dim=d, block_n=block_n, block_h=block_h, v_group=v_group))
    sig = dict(SIGNATURE, **{k: "constexpr" for k in const})
    if var.tma:  # the launcher's TMA descriptors (gluon_tma_descriptors): their block types and layouts
        w, ng, n = d * bits // 32, d // v_group, block_n * var.tma_tiles
        for name, (dt, block, bw) in {"kw_desc": ("i32", [n, w], 32), "kp_desc": ("i32", [max(1, n // k_group), d], 32),
                                      "vw_desc": ("i32", [n, w], 32),
                                      "vp_desc": ("fp16", [n * ng // 4, 8], 16)}.items():
            lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bw, rank=2)
            sig[name] = f"tensordesc<{dt}[{block[0]}, {block[1]}],{lay!r}>"
    else:
        for name in ("kw_desc", "kp_desc", "vw_desc", "vp_desc"):
            sig[name] = "constexpr"
            const[name] = None
    sig = {name: sig[name] for name in G._gluon_decode_stage1_kernel.arg_names if name in sig}  # the kernel's order
    from triton.experimental.gluon._runtime import GluonASTSource

    # what a launch specializes on: every pointer 16-byte aligned (torch allocations are)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, v) in enumerate(SIGNATURE.items()) if v.startswith("*")}
    src = GluonASTSource(G._gluon_decode_stage1_kernel, sig, const, attrs)
    options = {"num_warps": 1} if var.maxnreg is None else {"num_warps": 1, "maxnreg": var.maxnreg}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_triton_stage1(*, bits: int, block_n: int = 32, group: int = 4, d: int = 128, h: int = 8, p: int = 128,
                          launch_dependents: bool = False, spread: int = 0, dual: bool = False):
    """Today's Triton stage 1 (``decode._decode_stage1_kernel``) in its default form (transposed,
    one warp, fused write and query rotation, separate merge) compiled the same way, for comparison;
    ``launch_dependents``: with the separate merge a programmatic dependent launch (``merge_pdl``);
    ``spread``: the open page's tiles over short sealed programs (``spread_open``); ``dual``: the
    short requests only (``_DecodeTuning.long_gluon``)."""
    from triton.compiler import ASTSource

    from oscar_sgl.kernels import decode as dec

    pool = ("*i32", "*i32", "*i32", "*i32", "*fp32", "*bf16", "*bf16", "*i32")  # decode.POOL_TENSORS
    ptrs = {"qrot_ptr": "*fp32", "pool": pool, "kv_indptr_ptr": "*i32", "page_idx_ptr": "*i32",
            "seq_lens_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "q_ptr": "*bf16", "new_k_ptr": "*bf16",
            "new_v_ptr": "*bf16", "new_loc_ptr": "*i64", "stg_scale_ptr": "*fp32", "counter_ptr": "*i32", "out_ptr": "*bf16",
            "krot_ptr": "*i32"}
    ints = {"strides": ("i32",) * 8}
    const = dict(H=h, GROUP=group, BLOCK_H=8, D=d, BITS=bits, P=p, G_K=32, G_V=32, S=1, BLOCK_N=block_n, BLOCK_T=32, USE_ASM=True,
                 INTERPRET=False, ROT_Q=True, WRITE=True, MERGE=False, ROTATE=True, LOG2D=d.bit_length() - 1,
                 INV_SQRT_D=d ** -0.5, BLOCK_G=group, BLOCK_HK=h, CHUNK=16, TRANS=True, WINDOW=False, KEY_PAGE=False,
                 KEY_MASK=False, LAUNCH_DEPENDENTS=launch_dependents, SPREAD=spread, DUAL=dual)
    sig = {**ptrs, **ints, "sm_scale_log2": "fp32", "window_left": "i32", "long_min": "i32", "part_stride": "i32",
           **{k: "constexpr" for k in const}}
    sig = {k: sig[k] for k in dec._decode_stage1_kernel.arg_names}
    attrs = {path: [["tt.divisibility", 16]] for i, v in enumerate(sig.values())
             for path, t in (zip([(i, j) for j in range(len(v))], v) if isinstance(v, tuple) else [((i,), v)]) if t.startswith("*")}
    src = ASTSource(dec._decode_stage1_kernel, sig, const, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "num_stages": 3})


def sass_of(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


COUNTED = ("LDL", "STL", "STS", "LDS", "LDSM", "STSM", "LDGSTS", "LDGDEPBAR", "DEPBAR", "BAR", "SHFL", "HMMA", "LDG", "PRMT", "LOP3", "HADD2",
           "HFMA2", "MUFU")
_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(.*)$")


def count(ops: list[str]) -> dict[str, int]:
    return {"instructions": len(ops), **{k: ops.count(k) for k in COUNTED}}


def _rows(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, the rest of the line: modifiers and operands) of each SASS instruction."""
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(_LINE.match, sass.splitlines()) if m]


def _loop_spans(rows: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last address) of each loop: a backward branch and the instructions it spans."""
    spans = []
    for addr, op, rest in rows:
        b = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if b and int(b.group(1), 16) < addr:
            spans.append((int(b.group(1), 16), addr))
    return spans


def loop_opcodes(sass: str) -> list[collections.Counter]:
    """Per loop of the SASS, how many instructions of each opcode with its modifiers (``LOP3.LUT``,
    ``HMMA.16816.F32``, ``LDG.E.128``) one iteration holds."""
    rows = _rows(sass)
    return [collections.Counter(o + re.match(r"((?:\.[A-Z0-9_]+)*)", r).group(1) for a, o, r in rows if lo <= a <= hi)
            for lo, hi in _loop_spans(rows)]


def loops(sass: str) -> list[dict[str, int]]:
    """Per loop of the SASS (a backward branch and the instructions it spans): its counts, and
    ``common path``: the instructions left when every conditional block inside it (a forward
    branch to a target inside the loop) is skipped, e.g. the lazy rescale (GluonVariant.lazy_rescale)."""
    rows = _rows(sass)
    out = []
    for lo, addr in _loop_spans(rows):
        c = count([o for a, o, _ in rows if lo <= a <= addr])
        skipped = set()
        blocks = []
        for a2, o2, r2 in rows:
            f = re.search(r"0x([0-9a-f]+)", r2) if o2 == "BRA" and lo <= a2 < addr else None
            if f and a2 < int(f.group(1), 16) <= addr:
                block = {a3 for a3, _, _ in rows if a2 < a3 < int(f.group(1), 16)}
                blocks.append(len(block - skipped))
                skipped |= block
        if skipped:
            c["common path"] = c["instructions"] - len(skipped)
            c["blocks"] = blocks  # the conditional blocks' sizes, in program order
        out.append(c)
    return out


def resources(cubin: bytes) -> str:
    """``REG:.. STACK:.. SHARED:.. LOCAL:..`` of the kernel (cuobjdump -res-usage)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        res = subprocess.run([str(tool), "-res-usage", f.name], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", res)
    return m.group(0) if m else res.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sass-dir", type=Path, help="write each variant's SASS and TTGIR here")
    ap.add_argument("--triton", action="store_true", help="also today's Triton stage 1 (default form), for comparison")
    ap.add_argument("--variants", default="regs1", help="comma-separated keys of GLUON_VARIANTS, or 'all' (default: regs1)")
    ap.add_argument("--block-n", default="16,32", help="tile sizes to compile (default 16,32)")
    ap.add_argument("--groups", default="4,8", help="GQA groups to compile (default 4,8)")
    ap.add_argument("--window", action="store_true", help="compile the sliding-window form (WINDOW)")
    ap.add_argument("--format", choices=("group", "page"), default="group",
                    help="key ranges and groups: 'group' (the paper's fp16 pairs, G_K = G_V = 32; default) or 'page' "
                         "(the INT2 server default: page-grid ranges, G_K 16, G_V 64; block_n 16)")
    ap.add_argument("--k-group", type=int, default=None,
                    help="the key group in tokens instead of the format's (group: 32, page: 16)")
    ap.add_argument("--opcodes", action="store_true",
                    help="also each sealed-tile loop's instructions per opcode (with modifiers), most frequent first")
    ap.add_argument("--fused-parts", choices=("all", "nowrite", "split"), default="all",
                    help="a fused variant's parts in the launch: 'all' (the query rotation and the write; default), "
                         "'nowrite' (the query rotation only), 'split' (neither: _DecodeTuning.split_write's stage 1)")
    args = ap.parse_args()
    parts = {"all": {}, "nowrite": dict(write=False), "split": dict(rot_q=False, write=False)}[args.fused_parts]
    print(f"triton {triton.__version__}")
    reason = G.gluon_available()
    if reason is not None:
        print(f"cannot compile: {reason}")
        return 2
    rc = 0
    for bits in (2, 4) if args.triton else ():
        ck = compile_triton_stage1(bits=bits)
        sass = sass_of(ck.asm["cubin"])
        print(f"triton_int{bits}_bn32_g4 (today's kernel): {resources(ck.asm['cubin'])}")
        for i, c in enumerate(loops(sass)):
            print(f"  loop {i} (per iteration): " + ", ".join(f"{k} {v}" for k, v in c.items() if v))
    variants = list(G.GLUON_VARIANTS) if args.variants == "all" else args.variants.split(",")
    for v in variants:
        G.gluon_variant(v)  # unknown names: ValueError before any compile
    for variant, bits, block_n, group in ((v, b, n, g) for v in variants for b in (2, 4)
                                          for n in map(int, args.block_n.split(",")) for g in map(int, args.groups.split(","))):
        if True:
            if True:
                name = f"{variant}_int{bits}_bn{block_n}_g{group}"
                try:
                    fmt = (dict(k_group=16, v_group=64, key_page=True) if args.format == "page" else {})
                    if args.k_group is not None:
                        fmt["k_group"] = args.k_group
                    ck = compile_stage1(bits=bits, block_n=block_n, group=group, variant=variant, window=args.window,
                                        **fmt, **parts)
                except Exception as exc:  # noqa: BLE001 - report every variant
                    cause = f" (cause: {exc.__cause__!r})"[:1500] if exc.__cause__ is not None else ""
                    print(f"{name}: COMPILE FAILED: {type(exc).__name__}: {str(exc)[:2000]}{cause}")
                    rc = 1
                    continue
                sass = sass_of(ck.asm["cubin"])
                print(f"{name}: {resources(ck.asm['cubin'])} (dynamic shared {ck.metadata.shared} B)")
                for i, c in enumerate(loops(sass)):
                    # the sealed-tile loop is the one that dequantizes (HFMA2; with the values folded into the
                    # probabilities, benches/kernels/sensitivity.py's vfold, only the codes' LOP3 / HADD2 are
                    # left), the open-page one the one with MMAs but no dequantization; a fused variant's
                    # merge has neither
                    sealed = c["HFMA2"] or c["HADD2"] or c["LOP3"] >= 64
                    what = "sealed-tile loop" if sealed else "open-page loop" if c["HMMA"] else "merge loop"
                    print(f"  loop {i} ({what}, per iteration): " + ", ".join(f"{k} {v}" for k, v in c.items() if v))
                    if args.opcodes and sealed:
                        print("    opcodes: " + ", ".join(f"{k} {v}" for k, v in loop_opcodes(sass)[i].most_common()))
                if args.sass_dir:
                    args.sass_dir.mkdir(parents=True, exist_ok=True)
                    (args.sass_dir / f"{name}.sass").write_text(sass)
                    (args.sass_dir / f"{name}.ttgir").write_text(ck.asm["ttgir"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
