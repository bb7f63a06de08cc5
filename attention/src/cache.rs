//! Writing a step's new keys and values into the paged KV cache with the rotary position
//! embedding applied in the same pass ([`rope_and_cache`](fn@rope_and_cache)), and
//! optionally rotating the step's queries, so the whole rope of a layer costs one launch
//! instead of three (rope q, rope k, `reshape_and_cache`).
//!
//! # Layout
//! - `k`, `v`, `q`: row-strided inputs. Row `t` of `k` (`kv_heads * D` elements, head
//!   after head) starts at `t * k_stride` of the `k` slice, likewise `v` and `q` (`heads *
//!   D`): whole contiguous `[tokens, heads, D]` buffers (stride = row width), or the
//!   column slices of one stacked `[tokens, (heads + 2 kv_heads) * D]` q/k/v product read in
//!   place (the host passes each slice from its first element; the stride is the stacked
//!   row). `q` empty: no queries.
//! - `q_out [tokens, heads, D]`: the rotated queries, contiguous (empty with `q`).
//! - `k_out`, `v_out [tokens, kv_heads, D]`: optional contiguous copies of the rotated keys
//!   and the values of every token (empty: not written), for attention over the step's
//!   own keys without gathering them back out of the cache.
//! - `k_cache`, `v_cache [num_blocks, block_size, kv_heads, D]` as in [`crate::paged`]:
//!   token `t` goes to slot `slot_mapping[t]` (`block * block_size + row`; negative:
//!   padding, its key and value are not written to the cache, its queries and `k_out` /
//!   `v_out` rows still are).
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
//! One work-item per (token, head, 16-byte chunk): it owns [`pairs_per_item`] pairs of one
//! head row (8 for f16/bf16, 4 for f32), so the per-item index arithmetic (two divisions),
//! the token's position and slot reads and the table reads are paid once per 8 pairs
//! instead of once per pair, and a wave moves whole 16-byte vectors. A key head's item
//! also moves the value elements at the same indices. Main path: the two 16-byte blocks at
//! offsets `i0` and `i0 + D/2` of the row, each one vector load and one vector store per
//! destination (half-split: the blocks hold the two halves of pairs `i0..`; interleaved:
//! each block holds whole pairs), the table rows as one 16-byte (half-split) or two 8-byte
//! (interleaved) loads each; it needs `D/2` and every row stride to be multiples of
//! [`pairs_per_item`] and every buffer to start on 16 bytes (the stacked product of head
//! sizes 64..256 with fresh allocations). Otherwise the same items go pair by pair.
use kernel_dsl::prelude::*;

/// Pairs (and elements of a 16-byte block) one work-item moves: 16 bytes of elements.
pub const fn pairs_per_item<T>() -> usize {
    16 / core::mem::size_of::<T>()
}

/// 16 bytes as four 32-bit words, aligned: one vector access whatever the element type.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Block(pub [u32; 4]);

/// 8 bytes, aligned: half a block of table entries (interleaved layout).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct HalfBlock(pub [u8; 8]);

/// `$body` for `$k` in `0..$n` (`$n <= 8`), written out with constant indices so the
/// blocks stay in registers instead of stack arrays indexed at run time.
macro_rules! unroll8 {
    ($k:ident, $n:expr, $body:block) => {
        unroll8!(@ $k, $n, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $k:ident, $n:expr, $body:block, $($i:literal)*) => {
        $(
            if $i < $n {
                let $k: usize = $i;
                $body
            }
        )*
    };
}

/// The rotation of one pair: `(x0 c - x1 s, x0 s + x1 c)` (fused multiply-adds).
#[device]
#[inline(always)]
fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (FloatMath::mul_add(x0, c, -(x1 * s)), FloatMath::mul_add(x0, s, x1 * c))
}

/// The rotated blocks at `x + i0` and `x + i0 + d2` of a row (`tab`: the row's cos and
/// sin entries).
///
/// # Safety
/// Both blocks and the table entries they pair with are in bounds and 16-byte (tables in
/// the interleaved layout: 8-byte) aligned.
#[device]
#[inline(always)]
unsafe fn rotated_blocks<T: Float>(x: *const T, (cp, sp): (*const T, *const T), i0: usize, d2: usize, interleaved: bool) -> (Block, Block) {
    let lanes = pairs_per_item::<T>();
    // SAFETY: the caller's contract.
    let (xa, xb) = unsafe { (core::ptr::read(x.add(i0) as *const Block), core::ptr::read(x.add(i0 + d2) as *const Block)) };
    let (pa, pb) = (&xa as *const Block as *const T, &xb as *const Block as *const T);
    let (mut ra, mut rb) = (Block([0; 4]), Block([0; 4]));
    let (qa, qb) = (&mut ra as *mut Block as *mut T, &mut rb as *mut Block as *mut T);
    if interleaved {
        // Block a holds pairs i0/2.., block b pairs d2/2 + i0/2.. (whole pairs each).
        let half = lanes / 2;
        let (ta, tb) = (i0 / 2, i0 / 2 + d2 / 2);
        // SAFETY: the caller's contract (8-byte halves of table rows).
        let (ca, sa, cb, sb) = unsafe {
            (
                core::ptr::read(cp.add(ta) as *const HalfBlock),
                core::ptr::read(sp.add(ta) as *const HalfBlock),
                core::ptr::read(cp.add(tb) as *const HalfBlock),
                core::ptr::read(sp.add(tb) as *const HalfBlock),
            )
        };
        let (pca, psa) = (&ca as *const HalfBlock as *const T, &sa as *const HalfBlock as *const T);
        let (pcb, psb) = (&cb as *const HalfBlock as *const T, &sb as *const HalfBlock as *const T);
        unroll8!(k, half, {
            // SAFETY: 2k + 1 < lanes (16-byte blocks) and k < half (8-byte halves).
            unsafe {
                let (y0, y1) = rotate((*pa.add(2 * k)).to_f32(), (*pa.add(2 * k + 1)).to_f32(), (*pca.add(k)).to_f32(), (*psa.add(k)).to_f32());
                let [o0, o1] = T::from_f32x2([y0, y1]);
                (*qa.add(2 * k), *qa.add(2 * k + 1)) = (o0, o1);
                let (y0, y1) = rotate((*pb.add(2 * k)).to_f32(), (*pb.add(2 * k + 1)).to_f32(), (*pcb.add(k)).to_f32(), (*psb.add(k)).to_f32());
                let [o0, o1] = T::from_f32x2([y0, y1]);
                (*qb.add(2 * k), *qb.add(2 * k + 1)) = (o0, o1);
            }
        });
    } else {
        // SAFETY: the caller's contract (16-byte blocks of table rows).
        let (cv, sv) = unsafe { (core::ptr::read(cp.add(i0) as *const Block), core::ptr::read(sp.add(i0) as *const Block)) };
        let (pc, ps) = (&cv as *const Block as *const T, &sv as *const Block as *const T);
        unroll8!(k, lanes, {
            // SAFETY: k < lanes: inside the 16-byte blocks.
            unsafe {
                let (y0, y1) = rotate((*pa.add(k)).to_f32(), (*pb.add(k)).to_f32(), (*pc.add(k)).to_f32(), (*ps.add(k)).to_f32());
                *qa.add(k) = T::from_f32(y0);
                *qb.add(k) = T::from_f32(y1);
            }
        });
    }
    (ra, rb)
}

/// The 16-byte block at `p`, read as its four 32-bit words: a block that is only copied
/// (the values) would otherwise move as an opaque aggregate, through a stack temporary on
/// NVIDIA (local memory); named words stay in registers.
///
/// # Safety
/// The block is in bounds and 16-byte aligned.
#[device]
#[inline(always)]
unsafe fn load_block<T>(p: *const T) -> Block {
    // SAFETY: the caller's contract.
    let Block([w0, w1, w2, w3]) = unsafe { core::ptr::read(p as *const Block) };
    Block([w0, w1, w2, w3])
}

/// Writes blocks `a`, `b` at `dst + i0` and `dst + i0 + d2`.
///
/// # Safety
/// Both blocks are in bounds and 16-byte aligned.
#[device]
#[inline(always)]
unsafe fn store_blocks<T>(dst: *mut T, i0: usize, d2: usize, (a, b): (Block, Block)) {
    // SAFETY: the caller's contract.
    unsafe {
        core::ptr::write(dst.add(i0) as *mut Block, a);
        core::ptr::write(dst.add(i0 + d2) as *mut Block, b);
    }
}

/// Rotates pairs `i0..i0 + n` of the row at `x` pair by pair into the rows at `dst` and,
/// when not null, `dst2` (`tab`: the row's cos and sin entries).
///
/// # Safety
/// The rows hold `2 d2` elements and the table rows `d2`; `i0 + n <= d2`.
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rotate_pairs<T: Float>(x: *const T, dst: *mut T, dst2: *mut T, (cp, sp): (*const T, *const T), i0: usize, n: usize, d2: usize, interleaved: bool) {
    let mut k = 0;
    while k < n {
        let i = i0 + k;
        let (j0, j1) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + d2) };
        // SAFETY: i < d2 and j0, j1 < 2 d2: the caller's contract.
        unsafe {
            let (y0, y1) = rotate((*x.add(j0)).to_f32(), (*x.add(j1)).to_f32(), (*cp.add(i)).to_f32(), (*sp.add(i)).to_f32());
            let (o0, o1) = (T::from_f32(y0), T::from_f32(y1));
            if !dst.is_null() {
                (*dst.add(j0), *dst.add(j1)) = (o0, o1);
            }
            if !dst2.is_null() {
                (*dst2.add(j0), *dst2.add(j1)) = (o0, o1);
            }
        }
        k += 1;
    }
}

/// Copies pairs `i0..i0 + n` of the row at `x` (as [`rotate_pairs`] indexes them) to the
/// rows at `dst` and, when not null, `dst2`.
///
/// # Safety
/// As [`rotate_pairs`].
#[device]
#[inline(always)]
unsafe fn copy_pairs<T: Float>(x: *const T, dst: *mut T, dst2: *mut T, i0: usize, n: usize, d2: usize, interleaved: bool) {
    let mut k = 0;
    while k < n {
        let i = i0 + k;
        let (j0, j1) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + d2) };
        // SAFETY: j0, j1 < 2 d2: the caller's contract.
        unsafe {
            let (a, b) = (*x.add(j0), *x.add(j1));
            if !dst.is_null() {
                (*dst.add(j0), *dst.add(j1)) = (a, b);
            }
            if !dst2.is_null() {
                (*dst2.add(j0), *dst2.add(j1)) = (a, b);
            }
        }
        k += 1;
    }
}

/// `p`'s address when `used`, else 0 (no alignment constraint).
#[device]
#[inline(always)]
fn addr_if<T>(p: *const T, used: bool) -> usize {
    if used {
        p as usize
    } else {
        0
    }
}

/// Elements a row-strided operand of `tokens` rows of `width` spans: `(tokens - 1) *
/// stride + width`, 0 without rows or width.
#[device]
#[inline(always)]
pub fn strided_span(tokens: usize, stride: usize, width: usize) -> usize {
    if tokens == 0 || width == 0 {
        0
    } else {
        (tokens - 1) * stride + width
    }
}

/// See the module docs. `interleaved != 0`: `rope_i`'s pairs, else `rope`'s. `k_stride`,
/// `v_stride`, `q_stride`: elements between consecutive rows of `k`, `v`, `q` (at least
/// the row's width). Any work-group size; a grid of any size (each work-item loops over
/// `tokens * (kv_heads + heads) * ceil(D / 2 / pairs_per_item)` items). Buffer lengths are
/// checked once, uniformly (a mismatch traps): each strided operand spans exactly its
/// rows; each token's slot and position are checked against the cache and the tables
/// before they address anything; the accesses themselves then index without per-element
/// checks (bounds checks on every buffer would keep their lengths live in SGPRs: spills
/// on gfx9).
#[amdgpu_kernel(T = [f16, bf16, f32], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn rope_and_cache<T: Float>(
    k: &[T],
    v: &[T],
    q: &[T],
    q_out: &mut [T],
    k_out: &mut [T],
    v_out: &mut [T],
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
    k_stride: u32,
    v_stride: u32,
    q_stride: u32,
) {
    let (kvh, qh, d) = (kv_heads as usize, heads as usize, d as usize);
    let (ks, vs, qs) = (k_stride as usize, v_stride as usize, q_stride as usize);
    let d2 = d / 2;
    let tokens = slot_mapping.len();
    let row = kvh * d;
    if d2 == 0
        || kvh == 0
        || k.len() != strided_span(tokens, ks, row)
        || v.len() != strided_span(tokens, vs, row)
        || q.len() != strided_span(tokens, qs, qh * d)
        || q_out.len() != tokens * qh * d
        || (!k_out.is_empty() && k_out.len() != tokens * row)
        || v_out.len() != k_out.len()
        || positions.len() != tokens
        || k_cache.len() != v_cache.len()
        || sin.len() != cos.len()
    {
        panic!("rope_and_cache: buffer lengths do not match the shape");
    }
    let slots = k_cache.len() / row;
    let table_rows = cos.len() / d2;
    let with_out = !k_out.is_empty();
    let (kp, vp, qp, kcp, vcp) = (k.as_ptr(), v.as_ptr(), q.as_ptr(), k_cache.as_mut_ptr(), v_cache.as_mut_ptr());
    let (qop, kop, vop) = (q_out.as_mut_ptr(), k_out.as_mut_ptr(), v_out.as_mut_ptr());
    let (sp, pp, cp, snp) = (slot_mapping.as_ptr(), positions.as_ptr(), cos.as_ptr(), sin.as_ptr());
    let lanes = pairs_per_item::<T>();
    // Uniform: whole aligned 16-byte blocks everywhere (see the module docs).
    // (An empty buffer's pointer says nothing: it is left out.)
    let bits = ((d2 | ks | vs | qs) * core::mem::size_of::<T>())
        | kp as usize
        | vp as usize
        | cp as usize
        | snp as usize
        | kcp as usize
        | vcp as usize
        | addr_if(qp, qh != 0)
        | addr_if(qop, qh != 0)
        | addr_if(kop, with_out)
        | addr_if(vop, with_out);
    let vector = bits.is_multiple_of(16);
    // Items: chunks of `lanes` pairs of one head row (the last chunk of a row may be short
    // off the vector path). 32-bit index arithmetic: the host checked the count.
    let per_head = d2.div_ceil(lanes) as u32;
    let per_token = (kvh + qh) as u32 * per_head;
    let n = tokens as u32 * per_token;
    let mut e = global_idx_x() as u32;
    while e < n {
        let t = e / per_token;
        let r = e - t * per_token;
        let h = r / per_head;
        let i0 = ((r - h * per_head) as usize) * lanes;
        let (t, h) = (t as usize, h as usize);
        // SAFETY: t < tokens = positions.len() = slot_mapping.len() (checked above).
        let (p, slot) = unsafe { (*pp.add(t) as usize, *sp.add(t)) };
        if p >= table_rows || (slot >= 0 && slot as usize >= slots) {
            panic!("rope_and_cache: a position is outside the tables or a slot outside the cache");
        }
        // SAFETY: p < table_rows: the row is inside cos and sin (equal lengths).
        let tab = unsafe { (cp.add(p * d2), snp.add(p * d2)) };
        let key = h < kvh;
        let hq = h.wrapping_sub(kvh);
        // The row rotated (a key or a query) and where it goes: a key to its cache slot
        // (padding: nowhere) and to k_out, a query to q_out. SAFETY (every pointer): t <
        // tokens and h < kvh (a key) or hq < qh (a query), so each source row ends inside
        // its span, each output row inside its buffer, a slot's rows inside the caches.
        let (src, dst, dst2) = unsafe {
            if key {
                let kc = if slot >= 0 { kcp.add(slot as usize * row + h * d) } else { core::ptr::null_mut() };
                let ko = if with_out { kop.add(t * row + h * d) } else { core::ptr::null_mut() };
                (kp.add(t * ks + h * d), kc, ko)
            } else {
                (qp.add(t * qs + hq * d), qop.add((t * qh + hq) * d), core::ptr::null_mut())
            }
        };
        if vector {
            // SAFETY: as above; i0 + lanes <= d2 on this path, every address and offset a
            // multiple of 16 bytes.
            unsafe {
                let b = rotated_blocks(src, tab, i0, d2, interleaved != 0);
                if !dst.is_null() {
                    store_blocks(dst, i0, d2, b);
                }
                if !dst2.is_null() {
                    store_blocks(dst2, i0, d2, b);
                }
            }
        } else {
            // SAFETY: as above; i0 + m <= d2.
            unsafe { rotate_pairs(src, dst, dst2, tab, i0, (d2 - i0).min(lanes), d2, interleaved != 0) };
        }
        if key {
            // The values at the same indices, unchanged. SAFETY: as for the keys.
            let vsrc = unsafe { vp.add(t * vs + h * d) };
            let vc = if slot >= 0 { unsafe { vcp.add(slot as usize * row + h * d) } } else { core::ptr::null_mut() };
            let vo = if with_out { unsafe { vop.add(t * row + h * d) } } else { core::ptr::null_mut() };
            if vector {
                // SAFETY: as for the keys.
                unsafe {
                    let b = (load_block(vsrc.add(i0)), load_block(vsrc.add(i0 + d2)));
                    if !vc.is_null() {
                        store_blocks(vc, i0, d2, b);
                    }
                    if !vo.is_null() {
                        store_blocks(vo, i0, d2, b);
                    }
                }
            } else {
                // SAFETY: as for the keys.
                unsafe { copy_pairs(vsrc, vc, vo, i0, (d2 - i0).min(lanes), d2, interleaved != 0) };
            }
        }
        e += global_size_x() as u32;
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
