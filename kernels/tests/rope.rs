//! Rotary position embeddings (interleaved `rope_i`, half-split `rope`, `(b, t, h, d)`
//! `rope_thd`) against an independent f64 reference, for f32/f16/bf16, shared and per-batch
//! tables, on the CPU executor with waves of 32 and 64 lanes and on any GPU this build can
//! open.
//!
//! Tolerance: the reference takes the same (already rounded) inputs and tables in f64 and is
//! rounded once to the output type. The kernel computes each output in f32 as one product
//! plus a fused multiply-add, so before its output rounding it is within
//! 2^-24 (|x1 s| + |result|) <= 2^-23 (|x0| + |x1|) <= 2^-23 * 8 < 1e-6 of the exact value
//! for inputs in [-4, 4] and |c|, |s| <= 1: that is the extra absolute tolerance. On top of
//! it, one output rounding of the dtype (`TestFloat::REL`/`ABS`): f32 2e-6 relative + 2e-6
//! absolute, f16 2^-10 relative + 2^-14 absolute, bf16 2^-7 relative + 2^-14 absolute.
use half::{bf16, f16};
use kernel_dsl::host::{Executor, LaunchError};
use kernels::rope::{self, apply_rope, apply_rope_i, apply_rope_thd, RopeShape};
use kernels::runtime::{Device, DeviceVec};

mod common;
use common::*;

/// Extra absolute tolerance for the f32 evaluation (see the file comment).
const F32_EVAL: f64 = 1e-6;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `(b, h, t, d)`, pairs `(2i, 2i + 1)`.
    Interleaved,
    /// `(b, h, t, d)`, pairs `(i, i + d/2)`.
    HalfSplit,
    /// `(b, t, h, d)`, pairs `(i, i + d/2)`.
    Thd,
}
use Layout::*;

/// `(b, h, t, d)`: tiny, odd counts, head sizes that take the vector path for one dtype and
/// not the other (d/2 = 12: f32 blocks of 4 pairs, half blocks of 8), LLM-like shapes.
const SHAPES: [(usize, usize, usize, usize); 9] = [
    (1, 1, 1, 2),
    (1, 1, 7, 2),
    (2, 3, 7, 6),
    (1, 2, 3, 16),
    (2, 1, 3, 24),
    (3, 2, 7, 10),
    (1, 32, 5, 128),
    (2, 4, 33, 64),
    (2, 2, 9, 80),
];

/// The plain f64 definition, one pair at a time with explicit index arithmetic.
fn reference(layout: Layout, x: &[f64], cos: &[f64], sin: &[f64], s: &RopeShape) -> Vec<f64> {
    let (b, h, t, d) = (s.b, s.h, s.t, s.d);
    let d2 = d / 2;
    let mut out = vec![f64::NAN; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let row = match layout {
                    Interleaved | HalfSplit => ((bi * h + hi) * t + ti) * d,
                    Thd => ((bi * t + ti) * h + hi) * d,
                };
                for i in 0..d2 {
                    let tab = bi * s.table_batch_stride + ti * d2 + i;
                    let (c, sn) = (cos[tab], sin[tab]);
                    let (j0, j1) = match layout {
                        Interleaved => (row + 2 * i, row + 2 * i + 1),
                        HalfSplit | Thd => (row + i, row + i + d2),
                    };
                    let (x0, x1) = (x[j0], x[j1]);
                    out[j0] = x0 * c - x1 * sn;
                    out[j1] = x0 * sn + x1 * c;
                }
            }
        }
    }
    out
}

/// Real RoPE tables: angle `(p + offset) * 10000^(-2i/d)` for position `p` of each of
/// `tables` tables of `rows` positions, `stride` elements apart (0: one table).
fn tables<T: TestFloat>(tables: usize, stride: usize, rows: usize, d: usize) -> (Vec<T>, Vec<T>) {
    let d2 = d / 2;
    let len = if tables == 0 { 0 } else { (tables - 1) * stride + rows * d2 };
    let (mut c, mut s) = (vec![T::from_f64(0.0); len], vec![T::from_f64(0.0); len]);
    for k in 0..tables {
        for p in 0..rows {
            for i in 0..d2 {
                let theta = (p + 5 * k) as f64 * 10000f64.powf(-2.0 * i as f64 / d as f64);
                c[k * stride + p * d2 + i] = T::from_f64(theta.cos());
                s[k * stride + p * d2 + i] = T::from_f64(theta.sin());
            }
        }
    }
    (c, s)
}

fn f64s<T: TestFloat>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn apply<T: TestFloat>(
    layout: Layout,
    exec: &Device,
    x: &DeviceVec<T>,
    c: &DeviceVec<T>,
    s: &DeviceVec<T>,
    out: &mut DeviceVec<T>,
    shape: &RopeShape,
) -> Result<(), LaunchError> {
    match layout {
        Interleaved => apply_rope_i(exec, x, c, s, out, shape),
        HalfSplit => apply_rope(exec, x, c, s, out, shape),
        Thd => apply_rope_thd(exec, x, c, s, out, shape),
    }
}

/// Runs `layout` on `exec` and returns the output.
fn run<T: TestFloat>(layout: Layout, exec: &Device, x: &[T], c: &[T], s: &[T], shape: &RopeShape) -> Vec<T> {
    let (dx, dc, ds) = (exec.upload(x).unwrap(), exec.upload(c).unwrap(), exec.upload(s).unwrap());
    let mut dy = exec.alloc::<T>(x.len()).unwrap();
    apply(layout, exec, &dx, &dc, &ds, &mut dy, shape)
        .unwrap_or_else(|e| panic!("{layout:?}<{}> {shape:?} on {}: {e}", T::NAME, exec.name()));
    exec.download(&dy).unwrap()
}

/// The table set-ups each shape runs with: a shared table longer than `t` (rows past `t`
/// unread), contiguous per-batch tables, and per-batch tables with padding between them.
fn table_cases(b: usize, h: usize, t: usize, d: usize) -> [(RopeShape, usize, usize); 3] {
    let s = RopeShape::new(b, h, t, d);
    let one = t * (d / 2);
    [(s, 1, t + 3), (s.per_batch_tables(), b, t), (s.with_table_batch_stride(one + 8), b, t)]
}

fn check_layout<T: TestFloat>(layout: Layout, specials: bool) {
    for exec in executors() {
        for (k, &(b, h, t, d)) in SHAPES.iter().enumerate() {
            for (shape, n_tables, rows) in table_cases(b, h, t, d) {
                let n = b * h * t * d;
                let x: Vec<T> = inputs(n, -4.0, 4.0, 11 + k as u64, specials).into_iter().map(T::from_f64).collect();
                let (mut c, mut s) = tables::<T>(n_tables, shape.table_batch_stride, rows, d);
                if specials && c.len() > 2 {
                    // A NaN and an infinity in the tables reach their pairs only.
                    c[1] = T::from_f64(f64::NAN);
                    s[c.len() - 1] = T::from_f64(f64::INFINITY);
                }
                let y = run(layout, &exec, &x, &c, &s, &shape);
                let want = reference(layout, &f64s(&x), &f64s(&c), &f64s(&s), &shape);
                let what = format!("{layout:?}<{}> {shape:?} specials={specials} on {}", T::NAME, exec.name());
                assert_close_with(&y, &want, 0.0, F32_EVAL, &what);
            }
        }
    }
}

fn check_all_dtypes(layout: Layout, specials: bool) {
    check_layout::<f32>(layout, specials);
    check_layout::<f16>(layout, specials);
    check_layout::<bf16>(layout, specials);
}

#[test]
fn rope_i_matches_reference() {
    check_all_dtypes(Interleaved, false);
}

#[test]
fn rope_matches_reference() {
    check_all_dtypes(HalfSplit, false);
}

#[test]
fn rope_thd_matches_reference() {
    check_all_dtypes(Thd, false);
}

#[test]
fn nan_and_inf_propagate_like_the_reference() {
    for layout in [Interleaved, HalfSplit, Thd] {
        check_all_dtypes(layout, true);
    }
}

/// Permutes a `(b, x, y, d)` tensor to `(b, y, x, d)`.
fn swap_middle<T: Copy>(v: &[T], b: usize, m1: usize, m2: usize, d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for bi in 0..b {
        for j in 0..m2 {
            for i in 0..m1 {
                let at = ((bi * m1 + i) * m2 + j) * d;
                out.extend_from_slice(&v[at..at + d]);
            }
        }
    }
    out
}

fn check_thd_is_transposed_rope<T: TestFloat>() {
    for exec in executors() {
        for &(b, h, t, d) in &SHAPES {
            for (shape, n_tables, rows) in table_cases(b, h, t, d) {
                // x is (b, t, h, d).
                let x: Vec<T> = inputs(b * t * h * d, -4.0, 4.0, 3 + d as u64, true).into_iter().map(T::from_f64).collect();
                let (c, s) = tables::<T>(n_tables, shape.table_batch_stride, rows, d);
                let thd = run(Thd, &exec, &x, &c, &s, &shape);
                let bhtd = swap_middle(&x, b, t, h, d);
                let via_rope = swap_middle(&run(HalfSplit, &exec, &bhtd, &c, &s, &shape), b, h, t, d);
                let bits = |v: &[T]| f64s(v).iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&thd), bits(&via_rope), "rope_thd<{}> {shape:?} vs transposed rope on {}", T::NAME, exec.name());
            }
        }
    }
}

#[test]
fn rope_thd_equals_rope_of_the_transposed_tensor() {
    check_thd_is_transposed_rope::<f32>();
    check_thd_is_transposed_rope::<f16>();
    check_thd_is_transposed_rope::<bf16>();
}

/// De-interleaves each row: `(x0, x1, x2, x3, ...)` -> `(x0, x2, ..., x1, x3, ...)`.
fn deinterleave<T: Copy>(v: &[T], d: usize) -> Vec<T> {
    v.chunks(d).flat_map(|r| r.iter().step_by(2).chain(r.iter().skip(1).step_by(2)).copied().collect::<Vec<_>>()).collect()
}

fn check_interleaved_is_permuted_rope<T: TestFloat>() {
    for exec in executors() {
        for &(b, h, t, d) in &SHAPES {
            let shape = RopeShape::new(b, h, t, d);
            let x: Vec<T> = inputs(b * h * t * d, -4.0, 4.0, 9, true).into_iter().map(T::from_f64).collect();
            let (c, s) = tables::<T>(1, 0, t, d);
            let y = deinterleave(&run(Interleaved, &exec, &x, &c, &s, &shape), d);
            let via_rope = run(HalfSplit, &exec, &deinterleave(&x, d), &c, &s, &shape);
            let bits = |v: &[T]| f64s(v).iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&via_rope), "rope_i<{}> {shape:?} vs de-interleaved rope on {}", T::NAME, exec.name());
        }
    }
}

#[test]
fn rope_i_equals_rope_of_deinterleaved_rows() {
    check_interleaved_is_permuted_rope::<f32>();
    check_interleaved_is_permuted_rope::<f16>();
    check_interleaved_is_permuted_rope::<bf16>();
}

/// Buffers that do not start on 16 bytes take the pair-by-pair path; it must give the same
/// bits as the 16-byte block path (host slices, so CPU executors only).
fn check_unaligned_path<T: TestFloat>() {
    for exec in executors().into_iter().filter(|e| !e.is_gpu()) {
        for layout in [Interleaved, HalfSplit, Thd] {
            let (b, h, t, d) = (2, 4, 9, 64);
            let shape = RopeShape::new(b, h, t, d).per_batch_tables();
            let n = b * h * t * d;
            let x: Vec<T> = inputs(n, -4.0, 4.0, 21, true).into_iter().map(T::from_f64).collect();
            let (c, s) = tables::<T>(b, shape.table_batch_stride, t, d);
            let aligned = run(layout, &exec, &x, &c, &s, &shape);
            // One element in front of each buffer: at most one of a Vec's start and start + 1
            // element is 16-byte aligned, so try both offsets and require one unaligned run.
            let mut unaligned_runs = 0;
            for off in [1usize, 2] {
                let pad = |v: &[T]| {
                    let mut p = vec![T::from_f64(0.0); off];
                    p.extend_from_slice(v);
                    p
                };
                let (xp, cp, sp) = (pad(&x), pad(&c), pad(&s));
                let mut yp = vec![T::from_f64(0.0); n + off];
                if !(xp[off..].as_ptr() as usize).is_multiple_of(16) {
                    unaligned_runs += 1;
                }
                match layout {
                    Interleaved => apply_rope_i(&exec, &xp[off..], &cp[off..], &sp[off..], &mut yp[off..], &shape),
                    HalfSplit => apply_rope(&exec, &xp[off..], &cp[off..], &sp[off..], &mut yp[off..], &shape),
                    Thd => apply_rope_thd(&exec, &xp[off..], &cp[off..], &sp[off..], &mut yp[off..], &shape),
                }
                .unwrap();
                let bits = |v: &[T]| f64s(v).iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&yp[off..]), bits(&aligned), "{layout:?}<{}> offset {off} on {}", T::NAME, exec.name());
            }
            assert!(unaligned_runs > 0);
        }
    }
}

#[test]
fn unaligned_buffers_give_the_same_bits() {
    check_unaligned_path::<f32>();
    check_unaligned_path::<f16>();
    check_unaligned_path::<bf16>();
}

#[test]
fn empty_tensors_are_noops() {
    for exec in executors() {
        for (b, h, t, d) in [(1, 32, 0, 128), (0, 32, 7, 128), (2, 0, 3, 8), (2, 3, 4, 0)] {
            for layout in [Interleaved, HalfSplit, Thd] {
                for shape in [RopeShape::new(b, h, t, d), RopeShape::new(b, h, t, d).per_batch_tables()] {
                    let x = exec.alloc::<f32>(0).unwrap();
                    let mut y = exec.alloc::<f32>(0).unwrap();
                    // Tables may be empty too: nothing is read.
                    let c = exec.alloc::<f32>(0).unwrap();
                    apply(layout, &exec, &x, &c, &c, &mut y, &shape).unwrap();
                    let cfg = rope::launch_config::<f32>(&shape).unwrap();
                    assert_eq!(cfg.grid.volume(), 0, "{shape:?}");
                }
            }
        }
    }
}

#[test]
fn bad_input_is_rejected_and_leaves_out_unchanged() {
    // (what, shape, x len, table len, out len)
    let s = RopeShape::new(2, 3, 5, 8);
    let n = 2 * 3 * 5 * 8;
    let one = 5 * 4;
    let cases: Vec<(&str, RopeShape, usize, usize, usize)> = vec![
        ("odd d", RopeShape::new(2, 3, 5, 7), 2 * 3 * 5 * 7, 5 * 3, 2 * 3 * 5 * 7),
        ("odd d, empty", RopeShape::new(2, 3, 0, 7), 0, 0, 0),
        ("short x", s, n - 1, one, n),
        ("long x", s, n + 1, one, n),
        ("short out", s, n, one, n - 2),
        ("out for an empty shape", RopeShape::new(2, 3, 0, 8), 0, 0, 8),
        ("short tables", s, n, one - 1, n),
        ("one table for per-batch tables", s.per_batch_tables(), n, one, n),
        ("short per-batch tables", s.per_batch_tables(), n, 2 * one - 1, n),
        ("stride below one table", s.with_table_batch_stride(one - 4), n, 2 * one, n),
        ("padded stride, tables too short", s.with_table_batch_stride(one + 4), n, 2 * one, n),
        ("more than 2^32 rows", RopeShape::new(1 << 16, 1 << 16, 2, 2), 0, 0, 0),
    ];
    for exec in executors() {
        for (what, shape, xl, tl, ol) in &cases {
            for layout in [Interleaved, HalfSplit, Thd] {
                let x = exec.upload(&vec![1.0f32; *xl]).unwrap();
                let c = exec.upload(&vec![0.5f32; *tl]).unwrap();
                let sentinel = vec![-7.25f32; *ol];
                let mut y = exec.upload(&sentinel).unwrap();
                let err = apply(layout, &exec, &x, &c, &c, &mut y, shape).expect_err(what);
                assert!(matches!(err, LaunchError::InvalidArgument { .. }), "{what}: {err}");
                assert_eq!(exec.download(&y).unwrap(), sentinel, "{what}: {layout:?} changed out on {}", exec.name());
            }
        }
    }
    assert!(matches!(rope::launch_config::<f32>(&RopeShape::new(1, 1, 1, 3)), Err(LaunchError::InvalidArgument { .. })));
    // The extra table rows that a longer table has are fine, as is per-batch stride padding.
    let exec = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let x = exec.upload(&vec![1.0f32; n]).unwrap();
    let c = exec.upload(&vec![0.5f32; 2 * one + 4]).unwrap();
    let mut y = exec.alloc::<f32>(n).unwrap();
    apply_rope(&exec, &x, &c, &c, &mut y, &s.with_table_batch_stride(one + 4)).unwrap();
    apply_rope(&exec, &x, &c, &c, &mut y, &s).unwrap();
}

#[test]
fn launch_config_has_one_work_item_per_block_of_pairs() {
    // 32 heads x 128: 64 pairs a row, 8 per work-item for half types and 4 for f32.
    let s = RopeShape::new(4, 32, 1000, 128);
    let rows = 4 * 32 * 1000;
    assert_eq!(rope::launch_config::<bf16>(&s).unwrap().grid.x as usize * 256, rows * 8);
    assert_eq!(rope::launch_config::<f32>(&s).unwrap().grid.x as usize * 256, rows * 16);
    assert_eq!(rope::launch_config::<f16>(&RopeShape::new(1, 1, 1, 2)).unwrap().grid.x, 1);
    assert_eq!(rope::pairs_per_item::<f32>(), 4);
    assert_eq!(rope::pairs_per_item::<bf16>(), 8);
}

#[test]
fn every_rope_instance_is_registered_and_built_without_scratch() {
    let bins = &kernels::__KERNEL_BINARIES;
    let symbols: Vec<&str> =
        bins.kernels().filter(|r| r.module.starts_with("kernels::rope::")).flat_map(|r| r.instances.iter().map(|i| i.symbol)).collect();
    for k in ["rope_i", "rope", "rope_thd"] {
        for t in ["f32", "f16", "bf16"] {
            let want = format!("{k}_{t}");
            assert!(symbols.contains(&want.as_str()), "{want} not registered: {symbols:?}");
        }
    }
    assert_eq!(symbols.len(), 9, "{symbols:?}");
    // Without a GPU build (KERNEL_SKIP_GPU_BUILD) there are no code objects to look at.
    for co in bins.code_objects {
        for s in &symbols {
            let st = bins.stats_for(s, co.arch).unwrap_or_else(|| panic!("{s} missing on {}", co.arch));
            assert_eq!((st.scratch_bytes, st.vgpr_spills, st.sgpr_spills), (0, 0, 0), "{s} on {}", co.arch);
        }
    }
    if let Some(ptx) = bins.ptx {
        for s in &symbols {
            assert!(ptx.contains(&format!(".entry {s}(")), "PTX lacks {s}");
        }
    }
}
