//! The checked GEMM launcher: shapes, strides and sizes validated before anything runs.
use super::{block_tile, gemm_split_sum, gemm_tiled, gemm_wgmma, smem_elems, wgmma_smem_elems, work_group_size, GemmElem, WG_BK, WG_BM, WG_BN, WG_THREADS};
use crate::runtime::{Device, DeviceVec};
use crate::dtype::host::arg_len;
use kernel_dsl::host::{ArgValue, KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError, MatrixUnit, ScalarArg};
use kernel_dsl::mma::Lowering;
use kernel_dsl::Dim3;

/// Sizes of `C[batch] (m x n) = A[batch] (m x k) * B[batch] (k x n)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Independent products.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
}

/// How an operand is stored: row-major with leading dimension `ld`, or transposed (its
/// transpose stored row-major), plus the distance between batch entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// The matrix is stored transposed: A as `k x m`, B as `n x k`.
    pub transposed: bool,
    /// Elements between consecutive stored rows.
    pub ld: usize,
    /// Elements between batch entries.
    pub batch_stride: usize,
}

impl Operand {
    /// Row-major, densely packed `rows x cols` matrices one after another.
    pub fn row_major(rows: usize, cols: usize) -> Operand {
        Operand { transposed: false, ld: cols, batch_stride: rows * cols }
    }
    /// Stored transposed (`cols x rows` row-major), densely packed.
    pub fn transposed(rows: usize, cols: usize) -> Operand {
        Operand { transposed: true, ld: rows, batch_stride: rows * cols }
    }
}

/// Element-wise function applied last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `x * Phi(x)` (erf form).
    Gelu,
    /// `x * sigmoid(x)`.
    Silu,
}

/// `C = act(alpha * A B + bias)`; bias (length `n`) broadcast over rows.
#[derive(Clone, Copy)]
pub struct Epilogue<'a, T> {
    /// Scale of the product.
    pub alpha: f32,
    /// Per-column bias.
    pub bias: Option<&'a DeviceVec<T>>,
    /// Activation.
    pub act: Activation,
}

impl<T> Default for Epilogue<'_, T> {
    fn default() -> Self {
        Epilogue { alpha: 1.0, bias: None, act: Activation::Identity }
    }
}

/// Which kernel multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Engine {
    /// [`Engine::Wgmma`] where it can run and the product has at least as many of its
    /// 192 x 256 tiles as the GPU has multiprocessors, else [`Engine::Tiled`].
    #[default]
    Auto,
    /// `gemm_tiled` (every device, every shape).
    Tiled,
    /// `gemm_wgmma` (NVIDIA sm_90 with the crate's sm_90a PTX, or the CPU executor's
    /// `mma.sync` mode, which emulates it; N a multiple of 256, K of 64, 16-bit types, A
    /// row-major, 16-byte aligned rows); an error where it cannot take the product.
    Wgmma,
}

/// The matrix-unit lowering kernels use on `dev`.
pub fn lowering_of(dev: &Device) -> Lowering {
    match dev {
        Device::Cpu(e) => match e.executor().matrix_unit() {
            MatrixUnit::Mfma => Lowering::Mfma,
            MatrixUnit::Wmma => Lowering::Wmma,
            MatrixUnit::Wmma12 => Lowering::Wmma12,
            MatrixUnit::MmaSync => Lowering::MmaSync,
            MatrixUnit::Valu => Lowering::Valu,
        },
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Lowering::MmaSync,
        #[cfg(feature = "rocm")]
        Device::Rocm(r) => {
            let arch = r.arch();
            if arch.starts_with("gfx90a") || arch.starts_with("gfx94") || arch.starts_with("gfx95") {
                Lowering::Mfma
            } else if arch.starts_with("gfx11") {
                Lowering::Wmma
            } else if arch.starts_with("gfx12") {
                Lowering::Wmma12
            } else {
                Lowering::Valu
            }
        }
    }
}

fn invalid(reason: String) -> LaunchError {
    LaunchError::InvalidArgument { kernel: "matmul", reason }
}

/// One past the largest element index an operand of `rows x cols` stored as `op` touches
/// over `batch` entries (0 when empty), or an error on overflow.
fn extent(name: &str, op: &Operand, rows: usize, cols: usize, batch: usize) -> Result<usize, LaunchError> {
    let (srows, scols) = if op.transposed { (cols, rows) } else { (rows, cols) };
    if op.ld < scols {
        return Err(invalid(format!("{name}: leading dimension {} is smaller than the {scols} stored columns", op.ld)));
    }
    if batch == 0 || srows == 0 || scols == 0 {
        return Ok(0);
    }
    (batch - 1)
        .checked_mul(op.batch_stride)
        .and_then(|x| x.checked_add((srows - 1).checked_mul(op.ld)?))
        .and_then(|x| x.checked_add(scols))
        .ok_or_else(|| invalid(format!("{name}: index overflow")))
}

fn to_u32(name: &str, v: usize) -> Result<u32, LaunchError> {
    u32::try_from(v).map_err(|_| invalid(format!("{name} = {v} does not fit 32 bits")))
}

/// Element strides of a GEMM operand: element `(z, i, j)` of the batch of matrices is at
/// `z * batch + i * row + j * col`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// Between batch entries.
    pub batch: usize,
    /// Between rows.
    pub row: usize,
    /// Between columns.
    pub col: usize,
}

impl Operand {
    /// This operand's [`Strides`] for a matrix stored as described.
    pub fn strides(&self) -> Strides {
        if self.transposed {
            Strides { batch: self.batch_stride, row: 1, col: self.ld }
        } else {
            Strides { batch: self.batch_stride, row: self.ld, col: 1 }
        }
    }
}

/// One past the largest element index of `batch` matrices `rows x cols` with strides `s`
/// (0 when empty), or an error on overflow.
fn strided_extent(name: &str, s: Strides, rows: usize, cols: usize, batch: usize) -> Result<usize, LaunchError> {
    if batch == 0 || rows == 0 || cols == 0 {
        return Ok(0);
    }
    (batch - 1)
        .checked_mul(s.batch)
        .and_then(|x| x.checked_add((rows - 1).checked_mul(s.row)?))
        .and_then(|x| x.checked_add((cols - 1).checked_mul(s.col)?))
        .and_then(|x| x.checked_add(1))
        .ok_or_else(|| invalid(format!("{name}: index overflow")))
}

/// `C[z] = act(alpha * A[z] B[z] + bias)` for every batch entry `z`, with `C` row-major
/// (leading dimension `ldc`, batch stride `c_batch_stride`), on the matrix units of `dev`.
/// Checks every size first: a bad one is `LaunchError::InvalidArgument` and nothing runs.
/// An empty product (`k = 0`) writes `act(bias)`.
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: GemmElem + ScalarArg>(
    dev: &Device,
    shape: GemmShape,
    a: &DeviceVec<T>,
    a_op: Operand,
    b: &DeviceVec<T>,
    b_op: Operand,
    c: &mut DeviceVec<T>,
    ldc: usize,
    c_batch_stride: usize,
    epilogue: &Epilogue<'_, T>,
) -> Result<(), LaunchError> {
    matmul_with(Engine::Auto, dev, shape, a, a_op, b, b_op, c, ldc, c_batch_stride, epilogue)
}

/// [`matmul`] with operands given by element strides ([`Strides`]: any row and column
/// strides, broadcast batch entries with a batch stride of 0) over any buffer or view
/// the launchers take. Row-contiguous 16-byte aligned operands move through the fast copy
/// path; others element by element. `C` must not overlap itself across batch entries.
#[allow(clippy::too_many_arguments)]
pub fn matmul_strided<T: GemmElem + ScalarArg>(
    dev: &Device,
    shape: GemmShape,
    a: &(impl KernelArgSlice<T> + ?Sized),
    a_s: Strides,
    b: &(impl KernelArgSlice<T> + ?Sized),
    b_s: Strides,
    c: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ldc: usize,
    c_batch_stride: usize,
    epilogue: &Epilogue<'_, T>,
) -> Result<(), LaunchError> {
    matmul_strided_with(Engine::Auto, dev, shape, a, a_s, b, b_s, c, ldc, c_batch_stride, epilogue)
}

/// [`matmul`] on a chosen [`Engine`] (benchmarks and tests compare them).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with<T: GemmElem + ScalarArg>(
    engine: Engine,
    dev: &Device,
    shape: GemmShape,
    a: &DeviceVec<T>,
    a_op: Operand,
    b: &DeviceVec<T>,
    b_op: Operand,
    c: &mut DeviceVec<T>,
    ldc: usize,
    c_batch_stride: usize,
    epilogue: &Epilogue<'_, T>,
) -> Result<(), LaunchError> {
    let GemmShape { m, n, k, .. } = shape;
    extent("A", &a_op, m, k, shape.batch)?;
    extent("B", &b_op, k, n, shape.batch)?;
    matmul_strided_with(engine, dev, shape, a, a_op.strides(), b, b_op.strides(), c, ldc, c_batch_stride, epilogue)
}

/// Whether the wgmma kernel `symbol` runs on `dev`: an NVIDIA device the crate's sm_90a
/// PTX variant (which alone has the instructions) runs on, or the CPU executor in its
/// `mma.sync` mode (which emulates them, `kernel_dsl::mma::wgmma`).
pub fn wgmma_runs(dev: &Device, symbol: &str) -> bool {
    let _ = symbol;
    match dev {
        Device::Cpu(e) => e.executor().matrix_unit() == MatrixUnit::MmaSync,
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => crate::__KERNEL_BINARIES.variant_for(symbol).is_some_and(|v| v.runs_on(d.capability())),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// Why `gemm_wgmma` cannot take this product on `dev`, or `None` when it can.
#[allow(clippy::too_many_arguments)]
fn wgmma_refusal<T: GemmElem>(dev: &Device, shape: GemmShape, a: ArgValue, a_s: Strides, b: ArgValue, b_s: Strides, c: ArgValue, ldc: usize, c_bs: usize) -> Option<String> {
    if !wgmma_runs(dev, "gemm_wgmma_bf16") {
        return Some("wgmma needs an NVIDIA sm_90 device and the sm_90a PTX variant (or the CPU executor's mma.sync mode)".into());
    }
    if T::SPLIT {
        return Some("wgmma takes 16-bit inputs only".into());
    }
    let GemmShape { m, n, k, .. } = shape;
    if n % WG_BN != 0 || k % WG_BK != 0 || k == 0 {
        return Some(format!("wgmma takes N in whole tiles of {WG_BN} and K in steps of {WG_BK} ({m} x {n} x {k})"));
    }
    let addr = |v: ArgValue| match v {
        ArgValue::Slice { addr, .. } => addr,
        _ => 1,
    };
    let b_ld = if b_s.col == 1 { b_s.row } else if b_s.row == 1 { b_s.col } else { 1 };
    if a_s.col != 1 || a_s.row % 8 != 0 || a_s.batch % 8 != 0 || b_ld % 8 != 0 || b_s.batch % 8 != 0 || addr(a) % 16 != 0 || addr(b) % 16 != 0 {
        return Some("wgmma needs A row-major and both operands' rows 16-byte aligned".into());
    }
    if ldc % 2 != 0 || c_bs % 2 != 0 || addr(c) % 4 != 0 {
        return Some("wgmma stores pairs of C elements: C's rows must be 4-byte aligned".into());
    }
    None
}

/// [`matmul_strided`] on a chosen [`Engine`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_strided_with<T: GemmElem + ScalarArg>(
    engine: Engine,
    dev: &Device,
    shape: GemmShape,
    a: &(impl KernelArgSlice<T> + ?Sized),
    a_s: Strides,
    b: &(impl KernelArgSlice<T> + ?Sized),
    b_s: Strides,
    c: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ldc: usize,
    c_batch_stride: usize,
    epilogue: &Epilogue<'_, T>,
) -> Result<(), LaunchError> {
    let GemmShape { batch, m, n, k } = shape;
    if ldc < n {
        return Err(invalid(format!("C: leading dimension {ldc} is smaller than the {n} columns")));
    }
    let need_a = strided_extent("A", a_s, m, k, batch)?;
    let need_b = strided_extent("B", b_s, k, n, batch)?;
    let need_c = strided_extent("C", Strides { batch: c_batch_stride, row: ldc, col: 1 }, m, n, batch)?;
    for (name, need, have) in [("A", need_a, arg_len(a)), ("B", need_b, arg_len(b)), ("C", need_c, arg_len(c))] {
        if have < need {
            return Err(invalid(format!("{name} has {have} elements; the shape needs {need}")));
        }
    }
    if let Some(bias) = epilogue.bias {
        if bias.len() != n {
            return Err(invalid(format!("bias has {} elements; n = {n}", bias.len())));
        }
    }
    if batch > 1 && m * n > 0 && c_batch_stride < m.saturating_sub(1) * ldc + n {
        return Err(invalid(format!("C batch stride {c_batch_stride} makes batch entries overlap")));
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let none: Vec<T> = Vec::new();
    let bias: &dyn kernel_dsl::host::KernelArgSlice<T> = match epilogue.bias {
        Some(b) => b,
        None => &none,
    };
    let act = match epilogue.act {
        Activation::Identity => 0u32,
        Activation::Relu => 1,
        Activation::Gelu => 2,
        Activation::Silu => 3,
    };
    // `Auto` leaves products of fewer tiles than the GPU has multiprocessors to
    // `gemm_tiled`, which splits K for them (decode-sized M against a large weight).
    let wgmma_tiles = batch.saturating_mul(m.div_ceil(WG_BM)).saturating_mul(n.div_ceil(WG_BN));
    let enough = kernel_dsl::host::Executor::compute_units(dev).is_some_and(|sms| wgmma_tiles as u64 >= sms as u64);
    if engine == Engine::Wgmma || (engine == Engine::Auto && enough) {
        match wgmma_refusal::<T>(dev, shape, a.kernel_arg(), a_s, b.kernel_arg(), b_s, c.kernel_arg(), ldc, c_batch_stride) {
            None => {
                let b_mn_major = b_s.col == 1;
                if batch > 65535 || m.div_ceil(WG_BM) > 65535 {
                    return Err(invalid(format!("{m} rows or batch {batch} exceed the 65535 grid limit")));
                }
                let cfg = LaunchConfig::new(Dim3::new((n / WG_BN) as u32, m.div_ceil(WG_BM) as u32, batch as u32), Dim3::x(WG_THREADS as u32))
                    .with_dynamic_shared(wgmma_smem_elems());
                return gemm_wgmma::launch::<T>(
                    dev,
                    cfg,
                    a,
                    b,
                    bias,
                    c,
                    to_u32("m", m)?,
                    to_u32("n", n)?,
                    to_u32("k", k)?,
                    to_u32("A row stride", a_s.row)?,
                    to_u32("B stride", if b_mn_major { b_s.row } else { b_s.col })?,
                    b_mn_major as u32,
                    to_u32("ldc", ldc)?,
                    a_s.batch,
                    b_s.batch,
                    c_batch_stride,
                    epilogue.alpha,
                    act,
                );
            }
            Some(why) if engine == Engine::Wgmma => return Err(invalid(why)),
            Some(_) => {}
        }
    }
    let low = lowering_of(dev);
    let (bm, bn, _) = block_tile::<T>(low);
    let (gx, gy) = (n.div_ceil(bn), m.div_ceil(bm));
    let splits = splits_for::<T>(low, shape);
    if gy > 65535 || batch * splits > 65535 {
        return Err(invalid(format!("{m} rows ({gy} tiles) or batch {batch} exceed the 65535 grid limit")));
    }
    let cfg = LaunchConfig::new(
        Dim3::new(to_u32("n tiles", gx)?, gy as u32, (batch * splits) as u32),
        Dim3::x(work_group_size(low) as u32),
    )
    .with_dynamic_shared(smem_elems::<T>(low));
    // Split-K's partial sums: batch x splits dense m x n f32 blocks (none without it).
    let mut ws = dev.alloc_uninit::<f32>(if splits > 1 { batch * splits * m * n } else { 0 })?;
    gemm_tiled::launch::<T>(
        dev,
        cfg,
        a,
        b,
        bias,
        c,
        &mut ws,
        to_u32("m", m)?,
        to_u32("n", n)?,
        to_u32("k", k)?,
        to_u32("A row stride", a_s.row)?,
        to_u32("A column stride", a_s.col)?,
        to_u32("B row stride", b_s.row)?,
        to_u32("B column stride", b_s.col)?,
        to_u32("ldc", ldc)?,
        a_s.batch,
        b_s.batch,
        c_batch_stride,
        epilogue.alpha,
        act,
        splits as u32,
    )?;
    if splits > 1 {
        let cfg = LaunchConfig::new(Dim3::new(to_u32("C elements", (m * n).div_ceil(256))?, 1, batch as u32), Dim3::x(256));
        gemm_split_sum::launch::<T>(
            dev,
            cfg,
            &ws,
            bias,
            c,
            to_u32("m", m)?,
            to_u32("n", n)?,
            to_u32("ldc", ldc)?,
            c_batch_stride,
            splits as u32,
            epilogue.alpha,
            act,
        )?;
    }
    Ok(())
}

/// How many runs K is split into (split-K) for `shape` on a lowering: products with
/// fewer than 64 output tiles and at least 8 K steps per tile get about 128 work-groups
/// (a wave of them on a GPU of 100-300 compute units), each with at least 4 K steps, at
/// most 16 runs; others 1. Decode-sized products (a few rows against a large weight)
/// would otherwise run one work-group per output tile on a handful of units. Always 1 on
/// the VALU lowering (no matrix unit: the products, not the grid, bound it, and its
/// kernel has no registers to spare).
pub fn splits_for<T: GemmElem>(low: Lowering, shape: GemmShape) -> usize {
    if low == Lowering::Valu {
        return 1;
    }
    let (bm, bn, bk) = block_tile::<T>(low);
    let tiles = shape.batch * shape.m.div_ceil(bm) * shape.n.div_ceil(bn);
    let steps = shape.k.div_ceil(bk);
    if tiles == 0 || tiles >= 64 || steps < 8 {
        return 1;
    }
    128usize.div_ceil(tiles).min(steps / 4).clamp(1, 16)
}
