//! The checked launcher of [`rope_and_cache`](fn@super::rope_and_cache): the keys, values
//! and queries are [`Rows`] (row-strided views of device buffers, e.g. the column slices
//! of one stacked q/k/v product), slot mapping and positions are host slices, validated
//! (every slot inside the cache and distinct, every position inside the tables) and
//! uploaded, so an error writes nothing and the kernel never indexes out of range.
use super::{rope_and_cache, strided_span};
use crate::AttentionError;
use kernel_dsl::host::LaunchConfig;
use kernel_dsl::{Dim3, Float};
use kernel_runtime::{Device, DeviceView, DeviceVec};

/// Sizes of one [`rope_and_cache_rows`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeCacheShape {
    /// New tokens (rows of `k`, `v`, `q`; entries of `slot_mapping`, `positions`).
    pub tokens: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads rotated (0 or no queries: none).
    pub heads: usize,
    /// Head dimension (even).
    pub head_dim: usize,
    /// `true`: interleaved pairs (`candle_nn::rotary_emb::rope_i`); `false`: half-split
    /// pairs (`rope`, as llama).
    pub interleaved: bool,
}

/// The rows of one operand inside a device buffer: row `t` (the shape's heads times
/// `head_dim` elements, head after head) starts at element `offset + t * row_stride` of
/// `buf`. A whole contiguous `[tokens, heads, head_dim]` buffer is [`Rows::packed`]; the
/// key columns of a stacked `[tokens, (heads + 2 kv_heads) * head_dim]` q/k/v product are
/// `Rows::new(&qkv, heads * head_dim, (heads + 2 kv_heads) * head_dim)`, read in place.
pub struct Rows<'a, T> {
    /// The buffer holding the rows.
    pub buf: &'a DeviceVec<T>,
    /// Element of `buf` where row 0 starts.
    pub offset: usize,
    /// Elements from one row's start to the next's (at least the row's width).
    pub row_stride: usize,
}

impl<T> Clone for Rows<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Rows<'_, T> {}

impl<'a, T> Rows<'a, T> {
    /// Rows starting at `offset`, `row_stride` elements apart.
    pub fn new(buf: &'a DeviceVec<T>, offset: usize, row_stride: usize) -> Self {
        Rows { buf, offset, row_stride }
    }

    /// Rows of `width` elements, back to back from the buffer's start.
    pub fn packed(buf: &'a DeviceVec<T>, width: usize) -> Self {
        Rows { buf, offset: 0, row_stride: width }
    }
}

/// The operands of one [`rope_and_cache_rows`] call besides the caches and indices.
pub struct RopeCacheIo<'a, T> {
    /// Keys, `kv_heads * head_dim` elements a row.
    pub k: Rows<'a, T>,
    /// Values, like `k`.
    pub v: Rows<'a, T>,
    /// Queries (`heads * head_dim` a row) and where their rotations go, a contiguous
    /// `[tokens, heads, head_dim]` buffer; `None`: no queries.
    pub q: Option<(Rows<'a, T>, &'a mut DeviceVec<T>)>,
    /// Contiguous `[tokens, kv_heads, head_dim]` copies of the rotated keys and of the
    /// values of every token (padding included); `None`: the cache alone.
    pub kv_out: Option<(&'a mut DeviceVec<T>, &'a mut DeviceVec<T>)>,
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

/// Rotates the keys (`io.k`, `[tokens, kv_heads, head_dim]` rows) by their `positions`
/// (rows of the `cos`, `sin [max_positions, head_dim / 2]` tables) and writes them, with
/// the values of `io.v`, to the caches (`[num_blocks, block_size, kv_heads, head_dim]`) at
/// `slot_mapping[t]` (negative: skipped); when `io.q` is given, writes its rows rotated by
/// the same positions to its output; when `io.kv_out` is given, also the rotated keys and
/// the values, contiguous. One launch. Slots must be distinct and inside the caches,
/// positions inside the tables, every row inside its buffer; errors name the argument and
/// write nothing.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache_rows<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    io: RopeCacheIo<'_, T>,
    k_cache: &mut DeviceVec<T>,
    v_cache: &mut DeviceVec<T>,
    slot_mapping: &[i64],
    positions: &[u32],
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<(), AttentionError> {
    let g = geometry(shape, &io, k_cache, v_cache, (slot_mapping.len(), positions.len()), cos, sin)?;
    if let Some((t, &p)) = positions.iter().enumerate().find(|(_, &p)| p as usize >= g.table_rows) {
        return Err(arg("positions", format!("token {t}: position {p} is outside the {} rows of cos/sin", g.table_rows)));
    }
    let mut seen = std::collections::HashSet::new();
    for (t, &s) in slot_mapping.iter().enumerate() {
        if s >= 0 && (s as u64 >= g.slots as u64 || !seen.insert(s)) {
            return Err(arg("slot_mapping", format!("token {t}: slot {s} is outside the {} cache slots or repeated", g.slots)));
        }
    }
    if g.items == 0 {
        return Ok(());
    }
    let map = dev.upload(slot_mapping)?;
    let pos = dev.upload(positions)?;
    launch(dev, shape, g.items, io, (k_cache, v_cache), (&map, &pos), (cos, sin))
}

/// [`rope_and_cache_rows`] with `slot_mapping` (i64) and `positions` (u32) already on the
/// device: no upload and no host read of them, so a step can build its index buffers once
/// for every layer, and the launch can be captured in a graph. Sizes and strides are
/// checked (errors name the argument and write nothing); the index values are not.
///
/// # Safety
/// Every non-negative slot must be inside the caches and distinct, and every position
/// inside the `cos`/`sin` rows (what [`rope_and_cache_rows`] checks on the host): the
/// kernel indexes with them unchecked.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rope_and_cache_rows_unchecked<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    io: RopeCacheIo<'_, T>,
    k_cache: &mut DeviceVec<T>,
    v_cache: &mut DeviceVec<T>,
    slot_mapping: &DeviceVec<i64>,
    positions: &DeviceVec<u32>,
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<(), AttentionError> {
    let g = geometry(shape, &io, k_cache, v_cache, (slot_mapping.len(), positions.len()), cos, sin)?;
    if g.items == 0 {
        return Ok(());
    }
    launch(dev, shape, g.items, io, (k_cache, v_cache), (slot_mapping, positions), (cos, sin))
}

/// What the checks of the sizes found: work-items, rows of the tables, cache slots.
struct Geometry {
    items: usize,
    table_rows: usize,
    slots: usize,
}

/// Checks that the `tokens` rows of `width` elements of `rows` lie inside its buffer, `row_stride`
/// apart without overlapping, and that the kernel's 32-bit stride holds the stride.
fn rows_fit<T>(name: &'static str, rows: &Rows<'_, T>, tokens: usize, width: usize) -> Result<(), AttentionError> {
    if tokens > 1 && rows.row_stride < width {
        return Err(arg(name, format!("row stride {} is smaller than a row of {width} elements", rows.row_stride)));
    }
    if rows.row_stride > u32::MAX as usize {
        return Err(arg(name, format!("row stride {} exceeds 2^32 - 1", rows.row_stride)));
    }
    let span = (tokens.max(1) - 1)
        .checked_mul(rows.row_stride)
        .and_then(|s| s.checked_add(width))
        .and_then(|s| s.checked_add(rows.offset))
        .filter(|&end| tokens == 0 || width == 0 || end <= rows.buf.len());
    if span.is_none() {
        return Err(arg(
            name,
            format!("{tokens} rows of {width} elements from offset {} with stride {} do not fit its {} elements", rows.offset, rows.row_stride, rows.buf.len()),
        ));
    }
    Ok(())
}

/// The kernel's view of `rows`: from its first element through its last row.
fn view<'a, T>(rows: &Rows<'a, T>, tokens: usize, width: usize) -> Result<DeviceView<'a, T>, AttentionError> {
    let span = strided_span(tokens, rows.row_stride, width);
    let start = if span == 0 { 0 } else { rows.offset };
    Ok(rows.buf.view(start..start + span)?)
}

fn geometry<T: Float>(
    shape: RopeCacheShape,
    io: &RopeCacheIo<'_, T>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    (n_slots, n_positions): (usize, usize),
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<Geometry, AttentionError> {
    let RopeCacheShape { tokens, kv_heads, head_dim: d, .. } = shape;
    if d == 0 || !d.is_multiple_of(2) {
        return Err(arg("head_dim", format!("{d} is not a positive even number")));
    }
    if kv_heads == 0 {
        return Err(arg("k", "zero key/value heads"));
    }
    let heads = if io.q.is_some() { shape.heads } else { 0 };
    len_is("slot_mapping", n_slots, tokens)?;
    len_is("positions", n_positions, tokens)?;
    let row = product("k", &[kv_heads, d])?;
    rows_fit("k", &io.k, tokens, row)?;
    rows_fit("v", &io.v, tokens, row)?;
    if let Some((q, q_out)) = &io.q {
        let qrow = product("q", &[heads, d])?;
        rows_fit("q", q, tokens, qrow)?;
        len_is("q_out", q_out.len(), product("q_out", &[tokens, qrow])?)?;
    }
    if let Some((k_out, v_out)) = &io.kv_out {
        let n = product("k_out", &[tokens, row])?;
        len_is("k_out", k_out.len(), n)?;
        len_is("v_out", v_out.len(), n)?;
    }
    if !k_cache.len().is_multiple_of(row) {
        return Err(arg("k_cache", format!("{} elements are not whole rows of {row}", k_cache.len())));
    }
    len_is("v_cache", v_cache.len(), k_cache.len())?;
    let d2 = d / 2;
    if !cos.len().is_multiple_of(d2) {
        return Err(arg("cos", format!("{} elements are not whole rows of head_dim / 2 = {d2}", cos.len())));
    }
    len_is("sin", sin.len(), cos.len())?;
    let per_head = d2.div_ceil(super::pairs_per_item::<T>());
    let items = product("q", &[tokens, kv_heads + heads, per_head])?;
    // The kernel counts items in 32 bits, with room for its grid stride.
    if items > (u32::MAX / 2) as usize {
        return Err(arg("k", format!("{items} work-items exceed one launch (2^31)")));
    }
    Ok(Geometry { items, table_rows: cos.len() / d2, slots: k_cache.len() / row })
}

fn launch<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    items: usize,
    io: RopeCacheIo<'_, T>,
    (k_cache, v_cache): (&mut DeviceVec<T>, &mut DeviceVec<T>),
    (map, pos): (&DeviceVec<i64>, &DeviceVec<u32>),
    (cos, sin): (&DeviceVec<T>, &DeviceVec<T>),
) -> Result<(), AttentionError> {
    let RopeCacheShape { tokens, kv_heads, head_dim: d, interleaved, .. } = shape;
    let row = kv_heads * d;
    let groups = items.div_ceil(256).min(65535 * 16) as u32;
    let cfg = LaunchConfig::new(Dim3::x(groups), Dim3::x(256));
    let (k, v) = (view(&io.k, tokens, row)?, view(&io.v, tokens, row)?);
    let (mut none_q, mut none_k, mut none_v): (Vec<T>, Vec<T>, Vec<T>) = (Vec::new(), Vec::new(), Vec::new());
    let (heads, q, q_stride, q_out) = match io.q {
        Some((q, out)) => (shape.heads, Some(view(&q, tokens, shape.heads * d)?), q.row_stride, Some(out)),
        None => (0, None, 0, None),
    };
    let (k_out, v_out) = match io.kv_out {
        Some((k, v)) => (Some(k), Some(v)),
        None => (None, None),
    };
    let empty: Vec<T> = Vec::new();
    macro_rules! go {
        ($q:expr, $qo:expr, $ko:expr, $vo:expr) => {
            rope_and_cache::launch::<T>(
                dev,
                cfg,
                &k,
                &v,
                $q,
                $qo,
                $ko,
                $vo,
                k_cache,
                v_cache,
                map,
                pos,
                cos,
                sin,
                kv_heads as u32,
                heads as u32,
                d as u32,
                interleaved as u32,
                io.k.row_stride as u32,
                io.v.row_stride as u32,
                q_stride as u32,
            )?
        };
    }
    match (q, q_out, k_out, v_out) {
        (Some(q), Some(qo), Some(ko), Some(vo)) => go!(&q, qo, ko, vo),
        (Some(q), Some(qo), _, _) => go!(&q, qo, &mut none_k, &mut none_v),
        (_, _, Some(ko), Some(vo)) => go!(&empty, &mut none_q, ko, vo),
        _ => go!(&empty, &mut none_q, &mut none_k, &mut none_v),
    }
    Ok(())
}
