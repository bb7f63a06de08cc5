//! The checked GEMM launcher: shapes, strides and sizes validated before anything runs.
use super::{block_tile, gemm_tiled, stage_elems, stages, GemmElem, WAVES_M, WAVES_N};
use crate::runtime::{Device, DeviceVec};
use kernel_dsl::host::{LaunchConfig, LaunchError, MatrixUnit, ScalarArg};
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

/// The matrix-unit lowering kernels use on `dev`.
pub fn lowering_of(dev: &Device) -> Lowering {
    match dev {
        Device::Cpu(e) => match e.executor().matrix_unit() {
            MatrixUnit::Mfma => Lowering::Mfma,
            MatrixUnit::Wmma => Lowering::Wmma,
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
    let GemmShape { batch, m, n, k } = shape;
    let need_a = extent("A", &a_op, m, k, batch)?;
    let need_b = extent("B", &b_op, k, n, batch)?;
    let need_c = extent("C", &Operand { transposed: false, ld: ldc, batch_stride: c_batch_stride }, m, n, batch)?;
    for (name, need, have) in [("A", need_a, a.len()), ("B", need_b, b.len()), ("C", need_c, c.len())] {
        if have < need {
            return Err(invalid(format!("{name} has {have} elements; the shape needs {need}")));
        }
    }
    if let Some(bias) = epilogue.bias {
        if bias.len() != n {
            return Err(invalid(format!("bias has {} elements; n = {n}", bias.len())));
        }
    }
    if batch > 1 && c_batch_stride < need_c / batch.max(1) && c_batch_stride < m.saturating_sub(1) * ldc + n {
        return Err(invalid(format!("C batch stride {c_batch_stride} makes batch entries overlap")));
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let low = lowering_of(dev);
    let (bm, bn, _) = block_tile::<T>(low);
    let (gx, gy) = (n.div_ceil(bn), m.div_ceil(bm));
    if gy > 65535 || batch > 65535 {
        return Err(invalid(format!("{m} rows ({gy} tiles) or batch {batch} exceed the 65535 grid limit")));
    }
    let (a_rs, a_cs) = if a_op.transposed { (1, a_op.ld) } else { (a_op.ld, 1) };
    let (b_rs, b_cs) = if b_op.transposed { (1, b_op.ld) } else { (b_op.ld, 1) };
    let lanes = low.wave_lanes();
    let cfg = LaunchConfig::new(
        Dim3::new(to_u32("n tiles", gx)?, gy as u32, batch as u32),
        Dim3::x(lanes * (WAVES_M * WAVES_N) as u32),
    )
    .with_dynamic_shared(stages(low) * stage_elems::<T>(low));
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
    gemm_tiled::launch::<T>(
        dev,
        cfg,
        a,
        b,
        bias,
        c,
        to_u32("m", m)?,
        to_u32("n", n)?,
        to_u32("k", k)?,
        to_u32("A row stride", a_rs)?,
        to_u32("A column stride", a_cs)?,
        to_u32("B row stride", b_rs)?,
        to_u32("B column stride", b_cs)?,
        to_u32("ldc", ldc)?,
        a_op.batch_stride,
        b_op.batch_stride,
        c_batch_stride,
        epilogue.alpha,
        act,
    )
}
