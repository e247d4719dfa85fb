"""oscar-sgl's stand-in for the `sgl_kernel` names SGLang 0.5.23's CPU path imports at module load.

`oscar-sgl serve --device cpu ...` puts the folder above this package on PYTHONPATH of the server
processes, and only when no real `sgl_kernel` is installed (PyPI has no CPU build of it). SGLang
imports these names for speculative decoding and slot moves, paths an OScaR server never takes (it
rejects speculative decoding at startup) and a plain CPU server does not take either. Each function
raises if called; nothing is registered under `torch.ops.sgl_kernel`, so every layer takes
SGLang's plain-torch path. It is not a top-level package of the oscar-sgl wheel: it lives at
`oscar_sgl/_cpu_stand_in/sgl_kernel`, importable as `sgl_kernel` only through that PYTHONPATH entry.
"""

import importlib.machinery
import os
import sys

_NAMES = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "build_draft_decode_metadata_cpu",
)

# Never shadow a real sgl_kernel: if one is importable from anywhere else on the path, refuse.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REAL = importlib.machinery.PathFinder.find_spec(
    "sgl_kernel", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
if _REAL is not None:
    raise ImportError(
        f"oscar-sgl's sgl_kernel stand-in ({_HERE}) is on the path, but a real sgl_kernel is installed "
        f"({_REAL.origin or _REAL.submodule_search_locations}); remove {_HERE} from PYTHONPATH "
        "(`oscar-sgl serve` adds it only when no sgl_kernel is installed)")


def _stand_in(name):
    def fn(*args, **kwargs):
        raise RuntimeError(
            f"sgl_kernel.{name} was called, but this is oscar-sgl's import-only stand-in (no CPU build of "
            "sgl_kernel is installed): this path (speculative decoding or KV slot moves) needs the real "
            "sgl_kernel"
        )

    fn.__name__ = name
    return fn


for _n in _NAMES:
    globals()[_n] = _stand_in(_n)

__all__ = list(_NAMES)
