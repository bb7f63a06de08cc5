//! `attention::paged` against a naive f64 softmax attention over the gathered cache, on
//! the CPU executor in every matrix-unit emulation (and a GPU when this build has one):
//! shuffled block tables, partly filled last blocks, block sizes 16/32/64, GQA ratios
//! 1/4/8, sequences of different lengths in one launch, several split-KV partitions; the
//! key-wave kernel and its direct (merge-free) writes through explicit plans, the plan
//! heuristic and its run-time switch.
//! Tolerances as in `tests/flash.rs` (inputs rounded first; `P` rounded to the input type
//! before `P V`; f32 accumulation and merge).
use attention::paged::host::{
    decode_plan, decode_plan_with, decode_regs, decode_waves_regs, nvidia_resident, paged_attention, paged_attention_planned, paged_attention_planned_counters, paged_attention_unchecked, paged_attention_with_counters, decode_counters, set_fused_merge, reshape_and_cache_rows, set_wave_split, split_len_for,
    DecodePlan, PagedShape, MIN_SPLIT, SPLIT_OVERHEAD_TILES, TARGET_GROUPS,
};
use attention::paged::{decode_bn, decode_smem_elems};
use kernel_dsl::mma::Lowering;
use attention::flash::BN;
use attention::{AttentionError, FlashElem};
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, WaveSize};
use kernel_dsl::Float;
use kernel_runtime::Device;

mod common;
use common::{executors, name, Elem, Rng};

fn values<T: Elem + FlashElem>(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.uniform(lo, hi))).collect()
}

fn f(x: impl Float) -> f64 {
    x.to_f32() as f64
}

/// A decode step over sequences of `lens` tokens in a cache of shuffled blocks.
#[allow(clippy::too_many_arguments)] // one decode step's whole geometry
fn check<T: Elem + FlashElem>(dev: &Device, lens: &[usize], heads: usize, kv_heads: usize, d: usize, block_size: usize, split_len: Option<usize>, seed: u64) {
    check_plan::<T>(dev, lens, heads, kv_heads, d, block_size, Err(split_len), seed)
}

/// [`check`] with the split length (`Err`: chosen by the launcher unless given) or a whole
/// launch plan (`Ok`: `paged_attention_planned`).
#[allow(clippy::too_many_arguments)]
fn check_plan<T: Elem + FlashElem>(dev: &Device, lens: &[usize], heads: usize, kv_heads: usize, d: usize, block_size: usize, how: Result<DecodePlan, Option<usize>>, seed: u64) {
    check_runs::<T>(dev, lens, (heads, kv_heads, d, block_size), how, None, seed)
}

/// [`check_plan`], run `runs` times in a row on the same `counters` (a fused plan's,
/// `Some((counters, runs))`: every run must match the reference and leave them at zero).
fn check_runs<T: Elem + FlashElem>(dev: &Device, lens: &[usize], (heads, kv_heads, d, block_size): (usize, usize, usize, usize), how: Result<DecodePlan, Option<usize>>, counters: Option<(&kernel_runtime::DeviceVec<u32>, usize)>, seed: u64) {
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
    let shape = PagedShape { batch, heads, kv_heads, head_dim: d, num_blocks, block_size };
    let lens32: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    for run in 0..counters.map_or(1, |c| c.1) {
    let mut out = dev.upload(&vec![T::from_f64(f64::NAN); q.len()]).unwrap();
    let mut lse = dev.upload(&vec![f32::NAN; batch * heads]).unwrap();
    match (how, counters) {
        (Err(split_len), _) => paged_attention(dev, shape, &dq, &dk, &dv, &tables, &lens32, &mut out, &mut lse, scale as f32, split_len).unwrap(),
        (Ok(plan), None) => paged_attention_planned(dev, shape, &dq, &dk, &dv, &tables, &lens32, &mut out, &mut lse, scale as f32, plan).unwrap(),
        (Ok(plan), Some((c, _))) => {
            paged_attention_planned_counters(dev, shape, &dq, &dk, &dv, &tables, &lens32, &mut out, &mut lse, scale as f32, plan, c).unwrap();
            assert!(dev.download(c).unwrap().iter().all(|&x| x == 0), "run {run}: counters left at {:?}", dev.download(c).unwrap());
        }
    }
    let (got, got_lse) = (dev.download(&out).unwrap(), dev.download(&lse).unwrap());
    let what = format!("{} lens {lens:?} heads {heads}/{kv_heads} d {d} block {block_size} {how:?} run {run} on {}", T::NAME, name(dev));
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
}

#[test]
fn paged_decode_in_every_lowering() {
    for (e, dev) in executors().iter().enumerate() {
        // Different lengths (partly filled last blocks, an empty context), several splits.
        check::<f16>(dev, &[37, 1, 100, 0], 4, 1, 64, 16, Some(32), 1 + e as u64);
        check::<bf16>(dev, &[70, 5], 2, 2, 128, 32, None, 2 + e as u64);
        // More splits than one merge step (8 in the fused merge, 16 in the merge pass)
        // takes, the last step partly filled (11 and 20 splits; the short sequence's
        // splits past its context left out).
        check::<f16>(dev, &[340, 40], 4, 2, 64, 16, Some(32), 3 + e as u64);
        check::<bf16>(dev, &[620, 40], 4, 2, 64, 16, Some(32), 4 + e as u64);
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

/// The split heuristic with an occupancy figure: whole rounds of resident work-groups,
/// never a longer modelled time than the earlier fixed target of about
/// [`TARGET_GROUPS`] work-groups, splits of at least [`MIN_SPLIT`] keys (or the whole
/// context), a multiple of the key tile; the caller's choice wins.
#[test]
fn split_heuristic_fills_rounds_of_resident_groups() {
    // (batch, kv_heads, longest context, resident work-groups): the benchmark's H100
    // shapes (132 SMs x 5 or 10 work-groups) and odd ones.
    for (batch, kv, longest, r) in [(16usize, 8usize, 4096usize, 660usize), (16, 8, 16384, 1320), (1, 8, 32768, 1320), (4, 8, 1024, 660), (64, 8, 16384, 1320), (3, 2, 100, 7), (1, 1, 1, 1)] {
        let len = split_len_for(batch, kv, longest, None, Some(r));
        assert!(len.is_multiple_of(BN) && len >= MIN_SPLIT.min(longest.div_ceil(BN) * BN), "b{batch} ctx{longest}: split {len}");
        let cost = |len: usize| {
            let groups = batch * kv * longest.div_ceil(len);
            (groups.div_ceil(r), groups.div_ceil(r) * (len / BN + SPLIT_OVERHEAD_TILES))
        };
        let (rounds, c) = cost(len);
        let legacy = split_len_for(batch, kv, longest, None, None);
        assert!(c <= cost(legacy).1, "b{batch} ctx{longest} r{r}: split {len} costs {c}, the fixed target's {legacy} costs {}", cost(legacy).1);
        // The last round is at least half full unless one round holds the whole grid.
        let groups = batch * kv * longest.div_ceil(len);
        assert!(rounds == 1 || groups * 2 > (2 * rounds - 1) * r, "b{batch} ctx{longest} r{r}: {groups} work-groups in {rounds} rounds of {r}");
    }
    assert_eq!(split_len_for(16, 8, 4096, Some(100), Some(660)), 128);
    assert_eq!(split_len_for(16, 8, 4096, Some(0), None), BN);
    // 16 x 8 groups of 4096 keys in 660 slots: 5 splits of 832 keys fill one round.
    assert_eq!(split_len_for(16, 8, 4096, None, Some(660)), 832);
    // Without an occupancy figure: about TARGET_GROUPS work-groups.
    assert_eq!(split_len_for(16, 8, 4096, None, None), 512);
    assert_eq!(16 * 8 * 4096 / 512, TARGET_GROUPS);
}

/// A plan of `key_waves` key waves over splits of `split_len` keys for contexts of at most
/// `longest` tokens, written directly when there is one split and `direct`.
fn plan(longest: usize, split_len: usize, key_waves: usize, direct: bool) -> DecodePlan {
    let splits = longest.div_ceil(split_len).max(1);
    DecodePlan { split_len, splits, key_waves, direct: direct && splits == 1, fused: false }
}

/// Key waves (each its own online-softmax state over every `w`-th tile, combined in shared
/// memory) and the merge-free single split, in every lowering and wave size: contexts
/// shorter than one tile, not a multiple of it, more waves than tiles, an empty context,
/// one work-group, GQA 1/4/8, two row waves (32 query heads per KV head), several splits
/// through the merge pass; shuffled tables and partly filled last blocks as everywhere.
#[test]
fn paged_key_waves_and_direct_writes() {
    for (e, dev) in executors().iter().enumerate() {
        let seed = 100 + 10 * e as u64;
        // Shorter than one tile, one work-group (one sequence, one KV head), direct.
        check_plan::<f16>(dev, &[5], 4, 1, 64, 16, Ok(plan(5, 32, 2, true)), seed);
        check_plan::<bf16>(dev, &[5], 4, 1, 64, 16, Ok(plan(5, 32, 1, true)), seed + 1);
        // Mixed lengths (an empty context, one key, not a multiple of the tile), direct.
        check_plan::<f16>(dev, &[37, 1, 100, 0], 4, 1, 64, 16, Ok(plan(100, 128, 4, true)), seed + 2);
        // GQA 1, 4 and 8; more key waves than some sequences have tiles.
        check_plan::<bf16>(dev, &[70, 3, 129], 4, 4, 64, 32, Ok(plan(129, 160, 2, true)), seed + 3);
        check_plan::<f16>(dev, &[70, 200], 8, 2, 64, 16, Ok(plan(200, 224, 4, true)), seed + 4);
        check_plan::<bf16>(dev, &[45, 130], 16, 2, 128, 16, Ok(plan(130, 160, 2, true)), seed + 5);
        // Key waves with several splits (the merge pass combines the work-groups).
        check_plan::<f16>(dev, &[340, 40, 0], 8, 2, 64, 16, Ok(plan(340, 96, 2, false)), seed + 6);
        check_plan::<bf16>(dev, &[300, 17], 4, 1, 128, 32, Ok(plan(300, 64, 2, false)), seed + 7);
        // Two row waves (32 query heads of one KV head) with key waves.
        check_plan::<f16>(dev, &[90, 33], 32, 1, 64, 16, Ok(plan(90, 96, 2, true)), seed + 8);
        // One split through the merge pass (the launch with the switch off), and the
        // largest key-wave count that 256 work-items and the shared memory allow.
        check_plan::<bf16>(dev, &[77, 20], 8, 2, 64, 16, Ok(plan(77, 96, 1, false)), seed + 9);
        let low = attention::lowering_of(dev);
        let mut most = 256 / low.wave_lanes() as usize;
        while decode_smem_elems(64, 16, low, most, 2) * 2 > kernel_dsl::host::Executor::max_shared_bytes(dev) {
            most /= 2;
        }
        check_plan::<f16>(dev, &[300, 260], 4, 2, 64, 16, Ok(plan(300, 320, most, true)), seed + 10);
    }
}

/// A fused plan: `split_len`-key splits over contexts of at most `longest`, `key_waves` key
/// waves, merged inside the launch.
fn fused(longest: usize, split_len: usize, key_waves: usize) -> DecodePlan {
    DecodePlan { split_len, splits: longest.div_ceil(split_len).max(1), key_waves, direct: false, fused: true }
}

/// Split-KV with the merge inside the launch (the last split of each sequence and KV head
/// to arrive merges, through atomic counters), in every lowering and both wave sizes:
/// batch 1 to 4, contexts that are no multiple of the block or split size, splits with no
/// keys (a shorter sequence beside a longer one, an empty context), partly filled last
/// blocks in shuffled tables, block sizes 16/32/64, GQA 1/4/8, hd 64 and 128, one and
/// several key waves; each case runs twice on the same counters, which must be back at
/// zero after each run (what a graph replay needs), with the reference matched both times.
#[test]
fn paged_fused_merge() {
    for (e, dev) in executors().iter().enumerate() {
        let seed = 400 + 20 * e as u64;
        let counters = dev.alloc::<u32>(4 * 4).unwrap();
        let c = Some((&counters, 2));
        // Batch 1, GQA 4, hd64, block 16: 5 splits of 64 over 300 keys (the last holds 44).
        check_runs::<f16>(dev, &[300], (8, 2, 64, 16), Ok(fused(300, 64, 2)), c, seed);
        // Batch 2, one context shorter than one split: its other splits hold no keys.
        check_runs::<bf16>(dev, &[203, 50], (4, 1, 128, 32), Ok(fused(203, 64, 1)), c, seed + 1);
        // Batch 3 with an empty context, GQA 1 (4 KV heads), block 64, key waves.
        check_runs::<f16>(dev, &[0, 130, 77], (4, 4, 64, 64), Ok(fused(130, 32, 2)), c, seed + 2);
        // Batch 4, GQA 8, hd128, block 16, more splits than one merge step (8) takes.
        check_runs::<bf16>(dev, &[290, 1, 161, 96], (8, 1, 128, 16), Ok(fused(290, 32, 1)), c, seed + 3);
        // A split length that is no multiple of the block size, one split (fused anyway).
        check_runs::<f16>(dev, &[45, 20], (8, 2, 64, 32), Ok(fused(45, 96, 2)), c, seed + 4);
    }
}

/// Fused plans the launcher refuses (with a direct write, too few counters) name their
/// argument and write nothing.
#[test]
fn paged_fused_bad_inputs_are_named() {
    let dev = Device::cpu(WaveSize::W32);
    let shape = PagedShape { batch: 1, heads: 4, kv_heads: 2, head_dim: 64, num_blocks: 4, block_size: 16 };
    let q = dev.upload(&vec![f16::ONE; 4 * 64]).unwrap();
    let cache = dev.upload(&vec![f16::ONE; 4 * 16 * 2 * 64]).unwrap();
    let mut out = dev.upload(&vec![f16::from_f32(7.0); 4 * 64]).unwrap();
    let mut lse = dev.upload(&[7.0f32; 4]).unwrap();
    let enough = dev.alloc::<u32>(decode_counters(shape)).unwrap();
    let bad = DecodePlan { split_len: 64, splits: 1, key_waves: 1, direct: true, fused: true };
    let r = paged_attention_planned_counters(&dev, shape, &q, &cache, &cache, &[0, 1, 2, 3], &[40], &mut out, &mut lse, 0.1, bad, &enough);
    assert!(matches!(r, Err(AttentionError::Argument { arg: "plan", .. })), "{r:?}");
    let short = dev.alloc::<u32>(decode_counters(shape) - 1).unwrap();
    let r = paged_attention_planned_counters(&dev, shape, &q, &cache, &cache, &[0, 1, 2, 3], &[40], &mut out, &mut lse, 0.1, fused(40, 32, 1), &short);
    assert!(matches!(r, Err(AttentionError::Argument { arg: "counters", .. })), "{r:?}");
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == f16::from_f32(7.0)), "out written on error");
}

/// The launcher with the caller's counters on device tables (what the engine calls inside
/// a captured decode step): the default plan of a small grid on the CPU executor is fused,
/// matches the plain launcher, and leaves the counters at zero, twice.
#[test]
fn paged_with_counters_matches() {
    let dev = Device::cpu(WaveSize::W32);
    let (batch, heads, kv, d, bs) = (2usize, 8usize, 2usize, 64usize, 16usize);
    let lens = [700u32, 333];
    let max_blocks = 44;
    let num_blocks = 2 * max_blocks;
    let mut rng = Rng(77);
    let mut order: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut order);
    let shape = PagedShape { batch, heads, kv_heads: kv, head_dim: d, num_blocks, block_size: bs };
    // The fused plan is opt-in (no other test touches this switch).
    set_fused_merge(Some(true));
    let plan = decode_plan(&dev, shape, 700, None);
    assert!(plan.fused && plan.splits > 1, "{plan:?}");
    let q = dev.upload(&values::<f16>(&mut rng, batch * heads * d, -2.0, 2.0)).unwrap();
    let kc = dev.upload(&values::<f16>(&mut rng, num_blocks * bs * kv * d, -2.0, 2.0)).unwrap();
    let vc = dev.upload(&values::<f16>(&mut rng, num_blocks * bs * kv * d, -1.0, 1.0)).unwrap();
    let (tables, dlens) = (dev.upload(&order).unwrap(), dev.upload(&lens).unwrap());
    let mut want = dev.alloc::<f16>(batch * heads * d).unwrap();
    let mut want_lse = dev.alloc::<f32>(batch * heads).unwrap();
    paged_attention_planned(&dev, shape, &q, &kc, &vc, &order, &lens, &mut want, &mut want_lse, 0.125, DecodePlan { split_len: 704, splits: 1, key_waves: 1, direct: true, fused: false }).unwrap();
    let counters = dev.alloc::<u32>(decode_counters(shape)).unwrap();
    for run in 0..2 {
        let mut out = dev.alloc::<f16>(batch * heads * d).unwrap();
        let mut lse = dev.alloc::<f32>(batch * heads).unwrap();
        // SAFETY: every context fits its row of 44 blocks, all inside the cache.
        unsafe { paged_attention_with_counters(&dev, shape, &q, &kc, &vc, &tables, &dlens, 700, &mut out, &mut lse, 0.125, &counters) }.unwrap();
        assert!(dev.download(&counters).unwrap().iter().all(|&x| x == 0), "run {run}");
        let (got, w) = (dev.download(&out).unwrap(), dev.download(&want).unwrap());
        for (i, (g, w)) in got.iter().zip(&w).enumerate() {
            // Both f32-accumulated; they differ in summation order and P's rounding per split.
            assert!((g.to_f32() - w.to_f32()).abs() <= 2.0 / 2048.0 + w.to_f32().abs() / 1024.0, "run {run}: out[{i}] = {g}, want {w}");
        }
        let (gl, wl) = (dev.download(&lse).unwrap(), dev.download(&want_lse).unwrap());
        for (g, w) in gl.iter().zip(&wl) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "run {run}: lse {g}, want {w}");
        }
    }
    set_fused_merge(None);
}

/// Key waves and direct writes at the other head dimensions (value chunks on VALU, WMMA and
/// hd256 on `mma.sync`).
#[test]
fn paged_key_waves_head_dims() {
    let devs = executors();
    for (i, d) in [80usize, 96, 256].into_iter().enumerate() {
        for (j, dev) in devs.iter().enumerate() {
            let seed = 200 + 10 * i as u64 + j as u64;
            check_plan::<bf16>(dev, &[33, 70], 8, 2, d, 16, Ok(plan(70, 96, 2, true)), seed);
        }
        check_plan::<f16>(&devs[3], &[100, 9], 4, 2, d, 16, Ok(plan(100, 64, 2, false)), 250 + i as u64);
    }
}

/// Plans the launcher refuses name `plan` and write nothing.
#[test]
fn paged_bad_plans_are_named() {
    let dev = Device::cpu(WaveSize::W32);
    let shape = PagedShape { batch: 1, heads: 4, kv_heads: 2, head_dim: 64, num_blocks: 4, block_size: 16 };
    let q = dev.upload(&vec![f16::ONE; 4 * 64]).unwrap();
    let cache = dev.upload(&vec![f16::ONE; 4 * 16 * 2 * 64]).unwrap();
    let mut out = dev.upload(&vec![f16::from_f32(7.0); 4 * 64]).unwrap();
    let mut lse = dev.upload(&[7.0f32; 4]).unwrap();
    for bad in [
        DecodePlan { split_len: 32, splits: 2, key_waves: 1, direct: true, fused: false },
        DecodePlan { split_len: 32, splits: 1, key_waves: 1, direct: false, fused: false },
        DecodePlan { split_len: 64, splits: 1, key_waves: 0, direct: true, fused: false },
        DecodePlan { split_len: 64, splits: 1, key_waves: 16, direct: true, fused: false },
        DecodePlan { split_len: 0, splits: 1, key_waves: 1, direct: true, fused: false },
    ] {
        let r = paged_attention_planned(&dev, shape, &q, &cache, &cache, &[0, 1, 2, 3], &[40], &mut out, &mut lse, 0.1, bad);
        assert!(matches!(r, Err(AttentionError::Argument { arg: "plan", .. })), "{bad:?}: {r:?}");
    }
    assert!(dev.download(&out).unwrap().iter().all(|&x| x == f16::from_f32(7.0)), "out written on error");
}

/// The plan heuristic on an H200-like device (132 SMs, 227 KiB of shared memory per
/// work-group, `mma.sync`): the engine's small grids (batch 1 and 8, contexts 512 and 2048,
/// 8 KV heads of 4 query heads, hd64 and hd128) take key waves, one split and no merge
/// where a sequence fits one work-group; large grids keep today's split and one wave per
/// 16 rows; switched off, every shape gets today's plan; every plan's shared memory fits.
#[test]
fn plans_for_small_and_large_grids() {
    let (sms, smem) = (132usize, 227 * 1024usize);
    let low = Lowering::MmaSync;
    let shape = |batch: usize, d: usize| PagedShape { batch, heads: 32, kv_heads: 8, head_dim: d, num_blocks: 1, block_size: 16 };
    for (batch, d, ctx) in [(1usize, 64usize, 512usize), (1, 64, 530), (8, 64, 512), (1, 64, 2048), (8, 64, 2048), (1, 128, 512), (8, 128, 512), (1, 128, 2048), (8, 128, 2048), (16, 128, 4096), (64, 128, 16384), (16, 64, 4096)] {
        let resident = move |bytes: usize, waves: usize, kw: bool| Some(nvidia_resident(sms, smem, if kw { decode_waves_regs(d) } else { decode_regs(d) }, bytes, waves));
        let on = decode_plan_with(shape(batch, d), ctx, None, low, smem, 1, false, &resident);
        let off = decode_plan_with(shape(batch, d), ctx, None, low, smem, 0, false, &resident);
        eprintln!("b{batch} hd{d} ctx{ctx}: off {off:?} grid {}x8x{batch} of {} lanes; on {on:?} grid {}x8x{batch} of {} lanes", off.splits, 32, on.splits, 32 * on.key_waves);
        // Off: today's split (split_len_for with the one-wave work-group's occupancy).
        let today = split_len_for(batch, 8, ctx, None, Some(nvidia_resident(sms, smem, decode_regs(d), decode_smem_elems(d, 16, low, 1, 0) * 2, 1)));
        assert_eq!(off, DecodePlan { split_len: today, splits: ctx.div_ceil(today), key_waves: 1, direct: false, fused: false }, "b{batch} hd{d} ctx{ctx}");
        assert!(on.splits == ctx.div_ceil(on.split_len) && (!on.direct || on.splits == 1), "b{batch} hd{d} ctx{ctx}: {on:?}");
        let combine = if on.key_waves > 1 || on.direct { 4 } else { 0 };
        assert!(decode_smem_elems(d, 16, low, on.key_waves, combine) * 2 <= smem, "b{batch} hd{d} ctx{ctx}: {on:?}");
        let grid = batch * 8 * off.splits;
        if grid * 4 >= nvidia_resident(sms, smem, decode_regs(d), decode_smem_elems(d, 16, low, 1, 0) * 2, 1) {
            // A grid that fills the device keeps today's split.
            assert_eq!((on.split_len, on.key_waves), (off.split_len, 1), "b{batch} hd{d} ctx{ctx}");
        } else {
            assert!(on.key_waves > 1, "b{batch} hd{d} ctx{ctx}: {on:?}");
        }
        // A capped setting caps the key waves.
        let capped = decode_plan_with(shape(batch, d), ctx, None, low, smem, 2, false, &resident);
        assert!(capped.key_waves <= 2, "{capped:?}");
    }
    // The engine's batch-1 and batch-8 steps at context 512 need no merge.
    for (batch, d) in [(1, 64), (8, 64), (1, 128), (8, 128)] {
        let resident = move |bytes: usize, waves: usize, kw: bool| Some(nvidia_resident(sms, smem, if kw { decode_waves_regs(d) } else { decode_regs(d) }, bytes, waves));
        let on = decode_plan_with(shape(batch, d), 512, None, low, smem, 1, false, &resident);
        assert!(on.direct && on.key_waves > 1, "b{batch} hd{d}: {on:?}");
        // Each key wave walks at most 4 tiles (today: 8 tiles per work-group, then the merge).
        assert!(512usize.div_ceil(on.key_waves * decode_bn(low)) <= 4, "b{batch} hd{d}: {on:?}");
    }
    // A shape whose key waves would not fit the shared memory takes fewer.
    let resident = |bytes: usize, waves: usize, kw: bool| Some(nvidia_resident(sms, 48 * 1024, if kw { decode_waves_regs(128) } else { decode_regs(128) }, bytes, waves));
    let small = decode_plan_with(shape(1, 128), 512, None, low, 48 * 1024, 1, false, &resident);
    assert!(decode_smem_elems(128, 16, low, small.key_waves, 4) * 2 <= 48 * 1024 && small.key_waves >= 1, "{small:?}");
}

/// The fused plan on an H200-like device: the engine's batch-1 grids (contexts 512 to
/// 4096, hd64 and hd128) merge inside the launch, at 512 over more waves than the plan
/// without it (one split written directly); large grids (batch 16 at
/// 4096, 64 at 16384) keep the plan without it; every small-grid plan's shared memory fits.
#[test]
fn fused_plans_for_small_grids() {
    let (sms, smem) = (132usize, 227 * 1024usize);
    let low = Lowering::MmaSync;
    let shape = |batch: usize, d: usize| PagedShape { batch, heads: 32, kv_heads: 8, head_dim: d, num_blocks: 1, block_size: 16 };
    for d in [64usize, 128] {
        let resident = move |bytes: usize, waves: usize, kw: bool| Some(nvidia_resident(sms, smem, if kw { decode_waves_regs(d) } else { decode_regs(d) }, bytes, waves));
        for batch in [1usize, 2, 4] {
            for ctx in [512usize, 1024, 2048, 4096] {
                let old = decode_plan_with(shape(batch, d), ctx, None, low, smem, 1, false, &resident);
                let new = decode_plan_with(shape(batch, d), ctx, None, low, smem, 1, true, &resident);
                eprintln!("b{batch} hd{d} ctx{ctx}: old {old:?} new {new:?}");
                assert!(new.splits == ctx.div_ceil(new.split_len) && !(new.fused && new.direct), "{new:?}");
                assert!(decode_smem_elems(d, 16, low, new.key_waves, 4) * 2 <= smem, "{new:?}");
                if batch == 1 {
                    // Merged in place; at 512 (where the plan without it writes one split
                    // directly) over more waves.
                    let (n, o) = (new.splits * new.key_waves, old.splits * old.key_waves);
                    assert!(new.fused && (ctx > 512 || n > o), "b{batch} hd{d} ctx{ctx}: old {old:?} new {new:?}");
                }
            }
        }
        for (batch, ctx) in [(16usize, 4096usize), (64, 16384)] {
            let old = decode_plan_with(shape(batch, d), ctx, None, low, smem, 1, false, &resident);
            let new = decode_plan_with(shape(batch, d), ctx, None, low, smem, 1, true, &resident);
            assert_eq!(new, old, "b{batch} hd{d} ctx{ctx}");
        }
    }
}

/// The run-time switch: off, the launcher's plan is today's (one wave per 16 rows, the
/// merge pass), and results agree with the reference either way.
#[test]
fn wave_split_switch() {
    let dev = Device::cpu(WaveSize::W32);
    let shape = PagedShape { batch: 1, heads: 32, kv_heads: 8, head_dim: 64, num_blocks: 40, block_size: 16 };
    set_wave_split(Some(0));
    let off = decode_plan(&dev, shape, 512, None);
    set_wave_split(Some(1));
    let on = decode_plan(&dev, shape, 512, None);
    set_wave_split(None);
    assert_eq!((off.key_waves, off.direct), (1, false), "{off:?}");
    assert_eq!(off.split_len, split_len_for(1, 8, 512, None, None));
    assert!(on.direct && on.key_waves > 1, "{on:?}");
}
