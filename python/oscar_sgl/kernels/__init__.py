"""OScaR Triton kernels (sources in the repository's top-level ``triton_kernels/``, shipped here).

- ``oscar_write_kv``: rotate + s_t + BF16 staging write of a step's new K/V (optionally the queries).
- ``oscar_rotate_q``: the query rotation as one small launch.
- ``oscar_seal``: quantize + pack whole staging pages into the pool, one launch per step.
- ``oscar_decode_attention``: split-KV decode over sealed (INT2/INT4) pages + the open BF16 page;
  ``decode_num_splits`` / ``decode_workspace`` size its reusable scratch (CUDA graphs),
  ``pick_num_splits`` turns programs per SM into a split count.
- ``oscar_extend_attention``: new tokens over a sealed prefix plus themselves, causal.

The launchers take what a caller must give; how a launch runs (tiles, warps, splits) is the
private ``_default_tuning`` table of ``decode`` and of ``extend``. The shapes the kernels support
are ``oscar_sgl.supported.check_kernel_shape``. Importing this package needs ``triton``;
``import oscar_sgl`` does not.
"""

from .common import PagedLayer
from .decode import decode_num_splits, decode_workspace, oscar_decode_attention, pick_num_splits
from .extend import oscar_extend_attention
from .seal import oscar_seal
from .write import oscar_rotate_q, oscar_write_kv

__all__ = [
    "PagedLayer",
    "decode_num_splits",
    "decode_workspace",
    "oscar_decode_attention",
    "oscar_extend_attention",
    "oscar_rotate_q",
    "oscar_seal",
    "oscar_write_kv",
    "pick_num_splits",
]
