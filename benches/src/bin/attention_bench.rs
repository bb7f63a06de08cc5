//! Attention kernels (`attention::flash_attn` prefill, `attention::paged::host::paged_attention`
//! decode) timed with GPU events, with a spot check of each shape against f64.
//!
//! - Prefill: `q`, `k`, `v [batch, seq, heads, d]` (kv_heads = heads), causal and not,
//!   head dims 64 (32 heads) and 128 (16 heads), `batch * seq` = 8192 tokens (batch 1 from
//!   seq 8192 on). TFLOP/s with FLOPs = `4 * batch * heads * seq_q * seq_k * d`, halved
//!   for causal (the convention of FlashAttention's benchmarks). Where the launcher takes
//!   the Hopper `wgmma` kernel, `tflops_fragments` times the fragment (`mma.sync`) kernel on
//!   the same shape in the same run.
//! - Decode: one query token per sequence, Llama-3-8B heads (32 query, 8 KV, d 128),
//!   block size 16, every sequence `ctx` tokens long, batch 1..64, ctx 1k..32k (pairs
//!   with more than 1M cached tokens left out). GB/s = (K and V bytes of the context +
//!   q + out) / time; `copy_gbps` is a device-to-device copy of 1 GiB in the same run
//!   (read + write bytes over time, as in `elementwise`). Block tables cycle through
//!   copies of the cache region (256 MiB in all at least) so that every call reads K/V
//!   from DRAM, not from the L2 the previous call filled. `gbps` times the public
//!   launcher with its default split (block tables and lengths uploaded each call);
//!   `gbps_device_tables` the same step with the tables already on the device
//!   (`paged_attention_unchecked`, what a serving loop does: built once per step for every
//!   layer); `gbps_legacy_split` the launcher with the split length of the earlier
//!   heuristic (about 1024 work-groups, no occupancy model; key-wave split off), to tell
//!   the split choice's share from the kernel's. `gbps_no_wave_split` and
//!   `gbps_device_tables_no_wave_split` time `gbps`'s and `gbps_device_tables`' calls with
//!   the key-wave split switched off (`set_wave_split(Some(0))`, as
//!   `ATTN_DECODE_WAVE_SPLIT=0`: one wave per 16 query rows, always the merge pass), in the
//!   same run: the A/B of `decode_plan`; `plan` is the plan the default calls take
//!   (`splits x key_waves`, `direct` when no merge pass runs) and `wave_split` the switch's
//!   setting for them. Besides the 8B grid, the engine's shapes: batch 1 and 8, ctx 512 and
//!   2048, 32/8 heads at hd 64 (Llama-3.2-1B) and hd 128 (8B).
//!
//! `attention --graphs [--sweep] [--out DIR]`: the engine's small decode grids (hd 64 and
//! 128, 32/8 heads, batch 1, 2, 4 at ctx 512..4096, batch 16 at 4096) as the engine runs
//! them, launches captured in a graph, the plan before the in-launch merge against the
//! fused one (and with `--sweep` fixed fused plans), with a copy's bandwidth: writes
//! `DIR/decode_graphs.json`.
//!
//! `attention [--out DIR] [--quick] [--only prefill|decode]`: writes `DIR/rust_attention.json`;
//! `--prefill B,H,S,D,CAUSAL` or `--decode B,CTX[,D]` time one shape only (for `ncu`;
//! `D` defaults to 128, 32/8 heads);
//! `python/torch_attention.py` times PyTorch SDPA on the same shapes and
//! `python/report_attention.py` merges both into `report_attention.csv`.
use attention::paged::host::{
    decode_counters, decode_plan, paged_attention, paged_attention_unchecked, paged_attention_unchecked_planned, paged_attention_with_counters, set_fused_merge, set_wave_split, split_len_for, wave_split, DecodePlan,
    PagedShape,
};
use attention::flash::host::{takes_wgmma, with_prefill_kernel, PrefillKernel};
use attention::{flash_attn, FlashElem, FlashOptions, FlashShape};
use benches::{copy_us_with, gbps, gpu_ms, median, uniform, Args};
use half::bf16;
use kernel_dsl::Float;
use kernels::runtime::{Device, DeviceVec};

/// Median time of one call of `f` in microseconds: a few warm-up calls, then 5
/// repetitions of enough calls to take about 30 ms each (at least 3, at most 200).
fn time_us(dev: &Device, mut f: impl FnMut()) -> f64 {
    f();
    let one = gpu_ms(dev, &mut f).max(1e-3);
    f();
    let iters = ((30.0 / one) as usize).clamp(3, 200);
    let mut reps: Vec<f64> = (0..5)
        .map(|_| {
            gpu_ms(dev, || {
                for _ in 0..iters {
                    f();
                }
            }) / iters as f64
                * 1e3
        })
        .collect();
    median(&mut reps)
}

/// The f64 attention of one query row against `keys` (row `t` of `k`/`v` at `t * stride`).
fn reference_row(q: &[f64], k: impl Fn(usize, usize) -> f64, v: impl Fn(usize, usize) -> f64, keys: usize, scale: f64) -> Vec<f64> {
    let d = q.len();
    let s: Vec<f64> = (0..keys).map(|t| scale * (0..d).map(|c| q[c] * k(t, c)).sum::<f64>()).collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
    let mut o = vec![0.0; d];
    for (t, x) in s.iter().enumerate() {
        let p = (x - m).exp() / sum;
        for (c, oc) in o.iter_mut().enumerate() {
            *oc += p * v(t, c);
        }
    }
    o
}

/// Values in [-1, 1], rounded to bf16 and summed over a softmax: outputs differ from f64
/// by the rounding of P (2^-8 relative) and of the output, well under 0.02.
const TOL: f64 = 0.02;

struct Prefill {
    dtype: &'static str,
    causal: bool,
    batch: usize,
    heads: usize,
    seq: usize,
    d: usize,
    us: f64,
    tflops: f64,
    /// The fragment (`mma.sync`) kernel's TFLOP/s in the same run where the launcher took
    /// the `wgmma` kernel (0 elsewhere).
    tflops_fragments: f64,
}

fn prefill<T: FlashElem + Float>(dev: &Device, batch: usize, heads: usize, seq: usize, d: usize, causal: bool) -> Prefill {
    let n = batch * seq * heads * d;
    let (q, k, v) = (uniform::<T>(n, 1, 1.0), uniform::<T>(n, 2, 1.0), uniform::<T>(n, 3, 1.0));
    let (dq, dk, dvv) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    let mut out: DeviceVec<T> = dev.alloc(n).unwrap();
    let mut lse: DeviceVec<f32> = dev.alloc(batch * heads * seq).unwrap();
    let shape = FlashShape { batch, seq_q: seq, seq_k: seq, heads, kv_heads: heads, head_dim: d };
    let scale = 1.0 / (d as f32).sqrt();
    let opts = if causal { FlashOptions::causal(scale) } else { FlashOptions::new(scale) };
    let us = time_us(dev, || flash_attn(dev, shape, &dq, &dk, &dvv, &mut out, &mut lse, &opts).unwrap());
    // Spot check: head 1 of the last sequence, its first, middle and last query rows.
    let got = dev.download(&out).unwrap();
    let (b, h) = (batch - 1, 1);
    let at = |x: &[T], t: usize, c: usize| x[((b * seq + t) * heads + h) * d + c].to_f32() as f64;
    for i in [0, seq / 2, seq - 1] {
        let qi: Vec<f64> = (0..d).map(|c| at(&q, i, c)).collect();
        let keys = if causal { i + 1 } else { seq };
        let want = reference_row(&qi, |t, c| at(&k, t, c), |t, c| at(&v, t, c), keys, scale as f64);
        for (c, w) in want.iter().enumerate() {
            let g = at(&got, i, c);
            assert!((g - w).abs() <= TOL, "prefill {} b{batch} h{heads} s{seq} d{d} causal {causal}: out[{b},{i},{h},{c}] = {g}, want {w}", T::NAME);
        }
    }
    let flops = 4.0 * (batch * heads * seq * seq * d) as f64 / if causal { 2.0 } else { 1.0 };
    let tflops = flops / (us * 1e-6) / 1e12;
    let tflops_fragments = if takes_wgmma(dev, d) {
        let us = with_prefill_kernel(PrefillKernel::Fragments, || time_us(dev, || flash_attn(dev, shape, &dq, &dk, &dvv, &mut out, &mut lse, &opts).unwrap()));
        flops / (us * 1e-6) / 1e12
    } else {
        0.0
    };
    eprintln!(
        "prefill {:<4} causal {causal:<5} b {batch:>2} h {heads:>2} s {seq:>5} d {d:>3} {us:>10.1} us {tflops:>7.1} TFLOP/s (fragment kernel {tflops_fragments:.1})",
        T::NAME
    );
    Prefill { dtype: T::NAME, causal, batch, heads, seq, d, us, tflops, tflops_fragments }
}

struct Decode {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    ctx: usize,
    d: usize,
    block_size: usize,
    bytes: usize,
    us: f64,
    gbps: f64,
    gbps_device_tables: f64,
    gbps_legacy_split: f64,
    gbps_no_wave_split: f64,
    gbps_device_tables_no_wave_split: f64,
    plan: String,
    wave_split: usize,
}

fn decode(dev: &Device, batch: usize, heads: usize, kv_heads: usize, ctx: usize, d: usize, bs: usize) -> Decode {
    type T = bf16;
    let row = kv_heads * d;
    let blocks_per_seq = ctx.div_ceil(bs);
    let used = batch * blocks_per_seq;
    let kv_bytes = 2 * used * bs * row * 2;
    // Copies of the region the block tables name, so that the calls cycle through at least
    // 256 MiB of K/V (each call then reads its blocks from DRAM).
    let copies = benches::COLD_BYTES.div_ceil(kv_bytes).clamp(1, 64);
    let num_blocks = used * copies;
    // One cache with made-up values (the spot check reads them back through the table).
    let kc: Vec<T> = uniform(num_blocks * bs * row, 4, 1.0);
    let vc: Vec<T> = uniform(num_blocks * bs * row, 5, 1.0);
    let q: Vec<T> = uniform(batch * heads * d, 6, 1.0);
    let (dk, dvv, dq) = (dev.upload(&kc).unwrap(), dev.upload(&vc).unwrap(), dev.upload(&q).unwrap());
    // Table copy `c`: sequence `b`'s blocks scattered over region `c` (a fixed stride
    // permutation, so neighbouring logical blocks are not neighbours in memory).
    let stride = (0..).map(|s| 7 + 2 * s).find(|s: &usize| gcd(*s, used) == 1).unwrap();
    let tables: Vec<Vec<u32>> = (0..copies)
        .map(|c| (0..used).map(|i| (c * used + (i * stride) % used) as u32).collect())
        .collect();
    let lens = vec![ctx as u32; batch];
    let mut out: DeviceVec<T> = dev.alloc(batch * heads * d).unwrap();
    let mut lse: DeviceVec<f32> = dev.alloc(batch * heads).unwrap();
    let shape = PagedShape { batch, heads, kv_heads, head_dim: d, num_blocks, block_size: bs };
    let scale = 1.0 / (d as f32).sqrt();
    let mut turn = 0;
    let mut host_tables = |split: Option<usize>| {
        time_us(dev, || {
            turn += 1;
            paged_attention(dev, shape, &dq, &dk, &dvv, &tables[turn % copies], &lens, &mut out, &mut lse, scale, split).unwrap();
        })
    };
    // The default plan, then the same calls with the key-wave split off; the earlier
    // heuristic's split (no occupancy model, key-wave split off).
    let setting = wave_split();
    let plan = decode_plan(dev, shape, ctx, None);
    let us = host_tables(None);
    set_wave_split(Some(0));
    let us_off = host_tables(None);
    let legacy = split_len_for(batch, kv_heads, ctx, None, None);
    let us_legacy = host_tables(Some(legacy));
    set_wave_split(None);
    let dtables: Vec<DeviceVec<u32>> = tables.iter().map(|t| dev.upload(t).unwrap()).collect();
    let dlens = dev.upload(&lens).unwrap();
    let mut device_tables = || {
        time_us(dev, || {
            turn += 1;
            // SAFETY: every table names blocks inside the caches for all `ctx` tokens of each
            // sequence, and every length is `ctx` (what paged_attention checks).
            unsafe {
                paged_attention_unchecked(dev, shape, &dq, &dk, &dvv, &dtables[turn % copies], &dlens, ctx, &mut out, &mut lse, scale, None).unwrap()
            };
        })
    };
    set_wave_split(Some(0));
    let us_dev_off = device_tables();
    set_wave_split(None);
    // Last, so that the spot check below reads the default plan's output.
    let us_dev = device_tables();
    // Spot check of the last call (table `turn % copies`): the last sequence, two heads.
    let got = dev.download(&out).unwrap();
    let table = &tables[turn % copies];
    let b = batch - 1;
    for h in [0, heads - 1] {
        let hk = h / (heads / kv_heads);
        let slot = |t: usize| table[b * blocks_per_seq + t / bs] as usize * bs + t % bs;
        let qi: Vec<f64> = (0..d).map(|c| q[(b * heads + h) * d + c].to_f32() as f64).collect();
        let kv = |x: &[T], t: usize, c: usize| x[slot(t) * row + hk * d + c].to_f32() as f64;
        let want = reference_row(&qi, |t, c| kv(&kc, t, c), |t, c| kv(&vc, t, c), ctx, scale as f64);
        for (c, w) in want.iter().enumerate() {
            let g = got[(b * heads + h) * d + c].to_f32() as f64;
            assert!((g - w).abs() <= TOL, "decode b{batch} ctx{ctx}: out[{b},{h},{c}] = {g}, want {w}");
        }
    }
    let bytes = kv_bytes + 2 * batch * heads * d * 2;
    let gb = |us: f64| gbps(bytes, us);
    let (gbps, gbps_device_tables, gbps_legacy_split) = (gb(us), gb(us_dev), gb(us_legacy));
    let (gbps_no_wave_split, gbps_device_tables_no_wave_split) = (gb(us_off), gb(us_dev_off));
    let plan = format!("{}x{}{}", plan.splits, plan.key_waves, if plan.direct { " direct" } else { "" });
    eprintln!(
        "decode  bf16 b {batch:>2} h {heads}/{kv_heads} ctx {ctx:>5} d {d} bs {bs} {us:>10.1} us {gbps:>7.1} GB/s plan {plan} (switch off {us_off:.1} us {gbps_no_wave_split:.1}; device tables {gbps_device_tables:.1}, off {gbps_device_tables_no_wave_split:.1}; legacy split {legacy}: {gbps_legacy_split:.1})"
    );
    Decode {
        batch,
        heads,
        kv_heads,
        ctx,
        d,
        block_size: bs,
        bytes,
        us,
        gbps,
        gbps_device_tables,
        gbps_legacy_split,
        gbps_no_wave_split,
        gbps_device_tables_no_wave_split,
        plan,
        wave_split: setting,
    }
}

/// The engine's small decode grids as the engine runs them: `calls` launches (one per
/// "layer", each on its own copy of the cache region so that K/V come from DRAM) captured
/// in one graph and replayed; microseconds per launch. `old`: `paged_attention_unchecked`
/// (the engine's call before the fused plan: key waves, one split written directly or the
/// merge launch); `new`: `paged_attention_with_counters` (one counter buffer for every
/// call, as the engine's step). With `sweep`, fused plans of split lengths 64..1024 and
/// 1..8 key waves too (the data `decode_plan`'s constants are set from). Checks the last
/// call's output against f64 and that the counters are back at zero after the replays.
/// Returns JSON rows.
fn decode_graphs(dev: &Device, batch: usize, ctx: usize, d: usize, sweep: bool, copy: f64) -> Vec<String> {
    type T = bf16;
    let (heads, kv_heads, bs) = (32usize, 8usize, 16usize);
    let row = kv_heads * d;
    let blocks_per_seq = ctx.div_ceil(bs);
    let used = batch * blocks_per_seq;
    let kv_bytes = 2 * used * bs * row * 2;
    // About 96 MiB of K/V per replay (more than the L2), 4 to 64 copies of one region.
    let calls = (96usize << 20).div_ceil(kv_bytes).clamp(4, 64);
    let num_blocks = used * calls;
    let kc: Vec<T> = uniform::<T>(used * bs * row, 4, 1.0).repeat(calls);
    let vc: Vec<T> = uniform::<T>(used * bs * row, 5, 1.0).repeat(calls);
    let q: Vec<T> = uniform(batch * heads * d, 6, 1.0);
    let (dk, dvv, dq) = (dev.upload(&kc).unwrap(), dev.upload(&vc).unwrap(), dev.upload(&q).unwrap());
    let stride = (0..).map(|s| 7 + 2 * s).find(|s: &usize| gcd(*s, used) == 1).unwrap();
    let tables: Vec<Vec<u32>> = (0..calls).map(|c| (0..used).map(|i| (c * used + (i * stride) % used) as u32).collect()).collect();
    let dtables: Vec<DeviceVec<u32>> = tables.iter().map(|t| dev.upload(t).unwrap()).collect();
    let lens = vec![ctx as u32; batch];
    let dlens = dev.upload(&lens).unwrap();
    let shape = PagedShape { batch, heads, kv_heads, head_dim: d, num_blocks, block_size: bs };
    let scale = 1.0 / (d as f32).sqrt();
    let counters: DeviceVec<u32> = dev.alloc(decode_counters(shape)).unwrap();
    let mut out: DeviceVec<T> = dev.alloc(batch * heads * d).unwrap();
    let mut lse: DeviceVec<f32> = dev.alloc(batch * heads).unwrap();
    let bytes = kv_bytes + 2 * batch * heads * d * 2;
    // `how`: None old, Some(None) new (its own plan), Some(Some(plan)) a given plan.
    let mut run = |how: Option<Option<DecodePlan>>| -> Option<f64> {
        let mut step = |dev: &Device| -> Result<(), kernels::runtime::LaunchError> {
            for t in &dtables {
                // SAFETY: every table names blocks inside the caches for all `ctx` tokens of
                // each sequence, every length is `ctx`; the counters serve these launches only.
                let r = unsafe {
                    match how {
                        None => paged_attention_unchecked(dev, shape, &dq, &dk, &dvv, t, &dlens, ctx, &mut out, &mut lse, scale, None),
                        Some(None) => paged_attention_with_counters(dev, shape, &dq, &dk, &dvv, t, &dlens, ctx, &mut out, &mut lse, scale, &counters),
                        Some(Some(p)) => paged_attention_unchecked_planned(dev, shape, &dq, &dk, &dvv, t, &dlens, ctx, &mut out, &mut lse, scale, p, Some(&counters)),
                    }
                };
                r.map_err(|e| kernels::runtime::LaunchError::Capture { op: "decode", reason: e.to_string() })?;
            }
            Ok(())
        };
        // Eagerly once (kernels loaded), then captured; a plan the launcher refuses (shared
        // memory) is skipped.
        if let Err(e) = step(dev) {
            eprintln!("  {how:?}: {e}");
            return None;
        }
        let (graph, ()) = dev.capture(|dev| step(dev)).unwrap();
        // Median of 3 repetitions of about 5 ms of replays.
        graph.replay().unwrap();
        let one = gpu_ms(dev, || graph.replay().unwrap()).max(1e-3);
        let iters = ((5.0 / one) as usize).clamp(3, 100);
        let mut reps: Vec<f64> = (0..3)
            .map(|_| {
                gpu_ms(dev, || {
                    for _ in 0..iters {
                        graph.replay().unwrap();
                    }
                }) / iters as f64
                    * 1e3
            })
            .collect();
        let us = median(&mut reps) / calls as f64;
        assert!(dev.download(&counters).unwrap().iter().all(|&c| c == 0), "decode b{batch} ctx{ctx} d{d} {how:?}: counters not reset");
        // The last call's output (table `calls - 1`): the last sequence, two heads.
        let got = dev.download(&out).unwrap();
        let table = &tables[calls - 1];
        let b = batch - 1;
        for h in [0, heads - 1] {
            let hk = h / (heads / kv_heads);
            let slot = |t: usize| table[b * blocks_per_seq + t / bs] as usize * bs + t % bs;
            let qi: Vec<f64> = (0..d).map(|c| q[(b * heads + h) * d + c].to_f32() as f64).collect();
            let kv = |x: &[T], t: usize, c: usize| x[slot(t) * row + hk * d + c].to_f32() as f64;
            let want = reference_row(&qi, |t, c| kv(&kc, t, c), |t, c| kv(&vc, t, c), ctx, scale as f64);
            for (c, w) in want.iter().enumerate() {
                let g = got[(b * heads + h) * d + c].to_f32() as f64;
                assert!((g - w).abs() <= TOL, "decode b{batch} ctx{ctx} d{d} {how:?}: out[{b},{h},{c}] = {g}, want {w}");
            }
        }
        Some(us)
    };
    let fmt = |p: &DecodePlan| format!("{}x{}{}", p.splits, p.key_waves, if p.direct { " direct" } else if p.fused { " fused" } else { "" });
    set_fused_merge(Some(false));
    let old_plan = decode_plan(dev, shape, ctx, None);
    set_fused_merge(Some(true));
    let new_plan = decode_plan(dev, shape, ctx, None);
    set_fused_merge(None);
    let us_old = run(None).expect("the plan before the fused one");
    // The fused plan is opt-in (`ATTN_DECODE_FUSED_MERGE=1`): on for the new calls.
    set_fused_merge(Some(true));
    let us_new = run(Some(None)).expect("the fused plan");
    set_fused_merge(None);
    // The new plan's split and key waves through the merge launch instead (fused against
    // unfused at one split).
    let unfused = DecodePlan { fused: false, direct: new_plan.splits == 1, ..new_plan };
    let us_unfused = run(Some(Some(unfused))).expect("the new plan unfused");
    let row_of = |what: &str, plan: &DecodePlan, us: f64| {
        format!(
            "{{\"kind\":\"decode_graph\",\"what\":\"{what}\",\"batch\":{batch},\"heads\":{heads},\"kv_heads\":{kv_heads},\"seq\":{ctx},\"head_dim\":{d},\"block_size\":{bs},\"calls\":{calls},\"bytes\":{bytes},\"us\":{us:.3},\"gbps\":{:.2},\"plan\":\"{}\",\"split_len\":{},\"copy_gbps\":{copy:.2}}}",
            gbps(bytes, us),
            fmt(plan),
            plan.split_len
        )
    };
    eprintln!(
        "graph decode b {batch:>2} ctx {ctx:>5} d {d:>3}: old {us_old:>7.2} us {:>7.1} GB/s ({}) | new {us_new:>7.2} us {:>7.1} GB/s ({}) | {:.2}x, {:.1}% of copy",
        gbps(bytes, us_old),
        fmt(&old_plan),
        gbps(bytes, us_new),
        fmt(&new_plan),
        us_old / us_new,
        100.0 * gbps(bytes, us_new) / copy
    );
    eprintln!("  new plan unfused ({}): {us_unfused:.2} us", fmt(&unfused));
    let mut rows = vec![row_of("old", &old_plan, us_old), row_of("new", &new_plan, us_new), row_of("new_unfused", &unfused, us_unfused)];
    if sweep {
        for kw in [1usize, 2, 4, 8] {
            for len in [64usize, 128, 256, 512, 1024] {
                if len > ctx || (batch >= 16 && len < 256) {
                    continue;
                }
                let p = DecodePlan { split_len: len, splits: ctx.div_ceil(len), key_waves: kw, direct: false, fused: true };
                let Some(us) = run(Some(Some(p))) else { continue };
                eprintln!("  sweep {:<14} {us:>7.2} us {:>7.1} GB/s", fmt(&p), gbps(bytes, us));
                rows.push(row_of("sweep", &p, us));
            }
        }
    }
    rows
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Device-to-device copy bandwidth of 1 GiB (read + write bytes over time).
fn copy_gbps(dev: &Device) -> f64 {
    let n = 1usize << 30;
    gbps(2 * n, copy_us_with(dev, n, |f| time_us(dev, f)))
}

fn main() {
    let args = Args::from_env();
    let quick = args.quick();
    let only = args.value("--only");
    let Some(dev) = benches::gpu() else { return };
    // One shape only (for ncu): `--prefill B,H,S,D,causal` or `--decode B,CTX`.
    let nums = |v: &str| v.split(',').map(|x| x.parse::<usize>().expect("a number")).collect::<Vec<_>>();
    if let Some(v) = args.value("--prefill").map(nums) {
        prefill::<bf16>(&dev, v[0], v[1], v[2], v[3], v.get(4).is_some_and(|&c| c != 0));
        return;
    }
    // The engine's small grids in captured graphs, old plan against new (and, with
    // `--sweep`, fused plans around the new one): `--graphs` writes `DIR/decode_graphs.json`.
    if args.has("--graphs") {
        let copy = copy_gbps(&dev);
        eprintln!("copy 1 GiB: {copy:.1} GB/s");
        let mut rows = Vec::new();
        let sweep = args.has("--sweep");
        for d in [64, 128] {
            for b in [1, 2, 4] {
                for ctx in [512, 1024, 2048, 4096] {
                    rows.extend(decode_graphs(&dev, b, ctx, d, sweep, copy));
                }
            }
            rows.extend(decode_graphs(&dev, 16, 4096, d, sweep, copy));
        }
        let path = benches::write_json_array(&args.out_dir(), "decode_graphs.json", &rows);
        println!("wrote {path}");
        return;
    }
    if let Some(v) = args.value("--decode").map(nums) {
        decode(&dev, v[0], 32, 8, v[1], v.get(2).copied().unwrap_or(128), 16);
        return;
    }
    let mut pre = Vec::new();
    if only != Some("decode") {
        let seqs: &[usize] = if quick { &[1024, 4096] } else { &[512, 1024, 2048, 4096, 8192, 16384] };
        for &(d, heads) in &[(128, 16), (64, 32)] {
            for causal in [false, true] {
                for &seq in seqs {
                    pre.push(prefill::<bf16>(&dev, (8192 / seq).max(1), heads, seq, d, causal));
                }
            }
        }
    }
    let mut dec = Vec::new();
    let mut copy = 0.0;
    if only != Some("prefill") {
        copy = copy_gbps(&dev);
        eprintln!("copy 1 GiB: {copy:.1} GB/s");
        let batches: &[usize] = if quick { &[1, 16] } else { &[1, 4, 16, 32, 64] };
        let ctxs: &[usize] = if quick { &[1024, 4096] } else { &[1024, 4096, 16384, 32768] };
        for &b in batches {
            for &ctx in ctxs {
                if b * ctx <= 1 << 20 {
                    dec.push(decode(&dev, b, 32, 8, ctx, 128, 16));
                }
            }
        }
        // The engine's decode shapes (1B: hd 64; 8B: hd 128), quick runs included.
        for d in [64, 128] {
            for b in [1, 8] {
                for ctx in [512, 2048] {
                    dec.push(decode(&dev, b, 32, 8, ctx, d, 16));
                }
            }
        }
    }
    let mut rows: Vec<String> = pre
        .iter()
        .map(|p| {
            format!(
                "{{\"kind\":\"prefill\",\"dtype\":\"{}\",\"causal\":{},\"batch\":{},\"heads\":{},\"kv_heads\":{},\"seq\":{},\"head_dim\":{},\"us\":{:.3},\"tflops\":{:.2},\"tflops_fragments\":{:.2}}}",
                p.dtype, p.causal, p.batch, p.heads, p.heads, p.seq, p.d, p.us, p.tflops, p.tflops_fragments
            )
        })
        .collect();
    rows.extend(dec.iter().map(|r| {
        format!(
            "{{\"kind\":\"decode\",\"dtype\":\"bf16\",\"causal\":false,\"batch\":{},\"heads\":{},\"kv_heads\":{},\"seq\":{},\"head_dim\":{},\"block_size\":{},\"bytes\":{},\"us\":{:.3},\"gbps\":{:.2},\"gbps_device_tables\":{:.2},\"gbps_legacy_split\":{:.2},\"gbps_no_wave_split\":{:.2},\"gbps_device_tables_no_wave_split\":{:.2},\"plan\":\"{}\",\"wave_split\":{},\"copy_gbps\":{:.2}}}",
            r.batch,
            r.heads,
            r.kv_heads,
            r.ctx,
            r.d,
            r.block_size,
            r.bytes,
            r.us,
            r.gbps,
            r.gbps_device_tables,
            r.gbps_legacy_split,
            r.gbps_no_wave_split,
            r.gbps_device_tables_no_wave_split,
            r.plan,
            r.wave_split,
            copy
        )
    }));
    let path = benches::write_json_array(&args.out_dir(), "rust_attention.json", &rows);
    println!("wrote {path}");
}
