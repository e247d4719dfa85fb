//! Property tests: random SGLang-like scheduler traces (prefill, chunked prefill, batched decode,
//! radix match / insert / lock / evict, abort, retraction) drive the runtime through its wire
//! format, while an independent reference model predicts every page's state, the seal plan and the
//! page → staging map.
//!
//! The simulator follows SGLang 0.5.23 with page_size > 1: a LIFO free list (`need_sort=False`), a
//! page-granular radix tree whose values are page ids, duplicates freed at insert, locks on the
//! whole root→node path, eviction of unlocked leaves only.

use std::collections::{HashMap, VecDeque};

use oscar_core::plan::QuantFormat;
use oscar_core::runtime::*;
use oscar_core::{Error, ViolationKind};
use proptest::prelude::*;

const P: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Free,
    Open,
    Sealed,
}

#[derive(Debug, Clone, Copy)]
struct RefPage {
    st: St,
    fill: usize,
    locks: u32,
    tree: bool,
}

#[derive(Debug, Clone)]
struct Req {
    tokens: Vec<u8>,
    prompt_len: usize,
    len: usize,
    max_len: usize,
    chunk: usize,
    /// The request's KV row, one page id per started page.
    pages: Vec<u32>,
    /// Leading pages owned by the tree.
    protected: usize,
    /// Pages of the locked root→node path.
    lock: Vec<u32>,
}

#[derive(Debug)]
struct Node {
    parent: usize,
    key: Vec<u8>,
    page: u32,
    children: HashMap<Vec<u8>, usize>,
}

#[derive(Debug, Clone)]
enum Action {
    New {
        base: usize,
        shared: usize,
        suffix: usize,
        gen: usize,
        chunk: usize,
    },
    Readmit,
    Prefill,
    Decode,
    Finish(usize),
    Abort(usize),
    Retract(usize),
    Evict(usize),
    Flush,
    /// Between two steps: the events so far go to `Runtime::flush` (refused if they write).
    Settle,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..3usize, 0..40usize, 1..14usize, 0..10usize, 1..12usize)
            .prop_map(|(base, shared, suffix, gen, chunk)| Action::New { base, shared, suffix, gen, chunk }),
        1 => Just(Action::Readmit),
        4 => Just(Action::Prefill),
        5 => Just(Action::Decode),
        2 => (0..8usize).prop_map(Action::Finish),
        1 => (0..8usize).prop_map(Action::Abort),
        1 => (0..8usize).prop_map(Action::Retract),
        1 => (1..6usize).prop_map(Action::Evict),
        4 => Just(Action::Flush),
        2 => Just(Action::Settle),
    ]
}

struct Sim {
    rt: Runtime,
    cap: usize,
    pages: Vec<RefPage>,
    free: VecDeque<u32>,
    reqs: Vec<Req>,
    waiting: VecDeque<Vec<u8>>,
    nodes: Vec<Option<Node>>,
    ops: Vec<i64>,
    ids: Vec<i64>,
    /// Expected seal plan pages of the batch; `None` once the page was released in the same batch.
    sealed_in_batch: Vec<Option<u32>>,
    /// Parallel to `sealed_in_batch`: sealed directly from scratch (no staging slot).
    direct_in_batch: Vec<bool>,
    scratch: usize,
    open_count: usize,
    expect_exhaust: bool,
    mirror: Vec<i32>,
    bases: [Vec<u8>; 3],
    seen: Coverage,
}

/// What a trace exercised (the generator must not be vacuous: see `generator_covers_the_cases`).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    seals: usize,
    direct_seals: usize,
    cancelled_seals: usize,
    shares: usize,
    duplicates: usize,
    evictions: usize,
    locks: usize,
    chunked: usize,
    decodes: usize,
    retractions: usize,
    exhausted: usize,
    /// Flushes between steps that were applied (not refused for holding writes).
    settles: usize,
}

impl Sim {
    fn new(usable_pages: usize, cap: usize, scratch: usize) -> Self {
        let n = usable_pages + 1;
        let rt = Runtime::new(RuntimeConfig {
            num_pages: n as u32,
            page_size: P as u32,
            staging_slots: cap as u32,
            scratch_slots: scratch as u32,
            kv_heads: 2,
            head_dim: 16,
            quant: QuantFormat { bits: 2, k_group: 4, v_group: 16, scale_columns: 1, key_grid_page: 0 },
        })
        .unwrap();
        let base = |seed: u8| (0..48u32).map(|i| ((i * 7 + u32::from(seed) * 13) % 3) as u8).collect();
        Self {
            rt,
            cap,
            pages: vec![RefPage { st: St::Free, fill: 0, locks: 0, tree: false }; n],
            // SGLang: page 0 is the padding page, free_pages = arange(1, num_pages + 1).
            free: (1..n as u32).collect(),
            reqs: Vec::new(),
            waiting: VecDeque::new(),
            nodes: vec![Some(Node { parent: 0, key: Vec::new(), page: 0, children: HashMap::new() })],
            ops: Vec::new(),
            ids: Vec::new(),
            sealed_in_batch: Vec::new(),
            direct_in_batch: Vec::new(),
            scratch,
            open_count: 0,
            expect_exhaust: false,
            mirror: vec![NO_SLOT; n],
            bases: [base(0), base(1), base(2)],
            seen: Coverage::default(),
        }
    }

    // ---- reference model, updated as events are emitted ----

    fn ref_open(&mut self, page: u32) {
        let pg = &mut self.pages[page as usize];
        assert_eq!(pg.st, St::Free, "simulator bug: SGLang handed out a used page");
        let held = self.direct_in_batch.iter().filter(|&&d| !d).count();
        if self.open_count + held >= self.cap {
            self.expect_exhaust = true;
        }
        *pg = RefPage { st: St::Open, fill: 0, locks: 0, tree: false };
        self.open_count += 1;
    }

    fn ref_write(&mut self, page: u32, n: usize) {
        let pg = &mut self.pages[page as usize];
        assert_eq!(pg.st, St::Open);
        pg.fill += n;
        assert!(pg.fill <= P);
        if pg.fill == P {
            pg.st = St::Sealed;
            self.open_count -= 1;
            self.sealed_in_batch.push(Some(page));
            self.direct_in_batch.push(false);
            self.seen.seals += 1;
        }
    }

    /// A page opened and filled by one prefill write while scratch lasts: sealed directly.
    fn ref_direct(&mut self, page: u32) {
        let pg = &mut self.pages[page as usize];
        assert_eq!(pg.st, St::Free, "simulator bug: SGLang handed out a used page");
        *pg = RefPage { st: St::Sealed, fill: P, locks: 0, tree: false };
        self.sealed_in_batch.push(Some(page));
        self.direct_in_batch.push(true);
        self.seen.seals += 1;
        self.seen.direct_seals += 1;
    }

    fn release(&mut self, page: u32) {
        let pg = &mut self.pages[page as usize];
        assert_ne!(pg.st, St::Free);
        assert_eq!(pg.locks, 0, "simulator bug: releasing a locked page");
        if pg.st == St::Open {
            self.open_count -= 1;
        }
        if let Some(e) = self.sealed_in_batch.iter_mut().rev().find(|e| **e == Some(page)) {
            *e = None;
            self.seen.cancelled_seals += 1;
        }
        *pg = RefPage { st: St::Free, fill: 0, locks: 0, tree: false };
        // need_sort=False: torch.cat((page_ids, free_pages)).
        self.free.push_front(page);
        self.ops.extend([OP_RELEASE, 1]);
        self.ids.push(page.into());
    }

    fn lock(&mut self, path: &[u32]) {
        self.seen.locks += 1;
        for &p in path {
            self.pages[p as usize].locks += 1;
        }
        self.ops.extend([OP_LOCK, path.len() as i64]);
        self.ids.extend(path.iter().map(|&p| i64::from(p)));
    }

    fn unlock(&mut self, path: &[u32]) {
        for &p in path {
            self.pages[p as usize].locks -= 1;
        }
        self.ops.extend([OP_UNLOCK, path.len() as i64]);
        self.ids.extend(path.iter().map(|&p| i64::from(p)));
    }

    // ---- the radix tree ----

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().unwrap()
    }

    /// Pages of the longest cached page-aligned prefix of `tokens`, at most `max_pages`.
    fn match_prefix(&self, tokens: &[u8], max_pages: usize) -> Vec<u32> {
        let (mut at, mut out) = (0usize, Vec::new());
        for k in 0..max_pages.min(tokens.len() / P) {
            match self.node(at).children.get(&tokens[k * P..(k + 1) * P]) {
                Some(&c) => {
                    out.push(self.node(c).page);
                    at = c;
                }
                None => break,
            }
        }
        out
    }

    /// SGLang's insert + free of the duplicates it exposes; returns the new tree path.
    fn insert(&mut self, r: usize) -> Vec<u32> {
        let full = self.reqs[r].len / P;
        let mut at = 0usize;
        let mut shared = Vec::new();
        for k in 0..full {
            let key = self.reqs[r].tokens[k * P..(k + 1) * P].to_vec();
            let mine = self.reqs[r].pages[k];
            let child = self.node(at).children.get(&key).copied();
            at = match child {
                Some(c) => {
                    let theirs = self.node(c).page;
                    if theirs != mine {
                        self.seen.duplicates += 1;
                        self.release(mine);
                        self.reqs[r].pages[k] = theirs;
                    }
                    c
                }
                None => {
                    assert_eq!(self.pages[mine as usize].st, St::Sealed, "a full page is sealed");
                    self.pages[mine as usize].tree = true;
                    self.seen.shares += 1;
                    shared.push(mine);
                    self.nodes.push(Some(Node { parent: at, key: key.clone(), page: mine, children: HashMap::new() }));
                    let c = self.nodes.len() - 1;
                    self.nodes[at].as_mut().unwrap().children.insert(key, c);
                    c
                }
            };
        }
        if !shared.is_empty() {
            self.ops.extend([OP_SHARE, shared.len() as i64]);
            self.ids.extend(shared.iter().map(|&p| i64::from(p)));
        }
        self.reqs[r].protected = full;
        self.reqs[r].pages[..full].to_vec()
    }

    /// Evict up to `n` unlocked leaves (LRU order does not matter to the runtime).
    fn evict(&mut self, n: usize) -> usize {
        let mut done = 0;
        while done < n {
            let leaf = (1..self.nodes.len()).find(|&i| {
                self.nodes[i]
                    .as_ref()
                    .is_some_and(|nd| nd.children.is_empty() && self.pages[nd.page as usize].locks == 0)
            });
            let Some(i) = leaf else { break };
            let nd = self.nodes[i].take().unwrap();
            self.nodes[nd.parent].as_mut().unwrap().children.remove(&nd.key);
            self.release(nd.page);
            self.seen.evictions += 1;
            done += 1;
        }
        done
    }

    fn ensure_free(&mut self, need: usize) -> bool {
        if self.free.len() < need {
            let short = need - self.free.len();
            self.evict(short);
        }
        self.free.len() >= need
    }

    // ---- scheduler actions ----

    fn admit(&mut self, tokens: Vec<u8>, gen: usize, chunk: usize) {
        if self.reqs.len() >= 8 || tokens.len() < 2 {
            return;
        }
        let prompt_len = tokens.len();
        // At least one prompt token is always computed.
        let path = self.match_prefix(&tokens, (prompt_len - 1) / P);
        if !path.is_empty() {
            self.lock(&path);
        }
        let mut all = tokens;
        all.extend((0..gen).map(|i| (i % 3) as u8));
        self.reqs.push(Req {
            prompt_len,
            len: path.len() * P,
            max_len: prompt_len + gen,
            chunk,
            protected: path.len(),
            pages: path.clone(),
            lock: path,
            tokens: all,
        });
    }

    fn prefill(&mut self) {
        let rows: Vec<usize> = (0..self.reqs.len()).filter(|&r| self.reqs[r].len < self.reqs[r].prompt_len).collect();
        if rows.is_empty() {
            return;
        }
        let spans: Vec<(usize, usize)> = rows
            .iter()
            .map(|&r| {
                let q = &self.reqs[r];
                (q.len, (q.len + q.chunk).min(q.prompt_len))
            })
            .collect();
        let need: usize = spans.iter().map(|&(p, s)| s.div_ceil(P) - p.div_ceil(P)).sum();
        if !self.ensure_free(need) {
            return;
        }
        self.ops.extend([OP_EXTEND, rows.len() as i64]);
        self.ops.extend(spans.iter().map(|&(p, _)| p as i64));
        self.ops.extend(spans.iter().map(|&(_, s)| s as i64));
        for (&r, &(p, s)) in rows.iter().zip(&spans) {
            let mut pos = p;
            while pos < s {
                let n = (s - pos).min(P - pos % P);
                let direct = self.direct_in_batch.iter().filter(|&&d| d).count();
                if pos % P == 0 && n == P && direct < self.scratch {
                    let page = self.free.pop_front().unwrap();
                    self.ref_direct(page);
                    self.reqs[r].pages.push(page);
                    self.ids.push(page.into());
                    pos += n;
                    continue;
                }
                let page = if pos % P == 0 {
                    let page = self.free.pop_front().unwrap();
                    self.ref_open(page);
                    self.reqs[r].pages.push(page);
                    page
                } else {
                    *self.reqs[r].pages.last().unwrap()
                };
                self.ref_write(page, n);
                self.ids.push(page.into());
                pos += n;
            }
            self.reqs[r].len = s;
        }
        // cache_unfinished_req for rows still prefilling (chunked prefill).
        for &r in &rows {
            if self.reqs[r].len < self.reqs[r].prompt_len {
                self.seen.chunked += 1;
                let path = self.insert(r);
                let old = std::mem::take(&mut self.reqs[r].lock);
                if !path.is_empty() {
                    self.lock(&path);
                }
                if !old.is_empty() {
                    self.unlock(&old);
                }
                self.reqs[r].lock = path;
            }
        }
    }

    fn decode(&mut self) {
        let rows: Vec<usize> = (0..self.reqs.len())
            .filter(|&r| self.reqs[r].len >= self.reqs[r].prompt_len && self.reqs[r].len < self.reqs[r].max_len)
            .collect();
        if rows.is_empty() {
            return;
        }
        let need = rows.iter().filter(|&&r| self.reqs[r].len.is_multiple_of(P)).count();
        if !self.ensure_free(need) {
            // SGLang would retract; the trace just retracts the last decoding request.
            self.retract(*rows.last().unwrap());
            return;
        }
        self.seen.decodes += rows.len();
        self.ops.extend([OP_DECODE, rows.len() as i64]);
        self.ops.extend(rows.iter().map(|&r| self.reqs[r].len as i64 + 1));
        for &r in &rows {
            let pos = self.reqs[r].len;
            let page = if pos.is_multiple_of(P) {
                let page = self.free.pop_front().unwrap();
                self.ref_open(page);
                self.reqs[r].pages.push(page);
                page
            } else {
                *self.reqs[r].pages.last().unwrap()
            };
            self.ref_write(page, 1);
            self.ids.push(page.into());
            self.reqs[r].len += 1;
        }
    }

    fn finish(&mut self, i: usize) {
        let Some(r) = (0..self.reqs.len()).filter(|&r| self.reqs[r].len >= self.reqs[r].prompt_len).nth(i) else {
            return;
        };
        self.insert(r);
        let q = self.reqs.remove(r);
        if !q.lock.is_empty() {
            self.unlock(&q.lock);
        }
        for &page in &q.pages[q.len / P..] {
            self.release(page);
        }
    }

    fn drop_req(&mut self, r: usize) -> Req {
        let q = self.reqs.remove(r);
        if !q.lock.is_empty() {
            self.unlock(&q.lock);
        }
        for &page in &q.pages[q.protected..] {
            self.release(page);
        }
        q
    }

    fn retract(&mut self, r: usize) {
        self.seen.retractions += 1;
        let q = self.drop_req(r);
        self.waiting.push_back(q.tokens[..q.len.max(2)].to_vec());
    }

    fn run(&mut self, a: &Action) {
        match *a {
            Action::New { base, shared, suffix, gen, chunk } => {
                let mut t: Vec<u8> = self.bases[base][..shared].to_vec();
                t.extend((0..suffix).map(|i| ((i * 5 + shared) % 3) as u8));
                self.admit(t, gen, chunk);
            }
            Action::Readmit => {
                if let Some(t) = self.waiting.pop_front() {
                    self.admit(t, 3, 5);
                }
            }
            Action::Prefill => self.prefill(),
            Action::Decode => self.decode(),
            Action::Finish(i) => self.finish(i),
            Action::Abort(i) => {
                if !self.reqs.is_empty() {
                    let r = i % self.reqs.len();
                    self.drop_req(r);
                }
            }
            Action::Retract(i) => {
                if !self.reqs.is_empty() {
                    self.retract(i % self.reqs.len());
                }
            }
            Action::Evict(n) => {
                self.evict(n);
            }
            Action::Flush | Action::Settle => {}
        }
    }

    /// SGLang's result processing between two steps (releases, radix inserts, locks, unlocks) goes
    /// to the runtime through `flush`, so its statistics are those after the step: checked against
    /// the model, with no staging slot held but the open pages' (the last step's seals have run). A
    /// batch that writes or opens pages belongs to a step: it is refused whole and kept for it.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        let mut at = 0;
        let mut writes = false;
        while at < self.ops.len() {
            let (op, n) = (self.ops[at], self.ops[at + 1] as usize);
            writes |= matches!(op, OP_EXTEND | OP_DECODE | OP_WRITE | OP_ALLOC);
            at += 2 + match op {
                OP_EXTEND => 2 * n,
                OP_DECODE | OP_WRITE => n,
                _ => 0,
            };
        }
        if writes {
            let before = self.rt.clone();
            let res = self.rt.flush(&self.ops, &self.ids);
            prop_assert!(matches!(res, Err(Error::Event { .. })), "a flush with writes was accepted: {:?}", res);
            prop_assert_eq!(self.rt.stats(), before.stats());
            prop_assert_eq!(self.rt.page_to_staging(), before.page_to_staging());
            return Ok(());
        }
        self.rt.flush(&self.ops, &self.ids).map_err(|e| TestCaseError::fail(format!("flush failed: {e}")))?;
        self.ops.clear();
        self.ids.clear();
        self.seen.settles += 1;
        let s = self.rt.stats();
        let count = |st: St| self.pages.iter().filter(|p| p.st == st).count() as u64;
        prop_assert_eq!(
            (s.free_pages, s.open_pages, s.sealed_pages, s.staging_in_use),
            (count(St::Free), count(St::Open), count(St::Sealed), count(St::Open))
        );
        prop_assert_eq!(s.locked_pages, self.pages.iter().filter(|p| p.locks > 0).count() as u64);
        prop_assert_eq!(s.tree_pages, self.pages.iter().filter(|p| p.tree).count() as u64);
        for (i, pg) in self.pages.iter().enumerate() {
            let info = self.rt.page_info(i as u32).unwrap();
            prop_assert_eq!((info.locks, info.owner == Owner::Tree), (pg.locks, pg.tree), "page {}", i);
        }
        if let Err(v) = self.rt.check() {
            return Err(TestCaseError::fail(format!("check after flush: {v}")));
        }
        Ok(())
    }

    /// One scheduler step: the batch goes to the runtime; outputs checked against the model.
    /// Returns false once the (expected) staging exhaustion ended the trace.
    fn flush(&mut self) -> Result<bool, TestCaseError> {
        let res = self.rt.step(&self.ops, &self.ids).map(|o| (o.seal_plan.to_vec(), o.map_delta.to_vec()));
        self.ops.clear();
        self.ids.clear();
        if self.expect_exhaust {
            prop_assert!(matches!(res, Err(Error::StagingExhausted { .. })), "expected exhaustion, got {:?}", res);
            prop_assert!(self.rt.check().is_ok());
            self.seen.exhausted += 1;
            return Ok(false);
        }
        let (plan, delta) = res.map_err(|e| TestCaseError::fail(format!("step failed: {e}")))?;
        let planned: Vec<Option<u32>> = plan.chunks(2).map(|c| u32::try_from(c[0]).ok()).collect();
        prop_assert_eq!(&planned, &self.sealed_in_batch, "seal plan pages");
        for c in delta.chunks(2) {
            self.mirror[c[0] as usize] = c[1];
        }
        prop_assert_eq!(&self.mirror[..], self.rt.page_to_staging(), "map after applying the delta");
        let mut used = vec![false; self.cap];
        let staged =
            |page: u32| self.sealed_in_batch.iter().zip(&self.direct_in_batch).any(|(e, &d)| *e == Some(page) && !d);
        for (i, pg) in self.pages.iter().enumerate() {
            let slot = self.mirror[i];
            let sealing_now = pg.st == St::Sealed && staged(i as u32);
            prop_assert_eq!(slot != NO_SLOT, pg.st == St::Open || sealing_now, "page {} {:?} slot {}", i, pg.st, slot);
            if slot != NO_SLOT {
                prop_assert!(!std::mem::replace(&mut used[slot as usize], true), "slot {} mapped twice", slot);
            }
            let info = self.rt.page_info(i as u32).unwrap();
            let st = match info.state {
                PageState::Free => St::Free,
                PageState::Open => St::Open,
                PageState::Sealed => St::Sealed,
            };
            prop_assert_eq!(
                (st, info.fill as usize, info.locks),
                (pg.st, if pg.st == St::Free { 0 } else { pg.fill }, pg.locks)
            );
            prop_assert_eq!(info.owner == Owner::Tree, pg.tree);
        }
        let mut k = 0;
        for (c, &d) in plan.chunks(2).zip(&self.direct_in_batch) {
            if d {
                // Direct seals name scratch slots cap, cap + 1, ... in order, cancelled ones included.
                prop_assert_eq!(c[1], (self.cap + k) as i32, "direct seal {} names its scratch slot", k);
                k += 1;
            }
            if c[0] < 0 {
                continue;
            }
            prop_assert_eq!(self.pages[c[0] as usize].st, St::Sealed);
            let want = if d { NO_SLOT } else { c[1] };
            prop_assert_eq!(self.mirror[c[0] as usize], want, "the plan names the slot the map shows");
        }
        let live: Vec<i32> = plan.chunks(2).filter(|c| c[0] >= 0).map(|c| c[0]).collect();
        let mut dedup = live.clone();
        dedup.sort_unstable();
        dedup.dedup();
        prop_assert_eq!(live.len(), dedup.len(), "two live plan entries for one page");
        let s = self.rt.stats();
        let count = |st: St| self.pages.iter().filter(|p| p.st == st).count() as u64;
        prop_assert_eq!(
            (s.free_pages, s.open_pages, s.sealed_pages),
            (count(St::Free), count(St::Open), count(St::Sealed))
        );
        prop_assert_eq!(s.locked_pages, self.pages.iter().filter(|p| p.locks > 0).count() as u64);
        prop_assert_eq!(s.seals_last_step, self.sealed_in_batch.len() as u64);
        prop_assert!(s.staging_high_water <= self.cap as u64);
        if let Err(v) = self.rt.check() {
            return Err(TestCaseError::fail(format!("check: {v}")));
        }
        self.sealed_in_batch.clear();
        self.direct_in_batch.clear();
        Ok(true)
    }

    /// Abort everything, evict the whole tree: every page and every staging slot comes back.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        while !self.reqs.is_empty() {
            self.drop_req(0);
        }
        self.evict(usize::MAX);
        if !self.flush()? {
            return Ok(());
        }
        self.flush()?;
        let s = self.rt.stats();
        prop_assert_eq!(s.free_pages, s.total_pages);
        prop_assert_eq!(self.rt.staging_free(), self.cap);
        prop_assert_eq!(self.free.len() + 1, self.pages.len());
        Ok(())
    }
}

/// Run `actions` through `sim`, checking the runtime against the model at every settle and flush,
/// then drain it. A flush the model refuses (the trace ran out of pages) ends the trace early.
fn run_trace(mut sim: Sim, actions: &[Action]) -> Result<(), TestCaseError> {
    for a in actions {
        sim.run(a);
        if matches!(a, Action::Settle) {
            sim.settle()?;
        }
        if matches!(a, Action::Flush) && !sim.flush()? {
            return Ok(());
        }
    }
    if sim.flush()? {
        sim.drain()?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Plenty of staging: every trace is valid and the runtime must agree with the model at every step.
    #[test]
    fn traces_match_the_reference_model(pages in 12usize..48, scratch in 0usize..4, actions in prop::collection::vec(action(), 1..80)) {
        // Twice the pages: a batch can seal pages, free them and open new ones before the seals run.
        run_trace(Sim::new(pages, 2 * pages, scratch), &actions)?;
    }

    /// Scarce staging: exhaustion is reported exactly when the model says the pool is out, as a typed
    /// error, and the runtime stays internally consistent.
    #[test]
    fn staging_exhaustion_is_exact(pages in 12usize..48, cap in 1usize..6, scratch in 0usize..4, actions in prop::collection::vec(action(), 1..80)) {
        run_trace(Sim::new(pages, cap, scratch), &actions)?;
    }

    /// One corrupt event appended to a valid trace is caught with the right violation.
    #[test]
    fn corrupt_events_are_caught(pages in 12usize..48, actions in prop::collection::vec(action(), 1..60), pick in 0usize..1000, what in 0usize..5) {
        let mut sim = Sim::new(pages, 2 * pages, 2);
        for a in &actions {
            sim.run(a);
        }
        if !sim.flush()? {
            return Ok(());
        }
        let with = |f: &dyn Fn(&RefPage) -> bool| -> Option<u32> {
            let c: Vec<u32> = (1..sim.pages.len() as u32).filter(|&p| f(&sim.pages[p as usize])).collect();
            (!c.is_empty()).then(|| c[pick % c.len()])
        };
        let (ops, ids, want) = match what {
            0 => match with(&|p| p.st == St::Sealed) { Some(p) => (vec![OP_WRITE, 1, 1], vec![p], ViolationKind::WriteSealed), None => return Ok(()) },
            1 => match with(&|p| p.locks > 0) { Some(p) => (vec![OP_RELEASE, 1], vec![p], ViolationKind::ReleaseLocked), None => return Ok(()) },
            2 => match with(&|p| p.st == St::Free) { Some(p) => (vec![OP_RELEASE, 1], vec![p], ViolationKind::DoubleFree), None => return Ok(()) },
            3 => match with(&|p| p.st == St::Open) { Some(p) => (vec![OP_SHARE, 1], vec![p], ViolationKind::ShareUnsealed), None => return Ok(()) },
            _ => match with(&|p| p.st != St::Free && p.locks == 0) { Some(p) => (vec![OP_UNLOCK, 1], vec![p], ViolationKind::UnlockUnlocked), None => return Ok(()) },
        };
        let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
        match sim.rt.step(&ops, &ids) {
            Err(Error::Invariant { violation, event }) => {
                prop_assert_eq!(violation.kind, want);
                prop_assert_eq!(event, Some(0));
            }
            other => prop_assert!(false, "expected {:?}, got {:?}", want, other.map(|o| o.seal_plan.len())),
        }
    }
}

/// The property tests above are only as good as their traces: make sure the generator reaches every
/// kind of event often (fixed seed, so this is deterministic).
#[test]
fn generator_covers_the_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut total = Coverage::default();
    for i in 0..200 {
        let actions = prop::collection::vec(action(), 1..80).new_tree(&mut runner).unwrap().current();
        let pages = 12 + i % 36;
        let cap = if i % 2 == 0 { 2 * pages } else { 1 + i % 5 };
        let mut sim = Sim::new(pages, cap, i % 3);
        let mut alive = true;
        for a in &actions {
            sim.run(a);
            if matches!(a, Action::Settle) {
                sim.settle().unwrap();
            }
            if matches!(a, Action::Flush) {
                alive = sim.flush().unwrap();
                if !alive {
                    break;
                }
            }
        }
        if alive && sim.flush().unwrap() {
            sim.drain().unwrap();
        }
        let s = sim.seen;
        macro_rules! add {
            ($($field:ident),*) => { $(total.$field += s.$field;)* };
        }
        add!(
            seals,
            cancelled_seals,
            shares,
            duplicates,
            evictions,
            locks,
            chunked,
            decodes,
            retractions,
            direct_seals,
            exhausted,
            settles
        );
    }
    eprintln!("{total:?}");
    // Every kind of event the generator is meant to produce occurred often enough to be tested.
    macro_rules! at_least_20 {
        ($($field:ident $what:literal),*) => { $(assert!(total.$field >= 20, "the trace generator produced only {} {}", total.$field, $what);)* };
    }
    at_least_20!(seals "seals", direct_seals "direct seals", cancelled_seals "cancelled seals", shares "shares",
                 duplicates "duplicates", evictions "evictions", locks "locks", chunked "chunked prefills",
                 decodes "decode rows", retractions "retractions", exhausted "exhaustions", settles "flushes between steps");
}
