//! Batched matmul: Candle layouts become strided GEMM operands (row/column strides carry the
//! transposes, so no copy is made unless the batch dimensions cannot be folded into one
//! stride), and every product goes through [`gemm`], the backend's one GEMM entry point.
use super::{alloc, float_dispatch};
use crate::buffer::{Buf, BufElem, Region};
use crate::error::{at, invalid};
use crate::gemm::check_operands;
pub use crate::gemm::{GemmOperand, GemmShape};
use candle_core::{DType, Layout, Result};
use kernels::runtime::{Device, DeviceVec};

thread_local! {
    static MMA_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static NO_MATVEC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with matvec-shaped products ([`crate::gemm::matvec_plan`]) it issues on this
/// thread going to the GEMM path (vendor BLAS or GEMM kernel) instead of the dense matvec:
/// to compare the two, or to rule the matvec out.
pub fn with_gemm_for_matvecs<R>(f: impl FnOnce() -> R) -> R {
    crate::blas::with_thread_flag(&NO_MATVEC, f)
}

/// `true` while matvec-shaped products take the dense matvec on this thread: not inside
/// [`with_gemm_for_matvecs`], and not with `CANDLE_ROCM_MATVEC=0` in the environment (read
/// once; the whole process).
pub fn matvecs_allowed() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var("CANDLE_ROCM_MATVEC").is_ok_and(|v| v == "0")) && !NO_MATVEC.with(|k| k.get())
}

/// Runs `f` with the f16/bf16 GEMMs it issues on the CPU executor taking the matrix-unit
/// kernel (`kernels::gemm`, emulated lane by lane) that GPUs without a vendor BLAS take,
/// instead of `kernels::matmul_simple`: tests of that path without a GPU.
pub fn with_mma_gemm_on_cpu<R>(f: impl FnOnce() -> R) -> R {
    crate::blas::with_thread_flag(&MMA_ON_CPU, f)
}

/// Fewest rows of C for which a GPU without a vendor BLAS runs an f16/bf16 product on
/// `kernels::gemm`: its work-group tile is 64..128 rows, so decode's one-row products
/// waste nearly all of it (H100, llama 1B without cuBLAS: decode fell from 51 to 16
/// tokens/s with every product on it); fewer rows stay on `matmul_simple`.
pub const MMA_MIN_ROWS: usize = 64;

/// `true` when f16/bf16 products of `dev` with `m` rows take `kernels::gemm` (matrix
/// units): on GPUs from [`MMA_MIN_ROWS`] rows, and on the CPU executor inside
/// [`with_mma_gemm_on_cpu`] (any size, for tests).
fn mma_gemm(dev: &Device, dtype: DType, m: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && if matches!(dev, Device::Cpu(_)) { MMA_ON_CPU.with(|k| k.get()) } else { m >= MMA_MIN_ROWS }
}

/// The GEMM contract: `c[bi] = a[bi] * b[bi]` with `c` contiguous `(batch, m, n)`, `f32`
/// accumulation. Operands are checked to stay inside their regions. Matvec-shaped
/// products (decode: at most 8 activation rows against a `Linear` weight,
/// [`crate::gemm::matvec_plan`]) run on the dense matvec (`kernels::llm::dense_matvec`,
/// the weight streamed once at the memory's rate) on every device, unless
/// [`matvecs_allowed`] says no. Otherwise, on a GPU whose vendor
/// BLAS is loaded (cuBLAS, rocBLAS: [`crate::blas`]) and layouts it can take, the BLAS.
/// Otherwise f16/bf16 on a GPU take `kernels::gemm` (matrix units: MFMA, WMMA, `mma.sync`,
/// tiled and pipelined), and f32/f64 and the CPU executor the `kernels::matmul_simple`
/// tiled kernel (exact f32 products: `kernels::gemm` runs f32 as three bf16 products).
pub fn gemm<
    T: kernel_dsl::Float + kernel_dsl::host::ScalarArg + candle_core::WithDType + 'static,
>(
    dev: &Device,
    a: &GemmOperand,
    b: &GemmOperand,
    c: &mut DeviceVec<T>,
    s: GemmShape,
) -> Result<()> {
    const OP: &str = "matmul";
    let GemmShape { batch, m, n, k } = s;
    check_operands(a, b, c.len(), s)?;
    if batch * m * n == 0 {
        return Ok(());
    }
    if matvecs_allowed() {
        if let Some(p) = crate::gemm::matvec_plan(a, b, s) {
            let mut y = Region::of::<T>(c);
            kernels::llm::ops::dense_matvec::<T>(dev, &p.w, &p.x, None, &mut y, p.n, p.k, p.rows).map_err(at(OP))?;
            return Ok(());
        }
    }
    if crate::blas::try_gemm(dev, T::DTYPE, a, b, &Region::of::<T>(c), s)? {
        return Ok(());
    }
    // The grid's z counts batch entries: at most 65535 per launch on every vendor.
    const Z: usize = 65535;
    let c_all = Region::of::<T>(c);
    let mut start = 0;
    while start < batch {
        let nb = (batch - start).min(Z);
        let sub = |o: &GemmOperand| -> Result<Region> {
            let off = start * o.batch;
            o.data.sub(off, o.data.len() - off)
        };
        let (ra, rb) = (sub(a)?, sub(b)?);
        let mut rc = c_all.sub(start * m * n, nb * m * n)?;
        if mma_gemm(dev, T::DTYPE, m) {
            use kernels::gemm::Strides;
            let strides = |o: &GemmOperand| Strides { batch: o.batch, row: o.row, col: o.col };
            let shape = kernels::gemm::GemmShape { batch: nb, m, n, k };
            float16_gemm::<T>(dev, shape, &ra, strides(a), &rb, strides(b), &mut rc).map_err(at(OP))?;
            start += nb;
            continue;
        }
        let cfg = kernels::matmul_simple::launch_config(nb, m, n);
        kernels::matmul_simple::matmul_simple::launch::<T>(
            dev, cfg, &ra, &rb, &mut rc, m, n, k, a.batch, a.row, a.col, b.batch, b.row, b.col,
        )
        .map_err(at(OP))?;
        start += nb;
    }
    Ok(())
}

/// `kernels::gemm::matmul_strided` for the 16-bit float types (the only ones
/// [`mma_gemm`] sends there), `c` contiguous.
fn float16_gemm<T: candle_core::WithDType>(
    dev: &Device,
    shape: kernels::gemm::GemmShape,
    a: &Region,
    a_s: kernels::gemm::Strides,
    b: &Region,
    b_s: kernels::gemm::Strides,
    c: &mut Region,
) -> std::result::Result<(), kernels::runtime::LaunchError> {
    use kernels::gemm::{matmul_strided, Epilogue};
    let (ldc, cbs) = (shape.n, shape.m * shape.n);
    match T::DTYPE {
        DType::F16 => matmul_strided::<half::f16>(dev, shape, a, a_s, b, b_s, c, ldc, cbs, &Epilogue::default()),
        DType::BF16 => matmul_strided::<half::bf16>(dev, shape, a, a_s, b, b_s, c, ldc, cbs, &Epilogue::default()),
        d => Err(kernels::runtime::LaunchError::InvalidArgument { kernel: "matmul", reason: format!("{d:?} has no matrix-unit GEMM") }),
    }
}

/// The view `l` of `buf` as a GEMM operand of `batch` matrices `rows x cols`, or `None`
/// when its batch dimensions do not fold into one stride.
fn operand(buf: &Buf, l: &Layout, batch: usize, rows: usize, cols: usize) -> Result<Option<GemmOperand>> {
    let (dims, strides) = (l.dims(), l.stride());
    let r = dims.len();
    if r < 2 || dims[r - 2] != rows || dims[r - 1] != cols || dims[..r - 2].iter().product::<usize>() != batch {
        return Err(invalid("matmul", format!("operand of shape {dims:?} for {batch} x ({rows} x {cols})")));
    }
    // Fold the batch dims (size-1 ones ignored) into one stride.
    let mut bstride = None;
    let mut expect = None;
    for d in (0..r - 2).rev() {
        if dims[d] == 1 {
            continue;
        }
        match expect {
            None => bstride = Some(strides[d]),
            Some(e) if e == strides[d] => {}
            Some(_) => return Ok(None),
        }
        expect = Some(strides[d] * dims[d]);
    }
    Ok(Some(GemmOperand { data: buf.from_offset(l)?, batch: bstride.unwrap_or(0), row: strides[r - 2], col: strides[r - 1] }))
}

/// Candle's `matmul` for `(b, m, n, k)`.
pub fn matmul(dev: &Device, lhs: &Buf, ll: &Layout, rhs: &Buf, rl: &Layout, (batch, m, n, k): (usize, usize, usize, usize)) -> Result<Buf> {
    const OP: &str = "matmul";
    if lhs.dtype() != rhs.dtype() {
        return Err(invalid(OP, format!("dtypes {:?} and {:?} differ", lhs.dtype(), rhs.dtype())));
    }
    // Operands whose batch dims do not fold are made contiguous first.
    let mut keep = Vec::new();
    let mut get = |buf: &Buf, l: &Layout, rows, cols| -> Result<GemmOperand> {
        if let Some(o) = operand(buf, l, batch, rows, cols)? {
            return Ok(o);
        }
        let mut copy = Buf::uninit(dev, buf.dtype(), l.shape().elem_count())?;
        super::elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
        let o = operand(&copy, &Layout::contiguous(l.shape()), batch, rows, cols)?
            .ok_or_else(|| invalid(OP, "contiguous operand did not fold"))?;
        keep.push(copy);
        Ok(o)
    };
    let a = get(lhs, ll, m, k)?;
    let b = get(rhs, rl, k, n)?;
    if lhs.dtype() == DType::F64 {
        return gemm_f64(dev, lhs, ll, rhs, rl, &a, &b, GemmShape { batch, m, n, k });
    }
    float_dispatch!(lhs.dtype(), OP, T => {
        let mut c = alloc::<T>(dev, batch * m * n, OP)?;
        gemm::<T>(dev, &a, &b, &mut c, GemmShape { batch, m, n, k })?;
        Ok(T::wrap(c))
    })
}

/// f64 matmul: the vendor BLAS only (dgemm); the backend has no f64 GEMM kernel, so without
/// one (CPU executor, library missing, [`with_kernel_gemm`](crate::blas::with_kernel_gemm))
/// this is an error saying so. Operands without a BLAS layout are copied contiguous first.
#[allow(clippy::too_many_arguments)]
fn gemm_f64(
    dev: &Device,
    lhs: &Buf,
    ll: &Layout,
    rhs: &Buf,
    rl: &Layout,
    a: &GemmOperand,
    b: &GemmOperand,
    s: GemmShape,
) -> Result<Buf> {
    const OP: &str = "matmul";
    let GemmShape { batch, m, n, k } = s;
    let c = dev
        .alloc::<f64>(batch * m * n)
        .map_err(crate::error::at(OP))?;
    check_operands(a, b, c.len(), s)?;
    if batch * m * n == 0 || k == 0 {
        return Ok(f64::wrap(c));
    }
    let cr = Region::of::<f64>(&c);
    if crate::blas::try_gemm(dev, DType::F64, a, b, &cr, s)? {
        return Ok(f64::wrap(c));
    }
    let no_blas = || {
        let why = crate::blas::describe(dev).unwrap_or_else(|| "the CPU executor".into());
        invalid(OP, format!("F64 matmul needs a vendor BLAS (dgemm), the backend has no f64 GEMM kernel; this device: {why}{}",
            if crate::blas::blas_allowed() { "" } else { " (vendor BLAS switched off)" }))
    };
    if !crate::blas::available(dev) || !crate::blas::blas_allowed() {
        return Err(no_blas());
    }
    // A layout without a BLAS form: contiguous copies always have one.
    let mut keep = (None, None);
    let ac = super::contiguous::<f64>(dev, lhs, ll, &mut keep.0, OP)?;
    let bc = super::contiguous::<f64>(dev, rhs, rl, &mut keep.1, OP)?;
    let a2 = GemmOperand {
        data: Region::of::<f64>(ac),
        batch: m * k,
        row: k,
        col: 1,
    };
    let b2 = GemmOperand {
        data: Region::of::<f64>(bc),
        batch: k * n,
        row: n,
        col: 1,
    };
    check_operands(&a2, &b2, c.len(), s)?;
    if crate::blas::try_gemm(dev, DType::F64, &a2, &b2, &cr, s)? {
        return Ok(f64::wrap(c));
    }
    Err(no_blas())
}
