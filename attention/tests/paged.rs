//! `attention::paged` against a naive f64 softmax attention over the gathered cache, on
//! the CPU executor in every matrix-unit emulation (and a GPU when this build has one):
//! shuffled block tables, partly filled last blocks, block sizes 16/32/64, GQA ratios
//! 1/4/8, sequences of different lengths in one launch, several split-KV partitions, the
//! merge fused into the decode launch (one split, one and many splits in one launch, the
//! counters reused across launches and left at zero, the counter electing the merger).
//! Tolerances as in `tests/flash.rs` (inputs rounded first; `P` rounded to the input type
//! before `P V`; f32 accumulation and merge).
use attention::paged::host::{
    merge_rounds, paged_attention, paged_attention_unchecked, reshape_and_cache_rows, split_cost, split_len_for, target_split_len, PagedShape, MERGE_OVERHEAD_TILES, MIN_SPLIT,
    SPLIT_OVERHEAD_TILES, TARGET_GROUPS,
};
use attention::paged::MERGE_STEP;
use attention::flash::BN;
use attention::{AttentionError, FlashElem};
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, WaveSize};
use kernel_dsl::Float;
use kernel_runtime::Device;

mod common;
use common::{executors, name};

/// Deterministic values in `[lo, hi)` and a permutation source.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() as f64 / (1u64 << 53) as f64)
    }
    fn shuffle<X>(&mut self, v: &mut [X]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

trait Elem: FlashElem + Float + std::fmt::Debug + PartialEq {
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

fn values<T: Elem>(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.uniform(lo, hi))).collect()
}

fn f(x: impl Float) -> f64 {
    x.to_f32() as f64
}

/// A decode step over sequences of `lens` tokens in a cache of shuffled blocks.
#[allow(clippy::too_many_arguments)] // one decode step's whole geometry
fn check<T: Elem>(dev: &Device, lens: &[usize], heads: usize, kv_heads: usize, d: usize, block_size: usize, split_len: Option<usize>, seed: u64) {
    let mut rng = Rng(seed);
    let batch = lens.len();
    let max_blocks = lens.iter().map(|l| l.div_ceil(block_size)).max().unwrap().max(1) + 1;
    // Blocks of all sequences plus a few unused ones, in shuffled order.
    let used: usize = lens.iter().map(|l| l.div_ceil(block_size)).sum();
    let num_blocks = used + 3;
    let mut order: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut order);
    let mut tables = vec![0u32; batch * max_blocks];
    let mut next = 0;
    for (b, &l) in lens.iter().enumerate() {
        for i in 0..l.div_ceil(block_size) {
            tables[b * max_blocks + i] = order[next];
            next += 1;
        }
        // Entries past the context name an out-of-range block: never read.
        for i in l.div_ceil(block_size)..max_blocks {
            tables[b * max_blocks + i] = u32::MAX;
        }
    }
    let row = kv_heads * d;
    let kc: Vec<T> = values(&mut rng, num_blocks * block_size * row, -2.0, 2.0);
    let vc: Vec<T> = values(&mut rng, num_blocks * block_size * row, -1.0, 1.0);
    let q: Vec<T> = values(&mut rng, batch * heads * d, -2.0, 2.0);
    let scale = 1.0 / (d as f64).sqrt();
    // Reference over the gathered cache.
    let mut want = vec![0.0f64; batch * heads * d];
    let mut want_lse = vec![f64::NEG_INFINITY; batch * heads];
    for (b, &l) in lens.iter().enumerate() {
        let slot = |t: usize| tables[b * max_blocks + t / block_size] as usize * block_size + t % block_size;
        for h in 0..heads {
            let hk = h / (heads / kv_heads);
            if l == 0 {
                continue;
            }
            let s: Vec<f64> = (0..l)
                .map(|t| scale * (0..d).map(|c| f(q[(b * heads + h) * d + c]) * f(kc[slot(t) * row + hk * d + c])).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
            want_lse[b * heads + h] = m + sum.ln();
            for (t, x) in s.iter().enumerate() {
                let p = (x - m).exp() / sum;
                for c in 0..d {
                    want[(b * heads + h) * d + c] += p * f(vc[slot(t) * row + hk * d + c]);
                }
            }
        }
    }
    let (dq, dk, dv) = (dev.upload(&q).unwrap(), dev.upload(&kc).unwrap(), dev.upload(&vc).unwrap());
    let mut out = dev.upload(&vec![T::from_f64(f64::NAN); q.len()]).unwrap();
    let mut lse = dev.upload(&vec![f32::NAN; batch * heads]).unwrap();
    let shape = PagedShape { batch, heads, kv_heads, head_dim: d, num_blocks, block_size };
    let lens32: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    paged_attention(dev, shape, &dq, &dk, &dv, &tables, &lens32, &mut out, &mut lse, scale as f32, split_len).unwrap();
    let (got, got_lse) = (dev.download(&out).unwrap(), dev.download(&lse).unwrap());
    let what = format!("{} lens {lens:?} heads {heads}/{kv_heads} d {d} block {block_size} split {split_len:?} on {}", T::NAME, name(dev));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = 2.0 * T::U + T::U * w.abs() + 1e-5;
        assert!((f(*g) - w).abs() <= tol, "{what}: out[{i}] = {}, want {w}", f(*g));
    }
    for (i, (g, w)) in got_lse.iter().zip(&want_lse).enumerate() {
        let g = *g as f64;
        if w.is_infinite() {
            assert!(g == *w, "{what}: lse[{i}] = {g}, want -inf");
        } else {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: lse[{i}] = {g}, want {w}");
        }
    }
}

#[test]
fn paged_decode_in_every_lowering() {
    for (e, dev) in executors().iter().enumerate() {
        // Different lengths (partly filled last blocks, an empty context), several splits.
        check::<f16>(dev, &[37, 1, 100, 0], 4, 1, 64, 16, Some(32), 1 + e as u64);
        check::<bf16>(dev, &[70, 5], 2, 2, 128, 32, None, 2 + e as u64);
        // More splits than one merge step (8) takes, the last step partly filled (11).
        check::<f16>(dev, &[340, 40], 4, 2, 64, 16, Some(32), 3 + e as u64);
    }
}

#[test]
fn paged_block_sizes_and_gqa_ratios() {
    let devs = executors();
    // 12: a block size that is no power of two (the slot lookup divides instead of shifting).
    for (i, (bs, heads, kv)) in [(16usize, 8usize, 8usize), (32, 8, 2), (64, 8, 1), (16, 32, 1), (12, 8, 2)].into_iter().enumerate() {
        let dev = &devs[i % devs.len()];
        check::<f16>(dev, &[45, 130, 3], heads, kv, 64, bs, Some(64), 10 + i as u64);
    }
}

#[test]
fn paged_head_dims() {
    let devs = executors();
    for (i, d) in [80usize, 96, 256].into_iter().enumerate() {
        check::<bf16>(&devs[i % 2], &[33, 9], 4, 2, d, 16, Some(32), 20 + i as u64);
        // `mma.sync` (16-key tiles; hd256 in one 128-column value chunk of two).
        check::<bf16>(&devs[3], &[40, 17], 8, 2, d, 16, Some(32), 30 + i as u64);
    }
}

#[test]
fn reshape_and_cache_writes_slots_and_then_decode_reads_them() {
    for dev in executors().into_iter().take(2) {
        let (kv_heads, d, block_size, num_blocks) = (2usize, 64usize, 16usize, 5usize);
        let row = kv_heads * d;
        let mut rng = Rng(7);
        let kc: Vec<f16> = values(&mut rng, num_blocks * block_size * row, -1.0, 1.0);
        let vc: Vec<f16> = values(&mut rng, num_blocks * block_size * row, -1.0, 1.0);
        let k_new: Vec<f16> = values(&mut rng, 3 * row, -1.0, 1.0);
        let v_new: Vec<f16> = values(&mut rng, 3 * row, -1.0, 1.0);
        let slots = [3 * 16 + 5, -1, 16 + 15];
        let (mut dkc, mut dvc) = (dev.upload(&kc).unwrap(), dev.upload(&vc).unwrap());
        let (dkn, dvn) = (dev.upload(&k_new).unwrap(), dev.upload(&v_new).unwrap());
        reshape_and_cache_rows(&dev, row, &dkn, &dvn, &mut dkc, &mut dvc, &slots).unwrap();
        let (gk, gv) = (dev.download(&dkc).unwrap(), dev.download(&dvc).unwrap());
        let (mut wk, mut wv) = (kc.clone(), vc.clone());
        for (t, &s) in slots.iter().enumerate() {
            if s >= 0 {
                wk[s as usize * row..][..row].copy_from_slice(&k_new[t * row..][..row]);
                wv[s as usize * row..][..row].copy_from_slice(&v_new[t * row..][..row]);
            }
        }
        assert!(gk == wk && gv == wv, "reshape_and_cache on {}", name(&dev));
        // Errors name the argument and write nothing.
        let r = reshape_and_cache_rows(&dev, row, &dkn, &dvn, &mut dkc, &mut dvc, &[0, 1, (num_blocks * block_size) as i64]);
        assert!(matches!(r, Err(AttentionError::Argument { arg: "slot_mapping", .. })), "{r:?}");
        let r = reshape_and_cache_rows(&dev, row, &dkn, &dvn, &mut dkc, &mut dvc, &[0, 0, 1]);
        assert!(matches!(r, Err(AttentionError::Argument { arg: "slot_mapping", .. })), "{r:?}");
        assert!(dev.download(&dkc).unwrap() == gk, "k_cache written on error");
    }
}

#[test]
fn paged_bad_arguments_are_named() {
    let dev = Device::cpu(WaveSize::W32);
    let shape = PagedShape { batch: 2, heads: 4, kv_heads: 2, head_dim: 64, num_blocks: 4, block_size: 16 };
    let q = dev.upload(&vec![f16::ONE; 2 * 4 * 64]).unwrap();
    let cache = dev.upload(&vec![f16::ONE; 4 * 16 * 2 * 64]).unwrap();
    let mut out = dev.upload(&vec![f16::from_f32(7.0); 2 * 4 * 64]).unwrap();
    let mut lse = dev.upload(&[7.0f32; 8]).unwrap();
    let arg_of = |r: Result<(), AttentionError>| match r {
        Err(AttentionError::Argument { arg, .. }) => arg,
        other => panic!("expected an argument error, got {other:?}"),
    };
    let tables = [0u32, 1, 2, 3];
    assert_eq!(arg_of(paged_attention(&dev, shape, &q, &cache, &cache, &tables, &[33, 3], &mut out, &mut lse, 0.1, None)), "context_lens");
    assert_eq!(arg_of(paged_attention(&dev, shape, &q, &cache, &cache, &[0, 9, 2, 3], &[20, 3], &mut out, &mut lse, 0.1, None)), "block_tables");
    assert_eq!(arg_of(paged_attention(&dev, shape, &q, &q, &cache, &tables, &[20, 3], &mut out, &mut lse, 0.1, None)), "k_cache");
    assert_eq!(arg_of(paged_attention(&dev, shape, &q, &cache, &cache, &tables, &[20], &mut out, &mut lse, 0.1, None)), "context_lens");
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == f16::from_f32(7.0)), "out written on error");
    paged_attention(&dev, shape, &q, &cache, &cache, &tables, &[20, 3], &mut out, &mut lse, 0.1, None).unwrap();
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == f16::ONE));
}

#[test]
fn paged_work_items_in_either_order_agree() {
    for wave in [WaveSize::W64, WaveSize::W32] {
        let dev = Device::cpu_with(CpuExecutor::new(wave).with_reversed_items(true));
        check::<bf16>(&dev, &[50, 7], 8, 2, 64, 16, Some(32), 80);
    }
}

/// The launcher with the tables and lengths already on the device (the kernels then read
/// them from separate buffers, the host launcher from one upload) gives the same bits.
#[test]
fn device_tables_match_host_tables() {
    for dev in executors().into_iter().take(2) {
        let (lens, heads, kv, d, bs) = ([45u32, 130, 3], 8usize, 2usize, 64usize, 16usize);
        let max_blocks = 10;
        let num_blocks = 3 * max_blocks;
        let mut rng = Rng(90);
        let mut order: Vec<u32> = (0..num_blocks as u32).collect();
        rng.shuffle(&mut order);
        let shape = PagedShape { batch: lens.len(), heads, kv_heads: kv, head_dim: d, num_blocks, block_size: bs };
        let cache = |rng: &mut Rng| dev.upload(&values::<f16>(rng, num_blocks * bs * kv * d, -1.0, 1.0)).unwrap();
        let (kc, vc) = (cache(&mut rng), cache(&mut rng));
        let q = dev.upload(&values::<f16>(&mut rng, lens.len() * heads * d, -1.0, 1.0)).unwrap();
        let run = |device_tables: bool| {
            let mut out = dev.upload(&vec![f16::NAN; lens.len() * heads * d]).unwrap();
            let mut lse = dev.upload(&vec![f32::NAN; lens.len() * heads]).unwrap();
            if device_tables {
                let (t, l) = (dev.upload(&order).unwrap(), dev.upload(&lens).unwrap());
                // SAFETY: every row names blocks inside the caches for its whole length.
                unsafe { paged_attention_unchecked(&dev, shape, &q, &kc, &vc, &t, &l, 130, &mut out, &mut lse, 0.125, Some(32)).unwrap() };
            } else {
                paged_attention(&dev, shape, &q, &kc, &vc, &order, &lens, &mut out, &mut lse, 0.125, Some(32)).unwrap();
            }
            (dev.download(&out).unwrap(), dev.download(&lse).unwrap())
        };
        let (host, device) = (run(false), run(true));
        assert!(host.0.iter().all(|x| x.is_finite()) && host.1.iter().all(|x| x.is_finite()), "{}", name(&dev));
        assert!(host.0 == device.0 && host.1 == device.1, "host and device tables differ on {}", name(&dev));
    }
}

/// The split heuristic: the split count that minimises the documented model (rounds of
/// resident work-groups times each one's tiles plus overhead, plus the fused merge's tail
/// for more than one split), computed here independently and checked against every split
/// length the heuristic may take; splits of at least [`MIN_SPLIT`] keys (or the whole
/// context), a multiple of the key tile; the caller's choice wins.
#[test]
fn split_heuristic_weighs_rounds_and_the_fused_merge() {
    let cost = |groups: usize, longest: usize, len: usize, r: usize, mr: usize| {
        let splits = longest.div_ceil(len);
        let merge = if splits > 1 { MERGE_OVERHEAD_TILES + splits.div_ceil(MERGE_STEP) * mr } else { 0 };
        (groups * splits).div_ceil(r) * (len / BN + SPLIT_OVERHEAD_TILES) + merge
    };
    // (batch, kv_heads, longest context, resident work-groups, merge rounds): the
    // benchmark's H100 shapes (132 SMs x 5 or 10 work-groups; hd128, 4 query heads per KV
    // head on one warp), the 1B engine step (hd64, 16 per SM) and odd ones.
    let shapes = [
        (16usize, 8usize, 4096usize, 660usize, 4usize),
        (16, 8, 16384, 1320, 4),
        (1, 8, 32768, 1320, 4),
        (4, 8, 1024, 660, 4),
        (64, 8, 16384, 1320, 4),
        (1, 8, 512, 2112, merge_rounds(4, 64, 32)),
        (3, 2, 100, 7, 1),
        (1, 1, 1, 1, 1),
    ];
    for (batch, kv, longest, r, mr) in shapes {
        let len = split_len_for(batch, kv, longest, None, Some(r), mr);
        let whole = longest.div_ceil(BN) * BN;
        assert!(len.is_multiple_of(BN) && len >= MIN_SPLIT.min(whole), "b{batch} ctx{longest}: split {len}");
        let mine = cost(batch * kv, longest, len, r, mr);
        for other in (BN..=whole).step_by(BN).filter(|&l| l >= MIN_SPLIT.min(whole)) {
            let c = cost(batch * kv, longest, other, r, mr);
            assert!(mine <= c, "b{batch} ctx{longest} r{r}: split {len} models {mine}, split {other} {c}");
        }
        assert_eq!(split_cost(batch * kv, longest, len, r, mr), mine);
        // Never worse than the fixed target of about TARGET_GROUPS work-groups.
        assert!(mine <= cost(batch * kv, longest, target_split_len(batch, kv, longest), r, mr));
    }
    assert_eq!(merge_rounds(4, 64, 32), 2);
    assert_eq!(merge_rounds(8, 128, 64), 4);
    assert_eq!(split_len_for(16, 8, 4096, Some(100), Some(660), 4), 128);
    assert_eq!(split_len_for(16, 8, 4096, Some(0), None, 4), BN);
    // 16 x 8 groups of 4096 keys in 660 slots: 5 splits of 832 keys fill one round.
    assert_eq!(split_len_for(16, 8, 4096, None, Some(660), 4), 832);
    // The 1B engine step at batch 1 (8 KV heads, context 512): 8 splits of 64 keys.
    assert_eq!(split_len_for(1, 8, 512, None, Some(2112), 2), 64);
    // A context shorter than MIN_SPLIT is one split.
    assert_eq!(split_len_for(3, 2, 40, None, None, 1), 64);
    // Without an occupancy figure: TARGET_GROUPS resident work-groups.
    assert_eq!(split_len_for(16, 8, 4096, None, None, 2), 512);
    assert_eq!(target_split_len(16, 8, 4096), 512);
    assert_eq!(16 * 8 * 4096 / 512, TARGET_GROUPS);
}

/// Launches with one split (the chosen split covers every context, or the caller's does):
/// each work-group writes its rows and log-sum-exps itself, with no workspace and no merge;
/// an empty context gives zeros and `-inf`. Every lowering (waves 64 and 32).
#[test]
fn paged_single_split_writes_the_output_itself() {
    // The chosen split covers a context shorter than MIN_SPLIT whole.
    assert!(split_len_for(2, 2, 40, None, None, 1) >= 40);
    for (e, dev) in executors().iter().enumerate() {
        check::<bf16>(dev, &[40, 17], 8, 2, 64, 16, None, 40 + e as u64);
        check::<f16>(dev, &[200, 3, 0], 4, 1, 128, 32, Some(256), 45 + e as u64);
    }
}

/// One launch of many splits with sequences of one split (written directly), of several
/// (merged by the last work-group of each (sequence, KV head)) and an empty one, in every
/// lowering: 11 splits of 64 keys for contexts of 700 (11 splits, two merge steps), 129
/// (3), 65 (2), 64 and 5 (1) and 0; then the launcher's own split for contexts up to 600.
#[test]
fn paged_fused_merge_with_one_and_many_splits_in_one_batch() {
    for (e, dev) in executors().iter().enumerate() {
        check::<f16>(dev, &[700, 5, 0, 129, 64, 65], 8, 2, 64, 16, Some(64), 50 + e as u64);
        check::<bf16>(dev, &[600, 3, 0, 300], 4, 2, 128, 16, None, 55 + e as u64);
    }
}

/// The counters a device keeps for the fused merge serve launch after launch: a small
/// shape, a larger one (more (sequence, KV head) pairs: the counters grow), the small one
/// again and the larger one again, each against the reference, at waves 64 and 32.
#[test]
fn paged_merge_counters_are_reused_across_launches() {
    for dev in executors().into_iter().take(2) {
        for round in 0..2u64 {
            check::<f16>(&dev, &[150, 70], 4, 1, 64, 16, Some(32), 60 + round);
            check::<f16>(&dev, &[90, 260, 33, 0], 8, 4, 64, 16, Some(32), 62 + round);
        }
    }
}

mod direct {
    //! `paged_decode` launched directly on counters the test holds.
    use super::*;
    use attention::flash::{value_chunks, Hd64};
    use attention::paged::{decode_smem_elems, paged_decode};
    use kernel_dsl::host::{ArgValue, KernelArgSlice, LaunchConfig};
    use kernel_dsl::prelude::AtomicU32;
    use kernel_dsl::Dim3;
    use kernel_runtime::DeviceVec;

    /// A `u32` buffer offered to the kernel as its atomics (the same bits).
    struct Atomics(ArgValue);
    impl KernelArgSlice<AtomicU32> for Atomics {
        fn kernel_arg(&self) -> ArgValue {
            self.0
        }
    }

    const HEADS: usize = 8;
    const KV: usize = 2;
    const D: usize = 64;
    const BS: usize = 16;
    const SPLIT: usize = 32;
    const LENS: [u32; 4] = [300, 20, 0, 97];

    struct Case {
        shape: PagedShape,
        q: DeviceVec<f16>,
        k: DeviceVec<f16>,
        v: DeviceVec<f16>,
        tables: Vec<u32>,
        max_blocks: usize,
    }

    fn case(dev: &Device) -> Case {
        let mut rng = Rng(70);
        let max_blocks = 300usize.div_ceil(BS);
        let num_blocks = LENS.len() * max_blocks;
        let mut tables: Vec<u32> = (0..num_blocks as u32).collect();
        rng.shuffle(&mut tables);
        let shape = PagedShape { batch: LENS.len(), heads: HEADS, kv_heads: KV, head_dim: D, num_blocks, block_size: BS };
        let cache = |rng: &mut Rng| dev.upload(&values::<f16>(rng, num_blocks * BS * KV * D, -2.0, 2.0)).unwrap();
        let (k, v) = (cache(&mut rng), cache(&mut rng));
        let q = dev.upload(&values::<f16>(&mut rng, LENS.len() * HEADS * D, -2.0, 2.0)).unwrap();
        Case { shape, q, k, v, tables, max_blocks }
    }

    /// One launch of the kernel on `counters` with the launcher's geometry for split
    /// length SPLIT (its workspace NaN first): the output and the log-sum-exps.
    fn launch(dev: &Device, c: &Case, counters: &DeviceVec<u32>) -> (Vec<f16>, Vec<f32>) {
        let low = attention::lowering_of(dev);
        let splits = 300usize.div_ceil(SPLIT);
        let waves = (HEADS / KV).div_ceil(16);
        let (tables, lens) = (dev.upload(&c.tables).unwrap(), dev.upload(&LENS).unwrap());
        let mut part = dev.upload(&vec![f32::NAN; LENS.len() * HEADS * splits * (D + 2)]).unwrap();
        let mut out = dev.upload(&vec![f16::NAN; LENS.len() * HEADS * D]).unwrap();
        let mut lse = dev.upload(&vec![f32::NAN; LENS.len() * HEADS]).unwrap();
        let cfg = LaunchConfig::new(Dim3::new(splits as u32, (KV * value_chunks(D, low)) as u32, LENS.len() as u32), Dim3::x(waves as u32 * low.wave_lanes()))
            .with_dynamic_shared(decode_smem_elems(D, waves * 16, low));
        let atomics = Atomics(counters.kernel_arg());
        paged_decode::launch::<f16, Hd64>(dev, cfg, &c.q, &c.k, &c.v, &tables, &lens, &mut part, &atomics, &mut out, &mut lse,
            HEADS as u32, KV as u32, BS as u32, c.max_blocks as u32, SPLIT as u32, 0, 0.125).unwrap();
        (dev.download(&out).unwrap(), dev.download(&lse).unwrap())
    }

    /// Exactly one work-group of each (sequence, KV head) merges, whatever order the
    /// work-groups run in (several OS threads, work-items in either order, waves 64 and
    /// 32): the counters are zero after each of two launches on the same buffer, and both
    /// give the bits of the public launcher with the same split.
    #[test]
    fn fused_merge_leaves_its_counters_at_zero() {
        for (wave, reversed) in [(WaveSize::W64, false), (WaveSize::W32, true), (WaveSize::W32, false)] {
            let dev = Device::cpu_with(CpuExecutor::new(wave).with_threads(4).with_reversed_items(reversed));
            let c = case(&dev);
            let (mut out, mut lse) = (dev.alloc::<f16>(LENS.len() * HEADS * D).unwrap(), dev.alloc::<f32>(LENS.len() * HEADS).unwrap());
            paged_attention(&dev, c.shape, &c.q, &c.k, &c.v, &c.tables[..LENS.len() * c.max_blocks], &LENS, &mut out, &mut lse, 0.125, Some(SPLIT)).unwrap();
            let want = (dev.download(&out).unwrap(), dev.download(&lse).unwrap());
            assert!(want.0.iter().all(|x| x.is_finite()), "{}", name(&dev));
            let counters = dev.alloc::<u32>(LENS.len() * KV).unwrap();
            for launch_no in 0..2 {
                let got = launch(&dev, &c, &counters);
                assert!(got.0 == want.0 && got.1 == want.1, "launch {launch_no} on {}: not the launcher's bits", name(&dev));
                assert!(dev.download(&counters).unwrap().iter().all(|&n| n == 0), "launch {launch_no} on {}: counters left non-zero", name(&dev));
            }
        }
    }

    /// The merge is elected by the counter: one left one short of its total by an earlier
    /// launch makes the first work-group of that (sequence, KV head) merge partials not
    /// yet written (NaN here) and no later one merge, while every other row is unchanged.
    #[test]
    fn a_counter_not_at_zero_breaks_its_rows_only() {
        let dev = Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_threads(1));
        let c = case(&dev);
        let clean = launch(&dev, &c, &dev.alloc::<u32>(LENS.len() * KV).unwrap());
        // Sequence 0, KV head 0: 300 keys in 10 splits, each in every value chunk.
        let arrivals = 300usize.div_ceil(SPLIT) * value_chunks(D, attention::lowering_of(&dev));
        let mut start = vec![0u32; LENS.len() * KV];
        start[0] = arrivals as u32 - 1;
        let counters = dev.upload(&start).unwrap();
        let got = launch(&dev, &c, &counters);
        let group = HEADS / KV;
        for (i, (g, w)) in got.0.iter().zip(&clean.0).enumerate() {
            if i < group * D {
                assert!(g.is_nan(), "out[{i}] = {g}: merged without every split");
            } else {
                assert_eq!(g.to_bits(), w.to_bits(), "out[{i}]");
            }
        }
        assert_eq!(dev.download(&counters).unwrap()[0], arrivals as u32 - 1);
    }
}
