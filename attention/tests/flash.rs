//! `attention::flash` against a naive f64 `softmax(Q K^T * scale + mask) V` on the CPU
//! executor in every matrix-unit emulation (MFMA at wave 64; WMMA, mma.sync and VALU at
//! wave 32), and on a GPU when this build has one. Where the launcher takes the Hopper
//! `wgmma` kernel (the mma.sync emulation, which emulates `wgmma` too, and sm_90 GPUs) each
//! case also runs on the fragment kernel.
//!
//! Tolerances: q, k, v are rounded to the input type first and the reference takes the
//! rounded values, so what remains is the kernel's own arithmetic: f32 scores (relative
//! error about `head_dim * 2^-24`, negligible after the softmax), the probabilities rounded
//! to the input type before `P V` (relative `u` = 2^-11 for f16, 2^-8 for bf16, on each
//! weight: at most `u * max|v|` on the output, which is a convex combination of v rows),
//! f32 accumulation, and the output rounded once to the input type (`u * |out|`). The
//! bound used is `2u max|v| + u |out| + 1e-5`. The log-sum-exp is f32 throughout:
//! `1e-4 (1 + |lse|)` (hardware `exp2`/`log2` approximations included).
use attention::flash::host::{takes_wgmma, with_prefill_kernel, PrefillKernel};
use attention::flash::HEAD_DIMS;
use attention::{flash_attn, flash_attn_varlen, AttentionError, FlashElem, FlashOptions, FlashShape, VarlenShape};
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, MatrixUnit, WaveSize};
use kernel_runtime::Device;

/// The CPU executor in every matrix-unit mode, plus the GPUs of this build.
mod common;
use common::{executors, inputs, name, Elem};

fn round<T: Elem + FlashElem>(v: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    let back = t.iter().map(|x| x.to_f32() as f64).collect();
    (t, back)
}

/// One attention problem: sequence lengths (fixed or packed) and options.
#[derive(Clone)]
struct Case {
    /// Per sequence (seq_q, seq_k).
    seqs: Vec<(usize, usize)>,
    varlen: bool,
    heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
    causal: bool,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f64>,
    alibi: Option<Vec<f64>>,
}

impl Case {
    fn new(batch: usize, seq_q: usize, seq_k: usize, heads: usize, kv_heads: usize, d: usize) -> Case {
        Case {
            seqs: vec![(seq_q, seq_k); batch],
            varlen: false,
            heads,
            kv_heads,
            d,
            scale: 1.0 / (d as f64).sqrt(),
            causal: false,
            window: (None, None),
            softcap: None,
            alibi: None,
        }
    }
    fn causal(mut self) -> Case {
        self.causal = true;
        self
    }
    fn what(&self) -> String {
        format!(
            "seqs {:?} heads {}/{} d {} causal {} window {:?} softcap {:?} alibi {}",
            self.seqs,
            self.heads,
            self.kv_heads,
            self.d,
            self.causal,
            self.window,
            self.softcap,
            self.alibi.is_some()
        )
    }
    /// Rows of q (and out) and of k before each sequence, and in all.
    fn offsets(&self) -> (Vec<usize>, Vec<usize>) {
        let (mut cq, mut ck) = (vec![0], vec![0]);
        for &(sq, sk) in &self.seqs {
            cq.push(cq.last().unwrap() + sq);
            ck.push(ck.last().unwrap() + sk);
        }
        (cq, ck)
    }
}

/// `(out, lse)` in f64: `out` in q's layout, `lse` in the launcher's layout.
fn reference(c: &Case, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (cq, ck) = c.offsets();
    let (h_n, kv_n, d) = (c.heads, c.kv_heads, c.d);
    let total_q = *cq.last().unwrap();
    let mut out = vec![0.0; total_q * h_n * d];
    let mut lse = vec![0.0; total_q * h_n];
    for (b, &(sq, sk)) in c.seqs.iter().enumerate() {
        let off = sk as i64 - sq as i64;
        for h in 0..h_n {
            let hk = h / (h_n / kv_n);
            let slope = c.alibi.as_ref().map_or(0.0, |a| a[if a.len() == h_n { h } else { b * h_n + h }]);
            for i in 0..sq {
                let qrow = &q[((cq[b] + i) * h_n + h) * d..][..d];
                let diag = i as i64 + off;
                let mut scores: Vec<(usize, f64)> = Vec::new();
                for j in 0..sk {
                    let jj = j as i64;
                    let right = if c.causal { Some(0) } else { c.window.1 };
                    if c.window.0.is_some_and(|w| jj < diag - w as i64) || right.is_some_and(|w| jj > diag + w as i64) {
                        continue;
                    }
                    let krow = &k[((ck[b] + j) * kv_n + hk) * d..][..d];
                    let mut x = c.scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>();
                    if let Some(cap) = c.softcap {
                        x = cap * (x / cap).tanh();
                    }
                    x -= slope * (diag - jj).abs() as f64;
                    scores.push((j, x));
                }
                let lse_at = if c.varlen { h * total_q + cq[b] + i } else { (b * h_n + h) * sq + i };
                let o = &mut out[((cq[b] + i) * h_n + h) * d..][..d];
                if scores.is_empty() {
                    lse[lse_at] = f64::NEG_INFINITY;
                    continue;
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                lse[lse_at] = m + sum.ln();
                for &(j, x) in &scores {
                    let p = (x - m).exp() / sum;
                    let vrow = &v[((ck[b] + j) * kv_n + hk) * d..][..d];
                    for (oo, vv) in o.iter_mut().zip(vrow) {
                        *oo += p * vv;
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Runs `c` on `dev` with inputs of type `T` and compares with [`reference`].
/// [`check_kernel`] with the kernel the launcher picks and, where that is the `wgmma`
/// kernel (the CPU executor's mma.sync mode, Hopper GPUs), also with the fragment kernel.
fn check<T: Elem + FlashElem>(dev: &Device, c: &Case, seed: u64) {
    check_kernel::<T>(dev, c, seed, "");
    if takes_wgmma(dev, c.d) {
        with_prefill_kernel(PrefillKernel::Fragments, || check_kernel::<T>(dev, c, seed, " (fragment kernel)"));
    }
}

fn check_kernel<T: Elem + FlashElem>(dev: &Device, c: &Case, seed: u64, kernel: &str) {
    let (cq, ck) = c.offsets();
    let (total_q, total_k) = (*cq.last().unwrap(), *ck.last().unwrap());
    let (q, q64) = round::<T>(&inputs(total_q * c.heads * c.d, -2.0, 2.0, seed));
    let (k, k64) = round::<T>(&inputs(total_k * c.kv_heads * c.d, -2.0, 2.0, seed + 1));
    let (v, v64) = round::<T>(&inputs(total_k * c.kv_heads * c.d, -1.0, 1.0, seed + 2));
    let (want, want_lse) = reference(c, &q64, &k64, &v64);
    let (dq, dk, dv) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    // Outputs start as NaN: every element must be written.
    let mut dout = dev.upload(&vec![T::from_f64(f64::NAN); q.len()]).unwrap();
    let mut dlse = dev.upload(&vec![f32::NAN; total_q * c.heads]).unwrap();
    let slopes = c.alibi.as_ref().map(|a| dev.upload(&a.iter().map(|&x| x as f32).collect::<Vec<_>>()).unwrap());
    let opts = FlashOptions {
        scale: c.scale as f32,
        causal: c.causal,
        window_left: c.window.0,
        window_right: c.window.1,
        softcap: c.softcap.map(|x| x as f32),
        alibi_slopes: slopes.as_ref(),
    };
    if c.varlen {
        let (cq32, ck32): (Vec<u32>, Vec<u32>) = (cq.iter().map(|&x| x as u32).collect(), ck.iter().map(|&x| x as u32).collect());
        let shape = VarlenShape { heads: c.heads, kv_heads: c.kv_heads, head_dim: c.d };
        flash_attn_varlen(dev, shape, &dq, &dk, &dv, &mut dout, &mut dlse, &cq32, &ck32, &opts).unwrap();
    } else {
        let (sq, sk) = c.seqs[0];
        let shape = FlashShape { batch: c.seqs.len(), seq_q: sq, seq_k: sk, heads: c.heads, kv_heads: c.kv_heads, head_dim: c.d };
        flash_attn(dev, shape, &dq, &dk, &dv, &mut dout, &mut dlse, &opts).unwrap();
    }
    let (got, got_lse) = (dev.download(&dout).unwrap(), dev.download(&dlse).unwrap());
    let what = format!("{} {} on {}{kernel}", T::NAME, c.what(), name(dev));
    let vmax = v64.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.to_f32() as f64;
        let tol = 2.0 * T::U * vmax + T::U * w.abs() + 1e-5;
        assert!((g - w).abs() <= tol, "{what}: out[{i}] (row {}, col {}) = {g}, want {w}", i / c.d, i % c.d);
    }
    for (i, (g, w)) in got_lse.iter().zip(&want_lse).enumerate() {
        let g = *g as f64;
        if w.is_infinite() {
            assert!(g == *w, "{what}: lse[{i}] = {g}, want -inf (row sees no key)");
        } else {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: lse[{i}] = {g}, want {w}");
        }
    }
}

#[test]
fn every_head_dim_in_every_lowering() {
    // Lengths that are no multiple of any tile; two heads sharing a KV head (batches of
    // several sequences are in the other tests).
    for (e, dev) in executors().iter().enumerate() {
        for (n, &d) in HEAD_DIMS.iter().enumerate() {
            let c = Case::new(1, 19, 37, 2, 1, d);
            let c = if (n + e) % 2 == 0 { c.causal() } else { c };
            if (n + e) % 2 == 0 {
                check::<f16>(dev, &c, 10 + n as u64);
            } else {
                check::<bf16>(dev, &c, 10 + n as u64);
            }
        }
    }
}

#[test]
fn causal_aligns_bottom_right_and_masked_rows_are_zero() {
    for dev in executors() {
        // Fewer queries than keys: the last query sees every key.
        check::<f16>(&dev, &Case::new(1, 5, 70, 2, 2, 64).causal(), 1);
        // Decode-like: one query row.
        check::<bf16>(&dev, &Case::new(2, 1, 45, 2, 1, 64).causal(), 2);
        check::<f16>(&dev, &Case::new(1, 1, 33, 1, 1, 128), 3);
        // More queries than keys: the first 65 rows see no key (zeros, lse -inf).
        check::<bf16>(&dev, &Case::new(1, 70, 5, 1, 1, 64).causal(), 4);
    }
}

#[test]
fn grouped_query_ratios_1_4_8() {
    let devs = executors();
    for (r, kv) in [(1usize, 8usize), (4, 2), (8, 1)] {
        for dev in [&devs[0], &devs[2]] {
            check::<f16>(dev, &Case::new(1, 21, 40, 8, kv, 64).causal(), 20 + r as u64);
            check::<bf16>(dev, &Case::new(1, 21, 40, 8, kv, 64), 30 + r as u64);
        }
    }
}

#[test]
fn several_query_blocks_and_key_tiles() {
    let devs = executors();
    // 130 rows: three blocks of 64, the last partial; 150 keys: five tiles of 32.
    check::<f16>(&devs[1], &Case::new(1, 130, 150, 2, 1, 64).causal(), 40);
    check::<bf16>(&devs[0], &Case::new(1, 130, 150, 1, 1, 80), 41);
    // mma.sync: blocks of 128 rows (two row tiles per wave), 64-key tiles, K double- and V
    // single-buffered. 300 rows: blocks of 128, 128, 44; 330 keys: five whole tiles and a
    // partial one. Causal: plain, masking and (for some waves) wholly masked tiles.
    check::<bf16>(&devs[3], &Case::new(1, 300, 330, 2, 1, 128).causal(), 42);
    check::<f16>(&devs[3], &Case::new(2, 200, 256, 2, 2, 64), 43);
}

#[test]
fn sliding_window_softcap_and_alibi() {
    for dev in executors() {
        let mut c = Case::new(1, 50, 61, 2, 1, 64);
        c.window = (Some(9), Some(3));
        check::<f16>(&dev, &c, 50);
        let mut c = Case::new(1, 50, 61, 2, 1, 64).causal();
        c.window = (Some(20), None);
        c.softcap = Some(2.0);
        c.scale = 0.5;
        check::<bf16>(&dev, &c, 51);
        let mut c = Case::new(2, 40, 40, 2, 2, 96);
        c.alibi = Some(vec![0.25, 0.0625, 0.5, 0.125]);
        check::<f16>(&dev, &c, 52);
        let mut c = Case::new(1, 30, 45, 2, 1, 64).causal();
        c.alibi = Some(vec![0.3, 0.1]);
        check::<bf16>(&dev, &c, 53);
    }
}

#[test]
fn variable_length_batches() {
    let devs = executors();
    for (i, dev) in [&devs[0], &devs[1], &devs[3]].into_iter().enumerate() {
        let mut c = Case::new(1, 1, 1, 4, 2, 64).causal();
        // A long sequence, a short one, one without queries and one without keys.
        c.seqs = vec![(70, 75), (3, 9), (0, 5), (4, 0), (1, 17)];
        c.varlen = true;
        if i == 1 {
            c.causal = false;
            check::<bf16>(dev, &c, 61);
        } else {
            check::<f16>(dev, &c, 60);
        }
    }
}

#[test]
fn bad_arguments_are_named_and_nothing_is_written() {
    let dev = Device::cpu(WaveSize::W32);
    let shape = FlashShape { batch: 1, seq_q: 4, seq_k: 6, heads: 4, kv_heads: 2, head_dim: 64 };
    let q = dev.upload(&vec![f16::ONE; 4 * 4 * 64]).unwrap();
    let k = dev.upload(&vec![f16::ONE; 6 * 2 * 64]).unwrap();
    let sentinel = f16::from_f32(7.0);
    let mut out = dev.upload(&vec![sentinel; 4 * 4 * 64]).unwrap();
    let mut lse = dev.upload(&[7.0f32; 16]).unwrap();
    let opts = FlashOptions::causal(0.125);
    let short = dev.upload(&[f16::ONE; 5]).unwrap();
    let mut short_out = dev.upload(&[sentinel; 5]).unwrap();
    let arg_of = |r: Result<(), AttentionError>| match r {
        Err(AttentionError::Argument { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    assert_eq!(arg_of(flash_attn(&dev, shape, &short, &k, &k, &mut out, &mut lse, &opts)), "q");
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &short, &k, &mut out, &mut lse, &opts)), "k");
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &k, &short, &mut out, &mut lse, &opts)), "v");
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &k, &k, &mut short_out, &mut lse, &opts)), "out");
    let mut short_lse = dev.upload(&[7.0f32; 3]).unwrap();
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &k, &k, &mut out, &mut short_lse, &opts)), "lse");
    let bad_heads = FlashShape { kv_heads: 3, ..shape };
    assert_eq!(arg_of(flash_attn(&dev, bad_heads, &q, &k, &k, &mut out, &mut lse, &opts)), "k");
    let bad_d = FlashShape { head_dim: 72, ..shape };
    assert!(matches!(flash_attn(&dev, bad_d, &q, &k, &k, &mut out, &mut lse, &opts), Err(AttentionError::HeadDim(72))));
    let slopes = dev.upload(&[0.5f32; 3]).unwrap();
    let with_alibi = FlashOptions { alibi_slopes: Some(&slopes), ..opts };
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &k, &k, &mut out, &mut lse, &with_alibi)), "alibi_slopes");
    let capped = FlashOptions { softcap: Some(0.0), ..opts };
    assert_eq!(arg_of(flash_attn(&dev, shape, &q, &k, &k, &mut out, &mut lse, &capped)), "softcap");
    let vshape = VarlenShape { heads: 4, kv_heads: 2, head_dim: 64 };
    let r = flash_attn_varlen(&dev, vshape, &q, &k, &k, &mut out, &mut lse, &[0, 3, 2], &[0, 3, 6], &opts);
    assert_eq!(arg_of(r), "cu_seqlens_q");
    let r = flash_attn_varlen(&dev, vshape, &q, &k, &k, &mut out, &mut lse, &[0, 4], &[1, 6], &opts);
    assert_eq!(arg_of(r), "cu_seqlens_k");
    let r = flash_attn_varlen(&dev, vshape, &q, &k, &k, &mut out, &mut lse, &[0, 4], &[0, 5], &opts);
    assert_eq!(arg_of(r), "k");
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == sentinel), "out written on error");
    assert!(dev.download(&lse).unwrap().iter().all(|&x| x == 7.0), "lse written on error");
    // The same arguments with good shapes run.
    flash_attn(&dev, shape, &q, &k, &k, &mut out, &mut lse, &opts).unwrap();
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == f16::ONE));
}

#[test]
fn work_items_in_either_order_agree() {
    // Lanes share the shared-memory tiles between barriers: a race would show as a
    // different result when the CPU executor runs each group's work-items in reverse.
    for wave in [WaveSize::W64, WaveSize::W32] {
        let dev = Device::cpu_with(CpuExecutor::new(wave).with_reversed_items(true));
        check::<f16>(&dev, &Case::new(1, 70, 45, 2, 1, 64).causal(), 70);
    }
    // The wgmma kernel (mma.sync mode): two warpgroups share the stages; three key tiles
    // cycle through both stages.
    let dev = Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync).with_reversed_items(true));
    check::<bf16>(&dev, &Case::new(1, 140, 300, 1, 1, 128).causal(), 71);
}
