//! The one error type of the crate. Every input-dependent failure is a value of [`Error`], never a
//! panic: the Python binding maps each variant to one exception class (`oscar_sgl.errors`).

use std::fmt;

/// Which runtime invariant a page event or a [`crate::runtime::Runtime::check`] found broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A page that is not free was allocated again.
    DoubleAlloc,
    /// A free page was released.
    DoubleFree,
    /// A page with a radix-cache lock was released.
    ReleaseLocked,
    /// A token was written into a sealed page.
    WriteSealed,
    /// A token was written into a free page.
    WriteFree,
    /// A write did not start where the page's fill ends (pages are append-only).
    FillMismatch,
    /// A write would push a page past `page_size` tokens.
    Overflow,
    /// A page that is not sealed was locked or handed to the radix cache.
    ShareUnsealed,
    /// An unlock without a matching lock.
    UnlockUnlocked,
    /// Staging bookkeeping is inconsistent (a slot leaked, is used twice, or a map entry is stale).
    StagingLeak,
    /// Page counters disagree with the page table.
    Census,
}

impl ViolationKind {
    /// Stable snake_case name, used as the `kind` attribute of the Python exception.
    pub fn name(self) -> &'static str {
        match self {
            Self::DoubleAlloc => "double_alloc",
            Self::DoubleFree => "double_free",
            Self::ReleaseLocked => "release_locked",
            Self::WriteSealed => "write_sealed",
            Self::WriteFree => "write_free",
            Self::FillMismatch => "fill_mismatch",
            Self::Overflow => "overflow",
            Self::ShareUnsealed => "share_unsealed",
            Self::UnlockUnlocked => "unlock_unlocked",
            Self::StagingLeak => "staging_leak",
            Self::Census => "census",
        }
    }
}

/// A broken invariant: always a bug in the caller's event stream or in the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    /// The page concerned, when there is one.
    pub page: Option<u32>,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.page {
            Some(p) => write!(f, "{} (page {p}): {}", self.kind.name(), self.detail),
            None => write!(f, "{}: {}", self.kind.name(), self.detail),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Bad shape, bit width, group, buffer length or non-finite value handed to the packer or the
    /// memory planner; also an invalid runtime configuration.
    #[error("{0}")]
    Layout(String),
    /// The event batch itself is malformed (unknown opcode, truncated record, page id out of
    /// range). `at` is the word offset in the ops array.
    #[error("malformed event batch at ops[{at}]: {why}")]
    Event { at: usize, why: String },
    /// No free BF16 staging page for a page that opens. Events before `event` were applied.
    #[error("staging pool exhausted: all {capacity} staging pages are in use (event {event}, page {page})")]
    StagingExhausted { capacity: u32, page: u32, event: usize },
    /// A runtime invariant does not hold. Events before `event` were applied.
    #[error("invariant violated: {violation}")]
    Invariant { violation: Violation, event: Option<usize> },
}

impl Error {
    pub(crate) fn layout(msg: impl Into<String>) -> Self {
        Self::Layout(msg.into())
    }

    /// Stable snake_case name of the variant (the key `oscar_sgl.errors` maps to a class).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Layout(_) => "layout",
            Self::Event { .. } => "event",
            Self::StagingExhausted { .. } => "staging_exhausted",
            Self::Invariant { .. } => "invariant",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
