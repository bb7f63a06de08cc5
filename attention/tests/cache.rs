//! `attention::cache::rope_and_cache` against an f64 host reference on the CPU executor
//! (waves of 32 and 64, every matrix-unit mode: the kernel uses none, so they agree) and a
//! GPU when this build has one: rotated keys and plain values land in their (shuffled)
//! slots, padding tokens are skipped, other slots keep their contents, queries rotate in
//! place; both pair layouts (Candle's `rope` and `rope_i`); f16, bf16 and f32. Bad
//! arguments are errors naming the argument, and nothing is written.
//!
//! Tolerance: the kernel rotates in f32 and rounds once, so a result is within one
//! rounding of the element type (half an ulp: 2^-11 relative for f16, 2^-8 for bf16) plus
//! f32 evaluation error, of the f64 rotation of the rounded inputs; values are copied bit
//! for bit.
use attention::cache::host::{rope_and_cache_rows, RopeCacheIo, RopeCacheShape, Rows};
use attention::AttentionError;
use half::{bf16, f16};
use kernel_dsl::Float;
use kernel_runtime::Device;

mod common;
use common::{executors, name, Elem, Rng};

fn f(x: impl Float) -> f64 {
    x.to_f32() as f64
}

fn values<T: Elem>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.uniform(-2.0, 2.0))).collect()
}

/// Candle-style tables for `rows` positions: `theta_i = 10000^(-2i/d)`.
fn tables<T: Elem>(rows: usize, d: usize) -> (Vec<T>, Vec<T>) {
    let d2 = d / 2;
    let angle = |p: usize, i: usize| p as f64 * 10000f64.powf(-2.0 * i as f64 / d as f64);
    let cos = (0..rows * d2).map(|e| T::from_f64(angle(e / d2, e % d2).cos())).collect();
    let sin = (0..rows * d2).map(|e| T::from_f64(angle(e / d2, e % d2).sin())).collect();
    (cos, sin)
}

/// The pair indices of pair `i` of a row of `d`.
fn pair(i: usize, d: usize, interleaved: bool) -> (usize, usize) {
    if interleaved {
        (2 * i, 2 * i + 1)
    } else {
        (i, i + d / 2)
    }
}

/// `row` rotated by table row `p`, in f64.
fn rotated<T: Elem>(row: &[T], p: usize, cos: &[T], sin: &[T], interleaved: bool) -> Vec<f64> {
    let d = row.len();
    let mut out = vec![0.0; d];
    for i in 0..d / 2 {
        let (j0, j1) = pair(i, d, interleaved);
        let (c, s) = (f(cos[p * d / 2 + i]), f(sin[p * d / 2 + i]));
        let (x0, x1) = (f(row[j0]), f(row[j1]));
        out[j0] = x0 * c - x1 * s;
        out[j1] = x0 * s + x1 * c;
    }
    out
}

fn close<T: Elem>(got: T, want: f64, what: &str) {
    // One rounding of the result plus f32 rounding of the products (|c|, |s| <= 1, |x| <= 2).
    let tol = T::U * want.abs() + 8.0 * f32::EPSILON as f64 + T::U * 1e-3;
    assert!((f(got) - want).abs() <= tol, "{what}: got {got:?}, want {want} (tol {tol:e})");
}

/// Where the test puts q, k and v: separate packed buffers, or the column slices of one
/// stacked `[tokens, lead + (heads + 2 kv_heads) * d + pad]` product (`lead` columns
/// before q, `pad` after v), read in place.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Packed,
    Stacked { lead: usize, pad: usize },
}

/// One case: sizes, pair layout, queries or not, the k/v copies or not, operand layout.
#[derive(Clone, Copy, Debug)]
struct Case {
    tokens: usize,
    kv_heads: usize,
    heads: usize,
    d: usize,
    interleaved: bool,
    with_q: bool,
    kv_out: bool,
    layout: Layout,
}

fn check<T: Elem>(dev: &Device, c: Case, seed: u64) {
    let Case { tokens, kv_heads, heads, d, interleaved, with_q, kv_out, layout } = c;
    let mut rng = Rng(seed);
    let (block_size, num_blocks, max_pos) = (4, 5, 40);
    let slots = block_size * num_blocks;
    let row = kv_heads * d;
    let k: Vec<T> = values(&mut rng, tokens * row);
    let v: Vec<T> = values(&mut rng, tokens * row);
    let q: Vec<T> = values(&mut rng, tokens * heads * d);
    let cache0: Vec<T> = values(&mut rng, slots * row);
    let (cos, sin) = tables::<T>(max_pos, d);
    // Distinct slots in a scrambled order; every third token is padding.
    let slot_mapping: Vec<i64> = (0..tokens).map(|t| if t % 3 == 2 { -1 } else { ((t * 7 + 3) % slots) as i64 }).collect();
    let positions: Vec<u32> = (0..tokens).map(|t| ((t * 13 + 5) % max_pos) as u32).collect();
    let shape = RopeCacheShape { tokens, kv_heads, heads, head_dim: d, interleaved };

    let (cd, sd) = (dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
    // The operands: three buffers, or one stacked product (filled around the columns with
    // values that must not leak anywhere).
    let (bufs, offs, stride) = match layout {
        Layout::Packed => (vec![dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), dev.upload(&v).unwrap()], [0, 0, 0], [heads * d, row, row]),
        Layout::Stacked { lead, pad } => {
            let w = lead + (heads + 2 * kv_heads) * d + pad;
            let mut y: Vec<T> = values(&mut rng, tokens * w);
            for t in 0..tokens {
                y[t * w + lead..][..heads * d].copy_from_slice(&q[t * heads * d..][..heads * d]);
                y[t * w + lead + heads * d..][..row].copy_from_slice(&k[t * row..][..row]);
                y[t * w + lead + heads * d + row..][..row].copy_from_slice(&v[t * row..][..row]);
            }
            (vec![dev.upload(&y).unwrap()], [lead, lead + heads * d, lead + heads * d + row], [w, w, w])
        }
    };
    // Stacked: q, k and v are views of the one buffer.
    let (qb, kb, vb) = (&bufs[0], &bufs[1 % bufs.len()], &bufs[2 % bufs.len()]);
    let before = (dev.download(qb).unwrap(), dev.download(kb).unwrap(), dev.download(vb).unwrap());
    let mut q_out = dev.alloc::<T>(tokens * heads * d).unwrap();
    let (mut k_out, mut v_out) = (dev.alloc::<T>(tokens * row).unwrap(), dev.alloc::<T>(tokens * row).unwrap());
    let (mut kc, mut vc) = (dev.upload(&cache0).unwrap(), dev.upload(&cache0).unwrap());
    let io = RopeCacheIo {
        k: Rows::new(kb, offs[1], stride[1]),
        v: Rows::new(vb, offs[2], stride[2]),
        q: if with_q { Some((Rows::new(qb, offs[0], stride[0]), &mut q_out)) } else { None },
        kv_out: if kv_out { Some((&mut k_out, &mut v_out)) } else { None },
    };
    rope_and_cache_rows(dev, shape, io, &mut kc, &mut vc, &slot_mapping, &positions, &cd, &sd).unwrap_or_else(|e| panic!("{}: {e}", name(dev)));
    let (kc, vc, qo) = (dev.download(&kc).unwrap(), dev.download(&vc).unwrap(), dev.download(&q_out).unwrap());
    let (ko, vo) = (dev.download(&k_out).unwrap(), dev.download(&v_out).unwrap());

    let at = format!("{} {} {c:?}", name(dev), std::any::type_name::<T>());
    // The inputs are read only.
    assert!(dev.download(qb).unwrap() == before.0 && dev.download(kb).unwrap() == before.1 && dev.download(vb).unwrap() == before.2, "{at}: an input changed");
    let mut written = vec![false; slots];
    for t in 0..tokens {
        let p = positions[t] as usize;
        for h in 0..kv_heads {
            let src = (t * kv_heads + h) * d;
            let want = rotated(&k[src..src + d], p, &cos, &sin, interleaved);
            if slot_mapping[t] >= 0 {
                let s = slot_mapping[t] as usize;
                written[s] = true;
                for c in 0..d {
                    close(kc[(s * kv_heads + h) * d + c], want[c], &format!("{at}: k_cache token {t} head {h} col {c}"));
                }
                assert_eq!(&vc[(s * kv_heads + h) * d..][..d], &v[src..src + d], "{at}: v_cache token {t} head {h}");
            }
            if kv_out {
                for c in 0..d {
                    close(ko[src + c], want[c], &format!("{at}: k_out token {t} head {h} col {c}"));
                }
                assert_eq!(&vo[src..src + d], &v[src..src + d], "{at}: v_out token {t} head {h}");
            }
        }
        if with_q {
            for h in 0..heads {
                let src = (t * heads + h) * d;
                let want = rotated(&q[src..src + d], p, &cos, &sin, interleaved);
                for c in 0..d {
                    close(qo[src + c], want[c], &format!("{at}: q token {t} head {h} col {c}"));
                }
            }
        }
    }
    if kv_out {
        // The copies equal the cache rows bit for bit.
        for t in (0..tokens).filter(|&t| slot_mapping[t] >= 0) {
            let s = slot_mapping[t] as usize;
            assert_eq!(&ko[t * row..][..row], &kc[s * row..][..row], "{at}: k_out token {t} differs from its cache row");
        }
    } else {
        assert!(ko.iter().chain(&vo).all(|x| x.to_f32() == 0.0), "{at}: k_out/v_out written although not passed");
    }
    if !with_q {
        assert!(qo.iter().all(|x| x.to_f32() == 0.0), "{at}: q_out written although not passed");
    }
    for s in (0..slots).filter(|&s| !written[s]) {
        assert_eq!(&kc[s * row..][..row], &cache0[s * row..][..row], "{at}: k_cache slot {s} not in the mapping changed");
        assert_eq!(&vc[s * row..][..row], &cache0[s * row..][..row], "{at}: v_cache slot {s} not in the mapping changed");
    }
}

fn case(tokens: usize, kv_heads: usize, heads: usize, d: usize, interleaved: bool, with_q: bool) -> Case {
    Case { tokens, kv_heads, heads, d, interleaved, with_q, kv_out: false, layout: Layout::Packed }
}

#[test]
fn rotated_keys_values_and_queries_land_in_their_slots() {
    for dev in executors() {
        for interleaved in [false, true] {
            check::<f16>(&dev, case(7, 2, 8, 64, interleaved, true), 1);
            check::<bf16>(&dev, case(5, 1, 4, 16, interleaved, true), 2);
            check::<f32>(&dev, case(4, 2, 2, 6, interleaved, false), 3);
        }
        // One token (a decode step), no queries; GQA 8.
        check::<f16>(&dev, case(1, 1, 8, 128, false, true), 4);
        check::<bf16>(&dev, case(1, 2, 0, 8, true, false), 5);
    }
}

/// q, k, v read in place as the column slices of one stacked product (the engine's q/k/v
/// GEMM output), with and without the contiguous k/v copies: aligned (the 16-byte vector
/// path: head sizes 64 and 128, f32's 4-pair blocks at 16) and misaligned (a leading column
/// or a padded row: pair by pair), GQA 1, 4 and 8, both pair layouts.
#[test]
fn strided_views_of_one_stacked_product() {
    let stacked = |lead, pad| Layout::Stacked { lead, pad };
    for dev in executors() {
        for interleaved in [false, true] {
            for (layout, kv_out) in [(stacked(0, 0), false), (stacked(0, 0), true), (stacked(1, 0), true), (stacked(0, 3), false), (stacked(8, 8), true)] {
                let c = Case { tokens: 6, kv_heads: 2, heads: 8, d: 64, interleaved, with_q: true, kv_out, layout };
                check::<bf16>(&dev, c, 11);
                check::<f16>(&dev, Case { kv_heads: 1, heads: 8, d: 128, tokens: 3, ..c }, 12);
                check::<f32>(&dev, Case { kv_heads: 2, heads: 2, d: 16, ..c }, 13);
                check::<f16>(&dev, Case { kv_heads: 3, heads: 3, d: 10, tokens: 5, ..c }, 14);
            }
            // Packed buffers with the copies; no queries with the copies.
            check::<bf16>(&dev, Case { kv_out: true, ..case(5, 2, 4, 64, interleaved, true) }, 15);
            check::<f16>(&dev, Case { kv_out: true, layout: stacked(0, 0), ..case(4, 2, 4, 64, interleaved, false) }, 16);
        }
    }
}

#[test]
fn bad_arguments_name_the_argument_and_write_nothing() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let (tokens, kvh, heads, d) = (3usize, 2usize, 4usize, 8usize);
    let (row, w) = (kvh * d, (heads + 2 * kvh) * d);
    let shape = RopeCacheShape { tokens, kv_heads: kvh, heads, head_dim: d, interleaved: false };
    let mut rng = Rng(9);
    // One stacked product [tokens, w]: q at 0, k at heads * d, v at heads * d + row.
    let y0: Vec<f16> = values(&mut rng, tokens * w);
    let cache0: Vec<f16> = values(&mut rng, 8 * row);
    let (cos, sin) = tables::<f16>(10, d);
    let (y, cd, sd) = (dev.upload(&y0).unwrap(), dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
    let (qo, ko) = (heads * d, heads * d + row);
    let odd = RopeCacheShape { head_dim: 7, ..shape };
    // (argument, shape, slots, positions, k rows (offset, stride), q rows, q_out and k_out lengths)
    type Case<'a> = (&'a str, RopeCacheShape, &'a [i64], &'a [u32], (usize, usize), (usize, usize), (usize, usize));
    let good = ((qo, w), (0, w), (tokens * heads * d, tokens * row));
    let cases: [Case<'_>; 12] = [
        ("slot_mapping", shape, &[0, 8, 1], &[0, 1, 2], good.0, good.1, good.2),
        ("slot_mapping", shape, &[0, 1, 1], &[0, 1, 2], good.0, good.1, good.2),
        ("positions", shape, &[0, 1, 2], &[0, 10, 2], good.0, good.1, good.2),
        ("positions", shape, &[0, 1, 2], &[0, 1], good.0, good.1, good.2),
        ("head_dim", odd, &[0, 1, 2], &[0, 1, 2], good.0, good.1, good.2),
        // Rows overlapping (stride below the row), the last row past the buffer's end.
        ("k", shape, &[0, 1, 2], &[0, 1, 2], (qo, row - 1), good.1, good.2),
        ("k", shape, &[0, 1, 2], &[0, 1, 2], (qo + 2 * row, w), good.1, good.2),
        ("k", shape, &[0, 1, 2], &[0, 1, 2], (usize::MAX - 4, w), good.1, good.2),
        ("q", shape, &[0, 1, 2], &[0, 1, 2], good.0, (w - heads * d + 1, w), good.2),
        ("q", shape, &[0, 1, 2], &[0, 1, 2], good.0, (0, heads * d - 2), good.2),
        ("q_out", shape, &[0, 1, 2], &[0, 1, 2], good.0, good.1, (tokens * heads * d - 1, tokens * row)),
        ("k_out", shape, &[0, 1, 2], &[0, 1, 2], good.0, good.1, (tokens * heads * d, tokens * row + 1)),
    ];
    for (want, shape, slots, pos, (k_at, k_stride), (q_at, q_stride), (nq, nk)) in cases {
        let mut q_out = dev.upload(&vec![f16::from_f32(0.5); nq]).unwrap();
        let (mut k_out, mut v_out) = (dev.upload(&vec![f16::from_f32(0.5); nk]).unwrap(), dev.upload(&vec![f16::from_f32(0.5); tokens * row]).unwrap());
        let (mut kc, mut vc) = (dev.upload(&cache0).unwrap(), dev.upload(&cache0).unwrap());
        let io = RopeCacheIo {
            k: Rows::new(&y, k_at, k_stride),
            v: Rows::new(&y, ko, w),
            q: Some((Rows::new(&y, q_at, q_stride), &mut q_out)),
            kv_out: Some((&mut k_out, &mut v_out)),
        };
        let e = rope_and_cache_rows(&dev, shape, io, &mut kc, &mut vc, slots, pos, &cd, &sd).expect_err(want);
        assert!(matches!(&e, AttentionError::Argument { arg, .. } if *arg == want), "{want}: {e}");
        assert_eq!(dev.download(&y).unwrap(), y0, "{want}: the product written");
        assert!(dev.download(&q_out).unwrap().iter().all(|x| x.to_f32() == 0.5), "{want}: q_out written");
        assert!(dev.download(&k_out).unwrap().iter().chain(&dev.download(&v_out).unwrap()).all(|x| x.to_f32() == 0.5), "{want}: k_out/v_out written");
        assert_eq!(dev.download(&kc).unwrap(), cache0, "{want}: k_cache written");
        assert_eq!(dev.download(&vc).unwrap(), cache0, "{want}: v_cache written");
    }
}
