//! `candle_rocm::paged_prefill`: prompt chunks (several sequences, cached prefixes of
//! lengths no multiple of the block size, a chunk of one token) attending over caches
//! written by `reshape_and_cache` in shuffled blocks, against an f64 causal attention over
//! the same rounded values, on the CPU executor with waves of 32 and 64 (and a GPU when the
//! build has one); bad arguments are errors naming them.
//!
//! Tolerance: inputs in [-1, 1] rounded to f16/bf16 once, the reference takes those
//! values; the kernel rounds `P` to the input type before `P V` (`u max|v|`) and the
//! output once (`u |o|`): `3u` absolute (`u` = 2^-11 for f16, 2^-8 for bf16).
mod common;

use candle_core::{DType, Device, Result, Tensor};
use candle_rocm::paged;
use candle_rocm::paged_prefill::{paged_prefill_indexed, PrefillIndex};
use candle_rocm::{RocmDevice, WaveSize};
use common::{devices, values};

fn input(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, -1.0, 1.0, false), shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn chunks_over_cached_prefixes_match_f64_attention() {
    let (h, hk, d, bs, nb) = (8usize, 2usize, 64usize, 16usize, 12usize);
    // (prefix, chunk) per sequence.
    let seqs = [(0usize, 9usize), (21, 12), (40, 1), (16, 30)];
    let ctx: Vec<usize> = seqs.iter().map(|&(p, n)| p + n).collect();
    let max_blocks = ctx.iter().map(|c| c.div_ceil(bs)).max().unwrap();
    // Blocks handed out in a shuffled order.
    let order = [5u32, 11, 0, 7, 2, 9, 4, 1, 10, 3, 8, 6];
    let mut tables = vec![0u32; seqs.len() * max_blocks];
    let mut next = 0;
    for (b, c) in ctx.iter().enumerate() {
        for i in 0..c.div_ceil(bs) {
            tables[b * max_blocks + i] = order[next];
            next += 1;
        }
    }
    let slot = |b: usize, t: usize| (tables[b * max_blocks + t / bs] as usize * bs + t % bs) as i64;
    let mut cu_q = vec![0u32];
    for &(_, n) in &seqs {
        cu_q.push(cu_q.last().unwrap() + n as u32);
    }
    let total_q = *cu_q.last().unwrap() as usize;
    let lens: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    for (dtype, seed) in [(DType::F16, 70), (DType::BF16, 71)] {
        let u = if dtype == DType::F16 { 1.0 / 2048.0 } else { 1.0 / 256.0 };
        let keys: Vec<Tensor> = ctx.iter().enumerate().map(|(b, &c)| input(&[c, hk, d], dtype, seed * 10 + b as u64)).collect();
        let vals: Vec<Tensor> = ctx.iter().enumerate().map(|(b, &c)| input(&[c, hk, d], dtype, seed * 20 + b as u64)).collect();
        let q = input(&[total_q, h, d], dtype, seed);
        // The f64 reference on the rounded values.
        let (qh, kh, vh): (Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>) = (host(&q), keys.iter().map(host).collect(), vals.iter().map(host).collect());
        let mut want = vec![0f64; total_q * h * d];
        for (b, &(prefix, n)) in seqs.iter().enumerate() {
            for i in 0..n {
                let r = cu_q[b] as usize + i;
                for hh in 0..h {
                    let g = hh / (h / hk);
                    let qr = &qh[(r * h + hh) * d..][..d];
                    let s: Vec<f64> = (0..=prefix + i).map(|j| 0.125 * (0..d).map(|x| qr[x] as f64 * kh[b][(j * hk + g) * d + x] as f64).sum::<f64>()).collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for (j, x) in s.iter().enumerate() {
                        for c in 0..d {
                            want[(r * h + hh) * d + c] += (x - m).exp() / sum * vh[b][(j * hk + g) * d + c] as f64;
                        }
                    }
                }
            }
        }
        for rd in devices() {
            let dev = rd.as_candle();
            let kc = Tensor::zeros((nb, bs, hk, d), dtype, &dev).unwrap();
            let vc = Tensor::zeros((nb, bs, hk, d), dtype, &dev).unwrap();
            for b in 0..seqs.len() {
                let sm: Vec<i64> = (0..ctx[b]).map(|t| slot(b, t)).collect();
                paged::reshape_and_cache(&keys[b].to_device(&dev).unwrap(), &vals[b].to_device(&dev).unwrap(), &kc, &vc, &Tensor::new(sm.as_slice(), &dev).unwrap()).unwrap();
            }
            let ix = PrefillIndex::new(&dev, &cu_q, &lens, &tables, nb, bs).unwrap();
            assert_eq!((ix.batch(), ix.total_q()), (seqs.len(), total_q));
            let out = paged_prefill_indexed(&q.to_device(&dev).unwrap(), &kc, &vc, &ix, 0.125, None).unwrap();
            assert_eq!(out.dims(), &[total_q, h, d]);
            for (i, (g, w)) in host(&out).iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() <= 3.0 * u, "{dtype:?} on {}: out[{i}] (row {}) = {g}, want {w}", rd.name(), i / (h * d));
            }
        }
    }
}

#[test]
fn paged_prefill_errors_name_the_argument() {
    let dev = RocmDevice::new_cpu_executor(WaveSize::W32).as_candle();
    let (nb, bs) = (4usize, 4usize);
    let on = |t: Tensor| t.to_device(&dev).unwrap();
    let kc = on(input(&[nb, bs, 1, 64], DType::F16, 1));
    let q = on(input(&[3, 2, 64], DType::F16, 2));
    let tables = [0u32, 1, 2, 3];
    // The index: offsets, a chunk longer than its context, a block outside the cache.
    for (want, r) in [
        ("`cu_q`", PrefillIndex::new(&dev, &[0, 3], &[5, 2], &tables, nb, bs)),
        ("`context_lens`", PrefillIndex::new(&dev, &[0, 3, 6], &[5, 2], &tables, nb, bs)),
        ("`block_tables`", PrefillIndex::new(&dev, &[0, 2, 3], &[5, 2], &[0, 9, 2, 3], nb, bs)),
        ("`dev`", PrefillIndex::new(&Device::Cpu, &[0, 2, 3], &[5, 2], &tables, nb, bs)),
    ] {
        let e = err_of(r);
        assert!(e.contains(want), "expected {want} in: {e}");
    }
    let ix = PrefillIndex::new(&dev, &[0, 2, 3], &[5, 2], &tables, nb, bs).unwrap();
    let small = on(input(&[2, bs, 1, 64], DType::F16, 3));
    let cases = [
        ("`q`", err_of(paged_prefill_indexed(&q.narrow(0, 0, 2).unwrap(), &kc, &kc, &ix, 0.1, None))),
        ("`key_cache`", err_of(paged_prefill_indexed(&q, &small, &small, &ix, 0.1, None))),
        ("`value_cache`", err_of(paged_prefill_indexed(&q, &kc, &kc.narrow(3, 0, 32).unwrap(), &ix, 0.1, None))),
        ("`q`", err_of(paged_prefill_indexed(&q.to_dtype(DType::F32).unwrap(), &kc, &kc, &ix, 0.1, None))),
        ("`key_cache`", err_of(paged_prefill_indexed(&q, &kc.to_dtype(DType::BF16).unwrap(), &kc, &ix, 0.1, None))),
        ("`q`", err_of(paged_prefill_indexed(&on(input(&[3, 2, 80], DType::F16, 4)), &on(input(&[nb, bs, 1, 80], DType::F16, 5)), &on(input(&[nb, bs, 1, 80], DType::F16, 5)), &ix, 0.1, None))),
        ("`q`", err_of(paged_prefill_indexed(&q.to_device(&Device::Cpu).unwrap(), &kc, &kc, &ix, 0.1, None))),
    ];
    for (want, e) in cases {
        assert!(e.contains(want), "expected {want} in: {e}");
    }
}
