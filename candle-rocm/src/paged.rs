//! Decode attention over a paged KV cache on Candle tensors of this backend:
//! [`reshape_and_cache`] writes a step's keys and values into their cache blocks,
//! [`rope_and_cache`] does the same with the rotary embedding applied to the keys (and,
//! in the same launch, to the queries), and [`paged_attention`] attends one query token per
//! sequence over its cached context. Kernels: [`attention::paged`], [`attention::cache`].
//!
//! Layouts (as vLLM and candle-vllm):
//! - caches `[num_blocks, block_size, kv_heads, head_dim]` (one tensor each for keys and
//!   values, allocated whole, e.g. `Tensor::zeros`; written in place);
//! - `key`, `value [tokens, kv_heads, head_dim]`, `slot_mapping [tokens]` (`block *
//!   block_size + row`, negative: padding, not written);
//! - `q [batch, heads, head_dim]`, `block_tables [batch, max_blocks]` (token `t` of sequence
//!   `b` lives in block `block_tables[b][t / block_size]`), `context_lens [batch]` (cached
//!   tokens, the new one included).
//!
//! Index tensors (`slot_mapping`, `positions`, `block_tables`, `context_lens`) are u32, i32
//! or i64 and may live on the device: each call reads them back to the host, checks every
//! entry (a slot or block outside the cache, a repeated slot, a context longer than its
//! block table row are errors naming the argument, and nothing is written) and uploads
//! them for the kernel.
//!
//! The `*_indexed` forms take a step's indices as a [`CacheIndex`] / [`DecodeIndex`]:
//! checked once on the host when built and uploaded once, then used by every layer's call
//! with no host read and no upload (no device sync per layer, and launches that a graph
//! can capture).
//!
//! These run on rocm-kernels devices only; a tensor on another device is an error naming
//! it.
use crate::buffer::BufElem;
use crate::device::RocmDevice;
use crate::error::invalid;
use crate::tensor_access::{buf_mut, dims_n, distinct_storage, dtype_is, host_ints, host_u32, input, output, rocm_device, row_strided, same_device, whole_buffer, with_mut};
use attention::cache::host::{rope_and_cache_rows, rope_and_cache_rows_unchecked, RopeCacheIo, RopeCacheShape, Rows};
use attention::paged::host::{paged_attention as paged_decode, paged_attention_with_counters, reshape_and_cache_rows, PagedShape};
use attention::{AttentionError, FlashElem};
use candle_core::{DType, Result, Tensor};
use half::{bf16, f16};
use kernel_dsl::Float;

fn err(op: &str, e: AttentionError) -> candle_core::Error {
    match e {
        AttentionError::HeadDim(_) => invalid(op, format!("argument `q`: {e}")),
        e => invalid(op, e),
    }
}

/// The checked geometry of a cache write: `(tokens, kv_heads, head_dim)` of `key`.
fn cache_write_checks(op: &str, key: &Tensor, value: &Tensor, key_cache: &Tensor, value_cache: &Tensor, slot_mapping: &Tensor) -> Result<(usize, usize, usize)> {
    let kd = dims_n(op, "key", key, 3, "[tokens, kv_heads, head_dim]")?;
    let (tokens, kvh, d) = (kd[0], kd[1], kd[2]);
    if value.dims() != kd {
        return Err(invalid(op, format!("argument `value` has shape {:?}; expected key's {:?}", value.shape(), key.shape())));
    }
    let cd = dims_n(op, "key_cache", key_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")?;
    if cd[2] != kvh || cd[3] != d {
        return Err(invalid(op, format!("argument `key_cache` has shape {:?}; key {:?} needs [num_blocks, block_size, {kvh}, {d}]", key_cache.shape(), key.shape())));
    }
    if value_cache.dims() != cd {
        return Err(invalid(op, format!("argument `value_cache` has shape {:?}; expected key_cache's {:?}", value_cache.shape(), key_cache.shape())));
    }
    if slot_mapping.dims() != [tokens] {
        return Err(invalid(op, format!("argument `slot_mapping` has shape {:?}; expected [{tokens}]", slot_mapping.shape())));
    }
    if !matches!(key.dtype(), DType::F16 | DType::BF16 | DType::F32) {
        return Err(invalid(op, format!("argument `key` has dtype {:?}; expected f16, bf16 or f32", key.dtype())));
    }
    for (name, t) in [("value", value), ("key_cache", key_cache), ("value_cache", value_cache)] {
        dtype_is(op, name, t, key.dtype())?;
    }
    let dev = rocm_device(op, "key_cache", key_cache)?.as_candle();
    for (name, t) in [("key", key), ("value", value), ("value_cache", value_cache), ("slot_mapping", slot_mapping)] {
        same_device(op, name, t, &dev)?;
    }
    whole_buffer(op, "key_cache", key_cache)?;
    whole_buffer(op, "value_cache", value_cache)?;
    Ok((tokens, kvh, d))
}

/// Writes `key`, `value [tokens, kv_heads, head_dim]` into `key_cache`, `value_cache
/// [num_blocks, block_size, kv_heads, head_dim]` at `slot_mapping [tokens]` (negative:
/// skipped) in place. f16, bf16 or f32. Slots must be distinct and inside the caches.
pub fn reshape_and_cache(key: &Tensor, value: &Tensor, key_cache: &Tensor, value_cache: &Tensor, slot_mapping: &Tensor) -> Result<()> {
    const OP: &str = "reshape_and_cache";
    let (_, kvh, d) = cache_write_checks(OP, key, value, key_cache, value_cache, slot_mapping)?;
    distinct_storage(OP, &[("key_cache", key_cache), ("value_cache", value_cache)], &[("key", key), ("value", value)])?;
    let slots = host_ints(OP, "slot_mapping", slot_mapping)?;
    let dev = rocm_device(OP, "key_cache", key_cache)?;
    dev.profiled(
        || "reshape_and_cache".into(),
        key.dtype(),
        || match key.dtype() {
            DType::F16 => write_on::<f16>(dev, kvh * d, key, value, key_cache, value_cache, &slots),
            DType::BF16 => write_on::<bf16>(dev, kvh * d, key, value, key_cache, value_cache, &slots),
            _ => write_on::<f32>(dev, kvh * d, key, value, key_cache, value_cache, &slots),
        },
    )
}

fn write_on<T: BufElem + kernel_dsl::Element + kernel_dsl::host::ScalarArg>(
    dev: &RocmDevice,
    row: usize,
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    slots: &[i64],
) -> Result<()> {
    const OP: &str = "reshape_and_cache";
    let ((ks, kl), (vs, vl)) = (key.storage_and_layout(), value.storage_and_layout());
    let (k, v) = (input::<T>(OP, "key", dev, &ks, kl)?, input::<T>(OP, "value", dev, &vs, vl)?);
    with_mut(key_cache, |kc| {
        with_mut(value_cache, |vc| {
            let kc = buf_mut::<T>(OP, "key_cache", kc)?;
            let vc = buf_mut::<T>(OP, "value_cache", vc)?;
            reshape_and_cache_rows(dev.kernels(), row, &k, &v, kc, vc, slots).map_err(|e| err(OP, e))
        })
    })
}

/// The rotary embedding [`rope_and_cache`] applies: Candle's tables and each token's
/// position.
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    /// `[max_positions, head_dim / 2]`, the dtype of the keys (as
    /// `candle_nn::rotary_emb::rope` takes them).
    pub cos: &'a Tensor,
    /// Like `cos`.
    pub sin: &'a Tensor,
    /// `[tokens]` (u32, i32 or i64): the table row of each token.
    pub positions: &'a Tensor,
    /// `true`: `rope_i`'s interleaved pairs `(x[2i], x[2i + 1])`; `false`: `rope`'s
    /// half-split pairs `(x[i], x[i + head_dim / 2])`, as llama.
    pub interleaved: bool,
}

/// [`reshape_and_cache`] with the keys rotated by `rope` on their way into the cache (the
/// values unchanged), and, when `q [tokens, heads, head_dim]` is given, the queries
/// rotated by the same positions in the same launch: returns the rotated queries (a new
/// contiguous tensor). Equals `candle_nn::rotary_emb::rope` (or `rope_i`) of the keys and
/// queries at their positions followed by [`reshape_and_cache`], in one launch; the
/// rotation runs in f32 and rounds once. `key`, `value` and `q` whose rows are each
/// contiguous and evenly spaced (e.g. `narrow`s of the heads of one stacked q/k/v product
/// `[tokens, heads + 2 kv_heads, head_dim]`) are read in place; other layouts are copied
/// first.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache(
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    slot_mapping: &Tensor,
    rope: Rope<'_>,
    q: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    const OP: &str = "rope_and_cache";
    let (tokens, kvh, d) = cache_write_checks(OP, key, value, key_cache, value_cache, slot_mapping)?;
    let dev = rocm_device(OP, "key_cache", key_cache)?;
    let cd = dev.as_candle();
    for (name, t) in [("cos", rope.cos), ("sin", rope.sin)] {
        let td = dims_n(OP, name, t, 2, "[max_positions, head_dim / 2]")?;
        if td[1] * 2 != d {
            return Err(invalid(OP, format!("argument `{name}` has shape {:?}; head_dim {d} needs [max_positions, {}]", t.shape(), d / 2)));
        }
        dtype_is(OP, name, t, key.dtype())?;
        same_device(OP, name, t, &cd)?;
    }
    if rope.sin.dims() != rope.cos.dims() {
        return Err(invalid(OP, format!("argument `sin` has shape {:?}; cos has {:?}", rope.sin.shape(), rope.cos.shape())));
    }
    if rope.positions.dims() != [tokens] {
        return Err(invalid(OP, format!("argument `positions` has shape {:?}; expected [{tokens}]", rope.positions.shape())));
    }
    same_device(OP, "positions", rope.positions, &cd)?;
    let heads = match q {
        Some(q) => {
            let qd = dims_n(OP, "q", q, 3, "[tokens, heads, head_dim]")?;
            if qd[0] != tokens || qd[2] != d {
                return Err(invalid(OP, format!("argument `q` has shape {:?}; expected [{tokens}, heads, {d}]", q.shape())));
            }
            dtype_is(OP, "q", q, key.dtype())?;
            same_device(OP, "q", q, &cd)?;
            qd[1]
        }
        None => 0,
    };
    let mut srcs = vec![("key", key), ("value", value), ("cos", rope.cos), ("sin", rope.sin)];
    if let Some(q) = q {
        srcs.push(("q", q));
    }
    distinct_storage(OP, &[("key_cache", key_cache), ("value_cache", value_cache)], &srcs)?;
    let slots = host_ints(OP, "slot_mapping", slot_mapping)?;
    let positions = host_u32(OP, "positions", rope.positions)?;
    let shape = RopeCacheShape { tokens, kv_heads: kvh, heads, head_dim: d, interleaved: rope.interleaved };
    dev.profiled(
        || "rope_and_cache".into(),
        key.dtype(),
        || match key.dtype() {
            DType::F16 => rope_on::<f16>(dev, shape, key, value, key_cache, value_cache, &slots, &positions, &rope, q),
            DType::BF16 => rope_on::<bf16>(dev, shape, key, value, key_cache, value_cache, &slots, &positions, &rope, q),
            _ => rope_on::<f32>(dev, shape, key, value, key_cache, value_cache, &slots, &positions, &rope, q),
        },
    )
}

/// The kernel's operands of a call: keys, values and queries read in place where their
/// rows allow ([`row_strided`]), fresh outputs for the rotated queries and, with `kv_out`,
/// the contiguous rotated keys and values; then `f` launches with them.
#[allow(clippy::too_many_arguments)]
fn with_io<T: BufElem + Float>(
    op: &'static str,
    dev: &RocmDevice,
    shape: RopeCacheShape,
    key: &Tensor,
    value: &Tensor,
    q: Option<&Tensor>,
    kv_out: bool,
    f: impl FnOnce(RopeCacheIo<'_, T>) -> Result<()>,
) -> Result<RopeCacheOut> {
    let RopeCacheShape { tokens, kv_heads, heads, head_dim, .. } = shape;
    let ((ks, kl), (vs, vl)) = (key.storage_and_layout(), value.storage_and_layout());
    let (k, k_at, k_stride) = row_strided::<T>(op, "key", dev, &ks, kl)?;
    let (v, v_at, v_stride) = row_strided::<T>(op, "value", dev, &vs, vl)?;
    let qs = q.map(|q| q.storage_and_layout());
    let qi = match &qs {
        Some((s, l)) => Some(row_strided::<T>(op, "q", dev, s, l)?),
        None => None,
    };
    let kd = dev.kernels();
    let mut q_out = match q {
        Some(_) => Some(kd.alloc_uninit::<T>(tokens * heads * head_dim).map_err(crate::error::at(op))?),
        None => None,
    };
    let mut kv = match kv_out {
        true => Some((kd.alloc_uninit::<T>(tokens * kv_heads * head_dim).map_err(crate::error::at(op))?, kd.alloc_uninit::<T>(tokens * kv_heads * head_dim).map_err(crate::error::at(op))?)),
        false => None,
    };
    let io = RopeCacheIo {
        k: Rows::new(&k, k_at, k_stride),
        v: Rows::new(&v, v_at, v_stride),
        q: match (&qi, q_out.as_mut()) {
            (Some((qb, at, stride)), Some(out)) => Some((Rows::new(qb, *at, *stride), out)),
            _ => None,
        },
        kv_out: kv.as_mut().map(|(a, b)| (a, b)),
    };
    f(io)?;
    let rows = (tokens, kv_heads, head_dim);
    Ok(RopeCacheOut { q: q_out.map(|o| output(dev, o, (tokens, heads, head_dim))), kv: kv.map(|(a, b)| (output(dev, a, rows), output(dev, b, rows))) })
}

/// [`with_io`], then `launch` once with the operands and both caches borrowed as mutable
/// kernel buffers (the nest every `rope_and_cache` form shares).
#[allow(clippy::type_complexity)]
fn with_io_caches<T: BufElem + Float>(
    op: &'static str,
    dev: &RocmDevice,
    shape: RopeCacheShape,
    (key, value, q, kv_out): (&Tensor, &Tensor, Option<&Tensor>, bool),
    (key_cache, value_cache): (&Tensor, &Tensor),
    launch: impl FnOnce(RopeCacheIo<'_, T>, &mut kernels::runtime::DeviceVec<T>, &mut kernels::runtime::DeviceVec<T>) -> Result<()>,
) -> Result<RopeCacheOut> {
    with_io::<T>(op, dev, shape, key, value, q, kv_out, |io| {
        // `with_mut` takes `FnMut`: the operands and the launch are used once.
        let mut once = Some((io, launch));
        with_mut(key_cache, |kc| {
            with_mut(value_cache, |vc| {
                let kc = buf_mut::<T>(op, "key_cache", kc)?;
                let vc = buf_mut::<T>(op, "value_cache", vc)?;
                let (io, launch) = once.take().ok_or_else(|| invalid(op, "the caches were written twice"))?;
                launch(io, kc, vc)
            })
        })
    })
}

#[allow(clippy::too_many_arguments)]
fn rope_on<T: BufElem + Float>(
    dev: &RocmDevice,
    shape: RopeCacheShape,
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    slots: &[i64],
    positions: &[u32],
    rope: &Rope<'_>,
    q: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    const OP: &str = "rope_and_cache";
    let ((cs, cl), (ss, sl)) = (rope.cos.storage_and_layout(), rope.sin.storage_and_layout());
    let (cos, sin) = (input::<T>(OP, "cos", dev, &cs, cl)?, input::<T>(OP, "sin", dev, &ss, sl)?);
    let out = with_io_caches::<T>(OP, dev, shape, (key, value, q, false), (key_cache, value_cache), |io, kc, vc| {
        rope_and_cache_rows(dev.kernels(), shape, io, kc, vc, slots, positions, &cos, &sin).map_err(|e| err(OP, e))
    })?;
    Ok(out.q)
}

/// One decode step: `out[b, h] = softmax(q[b, h] . K_b^T * softmax_scale) V_b` over the
/// `context_lens[b]` cached tokens of sequence `b`, found through `block_tables [batch,
/// max_blocks]`; `q [batch, heads, head_dim]` (f16 or bf16), caches `[num_blocks,
/// block_size, kv_heads, head_dim]` (grouped-query: `kv_heads` divides `heads`, at most
/// [`attention::paged::MAX_GROUP`] query heads per KV head). Returns `[batch, heads,
/// head_dim]`; an empty context gives zeros. Long contexts with few sequences are split
/// (flash-decoding) and merged.
pub fn paged_attention(q: &Tensor, key_cache: &Tensor, value_cache: &Tensor, block_tables: &Tensor, context_lens: &Tensor, softmax_scale: f32) -> Result<Tensor> {
    Ok(paged_attention_lse(q, key_cache, value_cache, block_tables, context_lens, softmax_scale)?.0)
}

/// [`paged_attention`] that also returns each row's natural log-sum-exp, f32 `[batch,
/// heads]` (`-inf` for an empty context), for merging with attention over other keys.
pub fn paged_attention_lse(
    q: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    block_tables: &Tensor,
    context_lens: &Tensor,
    softmax_scale: f32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "paged_attention";
    let qd = dims_n(OP, "q", q, 3, "[batch, heads, head_dim]")?;
    let (batch, heads, d) = (qd[0], qd[1], qd[2]);
    let cd = dims_n(OP, "key_cache", key_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")?;
    let (num_blocks, block_size, kvh) = (cd[0], cd[1], cd[2]);
    if cd[3] != d {
        return Err(invalid(OP, format!("argument `key_cache` has shape {:?}; q {:?} needs head_dim {d}", key_cache.shape(), q.shape())));
    }
    if value_cache.dims() != cd {
        return Err(invalid(OP, format!("argument `value_cache` has shape {:?}; expected key_cache's {:?}", value_cache.shape(), key_cache.shape())));
    }
    let bt = dims_n(OP, "block_tables", block_tables, 2, "[batch, max_blocks]")?;
    if bt[0] != batch {
        return Err(invalid(OP, format!("argument `block_tables` has shape {:?}; expected [{batch}, max_blocks]", block_tables.shape())));
    }
    if context_lens.dims() != [batch] {
        return Err(invalid(OP, format!("argument `context_lens` has shape {:?}; expected [{batch}]", context_lens.shape())));
    }
    if !matches!(q.dtype(), DType::F16 | DType::BF16) {
        return Err(invalid(OP, format!("argument `q` has dtype {:?}; expected f16 or bf16", q.dtype())));
    }
    dtype_is(OP, "key_cache", key_cache, q.dtype())?;
    dtype_is(OP, "value_cache", value_cache, q.dtype())?;
    let dev = rocm_device(OP, "q", q)?;
    let candle_dev = dev.as_candle();
    for (name, t) in [("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables), ("context_lens", context_lens)] {
        same_device(OP, name, t, &candle_dev)?;
    }
    let tables = host_u32(OP, "block_tables", block_tables)?;
    let lens = host_u32(OP, "context_lens", context_lens)?;
    let shape = PagedShape { batch, heads, kv_heads: kvh, head_dim: d, num_blocks, block_size };
    dev.profiled(
        || "paged_attention".into(),
        q.dtype(),
        || match q.dtype() {
            DType::F16 => decode_on::<f16>(dev, shape, q, key_cache, value_cache, &tables, &lens, softmax_scale),
            _ => decode_on::<bf16>(dev, shape, q, key_cache, value_cache, &tables, &lens, softmax_scale),
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn decode_on<T: FlashElem + BufElem>(
    dev: &RocmDevice,
    shape: PagedShape,
    q: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    tables: &[u32],
    lens: &[u32],
    scale: f32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "paged_attention";
    let PagedShape { batch, heads, head_dim, .. } = shape;
    let ((qs, ql), (ks, kl), (vs, vl)) = (q.storage_and_layout(), key_cache.storage_and_layout(), value_cache.storage_and_layout());
    let q = input::<T>(OP, "q", dev, &qs, ql)?;
    let kc = input::<T>(OP, "key_cache", dev, &ks, kl)?;
    let vc = input::<T>(OP, "value_cache", dev, &vs, vl)?;
    let kd = dev.kernels();
    let mut out = kd.alloc_uninit::<T>(batch * heads * head_dim).map_err(crate::error::at(OP))?;
    let mut lse = kd.alloc_uninit::<f32>(batch * heads).map_err(crate::error::at(OP))?;
    paged_decode(kd, shape, &q, &kc, &vc, tables, lens, &mut out, &mut lse, scale, None).map_err(|e| err(OP, e))?;
    Ok((output(dev, out, (batch, heads, head_dim)), output(dev, lse, (batch, heads))))
}

/// A step's cache-write indices on the device, checked once on the host: `slot_mapping`
/// (i64, negative: skipped) and `positions` (u32) of every new token, for a cache of
/// `num_blocks` blocks of `block_size` tokens. Every layer's [`rope_and_cache_indexed`]
/// uses them with no host read.
#[derive(Debug)]
pub struct CacheIndex {
    slot_mapping: Tensor,
    positions: Tensor,
    num_blocks: usize,
    block_size: usize,
    /// Rows of the rope tables the positions need (largest position + 1).
    table_rows: usize,
}

impl CacheIndex {
    /// Checks (every non-negative slot inside the cache and distinct; as many positions as
    /// slots) and uploads to `dev`; an error names the argument.
    pub fn new(dev: &candle_core::Device, slot_mapping: &[i64], positions: &[u32], num_blocks: usize, block_size: usize) -> Result<Self> {
        const OP: &str = "CacheIndex::new";
        if RocmDevice::from_candle(dev).is_none() {
            return Err(invalid(OP, format!("argument `dev` is {dev:?}, not a rocm-kernels device")));
        }
        if positions.len() != slot_mapping.len() {
            return Err(invalid(OP, format!("argument `positions` has {} entries; slot_mapping has {}", positions.len(), slot_mapping.len())));
        }
        let slots = num_blocks.checked_mul(block_size).ok_or_else(|| invalid(OP, "argument `num_blocks`: cache size overflows"))?;
        let mut seen = std::collections::HashSet::new();
        for (t, &s) in slot_mapping.iter().enumerate() {
            if s >= 0 && (s as u64 >= slots as u64 || !seen.insert(s)) {
                return Err(invalid(OP, format!("argument `slot_mapping`: token {t}: slot {s} is outside the {slots} cache slots or repeated")));
            }
        }
        let table_rows = positions.iter().max().map_or(0, |&p| p as usize + 1);
        Ok(CacheIndex { slot_mapping: Tensor::new(slot_mapping, dev)?, positions: Tensor::new(positions, dev)?, num_blocks, block_size, table_rows })
    }

    /// A persistent index of `tokens` entries whose buffers keep their addresses (the
    /// inputs of a captured graph): every slot negative (nothing written), positions 0,
    /// for rope tables of at least `table_rows` rows. Fill it with [`CacheIndex::write`]
    /// before each run.
    pub fn with_capacity(dev: &candle_core::Device, tokens: usize, table_rows: usize, num_blocks: usize, block_size: usize) -> Result<Self> {
        const OP: &str = "CacheIndex::with_capacity";
        if RocmDevice::from_candle(dev).is_none() {
            return Err(invalid(OP, format!("argument `dev` is {dev:?}, not a rocm-kernels device")));
        }
        if tokens == 0 || table_rows == 0 || num_blocks.checked_mul(block_size).is_none() {
            return Err(invalid(OP, format!("{tokens} tokens, {table_rows} table rows, {num_blocks} blocks of {block_size}: every size must be positive")));
        }
        let slot_mapping = Tensor::new(vec![-1i64; tokens].as_slice(), dev)?;
        let positions = Tensor::zeros(tokens, DType::U32, dev)?;
        Ok(CacheIndex { slot_mapping, positions, num_blocks, block_size, table_rows })
    }

    /// Checks `slot_mapping` and `positions` (as [`CacheIndex::new`], as many entries as the
    /// index holds, every position below its `table_rows`) and copies them into this index's
    /// device buffers in place: same addresses, no allocation. Refused during a graph
    /// capture; an error writes nothing.
    pub fn write(&mut self, slot_mapping: &[i64], positions: &[u32]) -> Result<()> {
        const OP: &str = "CacheIndex::write";
        let n = self.tokens();
        if slot_mapping.len() != n || positions.len() != n {
            return Err(invalid(OP, format!("{} slots and {} positions into an index of {n} tokens", slot_mapping.len(), positions.len())));
        }
        let slots = self.num_blocks * self.block_size;
        let mut seen = std::collections::HashSet::new();
        for (t, &s) in slot_mapping.iter().enumerate() {
            if s >= 0 && (s as u64 >= slots as u64 || !seen.insert(s)) {
                return Err(invalid(OP, format!("argument `slot_mapping`: token {t}: slot {s} is outside the {slots} cache slots or repeated")));
            }
        }
        if let Some(p) = positions.iter().find(|&&p| p as usize >= self.table_rows) {
            return Err(invalid(OP, format!("argument `positions`: position {p} past the {} rope table rows of the index", self.table_rows)));
        }
        write_into(&self.slot_mapping, slot_mapping)?;
        write_into(&self.positions, positions)
    }

    /// The tokens this index writes.
    pub fn tokens(&self) -> usize {
        self.positions.dims1().unwrap_or(0)
    }

    /// `positions [tokens]` u32 on the device (for the ops that gather rope rows).
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }
}

/// A decode step's attention indices on the device, checked once on the host:
/// `block_tables [batch, max_blocks]` and `context_lens [batch]` (u32) for a cache of
/// `num_blocks` blocks of `block_size` tokens. Every layer's [`paged_attention_indexed`]
/// uses them with no host read.
#[derive(Debug)]
pub struct DecodeIndex {
    block_tables: Tensor,
    context_lens: Tensor,
    /// The in-launch merge's counters ([`COUNTERS_PER_SEQUENCE`] per row, zero between
    /// launches): allocated with the index, so their address is fixed for a captured graph
    /// and one buffer serves every layer of a step (the launches are ordered on the stream).
    counters: Tensor,
    max_context_len: usize,
    num_blocks: usize,
    block_size: usize,
}

/// Counters a [`DecodeIndex`] holds per sequence for the decode launch's in-launch merge
/// (`attention::paged::host::decode_counters`: one per KV head). A model of more KV heads
/// takes the plan without the in-launch merge.
pub const COUNTERS_PER_SEQUENCE: usize = 64;

impl DecodeIndex {
    /// Checks (each context fits its row of `max_blocks` entries, whose used blocks are
    /// inside the cache) and uploads to `dev`; an error names the argument.
    pub fn new(dev: &candle_core::Device, block_tables: &[u32], context_lens: &[u32], num_blocks: usize, block_size: usize) -> Result<Self> {
        const OP: &str = "DecodeIndex::new";
        if RocmDevice::from_candle(dev).is_none() {
            return Err(invalid(OP, format!("argument `dev` is {dev:?}, not a rocm-kernels device")));
        }
        let batch = context_lens.len();
        if batch == 0 || block_tables.is_empty() || !block_tables.len().is_multiple_of(batch) || block_size == 0 {
            return Err(invalid(OP, format!("argument `block_tables`: {} entries are not {batch} non-empty rows (block size {block_size})", block_tables.len())));
        }
        let max_blocks = block_tables.len() / batch;
        for (b, &c) in context_lens.iter().enumerate() {
            let need = (c as usize).div_ceil(block_size);
            if need > max_blocks {
                return Err(invalid(OP, format!("argument `context_lens`: sequence {b} has {c} tokens; its block table row holds {}", max_blocks * block_size)));
            }
            if let Some(&bad) = block_tables[b * max_blocks..][..need].iter().find(|&&x| x as usize >= num_blocks) {
                return Err(invalid(OP, format!("argument `block_tables`: sequence {b} names block {bad}; the cache has {num_blocks}")));
            }
        }
        let max_context_len = context_lens.iter().copied().max().unwrap_or(0) as usize;
        Ok(DecodeIndex {
            block_tables: Tensor::from_slice(block_tables, (batch, max_blocks), dev)?,
            context_lens: Tensor::new(context_lens, dev)?,
            counters: Tensor::zeros(batch * COUNTERS_PER_SEQUENCE, DType::U32, dev)?,
            max_context_len,
            num_blocks,
            block_size,
        })
    }

    /// A persistent index of `batch` rows of `max_blocks` block-table entries whose buffers
    /// keep their addresses (the inputs of a captured graph): every context empty. Its
    /// launches are sized for the longest context a row holds (`max_blocks * block_size`),
    /// not for a step's longest, so they can be replayed for any step. Fill it with
    /// [`DecodeIndex::write`] before each run.
    pub fn with_capacity(dev: &candle_core::Device, batch: usize, max_blocks: usize, num_blocks: usize, block_size: usize) -> Result<Self> {
        const OP: &str = "DecodeIndex::with_capacity";
        if RocmDevice::from_candle(dev).is_none() {
            return Err(invalid(OP, format!("argument `dev` is {dev:?}, not a rocm-kernels device")));
        }
        let cap = max_blocks.checked_mul(block_size).filter(|&c| c > 0 && c <= u32::MAX as usize);
        let Some(max_context_len) = cap.filter(|_| batch > 0) else {
            return Err(invalid(OP, format!("{batch} rows of {max_blocks} blocks of {block_size}: every size must be positive (and the rows hold under 2^32 tokens)")));
        };
        Ok(DecodeIndex {
            block_tables: Tensor::zeros((batch, max_blocks), DType::U32, dev)?,
            context_lens: Tensor::zeros(batch, DType::U32, dev)?,
            counters: Tensor::zeros(batch * COUNTERS_PER_SEQUENCE, DType::U32, dev)?,
            max_context_len,
            num_blocks,
            block_size,
        })
    }

    /// Block-table entries per row.
    pub fn max_blocks(&self) -> usize {
        self.block_tables.dims().get(1).copied().unwrap_or(0)
    }

    /// Checks `block_tables [batch, max_blocks]` and `context_lens [batch]` (as
    /// [`DecodeIndex::new`], in this index's shape) and copies them into its device buffers
    /// in place: same addresses, no allocation. Refused during a graph capture; an error
    /// writes nothing.
    pub fn write(&mut self, block_tables: &[u32], context_lens: &[u32]) -> Result<()> {
        const OP: &str = "DecodeIndex::write";
        let (batch, max_blocks) = (self.batch(), self.max_blocks());
        if context_lens.len() != batch || block_tables.len() != batch * max_blocks {
            return Err(invalid(OP, format!("{} block-table entries and {} lengths into an index of {batch} rows of {max_blocks}", block_tables.len(), context_lens.len())));
        }
        for (b, &c) in context_lens.iter().enumerate() {
            let need = (c as usize).div_ceil(self.block_size);
            if need > max_blocks || c as usize > self.max_context_len {
                return Err(invalid(OP, format!("argument `context_lens`: sequence {b} has {c} tokens; its block table row holds {}", max_blocks * self.block_size)));
            }
            if let Some(&bad) = block_tables[b * max_blocks..][..need].iter().find(|&&x| x as usize >= self.num_blocks) {
                return Err(invalid(OP, format!("argument `block_tables`: sequence {b} names block {bad}; the cache has {}", self.num_blocks)));
            }
        }
        write_into(&self.block_tables, block_tables)?;
        write_into(&self.context_lens, context_lens)
    }

    /// Sequences of the step.
    pub fn batch(&self) -> usize {
        self.context_lens.dims1().unwrap_or(0)
    }
}

/// Copies `data` into the buffer of `t` in place (a contiguous tensor spanning its whole
/// buffer, of `T`'s dtype, on a rocm-kernels device): the per-step input of a captured graph,
/// written between replays with one host-to-device copy and no allocation. Refused during
/// a capture; an error (wrong device, dtype or length, a view) writes nothing.
pub fn write_into<T: BufElem>(t: &Tensor, data: &[T]) -> Result<()> {
    const OP: &str = "write_into";
    let dev = rocm_device(OP, "t", t)?;
    whole_buffer(OP, "t", t)?;
    if t.elem_count() != data.len() {
        return Err(invalid(OP, format!("{} elements into a tensor of shape {:?}", data.len(), t.shape())));
    }
    with_mut(t, |s| {
        let v = buf_mut::<T>(OP, "t", s)?;
        let view = v.view_mut(..).map_err(crate::error::at(OP))?;
        dev.kernels().write(view, data).map_err(crate::error::at(OP))
    })
}

/// The cache `[num_blocks, block_size, ..]` the index was checked for, or an error.
fn cache_matches(op: &str, cache: &Tensor, num_blocks: usize, block_size: usize) -> Result<()> {
    let d = cache.dims();
    if d.len() != 4 || d[0] != num_blocks || d[1] != block_size {
        return Err(invalid(op, format!("argument `key_cache` has shape {:?}; the index was checked for {num_blocks} blocks of {block_size}", cache.shape())));
    }
    Ok(())
}

/// [`rope_and_cache`] with the step's checked [`CacheIndex`]: the same result, no host
/// read of the indices and no upload.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache_indexed(
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    index: &CacheIndex,
    cos: &Tensor,
    sin: &Tensor,
    interleaved: bool,
    q: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    Ok(rope_and_cache_indexed_out(key, value, key_cache, value_cache, index, (cos, sin), interleaved, q, false)?.q)
}

/// What [`rope_and_cache_indexed_out`] returns besides the cache write.
#[derive(Debug)]
pub struct RopeCacheOut {
    /// The rotated queries `[tokens, heads, head_dim]` (contiguous), when queries were given.
    pub q: Option<Tensor>,
    /// Contiguous `[tokens, kv_heads, head_dim]` rotated keys and values of every token
    /// (bit for bit what the cache holds for them), when asked for: attention over a
    /// step's own keys (chunks with no cached prefix) without gathering them back out of
    /// the cache.
    pub kv: Option<(Tensor, Tensor)>,
}

/// [`rope_and_cache_indexed`] (tables `(cos, sin)`) that, with `kv_out`, also returns the
/// rotated keys and the values as contiguous tensors, written by the same launch.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache_indexed_out(
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    index: &CacheIndex,
    (cos, sin): (&Tensor, &Tensor),
    interleaved: bool,
    q: Option<&Tensor>,
    kv_out: bool,
) -> Result<RopeCacheOut> {
    const OP: &str = "rope_and_cache_indexed";
    let (tokens, kvh, d) = cache_write_checks(OP, key, value, key_cache, value_cache, &index.slot_mapping)?;
    cache_matches(OP, key_cache, index.num_blocks, index.block_size)?;
    let dev = rocm_device(OP, "key_cache", key_cache)?;
    let cd = dev.as_candle();
    for (name, t) in [("cos", cos), ("sin", sin)] {
        let td = dims_n(OP, name, t, 2, "[max_positions, head_dim / 2]")?;
        if td[1] * 2 != d || td[0] < index.table_rows {
            return Err(invalid(OP, format!("argument `{name}` has shape {:?}; the step needs [>= {}, {}]", t.shape(), index.table_rows, d / 2)));
        }
        dtype_is(OP, name, t, key.dtype())?;
        same_device(OP, name, t, &cd)?;
    }
    same_device(OP, "index", &index.positions, &cd)?;
    let heads = match q {
        Some(q) => {
            let qd = dims_n(OP, "q", q, 3, "[tokens, heads, head_dim]")?;
            if qd[0] != tokens || qd[2] != d {
                return Err(invalid(OP, format!("argument `q` has shape {:?}; expected [{tokens}, heads, {d}]", q.shape())));
            }
            dtype_is(OP, "q", q, key.dtype())?;
            same_device(OP, "q", q, &cd)?;
            qd[1]
        }
        None => 0,
    };
    let mut srcs = vec![("key", key), ("value", value), ("cos", cos), ("sin", sin)];
    if let Some(q) = q {
        srcs.push(("q", q));
    }
    distinct_storage(OP, &[("key_cache", key_cache), ("value_cache", value_cache)], &srcs)?;
    let shape = RopeCacheShape { tokens, kv_heads: kvh, heads, head_dim: d, interleaved };
    dev.profiled(
        || "rope_and_cache".into(),
        key.dtype(),
        || match key.dtype() {
            DType::F16 => rope_indexed_on::<f16>(dev, shape, key, value, key_cache, value_cache, index, (cos, sin), q, kv_out),
            DType::BF16 => rope_indexed_on::<bf16>(dev, shape, key, value, key_cache, value_cache, index, (cos, sin), q, kv_out),
            _ => rope_indexed_on::<f32>(dev, shape, key, value, key_cache, value_cache, index, (cos, sin), q, kv_out),
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn rope_indexed_on<T: BufElem + Float>(
    dev: &RocmDevice,
    shape: RopeCacheShape,
    key: &Tensor,
    value: &Tensor,
    key_cache: &Tensor,
    value_cache: &Tensor,
    index: &CacheIndex,
    (cos, sin): (&Tensor, &Tensor),
    q: Option<&Tensor>,
    kv_out: bool,
) -> Result<RopeCacheOut> {
    const OP: &str = "rope_and_cache_indexed";
    let ((cs, cl), (ss, sl)) = (cos.storage_and_layout(), sin.storage_and_layout());
    let ((ms, ml), (ps, pl)) = (index.slot_mapping.storage_and_layout(), index.positions.storage_and_layout());
    let (cos, sin) = (input::<T>(OP, "cos", dev, &cs, cl)?, input::<T>(OP, "sin", dev, &ss, sl)?);
    let (map, pos) = (input::<i64>(OP, "slot_mapping", dev, &ms, ml)?, input::<u32>(OP, "positions", dev, &ps, pl)?);
    with_io_caches::<T>(OP, dev, shape, (key, value, q, kv_out), (key_cache, value_cache), |io, kc, vc| {
        // SAFETY: `CacheIndex::new` checked every slot (inside the cache of
        // `num_blocks * block_size` rows, distinct) and `cache_matches` that this
        // cache has that many; the tables hold `table_rows` rows, past every position.
        unsafe { rope_and_cache_rows_unchecked(dev.kernels(), shape, io, kc, vc, &map, &pos, &cos, &sin) }.map_err(|e| err(OP, e))
    })
}

/// [`paged_attention`] with the step's checked [`DecodeIndex`]: the same result, no host
/// read of the block tables and context lengths and no upload.
pub fn paged_attention_indexed(q: &Tensor, key_cache: &Tensor, value_cache: &Tensor, index: &DecodeIndex, softmax_scale: f32) -> Result<Tensor> {
    const OP: &str = "paged_attention_indexed";
    let qd = dims_n(OP, "q", q, 3, "[batch, heads, head_dim]")?;
    let (batch, heads, d) = (qd[0], qd[1], qd[2]);
    let cd = dims_n(OP, "key_cache", key_cache, 4, "[num_blocks, block_size, kv_heads, head_dim]")?;
    cache_matches(OP, key_cache, index.num_blocks, index.block_size)?;
    let (num_blocks, block_size, kvh) = (cd[0], cd[1], cd[2]);
    if cd[3] != d {
        return Err(invalid(OP, format!("argument `key_cache` has shape {:?}; q {:?} needs head_dim {d}", key_cache.shape(), q.shape())));
    }
    if value_cache.dims() != cd {
        return Err(invalid(OP, format!("argument `value_cache` has shape {:?}; expected key_cache's {:?}", value_cache.shape(), key_cache.shape())));
    }
    if index.batch() != batch {
        return Err(invalid(OP, format!("argument `index` holds {} sequences; q has {batch}", index.batch())));
    }
    if !matches!(q.dtype(), DType::F16 | DType::BF16) {
        return Err(invalid(OP, format!("argument `q` has dtype {:?}; expected f16 or bf16", q.dtype())));
    }
    dtype_is(OP, "key_cache", key_cache, q.dtype())?;
    dtype_is(OP, "value_cache", value_cache, q.dtype())?;
    let dev = rocm_device(OP, "q", q)?;
    let candle_dev = dev.as_candle();
    for (name, t) in [("key_cache", key_cache), ("value_cache", value_cache), ("index", &index.block_tables)] {
        same_device(OP, name, t, &candle_dev)?;
    }
    let shape = PagedShape { batch, heads, kv_heads: kvh, head_dim: d, num_blocks, block_size };
    dev.profiled(
        || "paged_attention".into(),
        q.dtype(),
        || match q.dtype() {
            DType::F16 => decode_indexed_on::<f16>(dev, shape, q, key_cache, value_cache, index, softmax_scale),
            _ => decode_indexed_on::<bf16>(dev, shape, q, key_cache, value_cache, index, softmax_scale),
        },
    )
}

fn decode_indexed_on<T: FlashElem + BufElem>(dev: &RocmDevice, shape: PagedShape, q: &Tensor, key_cache: &Tensor, value_cache: &Tensor, index: &DecodeIndex, scale: f32) -> Result<Tensor> {
    const OP: &str = "paged_attention_indexed";
    let PagedShape { batch, heads, head_dim, .. } = shape;
    let ((qs, ql), (ks, kl), (vs, vl)) = (q.storage_and_layout(), key_cache.storage_and_layout(), value_cache.storage_and_layout());
    let ((ts, tl), (ls, ll)) = (index.block_tables.storage_and_layout(), index.context_lens.storage_and_layout());
    let q = input::<T>(OP, "q", dev, &qs, ql)?;
    let kc = input::<T>(OP, "key_cache", dev, &ks, kl)?;
    let vc = input::<T>(OP, "value_cache", dev, &vs, vl)?;
    let (tables, lens) = (input::<u32>(OP, "block_tables", dev, &ts, tl)?, input::<u32>(OP, "context_lens", dev, &ls, ll)?);
    let (cs, cl) = index.counters.storage_and_layout();
    let counters = input::<u32>(OP, "counters", dev, &cs, cl)?;
    let kd = dev.kernels();
    let mut out = kd.alloc_uninit::<T>(batch * heads * head_dim).map_err(crate::error::at(OP))?;
    let mut lse = kd.alloc_uninit::<f32>(batch * heads).map_err(crate::error::at(OP))?;
    // SAFETY: `DecodeIndex::new` checked every context against its row and every used block
    // against `num_blocks`; `cache_matches` that these caches have `num_blocks` blocks of
    // the same size; `max_context_len` is the longest context. The counters are the index's
    // own, zero between launches (allocated zeroed, left at zero by every launch), used by
    // this stream's launches one after another.
    unsafe { paged_attention_with_counters(kd, shape, &q, &kc, &vc, &tables, &lens, index.max_context_len, &mut out, &mut lse, scale, &counters) }.map_err(|e| err(OP, e))?;
    Ok(output(dev, out, (batch, heads, head_dim)))
}
