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
use attention::cache::host::{rope_and_cache_rows, RopeCacheShape};
use attention::AttentionError;
use half::{bf16, f16};
use kernel_dsl::Float;
use kernel_runtime::Device;

mod common;
use common::{executors, name};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() as f64 / (1u64 << 53) as f64)
    }
}

trait Elem: Float + std::fmt::Debug + PartialEq + 'static {
    /// Relative rounding error of one rounding (half an ulp at 1).
    const U: f64;
    fn from_f64(v: f64) -> Self;
}
impl Elem for f16 {
    const U: f64 = 1.0 / 2048.0;
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Elem for bf16 {
    const U: f64 = 1.0 / 256.0;
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}
impl Elem for f32 {
    const U: f64 = 1.0 / (1u64 << 24) as f64;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

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

#[allow(clippy::too_many_arguments)]
fn check<T: Elem>(dev: &Device, tokens: usize, kv_heads: usize, heads: usize, d: usize, interleaved: bool, with_q: bool, seed: u64) {
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

    let (kd, vd, cd, sd) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap(), dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
    let mut qd = dev.upload(&q).unwrap();
    let (mut kc, mut vc) = (dev.upload(&cache0).unwrap(), dev.upload(&cache0).unwrap());
    let qarg = if with_q { Some(&mut qd) } else { None };
    rope_and_cache_rows(dev, shape, &kd, &vd, qarg, &mut kc, &mut vc, &slot_mapping, &positions, &cd, &sd)
        .unwrap_or_else(|e| panic!("{}: {e}", name(dev)));
    let (kc, vc, qo) = (dev.download(&kc).unwrap(), dev.download(&vc).unwrap(), dev.download(&qd).unwrap());

    let at = format!("{} {} tokens {tokens} kv {kv_heads} heads {heads} d {d} interleaved {interleaved}", name(dev), std::any::type_name::<T>());
    let mut written = vec![false; slots];
    for t in 0..tokens {
        let p = positions[t] as usize;
        if slot_mapping[t] >= 0 {
            let s = slot_mapping[t] as usize;
            written[s] = true;
            for h in 0..kv_heads {
                let src = (t * kv_heads + h) * d;
                let want = rotated(&k[src..src + d], p, &cos, &sin, interleaved);
                for c in 0..d {
                    close(kc[(s * kv_heads + h) * d + c], want[c], &format!("{at}: k_cache token {t} head {h} col {c}"));
                }
                assert_eq!(&vc[(s * kv_heads + h) * d..][..d], &v[src..src + d], "{at}: v_cache token {t} head {h}");
            }
        }
        for h in 0..heads {
            let src = (t * heads + h) * d;
            if with_q {
                let want = rotated(&q[src..src + d], p, &cos, &sin, interleaved);
                for c in 0..d {
                    close(qo[src + c], want[c], &format!("{at}: q token {t} head {h} col {c}"));
                }
            }
        }
    }
    if !with_q {
        assert_eq!(qo, q, "{at}: q changed although not passed");
    }
    for s in (0..slots).filter(|&s| !written[s]) {
        assert_eq!(&kc[s * row..][..row], &cache0[s * row..][..row], "{at}: k_cache slot {s} not in the mapping changed");
        assert_eq!(&vc[s * row..][..row], &cache0[s * row..][..row], "{at}: v_cache slot {s} not in the mapping changed");
    }
}

#[test]
fn rotated_keys_values_and_queries_land_in_their_slots() {
    for dev in executors() {
        for interleaved in [false, true] {
            check::<f16>(&dev, 7, 2, 8, 64, interleaved, true, 1);
            check::<bf16>(&dev, 5, 1, 4, 16, interleaved, true, 2);
            check::<f32>(&dev, 4, 2, 2, 6, interleaved, false, 3);
        }
        // One token (a decode step), no queries; GQA 8.
        check::<f16>(&dev, 1, 1, 8, 128, false, true, 4);
        check::<bf16>(&dev, 1, 2, 0, 8, true, false, 5);
    }
}

#[test]
fn bad_arguments_name_the_argument_and_write_nothing() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let (tokens, kvh, heads, d) = (3usize, 2usize, 4usize, 8usize);
    let shape = RopeCacheShape { tokens, kv_heads: kvh, heads, head_dim: d, interleaved: false };
    let mut rng = Rng(9);
    let k: Vec<f16> = values(&mut rng, tokens * kvh * d);
    let q0: Vec<f16> = values(&mut rng, tokens * heads * d);
    let cache0: Vec<f16> = values(&mut rng, 8 * kvh * d);
    let (cos, sin) = tables::<f16>(10, d);
    let (kd, cd, sd) = (dev.upload(&k).unwrap(), dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
    let short = dev.upload(&k[..k.len() - 1]).unwrap();
    let odd = RopeCacheShape { head_dim: 7, ..shape };
    type Case<'a> = (&'a str, RopeCacheShape, &'a [i64], &'a [u32], bool);
    let cases: [Case<'_>; 6] = [
        ("slot_mapping", shape, &[0, 8, 1], &[0, 1, 2], false),
        ("slot_mapping", shape, &[0, 1, 1], &[0, 1, 2], false),
        ("positions", shape, &[0, 1, 2], &[0, 10, 2], false),
        ("positions", shape, &[0, 1, 2], &[0, 1], false),
        ("head_dim", odd, &[0, 1, 2], &[0, 1, 2], false),
        ("v", shape, &[0, 1, 2], &[0, 1, 2], true),
    ];
    for (want, shape, slots, pos, short_v) in cases {
        let mut q = dev.upload(&q0).unwrap();
        let (mut kc, mut vc) = (dev.upload(&cache0).unwrap(), dev.upload(&cache0).unwrap());
        let v = if short_v { &short } else { &kd };
        let e = rope_and_cache_rows(&dev, shape, &kd, v, Some(&mut q), &mut kc, &mut vc, slots, pos, &cd, &sd).unwrap_err();
        assert!(matches!(&e, AttentionError::Argument { arg, .. } if *arg == want), "{want}: {e}");
        assert_eq!(dev.download(&q).unwrap(), q0, "{want}: q written");
        assert_eq!(dev.download(&kc).unwrap(), cache0, "{want}: k_cache written");
        assert_eq!(dev.download(&vc).unwrap(), cache0, "{want}: v_cache written");
    }
}
