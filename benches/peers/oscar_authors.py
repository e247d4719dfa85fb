"""The OScaR authors' CUDA decode kernel (github.com/ZunhaiSu/OScaR-KV-Quant, built on BitDecoding) as
a column of ``benches/kernels/bench_decode.py``. Their code is never part of this repository: this
module builds it from sources the caller points to and times it with bench_decode's own method.

Build (on the GPU machine; nvcc, ninja and torch's cpp_extension, compiled for sm_90)::

    OSCAR_AUTHORS_SRC=/path/to/OScaR-KV-Quant CUTLASS_INCLUDE=/path/to/cutlass/include \\
        python3 benches/peers/oscar_authors.py build --build-dir /tmp/oscar-authors-build

``OSCAR_AUTHORS_SRC`` is a checkout of their repository (``csrc/`` and ``oscar/oscar_interface.py``
are used), ``CUTLASS_INCLUDE`` the ``include/`` folder of CUTLASS at their submodule commit
``3fe62887``. ``benches/peers/build_oscar_authors.sh`` does both from the two archives it expects
in ``.peers/`` (an ignored folder, carried to the device machine).

Bench one shape (a separate process per shape: their kernel hits an illegal memory access at some
shapes, which poisons the CUDA context of the process that launched it)::

    python3 benches/peers/oscar_authors.py bench --build-dir DIR --batch 8 --ctx 32768 --group 32

prints one JSON line. What is matched against our kernel (bench_decode's OScaR column):

* shape: Llama-3.1-8B attention, 32 query / 8 KV heads, head_dim 128, one query token per request;
  fp16 (their kernel has no bf16 decode path), INT2, ``k-channel`` (per-channel keys in groups of
  ``--group`` tokens, per-token values in groups of ``--group`` channels: the same grouping as ours
  at group 32), their token norm on (``apply_k_norm``: the s_t of OScaR), no Hadamard rotation of
  the keys in the packer (a rotation changes no byte count nor any work of the decode kernel; left
  out so that the output can be checked against exact attention without rotating the query);
* state: ``ctx - 256`` tokens packed (their INT2 packs 256-token tiles; the residual flushes 256-token
  blocks) and 128 tokens in the fp16 residual block of 256 (``new_lens`` = 128: a half-full block,
  no flush inside the timed call), i.e. ``ctx - 128`` tokens attended. Ours at the same ``ctx``
  attends ``ctx`` tokens: ``ctx - 128`` sealed and 128 in the open BF16 page;
* timing: bench_decode's ``time_calls`` — C calls over C distinct copies of the packed cache captured
  in one CUDA graph (so that one replay streams >= 4x L2 and nothing is timed out of L2), median of
  ``triton.testing.do_bench`` over replays, divided by C. Everything their Python entry point does
  per call (output and split-accumulator allocation, the split heuristic) is inside the timed call,
  as it is for their model code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

HQ, H, D = 32, 8, 128
RESIDUAL_BLOCK = 256  # their INT2 k-channel residual / pack tile
NEW_LENS = 128  # fp16 tokens in the residual block during the timed call

SOURCES = [
    "csrc/oscar/decode_api.cpp",
    "csrc/oscar/src/k_preprocess.cu",
    "csrc/oscar/src/genfile/flash_fwd_hdim128_fp16_sm80.cu",
    "csrc/oscar/src/genfile/flash_qpack_hdim128_fp16_sm80_2bit.cu",
    "csrc/oscar/src/genfile/flash_qpack_hdim128_fp16_sm80_4bit.cu",
    "csrc/oscar/src/genfile/flash_fwd_split_hdim128_fp16_sm80_2bit.cu",
    "csrc/oscar/src/genfile/flash_fwd_split_hdim128_fp16_sm80_4bit.cu",
]
# their setup.py's nvcc flags, for sm_90 (their -std=c++17 is left to torch's cpp_extension, which
# picks the standard its headers need)
NVCC_FLAGS = [
    "-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
    "-gencode", "arch=compute_90,code=sm_90", "--threads", "4", "-w",
]  # fmt: skip


def _src() -> Path:
    src = os.environ.get("OSCAR_AUTHORS_SRC")
    if not src or not (Path(src) / "csrc" / "oscar" / "decode_api.cpp").is_file():
        raise SystemExit(f"OSCAR_AUTHORS_SRC must point to a checkout of ZunhaiSu/OScaR-KV-Quant (got {src!r})")
    return Path(src)


def build(build_dir: Path) -> Path:
    """Compile their extension (``oscar_cuda``) into ``build_dir``; returns the .so path."""
    import torch.utils.cpp_extension as ext

    src = _src()
    cutlass = os.environ.get("CUTLASS_INCLUDE")
    if not cutlass or not (Path(cutlass) / "cute" / "tensor.hpp").is_file():
        raise SystemExit(f"CUTLASS_INCLUDE must be CUTLASS's include/ folder at commit 3fe62887 (got {cutlass!r})")
    build_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    t0 = time.time()
    ext.load(
        name="oscar_cuda", sources=[str(src / s) for s in SOURCES], build_directory=str(build_dir),
        extra_cflags=["-O3"], extra_cuda_cflags=NVCC_FLAGS,
        extra_include_paths=[str(src / "csrc" / "oscar"), str(src / "csrc" / "oscar" / "src"), cutlass],
        verbose=True,
    )  # fmt: skip
    so = next(build_dir.glob("oscar_cuda*.so"))
    print(f"built {so} in {time.time() - t0:.0f} s", flush=True)
    return so


def load(build_dir: Path):
    """Import the built ``oscar_cuda`` and their ``oscar_interface`` (by path: their package's
    ``__init__`` pulls in their model code)."""
    import torch  # noqa: F401  (their extension needs torch loaded first)

    so = next(Path(build_dir).glob("oscar_cuda*.so"), None)
    if so is None:
        raise SystemExit(f"no oscar_cuda*.so in {build_dir}: run the build first")
    spec = importlib.util.spec_from_file_location("oscar_cuda", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["oscar_cuda"] = mod
    spec = importlib.util.spec_from_file_location("oscar_authors_interface", _src() / "oscar" / "oscar_interface.py")
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    return api


def bench(api, batch: int, ctx: int, group: int, budget: float) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
    from bench_decode import copies_for, rel_rms, time_calls

    dev = torch.device("cuda")
    bits, pack = 2, 8  # 16 // bits codes per uint16 word
    n_pack = ctx - RESIDUAL_BLOCK
    if n_pack <= 0 or n_pack % RESIDUAL_BLOCK:
        raise SystemExit(f"ctx must be a multiple of {RESIDUAL_BLOCK} above it, got {ctx}")
    # bytes one call must read: codes, fp32 params, fp32 norms of the packed part; the fp16 residual
    kv_bytes = batch * (
        H * (2 * n_pack * D * bits // 8 + (n_pack // group) * D * 2 * 4 + (D // group) * n_pack * 2 * 4)
        + n_pack * 4 + 2 * NEW_LENS * H * D * 2 + NEW_LENS * 4
    )  # fmt: skip
    copies = copies_for(kv_bytes, budget)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch, 1, HQ, D, device=dev, dtype=torch.float16, generator=g)
    scale = 1 / math.sqrt(D)
    sets = []
    for c in range(copies):
        k = (torch.randn(batch, ctx, H, D, device=dev, generator=g) * 0.3).half()
        v = torch.randn(batch, ctx, H, D, device=dev, generator=g).half()
        k_pack = torch.empty(batch, n_pack // pack, H, D, dtype=torch.uint16, device=dev)
        k_params = torch.empty(batch, n_pack // group, H, D, dtype=torch.float32, device=dev)
        v_pack = torch.empty(batch, n_pack, H, D // pack, dtype=torch.uint16, device=dev)
        v_params = torch.empty(batch, D // group, H, n_pack, dtype=torch.float32, device=dev)
        cu = torch.arange(0, (batch + 1) * n_pack, n_pack, dtype=torch.int32, device=dev)
        k_norm = api.kvcache_pack_int(k[:, :n_pack].contiguous(), k_pack, k_params, v[:, :n_pack].contiguous(), v_pack,
                                      v_params, None, cu, n_pack, "k-channel", group, bits, apply_k_hadamard=False,
                                      apply_k_norm=True)  # fmt: skip
        k_res = torch.zeros(batch, RESIDUAL_BLOCK, H, D, device=dev, dtype=torch.float16)
        v_res = torch.zeros_like(k_res)
        k_res[:, :NEW_LENS] = k[:, n_pack : n_pack + NEW_LENS]
        v_res[:, :NEW_LENS] = v[:, n_pack : n_pack + NEW_LENS]
        norm_res = torch.ones(batch, RESIDUAL_BLOCK, device=dev)
        new = dict(
            k_pack_new=torch.empty(batch, RESIDUAL_BLOCK // pack, H, D, dtype=torch.uint16, device=dev),
            k_params_new=torch.empty(batch, RESIDUAL_BLOCK // group, H, D, dtype=torch.float32, device=dev),
            v_pack_new=torch.empty(batch, RESIDUAL_BLOCK, H, D // pack, dtype=torch.uint16, device=dev),
            v_params_new=torch.empty(batch, D // group, H, RESIDUAL_BLOCK, dtype=torch.float32, device=dev),
        )
        seqlens = torch.full((batch,), n_pack, dtype=torch.int32, device=dev)
        ref_kv = (k[:, : n_pack + NEW_LENS], v[:, : n_pack + NEW_LENS]) if c == 0 else None
        del k, v
        sets.append(dict(k_pack=k_pack, k_params=k_params, v_pack=v_pack, v_params=v_params, k_res=k_res, v_res=v_res,
                         seqlens=seqlens, k_norm=k_norm, norm_res=norm_res, new=new, ref=ref_kv))  # fmt: skip
    torch.cuda.synchronize()

    def mk(s):
        def run():
            return api.fwd_kvcache_int(q, s["k_pack"], s["k_params"], s["v_pack"], s["v_params"], s["k_res"], s["v_res"],
                                       s["seqlens"], s["new"]["k_pack_new"], s["new"]["k_params_new"],
                                       s["new"]["v_pack_new"], s["new"]["v_params_new"], None, scale, "k-channel", group,
                                       RESIDUAL_BLOCK, NEW_LENS, bits, s["k_norm"], s["norm_res"])[0]  # fmt: skip

        return run

    out = mk(sets[0])()
    torch.cuda.synchronize()
    kk, vv = sets[0]["ref"]
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), kk.transpose(1, 2).float(), vv.transpose(1, 2).float(), enable_gqa=True
    ).transpose(1, 2)
    err = rel_rms(out, exact)
    sets[0]["ref"] = None
    del kk, vv, exact
    t = time_calls([mk(s) for s in sets])
    total = kv_bytes + batch * HQ * D * 2 * 2
    return {"batch": batch, "ctx": ctx, "group": group, "bits": bits, "attended": n_pack + NEW_LENS, "kv_bytes": kv_bytes,
            "copies": copies, "bytes": total, "TBps": total / (t["us"] * 1e-6) / 1e12,
            "rel_rms_vs_exact": err, **t}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--build-dir", type=Path, required=True)
    r = sub.add_parser("bench")
    r.add_argument("--build-dir", type=Path, required=True)
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--ctx", type=int, required=True)
    r.add_argument("--group", type=int, default=32)
    r.add_argument("--budget", type=float, default=24e9, help="bytes of KV copies (bench_decode's budget)")
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.build_dir)
        return
    res = bench(load(a.build_dir), a.batch, a.ctx, a.group, a.budget)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
