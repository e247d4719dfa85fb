"""Decode stage 1 in Triton's Gluon dialect: explicit ``mma_v2`` operand layouts on layout v1 (issue 14
item 1, first step; design: benches/results/kernels_gluon_design.md).

On GPUs (H100 and H200, Triton 3.6.0) its ``gpu`` tests in tests/test_kernels_decode_gluon.py
pass against the torch reference. The default decode runs the "dnp_r128fslwnkv" variant
(``decode.GLUON_DEFAULT_VARIANT``; session 21's "dnp_r128fs" before session 25, "dnp_r128fslwk" until
session 28, "dnp_r128fslwnk" until session 34) on sm_90 from 16 to
1024 (request, KV head) pairs (``decode.gluon_default_reason``): whole steps 0.90-1.33x the fused
Triton step on an H100 there (benches/results/kernels_gluon_s25/); elsewhere it is opt-in
(``decode._DecodeTuning.gluon``, tests and benchmarks);
``_tuning.gluon_variant`` picks one of ``GLUON_VARIANTS`` (how sealed tiles are streamed: register
prefetch, cp.async rings of 2-4 tiles, register caps, key params folded into the query), timed in
the same sweep (none beat "regs1" at the default split count), and the low-register forms of session
20 (16-token open-page tiles loaded straight into the operand layouts, params paired at load, no
prefetch: 168-104 registers instead of 230; kernels_gluon_design.md §9) and of session 21 (the open
page spread over the sealed splits); sessions 22-23 added instruction cuts (a lazy running maximum,
key params paired from words, a two-instruction INT2 dequantization, key params folded into the
query and an accumulator-input MMA) and a TMA ring that streams the sealed tiles into shared memory
(``GluonVariant.tma``), timed in session 25: the folded keys win, the TMA rings do not, the lean
INT2 form is faster but outside the reference bound (benches/results/kernels_gluon_s25/).

Same contract as the Triton stage 1 of ``decode.py`` (grid ``(B, H, num_splits + 1)``, one
normalized partial and log-sum-exp per (request, query head, split); split ``num_splits`` takes
the last page, or with ``spread_open`` only its last tile), with two differences: one warp per
program always; unless the variant is ``fused``, no fused write, query rotation or merge, and the
partials stay in the rotated basis (the merge launch rotates after the weighted sum,
``merge_launch(..., rotation=True)``).

What the kernel controls that Triton does not let the portable kernel control: the register layout
of every operand. Transposed form as in ``decode.py`` (``S^T = K Q^T``, ``O^T += V^T P^T``, the GQA
heads the MMA N side). The key tile is the A operand of ``mma.sync.m16n8k16``: lane ``(g, t)``
(``lane = 4g + t``) holds tokens ``g + 8r`` and, over the D/16 k-chunks, 32 fragment positions that
the kernel maps to the channels of whole code words: ``[t*D/4, (t+1)*D/4)``, i.e. words
``[t*WPL, (t+1)*WPL)`` of each of its tokens (WPL = D*BITS/128: one 8-byte load for INT2 at D=128,
one 16-byte load for INT4). The dot product does not care which channel sits at which k position:
the query operand is loaded in the same order (``key_channel``). The value tile is the A operand of
``V^T P^T``: lane ``(g, t)`` holds channels ``[g*D/8, (g+1)*D/8)`` (one INT2 word, two INT4 words per
token) of tokens ``2t, 2t+1 (+8, +16, ...)``; the output rows come out in that channel order
(``value_channel``) and are stored back in channel order. A register pairs two codes of one word
(keys) or of the two tokens of a pair (values, after one byte permute), so every lane dequantizes
exactly the words it loaded: no code word or dequantized value crosses shared memory. The
dequantized tiles are built in a blocked "pair domain" layout whose reshape to the operand shape
is the ``DotOperandLayout`` up to a register permutation, and ``gl.convert_layout`` to the operand
layout is then register-only (checked in the compiled sm_90 code: see the design note).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

try:  # Gluon is experimental: absent, or with another API, on other Triton versions (CPU CI has 3.8)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    GLUON_IMPORT_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 - any failure means: no Gluon path here
    gluon = gl = mma_v2 = async_copy = fence_async_shared = mbarrier = tma = None
    GLUON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class GluonVariant:
    """How the Gluon stage 1 streams its sealed tiles (never what it computes); ``GLUON_VARIANTS``
    names the ones a GPU sweep times (``bench_decode.py --gluon --gluon-variants``).

    Attributes:
        name: the key in ``GLUON_VARIANTS`` (a column of the sweep).
        stages: 0: the next tile's bytes prefetched into registers (the first kernel, "regs1");
            2..4: a cp.async ring of ``stages`` tiles in shared memory for the code words, key
            params and token scales (``stages - 1`` tiles in flight during a tile's math), each lane
            reading back exactly the bytes it copied (same layout on both sides, unswizzled, so a
            lane's 8/16-byte words stay contiguous); the value params (2-byte per lane: below
            cp.async's 4-byte minimum) stay one tile ahead in registers.
        maxnreg: register cap per thread (None: the compiler's choice; 230 at INT2), to fit more
            one-warp programs per SM (65536 / (32 * maxnreg) warps).
        keys: how the key tile meets the query. ``"dequant"``: codes * scale + offset in fp16
            (LOP3 + HSUB2 + HFMA2 per pair; the first kernel). ``"fold"``: the per-channel key
            (scale, offset) are constant over a tile (G_K a multiple of BLOCK_N), so
            ``K q = sum_c (q_c s_c) code_c + sum_c q_c o_c``: the MMA takes the exact codes (LOP3 +
            HSUB2) and the query scaled once per tile (fp16 ``q' = q * s``), plus the fp32 per-head
            ``q . o``. ``"magic"``: the MMA takes ``2^(10-b) + code`` as the LOP3 makes it (no HSUB2)
            and the per-head term also subtracts ``q' . 2^(10-b)`` (fp32; larger cancellation).
            ``"mma"`` (with ``packed``): ``fold`` with both per-tile terms on the f16x2 pairs the
            packed path already holds: ``q' = q * s`` one HMUL2 per pair of k positions, and the
            per-head term ``q . o`` an MMA of its own (the offsets broadcast over 16 rows) whose
            result is the key MMA's accumulator input, so it costs no shuffle and no add; the MMA
            takes the exact codes (LOP3 + HSUB2, ``_folded_keys``). Per 32-token tile and lane the
            keys' 64 HFMA2 give way to 16 HMUL2, 8 HMMA and 16 moves (the offsets' operand
            registers). With ``lean_dequant`` the INT2 keys stay dequantized (two instructions per
            pair there beat the fold) and the fold applies at INT4. ``"mma_magic"``: ``"mma"`` with
            the codes as the LOP3 makes them (``2^(10-b) + code``: one instruction per pair, no
            HSUB2) and ``q' . 2^(10-b)`` taken out by a second MMA of the same rounded ``q'``
            (exact products in fp32: the ``magic`` mode's cancellation without its fp32 reduction).
        prefetch: with ``stages`` 0, the next tile's bytes are loaded before the current tile's math
            (True, "regs1") or each tile's right before its own math (False: nothing of the next
            tile is held, so fewer registers per lane and more one-warp programs per SM hide the
            latency instead).
        packed: the key and value (scale, offset) are paired into f16x2 words as soon as they are
            loaded (True) instead of in the tile's math: a prefetched tile then holds half the
            registers for its params (sessions 9-19 measured the unpacked form).
        open_first: the open-page program of each (request, KV head) (the new token's write with
            ``fused``, the open page's last tile) is the first along the grid's split axis instead
            of the last, so it is launched in the first wave rather than in a last partial one
            where its latency is the step's tail (only the launch order changes).
        staging_block: tokens per open-page (BF16 staging) tile of this variant (None: the tuning's
            ``block_t``, 32 at head_dim 128). The open-page loop, not the sealed-tile loop, sets the
            kernel's register count at 32 (230 at INT2; 16: 168 with ``packed``), and registers
            decide how many programs an SM holds; the open page is at most one page per request.
        direct_staging: the open page's BF16 keys and values are loaded the way the sealed tiles'
            codes are, each lane the elements its operand registers hold (``_staging_tile_direct``:
            no shuffles, whole runs of a token's row; at INT2 281 instead of 537 instructions per
            16 tokens) instead of plain loads converted by ``gl.convert_layout`` (``_staging_tile``,
            sessions 9-19).
        fused: the step's other parts in the same launch (``ROT_Q`` / ``WRITE`` / ``ROT_OUT`` of the
            kernel): the query rotation (every program of a (request, KV head) rotates its query
            heads, as the Triton stage 1 does), the new token's write (rotated K/V into the staging
            slot and its s_t, by the open-page program) and the partials' inverse rotation (so the
            merge is the plain channel-parallel launch of the Triton path, not the rotating one):
            two launches per step instead of three, one where the Triton step fuses its merge too
            (few splits: the last program of a (request, KV head) merges). False: the write (+ query
            rotation) and the
            rotating merge are launches of their own (sessions 9-19).
        spread_open: the open page's tiles but the last (the one holding the new token) are read by
            the sealed splits, the j-th tile by split ``num_splits - 1 - j`` (mod ``num_splits``: the
            splits the ceiling division left shortest), instead of all by the last program: at short
            contexts that program (up to P / staging_block tiles, one memory round trip each, after
            the write) was the step's critical path (session 21, H200: the Gluon step lost 6-10 us
            to the fused Triton step there). The partials' contract is unchanged.
        lazy_rescale: the sealed-tile loop moves its running maximum (and rescales the accumulator
            and the sum by ``2^(m_old - m_new)``) only on a tile where some head's logits exceed it by
            more than ``LAZY_TAU`` (log2 units), instead of on every tile: the probabilities of a
            tile are then ``2^(s - m)`` with ``s - m <= LAZY_TAU``, at most ``2^LAZY_TAU`` = 256 (fp16
            and fp32 hold that as well as values <= 1). The same sums in fewer instructions: the 32
            FMUL rescale per lane, the factors' exponentials and the sum's rescale leave the loop's
            common path for a warp-uniform branch (session 22: the sealed-tile loop's time follows
            its instruction count, kernels_gluon_s22/).
        pair_words: with ``packed``, the key (scale, offset) pairs are made from whole int32 words
            of two neighbouring channels, one PRMT per pair (``_key_param_pairs``), instead of two
            fp16 loads paired by integer sign extension, mask, shift and OR (``_pack_f16``): 73 of
            the INT2 sealed tile's 785 instructions per lane went to pairing params (session 22,
            SASS line attribution). Bit-identical pairs.
        lean_dequant: at INT2, each code pair dequantized in two instructions (LOP3, HFMA2) instead
            of three: the code shifted to a mantissa bit whose magic is small (16 or 4) and the
            magic folded into the offset (``_dequant_pairs_lean``): 128 HSUB2 per 32-token tile
            and lane fewer, 72 shifts and offset fmas more. Not bit-identical: the folded offset is
            rounded to fp16 (within the bounds of the tests; a quality run decides adoption).
            INT4 keeps the three-instruction form (its four codes per half need a shift each).
            With ``keys="mma"`` the INT2 keys are dequantized this way too (not folded); with
            ``keys="mma_magic"`` only the values are (the keys stay on the magic MMA).
        tma: 0, or the slots of a ring that the Hopper tensor-memory accelerator fills with the sealed
            tiles (code words, key params, value params; ``_tma_issue``), ``tma - 1`` tiles in flight
            while a tile's math runs, each slot's arrival on an mbarrier: no per-lane address
            arithmetic and no register holds a tile in flight, the reads back are shared-memory loads
            (``_tma_read``); token scales stay global loads, one tile ahead. Needs sm_90 and the
            launcher's tensor descriptors (``gluon_tma_descriptors``); shared memory per program
            ``tma * (2 BLOCK_N W + D + BLOCK_N D/G_V) * 4`` bytes (3 KB per slot at INT2, D = 128,
            G_V = 32). Session 22's profile: a warp waited 1.63 cycles per issued instruction on
            global memory, the largest stall.
        tma_tiles: tiles per TMA transfer (1 or 2; with ``tma``): 2 issues the four copies, the page
            index load and the mbarrier wait once per two tiles of a page (a slot then holds both:
            twice the shared memory per slot), for half the issue overhead per tile.
        two_tiles: two tiles per loop step (``_attend2``; the register path without prefetch): both
            tiles' loads, key MMAs and logits before one softmax update, then both value MMAs, so the
            one warp has two independent dependency chains in flight (session 26: the magic keys'
            longer chain cost time at ~1 eligible warp per scheduler) and pays the cross-lane maximum
            once per two tiles.
        open_share: the open-page program (the new token's write, the open page's last tile) also takes
            an equal share of the sealed tiles: the sealed range is split over ``splits + 1``
            programs instead of ``splits``, so no program of the launch is a short one left for a
            partial last wave (measured on an H100, session 27: at 256 pairs the 2048 sealed programs
            filled one wave of 2112 slots and the 256 open-page ones, launched last, a second).
            Pays with a split count that fits the ``splits + 1`` programs per pair into the resident
            slots (timed with ``bench_decode.py --gluon-waves``; the launcher has no such rule: opt-in).
        page_pairs: with page-grid key ranges (``pair_words``), the lane that makes a key param word
            from the page grid also pairs it (one PRMT per pair, where each of the 8 lane rows paired
            all of its words after the hand-over), the grid's words and ``u`` serve both key groups of
            a 32-token tile, and both groups' pairs cross shared memory in one layout conversion
            (``_page_key_param_pairs_spread``). Bit-identical pairs. Session 31, sm_90 compile at
            groups 1-8: 872-889 -> 783-785 instructions per 32-token INT2 tile (946-962 -> 846-853 at
            INT4; 16-token tiles 522-524 -> 488-489), no stack (24-48 bytes before); whole steps on
            an H100 at (8, 32768) / (16, 65536): 6.2 / 7.8 % faster at INT2, 4.4 / 5.1 % at INT4
            (benches/results/kernels_gluon_s31/). The page default since.
        early_loads: the loads no store of the launch feeds are issued before its stores: the
            request's length, first page and open-page lookups (``_open_page``) before the query
            rotation and the write, and in the write (``_fused_write``) the new K/V (and, for the
            layer norm, every head's key) together with the slot's lookup, the stores masked by the
            slot instead of branched on it. Before, the open-page program ran the write's chain (slot
            -> staging slot -> K/V -> stores) and then the open page's (length -> page -> staging
            slot -> tile) one dependent load after another: ~7 memory round trips before its first
            math, ~4 now; the write's share of the step at 256-512 pairs, where the open-page
            programs run last, is that chain (session 27). Same values, same stores. Session 32,
            H100: the write's share unchanged (6.0-6.9 % at 256-512 pairs INT2), whole steps within
            1 % but 4-5 % faster at (32, 1024); not adopted (benches/results/kernels_gluon_s32/).
        min_tiles: at least this many sealed tiles per program (0: none): the sealed range is split
            into ``ceil(tiles / programs)`` tiles per program as before, but never fewer than
            ``min_tiles``, so at short contexts the last programs of a large grid get no sealed tile
            (an empty partial, log-sum-exp -inf) instead of one or two each. For single requests:
            a grid that fills the GPU at 131072 tokens (hundreds of splits per pair; a split count
            may not depend on lengths, one CUDA graph per batch size) without hundreds of one-tile
            programs at 4K tokens, where session 25 measured such a grid 0.69-0.76x the Triton step.
            Timed in session 33 (H200, "dnp_r128fslwnkm8" at the one-wave 263 splits): 1.13-1.15x the
            Triton step at (1, 131072), as without it, but 0.56-0.72x at 8K-32K, below the plain
            one-wave grid (0.72-0.83x): fewer, longer programs and as many empty ones. Not adopted
            (benches/results/kernels_gluon_s33/).
        block_n: the variant's own sealed tile (None: the tuning's ``block_n``); 64 spans two key
            groups of 32 (session 34: ``dnp_r1xxfslwn64``).
        l2_prefetch: ``prefetch.global.L2`` of sealed tiles' lines, one instruction per array (each
            lane a line; no register holds anything, so ptxas has no reason to move it): bit 0, the
            tile's value words and params right after its page index (ptxas sinks the tile's value
            loads below the first wait on its key loads, so a tile paid two memory round trips; the
            prefetch makes the second an L2 hit); bit 1, the whole next tile (key and value words and
            params, token scales) one tile ahead. Session 34 (H100 source-level profile of the
            default at (8, 32768) INT2): 38 % of the sealed loop's warp samples wait on global loads,
            9.5 % of them at the first use of the value params, issued after the keys' wait.
        lane_fwht: the fused variants' butterflies (the query rotation of every program, the
            partial's inverse rotation, the write's) by ``_fwht_lanes``: in a layout of their own,
            the upper index bits' stages as lane shuffles, where ``_fwht_rows`` converts the layout
            at each of the 7 stages; the query rotation over the GQA group's rows (``BLOCK_G``), not
            the MMA's padded ``BLOCK_H``. The same bits (sm_90 SASS of the fused paper default, the
            whole step: 6304 -> 4800 instructions, ~1100 fewer per program, shared memory 4 -> 1 KB).
            ptxas then schedules the sealed-tile loop differently (the same instructions, the value
            loads ~100 places earlier), which shows in the time: session 42, H100, whole steps side
            by side with the plain forms, 0.3-8.3 % less time at 16-128 requests at 8 KV heads (both
            formats, INT2 and INT4), but 2.7-9.5 % more at 2-4 (benches/results/kernels_s42/): the
            launcher's rule (``decode.GLUON_LANE_FWHT_PAIRS``).
    """

    name: str
    stages: int = 0
    maxnreg: int | None = None
    keys: str = "dequant"
    prefetch: bool = True
    packed: bool = False
    staging_block: int | None = None
    direct_staging: bool = False
    fused: bool = False
    spread_open: bool = False
    lazy_rescale: bool = False
    pair_words: bool = False
    lean_dequant: bool = False
    tma: int = 0
    tma_tiles: int = 1
    open_first: bool = False
    two_tiles: bool = False
    open_share: bool = False
    page_pairs: bool = False
    early_loads: bool = False
    min_tiles: int = 0
    block_n: int | None = None
    l2_prefetch: int = 0
    lane_fwht: bool = False

    @property
    def key_mode(self) -> int:
        """The kernel's ``KEYS`` constexpr."""
        return _KEY_MODES.index(self.keys)

    def constexprs(self) -> dict[str, object]:
        """The kernel's streaming constexprs for this variant (launcher, compile check, numpy check)."""
        return {"STAGES": self.stages, "KEYS": self.key_mode, "PREFETCH": self.prefetch,
                "PACKED": 2 if self.pair_words else self.packed,
                "DIRECT": self.direct_staging, "SPREAD": self.spread_open, "LAZY": self.lazy_rescale,
                "LEAN": self.lean_dequant, "TMA": self.tma, "TMA_TILES": self.tma_tiles, "OPEN_FIRST": self.open_first,
                "TWO": self.two_tiles, "OPEN_SHARE": self.open_share, "PAGE_PAIRS": self.page_pairs,
                "EARLY": self.early_loads, "MIN_TILES": self.min_tiles, "L2PF": self.l2_prefetch,
                "LANE_FWHT": self.lane_fwht}

    def __post_init__(self):
        if self.stages not in (0, 2, 3, 4):
            raise ValueError(f"GluonVariant.stages must be 0 (register prefetch) or 2..4 (cp.async ring), got {self.stages}")
        if self.keys not in _KEY_MODES:
            raise ValueError(f"GluonVariant.keys must be one of {', '.join(_KEY_MODES)}, got {self.keys!r}")
        if self.maxnreg is not None and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"GluonVariant.maxnreg must be in [24, 255] or None, got {self.maxnreg}")
        if not self.prefetch and self.stages:
            raise ValueError("GluonVariant.prefetch=False is the register path (stages 0): a cp.async ring always "
                             "streams ahead")
        if self.packed and (self.stages or self.keys not in ("dequant", "mma", "mma_magic")):
            raise ValueError("GluonVariant.packed pairs the params of the register path's keys (stages 0, keys "
                             "'dequant' or 'mma')")
        if self.keys in ("mma", "mma_magic") and not self.packed:
            raise ValueError(f"GluonVariant keys={self.keys!r} folds the key params the packed form pairs (packed=True)")
        if self.lane_fwht and not self.fused:
            raise ValueError("GluonVariant.lane_fwht: the butterflies are a fused variant's (fused=True)")
        if self.fused and (self.stages or self.keys not in ("dequant", "mma", "mma_magic")):
            raise ValueError("GluonVariant.fused takes the step's other parts into the register path (stages 0, keys "
                             "'dequant' or 'mma')")
        if self.spread_open and (self.stages or self.keys not in ("dequant", "mma", "mma_magic")):
            raise ValueError("GluonVariant.spread_open spreads the open page over the register path's splits "
                             "(stages 0, keys 'dequant' or 'mma')")
        if self.lean_dequant and (self.stages or self.keys not in ("dequant", "mma", "mma_magic")):
            raise ValueError("GluonVariant.lean_dequant is a form of the register path (stages 0, keys 'dequant' or "
                             "'mma')")
        if self.pair_words and not self.packed:
            raise ValueError("GluonVariant.pair_words is how the packed form pairs its key params (packed=True)")
        if self.lazy_rescale and (self.stages or self.keys not in ("dequant", "mma", "mma_magic")):
            raise ValueError("GluonVariant.lazy_rescale is a form of the register path (stages 0, keys 'dequant' or "
                             "'mma')")
        if self.tma and (self.tma not in (2, 3, 4) or self.prefetch or not self.pair_words):
            raise ValueError(f"GluonVariant.tma must be 0 (off) or a ring of 2..4 slots on the register path without "
                             f"prefetch whose key params are paired from words (prefetch=False, pair_words=True), got "
                             f"tma={self.tma}")
        if self.tma_tiles not in (1, 2) or (self.tma_tiles > 1 and not self.tma):
            raise ValueError(f"GluonVariant.tma_tiles (tiles per TMA transfer) must be 1, or 2 with a TMA ring, got "
                             f"{self.tma_tiles}")
        if self.two_tiles and (self.stages or self.prefetch or self.tma):
            raise ValueError("GluonVariant.two_tiles pairs the tiles of the register path that loads each tile "
                             "right before its math (stages 0, prefetch=False, no TMA ring)")
        if self.page_pairs and (not self.pair_words or self.tma):
            raise ValueError("GluonVariant.page_pairs is how the register path pairs page-grid key params made from "
                             "words (pair_words=True, no TMA ring)")
        if self.early_loads and (not self.spread_open or self.tma):
            raise ValueError("GluonVariant.early_loads orders the loads of the register path whose open page is spread "
                             "over the splits (spread_open=True, no TMA ring)")
        if not 0 <= self.min_tiles <= 1024:
            raise ValueError(f"GluonVariant.min_tiles must be in [0, 1024], got {self.min_tiles}")
        if self.l2_prefetch not in (0, 1, 2, 3) or (self.l2_prefetch and (self.stages or self.prefetch or self.tma
                                                                          or self.two_tiles)):
            raise ValueError(f"GluonVariant.l2_prefetch (0-3) is a form of the register path that loads each tile "
                             f"right before its math (stages 0, prefetch=False, no TMA ring, one tile per step), got "
                             f"{self.l2_prefetch}")
        if self.block_n not in (None, 16, 32, 64):
            raise ValueError(f"GluonVariant.block_n must be 16, 32, 64 or None (the tuning's), got {self.block_n}")
        if self.block_n == 64 and (self.keys != "dequant" or not self.pair_words or self.tma or self.stages):
            raise ValueError("GluonVariant.block_n=64 spans two key groups of 32 tokens: the register path with "
                             "dequantized keys paired from words (keys='dequant', pair_words=True, no TMA ring)")
        if self.staging_block not in (None, 16, 32):
            raise ValueError(f"GluonVariant.staging_block must be 16, 32 or None, got {self.staging_block}")


_KEY_MODES = ("dequant", "fold", "magic", "mma", "mma_magic")  # the KEYS constexpr of the kernel: 0 .. 4

#: The streaming of the session-29..32 defaults (lean INT2, everything fused, 128 registers) that
#: their later variants extend.
_LEAN_FUSED = dict(prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128, fused=True,
                   spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True)

GLUON_VARIANTS: dict[str, GluonVariant] = {
    v.name: v
    for v in (
        GluonVariant("regs1"),
        GluonVariant("regs1_r168", maxnreg=168),
        GluonVariant("cp2", stages=2),
        GluonVariant("cp3", stages=3),
        GluonVariant("cp4", stages=4),
        GluonVariant("cp3_r168", stages=3, maxnreg=168),
        GluonVariant("cp4_r128", stages=4, maxnreg=128),
        GluonVariant("fold", keys="fold"),
        GluonVariant("cp3_fold", stages=3, keys="fold"),
        GluonVariant("cp3_magic", stages=3, keys="magic"),
        # session 20 (timed in session 21): fewer registers, so more one-warp programs
        # per SM (time them at more programs per SM too: bench_decode.py --gluon-waves)
        GluonVariant("r16", packed=True, staging_block=16),
        GluonVariant("d16", packed=True, staging_block=16, direct_staging=True),
        GluonVariant("dnp", prefetch=False, packed=True, staging_block=16, direct_staging=True),
        GluonVariant("dnp_r128", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128),
        GluonVariant("dnp_r104", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=104),
        GluonVariant("d16f", packed=True, staging_block=16, direct_staging=True, fused=True),
        GluonVariant("dnp_r128f", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True),
        # session 21: the open page's tiles spread over the sealed splits (the last program keeps the
        # new token's tile), so one program no longer reads the whole open page at short contexts
        GluonVariant("d16fs", packed=True, staging_block=16, direct_staging=True, fused=True, spread_open=True),
        GluonVariant("dnp_r128fs", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True),
        GluonVariant("regs1s", spread_open=True),
        # session 22 (its fslw and fslwn forms timed in session 25): the running maximum moved only
        # when a tile outgrows it by > LAZY_TAU; 752 instead of 785 instructions per INT2 tile
        GluonVariant("dnp_r128fsl", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True),
        # the key params paired from whole words (one PRMT per pair), alone and with the lazy maximum
        GluonVariant("dnp_r128fsw", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, pair_words=True),
        GluonVariant("dnp_r128fslw", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True),
        # ... and the INT2 dequantization in two instructions per pair (offsets folded, rounded)
        GluonVariant("dnp_r128fslwn", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True),
        # session 23 (timed in session 25; dnp_r128fslwk the default since): the key params folded into the
        # query and an accumulator-input MMA (keys="mma"); with the lean INT2 form: lean at INT2, fold at INT4
        GluonVariant("dnp_r128fslwk", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma"),
        # session 26: the key codes into the MMA as the LOP3 makes them (2^(10-b) + code, no HSUB2), the
        # magic taken out by one more MMA of the same rounded q' (``_folded_keys(MAGIC)``)
        GluonVariant("dnp_r128fslwm", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma_magic"),
        # ... with the lean INT2 values (the keys stay on the magic MMA at both bit widths)
        GluonVariant("dnp_r128fslwnm", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True,
                     keys="mma_magic"),
        GluonVariant("dnp_r128fslwnk", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True, keys="mma"),
        # session 27: two tiles per loop step, their chains interleaved (``_attend2``); at the 128-register
        # cap and at 168 (12 programs per SM instead of 16)
        GluonVariant("dnp_r128fslwk2", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma", two_tiles=True),
        GluonVariant("dnp_r168fslwk2", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=168,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma", two_tiles=True),
        GluonVariant("dnp_r128fslwnk2", prefetch=False, packed=True, staging_block=16, direct_staging=True,
                     maxnreg=128, fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True,
                     keys="mma", two_tiles=True),
        # the open-page program takes a share of the sealed tiles (no short programs in a last wave)
        GluonVariant("dnp_r128fslwkx", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma", open_share=True),
        # ... and the default variant under lower register caps (more resident programs per SM: 17 at 120,
        # 18 at 112), the other lever the two-tile timings point to
        GluonVariant("dnp_r120fslwk", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=120,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma"),
        GluonVariant("dnp_r112fslwk", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=112,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma"),
        # session 26: the open-page programs (the new token's write, the open page's last tile) launched
        # first along the splits instead of last: in the last partial wave their write's latency was the
        # step's tail (H100: the write 5.3-5.9 us of the step at (64, 4096) / (32, 8192) with
        # dnp_r128fslwk, 2.1-3.5 us with dnp_r128fs)
        GluonVariant("dnp_r128fslwko", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, keys="mma", open_first=True),
        # ... and the sealed tiles streamed by the TMA into a ring of 3 slots (no register or address
        # arithmetic per tile in flight)
        GluonVariant("dnp_r128fslwt3", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, tma=3),
        GluonVariant("dnp_r128fslwt2", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, tma=2),
        # two tiles per TMA transfer (half the issue overhead; 2 slots of 6 KB at INT2)
        GluonVariant("dnp_r128fslwt2x2", prefetch=False, packed=True, staging_block=16, direct_staging=True,
                     maxnreg=128, fused=True, spread_open=True, lazy_rescale=True, pair_words=True, tma=2, tma_tiles=2),
        GluonVariant("dnp_r128fslwnkt2x2", prefetch=False, packed=True, staging_block=16, direct_staging=True,
                     maxnreg=128, fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True,
                     keys="mma", tma=2, tma_tiles=2),
        GluonVariant("dnp_r128fslwnkt3", prefetch=False, packed=True, staging_block=16, direct_staging=True,
                     maxnreg=128, fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True,
                     keys="mma", tma=3),
        # session 31: the page default (dnp_r128fslwn) with its page-grid key params paired where they are
        # made and both key groups of a tile handed over at once (``page_pairs``)
        GluonVariant("dnp_r128fslwnp", prefetch=False, packed=True, staging_block=16, direct_staging=True, maxnreg=128,
                     fused=True, spread_open=True, lazy_rescale=True, pair_words=True, lean_dequant=True,
                     page_pairs=True),
        # session 32: the two defaults with the loads no store feeds issued before the stores
        # (``early_loads``: the open-page program's write and open-page lookups in parallel)
        GluonVariant("dnp_r128fslwnke", **_LEAN_FUSED, keys="mma", early_loads=True),
        GluonVariant("dnp_r128fslwnpe", **_LEAN_FUSED, page_pairs=True, early_loads=True),
        # ... and the two defaults (one also with early loads) with the open-page program taking a
        # share of the sealed tiles (``open_share``: the default where ``decode.gluon_share_rule``
        # says so, at the one-wave split count; ``bench_decode.py --gluon-fit`` times them there)
        GluonVariant("dnp_r128fslwnkex", **_LEAN_FUSED, keys="mma", early_loads=True, open_share=True),
        GluonVariant("dnp_r128fslwnkx", **_LEAN_FUSED, keys="mma", open_share=True),
        GluonVariant("dnp_r128fslwnpx", **_LEAN_FUSED, page_pairs=True, open_share=True),
        # ... and the paper default with at least 8 sealed tiles per program (``min_tiles``), to time
        # single requests on a grid of hundreds of splits (``bench_decode.py --gluon-fit
        # --gluon-max-splits 512``)
        GluonVariant("dnp_r128fslwnkm8", **_LEAN_FUSED, keys="mma", min_tiles=8),
        # session 34: 64-token sealed tiles (two key groups of 32 per tile, dequantized keys): twice the
        # bytes in flight per round trip of a one-warp program, the per-tile overhead over twice the
        # tokens (H100: no faster than the default at 8-64 requests; kernels_gluon_s34/tiles64_h100)
        GluonVariant("dnp_r128fslwn64", **_LEAN_FUSED, block_n=64),
        GluonVariant("dnp_r144fslwn64", **{**_LEAN_FUSED, "maxnreg": 144}, block_n=64),
        GluonVariant("dnp_r168fslwn64", **{**_LEAN_FUSED, "maxnreg": 168}, block_n=64),
        # ... the default with the next tile prefetched into registers (rp_*), under higher caps, and
        # deeper TMA rings: for single requests, where the grid (8 one-warp programs per SM at 128
        # splits), not the registers, bounds the programs per SM (kernels_gluon_s34/pipe_h100)
        GluonVariant("rp_r128fslwnk", **{**_LEAN_FUSED, "prefetch": True}, keys="mma"),
        GluonVariant("rp_r152fslwnk", **{**_LEAN_FUSED, "maxnreg": 152, "prefetch": True}, keys="mma"),
        GluonVariant("rp_r168fslwnk", **{**_LEAN_FUSED, "maxnreg": 168, "prefetch": True}, keys="mma"),
        GluonVariant("rp_fslwnk", **{**_LEAN_FUSED, "maxnreg": None, "prefetch": True}, keys="mma"),
        GluonVariant("dnp_r144fslwnk", **{**_LEAN_FUSED, "maxnreg": 144}, keys="mma"),
        GluonVariant("dnp_r168fslwnk", **{**_LEAN_FUSED, "maxnreg": 168}, keys="mma"),
        GluonVariant("dnp_r168fslwnkt4", **{**_LEAN_FUSED, "maxnreg": 168}, keys="mma", tma=4),
        GluonVariant("dnp_r168fslwnkt4x2", **{**_LEAN_FUSED, "maxnreg": 168}, keys="mma", tma=4, tma_tiles=2),
        GluonVariant("dnp_r168fslwnkt3x2", **{**_LEAN_FUSED, "maxnreg": 168}, keys="mma", tma=3, tma_tiles=2),
        # ... and the sealed tiles' lines prefetched into L2 (``l2_prefetch``: v, the tile's own value
        # lines at its start; n, the next tile's; b, both); v on each of the launcher's four defaults
        # (the four defaults since session 34: kernels_gluon_s34/l2pf_h100, l2pf_defaults_h100)
        GluonVariant("dnp_r128fslwnkv", **_LEAN_FUSED, keys="mma", l2_prefetch=1),
        GluonVariant("dnp_r128fslwnkn", **_LEAN_FUSED, keys="mma", l2_prefetch=2),
        GluonVariant("dnp_r128fslwnkb", **_LEAN_FUSED, keys="mma", l2_prefetch=3),
        GluonVariant("dnp_r128fslwnkxv", **_LEAN_FUSED, keys="mma", open_share=True, l2_prefetch=1),
        GluonVariant("dnp_r128fslwnpv", **_LEAN_FUSED, page_pairs=True, l2_prefetch=1),
        GluonVariant("dnp_r128fslwnpxv", **_LEAN_FUSED, page_pairs=True, open_share=True, l2_prefetch=1),
        # session 48: the page default with the next tile's lines prefetched as well (b), the page-grid
        # counterpart of dnp_r128fslwnkb for single long requests. H100, whole steps, one request, INT2, every
        # length on it at 197 splits against the launcher's Triton step: 0.865x at 131072 tokens, 0.957x at
        # 65536, 1.108x at 32768 (the lane form dnp_r128fslwnpvh, long_gluon's default: 0.915x / 1.029x /
        # 1.155x; INT4 0.931x / 1.058x / 1.135x). Not timed as long_gluon's launch (kernels_s48)
        GluonVariant("dnp_r128fslwnpb", **_LEAN_FUSED, page_pairs=True, l2_prefetch=3),
        # session 49: a single request's Gluon stage 1 spends ~14 us of its time at 197 splits in work that
        # does not grow with the context (H100, session 47's call A: 13.7 us + 2.0 us per sealed tile of a
        # program), and ~1,400 of a program's instructions outside the sealed-tile loop (ncu at (1, 2048)),
        # half of them the query's rotation and the partial's inverse one. To time what that costs: the two
        # next-tile prefetch forms with the lane butterflies (h: long_gluon's forms), and the paper one
        # unfused (no f: the query rotation in the write's launch before it, the inverse rotation once per
        # query head in the merge after it, so no program rotates anything). Not timed yet (kernels_s49)
        GluonVariant("dnp_r128fslwnkbh", **_LEAN_FUSED, keys="mma", l2_prefetch=3, lane_fwht=True),
        GluonVariant("dnp_r128fslwnpbh", **_LEAN_FUSED, page_pairs=True, l2_prefetch=3, lane_fwht=True),
        GluonVariant("dnp_r128slwnkb", **{**_LEAN_FUSED, "fused": False}, keys="mma", l2_prefetch=3),
        # session 42: single requests again, now that the separate merge reads only the non-empty
        # splits' rows (``merge_one_pass``, up to 256 partials): the paper default with at least 4 / 8
        # sealed tiles per program on a one-wave grid of 255 splits (``--gluon-waves 15.5
        # --gluon-max-splits 255``), so a short request leaves the grid's last programs empty
        GluonVariant("dnp_r128fslwnkvm4", **_LEAN_FUSED, keys="mma", l2_prefetch=1, min_tiles=4),
        GluonVariant("dnp_r128fslwnkvm8", **_LEAN_FUSED, keys="mma", l2_prefetch=1, min_tiles=8),
        # ... and the four defaults with the butterflies in their own layout (``lane_fwht``, suffix h)
        GluonVariant("dnp_r128fslwnkvh", **_LEAN_FUSED, keys="mma", l2_prefetch=1, lane_fwht=True),
        GluonVariant("dnp_r128fslwnkxvh", **_LEAN_FUSED, keys="mma", open_share=True, l2_prefetch=1, lane_fwht=True),
        GluonVariant("dnp_r128fslwnpvh", **_LEAN_FUSED, page_pairs=True, l2_prefetch=1, lane_fwht=True),
        GluonVariant("dnp_r128fslwnpxvh", **_LEAN_FUSED, page_pairs=True, open_share=True, l2_prefetch=1,
                     lane_fwht=True),
    )
}
#: With ``GluonVariant.lazy_rescale``: how far (log2 units) a tile's logits may exceed the running
#: maximum before the loop moves it; probabilities stay <= 2^LAZY_TAU.
LAZY_TAU = 8.0
DEFAULT_GLUON_VARIANT = "regs1"


def gluon_variant(name: str) -> GluonVariant:
    """The registered variant ``name`` (ValueError naming the known ones otherwise)."""
    if name not in GLUON_VARIANTS:
        raise ValueError(f"unknown Gluon stage-1 variant {name!r}; known: {', '.join(GLUON_VARIANTS)}")
    return GLUON_VARIANTS[name]


def gluon_available(device: torch.device | None = None) -> str | None:
    """None when the Gluon stage 1 can run (on ``device``), else the reason it cannot."""
    import triton

    if GLUON_IMPORT_ERROR is not None:
        return f"triton.experimental.gluon does not import ({GLUON_IMPORT_ERROR})"
    if not triton.__version__.startswith("3.6."):
        return f"the Gluon stage 1 is written against Triton 3.6's Gluon API, this is Triton {triton.__version__}"
    if device is not None and (device.type != "cuda" or torch.version.hip is not None):
        return f"the Gluon stage 1 needs an NVIDIA GPU, got device {device}"
    if device is not None and torch.cuda.get_device_capability(device)[0] < 8:
        return "the Gluon stage 1 needs mma.sync (sm_80 or newer)"
    return None


def check_gluon_shape(*, bits: int, head_dim: int, k_group: int, v_group: int, block_n: int, group: int) -> None:
    """ValueError unless the Gluon stage 1 supports this layer and tile (the fragment mapping needs
    whole code words per lane, a value group that covers a lane's channels, and a key group that
    spans whole tiles)."""
    cpw = 32 // bits
    if head_dim // 8 % cpw or head_dim < 128:
        raise ValueError(f"the Gluon stage 1 needs head_dim a multiple of {8 * cpw} and >= 128 (whole code words per "
                         f"lane for keys and values), got head_dim={head_dim} at {bits} bits")
    if v_group % (head_dim // 8):
        raise ValueError(f"the Gluon stage 1 needs v_group a multiple of head_dim/8 = {head_dim // 8} (one value group "
                         f"per lane), got v_group={v_group}")
    if block_n not in (16, 32, 64) or (k_group % block_n and block_n != 2 * k_group):
        raise ValueError(f"the Gluon stage 1 needs block_n in (16, 32, 64) dividing k_group={k_group} (or twice it: two key "
                         f"groups per tile, check_gluon_key_groups), got block_n={block_n}")
    if group > 16:
        raise ValueError(f"the Gluon stage 1 takes at most 16 query heads per KV head, got {group}")


def page_u_constants(qmax: int) -> tuple[int, int]:
    """The f16x2 words (both halves) of ``h(1 / qmax)`` and ``-qmax``: the constants of the page
    grid's ``u = h(step / qmax)`` in three f16x2 operations (``_page_params_asm``)."""
    c = int(torch.tensor(1.0 / qmax, dtype=torch.float16).view(torch.int16).item()) & 0xFFFF
    m = int(torch.tensor(-float(qmax), dtype=torch.float16).view(torch.int16).item()) & 0xFFFF
    return c * 0x10001, m * 0x10001


def page_u_f16(step: torch.Tensor, qmax: int) -> torch.Tensor:
    """``u = h(step / qmax)`` as ``_page_params_asm`` computes it (every operation rounded to fp16;
    the products and sums exact in fp64 before the rounding): fp16 in, fp16 out. Tests compare it
    with the fp32 quotient rounded to fp16 (the reference's) over every fp16 value."""
    c = torch.tensor(1.0 / qmax, dtype=torch.float16).double()
    s = step.double()
    r = (s * c).half().double()
    e = (s - qmax * r).half().double()
    return (r + e * c).half()


def _page_params_asm(qmax: int) -> str:
    """The PTX of a channel pair's group (scale, offset) words ``$0``, ``$1``: ``h((b - a) u)`` and
    ``h(base + h(a step))`` from the index words ``$2`` (a) and ``$3`` (b) and the grid's step and
    base words ``$4``, ``$5``, with ``u = h(step / qmax)`` (``page_u_f16``)."""
    c, m = page_u_constants(qmax)
    return ("{\n"
            ".reg .b32 m, c, q, ta, tb, r, e;\n"
            "mov.b32 m, 0x64006400;\n"  # fp16 1024 in both halves
            f"mov.b32 c, 0x{c:08x};\n"  # h(1 / qmax)
            f"mov.b32 q, 0x{m:08x};\n"  # -qmax
            "prmt.b32 ta, $2, m, 0x5150;\n"  # (1024 + a_lo, 1024 + a_hi)
            "prmt.b32 tb, $3, m, 0x5150;\n"
            "sub.rn.f16x2 tb, tb, ta;\n"  # b - a, exact
            "sub.rn.f16x2 ta, ta, m;\n"  # a, exact
            "mul.rn.f16x2 r, $4, c;\n"  # r = step / qmax, to within an ulp
            "fma.rn.f16x2 e, r, q, $4;\n"  # e = step - qmax r
            "fma.rn.f16x2 r, e, c, r;\n"  # u, correctly rounded
            "mul.rn.f16x2 $0, tb, r;\n"  # scale = (b - a) * u
            "mul.rn.f16x2 ta, ta, $4;\n"  # a * step
            "add.rn.f16x2 $1, ta, $5;\n"  # offset = base + a * step
            "}")


def _page_u_asm(qmax: int) -> str:
    """The PTX of ``u = h(step / qmax)`` (``$0``) from the grid's step word ``$1``: the first three
    f16x2 operations of ``_page_params_asm``, for the grid words a tile's two key groups share."""
    c, m = page_u_constants(qmax)
    return ("{\n"
            ".reg .b32 c, q, r, e;\n"
            f"mov.b32 c, 0x{c:08x};\n"  # h(1 / qmax)
            f"mov.b32 q, 0x{m:08x};\n"  # -qmax
            "mul.rn.f16x2 r, $1, c;\n"
            "fma.rn.f16x2 e, r, q, $1;\n"
            "fma.rn.f16x2 $0, e, c, r;\n"
            "}")


#: The PTX of a channel pair's group (scale, offset) words ``$0``, ``$1`` from the index words ``$2``
#: (a), ``$3`` (b), ``u`` (``$4``, ``_page_u_asm``) and the grid's step and base words ``$5``, ``$6``:
#: the rest of ``_page_params_asm``.
_PAGE_GROUP_ASM = ("{\n"
                   ".reg .b32 m, ta, tb;\n"
                   "mov.b32 m, 0x64006400;\n"
                   "prmt.b32 ta, $2, m, 0x5150;\n"
                   "prmt.b32 tb, $3, m, 0x5150;\n"
                   "sub.rn.f16x2 tb, tb, ta;\n"
                   "sub.rn.f16x2 ta, ta, m;\n"
                   "mul.rn.f16x2 $0, tb, $4;\n"
                   "mul.rn.f16x2 ta, ta, $5;\n"
                   "add.rn.f16x2 $1, ta, $6;\n"
                   "}")


def check_gluon_key_groups(variant: str, *, block_n: int, k_group: int) -> None:
    """ValueError unless Gluon variant ``variant`` runs ``block_n``-token tiles over key groups of
    ``k_group`` tokens: a tile spans one group, or two (``block_n == 2 * k_group``, e.g. 32-token
    tiles at G_K 16) on the register path with dequantized keys whose params are paired from words
    (``_tile_raw`` loads both groups' pairs, ``_attend(KG2)`` gives each half of the rows its own)."""
    if block_n != 2 * k_group:
        return
    var = gluon_variant(variant)
    if not var.pair_words or var.tma or var.stages or var.keys != "dequant":
        able = ", ".join(n for n, v in GLUON_VARIANTS.items()
                         if v.pair_words and not v.tma and not v.stages and v.keys == "dequant")
        raise ValueError(f"Gluon variant {variant!r} takes one key group per tile; {block_n}-token tiles over key "
                         f"groups of {k_group} need a register-path variant with dequantized keys paired from words: "
                         f"{able}")


def check_gluon_key_page(variant: str) -> None:
    """ValueError unless Gluon variant ``variant`` reads page-grid key ranges (``key_ranges='page'``):
    the register path whose key params are paired from whole words (``pair_words``) without a TMA
    ring (``_page_key_param_pairs`` makes them from the page grid and the group's index bytes)."""
    var = gluon_variant(variant)
    if not var.pair_words or var.tma:
        able = ", ".join(n for n, v in GLUON_VARIANTS.items() if v.pair_words and not v.tma)
        raise ValueError(f"Gluon variant {variant!r} reads fp16 key params only; page-grid key ranges "
                         f"(key_ranges='page') need a variant that pairs them from words without a TMA ring: {able}")


if gl is not None:
    _LAZY_TAU = gl.constexpr(LAZY_TAU)
    _PAIR_ASM = gl.constexpr(
        "{\n"
        ".reg .b32 t;\n"
        "lop3.b32 t, $1, $2, $3, 0xea;\n"  # (x & mask) | magic: fp16 pair (2^(10-b) + c_lo, 2^(10-b) + c_hi)
        "sub.rn.f16x2 t, t, $3;\n"  # exact codes
        "fma.rn.f16x2 $0, t, $4, $5;\n"  # code * scale + offset, one rounding
        "}"
    )

    # page-grid key ranges (``_page_key_param_pairs``): a pair of channels' group scale
    # ``h((b - a) u)`` and offset ``h(base + h(a step))`` from their index bytes (int16: channel 2j in
    # the low byte) and the grid's f16x2 words, the indices as 1024 + a (exact) by a byte permute.
    # ``u = h(step / qmax)`` in three f16x2 operations: r = h(step c) with c = h(1 / qmax), the
    # residual e = h(step - qmax r) (one FMA), u = h(r + e c) (one FMA); the correctly rounded
    # quotient for every finite fp16 step >= 0 at qmax 3 and 15 (checked exhaustively against the
    # fp32 quotient rounded to fp16, tests/test_kernels_decode_gluon.py)
    _PAGE_ASM2 = gl.constexpr(_page_params_asm(3))
    _PAGE_ASM4 = gl.constexpr(_page_params_asm(15))
    _PAGE_U2 = gl.constexpr(_page_u_asm(3))
    _PAGE_U4 = gl.constexpr(_page_u_asm(15))
    _PAGE_GROUP = gl.constexpr(_PAGE_GROUP_ASM)
    # ``_lane_xor``: each lane takes the value of the same register of lane ``laneid ^ M`` (a butterfly
    # shuffle; every lane of the warp runs it: ``_fwht_lanes`` is never under divergent control flow)
    _SHFL1 = gl.constexpr("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;")
    _SHFL2 = gl.constexpr("shfl.sync.bfly.b32 $0, $1, 2, 0x1f, -1;")
    _SHFL4 = gl.constexpr("shfl.sync.bfly.b32 $0, $1, 4, 0x1f, -1;")
    _SHFL8 = gl.constexpr("shfl.sync.bfly.b32 $0, $1, 8, 0x1f, -1;")
    _SHFL16 = gl.constexpr("shfl.sync.bfly.b32 $0, $1, 16, 0x1f, -1;")

    @gluon.jit
    def _pair_operands(x, i, BITS: gl.constexpr):
        """For the code pair at bit ``(i % J) * BITS`` of both 16-bit halves of int32 ``x`` (``i >= J``:
        of the high bytes): the shifted word, its f16x2 mask and the f16x2 magic ``2^(10 - bpos)``
        whose mantissa the codes fill (LOP3 0xea)."""
        J: gl.constexpr = 8 // BITS
        QM: gl.constexpr = (1 << BITS) - 1
        bpos = (i % J) * BITS
        return x >> ((i // J) * 8), (QM << bpos) * 65537, ((25 - bpos) << 10) * 65537

    @gluon.jit
    def _halves_f16(t):
        """Int32 f16x2 -> its (low, high) fp16 halves."""
        return (t & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True), (t >> 16).to(gl.int16).to(gl.float16, bitcast=True)

    @gluon.jit
    def _dequant_pairs(x, i, s_pk, o_pk, BITS: gl.constexpr):
        """f16x2 (scale, offset) applied to the code pair at bit ``(i % J) * BITS`` of both 16-bit
        halves of int32 ``x`` -> the two fp16 values (low, high half)."""
        xs, mask, magic = _pair_operands(x, i, BITS)
        t = gl.inline_asm_elementwise(_PAIR_ASM, "=r,r,r,r,r,r", [xs, mask, magic, s_pk, o_pk], dtype=gl.int32,
                                      is_pure=True, pack=1)
        return _halves_f16(t)

    @gluon.jit
    def _dequant_pairs_lean(x, i, s_pk, o_pk):
        """``_dequant_pairs`` at INT2 in two instructions per pair instead of three (no HSUB2): code
        ``i`` of each 16-bit half is shifted to mantissa bit 6 (i even) or 8 (i odd), where the
        LOP3's magic is ``M`` = 16 or 4, and the fma takes the offset ``o' = o - M * scale``
        (one HFMA2 per (scale, offset) pair and ``M``, shared by every code that uses it):
        ``(M + c) * s + o'``. The shifts (``x << 6``, ``<< 2``, ``>> 2``, ``>> 6`` for codes 0-1,
        2-3, 4-5, 6-7) cost one per two codes of a half; bits shifted across the halves land
        outside the mask. ``o'`` is rounded to fp16 once: |o - M s| / 2^12 at most, at M <= 16
        ~70x below the INT2 quantization step's RMS error, the reason the small magics (not
        2^(10 - 2i) up to 1024) are used."""
        sig = 6 - 4 * (i // 2)  # the shift that brings code i to bit 6 or 8 of its half
        xs = (x << gl.maximum(sig, 0)) >> gl.maximum(0 - sig, 0)
        bpos = 6 + 2 * (i % 2)
        mask = (3 << bpos) * 65537
        magic = ((25 - bpos) << 10) * 65537
        negm = gl.where(i % 2 == 0, -872363008, -1006582784)  # f16x2 (-16, -16) / (-4, -4): 0xCC00CC00 / 0xC400C400
        o2 = gl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [s_pk, negm, o_pk],
                                       dtype=gl.int32, is_pure=True, pack=1)
        t = gl.inline_asm_elementwise("{\n.reg .b32 t;\nlop3.b32 t, $1, $2, $3, 0xea;\nfma.rn.f16x2 $0, t, $4, $5;\n}",
                                      "=r,r,r,r,r,r", [xs, mask, magic, s_pk, o2], dtype=gl.int32, is_pure=True, pack=1)
        return _halves_f16(t)

    @gluon.jit
    def _code_pairs(x, i, BITS: gl.constexpr, EXACT: gl.constexpr):
        """The code pair at bit ``(i % J) * BITS`` of both halves of ``x`` as fp16 (low, high half):
        ``2^(10 - bpos) + code`` straight from the LOP3 (``EXACT`` False), or the exact codes
        (one more HSUB2)."""
        xs, mask, magic = _pair_operands(x, i, BITS)
        if EXACT:
            t = gl.inline_asm_elementwise("{\n.reg .b32 t;\nlop3.b32 t, $1, $2, $3, 0xea;\nsub.rn.f16x2 $0, t, $3;\n}",
                                          "=r,r,r,r", [xs, mask, magic], dtype=gl.int32, is_pure=True, pack=1)
        else:
            t = gl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xea;", "=r,r,r,r", [xs, mask, magic],
                                          dtype=gl.int32, is_pure=True, pack=1)
        return _halves_f16(t)

    @gluon.jit
    def _pack_f16(a, b):
        """Two fp16 tensors -> int32 f16x2 pairs (a in the low half)."""
        lo = a.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        hi = b.to(gl.int16, bitcast=True).to(gl.int32) << 16
        return lo | hi

    @gluon.jit
    def _pair_words(a, b):
        """Int32 words of two tokens -> their low halves paired ``(a.lo, b.lo)`` and their high
        halves ``(a.hi, b.hi)``: one byte permute (PRMT) each."""
        lo = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, b], dtype=gl.int32,
                                       is_pure=True, pack=1)
        hi = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=gl.int32,
                                       is_pure=True, pack=1)
        return lo, hi

    @gluon.jit
    def _folded_keys(x4, k_i4, ks, ko, b_q, BITS: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr,
                     BLOCK_H: gl.constexpr, LK: gl.constexpr, MMA: gl.constexpr, LQP: gl.constexpr,
                     MAGIC: gl.constexpr = False):
        """``keys="mma"``: the operands of ``K q = sum_c (q_c s_c)(M_c + code_c) + sum_c q_c o'_c``
        over a tile whose key params are constant (G_K a multiple of BLOCK_N), with ``ks`` / ``ko``
        the packed (scale, offset) pairs ``[WPL, HALF, 4]``: the code operand ``[BLOCK_N, D]``
        (A), the scaled query ``q' = fp16(q * s)`` ``[D, BLOCK_H]`` (B; one HMUL2 per pair) and the
        per-head term ``q . o'`` as an accumulator ``[BLOCK_N, BLOCK_H]`` (an MMA of the offsets,
        broadcast over 16 rows, with the query). The codes are exact (LOP3 + HSUB2, ``M = 0``): the
        MMA's products ``q' M`` with the LOP3's magic ``M`` would carry q''s fp16 rounding times
        ``M + code`` (with the lean shift's ``M`` of 16 / 4 the numpy stand-in measured 7.1e-3
        relative RMS from the Triton kernel at INT2, twice ``lean_dequant``'s 3.6e-3).

        ``MAGIC`` (``keys="mma_magic"``): the codes as the LOP3 makes them, ``M_c + code_c`` with
        ``M_c = 2^(10 - bpos)`` (no HSUB2: one instruction per pair instead of two), and
        ``sum_c q'_c M_c`` taken out by one more MMA into the accumulator input, of the same
        rounded ``q'`` against a constant A operand of rows ``-M_c``: the products of fp16 values
        are exact in the fp32 accumulator, so the two terms cancel there up to its rounding
        (``2^-24`` of ``sum_c |q'_c| M_c``) instead of carrying ``q'``'s fp16 rounding times ``M``."""
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = D * BITS // 128
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        k_lo, k_hi = _code_pairs(x4, k_i4, BITS, not MAGIC)
        b_k = gl.convert_layout(gl.reshape(gl.join(k_lo, k_hi), [BLOCK_N, D]), A_OP, assert_trivial=True)
        # q' = q * s: the scale pair of k positions (p, p + 1) times the query pair of each head
        # (the query's pairs are its B-operand registers as they are: no instruction, no register)
        q_a, q_b = gl.split(gl.permute(gl.reshape(b_q, [WPL, HALF, 4, 2, BLOCK_H]), [0, 1, 2, 4, 3]))
        q_pk = gl.convert_layout(_pack_f16(q_a, q_b), LQP, assert_trivial=True)
        s4 = gl.expand_dims(gl.convert_layout(ks, gl.SliceLayout(3, LQP), assert_trivial=True), 3)
        s4, qp = gl.broadcast(s4, q_pk)
        qs = gl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [qp, s4], dtype=gl.int32, is_pure=True,
                                       pack=1)
        qs_lo, qs_hi = _halves_f16(qs)
        b_qs = gl.reshape(gl.permute(gl.join(qs_lo, qs_hi), [0, 1, 2, 4, 3]), [D, BLOCK_H])
        b_qs = gl.convert_layout(b_qs, B_OP, assert_trivial=True)
        # q . o': the offsets as 16 identical rows of an A operand, so every accumulator row is the term
        o16 = gl.expand_dims(ko, 0) + gl.zeros([16, WPL, HALF, 4], gl.int32, LK)
        o_lo, o_hi = _halves_f16(o16)
        a_o = gl.convert_layout(gl.reshape(gl.join(o_lo, o_hi), [16, D]), A_OP, assert_trivial=True)
        c16 = mma_v2(a_o, b_q, gl.zeros([16, BLOCK_H], gl.float32, MMA))
        if MAGIC:  # - sum_c q'_c M_c: 16 identical rows of -M_c (f16x2 of -2^(10 - bpos), a constant operand)
            J: gl.constexpr = 8 // BITS
            m_i = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LK))))
            m_h = (((25 - (m_i % J) * BITS) << 10) | 0x8000)  # the fp16 bits of -2^(10 - bpos)
            m_w = gl.expand_dims(gl.expand_dims(gl.expand_dims(m_h | (m_h << 16), 0), 1), 3)  # [1, 1, HALF, 1]
            m16 = m_w + gl.zeros([16, WPL, HALF, 4], gl.int32, LK)
            m_lo, m_hi = _halves_f16(m16)
            a_m = gl.convert_layout(gl.reshape(gl.join(m_lo, m_hi), [16, D]), A_OP, assert_trivial=True)
            c16 = mma_v2(a_m, b_qs, c16)
        if BLOCK_N == 16:
            c_s = c16
        else:  # 32: the same rows for both m-tiles
            c_s = gl.convert_layout(gl.reshape(gl.permute(gl.join(c16, c16), [2, 0, 1]), [BLOCK_N, BLOCK_H]), MMA)
        return b_k, b_qs, c_s

    @gluon.jit
    def _tile_ptrs(page, t0, i_h, kw_ptr, kp_ptr, vw_ptr, H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr,
                   P: gl.constexpr, G_K: gl.constexpr, BLOCK_N: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr):
        """The addresses of the wide part of tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page``
        (KV head ``i_h``), in the layouts whose lanes use them: key words ``[BLOCK_N, WPL, 4]``, key
        (scale, offset) halves ``[WPL, HALF, 4]`` x 2 x 2, value words of the even / odd tokens
        ``[WPLV, 8, BLOCK_N/2]``."""
        W: gl.constexpr = D * BITS // 32
        CPW: gl.constexpr = 32 // BITS
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = W // 4
        WPLV: gl.constexpr = W // 8
        NP: gl.constexpr = BLOCK_N // 2
        row0 = (page * H + i_h) * P + t0  # first token row of the tile (int64)

        # keys: words [BLOCK_N, WPL, 4] in the pair domain LK with the HALF axis sliced away
        LKW: gl.constexpr = gl.SliceLayout(2, LK)
        o_m = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, LKW)))
        o_wi = gl.arange(0, WPL, layout=gl.SliceLayout(0, gl.SliceLayout(2, LKW)))
        o_t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LKW)))
        off_k = (o_m[:, None, None] * W + o_t[None, None, :] * WPL + o_wi[None, :, None]).to(gl.int32)
        kw_p = kw_ptr + row0 * W + off_k

        # key params of the tile's group: [WPL, HALF, 4] for channel t*D/4 + wi*CPW + e*HALF + i
        LKP: gl.constexpr = gl.SliceLayout(0, LK)
        p_wi = gl.arange(0, WPL, layout=gl.SliceLayout(1, gl.SliceLayout(2, LKP)))
        p_i = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(2, LKP)))
        p_t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LKP)))
        c0 = p_t[None, None, :] * (D // 4) + p_wi[:, None, None] * CPW + p_i[None, :, None]
        kp_base = kp_ptr + ((page * H + i_h) * (P // G_K) + t0 // G_K) * (2 * D)

        # values: words of tokens 2tp / 2tp + 1 [WPLV, 8, NP], channels g*D/8 + wv*CPW + ...
        LVW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, LV))
        v_wv = gl.arange(0, WPLV, layout=gl.SliceLayout(1, gl.SliceLayout(2, LVW)))
        v_g = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, LVW)))
        v_tp = gl.arange(0, NP, layout=gl.SliceLayout(0, gl.SliceLayout(1, LVW)))
        off_v = ((2 * v_tp[None, None, :]) * W + v_g[None, :, None] * WPLV + v_wv[:, None, None]).to(gl.int32)
        vw0_p = vw_ptr + row0 * W + off_v
        return kw_p, kp_base + c0, kp_base + c0 + HALF, kp_base + D + c0, kp_base + D + c0 + HALF, vw0_p, vw0_p + W

    @gluon.jit
    def _param_word_offsets(D: gl.constexpr, BITS: gl.constexpr, SPREAD: gl.constexpr = False):
        """The word offsets ``[WPL, HALF/2, 4]`` (word j: channels 2j, 2j + 1 of a half) of the
        first half of each lane's key-param words within a row of D fp16, in the parent's order of
        ``_params_from_words``' inputs: the layout whose 8 lane rows (the tile's token rows) all
        hold the words their channels use. ``SPREAD``: the same offsets with each word held by one
        lane (lanes over the (wi, j, t) axes, no replication), where the page grid's params are made
        once per word, not once per lane row, before a layout conversion hands them to the 8 lane
        rows (``_page_key_param_pairs``)."""
        CPW: gl.constexpr = 32 // BITS
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = D * BITS // 128
        if SPREAD:  # lanes over (t, j, wi) without replication (32 // (HALF/2 * 4) lanes over wi)
            LW: gl.constexpr = 32 // (HALF // 2 * 4)
            LKW2: gl.constexpr = gl.BlockedLayout([WPL // LW, 1, 1], [LW, HALF // 2, 4], [1, 1, 1], [2, 1, 0])
        else:
            LKW2: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, WPL, HALF // 2, 1], [8, 1, 1, 4],
                                                                    [1, 1, 1, 1], [3, 2, 1, 0]))
        p_wi = gl.arange(0, WPL, layout=gl.SliceLayout(1, gl.SliceLayout(2, LKW2)))
        p_j = gl.arange(0, HALF // 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, LKW2)))
        p_t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LKW2)))
        return (p_t[None, None, :] * (D // 4) + p_wi[:, None, None] * CPW) // 2 + p_j[None, :, None]

    @gluon.jit
    def _key_param_pairs(page, t0, i_h, kp_ptr, H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr,
                         P: gl.constexpr, G_K: gl.constexpr, LK: gl.constexpr):
        """The tile's key (scale, offset) as the f16x2 pairs (channel c, channel c + HALF) of
        ``_tile_raw``'s packed form, ``[WPL, HALF, 4]`` in ``SliceLayout(0, LK)``, made from whole
        int32 words (two neighbouring channels each): one PRMT per pair (``_pair_words``) instead of
        the integer pairing of two fp16 loads (``_pack_f16``, ~1.8 instructions per pair)."""
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = D * BITS // 128
        w0 = _param_word_offsets(D, BITS)
        base = ((page * H + i_h) * (P // G_K) + t0 // G_K) * D  # in words: (2 * D) fp16 per group
        wp = kp_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + base + w0
        return _params_from_words(gl.load(wp), gl.load(wp + HALF // 2), gl.load(wp + D // 2),
                                  gl.load(wp + (D + HALF) // 2), WPL, HALF, LK)

    @gluon.jit
    def _page_key_param_pairs(page, t0, i_h, kp_ptr, kr_ptr, H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr,
                              P: gl.constexpr, G_K: gl.constexpr, LK: gl.constexpr):
        """``_key_param_pairs`` with page-grid key ranges (docs/LAYOUT.md §1, ``KEY_PAGE``): the
        tile's group (scale, offset) made from the page grid's (base, step) words (``kp_ptr``: fp16
        ``[.., 2, D]`` per (page, head)) and the group's index bytes (``kr_ptr``: int16 ``[.., P/G_K,
        2, D/2]``, channel 2j in the low byte), the words each lane loads at the offsets
        ``_key_param_pairs`` loads fp16 pairs at. fp16 arithmetic rounded at every operation as the
        reference's, per pair of channels: ``u = h(step / qmax)`` in three f16x2 operations
        (``page_u_f16``: the correctly rounded quotient), the indices as ``1024 + a`` by a byte
        permute, ``scale = h((b - a) u)``, ``offset = h(base + h(a step))``, in one asm block
        (``_page_params_asm``)."""
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = D * BITS // 128
        QMAX: gl.constexpr = (1 << BITS) - 1
        # each word made once, by one lane (``_param_word_offsets(SPREAD)``), then handed to the 8 lane
        # rows that use it by a layout conversion (shared memory: 4 STSM, 8 LDSM, 4 barriers per tile):
        # 8x fewer loads and param operations than every lane making its own. Session 25, sm_90
        # compile at group 4: 516 / 521 instructions per 16-token INT2 / INT4 tile (dnp_r128fslwk)
        # instead of 708 / 719, global loads 57 -> 25. (The same spread for the fp16 pairs of group
        # key ranges, 4 vector loads per lane, added instructions: 675 -> 708.)
        w0 = _param_word_offsets(D, BITS, True)
        gp = kp_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + (page * H + i_h) * D + w0  # D words per page grid
        rp = kr_ptr + ((page * H + i_h) * (P // G_K) + t0 // G_K) * D + w0  # D int16 per group
        s_a, o_a = _page_words(gp, rp, D, QMAX)  # the first half of each lane's code words
        s_b, o_b = _page_words(gp + HALF // 2, rp + HALF // 2, D, QMAX)  # the second
        LKW2: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, WPL, HALF // 2, 1], [8, 1, 1, 4], [1, 1, 1, 1],
                                                                [3, 2, 1, 0]))
        return _params_from_words(gl.convert_layout(s_a, LKW2), gl.convert_layout(s_b, LKW2),
                                  gl.convert_layout(o_a, LKW2), gl.convert_layout(o_b, LKW2), WPL, HALF, LK)

    @gluon.jit
    def _page_key_param_pairs_spread(page, t0, i_h, kp_ptr, kr_ptr, H: gl.constexpr, D: gl.constexpr,
                                     BITS: gl.constexpr, P: gl.constexpr, G_K: gl.constexpr, LK: gl.constexpr,
                                     NG: gl.constexpr):
        """``_page_key_param_pairs`` for the ``NG`` (1 or 2) key groups of a tile from token ``t0``
        (``GluonVariant.page_pairs``): the lane that makes a word (``_param_word_offsets(SPREAD)``) also
        pairs it (``_pair_words``: one PRMT per pair, once per word instead of once per lane row), the
        grid's words and ``u`` are loaded and made once for both groups, and the groups' (scale, offset)
        pairs cross to the 8 lane rows that use them in one layout conversion (one shared-memory round
        trip per tile instead of four per group). The same pairs, bit for bit. Returns ``(ks0, ko0, ks1,
        ko1)`` in ``SliceLayout(0, LK)`` (``ks1`` / ``ko1`` the first group's again when ``NG`` is 1)."""
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = D * BITS // 128
        w0 = _param_word_offsets(D, BITS, True)
        gp = kp_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + (page * H + i_h) * D + w0  # D words per page grid
        rp = kr_ptr + ((page * H + i_h) * (P // G_K) + t0 // G_K) * D + w0  # D int16 per group
        base_a = gl.load(gp)  # the grid words of the first half of each lane's code words
        step_a = gl.load(gp + D // 2)
        base_b = gl.load(gp + HALF // 2)  # ... and of the second
        step_b = gl.load(gp + (D + HALF) // 2)
        if BITS == 2:
            u_a = gl.inline_asm_elementwise(_PAGE_U2, "=r,r", [step_a], dtype=gl.int32, is_pure=True, pack=1)
            u_b = gl.inline_asm_elementwise(_PAGE_U2, "=r,r", [step_b], dtype=gl.int32, is_pure=True, pack=1)
        else:
            u_a = gl.inline_asm_elementwise(_PAGE_U4, "=r,r", [step_a], dtype=gl.int32, is_pure=True, pack=1)
            u_b = gl.inline_asm_elementwise(_PAGE_U4, "=r,r", [step_b], dtype=gl.int32, is_pure=True, pack=1)
        ks, ko = _page_group_pairs(rp, u_a, step_a, base_a, u_b, step_b, base_b, D, HALF, WPL, LK)
        if NG == 2:
            ks1, ko1 = _page_group_pairs(rp + D, u_a, step_a, base_a, u_b, step_b, base_b, D, HALF, WPL, LK)
            return ks, ko, ks1, ko1
        else:
            return ks, ko, ks, ko

    @gluon.jit
    def _page_group_pairs(rp, u_a, step_a, base_a, u_b, step_b, base_b, D: gl.constexpr, HALF: gl.constexpr,
                          WPL: gl.constexpr, LK: gl.constexpr):
        """One key group's (scale, offset) f16x2 pairs ``[WPL, HALF, 4]`` (channels ``c``, ``c + HALF``)
        in the spread layout of its index words at ``rp`` (``a``; ``b`` ``D/2`` on), from the grid's
        words and ``u`` of both halves of each lane's code words (``_page_key_param_pairs_spread``)."""
        ra = gl.load(rp).to(gl.int32)
        rb = gl.load(rp + D // 2).to(gl.int32)
        s_a, o_a = gl.inline_asm_elementwise(_PAGE_GROUP, "=r,=r,r,r,r,r,r", [ra, rb, u_a, step_a, base_a],
                                             dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        ra = gl.load(rp + HALF // 2).to(gl.int32)
        rb = gl.load(rp + (D + HALF) // 2).to(gl.int32)
        s_b, o_b = gl.inline_asm_elementwise(_PAGE_GROUP, "=r,=r,r,r,r,r,r", [ra, rb, u_b, step_b, base_b],
                                             dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        s_lo, s_hi = _pair_words(s_a, s_b)
        o_lo, o_hi = _pair_words(o_a, o_b)
        ks = gl.reshape(gl.permute(gl.join(s_lo, s_hi), [0, 1, 3, 2]), [WPL, HALF, 4])
        ko = gl.reshape(gl.permute(gl.join(o_lo, o_hi), [0, 1, 3, 2]), [WPL, HALF, 4])
        # to the lane rows that use them: scales and offsets in one conversion (one shared-memory round trip)
        LKP: gl.constexpr = gl.SliceLayout(0, LK)
        z = gl.zeros([WPL, HALF, 4], gl.int32, LKP)
        ks, ko = gl.split(gl.convert_layout(gl.join(ks, ko), gl.join(z, z).type.layout))
        return gl.convert_layout(ks, LKP, assert_trivial=True), gl.convert_layout(ko, LKP, assert_trivial=True)

    @gluon.jit
    def _page_words(gp, rp, D: gl.constexpr, QMAX: gl.constexpr):
        """The group's (scale, offset) f16x2 words of channel pairs from the page grid's words at
        ``gp`` (bases; steps ``D/2`` words on) and the group's index words at ``rp`` (``a``; ``b``
        ``D/2`` on)."""
        base = gl.load(gp)
        step = gl.load(gp + D // 2)
        ra = gl.load(rp).to(gl.int32)
        rb = gl.load(rp + D // 2).to(gl.int32)
        if QMAX == 3:
            s_w, o_w = gl.inline_asm_elementwise(_PAGE_ASM2, "=r,=r,r,r,r,r", [ra, rb, step, base],
                                                 dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        else:
            s_w, o_w = gl.inline_asm_elementwise(_PAGE_ASM4, "=r,=r,r,r,r,r", [ra, rb, step, base],
                                                 dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        return s_w, o_w

    @gluon.jit
    def _params_from_words(s_a, s_b, o_a, o_b, WPL: gl.constexpr, HALF: gl.constexpr, LK: gl.constexpr):
        """The key (scale, offset) f16x2 pairs ``[WPL, HALF, 4]`` in ``SliceLayout(0, LK)`` from the
        words ``[WPL, HALF/2, 4]`` of the scales and offsets, each of two neighbouring channels, of
        the first (``_a``) and second (``_b``) half of each lane's code words: one PRMT per pair."""
        LKP: gl.constexpr = gl.SliceLayout(0, LK)
        s_lo, s_hi = _pair_words(s_a, s_b)
        o_lo, o_hi = _pair_words(o_a, o_b)
        ks = gl.reshape(gl.permute(gl.join(s_lo, s_hi), [0, 1, 3, 2]), [WPL, HALF, 4])
        ko = gl.reshape(gl.permute(gl.join(o_lo, o_hi), [0, 1, 3, 2]), [WPL, HALF, 4])
        return gl.convert_layout(ks, LKP, assert_trivial=True), gl.convert_layout(ko, LKP, assert_trivial=True)

    @gluon.jit
    def _tma_issue(slot, bars, kw_b, kp_b, vw_b, vp_b, kw_desc, kp_desc, vw_desc, vp_desc, page, t0, i_h, pred,
                   H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr, G_K: gl.constexpr,
                   G_V: gl.constexpr, BLOCK_N: gl.constexpr, TT: gl.constexpr = 1):
        """The ``TT`` sealed tiles from token ``t0`` of page ``page`` (KV head ``i_h``) by TMA into
        ring slot ``slot``, all four parts on the slot's mbarrier (``pred`` False: nothing issued):
        key and value code words ``[TT*BLOCK_N, W]``, the key groups' (scales, offsets) rows ``[KR,
        D]`` words (KR = the groups the tiles touch) and the value params, ``TT * BLOCK_N * 2 *
        D/G_V`` fp16 as rows of 8 (``gluon_tma_descriptors``)."""
        W: gl.constexpr = D * BITS // 32
        NG: gl.constexpr = D // G_V
        KR: gl.constexpr = max(1, TT * BLOCK_N // G_K)
        row0 = ((page * H + i_h) * P + t0).to(gl.int32)
        bar = bars.index(slot)
        mbarrier.expect(bar, 8 * TT * BLOCK_N * W + 4 * KR * D + 4 * TT * BLOCK_N * NG, pred=pred)
        tma.async_copy_global_to_shared(kw_desc, [row0, 0], bar, kw_b.index(slot), pred=pred)
        tma.async_copy_global_to_shared(vw_desc, [row0, 0], bar, vw_b.index(slot), pred=pred)
        tma.async_copy_global_to_shared(kp_desc, [((page * H + i_h) * (P // G_K) + t0 // G_K).to(gl.int32), 0], bar,
                                        kp_b.index(slot), pred=pred)
        tma.async_copy_global_to_shared(vp_desc, [row0 * NG // 4, 0], bar, vp_b.index(slot), pred=pred)

    @gluon.jit
    def _tma_read(slot, sub, kw_b, kp_b, vw_b, vp_b, D: gl.constexpr, BITS: gl.constexpr, G_K: gl.constexpr,
                  G_V: gl.constexpr, BLOCK_N: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, LTK: gl.constexpr,
                  LTV: gl.constexpr, LTP: gl.constexpr, TT: gl.constexpr = 1):
        """Tile ``sub`` (of the ``TT`` a transfer holds) of ring slot ``slot`` read back in the
        operand-domain layouts, as ``_tile_raw`` returns them (packed form): key words ``[BLOCK_N,
        WPL, 4]``, key (scale, offset) pairs ``[WPL, HALF, 4]``, value words of the even / odd tokens
        ``[WPLV, 8, NP]`` and the value (scale, offset) pairs of each token pair ``[8, NP]``. Each is
        a view of the slot's bytes (``_reinterpret`` with a plain strided shared layout, the
        transfer's tile the slowest axis) loaded in a layout whose lanes hold what their operand
        registers use; the splits and reshapes after the loads are register renamings
        (``assert_trivial``)."""
        W: gl.constexpr = D * BITS // 32
        HALF: gl.constexpr = 16 // BITS
        WPL: gl.constexpr = W // 4
        WPLV: gl.constexpr = W // 8
        NP: gl.constexpr = BLOCK_N // 2
        NG: gl.constexpr = D // G_V
        KR: gl.constexpr = max(1, TT * BLOCK_N // G_K)
        # key words: word (sub*BLOCK_N + m)*W + t*WPL + wi
        SK: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 2, 0])  # (the leading axis: the buffer's)
        kw = kw_b.index(slot)._reinterpret(gl.int32, [TT, BLOCK_N, WPL, 4], SK).index(sub).load(gl.SliceLayout(2, LK))
        # key params: word r*D + so*D/2 + t*D/8 + wi*HALF + hh*HALF/2 + j as [r, 1, wi, j, t, so, hh]
        SP: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 5, 1, 3, 4, 0])
        kp = kp_b.index(slot)._reinterpret(gl.int32, [KR, 1, WPL, HALF // 2, 4, 2, 2], SP).index(
            (sub * BLOCK_N) // G_K).load(LTK)
        h_a, h_b = gl.split(gl.reshape(kp, [WPL, HALF // 2, 4, 2, 2]))
        s_a, o_a = gl.split(h_a)
        s_b, o_b = gl.split(h_b)
        LKW2: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, WPL, HALF // 2, 1], [8, 1, 1, 4], [1, 1, 1, 1],
                                                                [3, 2, 1, 0]))
        ks, ko = _params_from_words(gl.convert_layout(s_a, LKW2, assert_trivial=True),
                                    gl.convert_layout(s_b, LKW2, assert_trivial=True),
                                    gl.convert_layout(o_a, LKW2, assert_trivial=True),
                                    gl.convert_layout(o_b, LKW2, assert_trivial=True), WPL, HALF, LK)
        # value words: word (sub*BLOCK_N + 2tp + par)*W + g*WPLV + wv as [sub, wv, g, tp, par]
        SV: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0, 1, 3, 2])
        vw = vw_b.index(slot)._reinterpret(gl.int32, [TT, WPLV, 8, NP, 2], SV).index(sub).load(LTV)
        vw0, vw1 = gl.split(vw)
        LVW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, LV))
        vw0 = gl.convert_layout(vw0, LVW, assert_trivial=True)
        vw1 = gl.convert_layout(vw1, LVW, assert_trivial=True)
        # value params: fp16 (sub*BLOCK_N + 2tp + par)*2NG + so*NG + q as [sub, q, tp, so, par]; lane
        # (g, t) takes group q = g // (8/NG): loaded once per group of lanes (LTP's lane bases),
        # broadcast to g
        SQ: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0, 2, 3, 1])
        vp = vp_b.index(slot)._reinterpret(gl.float16, [TT, NG, NP, 2, 2], SQ).index(sub).load(gl.SliceLayout(1, LTP))
        vp = gl.broadcast(gl.expand_dims(vp, 1), gl.zeros([NG, 8 // NG, NP, 2, 2], gl.float16, LTP))[0]
        p_e, p_o = gl.split(gl.reshape(vp, [8, NP, 2, 2]))  # even / odd token of each pair
        vs_e, vo_e = gl.split(p_e)
        vs_o, vo_o = gl.split(p_o)
        LVP: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LV)))
        vs = _pack_f16(gl.convert_layout(vs_e, LVP, assert_trivial=True), gl.convert_layout(vs_o, LVP, assert_trivial=True))
        vo = _pack_f16(gl.convert_layout(vo_e, LVP, assert_trivial=True), gl.convert_layout(vo_o, LVP, assert_trivial=True))
        return kw, ks, ko, vw0, vw1, vs, vo

    @gluon.jit
    def _row_partials(l_i, BLOCK_N: gl.constexpr, MMA: gl.constexpr):
        """A running sum ``[BLOCK_H]`` as per-lane partials ``[8, BLOCK_H]`` (``_fold_rows``'s layout):
        ``lazy_rescale``'s sealed loop adds each tile's probabilities to them without a cross-lane
        reduction; ``gl.sum(axis=0)`` after the loop gives the sum back."""
        o_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
        return _fold_rows(gl.where((o_r == 0)[:, None], l_i[None, :], 0.0), BLOCK_N)

    @gluon.jit
    def _row_total(l_i, MMA: gl.constexpr):
        """``_row_partials``' sum back: ``[BLOCK_H]`` in ``SliceLayout(0, MMA)``."""
        return gl.convert_layout(gl.sum(l_i, axis=0), gl.SliceLayout(0, MMA))

    @gluon.jit
    def _fold_rows(x, BLOCK_N: gl.constexpr):
        """``[BLOCK_N, BLOCK_H]`` in the MMA layout -> ``[8, BLOCK_H]``: the rows a lane holds (row
        bits 3 and up are registers) summed inside the lane, no cross-lane step."""
        return gl.sum(gl.reshape(x, [BLOCK_N // 8, 8, x.shape[1]]), axis=0)

    @gluon.jit
    def _tile_scales(page, t0, s_col, scale_ptr, P: gl.constexpr, S: gl.constexpr, BLOCK_N: gl.constexpr,
                     LS: gl.constexpr):
        """Token scales s_t of tokens ``[t0, t0 + BLOCK_N)`` of page ``page`` ``[BLOCK_N]`` (the logits'
        rows; ones when the pool has none)."""
        o_s = gl.arange(0, BLOCK_N, layout=LS)
        if S > 0:
            st = gl.load(scale_ptr + (page * P + t0 + o_s) * S + s_col)
        else:
            st = gl.full([BLOCK_N], 1.0, gl.float32, LS)
        return st

    @gluon.jit
    def _tile_small(page, t0, i_h, s_col, vp_ptr, scale_ptr, H: gl.constexpr, D: gl.constexpr, P: gl.constexpr,
                    G_V: gl.constexpr, S: gl.constexpr, BLOCK_N: gl.constexpr, LV: gl.constexpr, LS: gl.constexpr):
        """The narrow part of the tile: token scales s_t ``[BLOCK_N]`` (the logits' rows) and the value
        params of the lane's group for the even / odd tokens of each pair ``[8, BLOCK_N/2]`` x 2 x 2
        (2-byte loads: below cp.async's minimum, so always loaded into registers)."""
        NG: gl.constexpr = D // G_V
        NP: gl.constexpr = BLOCK_N // 2
        row0 = (page * H + i_h) * P + t0
        st = _tile_scales(page, t0, s_col, scale_ptr, P, S, BLOCK_N, LS)
        LVP: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LV)))
        q_g = gl.arange(0, 8, layout=gl.SliceLayout(1, LVP))
        q_tp = gl.arange(0, NP, layout=gl.SliceLayout(0, LVP))
        off_p = ((2 * q_tp[None, :]) * (2 * NG) + (q_g[:, None] * (D // 8)) // G_V).to(gl.int32)
        vp_base = vp_ptr + row0 * (2 * NG)
        vs0 = gl.load(vp_base + off_p)
        vs1 = gl.load(vp_base + 2 * NG + off_p)
        vo0 = gl.load(vp_base + NG + off_p)
        vo1 = gl.load(vp_base + 3 * NG + off_p)
        return st, vs0, vs1, vo0, vo1

    @gluon.jit
    def _tile_raw(page, t0, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr, H: gl.constexpr, D: gl.constexpr,
                  BITS: gl.constexpr, P: gl.constexpr, G_K: gl.constexpr, G_V: gl.constexpr, S: gl.constexpr,
                  BLOCK_N: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, LS: gl.constexpr,
                  PACKED: gl.constexpr = False, kr_ptr=None, KEY_PAGE: gl.constexpr = False,
                  PAGE_PAIRS: gl.constexpr = False):
        """The stored bytes of tokens ``[t0, t0 + BLOCK_N)`` of sealed page ``page`` (KV head
        ``i_h``) in registers, each lane loading exactly the words and params its operand registers
        use (``_tile_ptrs`` and ``_tile_small``). ``PACKED``: the key and value (scale, offset)
        already paired into int32 f16x2 words (in ``ks0`` / ``ko0`` / ``vs0`` / ``vo0``; ``ks1`` /
        ``ko1`` / ``vs1`` / ``vo1`` then unused, except ``ks1`` / ``ko1`` with ``PACKED == 2`` and
        ``BLOCK_N == 2 * G_K``: the tile's second key group), half the registers a prefetched tile
        holds for them.
        ``KEY_PAGE`` (with ``PACKED == 2``): page-grid key ranges, ``kp_ptr`` the page grids and
        ``kr_ptr`` the groups' index bytes (``_page_key_param_pairs``; ``PAGE_PAIRS``:
        ``_page_key_param_pairs_spread``)."""
        kw_p, ks0_p, ks1_p, ko0_p, ko1_p, vw0_p, vw1_p = _tile_ptrs(page, t0, i_h, kw_ptr, kp_ptr, vw_ptr, H, D, BITS, P,
                                                                     G_K, BLOCK_N, LK, LV)
        kw = gl.load(kw_p)
        if PACKED == 2 and KEY_PAGE and PAGE_PAIRS:  # ... paired where made, one hand-over per tile
            ks0, ko0, ks1, ko1 = _page_key_param_pairs_spread(page, t0, i_h, kp_ptr, kr_ptr, H, D, BITS, P, G_K, LK,
                                                              2 if BLOCK_N > G_K else 1)
        elif PACKED == 2 and KEY_PAGE:  # page-grid key ranges: the params made from the grid and indices
            ks0, ko0 = _page_key_param_pairs(page, t0, i_h, kp_ptr, kr_ptr, H, D, BITS, P, G_K, LK)
            if BLOCK_N > G_K:  # two key groups per tile: the second's in ks1 / ko1 (``_attend(KG2)``)
                ks1, ko1 = _page_key_param_pairs(page, t0 + G_K, i_h, kp_ptr, kr_ptr, H, D, BITS, P, G_K, LK)
            else:
                ks1 = ks0
                ko1 = ko0
        elif PACKED == 2:  # GluonVariant.pair_words: the key params paired from whole words
            ks0, ko0 = _key_param_pairs(page, t0, i_h, kp_ptr, H, D, BITS, P, G_K, LK)
            if BLOCK_N > G_K:
                ks1, ko1 = _key_param_pairs(page, t0 + G_K, i_h, kp_ptr, H, D, BITS, P, G_K, LK)
            else:
                ks1 = ks0
                ko1 = ko0
        else:
            ks0 = gl.load(ks0_p)
            ks1 = gl.load(ks1_p)
            ko0 = gl.load(ko0_p)
            ko1 = gl.load(ko1_p)
        st, vs0, vs1, vo0, vo1 = _tile_small(page, t0, i_h, s_col, vp_ptr, scale_ptr, H, D, P, G_V, S, BLOCK_N, LV, LS)
        vw0 = gl.load(vw0_p)
        vw1 = gl.load(vw1_p)
        if PACKED:
            if PACKED != 2:
                ks0 = _pack_f16(ks0, ks1)
                ko0 = _pack_f16(ko0, ko1)
            vs0 = _pack_f16(vs0, vs1)
            vo0 = _pack_f16(vo0, vo1)
        return kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1

    @gluon.jit
    def _gdc_wait(x):
        """``griddepcontrol.wait``: in a programmatic dependent launch (``PDL``), wait for the launch
        before it and see its stores (``x``: any scalar, the asm's operand); a no-op otherwise."""
        gl.inline_asm_elementwise("griddepcontrol.wait;\nmov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _gdc_launch_dependents(x):
        """``griddepcontrol.launch_dependents``: the programmatic dependent launch after this one (the
        merge's, ``LAUNCH_DEPENDENTS``) may be scheduled; it still waits for this whole launch
        before it reads (``x``: any scalar, the asm's operand)."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents;\nmov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _l2_prefetch(ptrs):
        """``prefetch.global.L2`` of each lane's address (a pointer tensor, one element per lane): no
        result register, so nothing for ptxas to shorten by moving it toward a use."""
        gl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [ptrs], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _l2_prefetch_tile(page, t0, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr, H: gl.constexpr,
                          D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr, G_K: gl.constexpr,
                          G_V: gl.constexpr, S: gl.constexpr, BLOCK_N: gl.constexpr, KEYS_TOO: gl.constexpr,
                          kr_ptr=None, KEY_PAGE: gl.constexpr = False):
        """The 128-byte lines of sealed tile ``[t0, t0 + BLOCK_N)`` of page ``page`` (KV head ``i_h``)
        prefetched into L2 (``GluonVariant.l2_prefetch``), lane ``l`` a line of each array (lines
        repeat over the lanes where an array has fewer): the value words and params, and with
        ``KEYS_TOO`` the key words, the key group's params (``KEY_PAGE``: the page's grid and the
        tile's groups' index bytes, ``_page_key_param_pairs_spread``'s addresses) and the token scales
        (their column)."""
        W: gl.constexpr = D * BITS // 32
        NG: gl.constexpr = D // G_V
        L32: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        lane = gl.arange(0, 32, layout=L32)
        row0 = (page * H + i_h) * P + t0
        WL: gl.constexpr = BLOCK_N * W // 32  # 128-byte lines of a tile's words (int32)
        VPL: gl.constexpr = max(1, BLOCK_N * 2 * NG // 64)  # ... of its value params (fp16)
        _l2_prefetch(vw_ptr + row0 * W + (lane % WL) * 32)
        _l2_prefetch(vp_ptr + row0 * (2 * NG) + (lane % VPL) * 64)
        if KEYS_TOO:
            _l2_prefetch(kw_ptr + row0 * W + (lane % WL) * 32)
            if KEY_PAGE:
                GPL: gl.constexpr = max(1, 4 * D // 128)  # lines of the page's grid (D int32 words)
                RPL: gl.constexpr = max(1, max(1, BLOCK_N // G_K) * 2 * D // 128)  # ... of the tile's groups' indices
                gp = kp_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + (page * H + i_h) * D
                _l2_prefetch(gp + (lane % GPL) * 32)
                _l2_prefetch(kr_ptr + ((page * H + i_h) * (P // G_K) + t0 // G_K) * D + (lane % RPL) * 64)
            else:
                KPL: gl.constexpr = max(1, 2 * D // 64)  # lines of one key group's params (fp16)
                _l2_prefetch(kp_ptr + ((page * H + i_h) * (P // G_K) + t0 // G_K) * (2 * D) + (lane % KPL) * 64)
            if S == 1:  # one column: the tile's scales are one contiguous run
                _l2_prefetch(scale_ptr + (page * P + t0) + (lane % max(1, BLOCK_N // 32)) * 32)

    @gluon.jit
    def _tile_issue(slot, page, t0, i_h, kw_ptr, kp_ptr, vw_ptr, kw_s, ks0_s, ks1_s, ko0_s, ko1_s, vw0_s, vw1_s,
                    H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr, G_K: gl.constexpr,
                    BLOCK_N: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr):
        """cp.async of the tile's wide part (``_tile_ptrs``) into ring slot ``slot``, one commit group.
        The shared buffers have the pointer tensors' shapes and layouts matching their global order,
        so the lane that reads an element back (``_tile_smem``) reads the contiguous words it needs."""
        kw_p, ks0_p, ks1_p, ko0_p, ko1_p, vw0_p, vw1_p = _tile_ptrs(page, t0, i_h, kw_ptr, kp_ptr, vw_ptr, H, D, BITS, P,
                                                                     G_K, BLOCK_N, LK, LV)
        async_copy.async_copy_global_to_shared(kw_s.index(slot), kw_p)
        async_copy.async_copy_global_to_shared(ks0_s.index(slot), ks0_p)
        async_copy.async_copy_global_to_shared(ks1_s.index(slot), ks1_p)
        async_copy.async_copy_global_to_shared(ko0_s.index(slot), ko0_p)
        async_copy.async_copy_global_to_shared(ko1_s.index(slot), ko1_p)
        async_copy.async_copy_global_to_shared(vw0_s.index(slot), vw0_p)
        async_copy.async_copy_global_to_shared(vw1_s.index(slot), vw1_p)
        async_copy.commit_group()

    @gluon.jit
    def _tile_smem(slot, kw_s, ks0_s, ks1_s, ko0_s, ko1_s, vw0_s, vw1_s, LK: gl.constexpr, LV: gl.constexpr):
        """The wide part of the tile in ring slot ``slot``, read back in the operand-domain layouts."""
        LKW: gl.constexpr = gl.SliceLayout(2, LK)
        LKP: gl.constexpr = gl.SliceLayout(0, LK)
        LVW: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, LV))
        kw = kw_s.index(slot).load(LKW)
        ks0 = ks0_s.index(slot).load(LKP)
        ks1 = ks1_s.index(slot).load(LKP)
        ko0 = ko0_s.index(slot).load(LKP)
        ko1 = ko1_s.index(slot).load(LKP)
        vw0 = vw0_s.index(slot).load(LVW)
        vw1 = vw1_s.index(slot).load(LVW)
        return kw, ks0, ks1, ko0, ko1, vw0, vw1

    @gluon.jit
    def _tile_logits(b_q, kw, ks0, ks1, ko0, ko1, st, sm_scale_log2, D: gl.constexpr, BITS: gl.constexpr,
                     BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, LK: gl.constexpr, MMA: gl.constexpr,
                     KEYS: gl.constexpr = 0, PACKED: gl.constexpr = False, tok0=0, lo=0, WINDOW: gl.constexpr = False,
                     LEAN: gl.constexpr = False, LQP: gl.constexpr = None, KG2: gl.constexpr = False):
        """A sealed tile's logits ``[BLOCK_N, BLOCK_H]`` in log2 units (``_attend``'s keys half): the
        keys dequantized (or their codes with the params folded, ``KEYS``) into ``mma_v2``'s A operand,
        times the token scales and ``sm_scale_log2``; WINDOW: tokens below ``lo`` masked to -inf."""
        HALF: gl.constexpr = 16 // BITS
        W: gl.constexpr = D * BITS // 32
        WPL: gl.constexpr = W // 4
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)

        # ---- keys: pair domain [BLOCK_N, WPL, HALF, 4] -> A operand [BLOCK_N, D]
        k_i = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LK))))
        k_i4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(k_i, 0), 1), 3)  # [1, 1, HALF, 1]
        x4 = gl.expand_dims(kw, 2)  # [BLOCK_N, WPL, 1, 4]
        x4, k_i4 = gl.broadcast(x4, k_i4)
        if KEYS == 0 or (KEYS == 3 and LEAN and BITS == 2):  # dequantized keys (keys="mma" defers to
            # lean_dequant at INT2: two instructions per pair beat the fold's per-tile terms there)
            if PACKED and KG2:  # paired at load time, one group per half of the tile's rows
                o_r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LK))))
                hi = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_r >= BLOCK_N // 2, 1), 2), 3)  # [BLOCK_N, 1, 1, 1]
                hi, s_pk = gl.broadcast(hi, gl.expand_dims(ks0, 0))
                s_pk = gl.where(hi, gl.broadcast(hi, gl.expand_dims(ks1, 0))[1], s_pk)
                o_pk = gl.where(hi, gl.broadcast(hi, gl.expand_dims(ko1, 0))[1], gl.broadcast(hi, gl.expand_dims(ko0, 0))[1])
            elif PACKED:  # paired at load time (_tile_raw)
                s_pk = gl.expand_dims(ks0, 0)
                o_pk = gl.expand_dims(ko0, 0)
            else:
                s_pk = gl.expand_dims(_pack_f16(ks0, ks1), 0)  # [1, WPL, HALF, 4]
                o_pk = gl.expand_dims(_pack_f16(ko0, ko1), 0)
            x4, s_pk = gl.broadcast(x4, s_pk)
            x4, o_pk = gl.broadcast(x4, o_pk)
            if LEAN and BITS == 2:
                k_lo, k_hi = _dequant_pairs_lean(x4, k_i4, s_pk, o_pk)
            else:
                k_lo, k_hi = _dequant_pairs(x4, k_i4, s_pk, o_pk, BITS)
            b_k = gl.reshape(gl.join(k_lo, k_hi), [BLOCK_N, D])
            b_k = gl.convert_layout(b_k, A_OP, assert_trivial=True)
            b_s = mma_v2(b_k, b_q, gl.zeros([BLOCK_N, BLOCK_H], gl.float32, MMA))
        elif KEYS >= 3:  # codes into the MMA; q' = q * scale (HMUL2) and q . offset (an MMA) per tile
            b_k, b_qs, c_s = _folded_keys(x4, k_i4, ks0, ko0, b_q, BITS, D, BLOCK_N, BLOCK_H, LK, MMA, LQP, KEYS == 4)
            b_s = mma_v2(b_k, b_qs, c_s)
        else:  # codes into the MMA, (scale, offset) folded into the query and a per-head term
            k_lo, k_hi = _code_pairs(x4, k_i4, BITS, KEYS == 1)
            b_k = gl.reshape(gl.join(k_lo, k_hi), [BLOCK_N, D])
            b_k = gl.convert_layout(b_k, A_OP, assert_trivial=True)
            LQK: gl.constexpr = gl.SliceLayout(1, B_OP)  # the k positions of the query operand
            s_k = gl.convert_layout(gl.reshape(gl.join(ks0, ks1), [D]), LQK)  # position p = e + 2t + 8(wi*HALF + i)
            o_k = gl.convert_layout(gl.reshape(gl.join(ko0, ko1), [D]), LQK)
            b_qs = b_q * s_k[:, None]  # fp16 q' = q * scale, once per tile
            corr = b_q.to(gl.float32) * o_k.to(gl.float32)[:, None]
            if KEYS == 2:  # the MMA saw 2^(10 - bpos) + code: take q' . 2^(10 - bpos) back out
                J: gl.constexpr = 8 // BITS
                p_k = gl.arange(0, D, layout=LQK)
                mag = (gl.full([D], 1, gl.int32, LQK) << (10 - ((p_k // 8) % HALF % J) * BITS)).to(gl.float32)
                corr = corr - b_qs.to(gl.float32) * mag[:, None]
            corr = gl.convert_layout(gl.sum(corr, axis=0), gl.SliceLayout(0, MMA))
            b_s = mma_v2(b_k, b_qs, gl.zeros([BLOCK_N, BLOCK_H], gl.float32, MMA)) + corr[None, :]
        b_s = b_s * (st * sm_scale_log2)[:, None]
        if WINDOW:
            o_tok = tok0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
            b_s = gl.where((o_tok >= lo)[:, None], b_s, float("-inf"))
        return b_s

    @gluon.jit
    def _tile_values(vw0, vw1, vs0, vs1, vo0, vo1, D: gl.constexpr, BITS: gl.constexpr, BLOCK_N: gl.constexpr,
                     LV: gl.constexpr, MMA: gl.constexpr, PACKED: gl.constexpr = False, LEAN: gl.constexpr = False):
        """A sealed tile's values dequantized into ``mma_v2``'s A operand V^T ``[D, BLOCK_N]``
        (``_attend``'s values half)."""
        HALF: gl.constexpr = 16 // BITS
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        # ---- values: pair domain [WPLV, 2, HALF, 8, NP] -> A operand V^T [D, BLOCK_N]
        v_lo, v_hi = _pair_words(vw0, vw1)
        v_lo = gl.expand_dims(gl.expand_dims(v_lo, 1), 2)  # [WPLV, 1, 1, 8, NP]
        v_hi = gl.expand_dims(gl.expand_dims(v_hi, 1), 2)
        LV_HH: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, LV))))
        LV_I: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, LV))))
        v_hh = gl.arange(0, 2, layout=LV_HH)
        v_i = gl.arange(0, HALF, layout=LV_I)
        v_hh5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_hh, 0), 2), 3), 4)  # [1, 2, 1, 1, 1]
        v_i5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_i, 0), 1), 3), 4)  # [1, 1, HALF, 1, 1]
        if PACKED:
            vs_pk = gl.expand_dims(gl.expand_dims(gl.expand_dims(vs0, 0), 1), 2)  # [1, 1, 1, 8, NP]
            vo_pk = gl.expand_dims(gl.expand_dims(gl.expand_dims(vo0, 0), 1), 2)
        else:
            vs_pk = gl.expand_dims(gl.expand_dims(gl.expand_dims(_pack_f16(vs0, vs1), 0), 1), 2)
            vo_pk = gl.expand_dims(gl.expand_dims(gl.expand_dims(_pack_f16(vo0, vo1), 0), 1), 2)
        v_lo, v_hh5 = gl.broadcast(v_lo, v_hh5)
        v_hi, _ = gl.broadcast(v_hi, v_hh5)
        x5 = gl.where(v_hh5 == 0, v_lo, v_hi)  # [WPLV, 2, 1, 8, NP]
        x5, v_i5 = gl.broadcast(x5, v_i5)
        x5, vs_pk = gl.broadcast(x5, vs_pk)
        x5, vo_pk = gl.broadcast(x5, vo_pk)
        if LEAN and BITS == 2:
            v_e, v_o = _dequant_pairs_lean(x5, v_i5, vs_pk, vo_pk)  # even / odd token of each pair
        else:
            v_e, v_o = _dequant_pairs(x5, v_i5, vs_pk, vo_pk, BITS)
        b_vt = gl.reshape(gl.join(v_e, v_o), [D, BLOCK_N])
        b_vt = gl.convert_layout(b_vt, A_OP, assert_trivial=True)
        return b_vt

    @gluon.jit
    def _attend(b_q, kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1, m_i, l_i, acc, sm_scale_log2,
                D: gl.constexpr, BITS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
                LK: gl.constexpr, LV: gl.constexpr, MMA: gl.constexpr, KEYS: gl.constexpr = 0,
                PACKED: gl.constexpr = False, tok0=0, lo=0, WINDOW: gl.constexpr = False, LAZY: gl.constexpr = False,
                LEAN: gl.constexpr = False, LQP: gl.constexpr = None, KG2: gl.constexpr = False):
        """One online-softmax step over a sealed tile (``_tile_raw``'s bytes): keys and values
        dequantized in the pair-domain layouts, handed to ``mma_v2`` as its A operands. WINDOW: the
        tile's tokens (``tok0`` ...) below ``lo`` are masked (a sliding-window layer). LAZY: the
        running maximum moves only when the tile outgrows it by more than ``LAZY_TAU``
        (``GluonVariant.lazy_rescale``) and ``l_i`` is the running sum's per-lane partials ``[8, BLOCK_H]``
        (``_row_partials``), reduced across the lanes once after the loop instead of every tile. KEYS 3 (``keys="mma"``): ``_folded_keys``.
        KG2 (dequantized keys, ``PACKED``): the tile holds two key groups, ``ks0`` / ``ko0`` the first
        half's params and ``ks1`` / ``ko1`` the second's (a select per param register: the row bit
        that tells the halves apart is a register bit of the MMA layout)."""
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        b_s = _tile_logits(b_q, kw, ks0, ks1, ko0, ko1, st, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, MMA, KEYS,
                           PACKED, tok0, lo, WINDOW, LEAN, LQP, KG2)
        m_new, l_i, acc = _running_max(m_i, l_i, acc, gl.max(b_s, axis=0), LAZY)
        b_p = gl.exp2(b_s - m_new[None, :])
        l_i = l_i + _tile_sum(b_p, BLOCK_N, LAZY)
        b_vt = _tile_values(vw0, vw1, vs0, vs1, vo0, vo1, D, BITS, BLOCK_N, LV, MMA, PACKED, LEAN)
        acc = mma_v2(b_vt, gl.convert_layout(b_p.to(gl.float16), B_OP), acc)
        return m_new, l_i, acc

    @gluon.jit
    def _running_max(m_i, l_i, acc, m_tile, LAZY: gl.constexpr):
        """The online softmax's running maximum after a tile whose logits peak at ``m_tile`` per head:
        (the maximum its probabilities are taken against, ``l_i`` and ``acc`` rescaled to it). LAZY
        (``GluonVariant.lazy_rescale``): one warp-uniform decision for all heads, rescale only when
        some head's maximum grew by more than LAZY_TAU (always on the first tile: m_i = -inf)."""
        m_new = gl.maximum(m_i, m_tile)
        if LAZY:
            grow = gl.max((m_new > m_i + _LAZY_TAU).to(gl.int32), axis=0)
            if grow > 0:
                alpha = gl.exp2(m_i - m_new)
                acc = acc * alpha[None, :]
                l_i = l_i * gl.convert_layout(alpha, gl.SliceLayout(0, l_i.type.layout))[None, :]
                m_i = m_new
            m_new = m_i
        else:
            alpha = gl.exp2(m_i - m_new)
            acc = acc * alpha[None, :]
            l_i = l_i * alpha
        return m_new, l_i, acc

    @gluon.jit
    def _tile_sum(b_p, BLOCK_N: gl.constexpr, LAZY: gl.constexpr):
        """A tile's probabilities summed per head: LAZY, the per-lane partials (``_row_partials``,
        reduced after the loop); else across the lanes."""
        if LAZY:
            return _fold_rows(b_p, BLOCK_N)
        else:
            return gl.sum(b_p, axis=0)

    @gluon.jit
    def _attend2(b_q, raw_a, raw_b, has_b, m_i, l_i, acc, sm_scale_log2, D: gl.constexpr, BITS: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, MMA: gl.constexpr,
                 KEYS: gl.constexpr = 0, PACKED: gl.constexpr = False, tok0=0, lo=0, WINDOW: gl.constexpr = False,
                 LAZY: gl.constexpr = False, LEAN: gl.constexpr = False, LQP: gl.constexpr = None,
                 KG2: gl.constexpr = False):
        """``_attend`` over two sealed tiles at once (``GluonVariant.two_tiles``): tokens ``tok0 ..``
        (``raw_a``, ``_tile_raw``'s bytes) and the next ``BLOCK_N`` (``raw_b``; ``has_b`` False: past the
        split's range, its logits masked to -inf). Both tiles' key MMAs come before one online-softmax
        update over their 2 BLOCK_N logits, then both value MMAs: two independent dependency chains for
        the scheduler to interleave in the one warp, one cross-lane maximum (and LAZY decision) per
        two tiles instead of per tile. The same sums as two ``_attend`` steps up to where the running
        maximum moves (the exact softmax either way)."""
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        kw_a, ks0_a, ks1_a, ko0_a, ko1_a, st_a, vw0_a, vw1_a, vs0_a, vs1_a, vo0_a, vo1_a = raw_a
        kw_b, ks0_b, ks1_b, ko0_b, ko1_b, st_b, vw0_b, vw1_b, vs0_b, vs1_b, vo0_b, vo1_b = raw_b
        s_a = _tile_logits(b_q, kw_a, ks0_a, ks1_a, ko0_a, ko1_a, st_a, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK,
                           MMA, KEYS, PACKED, tok0, lo, WINDOW, LEAN, LQP, KG2)
        s_b = _tile_logits(b_q, kw_b, ks0_b, ks1_b, ko0_b, ko1_b, st_b, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK,
                           MMA, KEYS, PACKED, tok0 + BLOCK_N, lo, WINDOW, LEAN, LQP, KG2)
        s_b = gl.where(has_b, s_b, float("-inf"))
        m_new, l_i, acc = _running_max(m_i, l_i, acc, gl.max(gl.maximum(s_a, s_b), axis=0), LAZY)
        p_a = gl.exp2(s_a - m_new[None, :])
        p_b = gl.exp2(s_b - m_new[None, :])
        l_i = l_i + _tile_sum(p_a + p_b, BLOCK_N, LAZY)
        v_a = _tile_values(vw0_a, vw1_a, vs0_a, vs1_a, vo0_a, vo1_a, D, BITS, BLOCK_N, LV, MMA, PACKED, LEAN)
        acc = mma_v2(v_a, gl.convert_layout(p_a.to(gl.float16), B_OP), acc)
        v_b = _tile_values(vw0_b, vw1_b, vs0_b, vs1_b, vo0_b, vo1_b, D, BITS, BLOCK_N, LV, MMA, PACKED, LEAN)
        acc = mma_v2(v_b, gl.convert_layout(p_b.to(gl.float16), B_OP), acc)
        return m_new, l_i, acc

    @gluon.jit
    def _open_page_softmax(b_s, t0, n_valid, kv_lo, m_i, l_i, sm_scale_log2, BLOCK_T: gl.constexpr,
                           MMA: gl.constexpr, WINDOW: gl.constexpr):
        """The online-softmax step of an open-page tile's logits ``b_s`` ``[BLOCK_T, heads]``: tokens
        at or past ``n_valid`` (and, WINDOW, below ``kv_lo``) masked. Returns (m_new, alpha, p, l)."""
        o_tm = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, MMA))
        m_tok = o_tm < n_valid
        if WINDOW:
            m_tok = m_tok & (o_tm >= kv_lo)
        b_s = gl.where(m_tok[:, None], b_s * sm_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        b_p = gl.exp2(b_s - m_new[None, :])
        return m_new, alpha, b_p, l_i * alpha + gl.sum(b_p, axis=0)

    @gluon.jit
    def _staging_tile(b_qb, stg, i_h, t0, n_valid, m_i, l_i, acc, stg_k_ptr, stg_v_ptr, sm_scale_log2,
                      H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr, BLOCK_T: gl.constexpr,
                      BLOCK_H: gl.constexpr, MMA: gl.constexpr, LLOAD: gl.constexpr, kv_lo=0,
                      WINDOW: gl.constexpr = False):
        """Tokens ``[t0, t0 + BLOCK_T)`` (those in ``[kv_lo, n_valid)``) of an open page, BF16 from
        staging slot ``stg``: plain loads converted to the operand layouts (one page per request)."""
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        base = (stg * H + i_h) * P * D
        # keys [BLOCK_T, D], channel order
        o_t = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, LLOAD))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LLOAD))
        m_t = o_t < n_valid
        b_k = gl.load(stg_k_ptr + base + o_t[:, None] * D + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_s = mma_v2(gl.convert_layout(b_k, A_OP), b_qb, gl.zeros([BLOCK_T, BLOCK_H], gl.float32, MMA))
        m_new, alpha, b_p, l_i = _open_page_softmax(b_s, t0, n_valid, kv_lo, m_i, l_i, sm_scale_log2, BLOCK_T, MMA, WINDOW)
        # values V^T [D, BLOCK_T] with rows in the accumulator's (value_channel) order
        o_r = gl.arange(0, D, layout=gl.SliceLayout(1, LLOAD))
        o_tc = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, LLOAD))
        c_r = _value_channel(o_r, D, BITS)
        b_vt = gl.load(stg_v_ptr + base + o_tc[None, :] * D + c_r[:, None], mask=(o_tc < n_valid)[None, :], other=0.0)
        b_pt = gl.convert_layout(b_p.to(gl.bfloat16), B_OP)
        acc = mma_v2(gl.convert_layout(b_vt, A_OP), b_pt, acc * alpha[None, :])
        return m_new, l_i, acc

    @gluon.jit
    def _staging_tile_direct(b_qk, stg, i_h, t0, n_valid, m_i, l_i, acc, stg_k_ptr, stg_v_ptr, sm_scale_log2,
                             H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr,
                             BLOCK_T: gl.constexpr, BLOCK_H: gl.constexpr, MMA: gl.constexpr, LK: gl.constexpr,
                             LV: gl.constexpr, kv_lo=0, WINDOW: gl.constexpr = False):
        """``_staging_tile`` with every lane loading the BF16 elements its operand registers hold, in
        the sealed tiles' pair domains (``LK``, ``LV``): keys in ``_key_channel`` order (``b_qk``: the
        query in that order), values in ``_value_channel`` order (the accumulator's rows), so the
        conversions to the operand layouts move no data (no shuffles) and the loads are whole runs
        of a token's row."""
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        HALF: gl.constexpr = 16 // BITS
        CPW: gl.constexpr = 32 // BITS
        WPL: gl.constexpr = D * BITS // 128
        WPLV: gl.constexpr = D * BITS // 256
        NP: gl.constexpr = BLOCK_T // 2
        base = (stg * H + i_h) * P * D
        # keys: [BLOCK_T, WPL, HALF, 4] per half e: channel t*D/4 + wi*CPW + e*HALF + i
        LK_T: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LK)))
        LK_W: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LK)))
        LK_I: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LK)))
        LK_Q: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LK)))
        o_t = t0 + gl.arange(0, BLOCK_T, layout=LK_T)
        o_wi = gl.arange(0, WPL, layout=LK_W)
        o_i = gl.arange(0, HALF, layout=LK_I)
        o_q = gl.arange(0, 4, layout=LK_Q)
        t4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_t, 1), 2), 3)
        w4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_wi, 0), 2), 3)
        i4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_i, 0), 1), 3)
        q4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(o_q, 0), 1), 2)
        c4 = q4 * (D // 4) + w4 * CPW + i4
        off_k = t4 * D + c4
        m_k = t4 < n_valid
        off_k, m_k = gl.broadcast(off_k, m_k)
        k_lo = gl.load(stg_k_ptr + base + off_k, mask=m_k, other=0.0)
        k_hi = gl.load(stg_k_ptr + base + off_k + HALF, mask=m_k, other=0.0)
        b_k = gl.convert_layout(gl.reshape(gl.join(k_lo, k_hi), [BLOCK_T, D]), A_OP, assert_trivial=True)
        b_s = mma_v2(b_k, b_qk, gl.zeros([BLOCK_T, BLOCK_H], gl.float32, MMA))
        m_new, alpha, b_p, l_i = _open_page_softmax(b_s, t0, n_valid, kv_lo, m_i, l_i, sm_scale_log2, BLOCK_T, MMA, WINDOW)
        # values V^T: [WPLV, 2, HALF, 8, NP] per token parity: channel g*D/8 + wv*CPW + hh*HALF + i of token 2tp (+1)
        LV_W: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, LV))))
        LV_HH: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, LV))))
        LV_I: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, LV))))
        LV_G: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, LV))))
        LV_P: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LV))))
        v_w = gl.arange(0, WPLV, layout=LV_W)
        v_hh = gl.arange(0, 2, layout=LV_HH)
        v_i = gl.arange(0, HALF, layout=LV_I)
        v_g = gl.arange(0, 8, layout=LV_G)
        v_p = gl.arange(0, NP, layout=LV_P)
        w5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_w, 1), 2), 3), 4)
        hh5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_hh, 0), 2), 3), 4)
        i5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_i, 0), 1), 3), 4)
        g5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_g, 0), 1), 2), 4)
        p5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v_p, 0), 1), 2), 3)
        c5 = g5 * (D // 8) + w5 * CPW + hh5 * HALF + i5
        tok = t0 + 2 * p5
        off_v = tok * D + c5
        m_v = tok < n_valid
        off_v, m_v = gl.broadcast(off_v, m_v)
        m_v1 = (off_v // D + 1) < n_valid
        v_e = gl.load(stg_v_ptr + base + off_v, mask=m_v, other=0.0)
        v_o = gl.load(stg_v_ptr + base + off_v + D, mask=m_v1, other=0.0)
        b_vt = gl.convert_layout(gl.reshape(gl.join(v_e, v_o), [D, BLOCK_T]), A_OP, assert_trivial=True)
        b_pt = gl.convert_layout(b_p.to(gl.bfloat16), B_OP)
        acc = mma_v2(b_vt, b_pt, acc * alpha[None, :])
        return m_new, l_i, acc

    @gluon.jit
    def _open_page(page_idx_ptr, p2s_ptr, kv_start, n_pages, seq_len, lo, P: gl.constexpr, WINDOW: gl.constexpr):
        """The request's last page: ``(staging slot (-1: sealed), its tokens, the first of them in the
        window)`` (WINDOW: ``lo`` the window's first position; else the first token, 0)."""
        page = gl.load(page_idx_ptr + kv_start + n_pages - 1).to(gl.int64)
        stg = gl.load(p2s_ptr + page).to(gl.int64)
        n_valid = seq_len - (n_pages - 1) * P
        t_min = 0
        if WINDOW:
            t_min = gl.maximum(lo - (n_pages - 1) * P, 0)
        return stg, n_valid, t_min

    @gluon.jit
    def _open_tiles(qrot_ptr, q_row, m_n, o_p, stg, i_h, t_start, t_stop, t_step, n_valid, m_i, l_i, acc, stg_k_ptr,
                    stg_v_ptr, sm_scale_log2, H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr, P: gl.constexpr,
                    BLOCK_T: gl.constexpr, BLOCK_H: gl.constexpr, MMA: gl.constexpr, LK: gl.constexpr,
                    LV: gl.constexpr, LLOAD: gl.constexpr, t_min, WINDOW: gl.constexpr, DIRECT: gl.constexpr):
        """The open-page tiles at ``t_start, t_start + t_step, ..`` below ``t_stop`` (tokens of
        ``[t_min, n_valid)``) of staging slot ``stg``, BF16, folded into the online-softmax state: the
        query loaded as BF16 in the tiles' channel order first."""
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        if DIRECT:  # the query in the keys' channel order (as the sealed tiles'), BF16
            b_qb = gl.load(qrot_ptr + q_row[None, :] + _key_channel(o_p, D, BITS)[:, None], mask=m_n, other=0.0)
        else:
            b_qb = gl.load(qrot_ptr + q_row[None, :] + o_p[:, None], mask=m_n, other=0.0)
        b_qb = gl.convert_layout(b_qb.to(gl.bfloat16), B_OP)
        for t0 in range(t_start, t_stop, t_step):
            if DIRECT:
                m_i, l_i, acc = _staging_tile_direct(b_qb, stg, i_h, t0, n_valid, m_i, l_i, acc, stg_k_ptr, stg_v_ptr,
                                                     sm_scale_log2, H, D, BITS, P, BLOCK_T, BLOCK_H, MMA, LK, LV,
                                                     t_min, WINDOW)
            else:
                m_i, l_i, acc = _staging_tile(b_qb, stg, i_h, t0, n_valid, m_i, l_i, acc, stg_k_ptr, stg_v_ptr,
                                              sm_scale_log2, H, D, BITS, P, BLOCK_T, BLOCK_H, MMA, LLOAD, t_min, WINDOW)
        return m_i, l_i, acc

    @gluon.constexpr_function
    def _fwht_layout(ROWS, D):
        """The layout ``_fwht_lanes`` works in, for ``[ROWS, D]`` fp32 in one warp: each lane holds
        ``R = ROWS * D / 32`` consecutive elements of one row (the index bits below ``log2 R`` in
        registers), lane ``l`` the elements ``(l % (32 / ROWS)) * R ...`` of row ``l // (32 / ROWS)``:
        lane bit ``i`` is index bit ``log2 R + i``, so the butterflies over the upper bits are lane
        shuffles and the lower ones register arithmetic, with no layout conversion in between."""
        return gl.BlockedLayout([1, ROWS * D // 32], [ROWS, 32 // ROWS], [1, 1], [1, 0])

    @gluon.jit
    def _lane_xor(x, M: gl.constexpr):
        """``x`` of lane ``laneid ^ M``, register for register (one SHFL.BFLY per register)."""
        if M == 1:
            asm: gl.constexpr = _SHFL1
        elif M == 2:
            asm: gl.constexpr = _SHFL2
        elif M == 4:
            asm: gl.constexpr = _SHFL4
        elif M == 8:
            asm: gl.constexpr = _SHFL8
        else:
            gl.static_assert(M == 16, "_lane_xor: a lane mask of 1, 2, 4, 8 or 16")
            asm: gl.constexpr = _SHFL16
        return gl.inline_asm_elementwise(asm, "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _fwht_lanes(x, ROWS: gl.constexpr, D: gl.constexpr, LOG2D: gl.constexpr, SHIFT: gl.constexpr):
        """``_fwht_rows`` (the same additions in the same order, so the same bits) without its layout
        conversion per stage (``GluonVariant.lane_fwht``). Runs in ``_fwht_layout(ROWS, D)`` (``x``
        converted into it once; the result is in it): a stage over an index bit held in registers
        splits the register pairs (no data movement), a stage over a lane bit takes the partner's
        value by one lane shuffle per register and makes ``a + b`` (the lower index) or ``a - b`` (the
        upper) as ``x * sign + partner``: ``x * sign`` is exact, so the one rounding is the
        addition's, the reference's bits. (Session 42: sm_90 SASS of the fused paper default, ~1100
        fewer instructions per program for the query rotation and the partial's inverse rotation,
        ~730 of them the query's: a seventh of a single request's per-program work at 8 tiles.)"""
        LF: gl.constexpr = _fwht_layout(ROWS, D)
        R: gl.constexpr = ROWS * D // 32
        LOG2R: gl.constexpr = 0 if R == 1 else (1 if R == 2 else (2 if R == 4 else (3 if R == 8 else (
            4 if R == 16 else (5 if R == 32 else (6 if R == 64 else 7))))))
        gl.static_assert((1 << LOG2R) == R, "_fwht_lanes: ROWS * D / 32 elements per lane, a power of two <= 128")
        x = gl.convert_layout(x, LF)
        o_c = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, LF)), 0)
        for j in gl.static_range(LOG2D):  # stage j: index bit (j + SHIFT) % LOG2D (compile-time values)
            if (j + SHIFT) % LOG2D < LOG2R:
                y = gl.reshape(x, [ROWS, D // (2 << ((j + SHIFT) % LOG2D)), 2, 1 << ((j + SHIFT) % LOG2D)])
                a, b = gl.split(gl.permute(y, [0, 1, 3, 2]))
                y = gl.permute(gl.join(a + b, a - b), [0, 1, 3, 2])
                x = gl.convert_layout(gl.reshape(y, [ROWS, D]), LF, assert_trivial=True)
            else:
                sign = gl.where(((o_c >> ((j + SHIFT) % LOG2D)) & 1) == 0, 1.0, -1.0).to(gl.float32)
                x = x * sign + _lane_xor(x, 1 << ((j + SHIFT) % LOG2D - LOG2R))
        return x

    @gluon.jit
    def _fwht_rows(x, ROWS: gl.constexpr, D: gl.constexpr, LOG2D: gl.constexpr, SHIFT: gl.constexpr):
        """Unnormalized Sylvester butterfly over the last dim of an fp32 ``[ROWS, D]`` tensor: the
        additions of ``common.fwht_rows`` in the same order (so the same bits). Stage ``j`` pairs the
        elements whose index differs in bit ``(j + SHIFT) % LOG2D``: SHIFT 0 for rows in channel
        order, SHIFT 3 for the accumulator's rows, whose index c holds channel ``(c % 8) * D/8 + c // 8``
        (``_value_channel``: channel bit j is bit (j + 3) % LOG2D of c). (The Walsh-Hadamard matrix is
        invariant under a permutation of the index bits, so any stage order is the same transform;
        SHIFT keeps the reference's order of additions, hence its rounding.) Before each split the
        pair axis is moved into registers (Gluon's split needs it there): one layout conversion per
        stage."""
        for j in gl.static_range(LOG2D):
            y = gl.reshape(x, [ROWS, D // (2 << ((j + SHIFT) % LOG2D)), 2, 1 << ((j + SHIFT) % LOG2D)])
            y = gl.permute(y, [0, 1, 3, 2])
            y = gl.convert_layout(y, gl.BlockedLayout(
                [1, 1, 1, 2], [1, min(D // (2 << ((j + SHIFT) % LOG2D)), 32), 32 // min(D // (2 << ((j + SHIFT) % LOG2D)), 32), 1],
                [1, 1, 1, 1], [3, 2, 1, 0]))  # fmt: skip
            a, b = gl.split(y)
            y = gl.permute(gl.join(a + b, a - b), [0, 1, 3, 2])
            x = gl.reshape(y, [ROWS, D])
        return x

    @gluon.jit
    def _rotated_rows(ptr, row0, stride_r, o_r, m_r, rot, D: gl.constexpr, LOG2D: gl.constexpr, ROWS: gl.constexpr,
                      ROTATE: gl.constexpr, INV_SQRT_D: gl.constexpr, MASKED: gl.constexpr, LROW: gl.constexpr,
                      LANES: gl.constexpr = False):
        """Rows ``o_r`` (masked by ``m_r``) of ``ptr + row0``, row stride ``stride_r``, as fp32
        ``[ROWS, D]`` in ``LROW``, Walsh-Hadamard rotated and normalized when ROTATE (with MASKED only
        the rows whose ``rot`` flag is set: ``common.load_rotated``); LANES: by ``_fwht_lanes`` (the
        same bits)."""
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LROW))
        x = gl.load(ptr + row0 + o_r[:, None] * stride_r + o_d[None, :], mask=m_r[:, None], other=0.0).to(gl.float32)
        if ROTATE:
            if LANES:
                x_rot = gl.convert_layout(_fwht_lanes(x, ROWS, D, LOG2D, 0), LROW) * INV_SQRT_D
            else:
                x_rot = gl.convert_layout(_fwht_rows(x, ROWS, D, LOG2D, 0), LROW) * INV_SQRT_D
            if MASKED:
                x = gl.where(rot[:, None], x_rot, x)
            else:
                x = x_rot
        return x

    @gluon.jit
    def _new_rows(new_k_ptr, new_v_ptr, krot_ptr, i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, D: gl.constexpr,
                  LOG2D: gl.constexpr, ROTATE: gl.constexpr, INV_SQRT_D: gl.constexpr, KEY_MASK: gl.constexpr,
                  LROW: gl.constexpr, LANES: gl.constexpr = False):
        """The new token's K and V of KV head ``i_h`` of request ``i_b``, rotated as stored (the key
        only where head ``i_h``'s keys are, with KEY_MASK): fp32 ``[1, D]`` each in ``LROW``."""
        o_1 = gl.arange(0, 1, layout=gl.SliceLayout(1, LROW))
        m_1 = o_1 >= 0
        r_1 = m_1
        if KEY_MASK:
            r_1 = gl.load(krot_ptr + i_h + o_1) != 0
        b_k = _rotated_rows(new_k_ptr, i_b * stride_kb + i_h * stride_kh, 0, o_1, m_1, r_1, D, LOG2D, 1, ROTATE,
                            INV_SQRT_D, KEY_MASK, LROW, LANES)
        b_v = _rotated_rows(new_v_ptr, i_b * stride_vb + i_h * stride_vh, 0, o_1, m_1, m_1, D, LOG2D, 1, ROTATE,
                            INV_SQRT_D, False, LROW, LANES)
        return b_k, b_v

    @gluon.jit
    def _layer_key_sumsq(new_k_ptr, krot_ptr, i_b, stride_kb, stride_kh, H: gl.constexpr, D: gl.constexpr,
                         LOG2D: gl.constexpr, BLOCK_HK: gl.constexpr, ROTATE: gl.constexpr, INV_SQRT_D: gl.constexpr,
                         KEY_MASK: gl.constexpr, LROW: gl.constexpr, LANES: gl.constexpr = False):
        """The sum of squares of every head's new key of request ``i_b`` as stored (the layer norm's
        s_t squared), HC heads at a time (registers)."""
        HC: gl.constexpr = min(BLOCK_HK, 8)
        ss = gl.sum(gl.zeros([HC], gl.float32, gl.SliceLayout(1, LROW)), axis=0)
        for c in gl.static_range(BLOCK_HK // HC):
            o_h = c * HC + gl.arange(0, HC, layout=gl.SliceLayout(1, LROW))
            m_h = o_h < H
            r_h = m_h
            if KEY_MASK:
                r_h = gl.load(krot_ptr + o_h, mask=m_h, other=1) != 0
            b_ka = _rotated_rows(new_k_ptr, i_b * stride_kb, stride_kh, o_h, m_h, r_h, D, LOG2D, HC, ROTATE, INV_SQRT_D,
                                 KEY_MASK, LROW, LANES)
            ss += gl.sum(gl.sum(b_ka * b_ka, axis=1), axis=0)
        return ss

    @gluon.jit
    def _fused_write(new_k_ptr, new_v_ptr, new_loc_ptr, p2s_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr, krot_ptr, i_b,
                     i_h, stride_kb, stride_kh, stride_vb, stride_vh, H: gl.constexpr, D: gl.constexpr,
                     P: gl.constexpr, S: gl.constexpr, LOG2D: gl.constexpr, BLOCK_HK: gl.constexpr,
                     ROTATE: gl.constexpr, INV_SQRT_D: gl.constexpr, KEY_MASK: gl.constexpr, LROW: gl.constexpr,
                     LANES: gl.constexpr = False):
        """The write of KV head ``i_h`` of request ``i_b`` (``common.write_token``, the same values):
        its new K/V rotated into its staging slot as BF16 and, with the layer norm scope (S == 1) by
        the program of head 0, s_t over every head's key as stored. Padding slots (page 0, mapped to
        no staging slot) are not written."""
        loc = gl.load(new_loc_ptr + i_b).to(gl.int64)
        page = loc // P
        slot = loc % P
        stg = gl.load(p2s_ptr + page).to(gl.int64)
        if stg >= 0:
            b_k, b_v = _new_rows(new_k_ptr, new_v_ptr, krot_ptr, i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, D,
                                 LOG2D, ROTATE, INV_SQRT_D, KEY_MASK, LROW, LANES)
            o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LROW))
            o_stg = ((stg * H + i_h) * P + slot) * D + o_d[None, :]
            gl.store(stg_k_ptr + o_stg, b_k.to(gl.bfloat16))
            gl.store(stg_v_ptr + o_stg, b_v.to(gl.bfloat16))
            p_scale = stg_scale_ptr + (stg * P + slot) * S
            if S == 1:
                if i_h == 0:  # the layer norm needs every head's rotated key
                    b_s = gl.sqrt_rn(_layer_key_sumsq(new_k_ptr, krot_ptr, i_b, stride_kb, stride_kh, H, D, LOG2D,
                                                      BLOCK_HK, ROTATE, INV_SQRT_D, KEY_MASK, LROW, LANES))
                    gl.store(p_scale, gl.where(b_s > 0.0, b_s, 1.0))
            elif S > 1:
                b_s = gl.sqrt_rn(gl.sum(gl.sum(b_k * b_k, axis=1), axis=0))
                gl.store(p_scale + i_h, gl.where(b_s > 0.0, b_s, 1.0))

    @gluon.jit
    def _fused_write_early(new_k_ptr, new_v_ptr, stg, slot, stg_k_ptr, stg_v_ptr, stg_scale_ptr, krot_ptr,
                           i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, H: gl.constexpr, D: gl.constexpr,
                           P: gl.constexpr, S: gl.constexpr, LOG2D: gl.constexpr, BLOCK_HK: gl.constexpr,
                           ROTATE: gl.constexpr, INV_SQRT_D: gl.constexpr, KEY_MASK: gl.constexpr,
                           LROW: gl.constexpr, LANES: gl.constexpr = False):
        """``_fused_write`` (the same values and stores) with its loads issued together
        (``GluonVariant.early_loads``): the slot's lookup (new_loc -> page_to_staging: ``stg``,
        ``slot``) was issued at the program's start, and the new K/V (and, the layer norm's program,
        every head's key) do not wait for it; the stores are masked by it (padding slots, mapped to
        no staging slot, are not written)."""
        b_k, b_v = _new_rows(new_k_ptr, new_v_ptr, krot_ptr, i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, D,
                             LOG2D, ROTATE, INV_SQRT_D, KEY_MASK, LROW, LANES)
        ss = gl.sum(gl.sum(b_k * 0.0, axis=1), axis=0)
        if S == 1:
            if i_h == 0:  # the layer norm needs every head's rotated key
                ss = _layer_key_sumsq(new_k_ptr, krot_ptr, i_b, stride_kb, stride_kh, H, D, LOG2D, BLOCK_HK, ROTATE,
                                      INV_SQRT_D, KEY_MASK, LROW, LANES)
        elif S > 1:
            ss = gl.sum(gl.sum(b_k * b_k, axis=1), axis=0)
        b_s = gl.sqrt_rn(ss)
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LROW))
        o_stg = ((stg * H + i_h) * P + slot) * D + o_d[None, :]
        m_stg = o_stg * 0 + stg >= 0
        gl.store(stg_k_ptr + o_stg, b_k.to(gl.bfloat16), mask=m_stg)
        gl.store(stg_v_ptr + o_stg, b_v.to(gl.bfloat16), mask=m_stg)
        p_scale = stg_scale_ptr + (stg * P + slot) * S
        if S == 1:
            if i_h == 0:
                gl.store(p_scale, gl.where(b_s > 0.0, b_s, 1.0), mask=stg >= 0)
        elif S > 1:
            gl.store(p_scale + i_h, gl.where(b_s > 0.0, b_s, 1.0), mask=stg >= 0)

    @gluon.jit
    def _merge_heads(part_o_ptr, part_lse_ptr, out_ptr, i_b, i_h, n_part, stride_ob, stride_oh, H: gl.constexpr,
                     GROUP: gl.constexpr, BLOCK_G: gl.constexpr, D: gl.constexpr, CHUNK: gl.constexpr,
                     LM: gl.constexpr):
        """The fused merge (``decode.merge_partials``, the same arithmetic): the log-sum-exp weighted
        sum of the ``n_part`` partials (model basis) of the GROUP query heads of KV head ``i_h``, CHUNK
        partials per block load (``[BLOCK_G, CHUNK, D]`` in ``LM``), into ``out``. The loads bypass L1
        (``.cg``): other programs wrote the partials."""
        LRC: gl.constexpr = gl.SliceLayout(2, LM)  # [rows, chunk]
        LRD: gl.constexpr = gl.SliceLayout(1, LM)  # [rows, D]
        o_r = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, LRC))
        m_r = o_r < GROUP
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LRD))
        base = ((i_b * H + i_h) * GROUP + o_r) * n_part
        m = gl.full([BLOCK_G], float("-inf"), gl.float32, gl.SliceLayout(1, LRC))
        l = gl.zeros([BLOCK_G], gl.float32, gl.SliceLayout(1, LRC))
        acc = gl.zeros([BLOCK_G, D], gl.float32, LRD)
        for s0 in range(0, n_part, CHUNK):
            o_s = s0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, LRC))
            m_s = m_r[:, None] & (o_s < n_part)[None, :]
            o_p = base[:, None] + o_s[None, :]
            b_lse = gl.load(part_lse_ptr + o_p, mask=m_s, other=float("-inf"), cache_modifier=".cg")
            p3 = part_o_ptr + gl.expand_dims(o_p, 2) * D + gl.expand_dims(gl.expand_dims(o_d, 0), 1)
            b_o = gl.load(p3, mask=gl.expand_dims(m_s, 2), other=0.0, cache_modifier=".cg")
            m_new = gl.maximum(m, gl.max(b_lse, axis=1))
            m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m - m_ref)
            w = gl.exp2(b_lse - m_ref[:, None])  # empty splits (lse = -inf) weigh 0
            alpha_d = gl.convert_layout(alpha, gl.SliceLayout(1, LRD))
            acc = acc * alpha_d[:, None] + gl.sum(gl.expand_dims(w, 2) * b_o, axis=1)
            l = l * alpha + gl.sum(w, axis=1)
            m = m_new
        l_d = gl.convert_layout(l, gl.SliceLayout(1, LRD))
        b_out = acc / gl.where(l_d > 0.0, l_d, 1.0)[:, None]
        o_rd = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, LRD))
        p_out = out_ptr + i_b * stride_ob + (i_h * GROUP + o_rd)[:, None] * stride_oh + o_d[None, :]
        gl.store(p_out, b_out.to(out_ptr.dtype.element_ty), mask=(o_rd < GROUP)[:, None])

    @gluon.jit
    def _key_channel(p, D: gl.constexpr, BITS: gl.constexpr):
        """The channel at k position ``p`` of the dequantized key operand: p = e + 2t + 8(wi*HALF + i)
        holds channel t*D/4 + wi*CPW + e*HALF + i."""
        HALF: gl.constexpr = 16 // BITS
        CPW: gl.constexpr = 32 // BITS
        e = p % 2
        t = (p // 2) % 4
        r = p // 8
        return t * (D // 4) + (r // HALF) * CPW + e * HALF + r % HALF

    @gluon.jit
    def _value_channel(c, D: gl.constexpr, BITS: gl.constexpr):
        """The channel at row ``c`` of the dequantized V^T operand (and of the accumulator):
        c = g + 8((wv*2 + hh)*HALF + i) holds channel g*D/8 + wv*CPW + hh*HALF + i."""
        HALF: gl.constexpr = 16 // BITS
        CPW: gl.constexpr = 32 // BITS
        g = c % 8
        r = c // 8
        return g * (D // 8) + (r // (2 * HALF)) * CPW + ((r // HALF) % 2) * HALF + r % HALF

    @gluon.jit
    def _gluon_decode_stage1_kernel(
        qrot_ptr, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr, stg_k_ptr, stg_v_ptr, p2s_ptr, kv_indptr_ptr,
        page_idx_ptr, seq_lens_ptr, part_o_ptr, part_lse_ptr,
        q_ptr, new_k_ptr, new_v_ptr, new_loc_ptr, stg_scale_ptr, krot_ptr, counter_ptr, out_ptr,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh, sm_scale_log2, window_left,
        kw_desc, kp_desc, vw_desc, vp_desc, kr_ptr,
        H: gl.constexpr, GROUP: gl.constexpr, BLOCK_H: gl.constexpr, D: gl.constexpr, BITS: gl.constexpr,
        P: gl.constexpr, G_K: gl.constexpr, G_V: gl.constexpr, S: gl.constexpr, BLOCK_N: gl.constexpr,
        BLOCK_T: gl.constexpr, LK: gl.constexpr, LV: gl.constexpr, MMA: gl.constexpr, LLOAD: gl.constexpr,
        STAGES: gl.constexpr, KEYS: gl.constexpr, PREFETCH: gl.constexpr = True, PACKED: gl.constexpr = False,
        DIRECT: gl.constexpr = False, SPREAD: gl.constexpr = False, ROT_Q: gl.constexpr = False, WRITE: gl.constexpr = False,
        ROT_OUT: gl.constexpr = False, ROTATE: gl.constexpr = False, LOG2D: gl.constexpr = 7,
        INV_SQRT_D: gl.constexpr = 1.0, KEY_MASK: gl.constexpr = False, BLOCK_HK: gl.constexpr = 8,
        MERGE: gl.constexpr = False, BLOCK_G: gl.constexpr = 4, CHUNK: gl.constexpr = 4, LM: gl.constexpr = None,
        WINDOW: gl.constexpr = False, LAZY: gl.constexpr = False, LEAN: gl.constexpr = False, LQP: gl.constexpr = None,
        TMA: gl.constexpr = 0, LTK: gl.constexpr = None, LTV: gl.constexpr = None, LTP: gl.constexpr = None,
        TMA_TILES: gl.constexpr = 1, KEY_PAGE: gl.constexpr = False, OPEN_FIRST: gl.constexpr = False,
        TWO: gl.constexpr = False, OPEN_SHARE: gl.constexpr = False, PAGE_PAIRS: gl.constexpr = False,
        EARLY: gl.constexpr = False, MIN_TILES: gl.constexpr = 0, L2PF: gl.constexpr = 0, PDL: gl.constexpr = False,
        LAUNCH_DEPENDENTS: gl.constexpr = False, LANE_FWHT: gl.constexpr = False, long_min=0,
        DUAL: gl.constexpr = False,
    ):  # fmt: skip
        if LAUNCH_DEPENDENTS:  # the merge launch after this one is its programmatic dependent (merge_pdl)
            _gdc_launch_dependents(gl.program_id(0))
        if DUAL:
            # decode._DecodeTuning.long_gluon: a programmatic dependent of the Triton stage 1 launched
            # before it, which takes the requests shorter than long_min tokens; this launch takes the
            # others. A shorter request's programs wait for that launch (so that whatever waits for
            # this one sees its partials) and leave.
            seq_len_d = gl.load(seq_lens_ptr + gl.program_id(0))
            if seq_len_d < long_min:
                _gdc_wait(seq_len_d)
                return
        i_b = gl.program_id(0).to(gl.int64)
        i_h = gl.program_id(1).to(gl.int64)
        n_split = gl.num_programs(2) - 1
        if OPEN_FIRST:  # grid index 0 along the splits is the open-page program (launched first)
            i_s = n_split - gl.program_id(2)
        else:
            i_s = gl.program_id(2)
        TPP: gl.constexpr = P // BLOCK_N
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        s_col = i_h if S > 1 else 0  # the token-scale column: per head, or one for the layer

        if EARLY:
            # GluonVariant.early_loads: the request's length, pages and open-page lookups read no store
            # of this launch, so they are issued before the query rotation's and the write's stores
            seq_len = gl.load(seq_lens_ptr + i_b)
            kv_start = gl.load(kv_indptr_ptr + i_b).to(gl.int64)
            n_pages = (seq_len + P - 1) // P
            lo_e = 0
            if WINDOW:
                lo_e = gl.maximum(seq_len - 1 - window_left, 0)
            stg_e, n_valid_e, t_min_e = _open_page(page_idx_ptr, p2s_ptr, kv_start, n_pages, seq_len, lo_e, P, WINDOW)
            if WRITE:  # the new token's staging slot (every program: two scalar loads; the writer's chain)
                loc_w = gl.load(new_loc_ptr + i_b).to(gl.int64)
                slot_w = loc_w % P
                stg_w = gl.load(p2s_ptr + loc_w // P).to(gl.int64)

        if ROT_Q:
            # the query rotation, fused: every program of (b, h) rotates the GROUP query heads of KV
            # head h (identical values, so the concurrent stores of the splits agree) and reads them
            # back below in the orders its tiles want; KEY_MASK: rotated only if head h's keys are
            if LANE_FWHT:
                # (GluonVariant.lane_fwht: BLOCK_G rows, not the MMA's BLOCK_H, the padding rows never
                # read; loaded, rotated and stored in the butterfly's own layout: no layout conversion)
                QROWS: gl.constexpr = BLOCK_G
                LQR: gl.constexpr = _fwht_layout(BLOCK_G, D)
            else:
                QROWS: gl.constexpr = BLOCK_H
                LQR: gl.constexpr = LLOAD
            o_g = gl.arange(0, QROWS, layout=gl.SliceLayout(1, LQR))
            m_g = o_g < GROUP
            r_g = m_g
            if KEY_MASK:
                r_g = gl.load(krot_ptr + i_h + o_g * 0) != 0
            b_qr = _rotated_rows(q_ptr, i_b * stride_qb + (i_h * GROUP) * stride_qh, stride_qh, o_g, m_g, r_g, D, LOG2D,
                                 QROWS, ROTATE, INV_SQRT_D, KEY_MASK, LQR, LANE_FWHT)
            o_qd = gl.arange(0, D, layout=gl.SliceLayout(0, LQR))
            gl.store(qrot_ptr + ((i_b * H + i_h) * GROUP + o_g)[:, None] * D + o_qd[None, :], b_qr, mask=m_g[:, None])
        if WRITE:
            if i_s == n_split:  # the program that reads the open page writes the new token into it
                if EARLY:
                    _fused_write_early(new_k_ptr, new_v_ptr, stg_w, slot_w, stg_k_ptr, stg_v_ptr, stg_scale_ptr,
                                       krot_ptr, i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, H, D, P, S, LOG2D,
                                       BLOCK_HK, ROTATE, INV_SQRT_D, KEY_MASK, LLOAD, LANE_FWHT)
                else:
                    _fused_write(new_k_ptr, new_v_ptr, new_loc_ptr, p2s_ptr, stg_k_ptr, stg_v_ptr, stg_scale_ptr,
                                 krot_ptr, i_b, i_h, stride_kb, stride_kh, stride_vb, stride_vh, H, D, P, S, LOG2D,
                                 BLOCK_HK, ROTATE, INV_SQRT_D, KEY_MASK, LLOAD, LANE_FWHT)
        if ROT_Q or WRITE:
            gl.thread_barrier()  # this program's stores above are read back below

        if not EARLY:
            if DUAL:
                seq_len = seq_len_d
            else:
                seq_len = gl.load(seq_lens_ptr + i_b)
            kv_start = gl.load(kv_indptr_ptr + i_b).to(gl.int64)
            n_pages = (seq_len + P - 1) // P

        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(0, MMA))
        l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(0, MMA))
        acc = gl.zeros([D, BLOCK_H], gl.float32, MMA)

        # queries Q^T [D, BLOCK_H]: k positions in the key operand's channel order (sealed tiles)
        o_p = gl.arange(0, D, layout=gl.SliceLayout(1, LLOAD))
        o_n = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, LLOAD))
        q_row = ((i_b * H + i_h) * GROUP + o_n) * D
        m_n = (o_n < GROUP)[None, :]

        # WINDOW (a sliding-window layer): the query sees positions lo .. seq_len - 1 only; the sealed
        # tiles below lo's tile are skipped, and the tokens below lo of the tile holding it masked
        lo = 0
        if WINDOW:
            lo = gl.maximum(seq_len - 1 - window_left, 0)
        n_parts = n_split + 1 if OPEN_SHARE else n_split  # programs sharing the sealed tiles
        if i_s < n_split:
            n_tiles = (n_pages - 1) * TPP
            if WINDOW:
                t_first = lo // BLOCK_N
                per = (gl.maximum(n_tiles - t_first, 0) + n_parts - 1) // n_parts
                if MIN_TILES > 0:  # GluonVariant.min_tiles
                    per = gl.maximum(per, MIN_TILES)
                t_lo = t_first + i_s * per
            else:
                per = (n_tiles + n_parts - 1) // n_parts
                if MIN_TILES > 0:  # GluonVariant.min_tiles
                    per = gl.maximum(per, MIN_TILES)
                t_lo = i_s * per
            t_hi = gl.minimum(t_lo + per, n_tiles)
            if SPREAD:
                # the open page's tiles but its last are spread over the sealed splits, the j-th to
                # split n_split - 1 - j (mod n_split): the splits whose sealed ranges the ceiling
                # division left shortest (the last program keeps the new token's tile)
                if EARLY:
                    stg, n_valid, t_min = stg_e, n_valid_e, t_min_e
                else:
                    stg, n_valid, t_min = _open_page(page_idx_ptr, p2s_ptr, kv_start, n_pages, seq_len, lo, P, WINDOW)
                if stg >= 0:
                    o_first = t_min // BLOCK_T
                    o_last = (n_valid - 1) // BLOCK_T
                    j0 = o_first + n_split - 1 - i_s
                    if j0 < o_last:
                        m_i, l_i, acc = _open_tiles(qrot_ptr, q_row, m_n, o_p, stg, i_h, j0 * BLOCK_T, o_last * BLOCK_T,
                                                    n_split * BLOCK_T, n_valid, m_i, l_i, acc, stg_k_ptr, stg_v_ptr,
                                                    sm_scale_log2, H, D, BITS, P, BLOCK_T, BLOCK_H, MMA, LK, LV, LLOAD,
                                                    t_min, WINDOW, DIRECT)
        else:
            if PDL:  # a programmatic dependent of the write's launch: its stores (the new token) are read below
                _gdc_wait(seq_len)
            if EARLY:
                stg, n_valid, t_min = stg_e, n_valid_e, t_min_e
            else:
                stg, n_valid, t_min = _open_page(page_idx_ptr, p2s_ptr, kv_start, n_pages, seq_len, lo, P, WINDOW)
            if stg >= 0:
                t_start = t_min // BLOCK_T * BLOCK_T
                if SPREAD:  # the tile of the page's last token (the new one) only
                    t_start = (n_valid - 1) // BLOCK_T * BLOCK_T
                m_i, l_i, acc = _open_tiles(qrot_ptr, q_row, m_n, o_p, stg, i_h, t_start, n_valid, BLOCK_T, n_valid,
                                            m_i, l_i, acc, stg_k_ptr, stg_v_ptr, sm_scale_log2, H, D, BITS, P, BLOCK_T,
                                            BLOCK_H, MMA, LK, LV, LLOAD, t_min, WINDOW, DIRECT)
                t_lo = 0
                t_hi = 0
            else:
                t_lo = (n_pages - 1) * TPP
                if WINDOW:
                    t_lo = gl.maximum(t_lo, lo // BLOCK_N)
                t_hi = n_pages * TPP
            if OPEN_SHARE:
                # ... and the last share of the sealed tiles (GluonVariant.open_share): from the end of
                # split n_split - 1's range to the last sealed tile (the request's last page with it
                # when that page is sealed: no open page)
                n_tiles = (n_pages - 1) * TPP
                if WINDOW:
                    t_first = lo // BLOCK_N
                    per = (gl.maximum(n_tiles - t_first, 0) + n_parts - 1) // n_parts
                    if MIN_TILES > 0:  # GluonVariant.min_tiles
                        per = gl.maximum(per, MIN_TILES)
                    t_lo = gl.minimum(t_first + n_split * per, gl.maximum(n_tiles, t_first))
                else:
                    per = (n_tiles + n_parts - 1) // n_parts
                    if MIN_TILES > 0:  # GluonVariant.min_tiles
                        per = gl.maximum(per, MIN_TILES)
                    t_lo = gl.minimum(n_split * per, n_tiles)
                t_hi = n_tiles
                if stg < 0:
                    t_hi = n_pages * TPP

        # sealed tiles [t_lo, t_hi): the loads of tile it + 1 are issued before tile it's math
        c_q = _key_channel(o_p, D, BITS)
        b_q = gl.load(qrot_ptr + q_row[None, :] + c_q[:, None], mask=m_n, other=0.0)
        b_q = gl.convert_layout(b_q.to(gl.float16), B_OP)
        LS: gl.constexpr = gl.SliceLayout(1, MMA)
        pg_idx = page_idx_ptr + kv_start
        if TMA:  # a TMA ring of TMA slots of TT tiles each (GluonVariant.tma / tma_tiles), TMA - 1 transfers
            # in flight during a tile's math; transfer g holds tiles g*TT .. g*TT + TT - 1 (one page)
            W: gl.constexpr = D * BITS // 32
            NG: gl.constexpr = D // G_V
            TT: gl.constexpr = TMA_TILES
            kw_b = gl.allocate_shared_memory(gl.int32, [TMA, TT * BLOCK_N, W], kw_desc.layout)
            vw_b = gl.allocate_shared_memory(gl.int32, [TMA, TT * BLOCK_N, W], vw_desc.layout)
            kp_b = gl.allocate_shared_memory(gl.int32, [TMA, max(1, TT * BLOCK_N // G_K), D], kp_desc.layout)
            vp_b = gl.allocate_shared_memory(gl.float16, [TMA, TT * BLOCK_N * NG // 4, 8], vp_desc.layout)
            bars = gl.allocate_shared_memory(gl.int64, [TMA, 1], mbarrier.MBarrierLayout())
            for j in gl.static_range(TMA):
                mbarrier.init(bars.index(j), count=1)
            fence_async_shared()
            if t_lo < t_hi:
                g_lo = t_lo // TT
                g_hi = (t_hi - 1) // TT + 1
                for j in gl.static_range(TMA - 1):  # prologue: transfers g_lo .. g_lo + TMA - 2 (those that exist)
                    page_j = gl.load(pg_idx + gl.minimum(g_lo + j, g_hi - 1) * TT // TPP).to(gl.int64)
                    _tma_issue(j, bars, kw_b, kp_b, vw_b, vp_b, kw_desc, kp_desc, vw_desc, vp_desc, page_j,
                               ((g_lo + j) * TT % TPP) * BLOCK_N, i_h, g_lo + j < g_hi, H, D, BITS, P, G_K, G_V,
                               BLOCK_N, TT)
                page = gl.load(pg_idx + t_lo // TPP).to(gl.int64)
                st = _tile_scales(page, (t_lo % TPP) * BLOCK_N, s_col, scale_ptr, P, S, BLOCK_N, LS)
                page_x = gl.load(pg_idx + gl.minimum(g_lo + TMA - 1, g_hi - 1) * TT // TPP).to(gl.int64)
                if LAZY:
                    l_i = _row_partials(l_i, BLOCK_N, MMA)
                for it in range(t_lo, t_hi):
                    k = it // TT - g_lo
                    first = (it % TT == 0) | (it == t_lo)  # the first tile of its transfer this program reads
                    if first:
                        # refill the slot read by the last transfer (its loads' values are consumed)
                        gx = it // TT + TMA - 1
                        _tma_issue((k + TMA - 1) % TMA, bars, kw_b, kp_b, vw_b, vp_b, kw_desc, kp_desc, vw_desc,
                                   vp_desc, page_x, (gx * TT % TPP) * BLOCK_N, i_h, gx < g_hi, H, D, BITS, P, G_K,
                                   G_V, BLOCK_N, TT)
                        page_x = gl.load(pg_idx + gl.minimum(gx + 1, g_hi - 1) * TT // TPP).to(gl.int64)
                    # the next tile's token scales, a tile ahead in registers
                    nt = gl.minimum(it + 1, t_hi - 1)
                    page_n = gl.load(pg_idx + nt // TPP).to(gl.int64)
                    st_n = _tile_scales(page_n, (nt % TPP) * BLOCK_N, s_col, scale_ptr, P, S, BLOCK_N, LS)
                    if first:
                        mbarrier.wait(bars.index(k % TMA), (k // TMA) & 1)
                    kw, ks0, ko0, vw0, vw1, vs0, vo0 = _tma_read(k % TMA, it % TT, kw_b, kp_b, vw_b, vp_b, D, BITS, G_K,
                                                                 G_V, BLOCK_N, LK, LV, LTK, LTV, LTP, TT)
                    m_i, l_i, acc = _attend(b_q, kw, ks0, ks0, ko0, ko0, st, vw0, vw1, vs0, vs0, vo0, vo0, m_i, l_i,
                                            acc, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, PACKED,
                                            it * BLOCK_N, lo, WINDOW, LAZY, LEAN, LQP)
                    st = st_n
                if LAZY:
                    l_i = _row_total(l_i, MMA)
        elif STAGES == 0 and not PREFETCH and TWO:  # two tiles per step (_attend2), loaded right before it
            if LAZY:
                l_i = _row_partials(l_i, BLOCK_N, MMA)
            for it in range(t_lo, t_hi, 2):
                it_b = gl.minimum(it + 1, t_hi - 1)  # an odd range's last step re-loads its tile, masked
                page = gl.load(pg_idx + it // TPP).to(gl.int64)
                page_b = gl.load(pg_idx + it_b // TPP).to(gl.int64)
                raw_a = _tile_raw(page, (it % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr,
                                  H, D, BITS, P, G_K, G_V, S, BLOCK_N, LK, LV, LS, PACKED, kr_ptr, KEY_PAGE, PAGE_PAIRS)
                raw_b = _tile_raw(page_b, (it_b % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr,
                                  scale_ptr, H, D, BITS, P, G_K, G_V, S, BLOCK_N, LK, LV, LS, PACKED, kr_ptr, KEY_PAGE, PAGE_PAIRS)
                m_i, l_i, acc = _attend2(b_q, raw_a, raw_b, it + 1 < t_hi, m_i, l_i, acc, sm_scale_log2, D, BITS,
                                         BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, PACKED, it * BLOCK_N, lo, WINDOW, LAZY,
                                         LEAN, LQP, BLOCK_N > G_K)
            if LAZY:
                l_i = _row_total(l_i, MMA)
        elif STAGES == 0 and not PREFETCH:  # each tile loaded right before its math (more programs per SM instead)
            if LAZY:
                l_i = _row_partials(l_i, BLOCK_N, MMA)
            for it in range(t_lo, t_hi):
                page = gl.load(pg_idx + it // TPP).to(gl.int64)
                if L2PF % 2 == 1:  # this tile's value lines into L2 (GluonVariant.l2_prefetch)
                    _l2_prefetch_tile(page, (it % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr,
                                      scale_ptr, H, D, BITS, P, G_K, G_V, S, BLOCK_N, False)
                if L2PF >= 2:  # the next tile's lines (the last tile prefetches itself again)
                    nt = gl.minimum(it + 1, t_hi - 1)
                    page_n = gl.load(pg_idx + nt // TPP).to(gl.int64)
                    _l2_prefetch_tile(page_n, (nt % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr,
                                      scale_ptr, H, D, BITS, P, G_K, G_V, S, BLOCK_N, True, kr_ptr, KEY_PAGE)
                kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1 = _tile_raw(
                    page, (it % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr,
                    H, D, BITS, P, G_K, G_V, S, BLOCK_N, LK, LV, LS, PACKED, kr_ptr, KEY_PAGE, PAGE_PAIRS)  # fmt: skip
                m_i, l_i, acc = _attend(b_q, kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1, m_i, l_i,
                                        acc, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, PACKED,
                                        it * BLOCK_N, lo, WINDOW, LAZY, LEAN, LQP, BLOCK_N > G_K)
            if LAZY:
                l_i = _row_total(l_i, MMA)
        elif STAGES == 0:  # "regs1": the next tile's bytes in registers
            if t_lo < t_hi:
                if LAZY:
                    l_i = _row_partials(l_i, BLOCK_N, MMA)
                page = gl.load(pg_idx + t_lo // TPP).to(gl.int64)
                raw = _tile_raw(page, (t_lo % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr, scale_ptr,
                                H, D, BITS, P, G_K, G_V, S, BLOCK_N, LK, LV, LS, PACKED, kr_ptr, KEY_PAGE, PAGE_PAIRS)
                for it in range(t_lo, t_hi):
                    nxt = gl.minimum(it + 1, t_hi - 1)  # the last tile re-loads itself (never read past the end)
                    page_n = gl.load(pg_idx + nxt // TPP).to(gl.int64)
                    raw_n = _tile_raw(page_n, (nxt % TPP) * BLOCK_N, i_h, s_col, kw_ptr, kp_ptr, vw_ptr, vp_ptr,
                                      scale_ptr, H, D, BITS, P, G_K, G_V, S, BLOCK_N, LK, LV, LS, PACKED, kr_ptr,
                                      KEY_PAGE, PAGE_PAIRS)
                    kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1 = raw
                    m_i, l_i, acc = _attend(b_q, kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1, m_i, l_i,
                                            acc, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, PACKED,
                                            it * BLOCK_N, lo, WINDOW, LAZY, LEAN, LQP, BLOCK_N > G_K)
                    raw = raw_n
                if LAZY:
                    l_i = _row_total(l_i, MMA)
        else:  # cp.async ring of STAGES tiles (wide part), the narrow part one tile ahead in registers
            W: gl.constexpr = D * BITS // 32
            SL3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 2, 0])  # [(S,) BLOCK_N, WPL, 4]: m*W + t*WPL + wi
            SLP: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0, 2])  # [(S,) WPL, HALF, 4]: t*D/4 + wi*CPW + i
            SLV: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0, 1, 2])  # [(S,) WPLV, 8, NP]: 2tp*W + g*WPLV + wv
            kw_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, W // 4, 4], SL3)
            ks0_s = gl.allocate_shared_memory(gl.float16, [STAGES, W // 4, 16 // BITS, 4], SLP)
            ks1_s = gl.allocate_shared_memory(gl.float16, [STAGES, W // 4, 16 // BITS, 4], SLP)
            ko0_s = gl.allocate_shared_memory(gl.float16, [STAGES, W // 4, 16 // BITS, 4], SLP)
            ko1_s = gl.allocate_shared_memory(gl.float16, [STAGES, W // 4, 16 // BITS, 4], SLP)
            vw0_s = gl.allocate_shared_memory(gl.int32, [STAGES, W // 8, 8, BLOCK_N // 2], SLV)
            vw1_s = gl.allocate_shared_memory(gl.int32, [STAGES, W // 8, 8, BLOCK_N // 2], SLV)
            if t_lo < t_hi:
                for j in gl.static_range(STAGES - 1):  # prologue: tiles t_lo .. t_lo + STAGES - 2 (clamped)
                    tj = gl.minimum(t_lo + j, t_hi - 1)
                    page_j = gl.load(pg_idx + tj // TPP).to(gl.int64)
                    _tile_issue(j, page_j, (tj % TPP) * BLOCK_N, i_h, kw_ptr, kp_ptr, vw_ptr, kw_s, ks0_s, ks1_s, ko0_s,
                                ko1_s, vw0_s, vw1_s, H, D, BITS, P, G_K, BLOCK_N, LK, LV)
                page = gl.load(pg_idx + t_lo // TPP).to(gl.int64)
                small = _tile_small(page, (t_lo % TPP) * BLOCK_N, i_h, s_col, vp_ptr, scale_ptr, H, D, P, G_V, S,
                                    BLOCK_N, LV, LS)
                for it in range(t_lo, t_hi):
                    k = it - t_lo
                    async_copy.wait_group(STAGES - 2)  # tile it's group has landed
                    gl.thread_barrier()  # ... for every lane, and slot (k - 1) % STAGES is read by all
                    kw, ks0, ks1, ko0, ko1, vw0, vw1 = _tile_smem(k % STAGES, kw_s, ks0_s, ks1_s, ko0_s, ko1_s, vw0_s,
                                                                  vw1_s, LK, LV)
                    nx = gl.minimum(it + STAGES - 1, t_hi - 1)  # the last tile re-copies itself
                    page_x = gl.load(pg_idx + nx // TPP).to(gl.int64)
                    _tile_issue((k + STAGES - 1) % STAGES, page_x, (nx % TPP) * BLOCK_N, i_h, kw_ptr, kp_ptr, vw_ptr,
                                kw_s, ks0_s, ks1_s, ko0_s, ko1_s, vw0_s, vw1_s, H, D, BITS, P, G_K, BLOCK_N, LK, LV)
                    nxt = gl.minimum(it + 1, t_hi - 1)
                    page_n = gl.load(pg_idx + nxt // TPP).to(gl.int64)
                    small_n = _tile_small(page_n, (nxt % TPP) * BLOCK_N, i_h, s_col, vp_ptr, scale_ptr, H, D, P, G_V,
                                          S, BLOCK_N, LV, LS)
                    st, vs0, vs1, vo0, vo1 = small
                    m_i, l_i, acc = _attend(b_q, kw, ks0, ks1, ko0, ko1, st, vw0, vw1, vs0, vs1, vo0, vo1, m_i, l_i,
                                            acc, sm_scale_log2, D, BITS, BLOCK_N, BLOCK_H, LK, LV, MMA, KEYS, False,
                                            it * BLOCK_N, lo, WINDOW)
                    small = small_n
                async_copy.wait_group(0)

        # normalized partial (rotated basis) and log-sum-exp; empty split: lse = -inf, zero partial
        has = l_i > 0.0
        b_lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        b_o = acc / gl.where(has, l_i, 1.0)[None, :]
        o_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, MMA))
        o_part = ((i_b * H + i_h) * GROUP + o_h) * (n_split + 1) + i_s
        if ROT_OUT:
            # the inverse rotation of the partial here (it is linear), so the merge launch is a weighted
            # sum only (channel-parallel); the butterfly runs over the accumulator's row order
            # (LANE_FWHT: stored from the butterfly's layout, one layout conversion, into it)
            if LANE_FWHT:
                LOR: gl.constexpr = _fwht_layout(BLOCK_H, D)
            else:
                LOR: gl.constexpr = LLOAD
            b_ot = gl.permute(b_o, [1, 0])  # [BLOCK_H, D], column c holds channel _value_channel(c)
            if ROTATE:
                if LANE_FWHT:
                    b_ot = _fwht_lanes(b_ot, BLOCK_H, D, LOG2D, 3) * INV_SQRT_D
                else:
                    b_ot = _fwht_rows(b_ot, BLOCK_H, D, LOG2D, 3) * INV_SQRT_D
            b_ot = gl.convert_layout(b_ot, LOR)
            o_h2 = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LOR))
            o_c2 = _value_channel(gl.arange(0, D, layout=gl.SliceLayout(0, LOR)), D, BITS)
            o_part2 = ((i_b * H + i_h) * GROUP + o_h2) * (n_split + 1) + i_s
            gl.store(part_o_ptr + o_part2[:, None] * D + o_c2[None, :], b_ot, mask=(o_h2 < GROUP)[:, None])
        else:
            o_c = _value_channel(gl.arange(0, D, layout=gl.SliceLayout(1, MMA)), D, BITS)
            gl.store(part_o_ptr + o_part[None, :] * D + o_c[:, None], b_o, mask=(o_h < GROUP)[None, :])
        gl.store(part_lse_ptr + o_part, b_lse, mask=o_h < GROUP)
        if MERGE:
            # the merge, fused (ROT_OUT: the partials are in the model's basis): the last of the
            # n_split + 1 programs of (b, h) to finish merges them (a release/acquire counter; the
            # barrier makes every lane's partial stores part of the release) and resets the counter
            # for the next launch (CUDA-graph replays included)
            gl.thread_barrier()
            o_cnt = counter_ptr + i_b * H + i_h
            arrived = gl.atomic_add(o_cnt, 1, sem="acq_rel", scope="gpu")
            if arrived == n_split:
                _merge_heads(part_o_ptr, part_lse_ptr, out_ptr, i_b, i_h, n_split + 1, stride_ob, stride_oh, H, GROUP,
                             BLOCK_G, D, CHUNK, LM)
                gl.atomic_xchg(o_cnt, 0, sem="relaxed", scope="gpu")


def gluon_layouts(*, bits: int, head_dim: int, block_n: int, block_h: int, v_group: int = 32) -> dict[str, object]:
    """The compile-time layouts of ``_gluon_decode_stage1_kernel`` (one warp), by parameter name.

    ``LK``: key pair domain ``[BLOCK_N, WPL, HALF, 4]``: lanes ``4g + t`` with t the last axis and g
    the token (rows g + 8r), the words and pairs of a lane in registers. ``LV``: value pair domain
    ``[WPLV, 2, HALF, 8, BLOCK_N/2]``: lanes with t the token-pair axis (pairs t + 4r) and g the 8-row
    channel axis. ``MMA``: ``mma.sync`` m16n8 accumulators. ``LLOAD``: plain loads (queries, open page).
    ``LM``: the fused merge's ``[heads, partials, D]`` block loads (4 channels per lane). ``LQP``: the
    query as f16x2 pairs of the key operand's k positions ``[WPL, HALF, 4, BLOCK_H]`` (``keys="mma"``):
    lanes ``4h + t``, the pairs of a lane in registers as in ``LK``, i.e. the MMA's B operand.
    ``LTK`` / ``LTV`` / ``LTP``: how a TMA ring slot's key params ``[1, WPL, HALF/2, 4, 2, 2]``, value
    words ``[WPLV, 8, NP, 2]`` and value params ``[NG, 8/NG, NP, 2, 2]`` are read back
    (``_tma_read``): each lane the words its operand registers use, the split axes the first
    registers. The value params' lanes ``4g + t`` take group ``q = g // (8/NG)`` and token pairs
    ``t + 4r`` (a linear layout: the lanes of one group read the same params)."""
    d, w = head_dim, head_dim * bits // 32
    half = 16 // bits
    wpl, wplv = w // 4, w // 8
    ng, np_ = d // v_group, block_n // 2
    b_bits = (8 // ng).bit_length() - 1  # low bits of g that pick the lane inside a group (replicated)
    ltp = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 1, 0]] + [[0, 0, 1 << j, 0, 0] for j in range(2, np_.bit_length() - 1)],
        lane_bases=[[0, 0, 1, 0, 0], [0, 0, 2, 0, 0]] + [[0, 1 << j, 0, 0, 0] if j < b_bits else
                                                        [1 << (j - b_bits), 0, 0, 0, 0] for j in range(3)],
        warp_bases=[], block_bases=[], shape=[ng, 8 // ng, np_, 2, 2]) if ng <= 8 and np_ >= 4 else None
    return {
        "LK": gl.BlockedLayout([1, wpl, half, 1], [8, 1, 1, 4], [1, 1, 1, 1], [3, 2, 1, 0]),
        "LV": gl.BlockedLayout([wplv, 2, half, 1, 1], [1, 1, 1, 8, 4], [1, 1, 1, 1, 1], [4, 3, 2, 1, 0]),
        "MMA": gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8]),
        "LLOAD": gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0]),
        "LM": gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 1, 1], [2, 1, 0]),
        "LQP": gl.BlockedLayout([wpl, half, 1, 1], [1, 1, 4, 8], [1, 1, 1, 1], [2, 3, 1, 0]),
        "LTK": gl.BlockedLayout([1, wpl, half // 2, 1, 2, 2], [8, 1, 1, 4, 1, 1], [1] * 6, [5, 4, 2, 1, 3, 0]),
        "LTV": gl.BlockedLayout([wplv, 1, 1, 2], [1, 8, 4, 1], [1, 1, 1, 1], [3, 0, 2, 1]),
        "LTP": ltp,
    }


def gluon_tma_descriptors(pool_args: dict[str, object], block_n: int, tiles: int = 1) -> dict[str, object]:
    """The host tensor descriptors a ``tma`` variant's ring reads the sealed pages through, by kernel
    parameter name: the key and value code words as ``[pages * H * P, W]`` int32 (a tile is
    ``[block_n, W]``), the key params as ``[pages * H * P/G_K, D]`` int32 words (one group's fp16
    (scales, offsets) row ``[1, D]``) and the value params as rows of 8 fp16 (a tile's
    ``block_n * 2 * D/G_V`` fp16 are contiguous: ``[block_n * D/G_V / 4, 8]``), each with an
    unswizzled ``NVMMASharedLayout`` (the kernel reads the slots back through strided views).
    The TMA's limits hold for every pool the launcher accepts: 16-byte aligned bases and row
    strides (the pool's pages are whole multiples of 16 bytes), rows of at least 16 bytes, boxes of
    at most 256 rows."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    kw, kp, vw, vp = pool_args["kw_ptr"], pool_args["kp_ptr"], pool_args["vw_ptr"], pool_args["vp_ptr"]
    w, d, ng = kw.shape[-1], kp.shape[-1], vp.shape[-1]
    n = tiles * block_n  # tokens per transfer
    if pool_args["P"] % n:
        raise ValueError(f"a TMA transfer of {tiles} tile(s) of {block_n} tokens must divide the page ({pool_args['P']} "
                         f"tokens)")

    def desc(t: torch.Tensor, cols: int, block: list[int]) -> TensorDescriptor:
        t2 = t.reshape(-1, cols)
        lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=t2.element_size() * 8, rank=2)
        return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), block, lay)

    return {"kw_desc": desc(kw, w, [n, w]), "kp_desc": desc(kp, d, [max(1, n // pool_args["G_K"]), d]),
            "vw_desc": desc(vw, w, [n, w]), "vp_desc": desc(vp.view(torch.float16), 8, [n * ng // 4, 8])}


def gluon_stage1_launch(*, q_rot: torch.Tensor, pool_args: dict[str, object], group: int, kv_indptr: torch.Tensor,
                        kv_page_indices: torch.Tensor, seq_lens: torch.Tensor, part_o: torch.Tensor,
                        part_lse: torch.Tensor, sm_scale: float, block_n: int, block_t: int,
                        variant: str = DEFAULT_GLUON_VARIANT, fused: dict[str, object] | None = None,
                        window_left: int | None = None, pdl: bool = False, launch_dependents: bool = False,
                        long_min: int | None = None) -> None:
    """Stage 1 over ``(B, H, part_o.shape[2])`` programs (the last split takes each request's last
    page): partials and log-sum-exps into ``part_o`` / ``part_lse``, in the rotated basis unless
    ``fused`` (then in the model's: the plain merge launch follows). The caller
    (``oscar_decode_attention``) has checked the inputs; the shape limits are ``check_gluon_shape``'s.
    ``variant``: a key of ``GLUON_VARIANTS``. ``fused`` (a ``fused`` variant only): the step's other
    parts, by kernel parameter name: ``q_ptr`` (the queries to rotate into ``q_rot``, or None when
    ``q_rot`` holds them rotated), ``new_k_ptr`` / ``new_v_ptr`` / ``new_loc_ptr`` /
    ``stg_scale_ptr`` (the write, or None), ``krot_ptr`` / ``KEY_MASK`` (``key_mask_arguments``),
    ``ROTATE`` / ``LOG2D`` / ``INV_SQRT_D`` (``rotation_arguments``), and for the merge in the launch
    ``counter_ptr`` / ``out_ptr`` (``decode_workspace``'s counters, the output; absent: the caller
    merges). ``window_left``: a sliding-window layer's window (``check_window``'s), or None.
    ``pdl``: launched as a programmatic dependent of the launch before it (the write's,
    ``_DecodeTuning.split_pdl``), whose stores only the open-page program reads, after
    ``griddepcontrol.wait``. ``launch_dependents``: the merge launch that follows is a programmatic
    dependent of this one (``_DecodeTuning.merge_pdl``): every program lets it be scheduled at its start.
    ``long_min`` (``_DecodeTuning.long_gluon``): the requests of at least this many tokens only, as a
    programmatic dependent of the Triton stage 1 launched just before it, which took the others
    (this launch's programs of those wait for it and leave; not with ``pdl``)."""
    if long_min is not None and pdl:
        raise ValueError("gluon_stage1_launch: long_min (a dependent of the Triton stage 1) and pdl (of the write's "
                         "launch) exclude each other")
    var = gluon_variant(variant)
    block_n = var.block_n or block_n  # GluonVariant.block_n: the variant's own tile
    reason = gluon_available(q_rot.device)
    if reason is not None:
        raise RuntimeError(reason)
    if (fused is not None) != var.fused:
        raise ValueError(f"Gluon variant {variant!r} {'takes' if var.fused else 'does not take'} the fused step's arguments")
    b, hq, d = q_rot.shape
    h = pool_args["H"]
    block_h = max(8, 1 << (group - 1).bit_length())
    check_gluon_shape(bits=pool_args["BITS"], head_dim=d, k_group=pool_args["G_K"], v_group=pool_args["G_V"],
                      block_n=block_n, group=group)
    check_gluon_key_groups(variant, block_n=block_n, k_group=pool_args["G_K"])
    f = fused or {}
    q, new_k, out = f.get("q_ptr"), f.get("new_k_ptr"), f.get("out_ptr")
    write = new_k is not None
    block_g = max(1, 1 << (group - 1).bit_length())
    key_page = bool(pool_args.get("KEY_PAGE", False))
    if key_page:
        check_gluon_key_page(variant)
    descs = (gluon_tma_descriptors(pool_args, block_n, var.tma_tiles) if var.tma else
             {"kw_desc": None, "kp_desc": None, "vw_desc": None, "vp_desc": None})
    _gluon_decode_stage1_kernel[(b, h, part_o.shape[2])](
        **descs,
        qrot_ptr=q_rot, kw_ptr=pool_args["kw_ptr"], kp_ptr=pool_args["kp_ptr"].view(torch.float16),
        kr_ptr=pool_args["kr_ptr"] if key_page else pool_args["kw_ptr"], KEY_PAGE=key_page,
        vw_ptr=pool_args["vw_ptr"], vp_ptr=pool_args["vp_ptr"].view(torch.float16), scale_ptr=pool_args["scale_ptr"],
        stg_k_ptr=pool_args["stg_k_ptr"], stg_v_ptr=pool_args["stg_v_ptr"], p2s_ptr=pool_args["p2s_ptr"],
        kv_indptr_ptr=kv_indptr, page_idx_ptr=kv_page_indices, seq_lens_ptr=seq_lens, part_o_ptr=part_o,
        part_lse_ptr=part_lse,
        # the fused step's inputs (placeholders where a part does not run: never read then)
        q_ptr=q if q is not None else q_rot, new_k_ptr=new_k if write else q_rot,
        new_v_ptr=f["new_v_ptr"] if write else q_rot, new_loc_ptr=f["new_loc_ptr"] if write else seq_lens,
        stg_scale_ptr=f.get("stg_scale_ptr") if write and f.get("stg_scale_ptr") is not None else part_lse,
        krot_ptr=f.get("krot_ptr", seq_lens), counter_ptr=f["counter_ptr"] if out is not None else seq_lens,
        out_ptr=out if out is not None else part_o,
        stride_qb=q.stride(0) if q is not None else 0, stride_qh=q.stride(1) if q is not None else 0,
        stride_kb=new_k.stride(0) if write else 0, stride_kh=new_k.stride(1) if write else 0,
        stride_vb=f["new_v_ptr"].stride(0) if write else 0, stride_vh=f["new_v_ptr"].stride(1) if write else 0,
        stride_ob=out.stride(0) if out is not None else 0, stride_oh=out.stride(1) if out is not None else 0,
        sm_scale_log2=sm_scale * math.log2(math.e), window_left=window_left if window_left is not None else 0,
        WINDOW=window_left is not None, H=h, GROUP=group, BLOCK_H=block_h, D=d,
        BITS=pool_args["BITS"], P=pool_args["P"], G_K=pool_args["G_K"], G_V=pool_args["G_V"], S=pool_args["S"],
        BLOCK_N=block_n, BLOCK_T=var.staging_block or block_t, **var.constexprs(),
        **gluon_layouts(bits=pool_args["BITS"], head_dim=d, block_n=block_n, block_h=block_h, v_group=pool_args["G_V"]),
        ROT_Q=q is not None, WRITE=write, ROT_OUT=var.fused, ROTATE=bool(f.get("ROTATE", False)),
        LOG2D=f.get("LOG2D", d.bit_length() - 1), INV_SQRT_D=f.get("INV_SQRT_D", d ** -0.5),
        KEY_MASK=bool(f.get("KEY_MASK", False)), BLOCK_HK=max(1, 1 << (h - 1).bit_length()),
        MERGE=out is not None, BLOCK_G=block_g, CHUNK=max(1, 2048 // (block_g * d)), PDL=pdl,
        LAUNCH_DEPENDENTS=launch_dependents,
        **({"long_min": int(long_min), "DUAL": True} if long_min is not None else {}),
        num_warps=1, **({} if var.maxnreg is None else {"maxnreg": var.maxnreg}),
        **({"launch_pdl": True} if pdl or long_min is not None else {}),
    )  # fmt: skip
