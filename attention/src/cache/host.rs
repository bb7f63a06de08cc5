//! The checked launcher of [`rope_and_cache`](fn@super::rope_and_cache): slot mapping and
//! positions are host slices, validated (every slot inside the cache and distinct, every
//! position inside the tables) and uploaded, so an error writes nothing and the kernel
//! never indexes out of range.
use super::rope_and_cache;
use crate::AttentionError;
use kernel_dsl::host::LaunchConfig;
use kernel_dsl::{Dim3, Float};
use kernel_runtime::{Device, DeviceVec};

/// Sizes of one [`rope_and_cache_rows`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeCacheShape {
    /// New tokens (rows of `k`, `v`, `q`; entries of `slot_mapping`, `positions`).
    pub tokens: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads rotated in place (0: no queries).
    pub heads: usize,
    /// Head dimension (even).
    pub head_dim: usize,
    /// `true`: interleaved pairs (`candle_nn::rotary_emb::rope_i`); `false`: half-split
    /// pairs (`rope`, as llama).
    pub interleaved: bool,
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

/// Rotates the keys of `k [tokens, kv_heads, head_dim]` by their `positions` (rows of the
/// `cos`, `sin [max_positions, head_dim / 2]` tables) and writes them, with the values of
/// `v`, to the caches (`[num_blocks, block_size, kv_heads, head_dim]`) at
/// `slot_mapping[t]` (negative: skipped); when `q` is given (`[tokens, heads,
/// head_dim]`), rotates it in place by the same positions. One launch. Slots must be
/// distinct and inside the caches, positions inside the tables; errors name the argument
/// and write nothing.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache_rows<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    q: Option<&mut DeviceVec<T>>,
    k_cache: &mut DeviceVec<T>,
    v_cache: &mut DeviceVec<T>,
    slot_mapping: &[i64],
    positions: &[u32],
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<(), AttentionError> {
    let g = geometry(shape, k, v, q.as_deref(), k_cache, v_cache, (slot_mapping.len(), positions.len()), cos, sin)?;
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
    launch(dev, shape, g.items, (k, v, q), (k_cache, v_cache), (&map, &pos), (cos, sin))
}

/// [`rope_and_cache_rows`] with `slot_mapping` (i64) and `positions` (u32) already on the
/// device: no upload and no host read of them, so a step can build its index buffers once
/// for every layer, and the launch can be captured in a graph. Sizes are checked (errors
/// name the argument and write nothing); the values are not.
///
/// # Safety
/// Every non-negative slot must be inside the caches and distinct, and every position
/// inside the `cos`/`sin` rows (what [`rope_and_cache_rows`] checks on the host): the
/// kernel indexes with them unchecked.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rope_and_cache_rows_unchecked<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    q: Option<&mut DeviceVec<T>>,
    k_cache: &mut DeviceVec<T>,
    v_cache: &mut DeviceVec<T>,
    slot_mapping: &DeviceVec<i64>,
    positions: &DeviceVec<u32>,
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<(), AttentionError> {
    let g = geometry(shape, k, v, q.as_deref(), k_cache, v_cache, (slot_mapping.len(), positions.len()), cos, sin)?;
    if g.items == 0 {
        return Ok(());
    }
    launch(dev, shape, g.items, (k, v, q), (k_cache, v_cache), (slot_mapping, positions), (cos, sin))
}

/// What the checks of the sizes found: pairs to rotate, rows of the tables, cache slots.
struct Geometry {
    items: usize,
    table_rows: usize,
    slots: usize,
}

#[allow(clippy::too_many_arguments)]
fn geometry<T: Float>(
    shape: RopeCacheShape,
    k: &DeviceVec<T>,
    v: &DeviceVec<T>,
    q: Option<&DeviceVec<T>>,
    k_cache: &DeviceVec<T>,
    v_cache: &DeviceVec<T>,
    (n_slots, n_positions): (usize, usize),
    cos: &DeviceVec<T>,
    sin: &DeviceVec<T>,
) -> Result<Geometry, AttentionError> {
    let RopeCacheShape { tokens, kv_heads, heads, head_dim: d, .. } = shape;
    if d == 0 || !d.is_multiple_of(2) {
        return Err(arg("head_dim", format!("{d} is not a positive even number")));
    }
    if kv_heads == 0 {
        return Err(arg("k", "zero key/value heads"));
    }
    let heads = if q.is_some() { heads } else { 0 };
    len_is("slot_mapping", n_slots, tokens)?;
    len_is("positions", n_positions, tokens)?;
    let nk = product("k", &[tokens, kv_heads, d])?;
    len_is("k", k.len(), nk)?;
    len_is("v", v.len(), nk)?;
    if let Some(q) = q {
        len_is("q", q.len(), product("q", &[tokens, heads, d])?)?;
    }
    let row = kv_heads * d;
    if !k_cache.len().is_multiple_of(row) {
        return Err(arg("k_cache", format!("{} elements are not whole rows of {row}", k_cache.len())));
    }
    len_is("v_cache", v_cache.len(), k_cache.len())?;
    let d2 = d / 2;
    if !cos.len().is_multiple_of(d2) {
        return Err(arg("cos", format!("{} elements are not whole rows of head_dim / 2 = {d2}", cos.len())));
    }
    len_is("sin", sin.len(), cos.len())?;
    let items = product("q", &[tokens, kv_heads + heads, d2])?;
    // The kernel counts pairs in 32 bits, with room for its grid stride.
    if items > (u32::MAX / 2) as usize {
        return Err(arg("k", format!("{items} pairs exceed one launch (2^31)")));
    }
    Ok(Geometry { items, table_rows: cos.len() / d2, slots: k_cache.len() / row })
}

type Io<'a, T> = (&'a DeviceVec<T>, &'a DeviceVec<T>, Option<&'a mut DeviceVec<T>>);

fn launch<T: Float + 'static>(
    dev: &Device,
    shape: RopeCacheShape,
    items: usize,
    (k, v, q): Io<'_, T>,
    (k_cache, v_cache): (&mut DeviceVec<T>, &mut DeviceVec<T>),
    (map, pos): (&DeviceVec<i64>, &DeviceVec<u32>),
    (cos, sin): (&DeviceVec<T>, &DeviceVec<T>),
) -> Result<(), AttentionError> {
    let RopeCacheShape { kv_heads, heads, head_dim: d, interleaved, .. } = shape;
    let groups = items.div_ceil(256).min(65535 * 16) as u32;
    let cfg = LaunchConfig::new(Dim3::x(groups), Dim3::x(256));
    let mut none: Vec<T> = Vec::new();
    match q {
        Some(q) => rope_and_cache::launch::<T>(
            dev, cfg, k, v, q, k_cache, v_cache, map, pos, cos, sin, kv_heads as u32, heads as u32, d as u32, interleaved as u32,
        )?,
        None => rope_and_cache::launch::<T>(
            dev, cfg, k, v, &mut none, k_cache, v_cache, map, pos, cos, sin, kv_heads as u32, 0, d as u32, interleaved as u32,
        )?,
    }
    Ok(())
}
