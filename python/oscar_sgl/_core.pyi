"""Type stubs of the Rust extension `oscar_sgl._core` (checked with `python -m mypy.stubtest`).

Arrays cross as little-endian `bytes` (inputs) and `bytes`/`bytearray` (outputs) with shape ints.
Use the typed wrappers in `oscar_sgl.runtime`; errors are the classes of `oscar_sgl.errors`.
"""

from typing import final

__all__ = [
    "LAYOUT_VERSION",
    "OP_EXTEND",
    "OP_DECODE",
    "OP_ALLOC",
    "OP_WRITE",
    "OP_RELEASE",
    "OP_LOCK",
    "OP_UNLOCK",
    "OP_SHARE",
    "pack",
    "unpack",
    "pack_k_page",
    "unpack_k_page",
    "format_cost",
    "plan_memory",
    "Runtime",
]

LAYOUT_VERSION: int
OP_EXTEND: int
OP_DECODE: int
OP_ALLOC: int
OP_WRITE: int
OP_RELEASE: int
OP_LOCK: int
OP_UNLOCK: int
OP_SHARE: int

def pack(
    values: bytes, *, part: str, shape: tuple[int, int, int], bits: int, group: int, offset: str = "integer", clip: bool = False
) -> tuple[bytes, bytes]: ...
def unpack(codes: bytes, params: bytes, *, part: str, shape: tuple[int, int, int], bits: int, group: int) -> bytes: ...
def pack_k_page(
    values: bytes, *, shape: tuple[int, int, int], bits: int, k_group: int, page_size: int
) -> tuple[bytes, bytes, bytes]: ...
def unpack_k_page(
    codes: bytes, grid: bytes, ranges: bytes, *, shape: tuple[int, int, int], bits: int, k_group: int, page_size: int
) -> bytes: ...
def format_cost(
    *, shape: tuple[int, int], bits: int, k_group: int, v_group: int, scale_columns: int, key_grid_page: int = 0
) -> tuple[float, float]: ...
def plan_memory(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    staging_pages: int,
    budget_bytes: int,
    k_group: int,
    v_group: int,
    scale_columns: int,
    key_grid_page: int = 0,
) -> list[tuple[str, float, int, int, int, int]]: ...
@final
class Runtime:
    def __new__(
        cls,
        *,
        num_pages: int,
        page_size: int,
        staging_slots: int,
        kv_heads: int,
        head_dim: int,
        bits: int,
        k_group: int,
        v_group: int,
        scale_columns: int,
        scratch_slots: int = 0,
        key_grid_page: int = 0,
    ) -> Runtime: ...
    def step(self, ops: bytes, ids: bytes) -> tuple[bytearray, bytearray]: ...
    def flush(self, ops: bytes, ids: bytes) -> None: ...
    def check(self) -> None: ...
    def reset(self) -> None: ...
    def page_to_staging(self) -> bytearray: ...
    def staging_free(self) -> int: ...
    def staging_available(self) -> int: ...
    def page_info(self, page: int) -> tuple[str, str, int, int, int]: ...
    def stats(self) -> dict[str, int | float]: ...
    def sizes(self) -> tuple[int, int, int, int, int]: ...
