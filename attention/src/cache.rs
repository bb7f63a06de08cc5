//! Writing a step's new keys and values into the paged KV cache with the rotary position
//! embedding applied in the same pass ([`rope_and_cache`](fn@rope_and_cache)), and
//! optionally rotating the step's queries in place, so the whole rope of a layer costs one
//! launch instead of three (rope q, rope k, `reshape_and_cache`).
//!
//! # Layout
//! - `k`, `v [tokens, kv_heads, D]`, `q [tokens, heads, D]` (rotated in place; empty:
//!   no queries), all contiguous.
//! - `k_cache`, `v_cache [num_blocks, block_size, kv_heads, D]` as in [`crate::paged`]:
//!   token `t` goes to slot `slot_mapping[t]` (`block * block_size + row`; negative:
//!   padding, its key and value are not written, its queries are still rotated).
//! - `positions [tokens]`: the position of each token, the row of the tables it reads.
//! - `cos`, `sin [max_positions, D / 2]`: Candle's rope tables (`candle_nn::rotary_emb`),
//!   in the element type of `k`.
//!
//! # Rotation
//! Pair `i` of a row (`x[i]`, `x[i + D/2]` for Candle's `rope`, the half-split layout
//! llama uses; `x[2i]`, `x[2i + 1]` for `rope_i`, interleaved) at position `p` becomes
//! `(x0 c - x1 s, x0 s + x1 c)` with `c = cos[p][i]`, `s = sin[p][i]`, computed in f32 and
//! rounded once. Values are copied unchanged.
//!
//! # Work decomposition
//! One work-item per pair (grid-stride): per token `kv_heads * D / 2` key pairs, each
//! also copying the two value elements at the same indices, then `heads * D / 2` query
//! pairs. A work-item reads both elements of its pair before writing them, and no two
//! work-items share a pair, so the in-place query rotation has no race.
use kernel_dsl::prelude::*;

/// See the module docs. `interleaved != 0`: `rope_i`'s pairs, else `rope`'s. Any
/// work-group size; a grid that covers `tokens * (kv_heads + heads) * D / 2` work-items
/// (fewer: each loops). Buffer lengths are checked once, uniformly (a mismatch traps);
/// each token's slot and position are checked against the cache and the tables before
/// they address anything; the accesses themselves then index without per-element checks
/// (bounds checks on all nine buffers kept their lengths live in SGPRs: spills on gfx9).
#[amdgpu_kernel(T = [f16, bf16, f32], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache<T: Float>(
    k: &[T],
    v: &[T],
    q: &mut [T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    slot_mapping: &[i64],
    positions: &[u32],
    cos: &[T],
    sin: &[T],
    kv_heads: u32,
    heads: u32,
    d: u32,
    interleaved: u32,
) {
    let (kvh, qh, d) = (kv_heads as usize, heads as usize, d as usize);
    let d2 = d / 2;
    let tokens = slot_mapping.len();
    let row = kvh * d;
    if d2 == 0
        || kvh == 0
        || k.len() != tokens * row
        || v.len() != k.len()
        || q.len() != tokens * qh * d
        || positions.len() != tokens
        || k_cache.len() != v_cache.len()
        || sin.len() != cos.len()
    {
        panic!("rope_and_cache: buffer lengths do not match the shape");
    }
    let slots = k_cache.len() / row;
    let table_rows = cos.len() / d2;
    let (kp, vp, qp, kcp, vcp) = (k.as_ptr(), v.as_ptr(), q.as_mut_ptr(), k_cache.as_mut_ptr(), v_cache.as_mut_ptr());
    let (sp, pp, cp, snp) = (slot_mapping.as_ptr(), positions.as_ptr(), cos.as_ptr(), sin.as_ptr());
    let per_token = ((kvh + qh) * d2) as u32;
    let n = tokens as u32 * per_token;
    let mut e = global_idx_x() as u32;
    while e < n {
        let (t, r) = ((e / per_token) as usize, e % per_token);
        let (h, i) = ((r / d2 as u32) as usize, (r % d2 as u32) as usize);
        let (j0, j1) = if interleaved != 0 { (2 * i, 2 * i + 1) } else { (i, i + d2) };
        // SAFETY: t < tokens = positions.len() (checked above).
        let p = unsafe { *pp.add(t) } as usize;
        if p >= table_rows {
            panic!("rope_and_cache: a position is outside the tables");
        }
        // SAFETY: p < table_rows and i < d2: inside cos and sin (equal lengths).
        let (c, s) = unsafe { ((*cp.add(p * d2 + i)).to_f32(), (*snp.add(p * d2 + i)).to_f32()) };
        if h < kvh {
            // SAFETY: t < tokens = slot_mapping.len().
            let slot = unsafe { *sp.add(t) };
            if slot >= 0 {
                if slot as usize >= slots {
                    panic!("rope_and_cache: a slot is outside the cache");
                }
                let src = t * row + h * d;
                let dst = slot as usize * row + h * d;
                // SAFETY: src + d <= tokens * row = k.len() = v.len(); dst + d <= slots * row
                // <= k_cache.len() = v_cache.len(); j0, j1 < d.
                unsafe {
                    let (x0, x1) = ((*kp.add(src + j0)).to_f32(), (*kp.add(src + j1)).to_f32());
                    *kcp.add(dst + j0) = T::from_f32(FloatMath::mul_add(x0, c, -(x1 * s)));
                    *kcp.add(dst + j1) = T::from_f32(FloatMath::mul_add(x0, s, x1 * c));
                    *vcp.add(dst + j0) = *vp.add(src + j0);
                    *vcp.add(dst + j1) = *vp.add(src + j1);
                }
            }
        } else {
            let at = (t * qh + h - kvh) * d;
            // SAFETY: t < tokens, h - kvh < qh: at + d <= q.len(); j0, j1 < d. This
            // work-item alone touches the pair.
            unsafe {
                let (x0, x1) = ((*qp.add(at + j0)).to_f32(), (*qp.add(at + j1)).to_f32());
                *qp.add(at + j0) = T::from_f32(FloatMath::mul_add(x0, c, -(x1 * s)));
                *qp.add(at + j1) = T::from_f32(FloatMath::mul_add(x0, s, x1 * c));
            }
        }
        e += global_size_x() as u32;
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
