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
/// (fewer: each loops).
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
    let per_token = (kvh + qh) * d2;
    let n = slot_mapping.len() * per_token;
    let mut e = global_idx_x();
    while e < n {
        let (t, r) = (e / per_token, e % per_token);
        let (h, i) = (r / d2, r % d2);
        let (j0, j1) = if interleaved != 0 { (2 * i, 2 * i + 1) } else { (i, i + d2) };
        let at = positions[t] as usize * d2 + i;
        let (c, s) = (cos[at].to_f32(), sin[at].to_f32());
        if h < kvh {
            let slot = slot_mapping[t];
            if slot >= 0 {
                let src = (t * kvh + h) * d;
                let dst = (slot as usize * kvh + h) * d;
                let (x0, x1) = (k[src + j0].to_f32(), k[src + j1].to_f32());
                k_cache[dst + j0] = T::from_f32(FloatMath::mul_add(x0, c, -(x1 * s)));
                k_cache[dst + j1] = T::from_f32(FloatMath::mul_add(x0, s, x1 * c));
                v_cache[dst + j0] = v[src + j0];
                v_cache[dst + j1] = v[src + j1];
            }
        } else {
            let row = (t * qh + h - kvh) * d;
            let (x0, x1) = (q[row + j0].to_f32(), q[row + j1].to_f32());
            q[row + j0] = T::from_f32(FloatMath::mul_add(x0, c, -(x1 * s)));
            q[row + j1] = T::from_f32(FloatMath::mul_add(x0, s, x1 * c));
        }
        e += global_size_x();
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
