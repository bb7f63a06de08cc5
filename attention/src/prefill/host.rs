//! The checked launchers of [`paged_prefill`](fn@super::paged_prefill): the step's chunk
//! offsets, context lengths and block tables are checked once on the host
//! ([`PrefillIndex`]), so an error writes nothing and the kernel never indexes out of range.
use super::{paged_prefill as kernel, prefill_value_chunks, PREFILL_HEAD_DIMS};
use crate::flash::{block_rows, smem_elems, Hd128, Hd64, WAVES};
use crate::{AttentionError, FlashElem};
use kernel_dsl::host::{KernelArgSlice, LaunchConfig};
use kernel_dsl::Dim3;
use kernel_runtime::{Device, DeviceVec};

/// Sizes of a paged prefill: `q [total_q, heads, head_dim]` against caches `[num_blocks,
/// block_size, kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension: 64 or 128 ([`PREFILL_HEAD_DIMS`]).
    pub head_dim: usize,
}

fn arg(arg: &'static str, reason: impl Into<String>) -> AttentionError {
    AttentionError::Argument { arg, reason: reason.into() }
}

/// A step's prefill chunks, checked: sequence `b`'s chunk is query rows
/// `cu_q[b]..cu_q[b + 1]`, its context (prefix and chunk, already in the cache) `context_lens[b]` tokens
/// found through row `b` of `block_tables [batch, max_blocks]`, in a cache of `num_blocks`
/// blocks of `block_size` tokens. [`PrefillIndex::meta`] is what the kernel reads; upload
/// it once and pass it to every layer's [`paged_prefill_unchecked`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillIndex {
    batch: usize,
    max_blocks: usize,
    total_q: usize,
    longest_q: usize,
    num_blocks: usize,
    block_size: usize,
    meta: Vec<u32>,
}

impl PrefillIndex {
    /// Checks that the block size is a power of two, that `cu_q` (`batch + 1` offsets) starts at 0 and never decreases, that every
    /// chunk is at most its context and every context fits its block-table row, whose used
    /// entries name blocks inside the cache; an error names the argument.
    pub fn new(cu_q: &[u32], context_lens: &[u32], block_tables: &[u32], num_blocks: usize, block_size: usize) -> Result<Self, AttentionError> {
        if !block_size.is_power_of_two() {
            return Err(arg("block_size", format!("{block_size} is not a power of two (the kernel finds rows with a shift and a mask)")));
        }
        let batch = context_lens.len();
        if batch == 0 || cu_q.len() != batch + 1 {
            return Err(arg("cu_q", format!("has {} offsets; {batch} sequences (at least one) need {}", cu_q.len(), batch + 1)));
        }
        if batch > 65535 {
            return Err(arg("context_lens", format!("{batch} sequences exceed the grid limit of 65535")));
        }
        if cu_q[0] != 0 {
            return Err(arg("cu_q", format!("starts at {}, not 0", cu_q[0])));
        }
        if let Some(i) = cu_q.windows(2).position(|w| w[1] < w[0]) {
            return Err(arg("cu_q", format!("decreases at index {}", i + 1)));
        }
        if block_tables.is_empty() || !block_tables.len().is_multiple_of(batch) {
            return Err(arg("block_tables", format!("{} entries are not {batch} non-empty rows", block_tables.len())));
        }
        let max_blocks = block_tables.len() / batch;
        let mut longest_q = 0;
        for (b, &c) in context_lens.iter().enumerate() {
            let n = (cu_q[b + 1] - cu_q[b]) as usize;
            if n > c as usize {
                return Err(arg("context_lens", format!("sequence {b} has {c} tokens, fewer than its chunk of {n}")));
            }
            let need = (c as usize).div_ceil(block_size);
            if need > max_blocks {
                return Err(arg("context_lens", format!("sequence {b} has {c} tokens; its block table row holds {}", max_blocks * block_size)));
            }
            if let Some(&bad) = block_tables[b * max_blocks..][..need].iter().find(|&&x| x as usize >= num_blocks) {
                return Err(arg("block_tables", format!("sequence {b} names block {bad}; the caches have {num_blocks}")));
            }
            longest_q = longest_q.max(n);
        }
        let total_q = cu_q[batch] as usize;
        // The kernel compares positions in 32 bits.
        if total_q >= 1 << 29 || context_lens.iter().any(|&c| c >= 1 << 29) || num_blocks.checked_mul(block_size).is_none_or(|s| s > u32::MAX as usize) {
            return Err(arg("context_lens", "sizes past 2^29 tokens (or caches past 2^32 slots) are not supported"));
        }
        let meta = cu_q.iter().chain(context_lens).chain(block_tables).copied().collect();
        Ok(PrefillIndex { batch, max_blocks, total_q, longest_q, num_blocks, block_size, meta })
    }

    /// An index of a fixed shape for steps whose chunks change but whose sizes do not (a
    /// captured graph's): `batch` chunks, `total_q` query rows among them, block-table rows
    /// of `max_blocks`; its launch covers a chunk of all `total_q` rows, so any chunk
    /// [`PrefillIndex::rewrite`] puts in runs on the same grid. Starts with every chunk
    /// empty but the last, which holds every row over a context of as many positions in
    /// block 0. An error names the size.
    pub fn with_capacity(batch: usize, total_q: usize, max_blocks: usize, num_blocks: usize, block_size: usize) -> Result<Self, AttentionError> {
        if max_blocks == 0 || total_q.div_ceil(block_size.max(1)) > max_blocks {
            return Err(arg("block_tables", format!("rows of {max_blocks} blocks of {block_size} cannot hold a chunk of {total_q} rows")));
        }
        let mut cu_q = vec![0u32; batch + 1];
        if let Some(last) = cu_q.last_mut() {
            *last = total_q as u32;
        }
        let mut lens = vec![0u32; batch];
        if let Some(last) = lens.last_mut() {
            *last = total_q as u32;
        }
        let mut index = PrefillIndex::new(&cu_q, &lens, &vec![0u32; batch * max_blocks], num_blocks, block_size)?;
        index.longest_q = total_q;
        Ok(index)
    }

    /// Checks a step's chunks as [`PrefillIndex::new`] does, in this index's shape (as many
    /// chunks, query rows and block-table entries), and makes them this index's (the launch
    /// grid stays this index's: its longest chunk is never shorter than before). An error
    /// changes nothing.
    pub fn rewrite(&mut self, cu_q: &[u32], context_lens: &[u32], block_tables: &[u32]) -> Result<(), AttentionError> {
        let fresh = PrefillIndex::new(cu_q, context_lens, block_tables, self.num_blocks, self.block_size)?;
        if (fresh.batch, fresh.max_blocks, fresh.total_q) != (self.batch, self.max_blocks, self.total_q) {
            return Err(arg(
                "cu_q",
                format!("{} chunks of {} rows with tables of {} blocks into an index of {} chunks of {} rows with tables of {}", fresh.batch, fresh.total_q, fresh.max_blocks, self.batch, self.total_q, self.max_blocks),
            ));
        }
        self.meta = fresh.meta;
        self.longest_q = self.longest_q.max(fresh.longest_q);
        Ok(())
    }

    /// The kernel's index: `cu_q`, then `context_lens`, then the block tables.
    pub fn meta(&self) -> &[u32] {
        &self.meta
    }

    /// Sequences (chunks).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Query rows of all chunks.
    pub fn total_q(&self) -> usize {
        self.total_q
    }

    /// Query rows of the longest chunk.
    pub fn longest_q(&self) -> usize {
        self.longest_q
    }

    /// Blocks of the cache the index was checked for.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block of that cache.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

/// `out = softmax(q k^T * scale + causal mask) v` for every chunk of `index` over its
/// sequence's cached keys and values (bottom-right aligned: the chunk's last query sees
/// the whole context), `lse [heads, total_q]` the natural log-sum-exp of each row.
/// `window_left`: a query at position `p` sees keys from `p - window_left` only (`None`:
/// all). Query head `h` reads key/value head `h / (heads / kv_heads)`. Uploads
/// [`PrefillIndex::meta`]; errors name the argument and write nothing.
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill<T: FlashElem>(
    dev: &Device,
    shape: PrefillShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    index: &PrefillIndex,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    window_left: Option<usize>,
) -> Result<(), AttentionError> {
    sizes(shape, q, k_cache, v_cache, index, out, lse, scale)?;
    let meta = dev.upload(index.meta())?;
    launch(dev, shape, (q, k_cache, v_cache), index, &meta, (out, lse), scale, window_left)
}

/// [`paged_prefill`] with the index already on the device (`meta`, what
/// [`PrefillIndex::meta`] holds): no upload, so a step uploads it once for every layer.
/// Sizes are checked (errors name the argument and write nothing).
///
/// # Safety
/// `meta` holds exactly `index.meta()` (the kernel indexes the caches with its values).
#[allow(clippy::too_many_arguments)]
pub unsafe fn paged_prefill_unchecked<T: FlashElem>(
    dev: &Device,
    shape: PrefillShape,
    q: &DeviceVec<T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    index: &PrefillIndex,
    meta: &DeviceVec<u32>,
    out: &mut DeviceVec<T>,
    lse: &mut DeviceVec<f32>,
    scale: f32,
    window_left: Option<usize>,
) -> Result<(), AttentionError> {
    sizes(shape, q, k_cache, v_cache, index, out, lse, scale)?;
    if meta.len() != index.meta.len() {
        return Err(arg("meta", format!("has {} entries; the index has {}", meta.len(), index.meta.len())));
    }
    launch(dev, shape, (q, k_cache, v_cache), index, meta, (out, lse), scale, window_left)
}

#[allow(clippy::too_many_arguments)]
fn sizes<T>(shape: PrefillShape, q: &DeviceVec<T>, k_cache: &DeviceVec<T>, v_cache: &DeviceVec<T>, index: &PrefillIndex, out: &DeviceVec<T>, lse: &DeviceVec<f32>, scale: f32) -> Result<(), AttentionError> {
    let PrefillShape { heads, kv_heads, head_dim } = shape;
    if !PREFILL_HEAD_DIMS.contains(&head_dim) {
        return Err(AttentionError::HeadDim(head_dim));
    }
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || heads > 65535 {
        return Err(arg("k_cache", format!("{kv_heads} key/value heads do not divide {heads} query heads (at most 65535)")));
    }
    if !scale.is_finite() {
        return Err(arg("scale", format!("{scale} is not finite")));
    }
    let nq = index.total_q.checked_mul(heads * head_dim).ok_or_else(|| arg("q", "size overflows usize"))?;
    for (name, have, want) in [("q", q.len(), nq), ("out", out.len(), nq), ("lse", lse.len(), heads * index.total_q)] {
        if have != want {
            return Err(arg(name, format!("has {have} elements; the shape needs {want}")));
        }
    }
    let nk = index.num_blocks * index.block_size * kv_heads * head_dim;
    for (name, have) in [("k_cache", k_cache.len()), ("v_cache", v_cache.len())] {
        if have != nk {
            return Err(arg(name, format!("has {have} elements; {} blocks of {} x {kv_heads} x {head_dim} need {nk}", index.num_blocks, index.block_size)));
        }
    }
    Ok(())
}

type Bufs<'a, T> = (&'a DeviceVec<T>, &'a DeviceVec<T>, &'a DeviceVec<T>);

#[allow(clippy::too_many_arguments)]
fn launch<T: FlashElem>(
    dev: &Device,
    shape: PrefillShape,
    (q, kc, vc): Bufs<'_, T>,
    index: &PrefillIndex,
    meta: &(impl KernelArgSlice<u32> + ?Sized),
    (out, lse): (&mut DeviceVec<T>, &mut DeviceVec<f32>),
    scale: f32,
    window_left: Option<usize>,
) -> Result<(), AttentionError> {
    if index.total_q == 0 {
        return Ok(());
    }
    let low = crate::lowering_of(dev);
    let d = shape.head_dim;
    let gx = index.longest_q.div_ceil(block_rows(d, low));
    let gy = shape.heads * prefill_value_chunks(d, low);
    if gy > 65535 {
        return Err(arg("q", format!("{} heads exceed the grid limit", shape.heads)));
    }
    let grid = Dim3::new(gx as u32, gy as u32, index.batch as u32);
    let cfg = LaunchConfig::new(grid, Dim3::x(WAVES as u32 * low.wave_lanes())).with_dynamic_shared(smem_elems(d, block_rows(d, low), low));
    // Clamped so the kernel's 32-bit window arithmetic cannot overflow (contexts < 2^29).
    let wl = window_left.map_or(-1, |w| w.min(1 << 29) as i32);
    let (heads, kvh, bs, mb, tq) = (shape.heads as u32, shape.kv_heads as u32, index.block_size as u32, index.max_blocks as u32, index.total_q as u32);
    match d {
        64 => kernel::launch::<T, Hd64>(dev, cfg, q, kc, vc, out, lse, meta, heads, kvh, bs, mb, tq, scale, wl)?,
        128 => kernel::launch::<T, Hd128>(dev, cfg, q, kc, vc, out, lse, meta, heads, kvh, bs, mb, tq, scale, wl)?,
        d => return Err(AttentionError::HeadDim(d)),
    }
    Ok(())
}
