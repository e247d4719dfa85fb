"""What the OScaR Triton kernels support: the shape rules of one layer, in one function.

The kernel launchers (``oscar_sgl.kernels``) call it before they launch, and a front end can call
it when it builds a pool, so a configuration the kernels cannot run fails early, with the same
message wherever it is caught.
"""

from __future__ import annotations

from .config import OscarConfigError


def check_kernel_shape(*, bits: int, k_group: int, v_group: int, page_size: int, head_dim: int) -> None:
    """Raise `OscarConfigError` unless the kernels run a layer of this shape and configuration.

    The rules: 2 or 4 bits; a power-of-two head_dim whose codes fill whole 32-bit words (a token's
    codes are read as int32 words); a power-of-two value group dividing head_dim and made of whole
    16-bit halves of a word (32/bits channels per word); a power-of-two key group of at least 16
    tokens (an MMA tile) dividing the page; a page of a multiple of 32 tokens (the extend kernel
    walks pages in tiles of 32).
    """
    if bits not in (2, 4):
        raise OscarConfigError(f"OScaR kernels: --oscar-bits must be 2 or 4, got {bits}")
    if head_dim <= 0 or head_dim & (head_dim - 1):
        raise OscarConfigError(f"OScaR kernels: head_dim must be a power of two, got {head_dim}")
    if (head_dim * bits) % 32:
        raise OscarConfigError(f"OScaR kernels: head_dim={head_dim} at {bits} bits is not a whole number of 32-bit words")
    cpw = 32 // bits
    if v_group <= 0 or v_group & (v_group - 1) or head_dim % v_group:
        raise OscarConfigError(f"OScaR kernels: --oscar-v-group must be a power of two dividing head_dim={head_dim}, got {v_group}")
    if v_group % cpw:
        raise OscarConfigError(f"OScaR kernels: --oscar-v-group must be a multiple of {cpw} at {bits} bits, got {v_group}")
    if k_group < 16 or k_group & (k_group - 1) or page_size % k_group:
        raise OscarConfigError(
            f"OScaR kernels: --oscar-k-group must be a power of two >= 16 dividing --oscar-page-size ({page_size}), got {k_group}"
        )
    if page_size % 32:
        raise OscarConfigError(f"OScaR kernels: --oscar-page-size must be a multiple of 32, got {page_size}")
