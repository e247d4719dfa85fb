//! Bytes per token (docs/LAYOUT.md §4) and memory planning: how many tokens a byte budget holds
//! for BF16, FP8, INT4 and INT2 KV caches of one model shape.

use crate::error::{Error, Result};
use crate::pack::check_bits;

/// How keys and values are quantized: the part of `OscarConfig` that decides the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantFormat {
    pub bits: u32,
    pub k_group: u32,
    pub v_group: u32,
    /// `S`: token-scale columns per token (0 when token scaling is off, 1 for scope `layer`,
    /// `H` for scope `head`).
    pub scale_columns: u32,
    /// Key ranges (`OscarConfig.key_ranges`): 0 for an fp16 scale/offset pair per key group, or
    /// the page size `P` for `"page"`: an fp16 (base, step) grid per (page, head, channel) and two
    /// uint8 indices per key group.
    pub key_grid_page: u32,
}

impl QuantFormat {
    /// Reject a format that cannot run on heads of `head_dim` channels (mirrors
    /// `OscarConfig.check_shape`, minus the power-of-two rule that only the rotation needs).
    pub fn check(&self, kv_heads: u32, head_dim: u32) -> Result<()> {
        check_bits(self.bits)?;
        if kv_heads == 0 {
            return Err(Error::layout(format!("num_kv_heads must be positive, got {kv_heads}")));
        }
        if !self.k_group.is_power_of_two() {
            return Err(Error::layout(format!("k_group must be a positive power of two, got {}", self.k_group)));
        }
        if !self.v_group.is_power_of_two() || !head_dim.is_multiple_of(self.v_group) {
            return Err(Error::layout(format!(
                "v_group={} must be a power of two dividing head_dim={head_dim}",
                self.v_group
            )));
        }
        if head_dim == 0 || !(u64::from(head_dim) * u64::from(self.bits)).is_multiple_of(8) {
            return Err(Error::layout(format!(
                "head_dim={head_dim} does not pack into whole bytes at {} bits",
                self.bits
            )));
        }
        if self.key_grid_page != 0 && !self.key_grid_page.is_multiple_of(self.k_group) {
            return Err(Error::layout(format!(
                "the key page grid spans {} tokens, not a multiple of k_group={}",
                self.key_grid_page, self.k_group
            )));
        }
        if self.scale_columns != 0 && self.scale_columns != 1 && self.scale_columns != kv_heads {
            return Err(Error::layout(format!(
                "scale_columns must be 0, 1 or num_kv_heads={kv_heads}, got {}",
                self.scale_columns
            )));
        }
        Ok(())
    }

    /// Packed bytes per token per layer: `H*(2*D*b/8 + K + 4*D/G_V) + 4*S` with key params
    /// `K = 4*D/G_K` (or `2*D/G_K + 4*D/P` with page-grid key ranges), computed in f64 in the same
    /// order as `OscarConfig.bytes_per_token`, so the two agree exactly.
    pub fn bytes_per_token(&self, kv_heads: u32, head_dim: u32) -> Result<f64> {
        self.check(kv_heads, head_dim)?;
        let (h, d) = (f64::from(kv_heads), f64::from(head_dim));
        let k_params = if self.key_grid_page == 0 {
            4.0 * d / f64::from(self.k_group)
        } else {
            2.0 * d / f64::from(self.k_group) + 4.0 * d / f64::from(self.key_grid_page)
        };
        let per_head = 2.0 * d * f64::from(self.bits) / 8.0 + k_params + 4.0 * d / f64::from(self.v_group);
        Ok(h * per_head + 4.0 * f64::from(self.scale_columns))
    }

    /// Stored bits per K/V element: `8 * bytes_per_token / (2 * H * D)`.
    pub fn effective_bits(&self, kv_heads: u32, head_dim: u32) -> Result<f64> {
        Ok(8.0 * self.bytes_per_token(kv_heads, head_dim)? / (2.0 * f64::from(kv_heads) * f64::from(head_dim)))
    }

    /// Exact packed bytes of one page of one layer (`page_size` a multiple of `k_group`).
    pub fn bytes_per_page_layer(&self, kv_heads: u32, head_dim: u32, page_size: u32) -> Result<u64> {
        self.check(kv_heads, head_dim)?;
        if page_size == 0 || !page_size.is_multiple_of(self.k_group) {
            return Err(Error::layout(format!(
                "page_size={page_size} must be a positive multiple of k_group={}",
                self.k_group
            )));
        }
        if self.key_grid_page != 0 && self.key_grid_page != page_size {
            return Err(Error::layout(format!(
                "the key page grid spans {} tokens, but pages hold {page_size}",
                self.key_grid_page
            )));
        }
        let (h, d, p) = (u64::from(kv_heads), u64::from(head_dim), u64::from(page_size));
        let codes = product(&[2, p, d, u64::from(self.bits)])? / 8;
        let k_params = if self.key_grid_page == 0 {
            product(&[4, d, p / u64::from(self.k_group)])?
        } else {
            product(&[2, d, p / u64::from(self.k_group)])?.checked_add(product(&[4, d])?).ok_or_else(overflow)?
        };
        let v_params = product(&[4, d / u64::from(self.v_group), p])?;
        let scales = product(&[4, u64::from(self.scale_columns), p])?;
        let per_head = codes.checked_add(k_params).and_then(|x| x.checked_add(v_params));
        per_head.and_then(|x| x.checked_mul(h)).and_then(|x| x.checked_add(scales)).ok_or_else(overflow)
    }
}

fn overflow() -> Error {
    Error::layout("the byte count of one page overflows 64 bits (the shape or page size is too large)")
}

/// The product of `factors`, or a layout error when it does not fit in a u64 (release builds would
/// wrap around silently).
fn product(factors: &[u64]) -> Result<u64> {
    factors.iter().try_fold(1u64, |acc, &x| acc.checked_mul(x)).ok_or_else(overflow)
}

/// Model dimensions that size a KV cache (per rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
}

/// KV cache storage the planner compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    Bf16,
    Fp8,
    Int4,
    Int2,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::Bf16, KvDtype::Fp8, KvDtype::Int4, KvDtype::Int2];

    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
            Self::Int4 => "int4",
            Self::Int2 => "int2",
        }
    }
}

/// What one storage format gets out of a byte budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    pub dtype: KvDtype,
    /// Bytes per token over all layers (packed, BF16 staging excluded).
    pub bytes_per_token: f64,
    /// Bytes of one page over all layers.
    pub bytes_per_page: u64,
    /// Bytes of the BF16 staging pages (0 for BF16 and FP8, which need none).
    pub staging_bytes: u64,
    /// Pages the budget holds, SGLang's padding page (page 0) already taken out.
    pub pages: u64,
    /// `pages * page_size`: tokens the pool holds.
    pub tokens: u64,
}

/// Tokens that fit in `budget_bytes` for each of BF16, FP8, INT4 and INT2.
///
/// The quantized formats pay for `staging_pages` BF16 pages (the open pages, docs/OSCAR.md §4) before
/// any packed page; INT4/INT2 take groups and token scaling from `quant` with `bits` replaced.
/// Every pool also loses one page to SGLang's padding slot 0.
pub fn plan_memory(
    shape: ModelShape,
    quant: QuantFormat,
    page_size: u32,
    staging_pages: u64,
    budget_bytes: u64,
) -> Result<Vec<MemoryPlan>> {
    if shape.layers == 0 {
        return Err(Error::layout("layers must be positive"));
    }
    if page_size == 0 {
        return Err(Error::layout("page_size must be positive"));
    }
    quant.check(shape.kv_heads, shape.head_dim)?;
    let (l, h, d, p) =
        (u64::from(shape.layers), u64::from(shape.kv_heads), u64::from(shape.head_dim), u64::from(page_size));
    let bf16_page = product(&[l, h, d, 2, 2, p])?;
    let staging_bytes =
        staging_pages.checked_mul(bf16_page).ok_or_else(|| Error::layout("staging bytes overflow u64"))?;
    KvDtype::ALL
        .iter()
        .map(|&dtype| {
            let (page_bytes, bpt, staging) = match dtype {
                KvDtype::Bf16 => (bf16_page, (l * h * d * 4) as f64, 0),
                KvDtype::Fp8 => (bf16_page / 2, (l * h * d * 2) as f64, 0),
                KvDtype::Int4 | KvDtype::Int2 => {
                    let q = QuantFormat { bits: if dtype == KvDtype::Int4 { 4 } else { 2 }, ..quant };
                    let per_layer = q.bytes_per_page_layer(shape.kv_heads, shape.head_dim, page_size)?;
                    let bpt = q.bytes_per_token(shape.kv_heads, shape.head_dim)? * l as f64;
                    (per_layer.checked_mul(l).ok_or_else(overflow)?, bpt, staging_bytes)
                }
            };
            let pages = budget_bytes.saturating_sub(staging) / page_bytes;
            let pages = pages.saturating_sub(1);
            Ok(MemoryPlan {
                dtype,
                bytes_per_token: bpt,
                bytes_per_page: page_bytes,
                staging_bytes: staging,
                pages,
                tokens: pages * p,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: QuantFormat = QuantFormat { bits: 2, k_group: 32, v_group: 32, scale_columns: 1, key_grid_page: 0 };

    #[test]
    fn layout_doc_numbers() {
        // docs/LAYOUT.md §4: Llama-3.1-8B shape (96.5 B / 160.5 B per KV head) and SmolLM2.
        assert_eq!(LAYER.bytes_per_token(8, 128).unwrap(), 8.0 * 96.5);
        assert_eq!(QuantFormat { bits: 4, ..LAYER }.bytes_per_token(8, 128).unwrap(), 8.0 * 160.5);
        assert!((4096.0 / LAYER.bytes_per_token(8, 128).unwrap() - 5.31).abs() < 5e-3);
        assert!((LAYER.effective_bits(8, 128).unwrap() - 3.016).abs() < 1e-3);
        assert!((LAYER.effective_bits(3, 64).unwrap() - 3.083).abs() < 1e-3);
        assert_eq!(LAYER.bytes_per_page_layer(8, 128, 128).unwrap(), 772 * 128);
        // Page-grid key ranges, G_K = 16, G_V = 64, R = 128 on SmolLM2: keys 2 + 1 + 0.25 bits,
        // values 2 + 0.5, token scales 32 / (2 * 3 * 64).
        let page = QuantFormat { k_group: 16, v_group: 64, key_grid_page: 128, ..LAYER };
        assert!((page.effective_bits(3, 64).unwrap() - (2.875 + 32.0 / 384.0)).abs() < 1e-12);
        assert!(QuantFormat { key_grid_page: 24, ..page }.check(3, 64).is_err());
    }

    #[test]
    fn page_bytes_match_token_bytes() {
        for &(h, d, kg, vg, s, p) in
            &[(8u32, 128u32, 32u32, 32u32, 1u32, 128u32), (3, 64, 128, 16, 3, 256), (1, 256, 64, 64, 0, 64)]
        {
            for (bits, grid) in [(2, 0), (4, 0), (2, p), (4, p)] {
                let q = QuantFormat { bits, k_group: kg, v_group: vg, scale_columns: s, key_grid_page: grid };
                let page = q.bytes_per_page_layer(h, d, p).unwrap() as f64;
                assert_eq!(page, q.bytes_per_token(h, d).unwrap() * p as f64);
            }
            let q = QuantFormat { bits: 2, k_group: kg, v_group: vg, scale_columns: s, key_grid_page: p };
            assert!(q.bytes_per_page_layer(h, d, 2 * p).is_err()); // the grid spans a page
        }
    }

    #[test]
    fn plan_orders_formats() {
        let shape = ModelShape { layers: 32, kv_heads: 8, head_dim: 128 };
        let plans = plan_memory(shape, LAYER, 128, 64, 40 << 30).unwrap();
        let tokens: Vec<u64> = plans.iter().map(|p| p.tokens).collect();
        assert!(tokens[0] < tokens[1] && tokens[1] < tokens[2] && tokens[2] < tokens[3]);
        // BF16: 128 KiB per token for this shape -> 40 GiB / 128 KiB = 327680 tokens, minus one page.
        assert_eq!(tokens[0], 327_680 - 128);
        assert_eq!(plans[3].staging_bytes, 64 * 128 * 128 * 1024);
        assert!(plan_memory(shape, LAYER, 80, 0, 1 << 30).is_err());
        assert!(plan_memory(ModelShape { layers: 0, ..shape }, LAYER, 128, 0, 1 << 30).is_err());
        assert!(plan_memory(shape, LAYER, 0, 0, 1 << 30).is_err()); // not a division by zero
    }

    #[test]
    fn byte_counts_that_overflow_are_errors() {
        let huge = ModelShape { layers: u32::MAX, kv_heads: u32::MAX, head_dim: 1 << 31 };
        let err = plan_memory(huge, QuantFormat { v_group: 1, ..LAYER }, 1 << 31, 0, u64::MAX).unwrap_err();
        assert!(matches!(err, Error::Layout(_)) && err.to_string().contains("overflows 64 bits"), "{err}");
        assert!(LAYER.bytes_per_page_layer(u32::MAX, 1 << 31, 1 << 31).is_err());
    }

    #[test]
    fn tiny_budget_is_zero_not_an_error() {
        let shape = ModelShape { layers: 2, kv_heads: 2, head_dim: 64 };
        let plans = plan_memory(shape, LAYER, 32, 1000, 1000).unwrap();
        assert!(plans.iter().all(|p| p.tokens == 0));
    }
}
