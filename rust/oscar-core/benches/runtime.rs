//! Host cost of the page runtime.
//!
//! * `step/decode_bN`: one scheduler step at batch N in steady-state serving: every request decodes
//!   one token (one DECODE record), pages open and seal as requests cross page boundaries, and
//!   requests that reach `MAX_LEN` finish (RELEASE of their pages) and are replaced by a new one
//!   (EXTEND of a `PROMPT`-token prompt). Page size 128, as served.
//! * `pool_size/pN`: the same batch-64 workload on pools of 1e4..1e7 pages whose free list is
//!   shuffled (pages scattered over the whole table), reported per page event: it must stay flat.
//!
//! Only `Runtime::step` is timed; the workload generator runs outside the timed region.
//! Run: `cargo bench -p oscar-core --bench runtime` (short settings: the machine has 2 cores).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oscar_core::plan::QuantFormat;
use oscar_core::runtime::{Runtime, RuntimeConfig, OP_DECODE, OP_EXTEND, OP_RELEASE};

const P: u32 = 128;
const PROMPT: u32 = 512;
const MAX_LEN: u32 = 2048;

struct Req {
    len: u32,
    pages: Vec<u32>,
}

/// SGLang-like steady-state serving at a fixed batch size.
struct Workload {
    free: Vec<u32>,
    reqs: Vec<Req>,
    ops: Vec<i64>,
    ids: Vec<i64>,
}

impl Workload {
    fn new(num_pages: u32, batch: usize, seed: u64) -> (Self, Runtime) {
        let mut free: Vec<u32> = (1..num_pages).collect();
        // Fisher-Yates with a fixed LCG: pages of one request land far apart in big pools.
        let mut x = seed;
        for i in (1..free.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            free.swap(i, (x >> 33) as usize % (i + 1));
        }
        let rt = Runtime::new(RuntimeConfig {
            num_pages,
            page_size: P,
            staging_slots: 2 * batch as u32 + 2 * (PROMPT / P) + 8,
            scratch_slots: 0,
            kv_heads: 8,
            head_dim: 128,
            quant: QuantFormat { bits: 2, k_group: 32, v_group: 32, scale_columns: 1, key_grid_page: 0 },
        })
        .expect("valid bench config");
        let mut w = Self { free, reqs: Vec::new(), ops: Vec::new(), ids: Vec::new() };
        let mut rt = rt;
        // Requests start at staggered lengths so that finishes spread over the steps.
        let span = MAX_LEN - PROMPT;
        for i in 0..batch {
            let len = PROMPT + (i as u64 * u64::from(span) / batch as u64) as u32;
            w.ops.clear();
            w.ids.clear();
            w.prefill(len);
            rt.step(&w.ops, &w.ids).expect("warm-up prefill");
        }
        rt.step(&[], &[]).expect("warm-up");
        (w, rt)
    }

    fn pop(&mut self) -> u32 {
        self.free.pop().expect("the bench pool is large enough")
    }

    fn prefill(&mut self, len: u32) {
        let pages: Vec<u32> = (0..len.div_ceil(P)).map(|_| self.pop()).collect();
        self.ops.extend([OP_EXTEND, 1, 0, i64::from(len)]);
        self.ids.extend(pages.iter().map(|&p| i64::from(p)));
        self.reqs.push(Req { len, pages });
    }

    /// The next step's events into `ops` / `ids`.
    fn next(&mut self) {
        self.ops.clear();
        self.ids.clear();
        let mut i = 0;
        while i < self.reqs.len() {
            if self.reqs[i].len >= MAX_LEN {
                let done = self.reqs.swap_remove(i);
                self.ops.extend([OP_RELEASE, done.pages.len() as i64]);
                self.ids.extend(done.pages.iter().map(|&p| i64::from(p)));
                self.free.extend(done.pages);
                self.prefill(PROMPT);
                let last = self.reqs.len() - 1;
                self.reqs.swap(i, last);
            } else {
                i += 1;
            }
        }
        self.ops.extend([OP_DECODE, self.reqs.len() as i64]);
        for r in 0..self.reqs.len() {
            self.ops.push(i64::from(self.reqs[r].len) + 1);
        }
        for r in 0..self.reqs.len() {
            if self.reqs[r].len.is_multiple_of(P) {
                let page = self.pop();
                self.reqs[r].pages.push(page);
            }
            let page = *self.reqs[r].pages.last().expect("a request has a page");
            self.ids.push(i64::from(page));
            self.reqs[r].len += 1;
        }
    }

    fn page_events_per_step(num_pages: u32, batch: usize) -> f64 {
        let (mut w, _) = Self::new(num_pages, batch, 1);
        let n = 2000;
        let total: usize = (0..n)
            .map(|_| {
                w.next();
                w.ids.len()
            })
            .sum();
        total as f64 / n as f64
    }
}

fn timed_steps(w: &mut Workload, rt: &mut Runtime, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        w.next();
        let t = Instant::now();
        let out = rt.step(black_box(&w.ops), black_box(&w.ids)).expect("valid workload");
        black_box(out.seal_plan.len() + out.map_delta.len());
        total += t.elapsed();
    }
    total
}

fn per_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("step");
    g.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for batch in [1usize, 64, 256] {
        let (mut w, mut rt) = Workload::new(200_000, batch, 7);
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("decode", format!("b{batch}")), |b| {
            b.iter_custom(|iters| timed_steps(&mut w, &mut rt, iters))
        });
    }
    g.finish();
}

fn pool_size(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_size");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for pages in [10_000u32, 100_000, 1_000_000, 10_000_000] {
        let batch = 64;
        let per_step = Workload::page_events_per_step(pages, batch);
        let (mut w, mut rt) = Workload::new(pages, batch, 11);
        // Throughput in page events: criterion reports time per event.
        g.throughput(Throughput::Elements(per_step.round() as u64));
        g.bench_function(BenchmarkId::new("b64", format!("p{pages}")), |b| {
            b.iter_custom(|iters| timed_steps(&mut w, &mut rt, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, per_step, pool_size);
criterion_main!(benches);
