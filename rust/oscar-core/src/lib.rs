//! OScaR host-side core: the golden packer (docs/LAYOUT.md), memory planning, and the page runtime
//! that mirrors SGLang's KV pages (docs/OSCAR.md §4). Pure Rust: no PyO3, no libtorch, no GPU.
//!
//! The Python binding (`rust/oscar-py`, built into `oscar_sgl._core`) is a thin shell over this
//! crate; every rule lives here.

pub mod error;
pub mod pack;
pub mod plan;
pub mod runtime;

pub use error::{Error, Result, Violation, ViolationKind};
pub use half;

/// Version of the packed byte layout (docs/LAYOUT.md §5). Recorded on every sealed page.
pub const LAYOUT_VERSION: u32 = 1;
