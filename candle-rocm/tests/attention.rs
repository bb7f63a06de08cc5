//! The attention entry points (`candle_rocm::flash_attn`, `candle_rocm::paged`) against
//! Candle's own matmul-softmax on `Device::Cpu`, on the CPU executor with waves of 32 and 64
//! (and a GPU when the build has one), plus the same functions on `Device::Cpu` (their
//! Candle-ops path). Shapes are small (CI has two cores): lengths that are no multiple of
//! the kernels' 32/64 tiles, sequence length 1, GQA ratios 1/4/8, a fully masked row,
//! variable-length batches, paged caches with shuffled blocks.
//!
//! Tolerances. Inputs are rounded to f16/bf16 once and the reference computes on those
//! very values in f32, so the differences are the kernels' roundings: `P` rounded to the
//! input type before `P V` (at most `u * sum_j p_j |v_j| <= u * max|v|`, with `u` = 2^-11
//! for f16 and 2^-8 for bf16) and the output rounded once (`u * |o|`); inputs lie in
//! [-1, 1], so `3u` bounds both plus f32 ordering differences. The log-sum-exp is f32 on
//! both sides: 1e-4 relative. Rope: ours rotates in f32 and rounds once; Candle's CPU rope
//! rounds each product and the sum in the half type: up to 2 roundings of values <= 2, so
//! `4u` absolute.
mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor, D};
use candle_rocm::flash_attn as fa;
use candle_rocm::paged::{self, Rope};
use candle_rocm::{RocmDevice, WaveSize};
use common::{devices, values};

fn u(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
        _ => 1.0 / (1u64 << 24) as f64,
    }
}

/// Values in [-1, 1) of `dtype` on the CPU.
fn input(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, -1.0, 1.0, false), shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn assert_near(what: &str, want: &[f32], got: &[f32], atol: f64, rtol: f64) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    for (i, (&a, &b)) in want.iter().zip(got).enumerate() {
        let ok = if a.is_infinite() || b.is_infinite() { a == b } else { ((a - b).abs() as f64) <= atol + rtol * a.abs() as f64 };
        assert!(ok, "{what}: element {i}: want {a}, got {b} (atol {atol:e})");
    }
}

/// What a call asks for, in candle-flash-attn's terms.
#[derive(Clone, Copy, Debug)]
struct Opts {
    scale: f32,
    left: Option<usize>,
    right: Option<usize>,
    alibi: bool,
    softcap: f32,
}

impl Opts {
    fn plain(causal: bool) -> Self {
        Opts { scale: 0.125, left: None, right: causal.then_some(0), alibi: false, softcap: 0.0 }
    }
}

fn slopes(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect()
}

/// Candle's matmul-softmax on the CPU for one sequence: `q [sq, h, d]`, `k`, `v [sk, hk,
/// d]` (f16/bf16 values, computed in f32). Windows are taken literally (tests keep them
/// <= sk, where candle-flash-attn takes them literally too). Returns the output `[sq, h,
/// d]` in f32 and the log-sum-exp `[h, sq]`; rows that see no key: zeros and -inf.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, o: Opts) -> (Vec<f32>, Vec<f32>) {
    let (sq, h, d) = q.dims3().unwrap();
    let (sk, hk, _) = k.dims3().unwrap();
    let g = h / hk;
    let off = sk as i64 - sq as i64;
    let sl = slopes(h);
    let (mut out, mut lse) = (vec![0f32; sq * h * d], vec![f32::NEG_INFINITY; h * sq]);
    let f32of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    for hh in 0..h {
        let qh = f32of(&q.i((.., hh, ..)).unwrap()).contiguous().unwrap(); // [sq, d]
        let kh = f32of(&k.i((.., hh / g, ..)).unwrap()).contiguous().unwrap(); // [sk, d]
        let vh = f32of(&v.i((.., hh / g, ..)).unwrap()).contiguous().unwrap();
        let mut s = (qh.matmul(&kh.t().unwrap()).unwrap() * o.scale as f64).unwrap();
        if o.softcap > 0.0 {
            s = ((s / o.softcap as f64).unwrap().tanh().unwrap() * o.softcap as f64).unwrap();
        }
        let mut bias = vec![0f32; sq * sk];
        let mut empty = vec![true; sq];
        for i in 0..sq {
            for j in 0..sk {
                let (ii, jj) = (i as i64, j as i64);
                let seen = o.left.is_none_or(|w| jj >= ii + off - w as i64) && o.right.is_none_or(|w| jj <= ii + off + w as i64);
                bias[i * sk + j] = if !seen {
                    f32::NEG_INFINITY
                } else if o.alibi {
                    -sl[hh] * (ii + off - jj).abs() as f32
                } else {
                    0.0
                };
                empty[i] &= !seen;
            }
        }
        let s = (s + Tensor::from_vec(bias, (sq, sk), &Device::Cpu).unwrap()).unwrap();
        let p = candle_nn::ops::softmax_last_dim(&s).unwrap();
        let oh = p.matmul(&vh).unwrap().to_vec2::<f32>().unwrap();
        let l = s.exp().unwrap().sum(D::Minus1).unwrap().log().unwrap().to_vec1::<f32>().unwrap();
        for i in 0..sq {
            if !empty[i] {
                out[(i * h + hh) * d..][..d].copy_from_slice(&oh[i]);
                lse[hh * sq + i] = l[i];
            }
        }
    }
    (out, lse)
}

/// The fixed-length entry points that can express `o` (`all`: every one; else only
/// `flash_attn_lse`, which the others wrap), on `dev` (a rocm device or the CPU), with
/// `q [b, sq, h, d]`, `k`, `v [b, sk, hk, d]`.
fn fixed_calls(q: &Tensor, k: &Tensor, v: &Tensor, o: Opts, dev: &Device, all: bool) -> Vec<(&'static str, Tensor, Option<Tensor>)> {
    let h = q.dim(2).unwrap();
    let (q, k, v) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
    let al = Tensor::new(slopes(h), dev).unwrap();
    let causal = o.left.is_none() && o.right == Some(0);
    let plain = o.left.is_none() && (o.right.is_none() || causal);
    let mut r = vec![];
    let (out, lse) = fa::flash_attn_lse(&q, &k, &v, o.alibi.then_some(&al), o.scale, o.left, o.right, o.softcap).unwrap();
    r.push(("flash_attn_lse", out, Some(lse)));
    if !all {
        return r;
    }
    r.push(("softcap", fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, o.alibi.then_some(&al), o.scale, o.left, o.right, o.softcap).unwrap(), None));
    if o.softcap == 0.0 {
        if o.alibi {
            r.push(("alibi_windowed", fa::flash_attn_alibi_windowed(&q, &k, &v, &al, o.scale, o.left, o.right).unwrap(), None));
            if plain {
                r.push(("alibi", fa::flash_attn_alibi(&q, &k, &v, &al, o.scale, causal).unwrap(), None));
            }
        } else {
            r.push(("windowed", fa::flash_attn_windowed(&q, &k, &v, o.scale, o.left, o.right).unwrap(), None));
            if plain {
                r.push(("flash_attn", fa::flash_attn(&q, &k, &v, o.scale, causal).unwrap(), None));
            }
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn check_fixed(dtype: DType, b: usize, sq: usize, sk: usize, h: usize, hk: usize, o: Opts, seed: u64) {
    let d = 64;
    let q = input(&[b, sq, h, d], dtype, seed);
    let k = input(&[b, sk, hk, d], dtype, seed + 1);
    let v = input(&[b, sk, hk, d], dtype, seed + 2);
    let (mut want, mut want_lse) = (vec![], vec![]);
    for bb in 0..b {
        let (w, l) = reference(&q.get(bb).unwrap(), &k.get(bb).unwrap(), &v.get(bb).unwrap(), o);
        want.extend(w);
        want_lse.extend(l);
    }
    // Every entry point on the first device (the wave-32 executor) and the CPU; the
    // wrapped kernel call on the others (CI time).
    let mut devs: Vec<Device> = devices().iter().map(RocmDevice::as_candle).collect();
    devs.push(Device::Cpu);
    for (i, dev) in devs.iter().enumerate() {
        let all = i == 0 || matches!(dev, Device::Cpu);
        for (name, out, lse) in fixed_calls(&q, &k, &v, o, dev, all) {
            let what = format!("{name} {dtype:?} b{b} sq{sq} sk{sk} h{h}/{hk} {o:?} on {:?}", dev.location());
            assert_eq!(out.dims(), [b, sq, h, d], "{what}");
            assert_eq!(out.dtype(), dtype, "{what}");
            assert!(out.device().same_device(dev), "{what}: result left the device");
            assert_near(&what, &want, &host(&out), 3.0 * u(dtype) + 1e-4, 0.0);
            if let Some(lse) = lse {
                assert_eq!(lse.dims(), [b, h, sq], "{what}: lse");
                assert_near(&format!("{what}: lse"), &want_lse, &host(&lse), 1e-4, 1e-4);
            }
        }
    }
}

#[test]
fn fixed_length_entry_points_match_candle_matmul_softmax() {
    // Lengths no multiple of the tiles; GQA ratios 1, 4, 8; f16 and bf16.
    check_fixed(DType::F16, 2, 5, 37, 2, 2, Opts::plain(false), 1);
    check_fixed(DType::BF16, 1, 33, 33, 8, 1, Opts::plain(true), 2);
    check_fixed(DType::F16, 1, 7, 20, 4, 1, Opts { left: Some(3), right: Some(2), ..Opts::plain(false) }, 3);
    check_fixed(DType::BF16, 2, 6, 9, 2, 2, Opts { alibi: true, ..Opts::plain(true) }, 4);
    check_fixed(DType::F16, 1, 9, 9, 4, 2, Opts { alibi: true, left: Some(4), right: Some(0), softcap: 0.5, ..Opts::plain(false) }, 5);
}

#[test]
fn decode_row_and_fully_masked_rows() {
    // seq_q 1 (a decode step) against 17 keys, causal.
    check_fixed(DType::F16, 2, 1, 17, 4, 1, Opts::plain(true), 6);
    // seq_q > seq_k, causal bottom-right: the first three rows see no key (zeros, -inf).
    check_fixed(DType::BF16, 1, 6, 3, 2, 2, Opts::plain(true), 7);
    let q = input(&[1, 6, 2, 64], DType::F16, 8);
    let k = input(&[1, 3, 2, 64], DType::F16, 9);
    let dev = RocmDevice::new_cpu_executor(WaveSize::W32).as_candle();
    let (q, k) = (q.to_device(&dev).unwrap(), k.to_device(&dev).unwrap());
    let (out, lse) = fa::flash_attn_lse(&q, &k, &k, None, 0.125, None, Some(0), 0.0).unwrap();
    let (out, lse) = (host(&out), host(&lse));
    assert!(out[..3 * 2 * 64].iter().all(|&x| x == 0.0), "masked rows are zeros");
    assert!(out[3 * 2 * 64..].iter().any(|&x| x != 0.0), "rows that see keys are not");
    assert!(out.iter().all(|x| x.is_finite()), "no NaN");
    assert!((0..2).all(|h| lse[h * 6..][..3].iter().all(|&l| l == f32::NEG_INFINITY)), "masked rows have lse -inf: {lse:?}");
    assert!((0..2).all(|h| lse[h * 6 + 3..][..3].iter().all(|l| l.is_finite())), "other rows have a finite lse: {lse:?}");
}

#[test]
fn no_keys_give_zero_rows_on_every_device() {
    let q = input(&[1, 3, 2, 64], DType::BF16, 15);
    let k = input(&[1, 0, 2, 64], DType::BF16, 16);
    let mut devs: Vec<Device> = devices().iter().map(RocmDevice::as_candle).collect();
    devs.push(Device::Cpu);
    for dev in devs {
        let (q, k) = (q.to_device(&dev).unwrap(), k.to_device(&dev).unwrap());
        // Freed blocks of the outputs' sizes, holding ones: the outputs reuse them, so
        // zeros below were written.
        drop((Tensor::ones((1, 3, 2, 64), DType::BF16, &dev).unwrap(), Tensor::ones((1, 2, 3), DType::F32, &dev).unwrap()));
        let (out, lse) = fa::flash_attn_lse(&q, &k, &k, None, 0.125, None, None, 0.0).unwrap();
        assert!(host(&out).iter().all(|&x| x == 0.0), "{:?}: zeros", dev.location());
        assert!(host(&lse).iter().all(|&x| x == f32::NEG_INFINITY), "{:?}: lse -inf", dev.location());
    }
}

#[test]
fn windows_longer_than_the_keys_are_unbounded_as_in_candle_flash_attn() {
    let (q, k, v) = (input(&[1, 12, 2, 64], DType::F16, 10), input(&[1, 4, 2, 64], DType::F16, 11), input(&[1, 4, 2, 64], DType::F16, 12));
    let dev = RocmDevice::new_cpu_executor(WaveSize::W64).as_candle();
    let full = fa::flash_attn(&q.to_device(&dev).unwrap(), &k.to_device(&dev).unwrap(), &v.to_device(&dev).unwrap(), 0.125, false).unwrap();
    let wide = fa::flash_attn_windowed(&q.to_device(&dev).unwrap(), &k.to_device(&dev).unwrap(), &v.to_device(&dev).unwrap(), 0.125, Some(5), Some(5)).unwrap();
    assert_eq!(host(&full), host(&wide));
}

#[test]
fn strided_inputs_are_gathered() {
    // q as a transposed view of [b, h, sq, d], k and v as slices of one fused buffer.
    let dev = RocmDevice::new_cpu_executor(WaveSize::W32).as_candle();
    let qt = input(&[1, 4, 5, 64], DType::F16, 13);
    let kv = input(&[1, 11, 2, 2, 64], DType::F16, 14);
    let q = qt.transpose(1, 2).unwrap();
    let (k, v) = (kv.i((.., .., 0)).unwrap(), kv.i((.., .., 1)).unwrap());
    let (want, _) = reference(&q.get(0).unwrap(), &k.get(0).unwrap(), &v.get(0).unwrap(), Opts::plain(true));
    let got = fa::flash_attn(&q.to_device(&dev).unwrap(), &kv.to_device(&dev).unwrap().i((.., .., 0)).unwrap(), &kv.to_device(&dev).unwrap().i((.., .., 1)).unwrap(), 0.125, true).unwrap();
    assert_near("strided", &want, &host(&got), 3.0 * u(DType::F16) + 1e-4, 0.0);
}

#[test]
fn varlen_entry_points_match_candle_matmul_softmax() {
    let (lq, lk) = ([3usize, 1, 0, 9, 2], [5usize, 17, 4, 9, 0]);
    let (h, hk, d) = (4, 1, 64);
    let cum = |l: &[usize]| -> Vec<u32> { std::iter::once(0).chain(l.iter().scan(0u32, |s, &x| { *s += x as u32; Some(*s) })).collect() };
    let (cq, ck) = (cum(&lq), cum(&lk));
    let (tq, tk) = (cq[lq.len()] as usize, ck[lk.len()] as usize);
    // `wrappers`: every wrapper on the first executor too (else on the CPU only; CI time).
    for (dtype, o, seed, wrappers) in [
        (DType::F16, Opts::plain(true), 20, true),
        (DType::BF16, Opts { left: Some(2), right: Some(1), ..Opts::plain(false) }, 21, false),
        (DType::F16, Opts { alibi: true, ..Opts::plain(false) }, 22, true),
        (DType::BF16, Opts { alibi: true, left: Some(3), right: Some(0), softcap: 0.7, ..Opts::plain(false) }, 23, false),
    ] {
        let q = input(&[tq, h, d], dtype, seed);
        let k = input(&[tk, hk, d], dtype, seed + 1);
        let v = input(&[tk, hk, d], dtype, seed + 2);
        // Reference per sequence; output rows in order, lse [h, total_q].
        let mut want = vec![0f32; tq * h * d];
        let mut want_lse = vec![0f32; h * tq];
        for b in 0..lq.len() {
            let (q0, k0) = (cq[b] as usize, ck[b] as usize);
            if lq[b] == 0 {
                continue;
            }
            let (w, l) = if lk[b] == 0 {
                (vec![0f32; lq[b] * h * d], vec![f32::NEG_INFINITY; h * lq[b]])
            } else {
                reference(&q.narrow(0, q0, lq[b]).unwrap(), &k.narrow(0, k0, lk[b]).unwrap(), &v.narrow(0, k0, lk[b]).unwrap(), o)
            };
            want[q0 * h * d..][..w.len()].copy_from_slice(&w);
            for hh in 0..h {
                want_lse[hh * tq + q0..][..lq[b]].copy_from_slice(&l[hh * lq[b]..][..lq[b]]);
            }
        }
        let mut devs: Vec<Device> = devices().iter().map(RocmDevice::as_candle).collect();
        devs.push(Device::Cpu);
        for (i, dev) in devs.into_iter().enumerate() {
            // The wrappers on the CPU (and the first device), the kernel call everywhere.
            let all = (i == 0 && wrappers) || matches!(dev, Device::Cpu);
            let (qd, kd, vd) = (q.to_device(&dev).unwrap(), k.to_device(&dev).unwrap(), v.to_device(&dev).unwrap());
            let (sq, sk) = (Tensor::new(cq.as_slice(), &dev).unwrap(), Tensor::new(ck.as_slice(), &dev).unwrap());
            let al = Tensor::new(slopes(h), &dev).unwrap();
            let causal = o.left.is_none() && o.right == Some(0);
            let mut calls = vec![];
            let (out, lse) = fa::flash_attn_varlen_lse(&qd, &kd, &vd, o.alibi.then_some(&al), &sq, &sk, 9, 17, o.scale, o.left, o.right, o.softcap).unwrap();
            calls.push(("varlen_lse", out, Some(lse)));
            if all {
                calls.push(("varlen_softcap", fa::flash_attn_varlen_alibi_windowed_softcap(&qd, &kd, &vd, o.alibi.then_some(&al), &sq, &sk, 9, 17, o.scale, o.left, o.right, o.softcap).unwrap(), None));
                if o.softcap == 0.0 && !o.alibi {
                    calls.push(("varlen_windowed", fa::flash_attn_varlen_windowed(&qd, &kd, &vd, &sq, &sk, 9, 17, o.scale, o.left, o.right).unwrap(), None));
                    calls.push(("varlen_host_offsets", fa::flash_attn_varlen_host_offsets(&qd, &kd, &vd, &cq, &ck, 9, 17, o.scale, o.left, o.right).unwrap(), None));
                    if o.left.is_none() {
                        calls.push(("varlen", fa::flash_attn_varlen(&qd, &kd, &vd, &sq, &sk, 9, 17, o.scale, causal).unwrap(), None));
                    }
                }
                if o.softcap == 0.0 && o.alibi {
                    calls.push(("varlen_alibi_windowed", fa::flash_attn_varlen_alibi_windowed(&qd, &kd, &vd, &al, &sq, &sk, 9, 17, o.scale, o.left, o.right).unwrap(), None));
                    calls.push(("varlen_alibi", fa::flash_attn_varlen_alibi(&qd, &kd, &vd, &al, &sq, &sk, 9, 17, o.scale, causal).unwrap(), None));
                }
            }
            for (name, out, lse) in calls {
                let what = format!("{name} {dtype:?} {o:?} on {:?}", dev.location());
                assert_eq!(out.dims(), [tq, h, d], "{what}");
                assert_near(&what, &want, &host(&out), 3.0 * u(dtype) + 1e-4, 0.0);
                if let Some(lse) = lse {
                    assert_eq!(lse.dims(), [h, tq], "{what}: lse");
                    assert_near(&format!("{what}: lse"), &want_lse, &host(&lse), 1e-4, 1e-4);
                }
            }
        }
    }
}

fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn flash_errors_name_the_argument() {
    let dev = RocmDevice::new_cpu_executor(WaveSize::W32).as_candle();
    let on = |t: Tensor| t.to_device(&dev).unwrap();
    let q = on(input(&[1, 4, 2, 64], DType::F16, 30));
    let k = on(input(&[1, 6, 2, 64], DType::F16, 31));
    let cases: Vec<(&str, String)> = vec![
        ("`q`", err_of(fa::flash_attn(&q.get(0).unwrap(), &k, &k, 1.0, false))),
        ("`k`", err_of(fa::flash_attn(&q, &on(input(&[1, 6, 2, 32], DType::F16, 32)), &k, 1.0, false))),
        ("`v`", err_of(fa::flash_attn(&q, &k, &on(input(&[1, 5, 2, 64], DType::F16, 33)), 1.0, false))),
        ("`k`", err_of(fa::flash_attn(&q, &on(input(&[1, 6, 3, 64], DType::F16, 32)), &on(input(&[1, 6, 3, 64], DType::F16, 32)), 1.0, false))),
        ("`q`", err_of(fa::flash_attn(&q.to_dtype(DType::F32).unwrap(), &k, &k, 1.0, false))),
        ("`k`", err_of(fa::flash_attn(&q, &k.to_dtype(DType::BF16).unwrap(), &k, 1.0, false))),
        ("`k`", err_of(fa::flash_attn(&q, &k.to_device(&Device::Cpu).unwrap(), &k, 1.0, false))),
        ("`alibi_slopes`", err_of(fa::flash_attn_alibi(&q, &k, &k, &on(Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap()), 1.0, false))),
        ("`softcap`", err_of(fa::flash_attn_alibi_windowed_softcap(&q, &k, &k, None, 1.0, None, None, -1.0))),
    ];
    let q72 = on(input(&[1, 4, 2, 72], DType::F16, 34));
    let k72 = on(input(&[1, 6, 2, 72], DType::F16, 35));
    let hd = err_of(fa::flash_attn(&q72, &k72, &k72, 1.0, false));
    assert!(hd.contains("`q`") && hd.contains("72"), "{hd}");
    let qv = on(input(&[7, 2, 64], DType::F16, 36));
    let kv = on(input(&[6, 2, 64], DType::F16, 37));
    let cu = |v: &[u32]| Tensor::new(v, &dev).unwrap();
    let varlen = [
        ("`seqlens_q`", err_of(fa::flash_attn_varlen(&qv, &kv, &kv, &cu(&[0, 3, 6]), &cu(&[0, 2, 6]), 9, 9, 1.0, false))),
        ("`max_seqlen_k`", err_of(fa::flash_attn_varlen(&qv, &kv, &kv, &cu(&[0, 3, 7]), &cu(&[0, 1, 6]), 9, 4, 1.0, false))),
        ("`seqlens_k`", err_of(fa::flash_attn_varlen(&qv, &kv, &kv, &cu(&[0, 3, 7]), &cu(&[0, 2]), 9, 9, 1.0, false))),
        ("`seqlens_q`", err_of(fa::flash_attn_varlen_host_offsets(&qv, &kv, &kv, &[0, 3, 6], &[0, 2, 6], 9, 9, 1.0, None, Some(0)))),
        ("`max_seqlen_k`", err_of(fa::flash_attn_varlen_host_offsets(&qv, &kv, &kv, &[0, 3, 7], &[0, 1, 6], 9, 4, 1.0, None, None))),
    ];
    for (want, e) in cases.into_iter().chain(varlen) {
        assert!(e.contains(want), "expected {want} in: {e}");
    }
}

/// A paged cache in shuffled blocks: `(block_tables [batch, max_blocks], slot of token t
/// of sequence b)`.
fn layout(lens: &[usize], block_size: usize, num_blocks: usize, seed: u64) -> (Vec<u32>, Vec<Vec<i64>>) {
    let max_blocks = lens.iter().map(|l| l.div_ceil(block_size)).max().unwrap() + 1;
    let mut order: Vec<u32> = (0..num_blocks as u32).collect();
    let mut s = seed;
    for i in (1..order.len()).rev() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        order.swap(i, (s >> 33) as usize % (i + 1));
    }
    let (mut tables, mut slots, mut next) = (vec![0u32; lens.len() * max_blocks], vec![], 0);
    for (b, &l) in lens.iter().enumerate() {
        for i in 0..l.div_ceil(block_size) {
            tables[b * max_blocks + i] = order[next];
            next += 1;
        }
        slots.push((0..l).map(|t| (tables[b * max_blocks + t / block_size] as usize * block_size + t % block_size) as i64).collect());
    }
    (tables, slots)
}

#[test]
fn paged_attention_over_caches_written_by_reshape_and_cache() {
    let (h, hk, d, bs) = (8, 2, 64, 16);
    let lens = [1usize, 40, 17];
    for (dtype, seed) in [(DType::F16, 40), (DType::BF16, 41)] {
        let num_blocks = 8;
        let (tables, slots) = layout(&lens, bs, num_blocks, seed);
        let q = input(&[lens.len(), h, d], dtype, seed);
        let keys: Vec<Tensor> = lens.iter().enumerate().map(|(b, &l)| input(&[l, hk, d], dtype, seed * 10 + b as u64)).collect();
        let vals: Vec<Tensor> = lens.iter().enumerate().map(|(b, &l)| input(&[l, hk, d], dtype, seed * 20 + b as u64)).collect();
        for rd in devices() {
            let dev = rd.as_candle();
            let kc = Tensor::zeros((num_blocks, bs, hk, d), dtype, &dev).unwrap();
            let vc = Tensor::zeros((num_blocks, bs, hk, d), dtype, &dev).unwrap();
            for b in 0..lens.len() {
                let sm = Tensor::new(slots[b].as_slice(), &dev).unwrap();
                paged::reshape_and_cache(&keys[b].to_device(&dev).unwrap(), &vals[b].to_device(&dev).unwrap(), &kc, &vc, &sm).unwrap();
            }
            // The cache rows are the keys and values, bit for bit.
            let (kch, vch) = (kc.to_device(&Device::Cpu).unwrap(), vc.to_device(&Device::Cpu).unwrap());
            for (b, seq_slots) in slots.iter().enumerate() {
                for (t, &s) in seq_slots.iter().enumerate() {
                    let s = s as usize;
                    let row = |c: &Tensor| host(&c.get(s / bs).unwrap().get(s % bs).unwrap());
                    assert_eq!(row(&kch), host(&keys[b].get(t).unwrap()), "key cache row of token {t} of sequence {b}");
                    assert_eq!(row(&vch), host(&vals[b].get(t).unwrap()), "value cache row of token {t} of sequence {b}");
                }
            }
            let bt = Tensor::from_vec(tables.clone(), (lens.len(), tables.len() / lens.len()), &dev).unwrap();
            let cl = Tensor::new(lens.map(|l| l as u32).as_slice(), &dev).unwrap();
            let (out, lse) = paged::paged_attention_lse(&q.to_device(&dev).unwrap(), &kc, &vc, &bt, &cl, 0.125).unwrap();
            let out2 = paged::paged_attention(&q.to_device(&dev).unwrap(), &kc, &vc, &bt, &cl, 0.125).unwrap();
            assert_eq!(host(&out), host(&out2));
            let (out, lse) = (host(&out), host(&lse));
            for b in 0..lens.len() {
                let (w, wl) = reference(&q.get(b).unwrap().unsqueeze(0).unwrap(), &keys[b], &vals[b], Opts::plain(false));
                let what = format!("paged {dtype:?} sequence {b} on {}", rd.name());
                assert_near(&what, &w, &out[b * h * d..][..h * d], 3.0 * u(dtype) + 1e-4, 0.0);
                assert_near(&format!("{what}: lse"), &wl, &lse[b * h..][..h], 1e-4, 1e-4);
            }
        }
    }
}

#[test]
fn rope_and_cache_matches_candle_rope_then_cache() {
    let (tokens, h, hk, d, bs, nb) = (5usize, 4usize, 2usize, 64usize, 4usize, 4usize);
    let max_pos = 32;
    for (dtype, interleaved, seed) in [(DType::F16, false, 50), (DType::BF16, true, 51), (DType::F32, false, 52)] {
        let key = input(&[tokens, hk, d], dtype, seed);
        let value = input(&[tokens, hk, d], dtype, seed + 1);
        let q = input(&[tokens, h, d], dtype, seed + 2);
        // Llama-style tables (theta 10000), in the model's dtype.
        let inv: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / d as f32)).collect();
        let ang: Vec<f32> = (0..max_pos * d / 2).map(|e| (e / (d / 2)) as f32 * inv[e % (d / 2)]).collect();
        let ang = Tensor::from_vec(ang, (max_pos, d / 2), &Device::Cpu).unwrap();
        let (cos, sin) = (ang.cos().unwrap().to_dtype(dtype).unwrap(), ang.sin().unwrap().to_dtype(dtype).unwrap());
        let positions: Vec<u32> = vec![7, 0, 31, 12, 3];
        let slots: Vec<i64> = vec![9, 2, -1, 15, 0];
        // Candle: rope of each token's rows at its position, on the CPU.
        let rot = |x: &Tensor, t: usize| -> Tensor {
            let p = positions[t] as usize;
            let (c, s) = (cos.narrow(0, p, 1).unwrap(), sin.narrow(0, p, 1).unwrap());
            let x = x.get(t).unwrap().unsqueeze(0).unwrap().unsqueeze(2).unwrap().contiguous().unwrap(); // [1, heads, 1, d]
            let r = if interleaved { candle_nn::rotary_emb::rope_i(&x, &c, &s) } else { candle_nn::rotary_emb::rope(&x, &c, &s) };
            r.unwrap().squeeze(2).unwrap().squeeze(0).unwrap()
        };
        let tol = 4.0 * u(dtype) + 1e-6;
        for rd in devices() {
            let dev = rd.as_candle();
            let cache0 = input(&[nb, bs, hk, d], dtype, seed + 3);
            let kc = cache0.to_device(&dev).unwrap().copy().unwrap();
            let vc = cache0.to_device(&dev).unwrap().copy().unwrap();
            let rope = Rope {
                cos: &cos.to_device(&dev).unwrap(),
                sin: &sin.to_device(&dev).unwrap(),
                positions: &Tensor::new(positions.as_slice(), &dev).unwrap(),
                interleaved,
            };
            let sm = Tensor::new(slots.as_slice(), &dev).unwrap();
            let qo = paged::rope_and_cache(&key.to_device(&dev).unwrap(), &value.to_device(&dev).unwrap(), &kc, &vc, &sm, rope, Some(&q.to_device(&dev).unwrap()))
                .unwrap()
                .expect("rotated queries");
            let (kch, vch) = (kc.to_device(&Device::Cpu).unwrap(), vc.to_device(&Device::Cpu).unwrap());
            let what = format!("rope_and_cache {dtype:?} interleaved {interleaved} on {}", rd.name());
            let mut written = vec![false; nb * bs];
            for (t, &s) in slots.iter().enumerate() {
                assert_near(&format!("{what}: q token {t}"), &host(&rot(&q, t)), &host(&qo.get(t).unwrap()), tol, 0.0);
                if s < 0 {
                    continue;
                }
                let s = s as usize;
                written[s] = true;
                assert_near(&format!("{what}: key token {t}"), &host(&rot(&key, t)), &host(&kch.get(s / bs).unwrap().get(s % bs).unwrap()), tol, 0.0);
                assert_eq!(host(&vch.get(s / bs).unwrap().get(s % bs).unwrap()), host(&value.get(t).unwrap()), "{what}: value token {t}");
            }
            for s in (0..nb * bs).filter(|&s| !written[s]) {
                let (b, r) = (s / bs, s % bs);
                assert_eq!(host(&kch.get(b).unwrap().get(r).unwrap()), host(&cache0.get(b).unwrap().get(r).unwrap()), "{what}: slot {s} changed");
            }
            // Without queries: the same cache contents, no tensor back.
            let kc2 = cache0.to_device(&dev).unwrap().copy().unwrap();
            let vc2 = cache0.to_device(&dev).unwrap().copy().unwrap();
            let none = paged::rope_and_cache(&key.to_device(&dev).unwrap(), &value.to_device(&dev).unwrap(), &kc2, &vc2, &sm, rope, None).unwrap();
            assert!(none.is_none());
            assert_eq!(host(&kc2), host(&kch), "{what}: keys without q");
        }
    }
}

/// q, k, v as views of the heads of one stacked q/k/v product (`narrow`s of `[tokens,
/// heads + 2 kv_heads, head_dim]`, read in place by the kernel) give bit for bit what
/// contiguous copies of them give, and so does a layout the kernel cannot read in place
/// (transposed heads: copied first); the product is not written; `kv_out`'s keys equal the
/// cache rows and its values the step's values, bit for bit, padding tokens included.
#[test]
fn rope_and_cache_reads_views_of_a_stacked_product() {
    let (tokens, h, hk, d, bs, nb) = (5usize, 4usize, 2usize, 64usize, 4usize, 4usize);
    let positions: Vec<u32> = vec![7, 0, 11, 12, 3];
    let slots: Vec<i64> = vec![9, 2, -1, 15, 0];
    for (dtype, interleaved, seed) in [(DType::F16, false, 70), (DType::BF16, true, 71), (DType::F32, false, 72)] {
        let y = input(&[tokens, (h + 2 * hk) * d], dtype, seed);
        let ang = Tensor::arange(0u32, 16 * d as u32 / 2, &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().affine(0.01, 0.0).unwrap().reshape((16, d / 2)).unwrap();
        let (cos, sin) = (ang.cos().unwrap().to_dtype(dtype).unwrap(), ang.sin().unwrap().to_dtype(dtype).unwrap());
        let cache0 = input(&[nb, bs, hk, d], dtype, seed + 1);
        for rd in devices() {
            let dev = rd.as_candle();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let (yd, cos, sin) = (on(&y), on(&cos), on(&sin));
            let y3 = yd.reshape((tokens, h + 2 * hk, d)).unwrap();
            let (q, k, v) = (y3.narrow(1, 0, h).unwrap(), y3.narrow(1, h, hk).unwrap(), y3.narrow(1, h + hk, hk).unwrap());
            let ix = paged::CacheIndex::new(&dev, &slots, &positions, nb, bs).unwrap();
            // Rotated q, k cache, v cache, k_out, v_out.
            let run = |q: &Tensor, k: &Tensor, v: &Tensor| -> [Vec<f32>; 5] {
                let (kc, vc) = (on(&cache0).copy().unwrap(), on(&cache0).copy().unwrap());
                let out = paged::rope_and_cache_indexed_out(k, v, &kc, &vc, &ix, (&cos, &sin), interleaved, Some(q), true).unwrap();
                let (ko, vo) = out.kv.expect("k/v copies");
                assert_eq!((ko.dims(), vo.dims()), (&[tokens, hk, d][..], &[tokens, hk, d][..]));
                [host(&out.q.expect("rotated queries")), host(&kc), host(&vc), host(&ko), host(&vo)]
            };
            let what = format!("{dtype:?} interleaved {interleaved} on {}", rd.name());
            let views = run(&q, &k, &v);
            let copies = run(&q.contiguous().unwrap(), &k.contiguous().unwrap(), &v.contiguous().unwrap());
            assert!(views == copies, "{what}: views and contiguous copies differ");
            // Heads transposed in memory: not row-strided, copied by the entry point.
            let qt = q.transpose(0, 1).unwrap().contiguous().unwrap().transpose(0, 1).unwrap();
            assert!(run(&qt, &k, &v) == copies, "{what}: a transposed q differs");
            assert_eq!(host(&yd), host(&y), "{what}: the product was written");
            let [_, kc, _, ko, vo] = views;
            let row = hk * d;
            for (t, &s) in slots.iter().enumerate() {
                assert_eq!(&vo[t * row..][..row], &host(&v.get(t).unwrap())[..], "{what}: v_out token {t}");
                if s >= 0 {
                    assert_eq!(&ko[t * row..][..row], &kc[s as usize * row..][..row], "{what}: k_out token {t}");
                }
            }
        }
    }
}

#[test]
fn cache_errors_name_the_argument_and_write_nothing() {
    let dev = RocmDevice::new_cpu_executor(WaveSize::W32).as_candle();
    let on = |t: Tensor| t.to_device(&dev).unwrap();
    let (bs, nb, hk, d) = (4, 3, 2, 64);
    let cache0 = input(&[nb, bs, hk, d], DType::F16, 60);
    let key = on(input(&[2, hk, d], DType::F16, 61));
    let kc = on(cache0.clone()).copy().unwrap();
    let vc = on(cache0.clone()).copy().unwrap();
    let sm = |v: &[i64]| Tensor::new(v, &dev).unwrap();
    let ang = Tensor::zeros((8, d / 2), DType::F16, &dev).unwrap();
    let pos = Tensor::new(&[0u32, 9], &dev).unwrap();
    let q = on(input(&[3, 4, 64], DType::F16, 62));
    let cases: Vec<(&str, String)> = vec![
        ("`slot_mapping`", err_of(paged::reshape_and_cache(&key, &key, &kc, &vc, &sm(&[0, 12])))),
        ("`slot_mapping`", err_of(paged::reshape_and_cache(&key, &key, &kc, &vc, &sm(&[3, 3])))),
        ("`slot_mapping`", err_of(paged::reshape_and_cache(&key, &key, &kc, &vc, &sm(&[3])))),
        ("`value`", err_of(paged::reshape_and_cache(&key, &key.narrow(0, 0, 1).unwrap(), &kc, &vc, &sm(&[0, 1])))),
        ("`key_cache`", err_of(paged::reshape_and_cache(&key, &key, &kc.narrow(0, 0, 2).unwrap(), &vc.narrow(0, 0, 2).unwrap(), &sm(&[0, 1])))),
        ("`value_cache`", err_of(paged::reshape_and_cache(&key, &key, &kc, &vc.to_dtype(DType::BF16).unwrap(), &sm(&[0, 1])))),
        ("`key`", err_of(paged::reshape_and_cache(&key.to_device(&Device::Cpu).unwrap(), &key, &kc, &vc, &sm(&[0, 1])))),
        ("`value_cache`", err_of(paged::reshape_and_cache(&key, &key, &kc, &kc, &sm(&[0, 1])))),
        ("`positions`", err_of(paged::rope_and_cache(&key, &key, &kc, &vc, &sm(&[0, 1]), Rope { cos: &ang, sin: &ang, positions: &pos, interleaved: false }, None))),
        ("`q`", err_of(paged::rope_and_cache(&key, &key, &kc, &vc, &sm(&[0, 1]), Rope { cos: &ang, sin: &ang, positions: &Tensor::new(&[0u32, 1], &dev).unwrap(), interleaved: false }, Some(&q)))),
        ("`cos`", err_of(paged::rope_and_cache(&key, &key, &kc, &vc, &sm(&[0, 1]), Rope { cos: &ang.narrow(1, 0, 8).unwrap(), sin: &ang, positions: &pos, interleaved: false }, None))),
    ];
    for (want, e) in cases {
        assert!(e.contains(want), "expected {want} in: {e}");
    }
    assert_eq!(host(&kc), host(&cache0), "k_cache written by a failed call");
    assert_eq!(host(&vc), host(&cache0), "v_cache written by a failed call");

    // paged_attention: a block outside the cache, a context longer than its table row,
    // head dim 72, mismatched caches.
    let q = on(input(&[1, 4, 64], DType::F16, 63));
    let bt = |v: &[u32]| Tensor::from_vec(v.to_vec(), (1, v.len()), &dev).unwrap();
    let cl = |n: u32| Tensor::new(&[n], &dev).unwrap();
    let paged_cases = [
        ("`block_tables`", err_of(paged::paged_attention(&q, &kc, &vc, &bt(&[0, 3]), &cl(6), 0.1))),
        ("`context_lens`", err_of(paged::paged_attention(&q, &kc, &vc, &bt(&[0, 1]), &cl(9), 0.1))),
        ("`value_cache`", err_of(paged::paged_attention(&q, &kc, &vc.narrow(0, 0, 2).unwrap(), &bt(&[0, 1]), &cl(3), 0.1))),
        ("`q`", err_of(paged::paged_attention(&q.to_dtype(DType::F32).unwrap(), &kc, &vc, &bt(&[0, 1]), &cl(3), 0.1))),
        ("`block_tables`", err_of(paged::paged_attention(&q, &kc, &vc, &Tensor::new(&[0f32], &dev).unwrap().unsqueeze(0).unwrap(), &cl(3), 0.1))),
    ];
    for (want, e) in paged_cases {
        assert!(e.contains(want), "expected {want} in: {e}");
    }
    let c72 = on(input(&[nb, bs, hk, 72], DType::F16, 64));
    let e = err_of(paged::paged_attention(&on(input(&[1, 4, 72], DType::F16, 65)), &c72, &c72, &bt(&[0]), &cl(2), 0.1));
    assert!(e.contains("`q`") && e.contains("72"), "{e}");
}

/// The `*_indexed` forms (indices checked once on the host, read by the kernels from the
/// device) give bit for bit what the checked forms give; bad indices are errors when the
/// index is built, and an index used with a cache of another size is an error.
#[test]
fn indexed_forms_equal_the_checked_ones() {
    let (h, hk, d, bs, nb) = (4usize, 2usize, 64usize, 4usize, 6usize);
    let lens = [3usize, 9];
    let dtype = DType::F16;
    let (tables, slots) = layout(&lens, bs, nb, 60);
    let max_blocks = tables.len() / lens.len();
    // One new token per sequence, at its last position (a decode step).
    let step_slots: Vec<i64> = slots.iter().map(|s| *s.last().unwrap()).collect();
    let positions: Vec<u32> = lens.iter().map(|&l| l as u32 - 1).collect();
    let key = input(&[2, hk, d], dtype, 61);
    let value = input(&[2, hk, d], dtype, 62);
    let q = input(&[2, h, d], dtype, 63);
    let ang = Tensor::arange(0u32, 16 * d as u32 / 2, &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().affine(0.01, 0.0).unwrap().reshape((16, d / 2)).unwrap();
    let (cos, sin) = (ang.cos().unwrap().to_dtype(dtype).unwrap(), ang.sin().unwrap().to_dtype(dtype).unwrap());
    let cache0 = input(&[nb, bs, hk, d], dtype, 64);
    for rd in devices() {
        let dev = rd.as_candle();
        let on = |t: &Tensor| t.to_device(&dev).unwrap();
        let (cos, sin, key, value, q) = (on(&cos), on(&sin), on(&key), on(&value), on(&q));
        let run = |indexed: bool| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let (kc, vc) = (on(&cache0).copy().unwrap(), on(&cache0).copy().unwrap());
            let qo = if indexed {
                let ix = paged::CacheIndex::new(&dev, &step_slots, &positions, nb, bs).unwrap();
                paged::rope_and_cache_indexed(&key, &value, &kc, &vc, &ix, &cos, &sin, false, Some(&q)).unwrap().unwrap()
            } else {
                let rope = Rope { cos: &cos, sin: &sin, positions: &Tensor::new(positions.as_slice(), &dev).unwrap(), interleaved: false };
                paged::rope_and_cache(&key, &value, &kc, &vc, &Tensor::new(step_slots.as_slice(), &dev).unwrap(), rope, Some(&q)).unwrap().unwrap()
            };
            let cl: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
            let out = if indexed {
                let ix = paged::DecodeIndex::new(&dev, &tables, &cl, nb, bs).unwrap();
                paged::paged_attention_indexed(&qo, &kc, &vc, &ix, 0.125).unwrap()
            } else {
                let bt = Tensor::from_vec(tables.clone(), (lens.len(), max_blocks), &dev).unwrap();
                paged::paged_attention(&qo, &kc, &vc, &bt, &Tensor::new(cl.as_slice(), &dev).unwrap(), 0.125).unwrap()
            };
            (host(&qo), host(&kc), host(&out))
        };
        let (a, b) = (run(false), run(true));
        assert_eq!(a.0, b.0, "rotated queries on {}", rd.name());
        assert_eq!(a.1, b.1, "key cache on {}", rd.name());
        assert_eq!(a.2, b.2, "attention on {}", rd.name());
        // Errors when built, naming the argument.
        let e = err_of(paged::CacheIndex::new(&dev, &[0, nb as i64 * bs as i64], &[0, 1], nb, bs));
        assert!(e.contains("`slot_mapping`"), "{e}");
        let e = err_of(paged::CacheIndex::new(&dev, &[3, 3], &[0, 1], nb, bs));
        assert!(e.contains("`slot_mapping`"), "{e}");
        let e = err_of(paged::CacheIndex::new(&dev, &[3], &[0, 1], nb, bs));
        assert!(e.contains("`positions`"), "{e}");
        let e = err_of(paged::DecodeIndex::new(&dev, &[0, nb as u32], &[5], nb, bs));
        assert!(e.contains("`block_tables`"), "{e}");
        let e = err_of(paged::DecodeIndex::new(&dev, &[0, 1], &[9], nb, bs));
        assert!(e.contains("`context_lens`"), "{e}");
        // An index checked for another cache size.
        let small = on(&cache0.narrow(0, 0, 2).unwrap()).copy().unwrap();
        let ix = paged::DecodeIndex::new(&dev, &[0, 1], &[5], nb, bs).unwrap();
        let e = err_of(paged::paged_attention_indexed(&q.narrow(0, 0, 1).unwrap(), &small, &small.copy().unwrap(), &ix, 0.1));
        assert!(e.contains("`key_cache`"), "{e}");
        let ix = paged::CacheIndex::new(&dev, &step_slots, &positions, nb, bs).unwrap();
        let e = err_of(paged::rope_and_cache_indexed(&key, &value, &small, &small.copy().unwrap(), &ix, &cos, &sin, false, None));
        assert!(e.contains("`key_cache`"), "{e}");
        // Rope tables shorter than the step's positions.
        let (kc, vc) = (on(&cache0).copy().unwrap(), on(&cache0).copy().unwrap());
        let e = err_of(paged::rope_and_cache_indexed(&key, &value, &kc, &vc, &ix, &cos.narrow(0, 0, 2).unwrap(), &sin, false, None));
        assert!(e.contains("`cos`"), "{e}");
    }
    let e = err_of(paged::CacheIndex::new(&Device::Cpu, &[0], &[0], nb, bs));
    assert!(e.contains("`dev`"), "{e}");
}
