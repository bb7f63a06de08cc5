//! The llama-family forward written for serving: a batch of chunks of different lengths
//! packed into one token dimension, rope at each token's own position, K/V appended to a
//! paged cache and attention over it, logits only for the rows that sample.
//!
//! Every op that a fused kernel will replace sits behind one small function here
//! ([`rms_norm`], [`rope_append_kv`], [`paged_attention`], [`silu_mul`],
//! [`Linear::forward`]); each dispatches on the device: fused kernels of candle-rocm on
//! our device, plain Candle ops elsewhere (`Device::Cpu`) or when fused is off.
use crate::config::ModelConfig;
use crate::error::{malformed, Error, Result};
use candle_core::quantized::{gguf_file, QMatMul};
use candle_core::{DType, Device, Module, Tensor};
use std::path::{Path, PathBuf};

/// A weight matrix `[out, in]`: dense (safetensors) or GGML blocks (GGUF), with an optional bias.
pub struct Linear {
    pub(crate) w: Weight,
    pub(crate) b: Option<Tensor>,
}

pub(crate) enum Weight {
    Dense(Tensor),
    Quant(QMatMul),
}

impl Linear {
    /// Whether the product runs on GGML blocks (its decode input may carry q8_1 codes).
    pub(crate) fn quantized(&self) -> bool {
        matches!(self.w, Weight::Quant(QMatMul::QTensor(_)))
    }

    /// `x @ W^T + b` for `x` of `[tokens, in]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Weight::Dense(w) = &self.w {
            if on_our_device(x.device()) {
                // One kernel for decode-shaped inputs (matvec with the bias in its epilogue).
                return candle_rocm::llm_ops::linear(x, w, self.b.as_ref());
            }
        }
        let y = match &self.w {
            Weight::Dense(w) => x.matmul(&w.t()?)?,
            Weight::Quant(q) => q.forward(x)?,
        };
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// Rows `[q | k | v]` (or `[gate | up]`) of dense weights stacked into one `Linear`: one
/// product instead of three (two); `None` for GGML blocks, which stay separate.
fn stack(parts: &[&Linear]) -> candle_core::Result<Option<Linear>> {
    let mut ws = Vec::with_capacity(parts.len());
    for p in parts {
        match &p.w {
            Weight::Dense(w) => ws.push(w.clone()),
            Weight::Quant(_) => return Ok(None),
        }
    }
    let b = if parts.iter().all(|p| p.b.is_some()) {
        let bs: Vec<Tensor> = parts.iter().filter_map(|p| p.b.clone()).collect();
        Some(Tensor::cat(&bs, 0)?)
    } else if parts.iter().any(|p| p.b.is_some()) {
        return Ok(None);
    } else {
        None
    };
    Ok(Some(Linear { w: Weight::Dense(Tensor::cat(&ws, 0)?), b }))
}

/// `(x + residual, rms_norm(x + residual))`: one kernel on our device (when `fused`),
/// Candle's add and [`rms_norm`] elsewhere.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f64, fused: bool) -> candle_core::Result<(Tensor, Tensor)> {
    if fused && on_our_device(x.device()) {
        return candle_rocm::llm_ops::add_rms_norm(&x.contiguous()?, &residual.contiguous()?, w, eps);
    }
    let h = (x + residual)?;
    let n = rms_norm(&h, w, eps)?;
    Ok((h, n))
}

/// `silu(gate) * up` of one fused product `gate_up: [tokens, 2 I]` (gate first): one
/// kernel on our device (when `fused`), [`silu_mul`] of its halves elsewhere.
pub fn silu_mul_fused(gate_up: &Tensor, fused: bool) -> candle_core::Result<Tensor> {
    if fused && on_our_device(gate_up.device()) {
        return candle_rocm::llm_ops::silu_mul(&gate_up.contiguous()?);
    }
    let i = gate_up.dim(1)? / 2;
    silu_mul(&gate_up.narrow(1, 0, i)?, &gate_up.narrow(1, i, i)?)
}

/// `silu(gate) * up` of the stacked `[gate | up]` product `gu` of `x`: on our device (when
/// `fused` and `gated`) one gated-matvec kernel for decode-sized inputs where it is the
/// faster form (`candle_rocm::llm_ops::linear_silu_mul`; the product and
/// [`silu_mul_fused`] otherwise), else the product then [`silu_mul_fused`].
pub fn gate_up_silu(gu: &Linear, x: &Tensor, fused: bool, gated: bool) -> candle_core::Result<Tensor> {
    if let Weight::Dense(w) = &gu.w {
        if fused && gated && on_our_device(x.device()) {
            return candle_rocm::llm_ops::linear_silu_mul(x, w, gu.b.as_ref());
        }
    }
    silu_mul_fused(&gu.forward(x)?, fused)
}

/// RMSNorm over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)
}

/// `silu(gate) * up`.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::silu(gate)? * up
}

/// Rope of `x: [tokens, heads, head_dim]` with each token's `cos`/`sin` rows `[tokens, head_dim/2]`.
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> candle_core::Result<Tensor> {
    if interleaved {
        let xt = x.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        candle_nn::rotary_emb::rope_i(&xt, cos, sin)?.squeeze(0)?.transpose(0, 1)?.contiguous()
    } else {
        candle_nn::rotary_emb::rope_thd(&x.unsqueeze(0)?.contiguous()?, cos, sin)?.squeeze(0)
    }
}

/// One layer's paged K and V: `[num_blocks, block_size, kv_heads, head_dim]` each (the one
/// place that knows the layout).
pub struct LayerCache {
    /// Keys, rope applied.
    pub k: Tensor,
    /// Values.
    pub v: Tensor,
}

impl LayerCache {
    /// A zeroed cache.
    pub fn new(num_blocks: usize, block_size: usize, kv_heads: usize, head_dim: usize, dtype: DType, dev: &Device) -> candle_core::Result<Self> {
        let shape = (num_blocks, block_size, kv_heads, head_dim);
        Ok(LayerCache { k: Tensor::zeros(shape, dtype, dev)?, v: Tensor::zeros(shape, dtype, dev)? })
    }

    /// Copies whole blocks `src -> dst` in K and V (copy-on-write of shared prefixes).
    pub fn copy_blocks(&self, src: &Tensor, dst: &Tensor) -> candle_core::Result<()> {
        for c in [&self.k, &self.v] {
            let (nb, bs, h, d) = c.dims4()?;
            let flat = c.reshape((nb, bs * h * d))?;
            let rows = flat.index_select(src, 0)?;
            let idx = dst.unsqueeze(1)?.broadcast_as(rows.shape())?.contiguous()?;
            flat.scatter_set(&idx, &rows, 0)?;
        }
        Ok(())
    }
}

/// Writes `k`, `v` (`[tokens, kv_heads, head_dim]`) into the cache slots `slots` (`[tokens]`
/// u32: `block * block_size + offset`).
pub fn append_kv(cache: &LayerCache, k: &Tensor, v: &Tensor, slots: &Tensor) -> candle_core::Result<()> {
    for (c, x) in [(&cache.k, k), (&cache.v, v)] {
        let (nb, bs, h, d) = c.dims4()?;
        let flat = c.reshape((nb * bs, h * d))?;
        let x = x.reshape(((), h * d))?.to_dtype(c.dtype())?.contiguous()?;
        let idx = slots.unsqueeze(1)?.broadcast_as(x.shape())?.contiguous()?;
        flat.scatter_set(&idx, &x, 0)?;
    }
    Ok(())
}

/// A multi-token chunk (prefill) of a packed batch, as [`paged_attention`] needs it.
pub struct AttnChunk {
    /// First row of the chunk in the packed token dimension.
    pub offset: usize,
    pub len: usize,
    /// Slots of every cached position `0..start_pos + len`, `[ctx]` u32 on the device.
    pub ctx_slots: Tensor,
    /// Additive mask `[len, ctx]` f32 (0 or -inf): causal, and the sliding window.
    pub mask: Tensor,
}

/// The one-token chunks (decodes) of a packed batch, attended together: contexts padded to
/// the longest one (padding slots masked).
pub struct DecodeGroup {
    /// Packed rows of the decode tokens, `[B]` u32.
    pub rows: Tensor,
    /// Each row's context slots, padded to `ctx`: `[B * ctx]` u32.
    pub slots: Tensor,
    /// Additive mask `[B, 1, 1, ctx]` f32: padding and the sliding window.
    pub mask: Tensor,
    pub ctx: usize,
}

/// The decodes of a packed batch for the paged-attention kernel: each sequence's block
/// table and context length, read by the kernel from the cache directly (no gather, no
/// padding). The runner checked every entry on the host when it built them.
pub struct PagedDecode {
    /// Packed rows of the decode tokens, `[B]` u32; `None`: every packed row, in order (no
    /// gather).
    pub rows: Option<Tensor>,
    /// Block tables and context lengths, checked and uploaded once for every layer.
    pub index: candle_rocm::paged::DecodeIndex,
}

/// The multi-token chunks of a packed batch for the flash kernels: every chunk's queries
/// against every cached key of its sequence (the prefix of a continued chunk or a
/// prefix-cache hit included), in one causal call (causal aligns each chunk's last query
/// with its last key). Three forms: fresh chunks that fill the step attend over the step's
/// own keys ([`VarlenChunks::own_keys`]); otherwise the paged prefill kernel reads each
/// context through the block tables (`paged`, no gather); where it has no instance (head
/// dimensions other than 64 and 128, block sizes that are not powers of two) the contexts
/// are gathered out of the cache in one
/// `index_select` (`ctx_slots`) for the varlen kernel.
pub struct VarlenChunks {
    /// Packed rows of the chunks' tokens, chunk after chunk, `[Q]` u32; `None`: every
    /// packed row, in order (no gather).
    pub rows: Option<Tensor>,
    /// Cache slots of each chunk's keys `0..start_pos + len`, chunk after chunk, `[K]` u32
    /// (the gather path; `None` where `paged` or the own keys serve).
    pub ctx_slots: Option<Tensor>,
    /// The chunks' offsets, contexts and block tables for the paged prefill kernel.
    pub paged: Option<candle_rocm::paged_prefill::PrefillIndex>,
    /// Cumulative query offsets, `chunks + 1` (host values: the attention call reads
    /// nothing back from the device).
    pub cu_q: Vec<u32>,
    /// Cumulative key offsets, `chunks + 1`.
    pub cu_k: Vec<u32>,
    pub max_q: usize,
    pub max_k: usize,
}

impl VarlenChunks {
    /// Whether the chunks' keys are exactly the step's own new keys, in packed order: the
    /// chunks are every packed row (`rows` is `None`) and each starts at position 0 (as
    /// many keys as queries: no cached prefix), so its `ctx_slots` are the slots its own
    /// tokens were just written to. Attention then reads the step's rotated keys and
    /// values directly, with no gather out of the cache.
    pub fn own_keys(&self) -> bool {
        self.rows.is_none() && self.cu_q == self.cu_k
    }
}

/// What [`paged_attention`] needs of a batch.
pub struct AttnBatch {
    /// Decodes on the plain path (gathered, padded, masked).
    pub decode: Option<DecodeGroup>,
    /// Decodes on the paged kernel (instead of `decode`).
    pub paged: Option<PagedDecode>,
    /// Chunks on the plain path.
    pub chunks: Vec<AttnChunk>,
    /// Chunks on the varlen flash kernel (instead of `chunks`).
    pub varlen: Option<VarlenChunks>,
    /// The sliding window of the varlen call (`None`: causal only).
    pub window: Option<usize>,
    /// Where each packed row is in `[decode rows..., chunk rows...]`; `None` when that is
    /// the packed order already.
    pub order: Option<Tensor>,
}

/// Whether `dev` is a rocm-kernels device (the fused kernels' home); everything else
/// (`Device::Cpu`, Candle's own CUDA) runs the plain Candle ops.
pub fn on_our_device(dev: &Device) -> bool {
    candle_rocm::RocmDevice::from_candle(dev).is_some()
}

/// Where a step's new keys and values go: per-token cache slots and rope positions.
pub enum KvIndex {
    /// Plain Candle ops: `slots [tokens]` u32 and each token's rope rows `[tokens,
    /// head_dim / 2]` (gathered once per step).
    Plain { slots: Tensor, cos: Tensor, sin: Tensor },
    /// Our device: checked and uploaded once per step, read by every layer's kernel.
    Fused(candle_rocm::paged::CacheIndex),
}

impl KvIndex {
    /// The fused form on our device when `fused`, else the plain one (rope rows gathered
    /// from the tables `cos`, `sin`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(dev: &Device, slots: &[u32], positions: &[u32], tables: (&Tensor, &Tensor), fused: bool, num_blocks: usize, block_size: usize) -> candle_core::Result<Self> {
        if fused && on_our_device(dev) {
            let s: Vec<i64> = slots.iter().map(|&s| i64::from(s)).collect();
            Ok(KvIndex::Fused(candle_rocm::paged::CacheIndex::new(dev, &s, positions, num_blocks, block_size)?))
        } else {
            let positions = Tensor::new(positions, dev)?;
            Ok(KvIndex::Plain { slots: Tensor::new(slots, dev)?, cos: tables.0.index_select(&positions, 0)?, sin: tables.1.index_select(&positions, 0)? })
        }
    }
}

/// Rope of `q` and `k` at their positions and the write of `k`, `v` to the cache: on our
/// device one `rope_and_cache` launch (tables `cos`, `sin` `[max_positions, head_dim / 2]`)
/// that reads `q`, `k`, `v` in place when they are views of the heads of one stacked
/// product, elsewhere [`apply_rope`] twice and [`append_kv`]. Returns the rotated queries
/// and, with `kv_out`, the step's rotated keys and values `[tokens, kv_heads, head_dim]`
/// in the cache's dtype (what the cache now holds for them; on our device written
/// contiguous by the same launch).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn rope_append_kv(
    cache: &LayerCache,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    index: &KvIndex,
    tables: (&Tensor, &Tensor),
    interleaved: bool,
    kv_out: bool,
) -> candle_core::Result<(Tensor, Option<(Tensor, Tensor)>)> {
    match index {
        KvIndex::Fused(ix) => {
            let dt = cache.k.dtype();
            let (q, k, v) = (q.to_dtype(dt)?, k.to_dtype(dt)?, v.to_dtype(dt)?);
            let out = candle_rocm::paged::rope_and_cache_indexed_out(&k, &v, &cache.k, &cache.v, ix, tables, interleaved, Some(&q), kv_out)?;
            let q = out.q.ok_or_else(|| candle_core::Error::Msg("rope_and_cache returned no queries".into()))?;
            Ok((q, out.kv))
        }
        KvIndex::Plain { slots, cos, sin } => {
            let q = apply_rope(q, cos, sin, interleaved)?;
            let k = apply_rope(k, cos, sin, interleaved)?;
            append_kv(cache, &k, v, slots)?;
            let kv = match kv_out {
                true => Some((k.to_dtype(cache.k.dtype())?, v.to_dtype(cache.v.dtype())?.contiguous()?)),
                false => None,
            };
            Ok((q, kv))
        }
    }
}

/// Attention of the packed queries `q: [tokens, heads, head_dim]` over each sequence's
/// cached keys and values (written by [`append_kv`] first); `[tokens, heads * head_dim]`
/// in `q`'s dtype, softmax in f32. Decodes and chunks take the kernel forms
/// ([`PagedDecode`], [`VarlenChunks`]) where the batch carries them. `own`: the step's
/// rotated keys and values as [`rope_append_kv`] returns them; varlen chunks whose keys
/// are exactly the step's own ([`VarlenChunks::own_keys`]) attend over them instead of
/// gathering the same rows back out of the cache.
pub fn paged_attention(q: &Tensor, cache: &LayerCache, batch: &AttnBatch, scale: f64, own: Option<&(Tensor, Tensor)>) -> candle_core::Result<Tensor> {
    let (_, nh, hd) = q.dims3()?;
    let (nb, bs, nkv, _) = cache.k.dims4()?;
    let g = nh / nkv;
    let kf = cache.k.reshape((nb * bs, nkv, hd))?;
    let vf = cache.v.reshape((nb * bs, nkv, hd))?;
    let mut outs = Vec::with_capacity(batch.chunks.len() + 1);
    if let Some(d) = &batch.paged {
        let qd = match &d.rows {
            Some(r) => q.index_select(r, 0)?,
            None => q.clone(),
        };
        let b = qd.dim(0)?;
        let qd = qd.to_dtype(cache.k.dtype())?;
        let o = candle_rocm::paged::paged_attention_indexed(&qd, &cache.k, &cache.v, &d.index, scale as f32)?;
        outs.push(o.reshape((b, nh * hd))?.to_dtype(q.dtype())?);
    }
    if let Some(d) = &batch.decode {
        let b = d.rows.dim(0)?;
        let gather = |c: &Tensor| -> candle_core::Result<Tensor> { c.index_select(&d.slots, 0)?.to_dtype(DType::F32)?.reshape((b, d.ctx, nkv, hd))?.permute((0, 2, 1, 3))?.contiguous() };
        let (k, v) = (gather(&kf)?, gather(&vf)?); // [b, nkv, ctx, hd]
        let qd = q.index_select(&d.rows, 0)?.to_dtype(DType::F32)?.reshape((b, nkv, g, hd))?;
        let att = (qd.matmul(&k.t()?)? * scale)?.broadcast_add(&d.mask)?;
        let p = candle_nn::ops::softmax_last_dim(&att)?;
        outs.push(p.matmul(&v)?.reshape((b, nh * hd))?.to_dtype(q.dtype())?);
    }
    if let Some(c) = &batch.varlen {
        let qc = match &c.rows {
            Some(r) => q.index_select(r, 0)?,
            None => q.clone(),
        };
        let nq = qc.dim(0)?;
        let qc = qc.to_dtype(cache.k.dtype())?;
        // Causal; a query at p sees keys p - w < k <= p under a window: w - 1 to the left.
        let left = batch.window.map(|w| w.saturating_sub(1));
        let own = own.filter(|_| c.own_keys());
        let o = match (own, &c.paged, &c.ctx_slots) {
            (Some((k, v)), ..) => candle_rocm::flash_attn::flash_attn_varlen_host_offsets(&qc, k, v, &c.cu_q, &c.cu_k, c.max_q, c.max_k, scale as f32, left, Some(0))?,
            (None, Some(index), _) => candle_rocm::paged_prefill::paged_prefill_indexed(&qc, &cache.k, &cache.v, index, scale as f32, left)?,
            (None, None, Some(slots)) => {
                let (k, v) = (kf.index_select(slots, 0)?, vf.index_select(slots, 0)?);
                candle_rocm::flash_attn::flash_attn_varlen_host_offsets(&qc, &k, &v, &c.cu_q, &c.cu_k, c.max_q, c.max_k, scale as f32, left, Some(0))?
            }
            (None, None, None) => return Err(candle_core::Error::Msg("varlen chunks without their own keys, a prefill index or context slots".into())),
        };
        outs.push(o.reshape((nq, nh * hd))?.to_dtype(q.dtype())?);
    }
    for c in &batch.chunks {
        let ctx = c.ctx_slots.dim(0)?;
        let k = kf.index_select(&c.ctx_slots, 0)?.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?; // [nkv, ctx, hd]
        let v = vf.index_select(&c.ctx_slots, 0)?.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
        let qc = q.narrow(0, c.offset, c.len)?.to_dtype(DType::F32)?.reshape((c.len, nkv, g, hd))?.permute((1, 2, 0, 3))?.reshape((nkv, g * c.len, hd))?;
        let att = (qc.matmul(&k.t()?)? * scale)?.reshape((nkv, g, c.len, ctx))?;
        let att = att.broadcast_add(&c.mask)?;
        let p = candle_nn::ops::softmax_last_dim(&att)?.reshape((nkv, g * c.len, ctx))?;
        let o = p.matmul(&v)?.reshape((nkv, g, c.len, hd))?.permute((2, 0, 1, 3))?.reshape((c.len, nh * hd))?;
        outs.push(o.to_dtype(q.dtype())?);
    }
    let out = if outs.len() == 1 { outs.remove(0) } else { Tensor::cat(&outs, 0)? };
    match &batch.order {
        Some(o) => out.index_select(o, 0),
        None => Ok(out),
    }
}

pub(crate) struct Layer {
    /// `[q | k | v]` stacked: one product.
    pub(crate) qkv: Option<Linear>,
    /// `[gate | up]` stacked: one product.
    pub(crate) gate_up: Option<Linear>,
    pub(crate) input_norm: Tensor,
    /// The attention's q, k and v products, `None` where `qkv` alone holds them (GGUF
    /// weights stacked at load are read from the file and kept on the device once).
    pub(crate) q: Option<Linear>,
    pub(crate) k: Option<Linear>,
    pub(crate) v: Option<Linear>,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    pub(crate) post_norm: Tensor,
    /// The MLP's gate and up products, `None` where `gate_up` alone holds them (GGUF
    /// weights stacked at load keep one copy).
    pub(crate) gate: Option<Linear>,
    pub(crate) up: Option<Linear>,
    pub(crate) down: Linear,
}

impl Layer {
    /// Whether every product of the attention's input runs on GGML blocks.
    pub(crate) fn qkv_quantized(&self) -> bool {
        match (&self.qkv, &self.q, &self.k, &self.v) {
            (Some(qkv), ..) => qkv.quantized(),
            (None, Some(q), Some(k), Some(v)) => q.quantized() && k.quantized() && v.quantized(),
            _ => false,
        }
    }

    /// Whether every product of the MLP's input (gate and up) runs on GGML blocks.
    pub(crate) fn mlp_quantized(&self) -> bool {
        match (&self.gate_up, &self.gate, &self.up) {
            (Some(gu), ..) => gu.quantized(),
            (None, Some(g), Some(u)) => g.quantized() && u.quantized(),
            _ => false,
        }
    }

    /// Stacks dense q/k/v and gate/up into one product each (see [`stack`]).
    pub(crate) fn stack_dense(&mut self) -> candle_core::Result<()> {
        if let (Some(q), Some(k), Some(v)) = (&self.q, &self.k, &self.v) {
            self.qkv = stack(&[q, k, v])?;
        }
        if let (Some(g), Some(u)) = (&self.gate, &self.up) {
            self.gate_up = stack(&[g, u])?;
        }
        Ok(())
    }
}

/// A loaded llama-family model on one device.
pub struct Model {
    pub cfg: ModelConfig,
    /// Activations' dtype: the weights' for safetensors, [`gguf_dtype`] for GGUF.
    pub dtype: DType,
    pub device: Device,
    /// Where the model came from (file or folder).
    pub path: PathBuf,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    /// Whether the fused kernels run where the device has them (see [`Model::set_fused`]).
    fused: bool,
    /// Whether decode's gate/up product and activation take the gated matvec where it
    /// applies (see [`Model::set_gated_matvec`]).
    gated: bool,
    /// Whether decode's norms and activation write the q8_1 codes of the GGUF products'
    /// inputs (see [`Model::set_fused_quantize`]).
    fused_quantize: bool,
    /// This rank's share and communicator when the model is split across devices
    /// (tensor parallelism, [`crate::shard`]); `None`: the whole model.
    tp: Option<crate::tp::TpRank>,
    /// Whether prefill chunks with a cached prefix take the paged prefill kernel (see
    /// [`Model::set_paged_prefill`]).
    paged_prefill: bool,
}

/// The product of a GGUF tensor for activations of `dtype`: block formats stay GGML blocks
/// (their products take any activation dtype); float tensors, which Candle holds as a plain
/// weight, are cast to `dtype` so the product's operands agree.
pub(crate) fn gguf_qmatmul(t: candle_core::quantized::QTensor, dtype: DType) -> candle_core::Result<QMatMul> {
    Ok(match QMatMul::from_qtensor(t)? {
        QMatMul::Tensor(w) => QMatMul::Tensor(w.to_dtype(dtype)?),
        other => other,
    })
}

/// The GGUF matrices `{name}.weight` of `names` stacked by rows into one product `[sum of
/// rows, cols]` on `dev` (with their `{name}.bias` rows, in `dtype`, where `bias`): read on
/// the host and uploaded once. `None` where they cannot share one product: GGML types or
/// widths that differ (a Q4_K_M file keeps some `attn_v` / `ffn_down` in Q6_K), or float
/// tensors (Candle holds those as plain weights). A matrix's rows are whole blocks, so the
/// stacked bytes are the files' bytes one after the other.
fn stack_gguf(ct: &gguf_file::Content, f: &mut std::fs::File, names: &[String], bias: bool, dev: &Device, dtype: DType) -> candle_core::Result<Option<Linear>> {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    let infos: Vec<_> = names.iter().map(|n| ct.tensor_infos.get(&format!("{n}.weight"))).collect();
    let Some(Some(first)) = infos.first() else { return Ok(None) };
    let (t, cols) = (first.ggml_dtype, first.shape.dims().last().copied().unwrap_or(0));
    let same = infos.iter().all(|i| i.is_some_and(|i| i.ggml_dtype == t && i.shape.rank() == 2 && i.shape.dims()[1] == cols));
    if !same || matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
        return Ok(None);
    }
    let (mut bytes, mut rows) = (Vec::new(), 0);
    for n in names {
        let q = ct.tensor(f, &format!("{n}.weight"), &Device::Cpu)?;
        rows += q.shape().dims()[0];
        bytes.extend_from_slice(&q.data()?);
    }
    let w = QTensor::new(QStorage::from_data(std::borrow::Cow::Owned(bytes), dev, t)?, (rows, cols))?;
    let b = if bias {
        let bs = names.iter().map(|n| ct.tensor(f, &format!("{n}.bias"), dev)?.dequantize(dev)?.to_dtype(dtype)).collect::<candle_core::Result<Vec<_>>>()?;
        Some(Tensor::cat(&bs, 0)?)
    } else {
        None
    };
    Ok(Some(Linear { w: Weight::Quant(QMatMul::from_qtensor(w)?), b }))
}

/// The activations' (and cache's) dtype of a GGUF model on `dev`: bf16 on our device, so
/// the paged decode kernel, the fused rope/cache write and the bf16 norms apply and the
/// cache is half the size; f32 elsewhere (Candle's CPU and CUDA backends, whose quantized
/// products and plain ops are the reference path).
pub fn gguf_dtype(dev: &Device) -> DType {
    if on_our_device(dev) {
        DType::BF16
    } else {
        DType::F32
    }
}

/// The safetensors files of a folder: the index's shards, `model.safetensors`, or every `*.safetensors`.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| Error::Io { path: index.clone(), source })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| malformed(&index, format!("not JSON: {e}")))?;
        let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| malformed(&index, "no `weight_map` object"))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for f in map.values() {
            let f = dir.join(f.as_str().ok_or_else(|| malformed(&index, "a weight_map value is not a string"))?);
            if !files.contains(&f) {
                files.push(f);
            }
        }
        for f in &files {
            if !f.is_file() {
                return Err(Error::NotFound(f.clone()));
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| Error::Io { path: dir.into(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::NotFound(single));
    }
    Ok(files)
}

pub(crate) fn rope_tables(cfg: &ModelConfig, dtype: DType, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let inv = cfg.inv_freq();
    let n = inv.len();
    let inv = Tensor::from_vec(inv, (1, n), &Device::Cpu)?;
    let t = Tensor::arange(0u32, cfg.max_position_embeddings as u32, &Device::Cpu)?.to_dtype(DType::F32)?.reshape(((), 1))?;
    let f = t.matmul(&inv)?;
    Ok((f.cos()?.to_dtype(dtype)?.to_device(dev)?, f.sin()?.to_dtype(dtype)?.to_device(dev)?))
}

impl Model {
    /// Loads a Hugging Face folder (`config.json` + safetensors) or a GGUF file onto `dev`.
    pub fn load(path: &Path, dev: &Device) -> Result<Model> {
        if path.is_dir() {
            Self::load_safetensors(path, dev)
        } else if path.is_file() {
            Self::load_gguf(path, dev)
        } else {
            Err(Error::NotFound(path.into()))
        }
    }

    /// Loads a Hugging Face folder, in the weights' own dtype.
    pub fn load_safetensors(dir: &Path, dev: &Device) -> Result<Model> {
        let cfg = ModelConfig::from_hf_file(&dir.join("config.json"))?;
        let files = safetensors_files(dir)?;
        let bad = |e: candle_core::Error| malformed(files[0].clone(), e);
        // SAFETY: the files are mapped read-only; the model does not outlive a change to them
        // any more than any mmap-based loader does.
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(bad)?;
        let embed_name = "model.embed_tokens.weight";
        let view = st.get(embed_name).map_err(|e| malformed(files[0].clone(), format!("{embed_name}: {e}")))?;
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            other => return Err(Error::Unsupported { path: files[0].clone(), msg: format!("weights of dtype {other:?} (bf16, f16, f32 are)") }),
        };
        drop(st);
        // SAFETY: as above.
        let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&files, dtype, dev) }.map_err(bad)?;
        let c = &cfg;
        let (h, nh, nkv, hd) = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim);
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> { vb.get(shape, name).map_err(|e| malformed(dir, format!("tensor {name}: {e}"))) };
        let lin = |p: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
            Ok(Linear { w: Weight::Dense(get(&format!("{p}.weight"), &[out, inp])?), b: if bias { Some(get(&format!("{p}.bias"), &[out])?) } else { None } })
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            layers.push(Layer {
                qkv: None,
                gate_up: None,
                input_norm: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                q: Some(lin(&format!("{p}.self_attn.q_proj"), nh * hd, h, c.qkv_bias)?),
                k: Some(lin(&format!("{p}.self_attn.k_proj"), nkv * hd, h, c.qkv_bias)?),
                v: Some(lin(&format!("{p}.self_attn.v_proj"), nkv * hd, h, c.qkv_bias)?),
                o: lin(&format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                q_norm: if c.qk_norm { Some(get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?) } else { None },
                k_norm: if c.qk_norm { Some(get(&format!("{p}.self_attn.k_norm.weight"), &[hd])?) } else { None },
                post_norm: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate: Some(lin(&format!("{p}.mlp.gate_proj"), c.intermediate_size, h, false)?),
                up: Some(lin(&format!("{p}.mlp.up_proj"), c.intermediate_size, h, false)?),
                down: lin(&format!("{p}.mlp.down_proj"), h, c.intermediate_size, false)?,
            });
        }
        for l in &mut layers {
            l.stack_dense()?;
        }
        let embed = get(embed_name, &[c.vocab_size, h])?;
        let lm_head = if c.tie_word_embeddings && !vb.contains_tensor("lm_head.weight") {
            Linear { w: Weight::Dense(embed.clone()), b: None }
        } else {
            lin("lm_head", c.vocab_size, h, false)?
        };
        let (cos, sin) = rope_tables(c, dtype, dev)?;
        Ok(Model { norm: get("model.norm.weight", &[h])?, cfg, dtype, device: dev.clone(), path: dir.into(), embed, layers, lm_head, cos, sin, fused: true, gated: true, fused_quantize: fused_quantize_default(), tp: None, paged_prefill: paged_prefill_default() })
    }

    /// Loads a GGUF file (llama, qwen2, qwen3): weights stay in their GGML blocks (QMatMul),
    /// activations and the cache in [`gguf_dtype`]'s dtype for `dev`.
    pub fn load_gguf(path: &Path, dev: &Device) -> Result<Model> {
        Self::load_gguf_as(path, dev, gguf_dtype(dev))
    }

    /// [`Model::load_gguf`] with activations, cache, norms and embedding table in `dtype`
    /// (f32, f16 or bf16; the quantized products run on q8_1 codes of the activations
    /// whatever their dtype).
    pub fn load_gguf_as(path: &Path, dev: &Device, dtype: DType) -> Result<Model> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::Unsupported { path: path.into(), msg: format!("activations of dtype {dtype:?} (bf16, f16, f32 are)") });
        }
        let mut f = std::fs::File::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let ct = gguf_file::Content::read(&mut f).map_err(|e| {
            let m = e.to_string();
            if m.contains("unknown dtype") {
                Error::UnsupportedGgmlType { path: path.into(), msg: m }
            } else {
                malformed(path, format!("not a GGUF file: {m}"))
            }
        })?;
        let cfg = ModelConfig::from_gguf(&ct, path)?;
        let file_len = f.metadata().map_err(|source| Error::Io { path: path.into(), source })?.len();
        for (name, info) in &ct.tensor_infos {
            let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
            let end = ct.tensor_data_offset.checked_add(info.offset).and_then(|s| s.checked_add(bytes as u64));
            if end.is_none_or(|e| e > file_len) {
                return Err(malformed(path, format!("tensor {name} ends past the end of the file ({file_len} bytes): truncated?")));
            }
        }
        // Reads a tensor onto `dev` (the file passed in: the stacking below reads it too).
        let read = |f: &mut std::fs::File, name: &str| ct.tensor(f, name, dev).map_err(|e| malformed(path, format!("tensor {name}: {e}")));
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("blk.{l}");
            let qlin = |f: &mut std::fs::File, name: &str, bias: bool| -> Result<Linear> {
                let w = Weight::Quant(gguf_qmatmul(read(f, &format!("{p}.{name}.weight"))?, dtype)?);
                let b = if bias { Some(read(f, &format!("{p}.{name}.bias"))?.dequantize(dev)?.to_dtype(dtype)?) } else { None };
                Ok(Linear { w, b })
            };
            let bias = cfg.qkv_bias;
            let (ov, down) = (qlin(&mut f, "attn_output", false)?, qlin(&mut f, "ffn_down", false)?);
            // Gate and up, and q, k and v, of one GGML block type each: one stacked product
            // (one activation quantization and one matvec in decode, one GEMM in prefill),
            // the only copy read from the file and held on the device. Types that differ
            // (a Q4_K_M file's Q6_K `attn_v`) keep separate products.
            let stacked = |f: &mut std::fs::File, names: &[&str], bias: bool| stack_gguf(&ct, f, &names.iter().map(|n| format!("{p}.{n}")).collect::<Vec<_>>(), bias, dev, dtype).map_err(|e| malformed(path, format!("{p} {names:?} stacked: {e}")));
            let gate_up = stacked(&mut f, &["ffn_gate", "ffn_up"], false)?;
            let qkv = stacked(&mut f, &["attn_q", "attn_k", "attn_v"], bias)?;
            let (gate, up) = if gate_up.is_some() { (None, None) } else { (Some(qlin(&mut f, "ffn_gate", false)?), Some(qlin(&mut f, "ffn_up", false)?)) };
            let (qv, kv, vv) = if qkv.is_some() { (None, None, None) } else { (Some(qlin(&mut f, "attn_q", bias)?), Some(qlin(&mut f, "attn_k", bias)?), Some(qlin(&mut f, "attn_v", bias)?)) };
            let norm = |f: &mut std::fs::File, name: &str| -> Result<Tensor> { Ok(read(f, &format!("{p}.{name}.weight"))?.dequantize(dev)?.to_dtype(dtype)?) };
            let (q_norm, k_norm) = if cfg.qk_norm { (Some(norm(&mut f, "attn_q_norm")?), Some(norm(&mut f, "attn_k_norm")?)) } else { (None, None) };
            let (input_norm, post_norm) = (norm(&mut f, "attn_norm")?, norm(&mut f, "ffn_norm")?);
            layers.push(Layer { qkv, gate_up, input_norm, q: qv, k: kv, v: vv, o: ov, q_norm, k_norm, post_norm, gate, up, down });
        }
        let final_norm = read(&mut f, "output_norm.weight")?.dequantize(dev)?.to_dtype(dtype)?;
        // The embedding table is dequantized for row gathers, as Candle's models do.
        let embed_q = read(&mut f, "token_embd.weight")?;
        let embed = embed_q.dequantize(dev)?.to_dtype(dtype)?;
        let head = if ct.tensor_infos.contains_key("output.weight") { read(&mut f, "output.weight")? } else { embed_q };
        let lm_head = Linear { w: Weight::Quant(gguf_qmatmul(head, dtype)?), b: None };
        let (cos, sin) = rope_tables(&cfg, dtype, dev)?;
        Ok(Model { cfg, dtype, device: dev.clone(), path: path.into(), embed, layers, norm: final_norm, lm_head, cos, sin, fused: true, gated: true, fused_quantize: fused_quantize_default(), tp: None, paged_prefill: paged_prefill_default() })
    }

    /// A model of loaded parts (the tensor-parallel loaders of [`crate::shard`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(cfg: ModelConfig, dtype: DType, device: Device, path: PathBuf, embed: Tensor, layers: Vec<Layer>, norm: Tensor, lm_head: Linear, (cos, sin): (Tensor, Tensor), tp: Option<crate::tp::TpRank>) -> Model {
        Model { cfg, dtype, device, path, embed, layers, norm, lm_head, cos, sin, fused: true, gated: true, fused_quantize: fused_quantize_default(), tp, paged_prefill: paged_prefill_default() }
    }

    /// `(rank, world)` of a tensor-parallel shard; `(0, 1)` for a whole model.
    pub fn tp_rank(&self) -> (usize, usize) {
        self.tp.as_ref().map_or((0, 1), |t| (t.plan.rank, t.plan.world))
    }

    /// Query and key/value heads this model (shard) holds.
    pub fn local_heads(&self) -> (usize, usize) {
        match &self.tp {
            Some(t) => (t.plan.local_heads(), t.plan.local_kv_heads()),
            None => (self.cfg.num_heads, self.cfg.num_kv_heads),
        }
    }

    /// A zeroed paged cache for every layer (of this shard's key/value heads).
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> Result<Vec<LayerCache>> {
        let nkv = self.local_heads().1;
        (0..self.cfg.num_layers).map(|_| Ok(LayerCache::new(num_blocks, block_size, nkv, self.cfg.head_dim, self.dtype, &self.device)?)).collect()
    }

    /// The rank-sum of a row-parallel product's partial sums (identity without tensor parallelism).
    fn tp_sum(&self, x: Tensor) -> candle_core::Result<Tensor> {
        match &self.tp {
            Some(t) => t.comm.all_reduce_sum(&x),
            None => Ok(x),
        }
    }

    /// The embedding rows of `tokens`: with a vocabulary-parallel table, see
    /// [`crate::tp::TpRank::embed_rows`] (device ops only, so a decode step can be captured).
    fn embed_tokens(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        match &self.tp {
            Some(t) => t.embed_rows(&self.embed, tokens),
            None => self.embed.index_select(tokens, 0),
        }
    }

    /// Logits of the final hidden rows `h`: with a vocabulary-parallel head, every rank's
    /// columns gathered in rank order.
    fn head(&self, h: &Tensor) -> candle_core::Result<Tensor> {
        let y = self.lm_head.forward(h)?;
        let Some(t) = &self.tp else { return Ok(y) };
        let (rows, local) = y.dims2()?;
        let all = t.comm.all_gather(&y.contiguous()?)?; // [world, rows, local]
        all.transpose(0, 1)?.contiguous()?.reshape((rows, t.plan.world * local))
    }

    /// The forward of a packed batch: `tokens`/`positions`/`slots` (where each token's K/V
    /// goes) `[T]`, the batch's attention views, and the packed rows whose logits are wanted.
    /// Returns `[rows, vocab]` f32, or `None` when no row samples (the K/V are written anyway).
    pub fn forward(&self, tokens: &[u32], positions: &[u32], slots: &[u32], attn: &AttnBatch, sample_rows: &[u32], cache: &[LayerCache]) -> Result<Option<Tensor>> {
        let dev = &self.device;
        let tokens = Tensor::new(tokens, dev)?;
        let index = self.kv_index(slots, positions, cache)?;
        if sample_rows.is_empty() {
            // The K/V still go to the cache: the layers without the head.
            self.layers_forward(&tokens, &index, attn, cache)?;
            return Ok(None);
        }
        let rows = Tensor::new(sample_rows, dev)?;
        Ok(Some(self.forward_on(&tokens, &index, attn, Some(&rows), cache)?))
    }

    /// The step's [`KvIndex`] for `cache`: its write slots and rope positions, checked and
    /// uploaded once.
    pub fn kv_index(&self, slots: &[u32], positions: &[u32], cache: &[LayerCache]) -> Result<KvIndex> {
        let (num_blocks, block_size) = match cache.first() {
            Some(lc) => (lc.k.dim(0)?, lc.k.dim(1)?),
            None => (0, 1),
        };
        Ok(KvIndex::new(&self.device, slots, positions, (&self.cos, &self.sin), self.fused, num_blocks, block_size)?)
    }

    /// The forward of a packed batch whose inputs are on the device already: `tokens [T]`
    /// u32, the step's [`KvIndex`] and attention views, and the packed rows whose logits are
    /// wanted (`None`: every row). Returns `[rows, vocab]` f32. It reads nothing back from
    /// the device and makes no tensor from host data, so it can be captured into a graph
    /// (the runner's decode steps) once its inputs live in persistent buffers.
    pub fn forward_on(&self, tokens: &Tensor, index: &KvIndex, attn: &AttnBatch, sample_rows: Option<&Tensor>, cache: &[LayerCache]) -> candle_core::Result<Tensor> {
        let h = self.layers_forward(tokens, index, attn, cache)?;
        let h = match sample_rows {
            Some(r) => h.index_select(r, 0)?,
            None => h,
        };
        self.head(&h)?.to_dtype(DType::F32)
    }

    /// Every layer of the packed batch and the final norm: the normed residual stream after
    /// the last layer, `[T, hidden]` (the norm is per row, so it runs before the rows that
    /// sample are picked, fused with the last residual add).
    fn layers_forward(&self, tokens: &Tensor, index: &KvIndex, attn: &AttnBatch, cache: &[LayerCache]) -> candle_core::Result<Tensor> {
        let c = &self.cfg;
        let t = tokens.dim(0)?;
        let ((nh, nkv), hd) = (self.local_heads(), c.head_dim);
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self.embed_tokens(tokens)?;
        let eps = c.rms_norm_eps;
        // GGUF decode (few rows): the kernels that make a quantized product's input also
        // write its q8_1 codes, which the product's int8 matvec reads (no quantize launch).
        let q8 = self.fused_quantize && self.fused && on_our_device(&self.device) && (1..=candle_rocm::quantized::CODES_MAX_ROWS).contains(&t);
        let mut h = match self.layers.first() {
            Some(l) if q8 && l.qkv_quantized() => candle_rocm::llm_ops::add_rms_norm_q8(&x, None, &l.input_norm, eps)?.1,
            Some(l) => rms_norm(&x, &l.input_norm, eps)?,
            None => x.clone(),
        };
        // Fresh prefill chunks attend over the step's own keys and values, which the rope
        // launch then also writes contiguous (no gather out of the cache).
        let own_keys = attn.varlen.as_ref().is_some_and(VarlenChunks::own_keys);
        for (i, (layer, lc)) in self.layers.iter().zip(cache).enumerate() {
            // One product for q, k and v where the weights are stacked: q, k, v are views of
            // its heads (no copy), which rope_and_cache reads in place.
            let (mut q, mut k, v) = match &layer.qkv {
                Some(qkv) => {
                    let y = qkv.forward(&h)?.reshape((t, nh + 2 * nkv, hd))?;
                    (y.narrow(1, 0, nh)?, y.narrow(1, nh, nkv)?, y.narrow(1, nh + nkv, nkv)?)
                }
                None => match (&layer.q, &layer.k, &layer.v) {
                    (Some(q), Some(k), Some(v)) => (q.forward(&h)?.reshape((t, nh, hd))?, k.forward(&h)?.reshape((t, nkv, hd))?, v.forward(&h)?.reshape((t, nkv, hd))?),
                    _ => return Err(candle_core::Error::Msg(format!("layer {i} has no q/k/v weights"))),
                },
            };
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                // (Qwen3: the norms take contiguous rows, so q and k are copied here.)
                q = rms_norm(&q, qn, eps)?;
                k = rms_norm(&k, kn, eps)?;
            }
            let (q, own) = rope_append_kv(lc, &q, &k, &v, index, (&self.cos, &self.sin), c.rope_interleaved, own_keys)?;
            let a = paged_attention(&q, lc, attn, scale, own.as_ref())?;
            let o = self.tp_sum(layer.o.forward(&a)?)?;
            let (x1, h1) = match q8 && layer.mlp_quantized() {
                true => candle_rocm::llm_ops::add_rms_norm_q8(&o, Some(&x), &layer.post_norm, eps)?,
                false => add_rms_norm(&o, &x, &layer.post_norm, eps, self.fused)?,
            };
            let act = match (&layer.gate_up, &layer.gate, &layer.up) {
                (Some(gu), ..) if q8 && gu.quantized() && layer.down.quantized() => candle_rocm::llm_ops::silu_mul_q8(&gu.forward(&h1)?)?,
                (Some(gu), ..) => gate_up_silu(gu, &h1, self.fused, self.gated)?,
                (None, Some(gate), Some(up)) => silu_mul(&gate.forward(&h1)?, &up.forward(&h1)?)?,
                _ => return Err(candle_core::Error::Msg(format!("layer {i} has no gate/up weights"))),
            };
            let m = self.tp_sum(layer.down.forward(&act)?)?;
            // The residual add and the next layer's input norm (after the last layer, the
            // final norm) in one.
            // The head's input keeps its own quantization (the rows that sample are picked
            // out of it first).
            (x, h) = match self.layers.get(i + 1) {
                Some(next) if q8 && next.qkv_quantized() => candle_rocm::llm_ops::add_rms_norm_q8(&m, Some(&x1), &next.input_norm, eps)?,
                next => add_rms_norm(&m, &x1, next.map_or(&self.norm, |n| &n.input_norm), eps, self.fused)?,
            };
        }
        if self.layers.is_empty() {
            h = rms_norm(&x, &self.norm, eps)?;
        }
        Ok(h)
    }

    /// `false`: every op runs as plain Candle ops even on our device (the reference the
    /// fused path is tested against); `true` (the default): fused kernels where the
    /// device has them.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on;
    }

    /// `false`: decode's gate/up product and `silu(gate) * up` run as two kernels (the
    /// matvec, then `silu_mul`) even where the gated matvec applies; `true` (the default):
    /// one gated-matvec kernel where it applies (fused on, our device, at most 8 rows and
    /// the kernel the faster form there). `CANDLE_ROCM_GATED_MATVEC=0` turns it off for the
    /// whole process (an A/B without code changes).
    pub fn set_gated_matvec(&mut self, on: bool) {
        self.gated = on;
    }

    /// `false`: the GGUF products quantize their inputs themselves (a launch each); `true`
    /// (the default unless `LLM_FUSED_QUANTIZE=0` is in the environment): on our device, with fused on and at most
    /// `candle_rocm::quantized::CODES_MAX_ROWS` rows, the residual norms and the MLP's
    /// activation write the q8_1 codes of the quantized products' inputs in the same
    /// launch (`candle_rocm::llm_ops::add_rms_norm_q8`, `silu_mul_q8`): the same codes, no
    /// quantize launch before the q|k|v, gate|up and down products.
    pub fn set_fused_quantize(&mut self, on: bool) {
        self.fused_quantize = on;
    }

    /// Whether this step's attention runs on the kernels: our device, fused on, f16/bf16
    /// activations (the attention kernels' dtypes) and a head size they have.
    pub fn kernel_attention(&self) -> bool {
        self.fused && on_our_device(&self.device) && matches!(self.dtype, DType::F16 | DType::BF16) && attention::flash::HEAD_DIMS.contains(&self.cfg.head_dim)
    }

    /// `false`: prefill chunks with a cached prefix gather their contexts out of the cache
    /// for the varlen flash kernel (the path before the paged prefill kernel, kept as the
    /// reference); `true` (the default unless `LLM_PAGED_PREFILL=0` is in the environment,
    /// an A/B without code changes): the paged prefill kernel reads them through the block
    /// tables where it has the head size.
    pub fn set_paged_prefill(&mut self, on: bool) {
        self.paged_prefill = on;
    }

    /// Whether this step's chunks with a cached prefix take the paged prefill kernel:
    /// [`Model::kernel_attention`], a head size it is built for, and not turned off.
    pub fn paged_prefill(&self) -> bool {
        self.paged_prefill && self.kernel_attention() && attention::prefill::PREFILL_HEAD_DIMS.contains(&self.cfg.head_dim)
    }

    /// Largest position the rope tables cover, plus one.
    pub fn max_positions(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// Sliding window, if the model has one.
    pub fn window(&self) -> Option<usize> {
        self.cfg.sliding_window
    }
}

/// `true` unless `LLM_PAGED_PREFILL=0` is in the environment (read when a model is built).
fn paged_prefill_default() -> bool {
    !env_off("LLM_PAGED_PREFILL")
}

/// `true` unless `LLM_FUSED_QUANTIZE=0` is in the environment (read when a model is built).
fn fused_quantize_default() -> bool {
    !env_off("LLM_FUSED_QUANTIZE")
}

/// Whether the A/B switch `var` is set to `0`.
pub(crate) fn env_off(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "0")
}

/// Builds the `[len, ctx]` additive mask of a chunk starting at `start`: causal, plus the
/// sliding window `w` (a query at `p` sees keys `k` with `p - w < k <= p`).
pub fn chunk_mask(start: usize, len: usize, window: Option<usize>) -> Vec<f32> {
    let ctx = start + len;
    let mut m = vec![0f32; len * ctx];
    for i in 0..len {
        let p = start + i;
        for k in 0..ctx {
            let visible = k <= p && window.is_none_or(|w| p - k < w);
            if !visible {
                m[i * ctx + k] = f32::NEG_INFINITY;
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// A tiny llama GGUF of `storage` and its content, with the file open.
    fn tiny(dir: &Path, storage: gguf_llama::Storage) -> (gguf_file::Content, std::fs::File) {
        let path = dir.join(format!("{storage:?}.gguf"));
        gguf_llama::write_gguf(&path, &gguf_llama::LlamaShape::TINY, storage, 4).unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        (gguf_file::Content::read(&mut f).unwrap(), f)
    }

    /// A GGUF whose q/k/v and gate/up share a block type loads only the stacked products:
    /// no layer holds the separate ones (read once from the file, one copy on the device).
    #[test]
    fn stacked_gguf_layers_hold_no_separate_products() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        gguf_llama::write_gguf(&path, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(GgmlDType::Q4K), 4).unwrap();
        let m = Model::load_gguf(&path, &Device::Cpu).unwrap();
        assert!(!m.layers.is_empty());
        for (i, l) in m.layers.iter().enumerate() {
            assert!(l.qkv.as_ref().is_some_and(Linear::quantized), "layer {i}: no stacked q|k|v");
            assert!(l.gate_up.as_ref().is_some_and(Linear::quantized), "layer {i}: no stacked gate|up");
            assert!(l.q.is_none() && l.k.is_none() && l.v.is_none(), "layer {i} keeps separate q/k/v");
            assert!(l.gate.is_none() && l.up.is_none(), "layer {i} keeps separate gate/up");
            assert!(l.qkv_quantized() && l.mlp_quantized() && l.down.quantized());
        }
    }

    /// `stack_gguf` stacks matrices of one block type and width into one product whose
    /// rows are the separate products' rows (the same Candle CPU kernel per row: equal bit
    /// for bit), and declines widths that differ and float tensors.
    #[test]
    fn stack_gguf_stacks_one_block_type_and_declines_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Device::Cpu;
        let (ct, mut f) = tiny(dir.path(), gguf_llama::Storage::Quantized(GgmlDType::Q4_0));
        let names = ["blk.1.ffn_gate".to_string(), "blk.1.ffn_up".to_string()];
        let stacked = stack_gguf(&ct, &mut f, &names, false, &dev, DType::F32).unwrap().expect("one block type: stacked");
        let x = Tensor::arange(0u32, 3 * 256, &dev).unwrap().to_dtype(DType::F32).unwrap().reshape((3, 256)).unwrap().affine(0.01, -3.0).unwrap().sin().unwrap();
        let y = stacked.forward(&x).unwrap();
        let parts: Vec<Tensor> = names.iter().map(|n| QMatMul::from_qtensor(ct.tensor(&mut f, &format!("{n}.weight"), &dev).unwrap()).unwrap().forward(&x).unwrap()).collect();
        let want = Tensor::cat(&parts, 1).unwrap();
        assert_eq!(y.dims(), &[3, 1024]);
        assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        // gate (512 x 256) and down (256 x 512): widths differ.
        let mixed = ["blk.1.ffn_gate".to_string(), "blk.1.ffn_down".to_string()];
        assert!(stack_gguf(&ct, &mut f, &mixed, false, &dev, DType::F32).unwrap().is_none());
        let missing = ["blk.1.ffn_gate".to_string(), "blk.9.ffn_up".to_string()];
        assert!(stack_gguf(&ct, &mut f, &missing, false, &dev, DType::F32).unwrap().is_none());
        let (ct32, mut f32file) = tiny(dir.path(), gguf_llama::Storage::Dequantized(GgmlDType::Q4_0));
        assert!(stack_gguf(&ct32, &mut f32file, &names, false, &dev, DType::F32).unwrap().is_none(), "float tensors stay plain weights");
    }
}
