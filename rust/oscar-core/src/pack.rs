//! The golden packer: docs/LAYOUT.md §1-§3, bit for bit.
//!
//! Everything is IEEE-754 binary32 with round-to-nearest-even, true divisions, and the same order
//! of operations as `oscar_sgl.reference.quantize_groups`, so the bytes equal the torch reference
//! and the Triton seal kernel. Shapes are passed as numbers next to flat C-contiguous slices.
//!
//! One gap of the prose layout is closed here: `min` over a group holding both `+0.0` and `-0.0`
//! is not unique, and its sign reaches the stored offset. Inputs are read as `x + 0.0`, which turns
//! `-0.0` into `+0.0` and changes nothing else, so the bytes never depend on a reduction order.

use half::f16;

use crate::error::{Error, Result};

/// Shape of one block of one layer: `[heads, tokens, head_dim]` (docs/LAYOUT.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    pub heads: usize,
    pub tokens: usize,
    pub head_dim: usize,
}

impl BlockShape {
    pub fn new(heads: usize, tokens: usize, head_dim: usize) -> Self {
        Self { heads, tokens, head_dim }
    }

    /// Elements of the `[H, n, D]` value array.
    pub fn elements(&self) -> Result<usize> {
        self.heads
            .checked_mul(self.tokens)
            .and_then(|x| x.checked_mul(self.head_dim))
            .ok_or_else(|| Error::layout("block shape overflows usize"))
    }
}

/// Codes plus fp16 parameters of one packed block (keys or values).
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// `[H, n, D*b/8]` uint8.
    pub codes: Vec<u8>,
    /// Keys: `[H, n/G_K, 2, D]`; values: `[H, n, 2, D/G_V]` (row 0 scales, row 1 offsets).
    pub params: Vec<f16>,
}

/// Validate a bit width and return `qmax = 2^b - 1` as f32.
pub fn check_bits(bits: u32) -> Result<f32> {
    match bits {
        2 => Ok(3.0),
        4 => Ok(15.0),
        _ => Err(Error::layout(format!("bits must be 2 or 4, got {bits}"))),
    }
}

/// Bytes one token of one head takes: `D * b / 8`.
pub fn row_bytes(head_dim: usize, bits: u32) -> Result<usize> {
    check_bits(bits)?;
    if head_dim == 0 || !(head_dim * bits as usize).is_multiple_of(8) {
        return Err(Error::layout(format!("head_dim={head_dim} does not pack into whole bytes at {bits} bits")));
    }
    Ok(head_dim * bits as usize / 8)
}

/// Where a group's grid starts (`OscarConfig.offset`, docs/OSCAR.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offset {
    /// An integer zero point: `zero = round(-lo / scale)`, `offset = -zero * scale` (the paper).
    #[default]
    Integer,
    /// The group minimum itself: `offset = lo`, `q = round((x - lo) / scale)`.
    Min,
}

impl Offset {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "integer" => Ok(Self::Integer),
            "min" => Ok(Self::Min),
            _ => Err(Error::layout(format!("offset must be 'integer' or 'min', got {name:?}"))),
        }
    }
}

/// How the groups of one part (keys or values) are quantized at seal time: the offset rule and
/// whether the MSE clip search runs (`OscarConfig.offset` / `clip`). The default is the paper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quantizer {
    pub offset: Offset,
    pub clip: bool,
}

/// Clip search candidates: `[lo + w*c, hi - w*c]` for each `c`, `w = hi - lo` (ratios 1, 15/16,
/// 7/8, 13/16, 3/4 of the width; exact binary fractions). `oscar_sgl.reference.CLIP_SHRINK`.
pub const CLIP_SHRINK: [f32; 5] = [0.0, 1.0 / 32.0, 2.0 / 32.0, 3.0 / 32.0, 4.0 / 32.0];
/// A candidate's score: `sum t^2` in integers, `t = round(|x_hat - x| / w * 2^20)` capped at 2^24,
/// so any summation order gives the same choice (`oscar_sgl.reference.clip_score`).
const CLIP_SCORE_ONE: f32 = 1_048_576.0;
const CLIP_SCORE_CAP: f32 = 16_777_216.0;

/// Parameters of one quantization group (docs/LAYOUT.md §1).
#[derive(Debug, Clone, Copy)]
struct Group {
    scale: f32,
    zero: f32,
    offset: f32,
    normal: bool,
    mode: Offset,
}

impl Group {
    fn new(lo: f32, hi: f32, qmax: f32, mode: Offset) -> Self {
        match mode {
            Offset::Integer if hi > lo => {
                let scale = (hi - lo) / qmax;
                let zero = (-lo / scale).round_ties_even();
                Self { scale, zero, offset: (-zero) * scale, normal: true, mode }
            }
            Offset::Min if (hi - lo) / qmax > 0.0 => {
                Self { scale: (hi - lo) / qmax, zero: 0.0, offset: lo, normal: true, mode }
            }
            _ => Self { scale: 0.0, zero: 0.0, offset: lo, normal: false, mode },
        }
    }

    /// The code of `x` as an f32 integer in `[0, qmax]` (NaN only where the reference has it too).
    #[inline]
    fn code_f32(&self, x: f32, qmax: f32) -> f32 {
        if !self.normal {
            return 0.0;
        }
        match self.mode {
            Offset::Integer => ((x / self.scale).round_ties_even() + self.zero).clamp(0.0, qmax),
            Offset::Min => ((x - self.offset) / self.scale).round_ties_even().clamp(0.0, qmax),
        }
    }

    #[inline]
    fn code(&self, x: f32, qmax: f32) -> u8 {
        // Integer-valued and inside [0, qmax] after the clamp: the cast is exact.
        self.code_f32(x, qmax) as u8
    }

    /// The clip search score of this group's grid over `xs` (canonical values), `width` the
    /// unclipped group's `hi - lo`.
    fn score(&self, xs: &[f32], width: f32, qmax: f32) -> i64 {
        let w = if width > 0.0 { width } else { 1.0 };
        xs.iter()
            .map(|&x| {
                let err = (self.code_f32(x, qmax) * self.scale + self.offset - x).abs();
                let t = (err / w * CLIP_SCORE_ONE).round_ties_even();
                let t = (if t <= CLIP_SCORE_CAP { t } else { CLIP_SCORE_CAP }) as i64;
                t * t
            })
            .sum()
    }

    /// The group of canonical values `xs` with min/max `lo`/`hi`, clip-searched when asked: the
    /// candidate of least score, the widest on ties.
    fn choose(xs: &[f32], lo: f32, hi: f32, qmax: f32, quant: Quantizer) -> Self {
        let mut best = Self::new(lo, hi, qmax, quant.offset);
        if !quant.clip {
            return best;
        }
        let width = hi - lo;
        let mut best_score = best.score(xs, width, qmax);
        for &c in &CLIP_SHRINK[1..] {
            let d = width * c;
            let g = Self::new(lo + d, hi - d, qmax, quant.offset);
            let score = g.score(xs, width, qmax);
            if score < best_score {
                best = g;
                best_score = score;
            }
        }
        best
    }
}

/// Read one input value: reject NaN/Inf, fold `-0.0` into `+0.0` (module docs).
#[inline]
fn read(v: f32, at: usize) -> Result<f32> {
    if !v.is_finite() {
        return Err(Error::layout(format!("cannot quantize a non-finite value ({v}) at flat index {at}")));
    }
    Ok(v + 0.0)
}

fn check_range(lo: f32, hi: f32) -> Result<()> {
    if (hi - lo).is_finite() {
        Ok(())
    } else {
        Err(Error::layout(format!("group range [{lo}, {hi}] overflows f32: the scale would not be finite")))
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::layout(format!("{what} holds {got} elements, the shape needs {want}")))
    }
}

#[inline]
fn put_code(row: &mut [u8], c: usize, q: u8, bits: u32) {
    let per_byte = 8 / bits as usize;
    row[c / per_byte] |= q << ((c % per_byte) as u32 * bits);
}

#[inline]
fn get_code(row: &[u8], c: usize, bits: u32) -> u8 {
    let per_byte = 8 / bits as usize;
    (row[c / per_byte] >> ((c % per_byte) as u32 * bits)) & ((1u8 << bits) - 1)
}

/// Pack codes `[rows, D]` (each `< 2^b`) into `[rows, D*b/8]`, little-endian inside a byte.
pub fn pack_codes(q: &[u8], head_dim: usize, bits: u32) -> Result<Vec<u8>> {
    let rb = row_bytes(head_dim, bits)?;
    if !q.len().is_multiple_of(head_dim) {
        return Err(Error::layout(format!("{} codes are not rows of {head_dim}", q.len())));
    }
    let qmax = (1u8 << bits) - 1;
    let mut out = vec![0u8; q.len() / head_dim * rb];
    for (src, dst) in q.chunks_exact(head_dim).zip(out.chunks_exact_mut(rb)) {
        for (c, &code) in src.iter().enumerate() {
            if code > qmax {
                return Err(Error::layout(format!("code {code} does not fit in {bits} bits")));
            }
            put_code(dst, c, code, bits);
        }
    }
    Ok(out)
}

/// Inverse of [`pack_codes`].
pub fn unpack_codes(packed: &[u8], head_dim: usize, bits: u32) -> Result<Vec<u8>> {
    let rb = row_bytes(head_dim, bits)?;
    if !packed.len().is_multiple_of(rb) {
        return Err(Error::layout(format!("{} code bytes are not rows of {rb}", packed.len())));
    }
    let mut out = Vec::with_capacity(packed.len() / rb * head_dim);
    for row in packed.chunks_exact(rb) {
        out.extend((0..head_dim).map(|c| get_code(row, c, bits)));
    }
    Ok(out)
}

fn check_k_shape(shape: BlockShape, bits: u32, k_group: usize) -> Result<usize> {
    let rb = row_bytes(shape.head_dim, bits)?;
    if k_group == 0 || !shape.tokens.is_multiple_of(k_group) {
        return Err(Error::layout(format!(
            "a key block of {} tokens is not a whole number of k_group={k_group}",
            shape.tokens
        )));
    }
    Ok(rb)
}

fn check_v_shape(shape: BlockShape, bits: u32, v_group: usize) -> Result<usize> {
    let rb = row_bytes(shape.head_dim, bits)?;
    if v_group == 0 || !shape.head_dim.is_multiple_of(v_group) {
        return Err(Error::layout(format!("v_group={v_group} must divide head_dim={}", shape.head_dim)));
    }
    Ok(rb)
}

/// Quantize and pack keys already divided by their token scale.
///
/// `values`: `[H, n, D]` f32, `n` a multiple of `k_group`. One group is `k_group` consecutive tokens
/// of one (head, channel), quantized as `quant` says (`Quantizer::default()`: the paper's).
/// Returns codes `[H, n, D*b/8]` and params `[H, n/G_K, 2, D]`.
pub fn pack_k(values: &[f32], shape: BlockShape, bits: u32, k_group: usize, quant: Quantizer) -> Result<Packed> {
    let qmax = check_bits(bits)?;
    let rb = check_k_shape(shape, bits, k_group)?;
    check_len("key values", values.len(), shape.elements()?)?;
    let BlockShape { heads, tokens, head_dim: d } = shape;
    let groups = tokens / k_group;
    let mut codes = vec![0u8; heads * tokens * rb];
    let mut params = vec![f16::ZERO; heads * groups * 2 * d];
    let mut lo = vec![0f32; d];
    let mut hi = vec![0f32; d];
    let mut groups_of = Vec::with_capacity(d);
    let mut column = vec![0f32; if quant.clip { k_group } else { 0 }];
    for h in 0..heads {
        for g in 0..groups {
            let first = (h * tokens + g * k_group) * d;
            let block = &values[first..first + k_group * d];
            for (c, &v) in block[..d].iter().enumerate() {
                let x = read(v, first + c)?;
                lo[c] = x;
                hi[c] = x;
            }
            for (t, row) in block.chunks_exact(d).enumerate().skip(1) {
                for (c, &v) in row.iter().enumerate() {
                    let x = read(v, first + t * d + c)?;
                    if x < lo[c] {
                        lo[c] = x;
                    }
                    if x > hi[c] {
                        hi[c] = x;
                    }
                }
            }
            groups_of.clear();
            for c in 0..d {
                check_range(lo[c], hi[c])?;
                if quant.clip {
                    for (t, x) in column.iter_mut().enumerate() {
                        *x = block[t * d + c] + 0.0;
                    }
                }
                groups_of.push(Group::choose(&column, lo[c], hi[c], qmax, quant));
            }
            let p = (h * groups + g) * 2 * d;
            for (c, q) in groups_of.iter().enumerate() {
                params[p + c] = f16::from_f32(q.scale);
                params[p + d + c] = f16::from_f32(q.offset);
            }
            for (t, row) in block.chunks_exact(d).enumerate() {
                let out_row = (h * tokens + g * k_group + t) * rb;
                let dst = &mut codes[out_row..out_row + rb];
                for (c, (&v, q)) in row.iter().zip(&groups_of).enumerate() {
                    put_code(dst, c, q.code(v + 0.0, qmax), bits);
                }
            }
        }
    }
    Ok(Packed { codes, params })
}

/// Quantize and pack values: one group is `v_group` consecutive channels of one (token, head).
///
/// `values`: `[H, n, D]` f32 (any `n`), quantized as `quant` says. Returns codes `[H, n, D*b/8]` and
/// params `[H, n, 2, D/G_V]`.
pub fn pack_v(values: &[f32], shape: BlockShape, bits: u32, v_group: usize, quant: Quantizer) -> Result<Packed> {
    let qmax = check_bits(bits)?;
    let rb = check_v_shape(shape, bits, v_group)?;
    check_len("value values", values.len(), shape.elements()?)?;
    let d = shape.head_dim;
    let groups = d / v_group;
    let rows = shape.heads * shape.tokens;
    let mut codes = vec![0u8; rows * rb];
    let mut params = vec![f16::ZERO; rows * 2 * groups];
    let mut seg_c = vec![0f32; v_group];
    for (r, row) in values.chunks_exact(d).enumerate() {
        let dst = &mut codes[r * rb..(r + 1) * rb];
        for g in 0..groups {
            let seg = &row[g * v_group..(g + 1) * v_group];
            let base = r * d + g * v_group;
            let first = read(seg[0], base)?;
            let (mut lo, mut hi) = (first, first);
            for (i, &v) in seg.iter().enumerate().skip(1) {
                let x = read(v, base + i)?;
                if x < lo {
                    lo = x;
                }
                if x > hi {
                    hi = x;
                }
            }
            check_range(lo, hi)?;
            for (x, &v) in seg_c.iter_mut().zip(seg) {
                *x = v + 0.0;
            }
            let q = Group::choose(&seg_c, lo, hi, qmax, quant);
            params[r * 2 * groups + g] = f16::from_f32(q.scale);
            params[r * 2 * groups + groups + g] = f16::from_f32(q.offset);
            for (i, &v) in seg.iter().enumerate() {
                put_code(dst, g * v_group + i, q.code(v + 0.0, qmax), bits);
            }
        }
    }
    Ok(Packed { codes, params })
}

/// Levels of a page's key grid (`key_ranges = "page"`): uint8 indices `0..=255`.
pub const PAGE_GRID_STEPS: f32 = 255.0;

/// Keys packed with page-grid ranges (docs/LAYOUT.md §1, `OscarConfig.key_ranges = "page"`).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedPageKeys {
    /// `[H, n, D*b/8]` uint8.
    pub codes: Vec<u8>,
    /// `[H, n/P, 2, D]` fp16: row 0 the grid's base, row 1 its step (0: a constant page).
    pub grid: Vec<f16>,
    /// `[H, n/G_K, 2, D]` uint8: row 0 the group's first grid index `a`, row 1 its last `b`.
    pub ranges: Vec<u8>,
}

/// A key group's `(scale, offset)` from its page grid (`base`, `step`: fp16 values) and indices, in
/// fp16 arithmetic with every operation rounded to fp16: `u = step / qmax`, `scale = (b - a) * u`,
/// `offset = base + a * step`. Each operation runs in f32 and is then rounded to fp16, which equals
/// the correctly rounded fp16 operation (f32 carries 24 >= 2 * 11 + 2 bits), as the decode
/// kernels' f16x2 instructions compute it. Returns f32s holding fp16 values.
#[inline]
pub fn page_group_grid(base: f32, step: f32, a: f32, b: f32, qmax: f32) -> (f32, f32) {
    let h = |x: f32| f16::from_f32(x).to_f32();
    let u = h(step / qmax);
    let scale = h((b - a) * u);
    let offset = h(base + h(a * step));
    (scale, offset)
}

fn check_page_k_shape(shape: BlockShape, bits: u32, k_group: usize, page_size: usize) -> Result<usize> {
    let rb = check_k_shape(shape, bits, k_group)?;
    if page_size == 0 || !page_size.is_multiple_of(k_group) || !shape.tokens.is_multiple_of(page_size) {
        return Err(Error::layout(format!(
            "a key block of {} tokens is not whole pages of {page_size} tokens in groups of k_group={k_group}",
            shape.tokens
        )));
    }
    Ok(rb)
}

/// Quantize and pack keys (already divided by their token scale) with page-grid ranges: per
/// (head, page, channel) `base = f16(min)`, `step = f16((max - base) / 255)` (stored 0 unless
/// `> 0`); per group of `k_group` tokens `a = clamp(floor((lo - base) / step), 0, 255)`,
/// `b = clamp(ceil((hi - base) / step), 0, 255)`, the group's grid from [`page_group_grid`] and codes
/// `clamp(rne((x - offset) / scale), 0, qmax)` (0 where `scale` is not `> 0`). Equals
/// `oscar_sgl.reference.page_key_grid` byte for byte.
pub fn pack_k_page(
    values: &[f32],
    shape: BlockShape,
    bits: u32,
    k_group: usize,
    page_size: usize,
) -> Result<PackedPageKeys> {
    let qmax = check_bits(bits)?;
    let rb = check_page_k_shape(shape, bits, k_group, page_size)?;
    check_len("key values", values.len(), shape.elements()?)?;
    let BlockShape { heads, tokens, head_dim: d } = shape;
    let (pages, per_page, groups) = (tokens / page_size, page_size / k_group, tokens / k_group);
    let mut codes = vec![0u8; heads * tokens * rb];
    let mut grid = vec![f16::ZERO; heads * pages * 2 * d];
    let mut ranges = vec![0u8; heads * groups * 2 * d];
    let mut lo = vec![0f32; per_page * d];
    let mut hi = vec![0f32; per_page * d];
    let mut group_grid = vec![(0f32, 0f32); per_page * d];
    for h in 0..heads {
        for p in 0..pages {
            let first = (h * tokens + p * page_size) * d;
            let page = &values[first..first + page_size * d];
            for (t, row) in page.chunks_exact(d).enumerate() {
                let g = t / k_group;
                for (c, &v) in row.iter().enumerate() {
                    let x = read(v, first + t * d + c)?;
                    let i = g * d + c;
                    if t % k_group == 0 || x < lo[i] {
                        lo[i] = x;
                    }
                    if t % k_group == 0 || x > hi[i] {
                        hi[i] = x;
                    }
                }
            }
            let gp = (h * pages + p) * 2 * d;
            for c in 0..d {
                let (mut p_lo, mut p_hi) = (lo[c], hi[c]);
                for g in 1..per_page {
                    p_lo = p_lo.min(lo[g * d + c]);
                    p_hi = p_hi.max(hi[g * d + c]);
                }
                check_range(p_lo, p_hi)?;
                let base_h = f16::from_f32(p_lo);
                let base = base_h.to_f32();
                let step_h = f16::from_f32((p_hi - base) / PAGE_GRID_STEPS);
                if !base_h.is_finite() || !step_h.is_finite() {
                    return Err(Error::layout(format!(
                        "keys in [{p_lo}, {p_hi}] exceed the fp16 range of the page grid (|k| > 65504)"
                    )));
                }
                let step_h = if step_h.to_f32() > 0.0 { step_h } else { f16::ZERO };
                grid[gp + c] = base_h;
                grid[gp + d + c] = step_h;
                let step = step_h.to_f32();
                for g in 0..per_page {
                    let i = g * d + c;
                    let (a, b) = if step > 0.0 {
                        (
                            ((lo[i] - base) / step).floor().clamp(0.0, PAGE_GRID_STEPS),
                            ((hi[i] - base) / step).ceil().clamp(0.0, PAGE_GRID_STEPS),
                        )
                    } else {
                        (0.0, 0.0)
                    };
                    let r = (h * groups + p * per_page + g) * 2 * d;
                    // Integer-valued and inside [0, 255] after the clamp: the casts are exact.
                    ranges[r + c] = a as u8;
                    ranges[r + d + c] = b as u8;
                    group_grid[i] = page_group_grid(base, step, a, b, qmax);
                }
            }
            for (t, row) in page.chunks_exact(d).enumerate() {
                let out_row = (h * tokens + p * page_size + t) * rb;
                let dst = &mut codes[out_row..out_row + rb];
                let gg = &group_grid[(t / k_group) * d..(t / k_group + 1) * d];
                for (c, (&v, &(scale, offset))) in row.iter().zip(gg).enumerate() {
                    let q =
                        if scale > 0.0 { ((v + 0.0 - offset) / scale).round_ties_even().clamp(0.0, qmax) } else { 0.0 };
                    put_code(dst, c, q as u8, bits);
                }
            }
        }
    }
    Ok(PackedPageKeys { codes, grid, ranges })
}

/// Dequantize keys packed by [`pack_k_page`]: `[H, n, D]` f32, `q * scale + offset` with the
/// group's grid from [`page_group_grid`] (still divided by s).
pub fn unpack_k_page(
    codes: &[u8],
    grid: &[f16],
    ranges: &[u8],
    shape: BlockShape,
    bits: u32,
    k_group: usize,
    page_size: usize,
) -> Result<Vec<f32>> {
    let qmax = check_bits(bits)?;
    let rb = check_page_k_shape(shape, bits, k_group, page_size)?;
    let BlockShape { heads, tokens, head_dim: d } = shape;
    let (pages, groups) = (tokens / page_size, tokens / k_group);
    check_len("key codes", codes.len(), heads * tokens * rb)?;
    check_len("key page grid", grid.len(), heads * pages * 2 * d)?;
    check_len("key ranges", ranges.len(), heads * groups * 2 * d)?;
    let mut out = Vec::with_capacity(shape.elements()?);
    for h in 0..heads {
        for t in 0..tokens {
            let row = &codes[(h * tokens + t) * rb..(h * tokens + t + 1) * rb];
            let gp = (h * pages + t / page_size) * 2 * d;
            let r = (h * groups + t / k_group) * 2 * d;
            for c in 0..d {
                let (scale, offset) = page_group_grid(
                    grid[gp + c].to_f32(),
                    grid[gp + d + c].to_f32(),
                    f32::from(ranges[r + c]),
                    f32::from(ranges[r + d + c]),
                    qmax,
                );
                out.push(f32::from(get_code(row, c, bits)) * scale + offset);
            }
        }
    }
    Ok(out)
}

/// Dequantize keys: `[H, n, D]` f32, `q * f32(scale_h) + f32(offset_h)` (still divided by s).
pub fn unpack_k(codes: &[u8], params: &[f16], shape: BlockShape, bits: u32, k_group: usize) -> Result<Vec<f32>> {
    let rb = check_k_shape(shape, bits, k_group)?;
    let BlockShape { heads, tokens, head_dim: d } = shape;
    let groups = tokens / k_group;
    check_len("key codes", codes.len(), heads * tokens * rb)?;
    check_len("key params", params.len(), heads * groups * 2 * d)?;
    let mut out = Vec::with_capacity(shape.elements()?);
    for h in 0..heads {
        for t in 0..tokens {
            let row = &codes[(h * tokens + t) * rb..(h * tokens + t + 1) * rb];
            let p = (h * groups + t / k_group) * 2 * d;
            for c in 0..d {
                let q = f32::from(get_code(row, c, bits));
                out.push(q * params[p + c].to_f32() + params[p + d + c].to_f32());
            }
        }
    }
    Ok(out)
}

/// Dequantize values: `[H, n, D]` f32.
pub fn unpack_v(codes: &[u8], params: &[f16], shape: BlockShape, bits: u32, v_group: usize) -> Result<Vec<f32>> {
    let rb = check_v_shape(shape, bits, v_group)?;
    let d = shape.head_dim;
    let groups = d / v_group;
    let rows = shape.heads * shape.tokens;
    check_len("value codes", codes.len(), rows * rb)?;
    check_len("value params", params.len(), rows * 2 * groups)?;
    let mut out = Vec::with_capacity(rows * d);
    for r in 0..rows {
        let row = &codes[r * rb..(r + 1) * rb];
        for c in 0..d {
            let g = c / v_group;
            let q = f32::from(get_code(row, c, bits));
            out.push(q * params[r * 2 * groups + g].to_f32() + params[r * 2 * groups + groups + g].to_f32());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_keys_round_trip_and_bracket() {
        // 2 heads x 2 pages of 8 tokens x 4 channels, k_group 4: a smooth ramp plus a spike.
        let shape = BlockShape::new(2, 16, 4);
        let x: Vec<f32> =
            (0..128).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0 + if i == 77 { 9.0 } else { 0.0 }).collect();
        for bits in [2u32, 4] {
            let p = pack_k_page(&x, shape, bits, 4, 8).unwrap();
            assert_eq!(
                (p.codes.len(), p.grid.len(), p.ranges.len()),
                (2 * 16 * 4 * bits as usize / 8, 2 * 2 * 2 * 4, 2 * 4 * 2 * 4)
            );
            let y = unpack_k_page(&p.codes, &p.grid, &p.ranges, shape, bits, 4, 8).unwrap();
            let qmax = check_bits(bits).unwrap();
            for h in 0..2 {
                for g in 0..4 {
                    let (page, r) = ((h * 2 + g / 2) * 8, (h * 4 + g) * 8);
                    for c in 0..4 {
                        let (base, step) = (p.grid[page + c].to_f32(), p.grid[page + 4 + c].to_f32());
                        let (a, b) = (f32::from(p.ranges[r + c]), f32::from(p.ranges[r + 4 + c]));
                        assert!(a <= b && step > 0.0);
                        let (scale, offset) = page_group_grid(base, step, a, b, qmax);
                        for t in 0..4 {
                            let i = (h * 16 + g * 4 + t) * 4 + c;
                            // inside the group's grid (up to the fp16 rounding of base), within half a step
                            assert!((y[i] - x[i]).abs() <= scale / 2.0 + step + 1e-6, "{} vs {}", y[i], x[i]);
                            assert!(x[i] >= offset - step && x[i] <= offset + scale * qmax + step);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn page_keys_constant_and_bad_input() {
        let shape = BlockShape::new(1, 8, 4);
        let p = pack_k_page(&[0.3; 32], shape, 2, 4, 8).unwrap();
        assert!(p.ranges.iter().all(|&r| r == 0) && p.codes.iter().all(|&c| c == 0));
        assert!(p.grid[4..].iter().all(|s| s.to_f32() == 0.0)); // step 0: a constant page
        let y = unpack_k_page(&p.codes, &p.grid, &p.ranges, shape, 2, 4, 8).unwrap();
        assert!(y.iter().all(|&v| (v - 0.3).abs() < 1e-3));
        assert!(pack_k_page(&[0.0; 32], shape, 2, 4, 16).is_err()); // 8 tokens are not pages of 16
        assert!(pack_k_page(&[0.0; 32], shape, 2, 3, 6).is_err());
        let mut big = vec![0.0f32; 32];
        big[5] = -1e6;
        assert!(pack_k_page(&big, shape, 2, 4, 8).is_err()); // a base beyond fp16
        big[5] = 1e6;
        assert!(pack_k_page(&big, shape, 2, 4, 8).is_ok()); // a step of 3922 is fine
        big[5] = f32::NAN;
        assert!(pack_k_page(&big, shape, 2, 4, 8).is_err());
        assert!(unpack_k_page(&p.codes, &p.grid[1..], &p.ranges, shape, 2, 4, 8).is_err());
    }

    /// Today's quantizer: integer zero point, no clip search.
    const PAPER: Quantizer = Quantizer { offset: Offset::Integer, clip: false };

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
    }

    /// A key block of 4 tokens x 4 channels: channel 0 holds `column`, the others zeros.
    fn one_channel(column: [f32; 4]) -> (BlockShape, Vec<f32>) {
        let mut x = vec![0f32; 16];
        for (t, v) in column.iter().enumerate() {
            x[t * 4] = *v;
        }
        (BlockShape::new(1, 4, 4), x)
    }

    #[test]
    fn known_group_int2() {
        // One channel, 4 tokens: lo=-1, hi=2 -> scale=1, zero=1, q = round(x)+1.
        let (shape, x) = one_channel([-1.0, 0.0, 1.0, 2.0]);
        let p = pack_k(&x, shape, 2, 4, PAPER).unwrap();
        // Channel 0 codes 0,1,2,3 at bit offset 0 of byte 0 of each token row.
        assert_eq!(p.codes, vec![0, 1, 2, 3]);
        assert_eq!(p.params[0].to_f32(), 1.0); // scale of channel 0
        assert_eq!(p.params[4].to_f32(), -1.0); // offset of channel 0
                                                // Channels 1..3 are all-zero groups: scale 0, offset 0, code 0.
        assert_eq!(p.params[1].to_bits(), 0);
        assert_eq!(p.params[5].to_bits(), 0);
    }

    #[test]
    fn min_offset_spans_the_group_exactly() {
        // lo=-0.5, hi=2.5: scale 1. Integer zero point: round(0.5) = 0 (ties to even), offset 0, so
        // -0.5 decodes to 0. Min offset: offset -0.5, the grid is {-0.5, 0.5, 1.5, 2.5}.
        let (shape, x) = one_channel([-0.5, 0.25, 1.0, 2.5]);
        let int = pack_k(&x, shape, 2, 4, PAPER).unwrap();
        assert_eq!(int.params[4].to_f32(), 0.0);
        let min = pack_k(&x, shape, 2, 4, Quantizer { offset: Offset::Min, clip: false }).unwrap();
        assert_eq!((min.params[0].to_f32(), min.params[4].to_f32()), (1.0, -0.5));
        assert_eq!(min.codes, vec![0, 1, 2, 3]);
        let y = unpack_k(&min.codes, &min.params, shape, 2, 4).unwrap();
        assert_eq!((y[0], y[12]), (-0.5, 2.5));
        assert!(Offset::parse("max").is_err());
    }

    #[test]
    fn clip_search_shrinks_an_outlier_group_and_lowers_its_error() {
        // One value channel group of 32: 31 values in [-1, 1] and one outlier at 6.
        let shape = BlockShape::new(1, 1, 32);
        let mut seed = 3u64;
        let mut x: Vec<f32> = (0..32).map(|_| lcg(&mut seed) / 4.0).collect();
        x[7] = 6.0;
        let sq = |p: &Packed| {
            let y = unpack_v(&p.codes, &p.params, shape, 2, 32).unwrap();
            x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>()
        };
        for offset in [Offset::Integer, Offset::Min] {
            let plain = pack_v(&x, shape, 2, 32, Quantizer { offset, clip: false }).unwrap();
            let clipped = pack_v(&x, shape, 2, 32, Quantizer { offset, clip: true }).unwrap();
            assert!(clipped.params[0].to_f32() < plain.params[0].to_f32(), "{offset:?}: the range did not shrink");
            assert!(sq(&clipped) < sq(&plain), "{offset:?}");
            assert_eq!(
                pack_v(&x, shape, 2, 32, PAPER).unwrap(),
                pack_v(&x, shape, 2, 32, Quantizer::default()).unwrap()
            );
        }
        // A constant group keeps its constant (every candidate scores 0: the first wins).
        let c = vec![1.5f32; 32];
        let p = pack_v(&c, shape, 2, 32, Quantizer { offset: Offset::Min, clip: true }).unwrap();
        assert_eq!((p.params[0].to_f32(), p.params[1].to_f32()), (0.0, 1.5));
    }

    #[test]
    fn constant_groups_have_no_nan() {
        let shape = BlockShape::new(2, 32, 8);
        let x = vec![3.25f32; shape.elements().unwrap()];
        let k = pack_k(&x, shape, 4, 32, PAPER).unwrap();
        let v = pack_v(&x, shape, 4, 8, PAPER).unwrap();
        assert!(k.codes.iter().all(|&b| b == 0) && v.codes.iter().all(|&b| b == 0));
        let kd = unpack_k(&k.codes, &k.params, shape, 4, 32).unwrap();
        let vd = unpack_v(&v.codes, &v.params, shape, 4, 8).unwrap();
        assert!(kd.iter().chain(&vd).all(|&y| y == 3.25));
    }

    #[test]
    fn negative_zero_is_positive_zero() {
        let shape = BlockShape::new(1, 32, 16);
        let pos = vec![0f32; shape.elements().unwrap()];
        let mut mixed = pos.clone();
        for (i, v) in mixed.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = -0.0;
            }
        }
        mixed[5] = 1.0;
        let mut pos2 = pos.clone();
        pos2[5] = 1.0;
        assert_eq!(pack_k(&mixed, shape, 2, 32, PAPER).unwrap(), pack_k(&pos2, shape, 2, 32, PAPER).unwrap());
        assert_eq!(pack_v(&mixed, shape, 2, 16, PAPER).unwrap(), pack_v(&pos2, shape, 2, 16, PAPER).unwrap());
    }

    #[test]
    fn round_trip_within_half_step() {
        let mut seed = 7u64;
        for &(bits, d, g) in &[(2u32, 64usize, 32usize), (4, 128, 32), (2, 256, 64)] {
            let shape = BlockShape::new(3, 64, d);
            let x: Vec<f32> = (0..shape.elements().unwrap()).map(|_| lcg(&mut seed)).collect();
            let k = pack_k(&x, shape, bits, g, PAPER).unwrap();
            let y = unpack_k(&k.codes, &k.params, shape, bits, g).unwrap();
            let qmax = check_bits(bits).unwrap();
            // Half a step of the widest group (range <= 8) plus fp16 rounding of scale and offset.
            let tol = 0.5 * 8.0 / qmax * 1.01 + 8.0 * 2f32.powi(-10);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol, "{a} vs {b} (bits {bits})");
            }
        }
    }

    #[test]
    fn codes_round_trip() {
        let q: Vec<u8> = (0..128u32).map(|i| (i * 7 % 16) as u8).collect();
        assert_eq!(unpack_codes(&pack_codes(&q, 64, 4).unwrap(), 64, 4).unwrap(), q);
        let q2: Vec<u8> = q.iter().map(|c| c % 4).collect();
        assert_eq!(unpack_codes(&pack_codes(&q2, 64, 2).unwrap(), 64, 2).unwrap(), q2);
        assert!(pack_codes(&q, 64, 2).is_err());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let shape = BlockShape::new(1, 32, 64);
        let x = vec![1f32; shape.elements().unwrap()];
        assert!(matches!(pack_k(&x, shape, 3, 32, PAPER), Err(Error::Layout(_))));
        assert!(matches!(pack_k(&x, shape, 2, 24, PAPER), Err(Error::Layout(_))));
        assert!(matches!(pack_k(&x[1..], shape, 2, 32, PAPER), Err(Error::Layout(_))));
        assert!(matches!(pack_v(&x, shape, 2, 48, PAPER), Err(Error::Layout(_))));
        let mut nan = x.clone();
        nan[9] = f32::NAN;
        assert!(matches!(pack_v(&nan, shape, 2, 32, PAPER), Err(Error::Layout(_))));
        let mut wide = x;
        wide[0] = f32::MAX;
        wide[64] = -f32::MAX;
        assert!(matches!(pack_k(&wide, shape, 2, 32, PAPER), Err(Error::Layout(_))));
    }
}
