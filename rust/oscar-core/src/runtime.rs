//! The host runtime: a mirror of SGLang's KV pages with their OScaR state (docs/OSCAR.md §4).
//!
//! SGLang owns page allocation (its own free list); this runtime is told what happened, once per
//! scheduler step, as one batch of events, and answers with the work the GPU must do:
//!
//! * which pages became full and must be quantized (the **seal plan**, `(page, staging slot)`
//!   pairs, one kernel launch), and
//! * which entries of the **page → staging map** changed (the decode kernel reads a page from
//!   staging while the map says a slot, from the packed pool when it says `-1`).
//!
//! A page is `Free`, `Open` (a request is still writing it; its BF16 K/V live in one staging slot)
//! or `Sealed` (quantized, immutable, shareable through the radix cache). A page that fills during
//! step `t` is sealed by the kernel *after* forward `t`, so its slot stays mapped, and reserved,
//! until the next step starts: a slot is never handed to another page while the seal that reads it
//! is still queued. A page released in the same step it filled has its plan entry cancelled
//! (page `-1`, skipped by the seal kernel): two entries never target one page in one launch.
//!
//! **Direct seals.** A page that one prefill row opens and fills in a single step (every page of a
//! prompt chunk but its last, partial one) is never read from staging: the step's attention takes
//! the chunk's own keys and values from the forward, and the page is sealed in that very step. Such
//! a page takes no staging slot. It gets one of `scratch_slots` per-step scratch slots instead,
//! named in the seal plan as `staging_slots + k` (a one-layer scratch buffer on the GPU side, reused
//! layer after layer), and its map entry stays [`NO_SLOT`]. Scratch slots all return at the next
//! step; when they run out the page takes a staging slot as before. So staging holds only open pages
//! (and pages sealed this step that were opened earlier), not whole prefill chunks.
//!
//! Contract with the GPU side, per step `t`: apply the map changes to the device copy of the map
//! before forward `t` reads it; enqueue the seal plan on the same stream after forward `t` wrote its
//! K/V and before forward `t + 1` (the slots it reads are handed out again from step `t + 1` on).
//!
//! # Event batch (`ops`, `ids`)
//!
//! `ops` is a flat `i64` array of records `[opcode, count, args...]`; `ids` is a flat `i64` array of
//! page ids that the records consume in order. All values are little-endian when passed as bytes.
//!
//! | opcode | record | ids consumed |
//! |---|---|---|
//! | [`OP_EXTEND`] | `[1, bs, prefix_len × bs, seq_len × bs]` | per row with `seq > prefix`: every page the row writes, first to last |
//! | [`OP_DECODE`] | `[2, bs, seq_len × bs]` (one token at `seq_len - 1`) | `bs`: the page each row writes |
//! | [`OP_ALLOC`]  | `[3, n]` | `n` pages opened empty |
//! | [`OP_WRITE`]  | `[4, n, tokens × n]` | `n` pages, each appended `tokens` tokens |
//! | [`OP_RELEASE`]| `[5, n]` | `n` pages returned to SGLang's free list |
//! | [`OP_LOCK`]   | `[6, n]` | `n` pages, one radix-cache lock each |
//! | [`OP_UNLOCK`] | `[7, n]` | `n` pages, one lock released each |
//! | [`OP_SHARE`]  | `[8, n]` | `n` pages now held by the radix cache |
//!
//! `EXTEND` and `DECODE` carry the positions, so the runtime checks that every write starts where
//! the page's fill ends (pages are append-only) and opens a page exactly when a row starts one.

use crate::error::{Error, Result, Violation, ViolationKind};
use crate::plan::QuantFormat;
use crate::LAYOUT_VERSION;

pub const OP_EXTEND: i64 = 1;
pub const OP_DECODE: i64 = 2;
pub const OP_ALLOC: i64 = 3;
pub const OP_WRITE: i64 = 4;
pub const OP_RELEASE: i64 = 5;
pub const OP_LOCK: i64 = 6;
pub const OP_UNLOCK: i64 = 7;
pub const OP_SHARE: i64 = 8;

/// Map value of a page that is not in staging.
pub const NO_SLOT: i32 = -1;

/// Largest page size: fills are stored as `u16`.
pub const MAX_PAGE_SIZE: u32 = 1 << 15;

/// A page attribute stored in a few bits of the runtime's packed page byte: the enum, the name
/// Python sees (`page_info`) and the decoding of the stored bits (a value no variant has reads as the
/// last variant; the runtime only stores its own).
macro_rules! page_attribute {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $value:literal, $text:literal;)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vdoc])* $variant = $value,)+
        }

        impl $name {
            const ALL: &'static [$name] = &[$($name::$variant),+];

            /// Its name in `page_info` and the statistics.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            #[inline]
            fn from_bits(bits: u8) -> Self {
                let last = Self::ALL[Self::ALL.len() - 1];
                Self::ALL.iter().copied().find(|v| *v as u8 == bits).unwrap_or(last)
            }
        }
    };
}

page_attribute! {
    /// Where a page's tokens are (docs/OSCAR.md: a page is filled in staging, then sealed once full).
    PageState {
        /// Holds nothing; can be allocated.
        Free = 0, "free";
        /// Being filled: its tokens are BF16 in the staging slot the page map names.
        Open = 1, "open";
        /// Full and quantized into the packed pool (its staging slot released).
        Sealed = 2, "sealed";
    }
}

page_attribute! {
    /// Who holds a page.
    Owner {
        /// Free.
        None = 0, "none";
        /// A request's KV row (everything freshly allocated).
        Request = 1, "request";
        /// The radix cache (shared prefix; always sealed).
        Tree = 2, "tree";
    }
}

/// The packed format every sealed page of a runtime is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageFormat {
    pub quant: QuantFormat,
    pub layout_version: u32,
}

/// Construction parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Page ids are `0..num_pages` (SGLang: its `num_pages + 1`, page 0 being the padding page).
    pub num_pages: u32,
    pub page_size: u32,
    /// BF16 staging pages (slots `0..staging_slots`).
    pub staging_slots: u32,
    /// Per-step scratch slots for direct seals (plan slots `staging_slots..staging_slots +
    /// scratch_slots`); 0 turns direct seals off.
    pub scratch_slots: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub quant: QuantFormat,
}

/// One page as the runtime sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    pub state: PageState,
    pub owner: Owner,
    pub fill: u32,
    /// Staging slot the decode kernel reads, or [`NO_SLOT`].
    pub slot: i32,
    pub locks: u32,
    /// The format of a sealed page.
    pub format: Option<PageFormat>,
}

/// Counters for the server's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    pub total_pages: u64,
    pub free_pages: u64,
    pub open_pages: u64,
    pub sealed_pages: u64,
    pub tree_pages: u64,
    pub locked_pages: u64,
    /// Tokens held in open pages (the BF16 tail).
    pub open_tokens: u64,
    pub staging_capacity: u64,
    /// Slots held by open pages plus those waiting for this step's seals.
    pub staging_in_use: u64,
    pub staging_high_water: u64,
    pub steps: u64,
    pub seals_last_step: u64,
    pub seals_total: u64,
    /// Seals of pages opened and filled in one step, sealed from scratch (no staging slot).
    pub direct_seals_total: u64,
    pub max_seals_per_step: u64,
    pub events_total: u64,
    /// BF16 bytes of the stored tokens over the bytes they take now (sealed packed + open BF16).
    pub compression_ratio: f64,
    /// BF16 over packed bytes per token: the ratio once everything is sealed.
    pub format_ratio: f64,
}

// State byte: bits 0-1 PageState, bits 2-3 Owner, bit 7 "map entry changed this step".
const STATE_MASK: u8 = 0b11;
const OWNER_SHIFT: u8 = 2;
const OWNER_MASK: u8 = 0b11 << OWNER_SHIFT;
const DIRTY: u8 = 0x80;

/// The page table, staging pool and per-step outputs.
#[derive(Debug, Clone)]
pub struct Runtime {
    cfg: RuntimeConfig,
    format: PageFormat,
    state: Vec<u8>,
    fill: Vec<u16>,
    map: Vec<i32>,
    locks: Vec<u32>,
    free_slots: Vec<i32>,
    /// `(page, slot)` sealed during the current step: the slot frees when the next step starts.
    pending: Vec<(u32, i32)>,
    /// `(page, plan entry)` of this step's direct seals (scratch slots, no staging slot).
    direct: Vec<(u32, usize)>,
    dirty: Vec<u32>,
    plan: Vec<i32>,
    delta: Vec<i32>,
    /// False after a step that failed: its plan and pending seals are carried into the next step.
    delivered: bool,
    stats: Stats,
    packed_bpt: f64,
    bf16_bpt: f64,
}

/// What the GPU side needs after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOutput<'a> {
    /// `(page, staging slot)` pairs to quantize after this step's forward.
    pub seal_plan: &'a [i32],
    /// `(page, slot or -1)` pairs: entries of the page → staging map that changed.
    pub map_delta: &'a [i32],
}

fn violation(kind: ViolationKind, page: Option<u32>, detail: impl Into<String>) -> Violation {
    Violation { kind, page, detail: detail.into() }
}

struct Cursor<'a> {
    ops: &'a [i64],
    at: usize,
    ids: &'a [i64],
    next_id: usize,
    num_pages: u32,
}

impl<'a> Cursor<'a> {
    fn word(&mut self, what: &str) -> Result<i64> {
        let w = self
            .ops
            .get(self.at)
            .copied()
            .ok_or_else(|| Error::Event { at: self.at, why: format!("batch ends where {what} was expected") })?;
        self.at += 1;
        Ok(w)
    }

    fn count(&mut self, what: &str) -> Result<usize> {
        let at = self.at;
        let w = self.word(what)?;
        usize::try_from(w)
            .ok()
            .filter(|&n| n <= self.ops.len() + self.ids.len())
            .ok_or_else(|| Error::Event { at, why: format!("{what} = {w} is not a valid count") })
    }

    fn slice(&mut self, n: usize, what: &str) -> Result<&'a [i64]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.ops.len())
            .ok_or_else(|| Error::Event { at: self.at, why: format!("{what}: record wants {n} words past the end") })?;
        let s = &self.ops[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn page(&mut self) -> Result<u32> {
        let i = self.next_id;
        let raw = self.ids.get(i).copied().ok_or_else(|| Error::Event {
            at: self.at,
            why: format!("ids exhausted: the record needs page id #{i}, only {} given", self.ids.len()),
        })?;
        self.next_id += 1;
        u32::try_from(raw).ok().filter(|&p| p < self.num_pages).ok_or_else(|| Error::Event {
            at: self.at,
            why: format!("page id {raw} (ids[{i}]) is outside 0..{}", self.num_pages),
        })
    }
}

fn to_len(v: i64, at: usize, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::Event { at, why: format!("{what} = {v} is negative") })
}

impl Runtime {
    pub fn new(cfg: RuntimeConfig) -> Result<Self> {
        cfg.quant.check(cfg.kv_heads, cfg.head_dim)?;
        if cfg.page_size == 0 || cfg.page_size > MAX_PAGE_SIZE || !cfg.page_size.is_multiple_of(cfg.quant.k_group) {
            return Err(Error::layout(format!(
                "page_size={} must be a multiple of k_group={} and at most {MAX_PAGE_SIZE}",
                cfg.page_size, cfg.quant.k_group
            )));
        }
        if cfg.num_pages == 0 || cfg.num_pages > i32::MAX as u32 {
            return Err(Error::layout(format!("num_pages={} must be in 1..=2^31-1", cfg.num_pages)));
        }
        if cfg.staging_slots.checked_add(cfg.scratch_slots).is_none_or(|n| n > i32::MAX as u32) {
            return Err(Error::layout("staging_slots + scratch_slots must fit in int32"));
        }
        let n = cfg.num_pages as usize;
        let packed_bpt = cfg.quant.bytes_per_token(cfg.kv_heads, cfg.head_dim)?;
        let bf16_bpt = f64::from(cfg.kv_heads) * f64::from(cfg.head_dim) * 4.0;
        let mut rt = Self {
            cfg,
            format: PageFormat { quant: cfg.quant, layout_version: LAYOUT_VERSION },
            state: vec![0; n],
            fill: vec![0; n],
            map: vec![NO_SLOT; n],
            locks: vec![0; n],
            free_slots: Vec::with_capacity(cfg.staging_slots as usize),
            pending: Vec::new(),
            direct: Vec::new(),
            dirty: Vec::new(),
            plan: Vec::new(),
            delta: Vec::new(),
            delivered: true,
            stats: Stats::default(),
            packed_bpt,
            bf16_bpt,
        };
        rt.reset();
        Ok(rt)
    }

    /// Everything free, as after SGLang's `allocator.clear()`. Queued seals are dropped; the next
    /// step's map changes set every page that was in staging back to [`NO_SLOT`].
    pub fn reset(&mut self) {
        let mapped: Vec<u32> = (0..self.map.len()).filter(|&i| self.map[i] != NO_SLOT).map(|i| i as u32).collect();
        self.state.fill(0);
        self.fill.fill(0);
        self.map.fill(NO_SLOT);
        self.locks.fill(0);
        // Pop order hands out slot 0 first.
        self.free_slots.clear();
        self.free_slots.extend((0..self.cfg.staging_slots as i32).rev());
        self.pending.clear();
        self.direct.clear();
        self.dirty.clear();
        self.plan.clear();
        self.delta.clear();
        self.delivered = true;
        for page in mapped {
            self.state[page as usize] |= DIRTY;
            self.dirty.push(page);
        }
        self.stats = Stats {
            total_pages: u64::from(self.cfg.num_pages),
            free_pages: u64::from(self.cfg.num_pages),
            staging_capacity: u64::from(self.cfg.staging_slots),
            ..Stats::default()
        };
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    pub fn format(&self) -> PageFormat {
        self.format
    }

    /// The whole page → staging map (`i32` per page, [`NO_SLOT`] when not in staging).
    pub fn page_to_staging(&self) -> &[i32] {
        &self.map
    }

    /// Staging slots free right now (slots of this step's seals are not).
    pub fn staging_free(&self) -> usize {
        self.free_slots.len()
    }

    /// Staging slots the next step's batch can open pages into: the free ones plus those its start
    /// releases (the seals delivered by the last step).
    pub fn staging_available(&self) -> usize {
        self.free_slots.len() + if self.delivered { self.pending.len() } else { 0 }
    }

    pub fn page_info(&self, page: u32) -> Result<PageInfo> {
        let i = page as usize;
        if i >= self.state.len() {
            return Err(Error::layout(format!("page {page} is outside 0..{}", self.cfg.num_pages)));
        }
        let state = self.page_state(i);
        Ok(PageInfo {
            state,
            owner: self.owner(i),
            fill: u32::from(self.fill[i]),
            slot: self.map[i],
            locks: self.locks[i],
            format: (state == PageState::Sealed).then_some(self.format),
        })
    }

    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.staging_in_use = s.staging_capacity - self.free_slots.len() as u64;
        let sealed_tokens = (s.sealed_pages * u64::from(self.cfg.page_size)) as f64;
        let open_tokens = s.open_tokens as f64;
        let now = sealed_tokens * self.packed_bpt + open_tokens * self.bf16_bpt;
        s.compression_ratio = if now > 0.0 { (sealed_tokens + open_tokens) * self.bf16_bpt / now } else { 1.0 };
        s.format_ratio = self.bf16_bpt / self.packed_bpt;
        s
    }

    #[inline]
    fn page_state(&self, i: usize) -> PageState {
        PageState::from_bits(self.state[i] & STATE_MASK)
    }

    #[inline]
    fn owner(&self, i: usize) -> Owner {
        Owner::from_bits((self.state[i] & OWNER_MASK) >> OWNER_SHIFT)
    }

    #[inline]
    fn set(&mut self, i: usize, state: PageState, owner: Owner) {
        self.state[i] = (self.state[i] & DIRTY) | state as u8 | ((owner as u8) << OWNER_SHIFT);
    }

    #[inline]
    fn set_map(&mut self, i: usize, slot: i32) {
        self.map[i] = slot;
        if self.state[i] & DIRTY == 0 {
            self.state[i] |= DIRTY;
            self.dirty.push(i as u32);
        }
    }

    /// Apply one step's events; return the seal plan and the map changes.
    ///
    /// On error the events before the failing one stay applied, and the plan and map changes
    /// gathered so far are delivered by the next successful step (nothing is lost or freed early).
    pub fn step(&mut self, ops: &[i64], ids: &[i64]) -> Result<StepOutput<'_>> {
        if self.delivered {
            self.plan.clear();
            self.direct.clear();
            self.delta.clear();
            self.retire_pending();
            self.stats.seals_last_step = 0;
        }
        self.delivered = false;
        self.apply(ops, ids)?;
        #[cfg(debug_assertions)]
        self.check().map_err(|violation| Error::Invariant { violation, event: None })?;
        for &page in &self.dirty {
            let i = page as usize;
            self.state[i] &= !DIRTY;
            self.delta.push(page as i32);
            self.delta.push(self.map[i]);
        }
        self.dirty.clear();
        self.delivered = true;
        self.stats.steps += 1;
        self.stats.max_seals_per_step = self.stats.max_seals_per_step.max(self.stats.seals_last_step);
        Ok(StepOutput { seal_plan: &self.plan, map_delta: &self.delta })
    }

    /// Last step's seals have been enqueued after its forward (stream order): their slots go back
    /// to the pool, and the map entries that still name them are reset (delivered by the next step).
    fn retire_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for &(page, slot) in &pending {
            let i = page as usize;
            if self.map[i] == slot {
                self.set_map(i, NO_SLOT);
            }
            self.free_slots.push(slot);
        }
        self.pending = pending;
        self.pending.clear();
    }

    /// Apply the events that follow a step's forward (SGLang's result processing: releases,
    /// radix-cache locks, unlocks and inserts) *between* steps, so that [`Runtime::stats`] describes
    /// the state after the step rather than before the next one.
    ///
    /// Only [`OP_RELEASE`], [`OP_LOCK`], [`OP_UNLOCK`] and [`OP_SHARE`] are accepted: writes and
    /// allocations open and fill pages, whose seal plan and map changes only a [`Runtime::step`]
    /// delivers (a batch holding one is refused whole, before anything is applied). When the last
    /// step was delivered its seals have been enqueued (the caller flushes only after the step's
    /// forward), so their staging slots come back here, exactly as at the next step's start. Map
    /// changes made here are delivered by the next step; no step is counted.
    pub fn flush(&mut self, ops: &[i64], ids: &[i64]) -> Result<()> {
        self.validate(ops, ids)?;
        let mut at = 0usize;
        while at < ops.len() {
            let (op, n) = (ops[at], ops[at + 1] as usize);
            let args = match op {
                OP_EXTEND => 2 * n,
                OP_DECODE | OP_WRITE => n,
                _ => 0,
            };
            if matches!(op, OP_EXTEND | OP_DECODE | OP_WRITE | OP_ALLOC) {
                return Err(Error::Event {
                    at,
                    why: format!(
                        "opcode {op} writes or opens pages: it belongs to a step, not to a flush between steps"
                    ),
                });
            }
            at += 2 + args;
        }
        if self.delivered {
            self.plan.clear();
            self.direct.clear();
            self.retire_pending();
        }
        self.apply(ops, ids)?;
        #[cfg(debug_assertions)]
        self.check().map_err(|violation| Error::Invariant { violation, event: None })?;
        Ok(())
    }

    /// Structural check of a whole batch before any of it is applied, so a malformed batch
    /// changes nothing: opcodes, record lengths, lengths non-negative and ordered, the number of
    /// page ids the records consume, and every id in range.
    fn validate(&self, ops: &[i64], ids: &[i64]) -> Result<()> {
        let p_size = i64::from(self.cfg.page_size);
        let mut cur = Cursor { ops, at: 0, ids, next_id: 0, num_pages: self.cfg.num_pages };
        let mut needed: u64 = 0;
        while cur.at < ops.len() {
            let start = cur.at;
            let op = cur.word("an opcode")?;
            let n = cur.count("a count")?;
            let bad = |why: String| Error::Event { at: start, why };
            match op {
                OP_EXTEND => {
                    let lens = cur.slice(n.saturating_mul(2), "extend lengths")?;
                    let (prefix, seq) = lens.split_at(n);
                    for (&p, &s) in prefix.iter().zip(seq) {
                        if p < 0 || s < p {
                            return Err(bad(format!("extend row with prefix_len {p}, seq_len {s}")));
                        }
                        if s > p {
                            needed = needed.saturating_add(((s - 1) / p_size - p / p_size + 1) as u64);
                        }
                    }
                }
                OP_DECODE => {
                    if let Some(s) = cur.slice(n, "decode lengths")?.iter().find(|&&s| s < 1) {
                        return Err(bad(format!("decode row with seq_len {s}")));
                    }
                    needed = needed.saturating_add(n as u64);
                }
                OP_WRITE => {
                    if let Some(c) = cur.slice(n, "write counts")?.iter().find(|&&c| c < 0) {
                        return Err(bad(format!("write of {c} tokens")));
                    }
                    needed = needed.saturating_add(n as u64);
                }
                OP_ALLOC | OP_RELEASE | OP_LOCK | OP_UNLOCK | OP_SHARE => needed = needed.saturating_add(n as u64),
                other => return Err(bad(format!("unknown opcode {other}"))),
            }
        }
        if needed != ids.len() as u64 {
            return Err(Error::Event {
                at: ops.len(),
                why: format!("{} page ids given, the records consume {needed}", ids.len()),
            });
        }
        for _ in 0..ids.len() {
            cur.page()?;
        }
        Ok(())
    }

    fn apply(&mut self, ops: &[i64], ids: &[i64]) -> Result<()> {
        self.validate(ops, ids)?;
        let mut cur = Cursor { ops, at: 0, ids, next_id: 0, num_pages: self.cfg.num_pages };
        let mut event = 0usize;
        while cur.at < ops.len() {
            let start = cur.at;
            let op = cur.word("an opcode")?;
            let n = cur.count("a count")?;
            let res = match op {
                OP_EXTEND => self.extend(&mut cur, n, start),
                OP_DECODE => self.decode(&mut cur, n, start),
                OP_WRITE => {
                    let counts = cur.slice(n, "write counts")?;
                    counts.iter().try_for_each(|&c| {
                        let page = cur.page()?;
                        let c = to_len(c, start, "write count")?;
                        self.write(page, c, None)
                    })
                }
                OP_ALLOC | OP_RELEASE | OP_LOCK | OP_UNLOCK | OP_SHARE => (0..n).try_for_each(|_| {
                    let page = cur.page()?;
                    match op {
                        OP_ALLOC => self.open(page, event),
                        OP_RELEASE => self.release(page),
                        OP_LOCK => self.lock(page),
                        OP_UNLOCK => self.unlock(page),
                        _ => self.share(page),
                    }
                }),
                other => Err(Error::Event { at: start, why: format!("unknown opcode {other}") }),
            };
            res.map_err(|e| match e {
                Error::Invariant { violation, event: None } => Error::Invariant { violation, event: Some(event) },
                Error::StagingExhausted { capacity, page, .. } => Error::StagingExhausted { capacity, page, event },
                e => e,
            })?;
            event += 1;
            self.stats.events_total += 1;
        }
        if cur.next_id != ids.len() {
            return Err(Error::Event {
                at: ops.len(),
                why: format!("{} page ids given, the records consumed {}", ids.len(), cur.next_id),
            });
        }
        Ok(())
    }

    fn extend(&mut self, cur: &mut Cursor<'_>, bs: usize, start: usize) -> Result<()> {
        let lens = cur.slice(bs.saturating_mul(2), "extend lengths")?;
        let (prefix, seq) = lens.split_at(bs);
        let p_size = u64::from(self.cfg.page_size);
        for (&p, &s) in prefix.iter().zip(seq) {
            let (p, s) = (to_len(p, start, "prefix_len")?, to_len(s, start, "seq_len")?);
            if s < p {
                return Err(Error::Event { at: start, why: format!("seq_len {s} < prefix_len {p}") });
            }
            let mut pos = p;
            while pos < s {
                let page = cur.page()?;
                let in_page = pos % p_size;
                let n = (s - pos).min(p_size - in_page);
                if in_page == 0 && n == p_size && self.direct.len() < self.cfg.scratch_slots as usize {
                    self.seal_direct(page)?;
                } else {
                    if in_page == 0 {
                        self.open(page, 0)?;
                    }
                    self.write(page, n, Some(in_page))?;
                }
                pos += n;
            }
        }
        Ok(())
    }

    fn decode(&mut self, cur: &mut Cursor<'_>, bs: usize, start: usize) -> Result<()> {
        let seq = cur.slice(bs, "decode lengths")?;
        let p_size = u64::from(self.cfg.page_size);
        for &s in seq {
            let s = to_len(s, start, "seq_len")?;
            if s == 0 {
                return Err(Error::Event { at: start, why: "decode row with seq_len 0".into() });
            }
            let page = cur.page()?;
            let in_page = (s - 1) % p_size;
            if in_page == 0 {
                self.open(page, 0)?;
            }
            self.write(page, 1, Some(in_page))?;
        }
        Ok(())
    }

    fn require_free(&self, page: u32) -> Result<()> {
        let state = self.page_state(page as usize);
        if state != PageState::Free {
            return Err(Error::Invariant {
                violation: violation(ViolationKind::DoubleAlloc, Some(page), format!("allocated while {state:?}")),
                event: None,
            });
        }
        Ok(())
    }

    fn open(&mut self, page: u32, event: usize) -> Result<()> {
        let i = page as usize;
        self.require_free(page)?;
        let slot =
            self.free_slots.pop().ok_or(Error::StagingExhausted { capacity: self.cfg.staging_slots, page, event })?;
        self.set(i, PageState::Open, Owner::Request);
        self.fill[i] = 0;
        self.set_map(i, slot);
        self.stats.free_pages -= 1;
        self.stats.open_pages += 1;
        let in_use = self.stats.staging_capacity - self.free_slots.len() as u64;
        self.stats.staging_high_water = self.stats.staging_high_water.max(in_use);
        Ok(())
    }

    fn write(&mut self, page: u32, n: u64, at: Option<u64>) -> Result<()> {
        let i = page as usize;
        let inv =
            |kind, detail: String| Error::Invariant { violation: violation(kind, Some(page), detail), event: None };
        match self.page_state(i) {
            PageState::Open => {}
            PageState::Sealed => {
                return Err(inv(ViolationKind::WriteSealed, format!("{n} token(s) written into a sealed page")))
            }
            PageState::Free => {
                return Err(inv(ViolationKind::WriteFree, format!("{n} token(s) written into a free page")))
            }
        }
        let fill = u64::from(self.fill[i]);
        if let Some(at) = at {
            if at != fill {
                return Err(inv(ViolationKind::FillMismatch, format!("write at {at}, page holds {fill}")));
            }
        }
        let p_size = u64::from(self.cfg.page_size);
        if n > p_size - fill {
            return Err(inv(ViolationKind::Overflow, format!("{n} token(s) onto {fill} of {p_size}")));
        }
        let new_fill = fill + n;
        self.fill[i] = new_fill as u16; // <= page_size <= 2^15
        self.stats.open_tokens += n;
        if new_fill == p_size {
            self.seal(i);
        }
        Ok(())
    }

    fn seal(&mut self, i: usize) {
        let slot = self.map[i];
        self.set(i, PageState::Sealed, self.owner(i));
        self.plan.push(i as i32);
        self.plan.push(slot);
        self.pending.push((i as u32, slot));
        self.stats.open_pages -= 1;
        self.stats.sealed_pages += 1;
        self.stats.open_tokens -= u64::from(self.cfg.page_size);
        self.stats.seals_last_step += 1;
        self.stats.seals_total += 1;
    }

    /// A page opened and filled by one write of this step: sealed from scratch slot
    /// `staging_slots + k`, no staging slot, map entry left at [`NO_SLOT`].
    fn seal_direct(&mut self, page: u32) -> Result<()> {
        let i = page as usize;
        self.require_free(page)?;
        // k < scratch_slots, and staging_slots + scratch_slots fits in i32 (checked in `new`).
        let slot = (self.cfg.staging_slots as usize + self.direct.len()) as i32;
        self.set(i, PageState::Sealed, Owner::Request);
        self.fill[i] = self.cfg.page_size as u16; // <= 2^15
        self.direct.push((page, self.plan.len()));
        self.plan.push(i as i32);
        self.plan.push(slot);
        self.stats.free_pages -= 1;
        self.stats.sealed_pages += 1;
        self.stats.seals_last_step += 1;
        self.stats.seals_total += 1;
        self.stats.direct_seals_total += 1;
        Ok(())
    }

    fn release(&mut self, page: u32) -> Result<()> {
        let i = page as usize;
        let inv =
            |kind, detail: String| Error::Invariant { violation: violation(kind, Some(page), detail), event: None };
        if self.locks[i] > 0 {
            return Err(inv(ViolationKind::ReleaseLocked, format!("released with {} radix lock(s)", self.locks[i])));
        }
        match self.page_state(i) {
            PageState::Free => return Err(inv(ViolationKind::DoubleFree, "released while free".into())),
            PageState::Open => {
                self.free_slots.push(self.map[i]);
                self.stats.open_pages -= 1;
                self.stats.open_tokens -= u64::from(self.fill[i]);
            }
            PageState::Sealed => {
                // Sealed during this very step: its content is dead, so its plan entry is cancelled
                // (page -1, which the seal kernel skips). The slot stays in `pending` until the next
                // step all the same.
                if self.map[i] != NO_SLOT {
                    let live = (page, self.map[i]);
                    if let Some(&(_, slot)) = self.pending.iter().rfind(|&&e| e == live) {
                        if let Some(k) = (0..self.plan.len() / 2)
                            .rev()
                            .find(|&k| self.plan[2 * k] == page as i32 && self.plan[2 * k + 1] == slot)
                        {
                            self.plan[2 * k] = -1;
                        }
                    }
                } else if let Some(pos) = self.direct.iter().rposition(|&(p, _)| p == page) {
                    // Sealed directly during this step: cancel its plan entry (its scratch slot stays
                    // taken until the step ends).
                    let at = self.direct[pos].1;
                    self.plan[at] = -1;
                    self.direct[pos].0 = u32::MAX;
                }
                self.stats.sealed_pages -= 1;
            }
        }
        if self.owner(i) == Owner::Tree {
            self.stats.tree_pages -= 1;
        }
        if self.map[i] != NO_SLOT {
            self.set_map(i, NO_SLOT);
        }
        self.set(i, PageState::Free, Owner::None);
        self.fill[i] = 0;
        self.stats.free_pages += 1;
        Ok(())
    }

    fn require_sealed(&self, page: u32, what: &str) -> Result<()> {
        if self.page_state(page as usize) == PageState::Sealed {
            return Ok(());
        }
        Err(Error::Invariant {
            violation: violation(
                ViolationKind::ShareUnsealed,
                Some(page),
                format!("{what} a {:?} page: only sealed pages are shared", self.page_state(page as usize)),
            ),
            event: None,
        })
    }

    fn lock(&mut self, page: u32) -> Result<()> {
        self.require_sealed(page, "radix lock on")?;
        let i = page as usize;
        if self.locks[i] == 0 {
            self.stats.locked_pages += 1;
        }
        self.locks[i] = self.locks[i].checked_add(1).ok_or_else(|| Error::Invariant {
            violation: violation(ViolationKind::Census, Some(page), "lock count overflows u32"),
            event: None,
        })?;
        Ok(())
    }

    fn unlock(&mut self, page: u32) -> Result<()> {
        let i = page as usize;
        if self.locks[i] == 0 {
            return Err(Error::Invariant {
                violation: violation(ViolationKind::UnlockUnlocked, Some(page), "unlock without a lock"),
                event: None,
            });
        }
        self.locks[i] -= 1;
        if self.locks[i] == 0 {
            self.stats.locked_pages -= 1;
        }
        Ok(())
    }

    fn share(&mut self, page: u32) -> Result<()> {
        self.require_sealed(page, "radix insert of")?;
        let i = page as usize;
        if self.owner(i) != Owner::Tree {
            self.set(i, PageState::Sealed, Owner::Tree);
            self.stats.tree_pages += 1;
        }
        Ok(())
    }

    /// Full O(pages + slots) audit of every invariant. Runs after each step in debug builds.
    pub fn check(&self) -> std::result::Result<(), Violation> {
        let p_size = self.cfg.page_size;
        let slots = self.cfg.staging_slots as usize;
        // 0 free, 1 open page, 2 pending seal.
        let mut slot_use = vec![0u8; slots];
        let mut claim = |slot: i32, by: u8, page: Option<u32>| -> std::result::Result<(), Violation> {
            let s = usize::try_from(slot)
                .ok()
                .filter(|&s| s < slots)
                .ok_or_else(|| violation(ViolationKind::StagingLeak, page, format!("slot {slot} out of range")))?;
            if slot_use[s] != 0 {
                return Err(violation(ViolationKind::StagingLeak, page, format!("slot {slot} used twice")));
            }
            slot_use[s] = by;
            Ok(())
        };
        for &s in &self.free_slots {
            claim(s, 3, None)?;
        }
        for &(page, s) in &self.pending {
            claim(s, 2, Some(page))?;
        }
        let (mut free, mut open, mut sealed, mut tree, mut locked, mut open_tokens) =
            (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        for i in 0..self.state.len() {
            let page = Some(i as u32);
            let (state, owner, fill, slot) = (self.page_state(i), self.owner(i), u32::from(self.fill[i]), self.map[i]);
            if self.locks[i] > 0 {
                locked += 1;
                if state != PageState::Sealed {
                    return Err(violation(ViolationKind::ShareUnsealed, page, format!("locked while {state:?}")));
                }
            }
            if owner == Owner::Tree {
                tree += 1;
            }
            match state {
                PageState::Free => {
                    free += 1;
                    if owner != Owner::None || fill != 0 || slot != NO_SLOT {
                        return Err(violation(
                            ViolationKind::Census,
                            page,
                            format!("free page with owner {owner:?}, fill {fill}, slot {slot}"),
                        ));
                    }
                }
                PageState::Open => {
                    open += 1;
                    open_tokens += u64::from(fill);
                    if fill >= p_size || owner != Owner::Request {
                        return Err(violation(
                            ViolationKind::Census,
                            page,
                            format!("open page with fill {fill}, owner {owner:?}"),
                        ));
                    }
                    claim(slot, 1, page)?;
                }
                PageState::Sealed => {
                    sealed += 1;
                    if fill != p_size || owner == Owner::None {
                        return Err(violation(
                            ViolationKind::Census,
                            page,
                            format!("sealed page with fill {fill}, owner {owner:?}"),
                        ));
                    }
                    if slot != NO_SLOT && !self.pending.contains(&(i as u32, slot)) {
                        return Err(violation(
                            ViolationKind::StagingLeak,
                            page,
                            format!("sealed page still maps to slot {slot} with no queued seal"),
                        ));
                    }
                }
            }
        }
        if let Some(s) = slot_use.iter().position(|&u| u == 0) {
            return Err(violation(
                ViolationKind::StagingLeak,
                None,
                format!("staging slot {s} is neither free nor held"),
            ));
        }
        let st = &self.stats;
        let counted = (free, open, sealed, tree, locked, open_tokens);
        let kept = (st.free_pages, st.open_pages, st.sealed_pages, st.tree_pages, st.locked_pages, st.open_tokens);
        if counted != kept || free + open + sealed != st.total_pages {
            return Err(violation(
                ViolationKind::Census,
                None,
                format!(
                    "(free, open, sealed, tree, locked, open_tokens) counted {counted:?}, kept {kept:?}, total {}",
                    st.total_pages
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(pages: u32, slots: u32) -> Runtime {
        Runtime::new(RuntimeConfig {
            num_pages: pages,
            page_size: 4,
            staging_slots: slots,
            scratch_slots: 0,
            kv_heads: 2,
            head_dim: 8,
            quant: QuantFormat { bits: 2, k_group: 4, v_group: 8, scale_columns: 1, key_grid_page: 0 },
        })
        .unwrap()
    }

    fn rt_direct(pages: u32, slots: u32, scratch: u32) -> Runtime {
        let mut cfg = *rt(pages, slots).config();
        cfg.scratch_slots = scratch;
        Runtime::new(cfg).unwrap()
    }

    #[test]
    fn whole_prefill_pages_are_sealed_directly_without_a_staging_slot() {
        // 2 staging slots, 3 scratch slots, 4-token pages.
        let mut r = rt_direct(16, 2, 3);
        // Row 0 prefills 10 tokens (pages 1, 2 whole; page 3 holds 2), row 1 prefills 4 (page 4 whole).
        let out = r.step(&[OP_EXTEND, 2, 0, 0, 10, 4], &[1, 2, 3, 4]).unwrap();
        // Whole pages take scratch slots 2, 3, 4 (= staging_slots + k); only page 3 takes staging.
        assert_eq!(out.seal_plan, &[1, 2, 2, 3, 4, 4]);
        assert_eq!(out.map_delta, &[3, 0]);
        for page in [1, 2, 4] {
            let info = r.page_info(page).unwrap();
            assert_eq!((info.state, info.slot, info.fill), (PageState::Sealed, NO_SLOT, 4));
        }
        assert_eq!(r.staging_free(), 1);
        let s = r.stats();
        assert_eq!((s.sealed_pages, s.open_pages, s.seals_last_step, s.direct_seals_total), (3, 1, 3, 3));
        r.check().unwrap();
        // Next step: row 0 continues (page 3 fills from staging, page 5 whole: scratch slot 2 again,
        // scratch numbering restarts every step); 3 more tokens open page 6.
        let out = r.step(&[OP_EXTEND, 1, 10, 17], &[3, 5, 6]).unwrap();
        assert_eq!(out.seal_plan, &[3, 0, 5, 2]);
        // Scratch runs out: the page takes a staging slot as before (4 whole pages, 3 scratch slots).
        let mut r = rt_direct(16, 4, 3);
        let out = r.step(&[OP_EXTEND, 1, 0, 16], &[1, 2, 3, 4]).unwrap();
        assert_eq!(out.seal_plan, &[1, 4, 2, 5, 3, 6, 4, 0]);
        assert_eq!(out.map_delta, &[4, 0]);
        r.check().unwrap();
    }

    #[test]
    fn a_direct_seal_released_in_its_own_step_is_cancelled() {
        let mut r = rt_direct(16, 2, 3);
        let out = r.step(&[OP_EXTEND, 1, 0, 8, OP_RELEASE, 1], &[1, 2, 2]).unwrap();
        // Page 2 was sealed directly and released in the same step: its entry is cancelled.
        assert_eq!(out.seal_plan, &[1, 2, -1, 3]);
        assert_eq!(r.page_info(2).unwrap().state, PageState::Free);
        // Reopened in the next step, it is sealed again (a new scratch slot), once.
        let out = r.step(&[OP_EXTEND, 1, 0, 4], &[2]).unwrap();
        assert_eq!(out.seal_plan, &[2, 2]);
        r.check().unwrap();
    }

    fn kind(e: Error) -> ViolationKind {
        match e {
            Error::Invariant { violation, .. } => violation.kind,
            other => panic!("expected an invariant violation, got {other:?}"),
        }
    }

    #[test]
    fn prefill_decode_seal_release() {
        let mut r = rt(8, 3);
        // Prefill 6 tokens: page 1 fills (sealed), page 2 holds 2.
        let out = r.step(&[OP_EXTEND, 1, 0, 6], &[1, 2]).unwrap();
        assert_eq!(out.seal_plan, &[1, 0]);
        let mut delta: Vec<_> = out.map_delta.chunks(2).map(|c| (c[0], c[1])).collect();
        delta.sort();
        assert_eq!(delta, vec![(1, 0), (2, 1)]);
        assert_eq!(r.page_info(1).unwrap().state, PageState::Sealed);
        assert_eq!(r.page_info(1).unwrap().format.unwrap().layout_version, LAYOUT_VERSION);
        // Sealed page keeps its slot for this step's forward.
        assert_eq!(r.page_to_staging()[1], 0);
        assert_eq!(r.staging_free(), 1);
        // Two decode tokens (positions 6, 7) fill page 2.
        let out = r.step(&[OP_DECODE, 1, 7], &[2]).unwrap();
        assert!(out.seal_plan.is_empty());
        assert_eq!(out.map_delta, &[1, -1]);
        let out = r.step(&[OP_DECODE, 1, 8], &[2]).unwrap();
        assert_eq!(out.seal_plan, &[2, 1]);
        // Position 8 opens page 3, reusing slot 0 (freed two steps ago).
        let out = r.step(&[OP_DECODE, 1, 9, OP_RELEASE, 3], &[3, 1, 2, 3]).unwrap();
        assert!(out.seal_plan.is_empty());
        let s = r.stats();
        assert_eq!((s.free_pages, s.open_pages, s.sealed_pages), (8, 0, 0));
        r.step(&[], &[]).unwrap();
        assert_eq!(r.staging_free(), 3);
        r.check().unwrap();
    }

    #[test]
    fn flush_between_steps_reports_the_state_after_the_step() {
        let mut r = rt(8, 3);
        // Prefill 6 tokens: page 1 fills (sealed, slot 0 queued), page 2 holds 2 (slot 1).
        r.step(&[OP_EXTEND, 1, 0, 6], &[1, 2]).unwrap();
        let s = r.stats();
        assert_eq!((s.open_pages, s.sealed_pages, s.tree_pages, s.staging_in_use), (1, 1, 0, 2));
        // After the forward the request finishes: page 1 goes to the tree, page 2 is released.
        r.flush(&[OP_SHARE, 1, OP_RELEASE, 1], &[1, 2]).unwrap();
        let s = r.stats();
        assert_eq!((s.open_pages, s.sealed_pages, s.tree_pages, s.staging_in_use), (0, 1, 1, 0));
        assert_eq!((s.steps, s.seals_last_step), (1, 1), "a flush is not a step");
        r.check().unwrap();
        // The map changes it made are delivered by the next step, with no seal planned again.
        let out = r.step(&[], &[]).unwrap();
        assert!(out.seal_plan.is_empty());
        let mut delta: Vec<_> = out.map_delta.chunks(2).map(|c| (c[0], c[1])).collect();
        delta.sort();
        assert_eq!(delta, vec![(1, NO_SLOT), (2, NO_SLOT)]);
        assert_eq!(r.staging_free(), 3);
        // Writes and allocations belong to a step: refused whole, nothing applied.
        for (ops, ids) in [
            (vec![OP_RELEASE, 1, OP_ALLOC, 1], vec![1, 3]),
            (vec![OP_EXTEND, 1, 0, 2], vec![3]),
            (vec![OP_DECODE, 1, 1], vec![3]),
            (vec![OP_WRITE, 1, 1], vec![3]),
        ] {
            let before = r.clone();
            assert!(matches!(r.flush(&ops, &ids), Err(Error::Event { .. })), "{ops:?}");
            assert_eq!(r.stats(), before.stats());
            assert_eq!(r.page_info(1).unwrap(), before.page_info(1).unwrap());
        }
    }

    #[test]
    fn chunked_prefill_continues_the_open_page() {
        let mut r = rt(8, 4);
        r.step(&[OP_EXTEND, 1, 0, 3], &[1]).unwrap();
        let out = r.step(&[OP_EXTEND, 1, 3, 9], &[1, 2, 3]).unwrap();
        assert_eq!(out.seal_plan, &[1, 0, 2, 1]);
        assert_eq!(r.page_info(3).unwrap().fill, 1);
        // A continuation that does not start at the fill is caught.
        assert_eq!(kind(r.step(&[OP_EXTEND, 1, 10, 11], &[3]).unwrap_err()), ViolationKind::FillMismatch);
    }

    #[test]
    fn violations() {
        let mut r = rt(8, 4);
        r.step(&[OP_EXTEND, 1, 0, 4, OP_SHARE, 1, OP_LOCK, 1], &[1, 1, 1]).unwrap();
        assert_eq!(kind(r.clone().step(&[OP_WRITE, 1, 1], &[1]).unwrap_err()), ViolationKind::WriteSealed);
        assert_eq!(kind(r.clone().step(&[OP_RELEASE, 1], &[1]).unwrap_err()), ViolationKind::ReleaseLocked);
        assert_eq!(kind(r.clone().step(&[OP_ALLOC, 1], &[1]).unwrap_err()), ViolationKind::DoubleAlloc);
        assert_eq!(kind(r.clone().step(&[OP_RELEASE, 1], &[5]).unwrap_err()), ViolationKind::DoubleFree);
        assert_eq!(kind(r.clone().step(&[OP_UNLOCK, 1], &[5]).unwrap_err()), ViolationKind::UnlockUnlocked);
        assert_eq!(kind(r.clone().step(&[OP_WRITE, 1, 1], &[5]).unwrap_err()), ViolationKind::WriteFree);
        assert_eq!(
            kind(r.clone().step(&[OP_ALLOC, 1, OP_SHARE, 1], &[5, 5]).unwrap_err()),
            ViolationKind::ShareUnsealed
        );
        assert_eq!(kind(r.clone().step(&[OP_ALLOC, 1, OP_WRITE, 1, 5], &[5, 5]).unwrap_err()), ViolationKind::Overflow);
        r.step(&[OP_UNLOCK, 1, OP_RELEASE, 1], &[1, 1]).unwrap();
        r.check().unwrap();
    }

    #[test]
    fn malformed_batches_change_nothing() {
        let mut r = rt(8, 4);
        r.step(&[OP_EXTEND, 1, 0, 2], &[1]).unwrap();
        for (ops, ids) in [
            (vec![9, 0], vec![]),
            (vec![OP_ALLOC], vec![]),
            (vec![OP_ALLOC, 2], vec![1]),
            (vec![OP_ALLOC, 1], vec![8]),
            (vec![OP_ALLOC, 1], vec![-1]),
            (vec![OP_ALLOC, 1], vec![1, 2]),
            (vec![OP_ALLOC, -1], vec![]),
            (vec![OP_EXTEND, 1, 5, 4], vec![]),
            (vec![OP_EXTEND, 2, 0, 4], vec![]),
            (vec![OP_DECODE, 1, 0], vec![1]),
            (vec![OP_WRITE, 1, -3], vec![1]),
            (vec![OP_EXTEND, 1, 0, 2, OP_ALLOC, 1], vec![2, 9]),
        ] {
            let before = r.clone();
            assert!(matches!(r.step(&ops, &ids), Err(Error::Event { .. })), "{ops:?} {ids:?}");
            assert_eq!(r.stats(), before.stats());
            assert_eq!(r.page_to_staging(), before.page_to_staging());
        }
    }

    #[test]
    fn staging_exhaustion_is_typed_and_keeps_state_consistent() {
        let mut r = rt(8, 2);
        let e = r.step(&[OP_ALLOC, 3], &[1, 2, 3]).unwrap_err();
        assert_eq!(e, Error::StagingExhausted { capacity: 2, page: 3, event: 0 });
        r.check().unwrap();
        // The two applied opens are reported by the next successful step.
        let out = r.step(&[OP_RELEASE, 1], &[1]).unwrap();
        assert_eq!(out.map_delta.len(), 4);
        r.check().unwrap();
    }

    #[test]
    fn reset_unmaps_everything_in_the_next_delta() {
        let mut r = rt(8, 4);
        r.step(&[OP_EXTEND, 2, 0, 0, 4, 2], &[1, 2]).unwrap();
        assert_eq!(r.staging_available(), 3);
        assert_eq!(r.staging_free(), 2);
        r.reset();
        let out = r.step(&[], &[]).unwrap();
        assert!(out.seal_plan.is_empty());
        let mut delta: Vec<_> = out.map_delta.chunks(2).map(|c| (c[0], c[1])).collect();
        delta.sort();
        assert_eq!(delta, vec![(1, -1), (2, -1)]);
        assert_eq!(r.staging_free(), 4);
        r.check().unwrap();
    }

    #[test]
    fn seal_slot_is_not_reused_in_the_same_step() {
        let mut r = rt(8, 1);
        // Page 1 fills with the only slot; a new page in the same step must not get it.
        let e = r.step(&[OP_EXTEND, 1, 0, 4, OP_ALLOC, 1], &[1, 2]).unwrap_err();
        assert!(matches!(e, Error::StagingExhausted { .. }));
        let mut r = rt(8, 1);
        r.step(&[OP_EXTEND, 1, 0, 4], &[1]).unwrap();
        r.step(&[OP_ALLOC, 1], &[2]).unwrap();
        assert_eq!(r.page_to_staging()[2], 0);
        assert_eq!(r.page_to_staging()[1], NO_SLOT);
    }
}
