//! The checked launchers of [`paged_decode`](fn@super::paged_decode) with its merge pass, and
//! of [`reshape_and_cache`](fn@super::reshape_and_cache). Block tables, context lengths and
//! slot mappings are host slices: they are validated (every slot inside the cache) and
//! uploaded, so an error writes nothing and the kernels never index out of range.
use super::{decode_bn, decode_smem_elems, paged_decode, paged_decode_fused, paged_decode_waves, paged_merge, reshape_and_cache, MAX_GROUP, MERGE_STEP, MODE_DIRECT, MODE_FUSED, MODE_PARTS};
use crate::flash::{value_chunks, Hd128, Hd256, Hd64, Hd80, Hd96, HeadDim, BN, HEAD_DIMS};
use crate::{AttentionError, FlashElem};
use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, LaunchConfig, ScalarArg};
use kernel_dsl::prelude::AtomicU32;
use kernel_dsl::mma::Lowering;
use kernel_dsl::{Dim3, Element};
use kernel_runtime::{Device, DeviceVec};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Sizes of a paged decode step: `q [batch, heads, head_dim]` against caches
/// `[num_blocks, block_size, kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedShape {
    /// Sequences (one query token each).
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`, at most [`MAX_GROUP`] query heads each).
    pub kv_heads: usize,
    /// Head dimension: 64, 80, 96, 128 or 256.
    pub head_dim: usize,
    /// Blocks in each cache.
    pub num_blocks: usize,
    /// Tokens per block (any positive size; 16, 32 and 64 are the usual ones).
    pub block_size: usize,
}

fn arg(arg: &'static str, reason: impl Into<String>) -> AttentionError {
    AttentionError::Argument { arg, reason: reason.into() }
}

fn len_is(name: &'static str, have: usize, want: usize) -> Result<(), AttentionError> {
    if have != want {
        return Err(arg(name, format!("has {have} elements; the shape needs {want}")));
    }
    Ok(())
}

fn product(name: &'static str, xs: &[usize]) -> Result<usize, AttentionError> {
    xs.iter().try_fold(1usize, |a, &x| a.checked_mul(x)).ok_or_else(|| arg(name, "size overflows usize"))
}

/// Work-groups a decode launch aims for when it chooses the split length and cannot tell
/// how many the device holds at once (AMD, the CPU executor): about eight per compute unit
/// of a large GPU (132 on the H100), so that each one's copies keep enough bytes in flight
/// for DRAM bandwidth (a work-group is one wave for up to 16 query heads per KV head).
pub const TARGET_GROUPS: usize = 1024;

/// Shortest split the heuristic makes, in keys: shorter ones cost more in the merge pass
/// (each writes `heads / kv_heads` f32 rows of `head_dim`) and per-split setup than their
/// parallelism gains.
pub const MIN_SPLIT: usize = 128;

/// Fixed cost of one work-group in key tiles, for [`split_len_for`]'s cost model: the
/// first tile's DRAM latency (nothing overlaps it), the block-table checks and the
/// workspace writes.
pub const SPLIT_OVERHEAD_TILES: usize = 2;

/// Keys per split: the caller's choice, or one chosen from the shape, a multiple of the
/// key tile and at least [`MIN_SPLIT`] keys unless the context is shorter.
///
/// With `resident = Some(r)` (work-groups the device runs at once), the split count `s`
/// minimises `ceil(batch * kv_heads * s / r) * (tiles per split + `[`SPLIT_OVERHEAD_TILES`]`)`:
/// the rounds of resident work-groups times each one's length, so the grid fills whole
/// rounds (a last round that fills half the device runs at about half the bandwidth: the
/// kernel is latency-bound per work-group). Without it, enough splits for about
/// [`TARGET_GROUPS`] work-groups.
pub fn split_len_for(batch: usize, kv_heads: usize, longest: usize, chosen: Option<usize>, resident: Option<usize>) -> usize {
    let round = |len: usize| len.max(1).div_ceil(BN) * BN;
    if let Some(s) = chosen {
        return round(s);
    }
    let groups = (batch * kv_heads).max(1);
    let most = longest.div_ceil(MIN_SPLIT).max(1);
    match resident {
        Some(r) if r > 0 => {
            let mut best = (usize::MAX, round(longest));
            for s in 1..=most {
                let len = round(longest.div_ceil(s));
                let splits = longest.div_ceil(len).max(1);
                let cost = (groups * splits).div_ceil(r) * (len / BN + SPLIT_OVERHEAD_TILES);
                if cost < best.0 {
                    best = (cost, len);
                }
            }
            best.1
        }
        _ => {
            let splits = TARGET_GROUPS.div_ceil(groups).clamp(1, most);
            round(longest.div_ceil(splits))
        }
    }
}

/// Modelled cost of the merge pass in key tiles (of [`decode_bn`] keys), for
/// [`decode_plan`]'s small grids: a second launch and its tail (H200 profile of the 1B
/// decode step at batch 1, context ~512: merge 7.3 us against 15.6 us for the decode's 8
/// tiles plus [`SPLIT_OVERHEAD_TILES`], about 1.5 us per tile).
pub const MERGE_TILES: usize = 4;

/// Modelled cost in key tiles of combining a work-group's key waves in shared memory (a
/// barrier and the f32 round trip through shared memory).
pub const COMBINE_TILES: usize = 1;

/// Most key waves [`decode_plan`] gives a work-group (with at most 16 query heads per KV
/// head: 8 waves of 32 lanes, the kernel's 256 work-items).
pub const MAX_KEY_WAVES: usize = 8;

/// How a [`paged_decode`](fn@super::paged_decode) launch divides its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePlan {
    /// Keys per split-KV partition.
    pub split_len: usize,
    /// Splits (grid x): `ceil(longest context / split_len)`, at least 1.
    pub splits: usize,
    /// Key waves per 16 query rows: each takes every `key_waves`-th tile of the split.
    pub key_waves: usize,
    /// The decode work-groups write the output and log-sum-exp themselves (one split; no
    /// merge launch).
    pub direct: bool,
    /// Several splits merged inside the decode launch (the last split of each sequence and
    /// KV head to finish merges, through the caller's counters; no merge launch).
    pub fused: bool,
}

/// The run-time switch: 0 unread, else 1 + the most key waves (1 + 0: off).
static WAVE_SPLIT: AtomicUsize = AtomicUsize::new(0);

/// The key-wave split and the merge-free single split of small decode grids
/// ([`decode_plan`]): `0` turns them off (every launch as before them: one wave per 16 query
/// rows, the merge pass always), `n >= 2` allows at most `n` key waves, `1` (the default)
/// any number. Read once from `ATTN_DECODE_WAVE_SPLIT` unless [`set_wave_split`] set it.
pub fn wave_split() -> usize {
    let v = WAVE_SPLIT.load(Ordering::Relaxed);
    if v != 0 {
        return v - 1;
    }
    let v = match std::env::var("ATTN_DECODE_WAVE_SPLIT").ok().and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(0) => 0,
        Some(n) if n >= 2 => n,
        _ => 1,
    };
    WAVE_SPLIT.store(v + 1, Ordering::Relaxed);
    v
}

/// Sets [`wave_split`] for the whole process (for A/B runs in one process); `None` reads
/// `ATTN_DECODE_WAVE_SPLIT` again at the next launch.
pub fn set_wave_split(setting: Option<usize>) {
    WAVE_SPLIT.store(setting.map_or(0, |n| n + 1), Ordering::Relaxed);
}

/// The run-time switch of the in-launch merge: 0 unread, 1 off, 2 on.
static FUSED_MERGE: AtomicUsize = AtomicUsize::new(0);

/// Whether [`decode_plan`] may merge several splits inside the decode launch
/// ([`DecodePlan::fused`], [`MODE_FUSED`]) where the launch has
/// counters: off unless `ATTN_DECODE_FUSED_MERGE=1` (read once) or [`set_fused_merge`]
/// says otherwise. Off by default because the H200 measurement (session v,
/// `benches/results/h200-2026-11-27v/decode/`) has the same split 0.2 to 1.1 us faster
/// through the merge launch inside a captured graph than merged in place (the fence, the
/// counter and the merging work-group's reads form a longer chain than the launch
/// boundary). Off, small grids take the plan before it (key waves, one split written
/// directly or the merge launch).
pub fn fused_merge() -> bool {
    match FUSED_MERGE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var("ATTN_DECODE_FUSED_MERGE").map(|s| s.trim() == "1").unwrap_or(false);
            FUSED_MERGE.store(1 + on as usize, Ordering::Relaxed);
            on
        }
    }
}

/// Sets [`fused_merge`] for the whole process (A/B runs in one process); `None` reads
/// `ATTN_DECODE_FUSED_MERGE` again at the next launch.
pub fn set_fused_merge(setting: Option<bool>) {
    FUSED_MERGE.store(setting.map_or(0, |on| 1 + on as usize), Ordering::Relaxed);
}

/// Head dimensions of [`paged_decode_fused`](fn@super::paged_decode_fused) (the engine's
/// models); other head dimensions take the plans without the in-launch merge.
pub const FUSED_HEAD_DIMS: [usize; 2] = [64, 128];

/// Shortest split of a fused plan, in keys: with no merge launch to pay for, short splits
/// spread a short context over more work-groups (each split still costs its workspace rows
/// and a share of the merging work-group's reads).
pub const FUSED_MIN_SPLIT: usize = 64;

/// Modelled cost in key tiles of the in-launch merge of `splits` splits: the counter's
/// round trip and the merging work-group's reads of the workspace (from L2), [`MERGE_STEP`]
/// splits per round trip.
pub const fn fused_merge_tiles(splits: usize) -> usize {
    1 + splits.div_ceil(MERGE_STEP) / 2
}

/// Counters a fused decode launch over `shape` uses: one per (sequence, KV head). The
/// buffer passed to [`paged_attention_with_counters`] must hold at least this many, all
/// zero before the first launch (the launches leave them at zero).
pub fn decode_counters(shape: PagedShape) -> usize {
    shape.batch * shape.kv_heads
}

/// The key waves a work-group of `row_waves` row waves can take: at most 256 work-items.
fn key_waves_most(low: Lowering, row_waves: usize) -> usize {
    (256 / (row_waves * low.wave_lanes() as usize)).clamp(1, MAX_KEY_WAVES)
}

/// The plan of a decode launch over `shape` with contexts of at most `longest` tokens
/// (`split_len`: the caller's split length, else chosen).
///
/// Large grids keep [`split_len_for`]'s split with one wave per 16 query rows (a sequence
/// the split covers whole skips the merge). A grid of fewer work-groups than a quarter of
/// what the device holds at once ([`TARGET_GROUPS`] where that is unknown) leaves most of
/// the GPU idle, each work-group walking its tiles one after another: there the split
/// count `s` and key waves `w` (powers of two whose shared memory fits the device)
/// minimise the modelled time `rounds * (ceil(split / (w * tile)) + `[`SPLIT_OVERHEAD_TILES`]
/// ` + `[`COMBINE_TILES`]` if w > 1) + `[`MERGE_TILES`]` if s > 1` (ties: fewer splits, then
/// fewer waves). With [`wave_split`] off: [`split_len_for`]'s split, one wave per 16 rows,
/// always the merge (the launch before this plan).
///
/// With [`fused_merge`] on (off by default; and counters, which every launcher but the counter-less
/// [`paged_attention_unchecked`] has), small grids may also take several splits merged in
/// the same launch: modelled as the same rounds plus [`COMBINE_TILES`] and
/// [`fused_merge_tiles`] instead of [`MERGE_TILES`], with splits down to
/// [`FUSED_MIN_SPLIT`] keys.
pub fn decode_plan(dev: &Device, shape: PagedShape, longest: usize, split_len: Option<usize>) -> DecodePlan {
    plan_on(dev, shape, longest, split_len, fused_merge())
}

fn plan_on(dev: &Device, shape: PagedShape, longest: usize, split_len: Option<usize>, fused: bool) -> DecodePlan {
    let low = crate::lowering_of(dev);
    let resident = |smem: usize, waves: usize, key_waves: bool| resident_estimate(dev, low, shape.head_dim, smem, waves, key_waves);
    decode_plan_with(shape, longest, split_len, low, dev.max_shared_bytes(), wave_split(), fused, &resident)
}

/// [`decode_plan`] for a device described by its lowering, its shared memory per
/// work-group, `resident(shared bytes, waves, key-wave kernel)` (work-groups of that size
/// of [`paged_decode`](fn@super::paged_decode), or of
/// [`paged_decode_waves`](fn@super::paged_decode_waves) when the flag is set, it holds at
/// once, `None` if unknown; see [`nvidia_resident`]), the [`wave_split`] setting `cap` and
/// whether the launch may merge in place (`fused`: [`fused_merge`] and counters).
#[allow(clippy::too_many_arguments)]
pub fn decode_plan_with(
    shape: PagedShape,
    longest: usize,
    split_len: Option<usize>,
    low: Lowering,
    max_shared: usize,
    cap: usize,
    fused: bool,
    resident_of: &dyn Fn(usize, usize, bool) -> Option<usize>,
) -> DecodePlan {
    let PagedShape { batch, heads, kv_heads, head_dim: d, .. } = shape;
    let group = (heads / kv_heads.max(1)).max(1);
    let row_waves = group.div_ceil(16);
    let rows = row_waves * 16;
    // Element size: both instances are 16-bit.
    let size = 2;
    let smem_of = |kw: usize, combine: bool| decode_smem_elems(d, rows, low, kw, if combine { group } else { 0 }) * size;
    let resident = resident_of(smem_of(1, false), row_waves, false);
    let len0 = split_len_for(batch, kv_heads, longest, split_len, resident);
    let splits_of = |len: usize| longest.div_ceil(len.max(1)).max(1);
    let today = DecodePlan { split_len: len0, splits: splits_of(len0), key_waves: 1, direct: false, fused: false };
    if cap == 0 {
        return today;
    }
    let fits = |kw: usize| smem_of(kw, true) <= max_shared;
    let pairs = (batch * kv_heads).max(1);
    let r = resident.filter(|&r| r > 0).unwrap_or(TARGET_GROUPS);
    if pairs * today.splits * row_waves * 4 >= r {
        return DecodePlan { direct: today.splits == 1 && fits(1), ..today };
    }
    let bn = decode_bn(low);
    let most_waves = key_waves_most(low, row_waves).min(if cap == 1 { usize::MAX } else { cap });
    let round = |len: usize| len.max(1).div_ceil(BN) * BN;
    let fused = fused && FUSED_HEAD_DIMS.contains(&d);
    let shortest = if fused { FUSED_MIN_SPLIT } else { MIN_SPLIT };
    let mut lens: Vec<usize> = match split_len {
        Some(_) => vec![len0],
        None => (1..=longest.div_ceil(shortest).max(1)).map(|s| round(longest.div_ceil(s))).collect(),
    };
    lens.dedup();
    let mut best = (usize::MAX, usize::MAX, usize::MAX, today);
    let mut kw = 1;
    while kw <= most_waves && fits(kw) {
        for &len in &lens {
            let splits = splits_of(len);
            // Several splits merged in this launch, or through the merge launch (splits
            // of at least MIN_SPLIT keys).
            for in_launch in [false, true] {
                let skip = if in_launch { splits == 1 || !fused } else { splits > 1 && len < MIN_SPLIT && split_len.is_none() };
                if skip {
                    continue;
                }
                // One wave per 16 rows through the merge launch: the one-wave kernel.
                let one = kw == 1 && splits > 1 && !in_launch;
                let rk = resident_of(smem_of(kw, !one), row_waves * kw, !one).unwrap_or(TARGET_GROUPS / kw).max(1);
                let per_group = len.div_ceil(kw * bn) + SPLIT_OVERHEAD_TILES + if !one && (kw > 1 || in_launch) { COMBINE_TILES } else { 0 };
                let merge = match (splits > 1, in_launch) {
                    (false, _) => 0,
                    (true, true) => fused_merge_tiles(splits),
                    (true, false) => MERGE_TILES,
                };
                let cost = (pairs * splits).div_ceil(rk) * per_group + merge;
                if (cost, splits, kw) < (best.0, best.1, best.2) {
                    best = (cost, splits, kw, DecodePlan { split_len: len, splits, key_waves: kw, direct: splits == 1, fused: in_launch });
                }
            }
        }
        kw *= 2;
    }
    best.3
}

/// Work-groups of [`paged_decode`](fn@super::paged_decode) (`waves` waves, `smem` bytes of
/// shared memory, head dimension `d`) an NVIDIA sm_80+ device holds at once, estimated
/// from its SMs, its shared memory per SM (the opt-in per-block limit plus the 1 KiB the
/// driver reserves per work-group), the registers of [`decode_regs`], at most 32
/// work-groups and 48 warps per SM (sm_86/sm_89; sm_80/sm_90 hold 64); `None` elsewhere
/// (AMD's occupancy rules differ; the CPU executor has no such number). An estimate on the
/// low side costs a partly filled round; one on the high side a second, mostly empty one.
fn resident_estimate(dev: &Device, low: Lowering, d: usize, smem: usize, waves: usize, key_waves: bool) -> Option<usize> {
    if low != Lowering::MmaSync {
        return None;
    }
    let regs = if key_waves { decode_waves_regs(d) } else { decode_regs(d) };
    Some(nvidia_resident(dev.compute_units()? as usize, dev.max_shared_bytes(), regs, smem, waves))
}

/// `resident_estimate` of an NVIDIA sm_80+ device of `sms` SMs and `max_shared` bytes of
/// opt-in shared memory per work-group: work-groups of `waves` waves, `regs` registers per
/// work-item ([`decode_regs`], [`decode_waves_regs`]) and `smem` bytes it holds at once.
pub fn nvidia_resident(sms: usize, max_shared: usize, regs: usize, smem: usize, waves: usize) -> usize {
    let by_smem = (max_shared + 1024) / (smem + 1024);
    // Registers are allocated per warp in units of 256.
    let per_warp = (regs * 32).div_ceil(256) * 256;
    let by_regs = 65536 / (per_warp * waves);
    sms * by_smem.min(by_regs).min(32).min(48 / waves).max(1)
}

/// Registers per work-item `resident_estimate` assumes for the `MmaSync` instance of
/// head dimension `d`: the most `ptxas -arch=sm_90a` of CUDA 13.0 (the compiler the CUDA 13.0
/// driver JIT-compiles our PTX with) gives the f16 and bf16 instances (hd64 123, hd80 123,
/// hd96 120, hd128 167, hd256 166), rounded up to the allocation unit of 8. On the low
/// side the estimate would put the grid's last work-groups in a second round; shared
/// memory bounds hd128 at 10 work-groups per H100/H200 SM before registers do.
pub const fn decode_regs(d: usize) -> usize {
    match d {
        0..=64 => 128,
        65..=80 => 128,
        81..=96 => 120,
        _ => 168,
    }
}

/// [`decode_regs`] for [`paged_decode_waves`](fn@super::paged_decode_waves): `ptxas
/// -arch=sm_90a` of CUDA 13.0 gives hd64 166, hd80 175, hd96 178, hd128 232, hd256 178
/// (the key-wave bookkeeping, the output and lse pointers and the combine), rounded up to
/// 8. At 8 key waves of hd128 that is one work-group per SM; the plan uses the key waves
/// only where the grid leaves SMs idle. The plan uses these for
/// [`paged_decode_fused`](fn@super::paged_decode_fused) as well (the merge measured inside
/// this kernel: hd64 175, hd128 239, the same one work-group per SM at 8 key waves).
pub const fn decode_waves_regs(d: usize) -> usize {
    match d {
        0..=64 => 168,
        65..=80 => 176,
        81..=96 => 184,
        97..=128 => 232,
        _ => 184,
    }
}

/// `out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b` over the `context_lens[b]` cached
/// tokens of sequence `b` (found through `block_tables [batch, max_blocks]`), and `lse[b,
/// h]` its natural log-sum-exp (zeros and `-inf` for an empty context). `split_len`:
/// keys per split-KV partition (`None`: chosen from the shape, [`split_len_for`]).
///
/// Errors name the argument; on an error nothing is written.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &[u32],
    context_lens: &[u32],
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    split_len: Option<usize>,
) -> Result<(), AttentionError> {
    checked(dev, shape, q, k_cache, v_cache, block_tables, context_lens, out, lse, scale, Plan::Auto(split_len), Counters::Fresh)
}

/// [`paged_attention`]'s checks, upload and launch.
#[allow(clippy::too_many_arguments)]
fn checked<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &[u32],
    context_lens: &[u32],
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    plan: Plan,
    counters: Counters<'_>,
) -> Result<(), AttentionError> {
    let PagedShape { batch, num_blocks, block_size, .. } = shape;
    sizes(shape, q, k_cache, v_cache, out, lse, context_lens.len(), scale)?;
    if batch == 0 {
        return Ok(());
    }
    if !block_tables.len().is_multiple_of(batch) {
        return Err(arg("block_tables", format!("{} entries are not batch = {batch} rows", block_tables.len())));
    }
    let max_blocks = block_tables.len() / batch;
    for (b, &c) in context_lens.iter().enumerate() {
        let need = (c as usize).div_ceil(block_size);
        if need > max_blocks {
            return Err(arg("context_lens", format!("sequence {b} has {c} tokens; its block table row holds {}", max_blocks * block_size)));
        }
        let row = &block_tables[b * max_blocks..][..need];
        if let Some(&bad) = row.iter().find(|&&x| x as usize >= num_blocks) {
            return Err(arg("block_tables", format!("sequence {b} names block {bad}; the caches have {num_blocks}")));
        }
    }
    let longest = context_lens.iter().copied().max().unwrap_or(0) as usize;
    // One upload of the lengths followed by the tables (one host-to-device copy on the
    // stream instead of two); the kernels find the tables at offset `batch`.
    let meta: Vec<u32> = context_lens.iter().chain(block_tables).copied().collect();
    let meta = dev.upload(&meta)?;
    launch(dev, shape, (q, k_cache, v_cache), Indices { tables: &meta, table_at: batch, max_blocks, lens: &meta, longest }, (out, lse), scale, plan, counters)
}

/// [`paged_attention`] with the launch's [`DecodePlan`] given (tests and benchmarks of one
/// configuration): `plan.splits` must be `ceil(longest context / plan.split_len)` (at least
/// 1), `plan.key_waves` at least 1 with at most 256 work-items per work-group and its
/// shared memory on the device, `plan.direct` only with one split, `plan.fused` not with
/// `plan.direct` (its counters are allocated here, zeroed). Errors name `plan` (or
/// the argument) and write nothing.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_planned<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &[u32],
    context_lens: &[u32],
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    plan: DecodePlan,
) -> Result<(), AttentionError> {
    checked(dev, shape, q, k_cache, v_cache, block_tables, context_lens, out, lse, scale, Plan::Given(plan), Counters::Fresh)
}

/// [`paged_attention_planned`] with the caller's `counters` for a fused plan (at least
/// [`decode_counters`], all zero; left at zero): the launches a captured graph replays,
/// with the host-side checks. A shorter buffer is an error naming `counters`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_planned_counters<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &[u32],
    context_lens: &[u32],
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    plan: DecodePlan,
    counters: &DeviceVec<u32>,
) -> Result<(), AttentionError> {
    let need = decode_counters(shape);
    if counters.len() < need {
        return Err(arg("counters", format!("{} counters; the shape needs {need}", counters.len())));
    }
    checked(dev, shape, q, k_cache, v_cache, block_tables, context_lens, out, lse, scale, Plan::Given(plan), Counters::Given(counters))
}

/// [`paged_attention`] with `block_tables` (`[batch, max_blocks]`) and `context_lens`
/// already on the device: no upload and no host read of them, so a step builds them once
/// for every layer, and the launch can be captured in a graph. `max_context_len` bounds the
/// context lengths (it sizes the split-KV partitions). Sizes are checked (errors name the
/// argument and write nothing); the values are not.
///
/// # Safety
/// Every `context_lens[b]` must be at most `max_context_len` and `max_blocks *
/// block_size`, and the first `context_lens[b].div_ceil(block_size)` entries of row `b` of
/// `block_tables` must name blocks inside the caches (what [`paged_attention`] checks on
/// the host): the kernel indexes with them unchecked.
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_unchecked<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &DeviceVec<u32>,
    context_lens: &DeviceVec<u32>,
    max_context_len: usize,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    split_len: Option<usize>,
) -> Result<(), AttentionError> {
    let batch = shape.batch;
    sizes(shape, q, k_cache, v_cache, out, lse, context_lens.len(), scale)?;
    if batch == 0 {
        return Ok(());
    }
    if block_tables.is_empty() || !block_tables.len().is_multiple_of(batch) {
        return Err(arg("block_tables", format!("{} entries are not batch = {batch} rows", block_tables.len())));
    }
    let max_blocks = block_tables.len() / batch;
    if max_context_len > max_blocks * shape.block_size {
        return Err(arg("max_context_len", format!("{max_context_len} tokens; a block table row holds {}", max_blocks * shape.block_size)));
    }
    launch(dev, shape, (q, k_cache, v_cache), Indices { tables: block_tables, table_at: 0, max_blocks, lens: context_lens, longest: max_context_len }, (out, lse), scale, Plan::Auto(split_len), Counters::Absent)
}

/// [`paged_attention_unchecked`] with the caller's `counters` (u32, at least
/// [`decode_counters`] of them, zero before the first launch): small grids may then split
/// a sequence's keys over more work-groups and merge them in the same launch
/// ([`DecodePlan::fused`]), which leaves the counters at zero again. The buffer keeps its
/// address, so a captured graph can replay the launch; one buffer serves every layer of a
/// step (launches on one stream are ordered), but not two launches that may run at once.
/// A buffer shorter than the shape needs only turns the fused plan off.
///
/// # Safety
/// As [`paged_attention_unchecked`]; besides, no other work may touch `counters` while the
/// launch runs, and they must be zero when it starts (as they are after any completed
/// launch of this function, or after [`Device::alloc`]).
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_with_counters<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &DeviceVec<u32>,
    context_lens: &DeviceVec<u32>,
    max_context_len: usize,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    counters: &DeviceVec<u32>,
) -> Result<(), AttentionError> {
    let batch = shape.batch;
    sizes(shape, q, k_cache, v_cache, out, lse, context_lens.len(), scale)?;
    if batch == 0 {
        return Ok(());
    }
    if block_tables.is_empty() || !block_tables.len().is_multiple_of(batch) {
        return Err(arg("block_tables", format!("{} entries are not batch = {batch} rows", block_tables.len())));
    }
    let max_blocks = block_tables.len() / batch;
    if max_context_len > max_blocks * shape.block_size {
        return Err(arg("max_context_len", format!("{max_context_len} tokens; a block table row holds {}", max_blocks * shape.block_size)));
    }
    let counters = if counters.len() >= decode_counters(shape) { Counters::Given(counters) } else { Counters::Absent };
    launch(dev, shape, (q, k_cache, v_cache), Indices { tables: block_tables, table_at: 0, max_blocks, lens: context_lens, longest: max_context_len }, (out, lse), scale, Plan::Auto(None), counters)
}

/// [`paged_attention_with_counters`] with the launch's [`DecodePlan`] given (benchmarks of
/// one configuration inside a captured graph): the plan's checks as
/// [`paged_attention_planned`]'s; a fused plan needs `counters` (at least
/// [`decode_counters`], zero).
///
/// # Safety
/// As [`paged_attention_with_counters`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_attention_unchecked_planned<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    block_tables: &DeviceVec<u32>,
    context_lens: &DeviceVec<u32>,
    max_context_len: usize,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    plan: DecodePlan,
    counters: Option<&DeviceVec<u32>>,
) -> Result<(), AttentionError> {
    let batch = shape.batch;
    sizes(shape, q, k_cache, v_cache, out, lse, context_lens.len(), scale)?;
    if batch == 0 {
        return Ok(());
    }
    if block_tables.is_empty() || !block_tables.len().is_multiple_of(batch) {
        return Err(arg("block_tables", format!("{} entries are not batch = {batch} rows", block_tables.len())));
    }
    let max_blocks = block_tables.len() / batch;
    if max_context_len > max_blocks * shape.block_size {
        return Err(arg("max_context_len", format!("{max_context_len} tokens; a block table row holds {}", max_blocks * shape.block_size)));
    }
    let counters = match counters {
        Some(c) if c.len() >= decode_counters(shape) => Counters::Given(c),
        Some(c) => return Err(arg("counters", format!("{} counters; the shape needs {}", c.len(), decode_counters(shape)))),
        None => Counters::Absent,
    };
    launch(dev, shape, (q, k_cache, v_cache), Indices { tables: block_tables, table_at: 0, max_blocks, lens: context_lens, longest: max_context_len }, (out, lse), scale, Plan::Given(plan), counters)
}

/// Where a decode launch finds the counters of a fused plan.
enum Counters<'a> {
    /// None: no fused plan.
    Absent,
    /// Allocated (zeroed) by the launch when its plan is fused.
    Fresh,
    /// The caller's, long enough and zero.
    Given(&'a DeviceVec<u32>),
}

/// A `u32` buffer's kernel argument, offered as a buffer of [`AtomicU32`].
struct AsAtomicU32(ArgValue);
impl KernelArgSlice<AtomicU32> for AsAtomicU32 {
    fn kernel_arg(&self) -> ArgValue {
        self.0
    }
}

/// The checks of sizes both launchers share.
#[allow(clippy::too_many_arguments)]
fn sizes<T: FlashElem>(
    shape: PagedShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    out: &DeviceVec<T>,
    lse: &DeviceVec<f32>,
    context_lens: usize,
    scale: f32,
) -> Result<(), AttentionError> {
    let PagedShape { batch, heads, kv_heads, head_dim: d, num_blocks, block_size } = shape;
    if !HEAD_DIMS.contains(&d) {
        return Err(AttentionError::HeadDim(d));
    }
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(arg("k_cache", format!("{kv_heads} key/value heads do not divide {heads} query heads")));
    }
    let group = heads / kv_heads;
    if group > MAX_GROUP {
        return Err(arg("q", format!("{group} query heads per key/value head; at most {MAX_GROUP}")));
    }
    if block_size == 0 {
        return Err(arg("block_size", "must be positive"));
    }
    if !scale.is_finite() {
        return Err(arg("scale", format!("{scale} is not finite")));
    }
    let nq = product("q", &[batch, heads, d])?;
    len_is("q", q.len(), nq)?;
    let cache = product("k_cache", &[num_blocks, block_size, kv_heads, d])?;
    if num_blocks.saturating_mul(block_size) > u32::MAX as usize - 1 {
        return Err(arg("k_cache", format!("{num_blocks} blocks of {block_size} slots exceed 2^32 - 2 slots")));
    }
    len_is("k_cache", k_cache.len(), cache)?;
    len_is("v_cache", v_cache.len(), cache)?;
    len_is("out", out.len(), nq)?;
    len_is("lse", lse.len(), batch * heads)?;
    len_is("context_lens", context_lens, batch)?;
    Ok(())
}

type Operands<'a, T> = (&'a DeviceVec<T>, &'a DeviceVec<T>, &'a DeviceVec<T>);
/// Where a decode launch finds its block tables and context lengths.
struct Indices<'a> {
    /// Holds the block tables from element `table_at` on (`[batch, max_blocks]`).
    tables: &'a DeviceVec<u32>,
    table_at: usize,
    max_blocks: usize,
    /// Holds the context lengths from element 0 on (may be `tables` itself).
    lens: &'a DeviceVec<u32>,
    /// The longest context (sizes the split-KV partitions).
    longest: usize,
}

/// A launch's plan: chosen from the shape (with the caller's split length, if any) or given.
enum Plan {
    Auto(Option<usize>),
    Given(DecodePlan),
}

#[allow(clippy::too_many_arguments)]
fn launch<T: FlashElem>(
    dev: &Device,
    shape: PagedShape,
    (q, k_cache, v_cache): Operands<'_, T>,
    Indices { tables, table_at, max_blocks, lens, longest }: Indices<'_>,
    (out, lse): (&mut DeviceVec<T>, &mut DeviceVec<f32>),
    scale: f32,
    plan: Plan,
    counters: Counters<'_>,
) -> Result<(), AttentionError> {
    let PagedShape { batch, heads, kv_heads, head_dim: d, block_size, .. } = shape;
    let group = heads / kv_heads;
    let low = crate::lowering_of(dev);
    let row_waves = group.div_ceil(16);
    let plan = match plan {
        Plan::Auto(split_len) => plan_on(dev, shape, longest, split_len, fused_merge() && !matches!(counters, Counters::Absent)),
        Plan::Given(p) => {
            let bad = |reason: String| Err(arg("plan", reason));
            if p.split_len == 0 || p.splits != longest.div_ceil(p.split_len).max(1) {
                return bad(format!("{p:?}: splits must be ceil({longest} / split_len) with split_len > 0"));
            }
            if p.key_waves == 0 || p.key_waves > key_waves_most(low, row_waves) {
                return bad(format!("{p:?}: 1 ..= {} key waves fit 256 work-items", key_waves_most(low, row_waves)));
            }
            if p.direct && p.splits != 1 {
                return bad(format!("{p:?}: a direct write needs one split"));
            }
            if p.fused && (p.direct || matches!(counters, Counters::Absent) || !FUSED_HEAD_DIMS.contains(&d)) {
                return bad(format!("{p:?}: an in-launch merge writes through the workspace, needs counters and head dimension 64 or 128"));
            }
            p
        }
    };
    let DecodePlan { split_len, splits, key_waves, direct, fused } = plan;
    let combine = key_waves > 1 || direct || fused;
    let smem = decode_smem_elems(d, row_waves * 16, low, key_waves, if combine { group } else { 0 });
    if smem * core::mem::size_of::<T>() > dev.max_shared_bytes() {
        return Err(arg("plan", format!("{plan:?} needs {} bytes of shared memory; the device has {}", smem * core::mem::size_of::<T>(), dev.max_shared_bytes())));
    }
    if batch > 65535 || kv_heads * value_chunks(d, low) > 65535 || split_len > u32::MAX as usize || table_at + batch * max_blocks > u32::MAX as usize {
        return Err(arg("q", "batch or heads exceed the grid limit of 65535"));
    }
    // A direct launch writes no workspace (one-element placeholders).
    let part = if direct { 1 } else { batch * heads * splits };
    let mut part_o = dev.alloc_uninit::<f32>(part * if direct { 1 } else { d })?;
    let mut part_ml = dev.alloc_uninit::<f32>(part * if direct { 1 } else { 2 })?;
    // The counters of a fused launch (a one-element placeholder otherwise).
    let fresh;
    let counters = match counters {
        Counters::Given(c) if fused => c,
        _ => {
            fresh = if fused { dev.alloc::<u32>(decode_counters(shape))? } else { dev.alloc_uninit::<u32>(1)? };
            &fresh
        }
    };
    let counters = AsAtomicU32(counters.kernel_arg());
    let cfg = LaunchConfig::new(Dim3::new(splits as u32, (kv_heads * value_chunks(d, low)) as u32, batch as u32), Dim3::x((row_waves * key_waves) as u32 * low.wave_lanes()))
        .with_dynamic_shared(smem);
    let args = DecodeArgs {
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        block_size: block_size as u32,
        max_blocks: max_blocks as u32,
        split_len: split_len as u32,
        table_at: table_at as u32,
        key_waves: key_waves as u32,
        mode: if fused {
            MODE_FUSED
        } else if direct {
            MODE_DIRECT
        } else {
            MODE_PARTS
        },
        scale,
    };
    fn go<T: FlashElem, H: HeadDim>(
        dev: &Device,
        cfg: LaunchConfig,
        a: &DecodeArgs,
        bufs: DecodeBufs<'_, T>,
    ) -> Result<(), AttentionError> {
        let (q, kc, vc, tables, lens, po, pml, out, lse, counters) = bufs;
        if a.key_waves == 1 && a.mode == MODE_PARTS {
            paged_decode::launch::<T, H>(dev, cfg, q, kc, vc, tables, lens, po, pml, a.heads, a.kv_heads, a.block_size, a.max_blocks, a.split_len, a.table_at, a.scale)?;
        } else if a.mode == MODE_FUSED {
            paged_decode_fused::launch::<T, H>(dev, cfg, q, kc, vc, tables, lens, po, pml, out, lse, counters, a.heads, a.kv_heads, a.block_size, a.max_blocks, a.split_len, a.table_at, a.key_waves, a.scale)?;
        } else {
            paged_decode_waves::launch::<T, H>(dev, cfg, q, kc, vc, tables, lens, po, pml, out, lse, a.heads, a.kv_heads, a.block_size, a.max_blocks, a.split_len, a.table_at, a.key_waves, a.mode, a.scale)?;
        }
        Ok(())
    }
    let bufs = (q, k_cache, v_cache, tables, lens, &mut part_o, &mut part_ml, &mut *out, &mut *lse, &counters);
    match d {
        64 => go::<T, Hd64>(dev, cfg, &args, bufs),
        80 => go::<T, Hd80>(dev, cfg, &args, bufs),
        96 => go::<T, Hd96>(dev, cfg, &args, bufs),
        128 => go::<T, Hd128>(dev, cfg, &args, bufs),
        _ => go::<T, Hd256>(dev, cfg, &args, bufs),
    }?;
    if direct || fused {
        return Ok(());
    }
    // One work-item per output column.
    let cfg = LaunchConfig::new(Dim3::new(heads as u32, batch as u32, 1), Dim3::x(d as u32));
    paged_merge::launch::<T>(dev, cfg, &part_o, &part_ml, lens, out, lse, heads as u32, d as u32, splits as u32, split_len as u32)?;
    Ok(())
}

struct DecodeArgs {
    heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    split_len: u32,
    table_at: u32,
    key_waves: u32,
    mode: u32,
    scale: f32,
}

/// Writes the rows of `k`, `v` (`[tokens, kv_heads, head_dim]`, `row = kv_heads *
/// head_dim` elements per token) into the caches (`[num_blocks, block_size, kv_heads,
/// head_dim]`, so `slots = num_blocks * block_size` rows) at `slot_mapping[t]` (`block *
/// block_size + offset`; negative: skipped). Slots must be distinct and inside the cache;
/// errors name the argument and write nothing.
pub fn reshape_and_cache_rows<T: Element + ScalarArg>(
    dev: &Device,
    row: usize,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    k_cache: &mut DeviceVec<T>,
    v_cache: &mut DeviceVec<T>,
    slot_mapping: &[i64],
) -> Result<(), AttentionError> {
    if row == 0 {
        return Err(arg("k", "rows of zero elements"));
    }
    let n = product("k", &[slot_mapping.len(), row])?;
    len_is("k", k.len(), n)?;
    len_is("v", v.len(), n)?;
    if !k_cache.len().is_multiple_of(row) {
        return Err(arg("k_cache", format!("{} elements are not whole rows of {row}", k_cache.len())));
    }
    len_is("v_cache", v_cache.len(), k_cache.len())?;
    let slots = k_cache.len() / row;
    let mut seen = std::collections::HashSet::new();
    for (t, &s) in slot_mapping.iter().enumerate() {
        if s >= 0 && (s as u64 >= slots as u64 || !seen.insert(s)) {
            return Err(arg("slot_mapping", format!("token {t}: slot {s} is outside the {slots} cache slots or repeated")));
        }
    }
    if n == 0 {
        return Ok(());
    }
    let map = dev.upload(slot_mapping)?;
    let groups = n.div_ceil(256).min(65535 * 16) as u32;
    reshape_and_cache::launch::<T>(dev, LaunchConfig::new(Dim3::x(groups), Dim3::x(256)), k, v, k_cache, v_cache, &map, row as u32)?;
    Ok(())
}

/// q, the key and value caches, block tables, sequence lengths, the partial outputs and
/// statistics, the output and the log-sum-exp of one decode launch.
type DecodeBufs<'a, T> = (
    &'a DeviceVec<T>,
    &'a DeviceVec<T>,
    &'a DeviceVec<T>,
    &'a DeviceVec<u32>,
    &'a DeviceVec<u32>,
    &'a mut DeviceVec<f32>,
    &'a mut DeviceVec<f32>,
    &'a mut DeviceVec<T>,
    &'a mut DeviceVec<f32>,
    &'a AsAtomicU32,
);
