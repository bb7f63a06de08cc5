//! `attention::prefill` (flash prefill reading K/V through the block tables) against a
//! naive f64 causal attention over each sequence's context on the CPU executor in every
//! matrix-unit emulation (MFMA at wave 64; WMMA, gfx12 WMMA, mma.sync and VALU at wave
//! 32), and on a GPU when this build has one.
//!
//! The caches hold the contexts in shuffled blocks; every slot no context uses (the rest
//! of a partly filled last block, the blocks no table names) is NaN, and block-table
//! entries past a context name no block, so a read outside the context shows in the
//! output. Tolerances as in `tests/flash.rs` (inputs rounded first, the reference takes the
//! rounded values): `2u max|v| + u |out| + 1e-5` on the output (`u` the unit roundoff of
//! the input type: the probabilities and the output are rounded to it once each), `1e-4 (1
//! + |lse|)` on the f32 log-sum-exp.
use attention::prefill::host::{paged_prefill, paged_prefill_unchecked, PrefillIndex, PrefillShape};
use attention::{AttentionError, FlashElem};
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, WaveSize};
use kernel_runtime::Device;

mod common;
use common::{executors, inputs, name, Elem};

/// One launch: per sequence (cached prefix, chunk length), heads, head dimension, block
/// size and an optional left window.
#[derive(Clone, Debug)]
struct Case {
    seqs: Vec<(usize, usize)>,
    heads: usize,
    kv_heads: usize,
    d: usize,
    bs: usize,
    window: Option<usize>,
}

/// A permutation of `0..n` from `seed` (Fisher-Yates on the generator of [`inputs`]).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let r = inputs(n, 0.0, 1.0, seed);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, (r[i] * (i + 1) as f64) as usize);
    }
    p
}

/// Unused block-table entries: no block of any cache here.
const NO_BLOCK: u32 = 0x7fff_ffff;

fn check<T: Elem + FlashElem>(dev: &Device, c: &Case, seed: u64) {
    let (h_n, kv_n, d, bs) = (c.heads, c.kv_heads, c.d, c.bs);
    let batch = c.seqs.len();
    let ctx: Vec<usize> = c.seqs.iter().map(|&(p, n)| p + n).collect();
    let need: Vec<usize> = ctx.iter().map(|c| c.div_ceil(bs)).collect();
    // One spare row entry past the longest context, and two blocks no table names.
    let max_blocks = need.iter().max().unwrap() + 1;
    let num_blocks = need.iter().sum::<usize>() + 2;
    let perm = shuffled(num_blocks, seed + 7);
    let mut tables = vec![NO_BLOCK; batch * max_blocks];
    let mut next = 0;
    for b in 0..batch {
        for i in 0..need[b] {
            tables[b * max_blocks + i] = perm[next] as u32;
            next += 1;
        }
    }
    // The caches: NaN everywhere, then each context's keys and values at their slots.
    let row = kv_n * d;
    let mut kc = vec![f64::NAN; num_blocks * bs * row];
    let mut vc = kc.clone();
    let keys: Vec<Vec<f64>> = (0..batch).map(|b| inputs(ctx[b] * row, -2.0, 2.0, seed + 11 + b as u64)).collect();
    let vals: Vec<Vec<f64>> = (0..batch).map(|b| inputs(ctx[b] * row, -1.0, 1.0, seed + 31 + b as u64)).collect();
    let round = |x: f64| T::from_f64(x).to_f32() as f64;
    let (keys, vals): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (keys.iter().map(|k| k.iter().map(|&x| round(x)).collect()).collect(), vals.iter().map(|v| v.iter().map(|&x| round(x)).collect()).collect());
    for b in 0..batch {
        for t in 0..ctx[b] {
            let slot = tables[b * max_blocks + t / bs] as usize * bs + t % bs;
            kc[slot * row..][..row].copy_from_slice(&keys[b][t * row..][..row]);
            vc[slot * row..][..row].copy_from_slice(&vals[b][t * row..][..row]);
        }
    }
    let mut cu_q = vec![0u32];
    for &(_, n) in &c.seqs {
        cu_q.push(cu_q.last().unwrap() + n as u32);
    }
    let total_q = *cu_q.last().unwrap() as usize;
    let q: Vec<f64> = inputs(total_q * h_n * d, -2.0, 2.0, seed).into_iter().map(round).collect();
    let scale = 1.0 / (d as f64).sqrt();

    // The f64 reference: query i of sequence b's chunk at position prefix + i.
    let mut want = vec![0.0; total_q * h_n * d];
    let mut want_lse = vec![0.0; h_n * total_q];
    for (b, &(prefix, n)) in c.seqs.iter().enumerate() {
        for i in 0..n {
            let (p, r) = (prefix + i, cu_q[b] as usize + i);
            let lo = c.window.map_or(0, |w| p.saturating_sub(w));
            for h in 0..h_n {
                let hk = h / (h_n / kv_n);
                let qr = &q[(r * h_n + h) * d..][..d];
                let s: Vec<f64> = (lo..=p).map(|j| scale * qr.iter().zip(&keys[b][(j * kv_n + hk) * d..][..d]).map(|(a, b)| a * b).sum::<f64>()).collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
                want_lse[h * total_q + r] = m + sum.ln();
                let o = &mut want[(r * h_n + h) * d..][..d];
                for (jj, x) in s.iter().enumerate() {
                    let w = (x - m).exp() / sum;
                    for (oo, vv) in o.iter_mut().zip(&vals[b][((lo + jj) * kv_n + hk) * d..][..d]) {
                        *oo += w * vv;
                    }
                }
            }
        }
    }

    let t = |v: &[f64]| v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>();
    let (dq, dk, dv) = (dev.upload(&t(&q)).unwrap(), dev.upload(&t(&kc)).unwrap(), dev.upload(&t(&vc)).unwrap());
    // Outputs start as NaN: every element must be written.
    let mut out = dev.upload(&vec![T::from_f64(f64::NAN); q.len()]).unwrap();
    let mut lse = dev.upload(&vec![f32::NAN; h_n * total_q]).unwrap();
    let lens: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    let index = PrefillIndex::new(&cu_q, &lens, &tables, num_blocks, bs).unwrap();
    let shape = PrefillShape { heads: h_n, kv_heads: kv_n, head_dim: d };
    paged_prefill(dev, shape, &dq, &dk, &dv, &index, &mut out, &mut lse, scale as f32, c.window).unwrap();
    let (got, got_lse) = (dev.download(&out).unwrap(), dev.download(&lse).unwrap());
    let what = format!("{} {}: {c:?}", name(dev), std::any::type_name::<T>());
    let vmax = 1.0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.to_f32() as f64;
        let tol = 2.0 * T::U * vmax + T::U * w.abs() + 1e-5;
        assert!((g - w).abs() <= tol, "{what}: out[{i}] (row {}, head {}) = {g}, want {w}", i / (h_n * d), i / d % h_n);
    }
    for (i, (g, w)) in got_lse.iter().zip(&want_lse).enumerate() {
        let g = *g as f64;
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: lse[{i}] = {g}, want {w}");
    }
}

fn case(seqs: &[(usize, usize)], heads: usize, kv_heads: usize, d: usize, bs: usize) -> Case {
    Case { seqs: seqs.to_vec(), heads, kv_heads, d, bs, window: None }
}

/// Block sizes 16/32/64; prefixes 0, multiples of the block size and not; chunks of one
/// token, of less than a key tile and of more than a query block; GQA 1, 4, 8; hd 64 and
/// 128; several sequences per launch.
#[test]
fn paged_prefill_matches_f64_reference() {
    let cases = [
        case(&[(0, 20), (37, 5), (16, 1), (3, 70)], 2, 2, 64, 16),
        case(&[(45, 33), (0, 1), (64, 17)], 4, 1, 128, 32),
        case(&[(70, 66), (3, 9), (128, 1)], 8, 1, 64, 64),
        case(&[(100, 30), (31, 2)], 8, 2, 128, 16),
    ];
    for dev in executors() {
        for (i, c) in cases.iter().enumerate() {
            // Both types on every case would double the CPU executor's time: alternate.
            if i % 2 == 0 {
                check::<f16>(&dev, c, 100 + i as u64);
            } else {
                check::<bf16>(&dev, c, 100 + i as u64);
            }
        }
    }
}

/// A sliding window (left) cuts the prefix: rows see only the last `w + 1` positions.
#[test]
fn paged_prefill_left_window() {
    let c = Case { window: Some(19), ..case(&[(50, 24), (5, 7)], 4, 2, 64, 16) };
    for dev in executors() {
        check::<bf16>(&dev, &c, 7);
    }
}

fn arg_of(r: Result<impl std::fmt::Debug, AttentionError>) -> String {
    match r {
        Err(AttentionError::Argument { arg, .. }) => arg.to_string(),
        other => format!("{other:?}"),
    }
}

/// Bad indices and sizes are errors naming the argument, and nothing is written.
#[test]
fn paged_prefill_rejects_bad_arguments() {
    let dev = Device::cpu_with(CpuExecutor::new(WaveSize::W64));
    // Two sequences, blocks of 4 in a cache of 4 blocks, rows of 3 entries.
    let tables = [0u32, 1, 2, 3, NO_BLOCK, NO_BLOCK];
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2], &[5, 3], &tables, 4, 4)), "cu_q");
    assert_eq!(arg_of(PrefillIndex::new(&[1, 2, 3], &[5, 3], &tables, 4, 4)), "cu_q");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 3, 2], &[5, 3], &tables, 4, 4)), "cu_q");
    // A chunk longer than its context, a context past its row, a block outside the cache.
    assert_eq!(arg_of(PrefillIndex::new(&[0, 6, 7], &[5, 3], &tables, 4, 4)), "context_lens");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2, 3], &[13, 3], &tables, 4, 4)), "context_lens");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2, 3], &[5, 5], &tables, 4, 4)), "block_tables");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2, 3], &[5, 3], &tables[..5], 4, 4)), "block_tables");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2, 3], &[5, 3], &tables, 4, 0)), "block_size");
    assert_eq!(arg_of(PrefillIndex::new(&[0, 2, 3], &[5, 3], &tables, 4, 12)), "block_size");
    let index = PrefillIndex::new(&[0, 2, 3], &[5, 3], &tables, 4, 4).unwrap();
    assert_eq!((index.batch(), index.total_q(), index.longest_q()), (2, 3, 2));

    let shape = PrefillShape { heads: 2, kv_heads: 1, head_dim: 64 };
    let q = dev.upload(&vec![f16::from_f32(0.5); 3 * 2 * 64]).unwrap();
    let cache = dev.upload(&vec![f16::from_f32(0.5); 4 * 4 * 64]).unwrap();
    let mut out = dev.upload(&vec![f16::from_f32(7.0); 3 * 2 * 64]).unwrap();
    let mut lse = dev.upload(&[7.0f32; 6]).unwrap();
    let mut short = dev.upload(&[7.0f32; 5]).unwrap();
    assert_eq!(arg_of(paged_prefill(&dev, shape, &q, &cache, &cache, &index, &mut out, &mut short, 0.1, None)), "lse");
    assert_eq!(arg_of(paged_prefill(&dev, shape, &q, &q, &cache, &index, &mut out, &mut lse, 0.1, None)), "k_cache");
    assert_eq!(arg_of(paged_prefill(&dev, shape, &q, &cache, &cache, &index, &mut out, &mut lse, f32::NAN, None)), "scale");
    assert_eq!(arg_of(paged_prefill(&dev, PrefillShape { kv_heads: 3, ..shape }, &q, &cache, &cache, &index, &mut out, &mut lse, 0.1, None)), "k_cache");
    assert!(matches!(paged_prefill(&dev, PrefillShape { head_dim: 80, ..shape }, &q, &cache, &cache, &index, &mut out, &mut lse, 0.1, None), Err(AttentionError::HeadDim(80))));
    let meta = dev.upload(&index.meta()[..5]).unwrap();
    // SAFETY: refused on its length before any launch.
    let r = unsafe { paged_prefill_unchecked(&dev, shape, &q, &cache, &cache, &index, &meta, &mut out, &mut lse, 0.1, None) };
    assert_eq!(arg_of(r), "meta");
    assert!(dev.download(&out).unwrap().iter().all(|x| x.to_f32() == 7.0));
    assert!(dev.download(&lse).unwrap().iter().all(|&x| x == 7.0));
    // The checked form with the index uploaded once gives what the plain one gives: every
    // value is 0.5, so every output is 0.5.
    let meta = dev.upload(index.meta()).unwrap();
    // SAFETY: `meta` is the index's.
    unsafe { paged_prefill_unchecked(&dev, shape, &q, &cache, &cache, &index, &meta, &mut out, &mut lse, 0.1, None) }.unwrap();
    assert!(dev.download(&out).unwrap().iter().all(|x| (x.to_f32() - 0.5).abs() < 1e-3));
}
