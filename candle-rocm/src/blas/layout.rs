//! Row-major GEMM operands as arguments of a column-major BLAS (cuBLAS, rocBLAS).
//!
//! The backend's GEMM is `C = A * B` with `C` contiguous row-major `(m x n)`. Read as
//! column-major, that memory is `C^T (n x m)` with leading dimension `n`, and
//! `C^T = B^T * A^T`: the BLAS call multiplies the right operand's data by the left one's,
//! with `m` and `n` swapped. An operand whose column stride is 1 is row-major (its memory
//! is its transpose in column-major, no transpose flag); one whose row stride is 1 is
//! column-major (transpose flag set). Anything else (both strides above 1, overlapping
//! rows, sizes beyond `i32`) has no BLAS form and stays with the backend's kernel.
use crate::gemm::{GemmOperand, GemmShape};

/// How one operand `X (rows x cols)` lies in memory, seen by a column-major BLAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Row-major with this leading dimension: the memory is `X^T` column-major.
    RowMajor(usize),
    /// Column-major with this leading dimension: the memory is `X` column-major.
    ColMajor(usize),
}

/// The storage of `X (rows x cols)` whose element `(i, j)` is at `i * row + j * col`, or
/// `None` when no leading dimension describes it. Strides of size-1 dimensions never
/// address anything and are ignored.
pub fn storage(rows: usize, cols: usize, row: usize, col: usize) -> Option<Storage> {
    if cols == 1 || col == 1 {
        let ld = if rows == 1 { cols } else { row };
        if ld >= cols.max(1) {
            return Some(Storage::RowMajor(ld));
        }
    }
    if rows == 1 || row == 1 {
        let ld = if cols == 1 { rows } else { col };
        if ld >= rows.max(1) {
            return Some(Storage::ColMajor(ld));
        }
    }
    None
}

/// One strided-batched column-major call `C' = op(A') * op(B')` computing the row-major
/// product: `A'` is the right operand's data, `B'` the left one's (all in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColMajorGemm {
    /// Rows of `C'` (the product's `n`).
    pub m: i32,
    /// Columns of `C'` (the product's `m`).
    pub n: i32,
    pub k: i32,
    /// `op(A') = A'^T` (the right operand is column-major).
    pub trans_a: bool,
    pub lda: i32,
    pub stride_a: i64,
    /// `op(B') = B'^T` (the left operand is column-major).
    pub trans_b: bool,
    pub ldb: i32,
    pub stride_b: i64,
    pub ldc: i32,
    pub stride_c: i64,
}

/// The BLAS form of `c = a * b` for shape `s`, or `None` when the layouts or sizes have
/// none (or `k = 0`, left to the kernel, which writes the zeros itself).
pub fn plan(a: &GemmOperand, b: &GemmOperand, s: GemmShape) -> Option<ColMajorGemm> {
    let GemmShape { m, n, k, .. } = s;
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    let i32_of = |v: usize| i32::try_from(v).ok();
    let i64_of = |v: usize| i64::try_from(v).ok();
    let (trans_a, lda) = match storage(k, n, b.row, b.col)? {
        Storage::RowMajor(ld) => (false, ld),
        Storage::ColMajor(ld) => (true, ld),
    };
    let (trans_b, ldb) = match storage(m, k, a.row, a.col)? {
        Storage::RowMajor(ld) => (false, ld),
        Storage::ColMajor(ld) => (true, ld),
    };
    Some(ColMajorGemm {
        m: i32_of(n)?,
        n: i32_of(m)?,
        k: i32_of(k)?,
        trans_a,
        lda: i32_of(lda)?,
        stride_a: i64_of(b.batch)?,
        trans_b,
        ldb: i32_of(ldb)?,
        stride_b: i64_of(a.batch)?,
        ldc: i32_of(n)?,
        stride_c: i64_of(m.checked_mul(n)?)?,
    })
}

/// Largest batch count per call: the grid limit some BLAS kernels put on the batch (their
/// grid's z or y), so larger batches are split into calls of at most this many.
pub const MAX_BATCH: usize = 65535;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Region;

    /// Reference column-major strided-batched GEMM on host data, as the BLAS defines it.
    fn colmajor(p: &ColMajorGemm, batch: usize, a: &[f64], b: &[f64], c: &mut [f64]) {
        let at = |bi: usize, i: usize, l: usize| {
            let base = bi as i64 * p.stride_a;
            let idx = if p.trans_a {
                l + i * p.lda as usize
            } else {
                i + l * p.lda as usize
            };
            a[(base + idx as i64) as usize]
        };
        let bt = |bi: usize, l: usize, j: usize| {
            let base = bi as i64 * p.stride_b;
            let idx = if p.trans_b {
                j + l * p.ldb as usize
            } else {
                l + j * p.ldb as usize
            };
            b[(base + idx as i64) as usize]
        };
        for bi in 0..batch {
            for j in 0..p.n as usize {
                for i in 0..p.m as usize {
                    let s: f64 = (0..p.k as usize).map(|l| at(bi, i, l) * bt(bi, l, j)).sum();
                    c[bi * p.stride_c as usize + i + j * p.ldc as usize] = s;
                }
            }
        }
    }

    fn op(batch: usize, row: usize, col: usize) -> GemmOperand {
        GemmOperand {
            data: Region::empty(),
            batch,
            row,
            col,
        }
    }

    /// Every layout the mapping accepts gives the row-major product through the
    /// column-major definition (exact: small integers in f64).
    #[test]
    fn accepted_layouts_compute_the_row_major_product() {
        let (batch, m, n, k) = (3, 5, 4, 6);
        let data: Vec<f64> = (0..4096).map(|i| ((i * 7919) % 23) as f64 - 11.0).collect();
        // (batch, row, col) strides of A (m x k) and B (k x n): row-major, transposed,
        // padded rows, broadcast batch, offset-free.
        let a_layouts = [
            (m * k, k, 1),
            (m * k, 1, m),
            (m * (k + 3), k + 3, 1),
            (0, k, 1),
            (2 * m * k, 1, m + 2),
        ];
        let b_layouts = [
            (k * n, n, 1),
            (k * n, 1, k),
            (0, n, 1),
            (k * (n + 1), 1, k + 1),
        ];
        let mut accepted = 0;
        for &(ab, ar, ac) in &a_layouts {
            for &(bb, br, bc) in &b_layouts {
                let (a, b) = (op(ab, ar, ac), op(bb, br, bc));
                let p = plan(&a, &b, GemmShape { batch, m, n, k }).expect("layout has a BLAS form");
                accepted += 1;
                let mut c = vec![f64::NAN; batch * m * n];
                colmajor(&p, batch, &data, &data, &mut c);
                for bi in 0..batch {
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|l| {
                                    data[bi * ab + i * ar + l * ac]
                                        * data[bi * bb + l * br + j * bc]
                                })
                                .sum();
                            assert_eq!(
                                c[bi * m * n + i * n + j],
                                want,
                                "a {:?} b {:?} at ({bi},{i},{j})",
                                (ab, ar, ac),
                                (bb, br, bc)
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(accepted, a_layouts.len() * b_layouts.len());
    }

    #[test]
    fn layouts_without_a_blas_form_are_refused() {
        let s = GemmShape {
            batch: 2,
            m: 5,
            n: 4,
            k: 6,
        };
        let b = op(24, 4, 1);
        // Both strides above 1 (a strided view of every other column).
        assert_eq!(plan(&op(60, 12, 2), &b, s), None);
        // Overlapping rows (row stride 0 broadcasts one row) or too short a row stride.
        assert_eq!(plan(&op(30, 0, 1), &b, s), None);
        assert_eq!(plan(&op(30, 3, 1), &b, s), None);
        // k = 0 and sizes beyond i32 are left to the kernel.
        assert_eq!(
            plan(&op(0, 0, 1), &op(0, 4, 1), GemmShape { k: 0, ..s }),
            None
        );
        let big = 1usize << 31;
        assert_eq!(
            plan(
                &op(0, big, 1),
                &op(0, 4, 1),
                GemmShape {
                    batch: 1,
                    m: 2,
                    n: 4,
                    k: big
                }
            ),
            None
        );
    }

    #[test]
    fn size_one_dimensions_ignore_their_strides() {
        // A single row (m = 1) with a garbage row stride, a single column of B (n = 1).
        assert_eq!(storage(1, 6, 999, 1), Some(Storage::RowMajor(6)));
        assert_eq!(storage(6, 1, 1, 999), Some(Storage::RowMajor(1)));
        assert_eq!(storage(6, 1, 5, 0), Some(Storage::RowMajor(5)));
        assert_eq!(storage(1, 1, 0, 0), Some(Storage::RowMajor(1)));
        assert_eq!(storage(4, 6, 1, 4), Some(Storage::ColMajor(4)));
        assert_eq!(storage(4, 6, 1, 3), None);
    }
}
