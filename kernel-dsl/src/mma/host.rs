//! CPU-executor emulation of [`mma`](super::mma) in the layout of the executor's matrix
//! unit: the wave's fragments are gathered, checked, multiplied, and each lane takes its
//! own accumulator items back.
use super::layout::{a_coord, ab_len, b_coord, c_coord, c_len};
use super::{FragA, FragB, FragC, InputKind, Lowering, MmaInput, K, M, N};
use cpu_executor::{item, MatrixUnit};
use std::cell::Cell;

/// The executor's matrix unit as a lowering.
pub(super) fn lowering() -> Lowering {
    match item::matrix_unit() {
        MatrixUnit::Mfma => Lowering::Mfma,
        MatrixUnit::Wmma => Lowering::Wmma,
        MatrixUnit::Wmma12 => Lowering::Wmma12,
        MatrixUnit::MmaSync => Lowering::MmaSync,
        MatrixUnit::Valu => Lowering::Valu,
    }
}

/// One lane's operands, read by the wave's first lane to run after the exchange, which
/// computes every lane's result (the lanes of a work-group run on one OS thread, one at a
/// time, so the cells are never touched concurrently).
struct Operands<T: MmaInput> {
    a: FragA<T>,
    b: FragB<T>,
    c: FragC<T::Acc>,
    out: Cell<Option<FragC<T::Acc>>>,
}

/// Places `value` at `(r, k)` of `tile`, panicking when a lane already put a different
/// value there (WMMA's repeated lanes must agree, as the hardware reads only one copy).
fn place<T: MmaInput>(tile: &mut [[Option<T>; 16]; 16], r: usize, k: usize, value: T, what: &str, low: Lowering) {
    match tile[r][k] {
        Some(old) if old.bits() != value.bits() => panic!(
            "kernel_dsl::mma ({low:?}): the lanes holding {what}[{r}][{k}] disagree; fragments must be built with from_fn in the {low:?} layout"
        ),
        _ => tile[r][k] = Some(value),
    }
}

pub(super) fn mma<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    let low = lowering();
    let lanes = item::wave_size() as usize;
    if low.wave_lanes() as usize != lanes {
        panic!(
            "kernel_dsl::mma: the {low:?} lowering needs waves of {} lanes; this launch has {lanes}",
            low.wave_lanes()
        );
    }
    let mine = Operands::<T> { a: *a, b: *b, c, out: Cell::new(None) };
    let all = item::wave_exchange(&mine as *const Operands<T> as u64);
    let full = if lanes == 64 { u64::MAX } else { (1u64 << lanes) - 1 };
    if all.active != full {
        panic!("kernel_dsl::mma needs every lane of the wave (active lanes {:#x})", all.active);
    }
    // SAFETY: every lane of the wave is suspended inside this function, at the exchange
    // above or the one below, so its `Operands` are alive; only `out` is written, through
    // a Cell, by the one lane running at a time.
    let lane_ops = |l: usize| unsafe { &*(all.values[l] as *const Operands<T>) };
    if mine.out.get().is_none() {
        let i8 = T::KIND == InputKind::I8;
        let mut at = [[None; K]; M];
        let mut bt = [[None; N]; K];
        for l in 0..lanes {
            let ops = lane_ops(l);
            for j in 0..ab_len(low) {
                let (r, k) = a_coord(low, i8, l, j);
                place(&mut at, r, k, ops.a.v[j], "A", low);
                let (k, n) = b_coord(low, i8, l, j);
                place(&mut bt, k, n, ops.b.v[j], "B", low);
            }
        }
        let at = at.map(|row| row.map(|x| x.expect("the layout covers A")));
        let bt = bt.map(|row| row.map(|x| x.expect("the layout covers B")));
        for l in 0..lanes {
            let ops = lane_ops(l);
            let mut out = ops.c;
            for j in 0..c_len(low) {
                let (r, n) = c_coord(low, l, j);
                let mut acc = ops.c.v[j];
                for k in 0..K {
                    acc = T::mac(acc, at[r][k], bt[k][n]);
                }
                out.v[j] = acc;
            }
            ops.out.set(Some(out));
        }
    }
    let out = mine.out.get().expect("computed by the first lane");
    // Every lane has taken its result once all reach this point.
    item::wave_exchange(0);
    out
}

#[cfg(test)]
mod tests {
    use super::super::layout::*;
    use super::super::Lowering;
    const ALL: [Lowering; 5] = [Lowering::Mfma, Lowering::Wmma, Lowering::Wmma12, Lowering::MmaSync, Lowering::Valu];

    /// Every element of each tile is held by some lane; the accumulator exactly once, A and
    /// B exactly once except WMMA's documented duplication of lanes 0-15 in 16-31.
    #[test]
    fn layouts_cover_every_element() {
        for low in ALL {
            for i8 in [false, true] {
                let lanes = low.wave_lanes() as usize;
                let mut a = [[0; 16]; 16];
                let mut b = [[0; 16]; 16];
                let mut c = [[0; 16]; 16];
                for l in 0..lanes {
                    for j in 0..ab_len(low) {
                        let (r, k) = a_coord(low, i8, l, j);
                        a[r][k] += 1;
                        let (k, n) = b_coord(low, i8, l, j);
                        b[k][n] += 1;
                    }
                    for j in 0..c_len(low) {
                        let (r, n) = c_coord(low, l, j);
                        c[r][n] += 1;
                        let (ll, jj) = c_locate(low, r, n);
                        assert_eq!((ll, jj), (l, j), "{low:?} c_locate({r},{n})");
                    }
                }
                let dup = if low == Lowering::Wmma { 2 } else { 1 };
                assert!(a.iter().flatten().all(|&n| n == dup), "{low:?} i8={i8} A: {a:?}");
                assert!(b.iter().flatten().all(|&n| n == dup), "{low:?} i8={i8} B: {b:?}");
                assert!(c.iter().flatten().all(|&n| n == 1), "{low:?} C: {c:?}");
            }
        }
    }
}
