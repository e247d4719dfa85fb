"""Test-only stand-in for the `sgl_kernel` names SGLang 0.5.23's CPU path imports at module load.

PyPI has no CPU build of sgl_kernel. SGLang imports these names for speculative decoding and slot
moves, paths an OScaR server never takes (it rejects speculative decoding at startup). Each
function raises if called; nothing is registered under `torch.ops.sgl_kernel`, so every layer
takes SGLang's plain-torch path.
"""

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


def _stand_in(name):
    def fn(*args, **kwargs):
        raise RuntimeError(
            f"sgl_kernel.{name} was called, but this is the test stand-in (no CPU build of "
            "sgl_kernel exists): the OScaR CPU server must never reach this path"
        )

    fn.__name__ = name
    return fn


for _n in _NAMES:
    globals()[_n] = _stand_in(_n)

__all__ = list(_NAMES)
