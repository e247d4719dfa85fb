//! `oscar_sgl._core`: a thin PyO3 shell over `oscar-core`. Arrays cross as `bytes` (little-endian)
//! plus shape ints, which keeps the module abi3 and free of numpy/torch. Errors become the classes of
//! `oscar_sgl.errors` (the one mapping table), looked up by the core's error kind.

use oscar_core::pack::{self, BlockShape};
use oscar_core::plan::{self, ModelShape, QuantFormat};
use oscar_core::runtime::{self, RuntimeConfig};
use oscar_core::{half, Error};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

/// Batches with more words than this release the GIL while they are applied.
const DETACH_WORDS: usize = 1 << 14;

static FROM_CORE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn to_py_err(py: Python<'_>, e: Error) -> PyErr {
    let details = PyDict::new(py);
    let filled = (|| -> PyResult<()> {
        match &e {
            Error::Layout(_) => {}
            Error::Event { at, .. } => details.set_item("at", at)?,
            Error::StagingExhausted { capacity, page, event } => {
                details.set_item("capacity", capacity)?;
                details.set_item("page", page)?;
                details.set_item("event", event)?;
            }
            Error::Invariant { violation, event } => {
                details.set_item("violation", violation.kind.name())?;
                details.set_item("page", violation.page)?;
                details.set_item("event", event)?;
            }
        }
        Ok(())
    })();
    let made = filled.and_then(|()| {
        let from_core = FROM_CORE
            .get_or_try_init(py, || Ok::<_, PyErr>(py.import("oscar_sgl.errors")?.getattr("from_core")?.unbind()))?;
        from_core.bind(py).call1((e.kind(), e.to_string(), details))
    });
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(import_failure) => {
            let err = PyRuntimeError::new_err(format!("{} ({})", e, e.kind()));
            err.set_cause(py, Some(import_failure));
            err
        }
    }
}

fn f32s(py: Python<'_>, raw: &[u8]) -> PyResult<Vec<f32>> {
    if !raw.len().is_multiple_of(4) {
        return Err(to_py_err(py, Error::Layout(format!("{} bytes are not whole float32 values", raw.len()))));
    }
    Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

fn f16s(py: Python<'_>, raw: &[u8]) -> PyResult<Vec<half::f16>> {
    if !raw.len().is_multiple_of(2) {
        return Err(to_py_err(py, Error::Layout(format!("{} bytes are not whole float16 values", raw.len()))));
    }
    Ok(raw.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]])).collect())
}

fn i64s(py: Python<'_>, raw: &[u8], what: &str) -> PyResult<Vec<i64>> {
    if !raw.len().is_multiple_of(8) {
        return Err(to_py_err(
            py,
            Error::Event { at: 0, why: format!("{what}: {} bytes are not whole int64 values", raw.len()) },
        ));
    }
    Ok(raw.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
}

fn f16_bytes<'py>(py: Python<'py>, v: &[half::f16]) -> Bound<'py, PyBytes> {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    PyBytes::new(py, &raw)
}

fn f32_bytes<'py>(py: Python<'py>, v: &[f32]) -> Bound<'py, PyBytes> {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    PyBytes::new(py, &raw)
}

/// int32 arrays go out as `bytearray`: writable, so numpy/torch wrap them without a copy or warning.
fn i32_bytes<'py>(py: Python<'py>, v: &[i32]) -> Bound<'py, PyByteArray> {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    PyByteArray::new(py, &raw)
}

fn quant(bits: u32, k_group: u32, v_group: u32, scale_columns: u32, key_grid_page: u32) -> QuantFormat {
    QuantFormat { bits, k_group, v_group, scale_columns, key_grid_page }
}

/// The key (`part="k"`) or value (`part="v"`) variant of a packer function.
fn by_part<T>(py: Python<'_>, part: &str, k: T, v: T) -> PyResult<T> {
    match part {
        "k" => Ok(k),
        "v" => Ok(v),
        _ => Err(to_py_err(py, Error::Layout(format!("part must be 'k' or 'v', got {part:?}")))),
    }
}

/// Quantize and pack keys (`part="k"`, float32 `[H, n, D]` already divided by the token scale,
/// `group` = k_group) or values (`part="v"`, `group` = v_group); `shape` is `(H, n, D)`. Returns
/// `(codes [H, n, D*b/8] uint8, params)` as bytes: key params `[H, n/k_group, 2, D]`, value params
/// `[H, n, 2, D/v_group]` float16. `offset` ("integer" or "min") and `clip` are the seal-time
/// quantizer options of `OscarConfig` (docs/OSCAR.md §2.3) for this part.
#[pyfunction]
#[pyo3(name = "pack", signature = (values, *, part, shape, bits, group, offset = "integer", clip = false))]
#[allow(clippy::too_many_arguments)]
fn pack_block<'py>(
    py: Python<'py>,
    values: &[u8],
    part: &str,
    shape: (usize, usize, usize),
    bits: u32,
    group: usize,
    offset: &str,
    clip: bool,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let f = by_part::<PackFn>(py, part, pack::pack_k, pack::pack_v)?;
    let quant = pack::Quantizer { offset: pack::Offset::parse(offset).map_err(|e| to_py_err(py, e))?, clip };
    let x = f32s(py, values)?;
    let shape = BlockShape::new(shape.0, shape.1, shape.2);
    let p = py.detach(|| f(&x, shape, bits, group, quant)).map_err(|e| to_py_err(py, e))?;
    Ok((PyBytes::new(py, &p.codes), f16_bytes(py, &p.params)))
}

/// Dequantize packed keys (`part="k"`, `group` = k_group) or values (`part="v"`, `group` =
/// v_group) of `shape` `(H, n, D)` to float32 `[H, n, D]` bytes.
#[pyfunction]
#[pyo3(name = "unpack", signature = (codes, params, *, part, shape, bits, group))]
fn unpack_block<'py>(
    py: Python<'py>,
    codes: &[u8],
    params: &[u8],
    part: &str,
    shape: (usize, usize, usize),
    bits: u32,
    group: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let f = by_part::<UnpackFn>(py, part, pack::unpack_k, pack::unpack_v)?;
    let prm = f16s(py, params)?;
    let shape = BlockShape::new(shape.0, shape.1, shape.2);
    let y = py.detach(|| f(codes, &prm, shape, bits, group)).map_err(|e| to_py_err(py, e))?;
    Ok(f32_bytes(py, &y))
}

/// Quantize and pack keys (float32 `[H, n, D]` already divided by the token scale) with page-grid
/// ranges (`OscarConfig.key_ranges = "page"`, docs/LAYOUT.md §1); `shape` is `(H, n, D)`, `n`
/// whole pages. Returns `(codes [H, n, D*b/8] uint8, grid [H, n/P, 2, D] float16, ranges
/// [H, n/k_group, 2, D] uint8)` as bytes.
#[pyfunction]
#[pyo3(signature = (values, *, shape, bits, k_group, page_size))]
fn pack_k_page<'py>(
    py: Python<'py>,
    values: &[u8],
    shape: (usize, usize, usize),
    bits: u32,
    k_group: usize,
    page_size: usize,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let x = f32s(py, values)?;
    let shape = BlockShape::new(shape.0, shape.1, shape.2);
    let p = py.detach(|| pack::pack_k_page(&x, shape, bits, k_group, page_size)).map_err(|e| to_py_err(py, e))?;
    Ok((PyBytes::new(py, &p.codes), f16_bytes(py, &p.grid), PyBytes::new(py, &p.ranges)))
}

/// Dequantize keys packed by `pack_k_page` to float32 `[H, n, D]` bytes.
#[pyfunction]
#[pyo3(signature = (codes, grid, ranges, *, shape, bits, k_group, page_size))]
#[allow(clippy::too_many_arguments)]
fn unpack_k_page<'py>(
    py: Python<'py>,
    codes: &[u8],
    grid: &[u8],
    ranges: &[u8],
    shape: (usize, usize, usize),
    bits: u32,
    k_group: usize,
    page_size: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let g = f16s(py, grid)?;
    let shape = BlockShape::new(shape.0, shape.1, shape.2);
    let y = py
        .detach(|| pack::unpack_k_page(codes, &g, ranges, shape, bits, k_group, page_size))
        .map_err(|e| to_py_err(py, e))?;
    Ok(f32_bytes(py, &y))
}

type PackFn = fn(&[f32], BlockShape, u32, usize, pack::Quantizer) -> oscar_core::Result<pack::Packed>;
type UnpackFn = fn(&[u8], &[half::f16], BlockShape, u32, usize) -> oscar_core::Result<Vec<f32>>;

/// `(packed bytes per token per layer, stored bits per K/V element)` (docs/LAYOUT.md §4);
/// `shape` is `(kv_heads, head_dim)`.
#[pyfunction]
#[pyo3(signature = (*, shape, bits, k_group, v_group, scale_columns, key_grid_page = 0))]
fn format_cost(
    py: Python<'_>,
    shape: (u32, u32),
    bits: u32,
    k_group: u32,
    v_group: u32,
    scale_columns: u32,
    key_grid_page: u32,
) -> PyResult<(f64, f64)> {
    let q = quant(bits, k_group, v_group, scale_columns, key_grid_page);
    let bytes = q.bytes_per_token(shape.0, shape.1).map_err(|e| to_py_err(py, e))?;
    let bits = q.effective_bits(shape.0, shape.1).map_err(|e| to_py_err(py, e))?;
    Ok((bytes, bits))
}

/// `(name, bytes_per_token, bytes_per_page, staging_bytes, pages, tokens)`.
type PlanRow = (&'static str, f64, u64, u64, u64, u64);

/// One row per format (bf16, fp8, int4, int2):
/// `(name, bytes_per_token, bytes_per_page, staging_bytes, pages, tokens)`.
#[pyfunction]
#[pyo3(signature = (*, layers, kv_heads, head_dim, page_size, staging_pages, budget_bytes, k_group, v_group, scale_columns, key_grid_page = 0))]
#[allow(clippy::too_many_arguments)]
fn plan_memory(
    py: Python<'_>,
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    page_size: u32,
    staging_pages: u64,
    budget_bytes: u64,
    k_group: u32,
    v_group: u32,
    scale_columns: u32,
    key_grid_page: u32,
) -> PyResult<Vec<PlanRow>> {
    let shape = ModelShape { layers, kv_heads, head_dim };
    let q = quant(2, k_group, v_group, scale_columns, key_grid_page);
    let plans = plan::plan_memory(shape, q, page_size, staging_pages, budget_bytes).map_err(|e| to_py_err(py, e))?;
    Ok(plans
        .iter()
        .map(|p| (p.dtype.name(), p.bytes_per_token, p.bytes_per_page, p.staging_bytes, p.pages, p.tokens))
        .collect())
}

/// The page runtime (see `oscar_core::runtime`). One `step` call per scheduler step.
#[pyclass(module = "oscar_sgl._core")]
struct Runtime {
    inner: runtime::Runtime,
}

#[pymethods]
impl Runtime {
    #[new]
    #[pyo3(signature = (*, num_pages, page_size, staging_slots, kv_heads, head_dim, bits, k_group, v_group, scale_columns, scratch_slots=0, key_grid_page=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_pages: u32,
        page_size: u32,
        staging_slots: u32,
        kv_heads: u32,
        head_dim: u32,
        bits: u32,
        k_group: u32,
        v_group: u32,
        scale_columns: u32,
        scratch_slots: u32,
        key_grid_page: u32,
    ) -> PyResult<Self> {
        let cfg = RuntimeConfig {
            num_pages,
            page_size,
            staging_slots,
            scratch_slots,
            kv_heads,
            head_dim,
            quant: quant(bits, k_group, v_group, scale_columns, key_grid_page),
        };
        let inner = py.detach(|| runtime::Runtime::new(cfg)).map_err(|e| to_py_err(py, e))?;
        Ok(Self { inner })
    }

    /// Apply one step's events (`ops`, `ids`: little-endian int64 bytes). Returns
    /// `(seal_plan, map_delta)`: little-endian int32 `bytearray`s of `(page, slot)` pairs.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        ops: &[u8],
        ids: &[u8],
    ) -> PyResult<(Bound<'py, PyByteArray>, Bound<'py, PyByteArray>)> {
        let ops = i64s(py, ops, "ops")?;
        let ids = i64s(py, ids, "ids")?;
        let inner = &mut self.inner;
        let res = if ops.len() + ids.len() > DETACH_WORDS {
            py.detach(|| inner.step(&ops, &ids).map(|o| (o.seal_plan.to_vec(), o.map_delta.to_vec())))
        } else {
            inner.step(&ops, &ids).map(|o| (o.seal_plan.to_vec(), o.map_delta.to_vec()))
        };
        let (plan, delta) = res.map_err(|e| to_py_err(py, e))?;
        Ok((i32_bytes(py, &plan), i32_bytes(py, &delta)))
    }

    /// Apply between two steps the events that follow a step's forward (release, lock, unlock,
    /// share; `ops`, `ids` as for `step`), so `stats()` is the state after the step. Writes and
    /// allocations are refused (`EventError`); map changes come with the next `step`.
    fn flush(&mut self, py: Python<'_>, ops: &[u8], ids: &[u8]) -> PyResult<()> {
        let ops = i64s(py, ops, "ops")?;
        let ids = i64s(py, ids, "ids")?;
        self.inner.flush(&ops, &ids).map_err(|e| to_py_err(py, e))
    }

    /// Audit every invariant; raises `InvariantViolation`.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.check()).map_err(|violation| to_py_err(py, Error::Invariant { violation, event: None }))
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    /// The whole page -> staging map, little-endian int32 bytes (one per page, -1: not in staging).
    fn page_to_staging<'py>(&self, py: Python<'py>) -> Bound<'py, PyByteArray> {
        i32_bytes(py, self.inner.page_to_staging())
    }

    /// Staging slots free now.
    fn staging_free(&self) -> usize {
        self.inner.staging_free()
    }

    /// Staging slots the next step can open pages into (free now + released at its start).
    fn staging_available(&self) -> usize {
        self.inner.staging_available()
    }

    /// `(state, owner, fill, slot, locks)` of one page.
    fn page_info(&self, py: Python<'_>, page: u32) -> PyResult<(&'static str, &'static str, u32, i32, u32)> {
        let i = self.inner.page_info(page).map_err(|e| to_py_err(py, e))?;
        Ok((i.state.name(), i.owner.name(), i.fill, i.slot, i.locks))
    }

    /// Counters by name (ints, and floats for the ratios).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("total_pages", s.total_pages),
            ("free_pages", s.free_pages),
            ("open_pages", s.open_pages),
            ("sealed_pages", s.sealed_pages),
            ("tree_pages", s.tree_pages),
            ("locked_pages", s.locked_pages),
            ("open_tokens", s.open_tokens),
            ("staging_capacity", s.staging_capacity),
            ("staging_in_use", s.staging_in_use),
            ("staging_high_water", s.staging_high_water),
            ("steps", s.steps),
            ("seals_last_step", s.seals_last_step),
            ("seals_total", s.seals_total),
            ("direct_seals_total", s.direct_seals_total),
            ("max_seals_per_step", s.max_seals_per_step),
            ("events_total", s.events_total),
        ] {
            d.set_item(k, v)?;
        }
        d.set_item("compression_ratio", s.compression_ratio)?;
        d.set_item("format_ratio", s.format_ratio)?;
        Ok(d)
    }

    /// `(num_pages, page_size, staging_slots, scratch_slots, layout_version)`: fixed at construction.
    fn sizes(&self) -> (u32, u32, u32, u32, u32) {
        let c = self.inner.config();
        (c.num_pages, c.page_size, c.staging_slots, c.scratch_slots, self.inner.format().layout_version)
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("LAYOUT_VERSION", oscar_core::LAYOUT_VERSION)?;
    for (name, op) in [
        ("OP_EXTEND", runtime::OP_EXTEND),
        ("OP_DECODE", runtime::OP_DECODE),
        ("OP_ALLOC", runtime::OP_ALLOC),
        ("OP_WRITE", runtime::OP_WRITE),
        ("OP_RELEASE", runtime::OP_RELEASE),
        ("OP_LOCK", runtime::OP_LOCK),
        ("OP_UNLOCK", runtime::OP_UNLOCK),
        ("OP_SHARE", runtime::OP_SHARE),
    ] {
        m.add(name, op)?;
    }
    m.add_function(wrap_pyfunction!(pack_block, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_block, m)?)?;
    m.add_function(wrap_pyfunction!(pack_k_page, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_k_page, m)?)?;
    m.add_function(wrap_pyfunction!(format_cost, m)?)?;
    m.add_function(wrap_pyfunction!(plan_memory, m)?)?;
    m.add_class::<Runtime>()?;
    Ok(())
}
