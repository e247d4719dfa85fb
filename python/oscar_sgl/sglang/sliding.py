"""Sliding-window layers kept in the model dtype in the server (`--oscar-sliding-layers bf16`).

SGLang 0.5.23 serves gemma-2/3 in its single-pool mode: every layer in one KV pool indexed by
token slot, the attention backend masking a sliding layer to its window
(`RadixAttention.sliding_window_size`: the query at x sees x - window .. x). By default
(`quantized`) the OScaR pool stores those layers like every other one. With `bf16` the pool keeps
them as SGLang's own pool does, one K and one V row per token slot in the KV dtype (BF16 on a
GPU), and the `oscar` backend attends over them here, in torch:

* decode (eager or inside the captured CUDA graph): each request's last window + 1 positions,
  gathered through `req_to_token`, positions below 0 masked;
* extend: each request's queries in blocks of `EXTEND_BLOCK` positions aligned to absolute
  positions, each block over the keys from its first position - window to its last, masked
  causally and to each row's window; the blocks of the whole batch run together. A token's block
  has the same shapes however its prompt was chunked, cached or batched.

Both compute in fp32 (scores, softmax, the weighted sum) and write the model dtype. In this mode
SGLang keeps every token of a sliding layer too, so the choice costs the full BF16 bytes of those
layers per token (docs/OSCAR.md §7): the default is `quantized`, what measures best per byte.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["EXTEND_BLOCK", "GATHER_ELEMENTS", "sliding_windows_of", "window_decode", "window_extend"]

#: Query positions per extend block (blocks start at multiples of it, whatever the chunk).
EXTEND_BLOCK = 128
#: At most this many gathered K (or V) elements per decode launch: larger batches run in chunks.
GATHER_ELEMENTS = 1 << 25


def sliding_windows_of(model: Any) -> dict[int, int]:
    """Layer id -> window of every sliding-window attention layer of a loaded SGLang model
    (`RadixAttention.sliding_window_size` >= 0; SGLang's -1 / None: full attention)."""
    if model is None:
        return {}
    from sglang.srt.layers.radix_attention import RadixAttention

    out: dict[int, int] = {}
    for m in model.modules():
        if isinstance(m, RadixAttention):
            w = getattr(m, "sliding_window_size", -1)
            if w is not None and int(w) >= 0:
                out[int(m.layer_id)] = int(w)
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Softmax attention in fp32. q [B, M, Hq, D], k / v [B, N, H, D], mask [B, M, N] (True: seen).
    Returns [B, M, Hq, D] fp32. Query head j reads KV head j // (Hq / H), as SGLang's GQA."""
    b, m, hq, d = q.shape
    h = k.shape[2]
    qg = q.float().reshape(b, m, h, hq // h, d)
    s = torch.einsum("bmhgd,bnhd->bhgmn", qg, k.float()) * sm_scale
    s = s.masked_fill(~mask[:, None, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("bhgmn,bnhd->bmhgd", p, v.float())
    return o.reshape(b, m, hq, d)


def window_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                  rows: torch.Tensor, seq_lens: torch.Tensor, window: int, sm_scale: float) -> torch.Tensor:
    """One decode query per request (q [bs, Hq, D], its position seq_len - 1) over the request's
    positions seq_len - 1 - window .. seq_len - 1, read from the slot-indexed buffers k_buf / v_buf
    [slots, H, D] through ``req_to_token[rows]``. Device ops only (CUDA-graph capturable). Returns
    [bs, Hq, D] in q's dtype."""
    bs = q.shape[0]
    h, d = k_buf.shape[1], k_buf.shape[2]
    n = window + 1
    offs = torch.arange(n, device=q.device, dtype=torch.int64)
    out = torch.empty_like(q)
    step = max(1, GATHER_ELEMENTS // (n * h * d))
    for a in range(0, bs, step):
        b = min(bs, a + step)
        pos = seq_lens[a:b].to(torch.int64)[:, None] - n + offs[None]  # [b, n]
        seen = pos >= 0
        slots = req_to_token[rows[a:b].to(torch.int64)[:, None], pos.clamp(min=0)].to(torch.int64)
        o = _attend(q[a:b, None], k_buf[slots], v_buf[slots], seen[:, None, :], sm_scale)
        out[a:b] = o[:, 0].to(q.dtype)
    return out


def window_extend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                  rows: list[int], pre: list[int], seq: list[int], window: int, sm_scale: float,
                  block: int | None = None) -> torch.Tensor:
    """An extend batch: request i's new tokens at positions pre[i] .. seq[i] - 1 (q [sum(seq - pre),
    Hq, D], request after request) over its positions 0 .. seq[i] - 1 in the slot-indexed buffers
    (slots ``req_to_token[rows[i]]``, this step's K/V already written), each query seeing x - window
    .. x. Every request's positions are cut into blocks of ``block`` (default `EXTEND_BLOCK`)
    starting at multiples of ``block``; a block's rows outside the chunk are zeros and its keys past
    the request's last position are masked, so a position's block has the same shapes whatever the
    chunk. The blocks of the whole batch run together, `GATHER_ELEMENTS` gathered keys at a time.
    Returns [sum(seq - pre), Hq, D] in q's dtype."""
    block = EXTEND_BLOCK if block is None else block
    hq, d = q.shape[1], q.shape[2]
    h = k_buf.shape[1]
    dev = q.device
    # the batch's blocks (host ints): request row, block start, the request's first new position,
    # its last position + 1, and the q row of that first new position
    blocks: list[tuple[int, int, int, int, int]] = []
    at = 0
    for r, s0, s1 in zip(rows, pre, seq):
        blocks += [(r, b0, s0, s1, at) for b0 in range(s0 // block * block, s1, block)]
        at += s1 - s0
    out = torch.empty_like(q)
    if not blocks:
        return out
    info = torch.tensor(blocks, dtype=torch.int64).to(dev)  # [B, 5]
    within = torch.arange(block, device=dev, dtype=torch.int64)
    keys = torch.arange(window + block, device=dev, dtype=torch.int64)
    step = max(1, GATHER_ELEMENTS // ((window + block) * h * d))
    for a in range(0, len(blocks), step):
        row, b0, s0, s1, at0 = info[a:a + step].unbind(1)
        qpos = b0[:, None] + within[None]  # [b, block]
        in_chunk = (qpos >= s0[:, None]) & (qpos < s1[:, None])
        qrow = (at0 - s0)[:, None] + qpos  # this step's q row of each block row in the chunk
        qb = q[qrow.clamp(0, q.shape[0] - 1)] * in_chunk[:, :, None, None]
        kpos = b0[:, None] - window + keys[None]  # [b, window + block]
        seen = ((kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] >= qpos[:, :, None] - window)
                & (kpos[:, None, :] >= 0) & (kpos[:, None, :] < s1[:, None, None]))
        slots = req_to_token[row[:, None], torch.minimum(kpos.clamp(min=0), s1[:, None] - 1)].to(torch.int64)
        o = _attend(qb, k_buf[slots], v_buf[slots], seen, sm_scale)  # [b, block, Hq, D]
        out[qrow[in_chunk]] = o[in_chunk].to(q.dtype)
    return out
