//! Prefill attention over the paged KV cache on Candle tensors of this backend: a step's
//! prompt chunks (several sequences, each chunk with or without a cached prefix) attend
//! over their sequences' cached keys and values read through the block tables, in one
//! launch, with no gather of the context into contiguous tensors. Kernel:
//! [`attention::prefill`].
//!
//! Layouts: `q [total_q, heads, head_dim]` (chunk after chunk), caches `[num_blocks,
//! block_size, kv_heads, head_dim]` as in [`crate::paged`], with the chunks' own keys and
//! values written first (`rope_and_cache`). The step's indices are a [`PrefillIndex`],
//! checked on the host and uploaded once, used by every layer's
//! [`paged_prefill_indexed`].
use crate::device::RocmDevice;
use crate::error::invalid;
use crate::tensor_access::{dims_n, dtype_is, input, output, rocm_device, same_device};
use attention::prefill::host::{paged_prefill_unchecked, PrefillIndex as Checked, PrefillShape};
use attention::{AttentionError, FlashElem};
use candle_core::{DType, Result, Tensor};
use half::{bf16, f16};

fn err(op: &str, e: AttentionError) -> candle_core::Error {
    match e {
        AttentionError::HeadDim(_) => invalid(op, format!("argument `q`: {e}")),
        e => invalid(op, e),
    }
}

/// A step's prefill chunks on the device: sequence `b`'s chunk is rows `cu_q[b]..cu_q[b +
/// 1]` of `q`, its context (cached prefix and the chunk) `context_lens[b]` tokens in row
/// `b` of `block_tables [batch, max_blocks]`, for a cache of `num_blocks` blocks of
/// `block_size` tokens. Checked once on the host ([`attention::prefill::host::PrefillIndex`])
/// and uploaded once.
#[derive(Debug)]
pub struct PrefillIndex {
    checked: Checked,
    meta: Tensor,
}

impl PrefillIndex {
    /// Checks (offsets from 0, non-decreasing; every chunk within its context, every
    /// context within its row, whose used entries name blocks inside the cache) and
    /// uploads to `dev`; an error names the argument.
    pub fn new(dev: &candle_core::Device, cu_q: &[u32], context_lens: &[u32], block_tables: &[u32], num_blocks: usize, block_size: usize) -> Result<Self> {
        Self::upload("PrefillIndex::new", dev, || Checked::new(cu_q, context_lens, block_tables, num_blocks, block_size))
    }

    /// An index of a fixed shape on `dev` for steps whose chunks change between launches
    /// but whose sizes do not (a captured graph's input): `batch` chunks over `total_q`
    /// query rows, block-table rows of `max_blocks` (see
    /// [`attention::prefill::host::PrefillIndex::with_capacity`]). Rewritten in place by
    /// [`PrefillIndex::write`].
    pub fn with_capacity(dev: &candle_core::Device, batch: usize, total_q: usize, max_blocks: usize, num_blocks: usize, block_size: usize) -> Result<Self> {
        Self::upload("PrefillIndex::with_capacity", dev, || Checked::with_capacity(batch, total_q, max_blocks, num_blocks, block_size))
    }

    /// The index `check` makes, uploaded to `dev` (a rocm-kernels device); errors name `op`.
    fn upload(op: &str, dev: &candle_core::Device, check: impl FnOnce() -> std::result::Result<Checked, AttentionError>) -> Result<Self> {
        if RocmDevice::from_candle(dev).is_none() {
            return Err(invalid(op, format!("argument `dev` is {dev:?}, not a rocm-kernels device")));
        }
        let checked = check().map_err(|e| err(op, e))?;
        let meta = Tensor::new(checked.meta(), dev)?;
        Ok(PrefillIndex { checked, meta })
    }

    /// Checks a step's `cu_q`, `context_lens` and `block_tables` (as [`PrefillIndex::new`],
    /// in this index's shape) and copies them into its device buffer in place: same
    /// address, no allocation. Refused during a graph capture; an error writes nothing.
    pub fn write(&mut self, cu_q: &[u32], context_lens: &[u32], block_tables: &[u32]) -> Result<()> {
        const OP: &str = "PrefillIndex::write";
        let mut next = self.checked.clone();
        next.rewrite(cu_q, context_lens, block_tables).map_err(|e| err(OP, e))?;
        crate::paged::write_into(&self.meta, next.meta())?;
        self.checked = next;
        Ok(())
    }

    /// Query rows of all chunks.
    pub fn total_q(&self) -> usize {
        self.checked.total_q()
    }

    /// Chunks (sequences).
    pub fn batch(&self) -> usize {
        self.checked.batch()
    }
}

/// Causal attention of every chunk of `index` over its sequence's cached context:
/// `q [total_q, heads, head_dim]` (f16 or bf16, head_dim 64 or 128) against `key_cache`,
/// `value_cache [num_blocks, block_size, kv_heads, head_dim]` of the same dtype (the
/// cache the index was checked for); a chunk's last query sees its whole context, query
/// `i` of a chunk of `n` the first `context_len - n + i + 1` keys (and with `window_left =
/// Some(w)` only the last `w + 1` of those). Returns `[total_q, heads, head_dim]`. Errors
/// name the argument.
pub fn paged_prefill_indexed(q: &Tensor, key_cache: &Tensor, value_cache: &Tensor, index: &PrefillIndex, softmax_scale: f32, window_left: Option<usize>) -> Result<Tensor> {
    const OP: &str = "paged_prefill";
    let qd = dims_n(OP, "q", q, 3, "[total_q, heads, head_dim]")?;
    let (total_q, heads, d) = (qd[0], qd[1], qd[2]);
    if total_q != index.total_q() {
        return Err(invalid(OP, format!("argument `q` has {total_q} rows; the index's chunks have {}", index.total_q())));
    }
    let cd = dims_n(OP, "key_cache", key_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")?;
    if cd[0] != index.checked.num_blocks() || cd[1] != index.checked.block_size() || cd[3] != d {
        return Err(invalid(
            OP,
            format!("argument `key_cache` has shape {:?}; the index and q need [{}, {}, kv_heads, {d}]", key_cache.shape(), index.checked.num_blocks(), index.checked.block_size()),
        ));
    }
    if value_cache.dims() != cd {
        return Err(invalid(OP, format!("argument `value_cache` has shape {:?}; expected key_cache's {:?}", value_cache.shape(), key_cache.shape())));
    }
    if !matches!(q.dtype(), DType::F16 | DType::BF16) {
        return Err(invalid(OP, format!("argument `q` has dtype {:?}; expected f16 or bf16", q.dtype())));
    }
    dtype_is(OP, "key_cache", key_cache, q.dtype())?;
    dtype_is(OP, "value_cache", value_cache, q.dtype())?;
    let dev = rocm_device(OP, "q", q)?;
    let candle_dev = dev.as_candle();
    for (name, t) in [("key_cache", key_cache), ("value_cache", value_cache), ("index", &index.meta)] {
        same_device(OP, name, t, &candle_dev)?;
    }
    let shape = PrefillShape { heads, kv_heads: cd[2], head_dim: d };
    dev.profiled(
        || "paged_prefill".into(),
        q.dtype(),
        || match q.dtype() {
            DType::F16 => prefill_on::<f16>(dev, shape, q, key_cache, value_cache, index, softmax_scale, window_left),
            _ => prefill_on::<bf16>(dev, shape, q, key_cache, value_cache, index, softmax_scale, window_left),
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn prefill_on<T: FlashElem + crate::buffer::BufElem>(
    dev: &RocmDevice,
    shape: PrefillShape,
    q: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    index: &PrefillIndex,
    scale: f32,
    window_left: Option<usize>,
) -> Result<Tensor> {
    const OP: &str = "paged_prefill";
    let total_q = index.total_q();
    let ((qs, ql), (ks, kl), (vs, vl), (ms, ml)) = (q.storage_and_layout(), key_cache.storage_and_layout(), value_cache.storage_and_layout(), index.meta.storage_and_layout());
    let q = input::<T>(OP, "q", dev, &qs, ql)?;
    let kc = input::<T>(OP, "key_cache", dev, &ks, kl)?;
    let vc = input::<T>(OP, "value_cache", dev, &vs, vl)?;
    let meta = input::<u32>(OP, "index", dev, &ms, ml)?;
    let kd = dev.kernels();
    let mut out = kd.alloc_uninit::<T>(total_q * shape.heads * shape.head_dim).map_err(crate::error::at(OP))?;
    let mut lse = kd.alloc_uninit::<f32>(total_q * shape.heads).map_err(crate::error::at(OP))?;
    // SAFETY: `meta` is the upload of `index.checked.meta()` (made by `PrefillIndex::new`,
    // never written since).
    unsafe { paged_prefill_unchecked(kd, shape, &q, &kc, &vc, &index.checked, &meta, &mut out, &mut lse, scale, window_left) }.map_err(|e| err(OP, e))?;
    Ok(output(dev, out, (total_q, shape.heads, shape.head_dim)))
}
