//! Fuzzing the runtime (issue 16 item 3): arbitrary and mutated SGLang-like event streams go
//! through the binding's entry points, `Runtime::step(ops, ids)` and `Runtime::flush(ops, ids)`,
//! on small runtimes. Whatever the stream, every call must
//!
//! * return `Ok` or `Err`, never panic (each call runs under `catch_unwind`);
//! * leave `Runtime::check()` holding (no staging slot leaked or held twice, no page in two states,
//!   counters equal to a census), after an `Err` too;
//! * never rewrite a sealed page: a page sealed before a call and not released by it stays sealed
//!   and full, and no seal plan names a page again unless it was released in between;
//! * reject a malformed batch (`Error::Event`) with no page changed, and a flush holding a write or
//!   an allocation with nothing changed at all;
//! * keep the caller's copy of the page → staging map (the map deltas applied in order) equal to
//!   the runtime's map after every successful step;
//!
//! and after the stream, releasing every page leaves all pages free and every staging slot free
//! (no leak).
//!
//! Cases per property: `OSCAR_FUZZ_CASES` (default: a CI-sized count, see `cases`).

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use oscar_core::plan::QuantFormat;
use oscar_core::runtime::*;
use oscar_core::Error;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::sync::atomic::{AtomicU64, Ordering};

/// Cases per property: `OSCAR_FUZZ_CASES` when set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("OSCAR_FUZZ_CASES").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(default)
}

fn config(cases: u32) -> ProptestConfig {
    // Failures print their minimal input; regressions are kept as named tests, not files.
    ProptestConfig { cases, max_shrink_iters: 2048, failure_persistence: None, ..ProptestConfig::default() }
}

#[derive(Debug, Clone, Copy)]
struct Cfg {
    pages: u32,
    page_size: u32,
    staging: u32,
    scratch: u32,
}

fn cfg() -> impl Strategy<Value = Cfg> {
    (8u32..=64, prop::sample::select(vec![4u32, 8, 16]), 1u32..=8, 0u32..=4)
        .prop_map(|(pages, page_size, staging, scratch)| Cfg { pages, page_size, staging, scratch })
}

fn runtime(c: Cfg) -> Runtime {
    Runtime::new(RuntimeConfig {
        num_pages: c.pages,
        page_size: c.page_size,
        staging_slots: c.staging,
        scratch_slots: c.scratch,
        kv_heads: 2,
        head_dim: 16,
        quant: QuantFormat { bits: 2, k_group: 4, v_group: 16, scale_columns: 1, key_grid_page: 0 },
    })
    .expect("valid fuzz config")
}

/// What a batch does, read the way the runtime's validation reads it. `None` when the batch is
/// malformed (the runtime must then reject it whole).
#[derive(Debug, Default)]
struct Parsed {
    releases: Vec<u32>,
    writes: bool,
}

fn parse(ops: &[i64], ids: &[i64], page_size: u32, pages: u32) -> Option<Parsed> {
    let p = i64::from(page_size);
    let mut out = Parsed::default();
    let (mut at, mut next) = (0usize, 0usize);
    let limit = ops.len() + ids.len();
    let mut take = |k: usize, release: bool, out: &mut Parsed| -> Option<()> {
        for _ in 0..k {
            let id = *ids.get(next)?;
            next += 1;
            let page = u32::try_from(id).ok().filter(|&x| x < pages)?;
            if release {
                out.releases.push(page);
            }
        }
        Some(())
    };
    while at < ops.len() {
        let op = ops[at];
        let n = usize::try_from(*ops.get(at + 1)?).ok().filter(|&n| n <= limit)?;
        at += 2;
        match op {
            OP_EXTEND => {
                let lens = ops.get(at..at.checked_add(n.checked_mul(2)?)?)?;
                at += 2 * n;
                let (pre, seq) = lens.split_at(n);
                for (&a, &b) in pre.iter().zip(seq) {
                    if a < 0 || b < a {
                        return None;
                    }
                    if b > a {
                        let k = usize::try_from((b - 1) / p - a / p + 1).ok()?;
                        take(k, false, &mut out)?;
                    }
                }
                out.writes = true;
            }
            OP_DECODE | OP_WRITE => {
                let args = ops.get(at..at.checked_add(n)?)?;
                at += n;
                if args.iter().any(|&a| if op == OP_DECODE { a < 1 } else { a < 0 }) {
                    return None;
                }
                take(n, false, &mut out)?;
                out.writes = true;
            }
            OP_ALLOC | OP_LOCK | OP_UNLOCK | OP_SHARE | OP_RELEASE => {
                take(n, op == OP_RELEASE, &mut out)?;
                out.writes |= op == OP_ALLOC;
            }
            _ => return None,
        }
    }
    (next == ids.len()).then_some(out)
}

/// The counters a malformed batch must not move.
fn census(s: &Stats) -> [u64; 11] {
    [
        s.total_pages,
        s.free_pages,
        s.open_pages,
        s.sealed_pages,
        s.tree_pages,
        s.locked_pages,
        s.open_tokens,
        s.events_total,
        s.steps,
        s.seals_total,
        s.direct_seals_total,
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Step,
    Flush,
}

/// One runtime under fuzz plus what the caller observed of it.
struct Harness {
    rt: Runtime,
    c: Cfg,
    /// The caller's copy of the page → staging map, built from the map deltas.
    mirror: Vec<i32>,
    /// Pages sealed right after the last successful step (the start of the current plan).
    sealed_at_window: BTreeSet<u32>,
    /// Pages a batch since then asked to release (a superset of those released).
    released_in_window: BTreeSet<u32>,
    calls: u64,
    errors: u64,
    /// Counts in the order of `TALLY`.
    tally: [u64; 7],
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

impl Harness {
    fn new(c: Cfg) -> Self {
        Self {
            rt: runtime(c),
            c,
            mirror: vec![NO_SLOT; c.pages as usize],
            sealed_at_window: BTreeSet::new(),
            released_in_window: BTreeSet::new(),
            calls: 0,
            errors: 0,
            tally: [0; 7],
        }
    }

    fn infos(&self) -> Vec<PageInfo> {
        (0..self.c.pages).map(|p| self.rt.page_info(p).expect("page in range")).collect()
    }

    /// One call through the binding's entry point, with every per-call property checked.
    fn call(&mut self, kind: Kind, ops: &[i64], ids: &[i64]) -> Result<Result<(), Error>, TestCaseError> {
        self.calls += 1;
        self.tally[0] += 1;
        let ctx = || format!("{kind:?} ops={ops:?} ids={ids:?}");
        let before = self.infos();
        let stats_before = self.rt.stats();
        let map_before = self.rt.page_to_staging().to_vec();
        let parsed = parse(ops, ids, self.c.page_size, self.c.pages);
        let released: BTreeSet<u32> = parsed.as_ref().map(|p| p.releases.iter().copied().collect()).unwrap_or_default();
        self.released_in_window.extend(&released);

        let rt = &mut self.rt;
        let res = catch_unwind(AssertUnwindSafe(|| match kind {
            Kind::Step => rt.step(ops, ids).map(|o| Some((o.seal_plan.to_vec(), o.map_delta.to_vec()))),
            Kind::Flush => rt.flush(ops, ids).map(|()| None),
        }))
        .map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            fail(format!("panic `{msg}` on {}", ctx()))
        })?;
        self.rt.check().map_err(|v| fail(format!("check() after {:?}: {v} on {}", res.as_ref().err(), ctx())))?;

        let after = self.infos();
        let stats = self.rt.stats();
        let ps = self.c.page_size;
        // Sealed pages are immutable until released.
        for (p, (b, a)) in before.iter().zip(&after).enumerate() {
            let p = p as u32;
            if released.contains(&p) {
                continue;
            }
            match b.state {
                PageState::Sealed => {
                    let owner_ok = a.owner == b.owner || (b.owner == Owner::Request && a.owner == Owner::Tree);
                    let slot_ok = a.slot == b.slot || a.slot == NO_SLOT;
                    if a.state != PageState::Sealed || a.fill != ps || !owner_ok || !slot_ok || a.format != b.format {
                        return Err(fail(format!(
                            "sealed page {p} changed {b:?} -> {a:?} (not released) on {}",
                            ctx()
                        )));
                    }
                }
                PageState::Open => {
                    if a.state == PageState::Free || a.fill < b.fill && a.state == PageState::Open {
                        return Err(fail(format!("open page {p} went {b:?} -> {a:?} (not released) on {}", ctx())));
                    }
                }
                PageState::Free => {}
            }
        }
        match &res {
            Err(Error::Layout(m)) => return Err(fail(format!("layout error `{m}` from {}", ctx()))),
            Err(Error::Event { .. }) => {
                let same_pages = before
                    .iter()
                    .zip(&after)
                    .all(|(b, a)| (b.state, b.owner, b.fill, b.locks) == (a.state, a.owner, a.fill, a.locks));
                if !same_pages || census(&stats) != census(&stats_before) {
                    return Err(fail(format!("a malformed batch changed pages or counters: {}", ctx())));
                }
                if kind == Kind::Flush
                    && (before != after || stats != stats_before || map_before != self.rt.page_to_staging())
                {
                    return Err(fail(format!("a refused flush changed state: {}", ctx())));
                }
            }
            _ => {}
        }
        if kind == Kind::Flush {
            if parsed.as_ref().is_some_and(|p| p.writes) && !matches!(res, Err(Error::Event { .. })) {
                return Err(fail(format!("flush accepted a write or an allocation: {res:?} on {}", ctx())));
            }
            if stats.steps != stats_before.steps {
                return Err(fail(format!("a flush counted a step: {}", ctx())));
            }
        }
        let out = match res {
            Err(e) => {
                self.errors += 1;
                self.tally[match e {
                    Error::Event { .. } => 3,
                    Error::StagingExhausted { .. } => 4,
                    _ => 5,
                }] += 1;
                if stats.steps != stats_before.steps {
                    return Err(fail(format!("a failed step counted a step: {}", ctx())));
                }
                return Ok(Err(e));
            }
            Ok(None) => {
                self.tally[2] += 1;
                return Ok(Ok(()));
            }
            Ok(Some(out)) => out,
        };
        let (plan, delta) = out;
        if stats.steps != stats_before.steps + 1 || plan.len() % 2 != 0 || delta.len() % 2 != 0 {
            return Err(fail(format!("bad step output {plan:?} {delta:?} on {}", ctx())));
        }
        // Seal plan: live entries name distinct sealed pages, never one sealed before this plan
        // began and not released since; slots are distinct, staging ones still mapped.
        let (staging, scratch) = (self.c.staging as i32, self.c.scratch as i32);
        let (mut pages, mut slots) = (BTreeSet::new(), BTreeSet::new());
        for e in plan.chunks(2) {
            let (page, slot) = (e[0], e[1]);
            if !(0..staging + scratch).contains(&slot) || !slots.insert(slot) {
                return Err(fail(format!("plan {plan:?}: slot {slot} out of range or twice on {}", ctx())));
            }
            if page == -1 {
                continue;
            }
            let p = u32::try_from(page).ok().filter(|&p| p < self.c.pages);
            let Some(p) = p else { return Err(fail(format!("plan {plan:?}: page {page} out of range"))) };
            if !pages.insert(p) {
                return Err(fail(format!("plan {plan:?} seals page {p} twice on {}", ctx())));
            }
            let a = after[p as usize];
            let mapped = if slot < staging { a.slot == slot } else { a.slot == NO_SLOT };
            if a.state != PageState::Sealed || !mapped {
                return Err(fail(format!("plan {plan:?}: page {p} is {a:?} on {}", ctx())));
            }
            if self.sealed_at_window.contains(&p) && !self.released_in_window.contains(&p) {
                return Err(fail(format!(
                    "sealed page {p} sealed again without a release: plan {plan:?} on {}",
                    ctx()
                )));
            }
        }
        // Map deltas: distinct pages; applied in order, the caller's map equals the runtime's.
        let mut seen = BTreeSet::new();
        for e in delta.chunks(2) {
            let p = usize::try_from(e[0]).ok().filter(|&p| p < self.mirror.len());
            let Some(p) = p.filter(|&p| seen.insert(p)) else {
                return Err(fail(format!("delta {delta:?}: bad or repeated page on {}", ctx())));
            };
            self.mirror[p] = e[1];
        }
        if self.mirror != self.rt.page_to_staging() {
            return Err(fail(format!("mirror {:?} != map {:?} on {}", self.mirror, self.rt.page_to_staging(), ctx())));
        }
        self.sealed_at_window = (0..self.c.pages).filter(|&p| after[p as usize].state == PageState::Sealed).collect();
        self.released_in_window.clear();
        self.tally[1] += 1;
        self.tally[6] += pages.len() as u64;
        Ok(Ok(()))
    }

    /// Unlock and release everything, then one empty step: every page and slot must come back.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        let infos = self.infos();
        let unlock: Vec<i64> =
            infos.iter().enumerate().flat_map(|(p, i)| std::iter::repeat_n(p as i64, i.locks as usize)).collect();
        let release: Vec<i64> =
            infos.iter().enumerate().filter(|(_, i)| i.state != PageState::Free).map(|(p, _)| p as i64).collect();
        let ops = vec![OP_UNLOCK, unlock.len() as i64, OP_RELEASE, release.len() as i64];
        let ids: Vec<i64> = unlock.into_iter().chain(release).collect();
        if let Err(e) = self.call(Kind::Step, &ops, &ids)? {
            return Err(fail(format!("draining failed: {e}")));
        }
        if let Err(e) = self.call(Kind::Step, &[], &[])? {
            return Err(fail(format!("empty step failed: {e}")));
        }
        let s = self.rt.stats();
        if s.free_pages != u64::from(self.c.pages)
            || self.rt.staging_free() != self.c.staging as usize
            || s.open_tokens != 0
            || s.locked_pages != 0
            || self.mirror.iter().any(|&m| m != NO_SLOT)
        {
            return Err(fail(format!("leak after draining: {s:?}, staging free {}", self.rt.staging_free())));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- (a) arbitrary raw streams

fn word() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..40,
        1 => -3i64..0,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => any::<i64>(),
        1 => (1i64 << 31) - 2..(1i64 << 31) + 2,
    ]
}

fn record() -> impl Strategy<Value = Vec<i64>> {
    let opcode = prop_oneof![8 => 1i64..=8, 1 => Just(0i64), 1 => Just(9i64), 1 => any::<i64>()];
    let count = prop_oneof![8 => 0i64..4, 1 => word()];
    // Mostly plausible lengths (a few pages), sometimes any word.
    let args = prop::collection::vec(prop_oneof![6 => 0i64..48, 1 => word()], 1..8);
    (opcode, count, args, prop::bool::weighted(0.85), any::<bool>()).prop_map(|(op, n, args, fit, order)| {
        let mut r = vec![op, n];
        // Most records carry exactly the words their count asks for (so they parse deeper), and
        // half of those extends have each prefix_len <= seq_len.
        let want = match (fit, usize::try_from(n)) {
            (true, Ok(k)) if k < 8 => Some(match op {
                OP_EXTEND => 2 * k,
                OP_DECODE | OP_WRITE => k,
                _ => 0,
            }),
            _ => None,
        };
        match want {
            Some(k) => {
                let mut words: Vec<i64> = args.iter().copied().cycle().take(k).collect();
                if op == OP_EXTEND && order {
                    let (pre, seq) = words.split_at_mut(k / 2);
                    for (a, b) in pre.iter_mut().zip(seq) {
                        if *a > *b {
                            std::mem::swap(a, b);
                        }
                    }
                }
                r.extend(words);
            }
            None => r.extend(args),
        }
        r
    })
}

#[derive(Debug, Clone)]
struct RawCall {
    flush: bool,
    ops: Vec<i64>,
    /// Random ids; with `fit`, as many as the ops consume (read in range modulo the page count).
    ids: Vec<i64>,
    fit: bool,
}

fn raw_call() -> impl Strategy<Value = RawCall> {
    (
        prop::bool::weighted(0.3),
        prop::collection::vec(record(), 0..4),
        prop::collection::vec(prop_oneof![8 => 0i64..70, 1 => word()], 0..24),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(flush, recs, ids, fit)| RawCall { flush, ops: recs.concat(), ids, fit })
}

/// The number of ids `ops` consumes when it is otherwise well formed.
fn ids_needed(ops: &[i64], page_size: u32) -> Option<usize> {
    let mut ids: Vec<i64> = Vec::new();
    for k in 0..64usize {
        if parse(ops, &ids, page_size, u32::MAX).is_some() {
            return Some(k);
        }
        ids.push(0);
    }
    None
}

fn run_raw(c: Cfg, calls: &[RawCall], tally: &Tally) -> Result<(), TestCaseError> {
    let mut h = Harness::new(c);
    for rc in calls {
        let mut ids = rc.ids.clone();
        if rc.fit {
            if let Some(k) = ids_needed(&rc.ops, c.page_size) {
                ids.resize(k.max(ids.len()), 1);
                ids.truncate(k);
                for id in &mut ids {
                    *id = id.rem_euclid(i64::from(c.pages));
                }
            }
        }
        let _ = h.call(if rc.flush { Kind::Flush } else { Kind::Step }, &rc.ops, &ids)?;
    }
    tally.add(&h);
    h.drain()
}

// ---------------------------------------------------------------- (b) mutated SGLang-like streams

/// One scheduler move; the numbers pick requests, lengths and pages.
#[derive(Debug, Clone, Copy)]
enum Move {
    Prefill(u16),
    Chunk(u16, u16),
    Decode(u16),
    Finish(u16),
    Abort(u16),
    Lock(u16),
    Unlock(u16),
    Evict(u16),
    AllocWrite(u16),
}

fn mv() -> impl Strategy<Value = Move> {
    prop_oneof![
        3 => any::<u16>().prop_map(Move::Prefill),
        2 => (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Move::Chunk(a, b)),
        5 => any::<u16>().prop_map(Move::Decode),
        2 => any::<u16>().prop_map(Move::Finish),
        1 => any::<u16>().prop_map(Move::Abort),
        1 => any::<u16>().prop_map(Move::Lock),
        1 => any::<u16>().prop_map(Move::Unlock),
        1 => any::<u16>().prop_map(Move::Evict),
        1 => any::<u16>().prop_map(Move::AllocWrite),
    ]
}

/// A corruption of a valid batch.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    TruncateOps(u16),
    TruncateIds(u16),
    WrongPage(u16, u16),
    WrongWord(u16, i64),
    WriteSealed(u16),
    DoubleRelease(u16),
    UnlockUnlocked(u16),
    ShareOpen(u16),
    ReleaseLocked(u16),
    DuplicateBatch,
    /// Send the batch as a flush (writes in a flush), or a flush's batch as a step.
    SwapKind,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<u16>().prop_map(Mutation::TruncateOps),
        any::<u16>().prop_map(Mutation::TruncateIds),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Mutation::WrongPage(a, b)),
        (any::<u16>(), word()).prop_map(|(a, b)| Mutation::WrongWord(a, b)),
        any::<u16>().prop_map(Mutation::WriteSealed),
        any::<u16>().prop_map(Mutation::DoubleRelease),
        any::<u16>().prop_map(Mutation::UnlockUnlocked),
        any::<u16>().prop_map(Mutation::ShareOpen),
        any::<u16>().prop_map(Mutation::ReleaseLocked),
        Just(Mutation::DuplicateBatch),
        Just(Mutation::SwapKind),
    ]
}

#[derive(Debug, Clone)]
struct Batch {
    /// Moves of the step; `after` go to a flush after it (finish, lock, unlock, evict).
    moves: Vec<Move>,
    settle: bool,
    mutations: Vec<Mutation>,
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        prop::collection::vec(mv(), 0..6),
        prop::bool::weighted(0.3),
        prop_oneof![3 => Just(0usize), 2 => Just(1usize), 1 => 2usize..4],
    )
        .prop_flat_map(|(moves, settle, k)| {
            prop::collection::vec(mutation(), k).prop_map(move |mutations| Batch {
                moves: moves.clone(),
                settle,
                mutations,
            })
        })
}

#[derive(Debug, Clone)]
struct Req {
    pages: Vec<u32>,
    len: u64,
}

/// Builds valid batches from the runtime's observed state (requests are re-checked after errors).
struct Sched {
    reqs: Vec<Req>,
    /// Pages handed out in the batch being built.
    taken: BTreeSet<u32>,
    ops: Vec<i64>,
    ids: Vec<i64>,
    /// Tree pages locked by this scheduler (to unlock later).
    locked: Vec<u32>,
}

fn pick<T: Copy>(v: &[T], k: u16) -> Option<T> {
    (!v.is_empty()).then(|| v[usize::from(k) % v.len()])
}

impl Sched {
    fn free_page(&mut self, h: &Harness) -> Option<u32> {
        // Page 0 is SGLang's padding page: never handed out.
        let p = (1..h.c.pages)
            .find(|&p| !self.taken.contains(&p) && h.rt.page_info(p).is_ok_and(|i| i.state == PageState::Free))?;
        self.taken.insert(p);
        Some(p)
    }

    fn extend_req(&mut self, h: &Harness, r: &mut Req, n: u64) -> bool {
        let ps = u64::from(h.c.page_size);
        let (from, to) = (r.len, r.len + n);
        let mut row = Vec::new();
        let mut pos = from;
        while pos < to {
            let page = if pos % ps == 0 {
                match self.free_page(h) {
                    Some(p) => {
                        r.pages.push(p);
                        p
                    }
                    None => return false,
                }
            } else {
                match r.pages.last() {
                    Some(&p) => p,
                    None => return false,
                }
            };
            row.push(page as i64);
            pos = (pos / ps + 1) * ps;
        }
        self.ops.extend([OP_EXTEND, 1, from as i64, to as i64]);
        self.ids.extend(row);
        r.len = to;
        true
    }

    fn apply(&mut self, h: &Harness, m: Move) {
        let ps = u64::from(h.c.page_size);
        let infos = h.infos();
        let tree: Vec<u32> =
            (1..h.c.pages).filter(|&p| infos[p as usize].owner == Owner::Tree && !self.taken.contains(&p)).collect();
        match m {
            Move::Prefill(n) => {
                let mut r = Req { pages: Vec::new(), len: 0 };
                if self.extend_req(h, &mut r, 1 + u64::from(n) % (3 * ps)) {
                    self.reqs.push(r);
                }
            }
            Move::Chunk(i, _) | Move::Decode(i) if !self.reqs.is_empty() => {
                let k = usize::from(i) % self.reqs.len();
                let mut r = self.reqs[k].clone();
                if let Move::Chunk(_, n) = m {
                    if !self.extend_req(h, &mut r, 1 + u64::from(n) % (2 * ps)) {
                        return;
                    }
                } else {
                    let page = if r.len.is_multiple_of(ps) { self.free_page(h) } else { r.pages.last().copied() };
                    let Some(page) = page else { return };
                    if r.len.is_multiple_of(ps) {
                        r.pages.push(page);
                    }
                    r.len += 1;
                    self.ops.extend([OP_DECODE, 1, r.len as i64]);
                    self.ids.push(i64::from(page));
                }
                self.reqs[k] = r;
            }
            Move::Finish(i) | Move::Abort(i) if !self.reqs.is_empty() => {
                let r = self.reqs.remove(usize::from(i) % self.reqs.len());
                let full = (r.len / ps) as usize;
                // Finish: whole pages go to the radix tree (sealed), the rest is released.
                let (share, free) =
                    if matches!(m, Move::Finish(_)) { r.pages.split_at(full) } else { (&[][..], &r.pages[..]) };
                if !share.is_empty() {
                    self.ops.extend([OP_SHARE, share.len() as i64]);
                    self.ids.extend(share.iter().map(|&p| i64::from(p)));
                }
                if !free.is_empty() {
                    self.ops.extend([OP_RELEASE, free.len() as i64]);
                    self.ids.extend(free.iter().map(|&p| i64::from(p)));
                }
            }
            Move::Lock(k) => {
                if let Some(p) = pick(&tree, k) {
                    self.ops.extend([OP_LOCK, 1]);
                    self.ids.push(i64::from(p));
                    self.locked.push(p);
                    self.taken.insert(p);
                }
            }
            Move::Unlock(k) => {
                if let Some(p) = pick(&self.locked, k) {
                    self.locked.retain(|&q| q != p);
                    let n = infos[p as usize].locks;
                    self.ops.extend([OP_UNLOCK, i64::from(n)]);
                    self.ids.extend(std::iter::repeat_n(i64::from(p), n as usize));
                }
            }
            Move::Evict(k) => {
                let idle: Vec<u32> = tree.iter().copied().filter(|&p| infos[p as usize].locks == 0).collect();
                if let Some(p) = pick(&idle, k) {
                    self.ops.extend([OP_RELEASE, 1]);
                    self.ids.push(i64::from(p));
                    self.taken.insert(p);
                }
            }
            Move::AllocWrite(n) => {
                if let Some(p) = self.free_page(h) {
                    self.ops.extend([OP_ALLOC, 1, OP_WRITE, 1, i64::from(n) % (ps as i64 + 1)]);
                    self.ids.extend([i64::from(p), i64::from(p)]);
                }
            }
            _ => {}
        }
    }

    fn mutate(&mut self, h: &Harness, m: Mutation, kind: &mut Kind, dup: &mut bool) {
        let infos = h.infos();
        let with =
            |f: &dyn Fn(&PageInfo) -> bool| -> Vec<u32> { (0..h.c.pages).filter(|&p| f(&infos[p as usize])).collect() };
        let idx = |k: u16, len: usize| usize::from(k) % len.max(1);
        match m {
            Mutation::TruncateOps(k) => self.ops.truncate(idx(k, self.ops.len())),
            Mutation::TruncateIds(k) => self.ids.truncate(idx(k, self.ids.len())),
            Mutation::WrongPage(k, p) => {
                if !self.ids.is_empty() {
                    let i = idx(k, self.ids.len());
                    self.ids[i] = i64::from(p) % i64::from(h.c.pages + 2);
                }
            }
            Mutation::WrongWord(k, w) => {
                if !self.ops.is_empty() {
                    let i = idx(k, self.ops.len());
                    self.ops[i] = if k % 2 == 0 { self.ops[i].wrapping_add(w % 3 - 1) } else { w };
                }
            }
            Mutation::WriteSealed(k) => {
                if let Some(p) = pick(&with(&|i| i.state == PageState::Sealed), k) {
                    let ps = i64::from(h.c.page_size);
                    if k % 2 == 0 {
                        self.ops.extend([OP_WRITE, 1, 1]);
                    } else {
                        self.ops.extend([OP_DECODE, 1, ps * (1 + i64::from(k % 5)) - 1]);
                    }
                    self.ids.push(i64::from(p));
                }
            }
            Mutation::DoubleRelease(k) => {
                let cand = with(&|i| i.state != PageState::Free && i.locks == 0);
                if let Some(p) = pick(&cand, k).or_else(|| pick(&with(&|i| i.state == PageState::Free), k)) {
                    self.ops.extend([OP_RELEASE, 2]);
                    self.ids.extend([i64::from(p), i64::from(p)]);
                }
            }
            Mutation::UnlockUnlocked(k) => {
                if let Some(p) = pick(&with(&|i| i.locks == 0), k) {
                    self.ops.extend([OP_UNLOCK, 1]);
                    self.ids.push(i64::from(p));
                }
            }
            Mutation::ShareOpen(k) => {
                if let Some(p) = pick(&with(&|i| i.state != PageState::Sealed), k) {
                    self.ops.extend(if k % 2 == 0 { [OP_SHARE, 1] } else { [OP_LOCK, 1] });
                    self.ids.push(i64::from(p));
                }
            }
            Mutation::ReleaseLocked(k) => {
                if let Some(p) = pick(&with(&|i| i.locks > 0), k) {
                    self.ops.extend([OP_RELEASE, 1]);
                    self.ids.push(i64::from(p));
                }
            }
            Mutation::DuplicateBatch => *dup = true,
            Mutation::SwapKind => {
                *kind = if *kind == Kind::Step { Kind::Flush } else { Kind::Step };
            }
        }
    }

    /// After a call: drop requests whose pages no longer look like a live row.
    fn resync(&mut self, h: &Harness) {
        let ps = u64::from(h.c.page_size);
        let infos = h.infos();
        self.reqs.retain(|r| {
            let n = r.pages.len();
            r.pages.iter().enumerate().all(|(k, &p)| {
                let i = infos[p as usize];
                let want_fill = if k + 1 < n || r.len % ps == 0 { ps } else { r.len % ps } as u32;
                i.owner == Owner::Request && i.fill == want_fill
            }) && n as u64 == r.len.div_ceil(ps)
        });
        self.locked.retain(|&p| infos[p as usize].locks > 0);
    }
}

fn run_mutated(c: Cfg, batches: &[Batch], tally: &Tally) -> Result<(), TestCaseError> {
    let mut h = Harness::new(c);
    let mut s =
        Sched { reqs: Vec::new(), taken: BTreeSet::new(), ops: Vec::new(), ids: Vec::new(), locked: Vec::new() };
    for b in batches {
        // Step moves: writes; flush moves (finish, abort, lock, unlock, evict) after it when `settle`.
        let (mut step_moves, mut flush_moves) = (Vec::new(), Vec::new());
        for &m in &b.moves {
            let late = matches!(m, Move::Finish(_) | Move::Abort(_) | Move::Lock(_) | Move::Unlock(_) | Move::Evict(_));
            if late && b.settle {
                flush_moves.push(m)
            } else {
                step_moves.push(m)
            }
        }
        for (moves, mut kind) in [(step_moves, Kind::Step), (flush_moves, Kind::Flush)] {
            if kind == Kind::Flush && !b.settle {
                continue;
            }
            s.taken.clear();
            s.ops.clear();
            s.ids.clear();
            for m in moves {
                s.apply(&h, m);
            }
            let mut dup = false;
            // Mutations hit the step's batch, or the flush's when the step has none.
            if kind == Kind::Step || b.settle {
                for &m in &b.mutations {
                    s.mutate(&h, m, &mut kind, &mut dup);
                }
            }
            let (ops, ids) = (s.ops.clone(), s.ids.clone());
            let _ = h.call(kind, &ops, &ids)?;
            if dup {
                let _ = h.call(kind, &ops, &ids)?;
            }
            s.resync(&h);
        }
    }
    tally.add(&h);
    h.drain()
}

// ---------------------------------------------------------------- properties

/// What the calls of one property returned, summed over its cases.
#[derive(Default)]
struct Tally([AtomicU64; 7]);

const TALLY: [&str; 7] =
    ["calls", "ok_steps", "ok_flushes", "event_errors", "staging_exhausted", "invariant_errors", "seals"];

impl Tally {
    fn add(&self, h: &Harness) {
        for (slot, v) in self.0.iter().zip(h.tally) {
            slot.fetch_add(v, Ordering::Relaxed);
        }
    }
}

/// Runs `n` cases of one property (a panic inside a call fails the case, see `Harness::call`),
/// and prints the case count and what the calls returned.
fn fuzz<S: Strategy>(name: &str, n: u32, strategy: S, case: impl Fn(S::Value, &Tally) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let tally = Tally::default();
    let t0 = std::time::Instant::now();
    let mut runner = TestRunner::new(config(n));
    if let Err(e) = runner.run(&strategy, |v| case(v, &tally)) {
        panic!("{name}: {e}");
    }
    let counts: Vec<String> =
        TALLY.iter().zip(&tally.0).map(|(k, v)| format!("{k}={}", v.load(Ordering::Relaxed))).collect();
    eprintln!("fuzz_events::{name}: {n} cases in {:.1} s; {}", t0.elapsed().as_secs_f64(), counts.join(" "));
}

/// Arbitrary words: random opcodes (valid and not), counts (huge, negative), arguments, ids (out of
/// range, negative, page 0), steps and flushes interleaved.
#[test]
fn arbitrary_streams_never_panic_leak_or_reseal() {
    let strategy = (cfg(), prop::collection::vec(raw_call(), 1..32));
    fuzz("arbitrary_streams_never_panic_leak_or_reseal", cases(800), strategy, |(c, calls), t| run_raw(c, &calls, t));
}

/// SGLang-like streams (prefill, chunked prefill, decode, finish into the radix tree, abort, lock,
/// unlock, evict, alloc + write, flushes between steps) with one or a few corruptions.
#[test]
fn mutated_sglang_streams_never_panic_leak_or_reseal() {
    let strategy = (cfg(), prop::collection::vec(batch(), 1..32));
    fuzz("mutated_sglang_streams_never_panic_leak_or_reseal", cases(1200), strategy, |(c, batches), t| {
        run_mutated(c, &batches, t)
    });
}

/// The generators are not vacuous: valid SGLang-like streams with no corruption succeed and seal
/// pages, and the corruptions produce each kind of error.
#[test]
fn generators_reach_deep_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut seals, mut ok_steps, mut errors, mut calls) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..200 {
        let c = cfg().new_tree(&mut runner).unwrap().current();
        let batches: Vec<Batch> = prop::collection::vec(batch(), 1..24)
            .new_tree(&mut runner)
            .unwrap()
            .current()
            .into_iter()
            .map(|mut b| {
                b.mutations.clear();
                b
            })
            .collect();
        let c = Cfg { staging: c.pages, ..c };
        let mut h = Harness::new(c);
        let mut s =
            Sched { reqs: Vec::new(), taken: BTreeSet::new(), ops: Vec::new(), ids: Vec::new(), locked: Vec::new() };
        for b in &batches {
            s.taken.clear();
            s.ops.clear();
            s.ids.clear();
            for &m in &b.moves {
                s.apply(&h, m);
            }
            let (ops, ids) = (s.ops.clone(), s.ids.clone());
            if h.call(Kind::Step, &ops, &ids).unwrap().is_ok() {
                ok_steps += 1;
            }
            s.resync(&h);
        }
        seals += h.rt.stats().seals_total;
        h.drain().unwrap();
        errors += h.errors;
        calls += h.calls;
    }
    assert!(seals > 1000, "seals {seals}");
    assert!(ok_steps * 10 > calls * 8, "only {ok_steps} of {calls} unmutated calls succeeded ({errors} errors)");
}
