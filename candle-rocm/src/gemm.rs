//! The operands and shape of one (batched) GEMM, shared by the matmul op
//! ([`crate::ops::matmul`]), the vendor BLAS ([`crate::blas`]) and the matvec path
//! ([`matvec_plan`]): they point down to this module, not at each other.
use crate::buffer::Region;
use crate::error::invalid;
use candle_core::Result;

/// One GEMM operand: element `(bi, i, j)` is `data[bi * batch + i * row + j * col]`.
#[derive(Clone, Copy)]
pub struct GemmOperand {
    pub data: Region,
    pub batch: usize,
    pub row: usize,
    pub col: usize,
}

/// Sizes of `batch` products `(m x k) * (k x n)`.
#[derive(Clone, Copy, Debug)]
pub struct GemmShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Checks that `c` holds `batch x m x n` elements and that every element the operands
/// address lies inside their regions.
pub fn check_operands(a: &GemmOperand, b: &GemmOperand, c_len: usize, s: GemmShape) -> Result<()> {
    const OP: &str = "matmul";
    let GemmShape { batch, m, n, k } = s;
    if Some(c_len) != batch.checked_mul(m).and_then(|v| v.checked_mul(n)) {
        return Err(invalid(
            OP,
            format!("output has {c_len} elements, {batch}x{m}x{n} expected"),
        ));
    }
    if c_len == 0 {
        return Ok(());
    }
    for (name, o, rows, cols) in [("lhs", a, m, k), ("rhs", b, k, n)] {
        if rows * cols == 0 {
            continue;
        }
        let last = [(batch - 1, o.batch), (rows - 1, o.row), (cols - 1, o.col)]
            .iter()
            .try_fold(0usize, |acc, &(i, st)| {
                i.checked_mul(st).and_then(|v| acc.checked_add(v))
            });
        match last {
            Some(last) if last < o.data.len() => {}
            _ => {
                return Err(invalid(
                    OP,
                    format!("{name} reaches past element {} of its buffer", o.data.len()),
                ))
            }
        }
    }
    Ok(())
}


/// Most rows (`batch * m`) of a product that [`matvec_plan`] sends to the dense matvec
/// (`kernels::llm::dense_matvec`): decode's products, where the weight is read once per
/// step and a GEMM (vendor or ours) reaches a fraction of the memory's rate.
pub const MATVEC_MAX_ROWS: usize = kernels::llm::ops::MAX_ROWS;

/// A product that is a dense matvec: `rows` contiguous activation rows of `k` elements
/// (`x`) times a weight stored `[n, k]` row-major (`w`; the transposed right operand that
/// Candle's `Linear` passes), into a contiguous `[rows, n]` output.
#[derive(Clone, Copy)]
pub struct MatvecPlan {
    pub x: Region,
    pub w: Region,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
}

/// The [`MatvecPlan`] of `a * b` (operands already checked by [`check_operands`]), or
/// `None` when the product is not matvec-shaped: at most [`MATVEC_MAX_ROWS`] rows in all
/// (`batch * m`), `a` row-major with contiguous rows and batch entries, `b` with row
/// stride 1 and column stride `k` (a row-major `[n, k]` weight read transposed) and the
/// same for every batch entry. Strides of dimensions of size 1 do not matter.
pub fn matvec_plan(a: &GemmOperand, b: &GemmOperand, s: GemmShape) -> Option<MatvecPlan> {
    let GemmShape { batch, m, n, k } = s;
    let rows = batch.checked_mul(m)?;
    if !(1..=MATVEC_MAX_ROWS).contains(&rows) || n == 0 || k == 0 {
        return None;
    }
    let x_ok = (k == 1 || a.col == 1) && (m == 1 || a.row == k) && (batch == 1 || a.batch == m * k);
    let w_ok = (k == 1 || b.row == 1) && (n == 1 || b.col == k) && (batch == 1 || b.batch == 0);
    if !(x_ok && w_ok) {
        return None;
    }
    Some(MatvecPlan { x: a.data.sub(0, rows * k).ok()?, w: b.data.sub(0, n * k).ok()?, rows, n, k })
}
