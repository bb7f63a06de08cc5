//! Batched matmul: Candle layouts become strided GEMM operands (row/column strides carry the
//! transposes, so no copy is made unless the batch dimensions cannot be folded into one
//! stride), and every product goes through [`gemm`], the backend's one GEMM entry point.
use super::{alloc, float_dispatch};
use crate::buffer::{Buf, BufElem, Region};
use crate::error::{at, invalid};
use candle_core::{Layout, Result};
use kernels::runtime::{Device, DeviceVec};

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

/// The GEMM contract: `c[bi] = a[bi] * b[bi]` with `c` contiguous `(batch, m, n)`, `f32`
/// accumulation. Operands are checked to stay inside their regions. Today: the
/// `kernels::matmul_simple` tiled kernel on every device (a BLAS or the project's MMA GEMM
/// can take its place here without touching the layout mapping).
pub fn gemm<T: kernel_dsl::Float + kernel_dsl::host::ScalarArg + 'static>(
    dev: &Device,
    a: &GemmOperand,
    b: &GemmOperand,
    c: &mut DeviceVec<T>,
    s: GemmShape,
) -> Result<()> {
    const OP: &str = "matmul";
    let GemmShape { batch, m, n, k } = s;
    if c.len() != batch * m * n {
        return Err(invalid(OP, format!("output has {} elements, {batch}x{m}x{n} expected", c.len())));
    }
    if batch * m * n == 0 {
        return Ok(());
    }
    for (name, o, rows, cols) in [("lhs", a, m, k), ("rhs", b, k, n)] {
        if rows * cols == 0 {
            continue;
        }
        let last = (batch - 1) * o.batch + (rows - 1) * o.row + (cols - 1) * o.col;
        if last >= o.data.len() {
            return Err(invalid(OP, format!("{name} reaches element {last} of {}", o.data.len())));
        }
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
        let cfg = kernels::matmul_simple::launch_config(nb, m, n);
        kernels::matmul_simple::matmul_simple::launch::<T>(
            dev, cfg, &ra, &rb, &mut rc, m, n, k, a.batch, a.row, a.col, b.batch, b.row, b.col,
        )
        .map_err(at(OP))?;
        start += nb;
    }
    Ok(())
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
        let mut copy = Buf::zeros(dev, buf.dtype(), l.shape().elem_count())?;
        super::elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
        let o = operand(&copy, &Layout::contiguous(l.shape()), batch, rows, cols)?
            .ok_or_else(|| invalid(OP, "contiguous operand did not fold"))?;
        keep.push(copy);
        Ok(o)
    };
    let a = get(lhs, ll, m, k)?;
    let b = get(rhs, rl, k, n)?;
    float_dispatch!(lhs.dtype(), OP, T => {
        let mut c = alloc::<T>(dev, batch * m * n, OP)?;
        gemm::<T>(dev, &a, &b, &mut c, GemmShape { batch, m, n, k })?;
        Ok(T::wrap(c))
    })
}
