//! Row access shared by the row-wise families (reductions, softmax, norms): 8-element
//! chunks moved as 16-byte vectors where the row is aligned, and a register-resident
//! [`RowTile`] that lets a work-group read a row from memory once and reuse it.
//!
//! Work-item `t` of `n` owns chunks `t, t + n, t + 2n, ...` of its row, so one load
//! instruction of a wave covers whole contiguous cache lines.
use kernel_dsl::prelude::*;

/// Elements per chunk (one or two 16-byte accesses).
pub const CHUNK: usize = 8;

/// `each_lane!` over the first lane of each pair (`$j` = 0, 2, 4, 6), for conversions
/// that take two elements at a time.
#[macro_export]
macro_rules! each_pair {
    ($j:ident, $body:block) => {
        $crate::each_lane!(@ $j, $body, 0 2 4 6)
    };
}

// `each_lane!` writes out exactly 8 lanes.
const _: () = assert!(CHUNK == 8);

/// Runs `$body` with `$j` = 0, 1, ... [`CHUNK`]` - 1` as straight-line code, so a chunk's
/// values stay in registers (a loop the compiler declines to unroll would index them at
/// run time, from scratch / local memory).
#[macro_export]
macro_rules! each_lane {
    ($j:ident, $body:block) => {
        $crate::each_lane!(@ $j, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $j:ident, $body:block, $($i:literal)*) => {
        $({
            let $j: usize = $i;
            $body
        })*
    };
}

/// Most chunks per work-item a [`RowTile`] holds (see [`tile_chunks`]).
pub const TILE_CHUNKS: usize = 4;

/// Chunks per work-item in the [`RowTile`]s of elements of `elem_bytes` bytes, on the
/// architecture this is compiled for: 2 (rows up to 16384 elements at 1024 work-items),
/// and 4 for 16-bit types on NVIDIA (and the CPU executor, which runs this code path), so
/// that a work-item moves as many bytes as with 32-bit types (bf16 rows up to 32768). On
/// AMD, 4 chunks needed more than the 102 scalar registers of gfx90a and gfx942 and
/// spilled, so 16-bit types keep 2 there ([`AMD_TILE_CHUNKS`]).
pub const fn tile_chunks(elem_bytes: usize) -> usize {
    if cfg!(target_arch = "amdgpu") || elem_bytes > 2 {
        AMD_TILE_CHUNKS
    } else {
        TILE_CHUNKS
    }
}

/// Chunks per work-item of every [`RowTile`] on AMD GPUs, and of short 32-bit rows everywhere.
pub const AMD_TILE_CHUNKS: usize = 2;

/// f32 rows longer than this take [`TILE_CHUNKS`] chunks per work-item where 16-bit types
/// do (NVIDIA, the CPU executor): 16384 f32 columns then run on 512 work-items instead
/// of 1024 (two rows per compute unit overlap one row's reductions with the other's
/// loads, as the streaming path's 512 did), and rows up to 32768 are read once instead
/// of twice. The registers are those of the 16-bit tiles, which hold f32 values too.
pub const F32_WIDE_TILE_COLS: usize = 8192;

/// Chunks per work-item of the [`RowTile`]s of rows of `cols` elements of `elem_bytes`
/// bytes on the architecture this is compiled for: [`tile_chunks`], except for long f32
/// rows ([`F32_WIDE_TILE_COLS`]).
pub const fn row_chunks(elem_bytes: usize, cols: usize) -> usize {
    if !cfg!(target_arch = "amdgpu") && elem_bytes == 4 && cols > F32_WIDE_TILE_COLS {
        TILE_CHUNKS
    } else {
        tile_chunks(elem_bytes)
    }
}

/// The chunks per work-item a row of `cols` elements needs on `parts` work-items:
/// [`row_chunks`], or fewer where the work-group is wider than the fewest that hold the
/// row (the decode norms raise their work-items towards one chunk each), so that no
/// work-item computes chunk slots that lie wholly past the row.
pub const fn used_chunks(elem_bytes: usize, cols: usize, parts: usize) -> usize {
    let most = row_chunks(elem_bytes, cols);
    let need = if parts == 0 { most } else { cols.div_ceil(CHUNK * parts) };
    if need == 0 {
        1
    } else if need < most {
        need
    } else {
        most
    }
}

/// [`row_chunks`] of the kernels `dev` runs.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn row_chunks_on(dev: &crate::runtime::Device, elem_bytes: usize, cols: usize) -> usize {
    #[cfg(feature = "rocm")]
    if matches!(dev, crate::runtime::Device::Rocm(_)) {
        return AMD_TILE_CHUNKS;
    }
    let _ = dev;
    row_chunks(elem_bytes, cols)
}

/// [`tile_chunks`] of the kernels `dev` runs (the host is compiled with the NVIDIA / CPU
/// value; an AMD device runs code objects built with [`AMD_TILE_CHUNKS`]).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn tile_chunks_on(dev: &crate::runtime::Device, elem_bytes: usize) -> usize {
    // Rows of no columns take the plain tile size.
    row_chunks_on(dev, elem_bytes, 0)
}

/// Largest work-group the row kernels are launched with.
pub const MAX_ROW_THREADS: usize = 1024;

/// `CHUNK` elements, 16-byte aligned, read and written as whole vectors.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector<T>([T; CHUNK]);

/// `true` when chunks of `s` start on 16-byte boundaries (its start is aligned and a chunk
/// of `T` is a multiple of 16 bytes).
#[device]
#[inline(always)]
pub(crate) fn vectorizable<T>(s: *const T) -> bool {
    core::mem::size_of::<T>() >= 2 && (s as usize) % 16 == 0
}

/// The full chunk of `s` at element `e`, in `f32`: one or two vector loads when `vec`
/// (= `vectorizable(s)`, the same for the whole work-group), else eight scalar loads.
///
/// # Safety
/// `e + CHUNK <= s.len()` and `e` is a multiple of [`CHUNK`].
#[device]
#[inline(always)]
pub unsafe fn load_full<T: Float>(s: &[T], e: usize, vec: bool) -> [f32; CHUNK] {
    let mut v = [0.0; CHUNK];
    if vec {
        // SAFETY: in bounds by the contract; 16-byte aligned because the slice start is
        // and `e` elements are a multiple of 16 bytes.
        let c = unsafe { core::ptr::read(s.as_ptr().add(e) as *const Vector<T>) };
        v = unpack_chunk(&c.0);
    } else {
        each_lane!(j, {
            // SAFETY: e + j < e + CHUNK <= len.
            v[j] = unsafe { *s.get_unchecked(e + j) }.to_f32();
        });
    }
    v
}

/// Writes the full chunk of `s` at element `e` ([`load_full`]'s twin).
///
/// # Safety
/// As [`load_full`].
#[device]
#[inline(always)]
pub unsafe fn store_full<T: Float>(s: &mut [T], e: usize, v: &[f32; CHUNK], vec: bool) {
    if vec {
        let mut c = Vector([T::ZERO; CHUNK]);
        // In pairs: one packed conversion per pair where the target has one.
        each_pair!(j, {
            [c.0[j], c.0[j + 1]] = T::from_f32x2([v[j], v[j + 1]]);
        });
        // SAFETY: as in `load_full`.
        unsafe { core::ptr::write(s.as_mut_ptr().add(e) as *mut Vector<T>, c) };
    } else {
        each_lane!(j, {
            // SAFETY: e + j < e + CHUNK <= len.
            unsafe { *s.get_unchecked_mut(e + j) = T::from_f32(v[j]) };
        });
    }
}

/// `true` when `s` is made of whole 16-byte-aligned chunks: it starts on 16 bytes and its
/// length is a multiple of [`CHUNK`] (16-bit and 32-bit elements), or it is empty. The row kernels test
/// their rows (and weights) once and take a straight-line vector path when they are
/// ([`RowTile::load_as`], [`load_chunk_as`]); the same for every row of a launch whose
/// buffers start aligned.
#[device]
#[inline(always)]
pub fn whole_chunks<T>(s: &[T]) -> bool {
    // An empty slice's dangling pointer is only aligned to `T`: it qualifies (nothing to load).
    s.is_empty() || (s.len() % CHUNK == 0 && vectorizable(s.as_ptr()))
}

/// [`load_chunk`]; with `WHOLE` the caller has checked [`whole_chunks`]`(s)` (an empty `s`
/// qualifies and reads as `pad`): one vector load, no scalar alternative.
#[device]
#[inline(always)]
pub fn load_chunk_as<T: Float, const WHOLE: bool>(s: &[T], e: usize, pad: f32) -> [f32; CHUNK] {
    if !WHOLE {
        return load_chunk(s, e, pad);
    }
    if e + CHUNK <= s.len() {
        // SAFETY: in bounds (checked); 16-byte aligned by `whole_chunks(s)`.
        unsafe { load_full(s, e, true) }
    } else {
        [pad; CHUNK]
    }
}

/// The chunk of `s` starting at element `e`, in `f32`; elements past the end read as `pad`.
#[device]
#[inline(always)]
pub fn load_chunk<T: Float>(s: &[T], e: usize, pad: f32) -> [f32; CHUNK] {
    if e + CHUNK <= s.len() {
        // SAFETY: checked just above; chunks start at multiples of CHUNK.
        unsafe { load_full(s, e, vectorizable(s.as_ptr())) }
    } else {
        load_chunk_scalar(s, e, pad)
    }
}

/// [`load_chunk`] element by element, without branches: clamped loads and selects (no
/// divergent control flow or saved execution masks in unrolled code). For short or
/// cached data such as norm weights, where vector loads gain little.
#[device]
#[inline(always)]
pub fn load_chunk_scalar<T: Float>(s: &[T], e: usize, pad: f32) -> [f32; CHUNK] {
    let mut v = [pad; CHUNK];
    if !s.is_empty() {
        let last = s.len() - 1;
        each_lane!(j, {
            let x = s[(e + j).min(last)].to_f32();
            v[j] = if e + j <= last { x } else { pad };
        });
    }
    v
}

/// Writes `v` to the chunk of `s` starting at element `e`, dropping elements past the end.
#[device]
#[inline(always)]
pub fn store_chunk<T: Float>(s: &mut [T], e: usize, v: &[f32; CHUNK]) {
    if e + CHUNK <= s.len() {
        // SAFETY: checked just above.
        unsafe { store_full(s, e, v, vectorizable(s.as_ptr())) }
    } else {
        each_lane!(j, {
            if e + j < s.len() {
                s[e + j] = T::from_f32(v[j]);
            }
        });
    }
}

/// Runs `$body` with `$k` = 0 .. `$n - 1` (`$n` <= [`TILE_CHUNKS`], a constant after
/// inlining) as straight-line code (see `each_lane!`).
#[macro_export]
macro_rules! each_tile_chunk {
    ($k:ident, $n:expr, $body:block) => {
        $crate::each_tile_chunk!(@ $k, $n, $body, 0 1 2 3)
    };
    (@ $k:ident, $n:expr, $body:block, $($i:literal)*) => {
        $({
            let $k: usize = $i;
            if $k < $n {
                $body
            }
        })*
    };
}

// `each_tile_chunk!` writes out at most 4 chunks.
const _: () = assert!(TILE_CHUNKS == 4);

/// This work-item's share of a row, [`TILE_CHUNKS`] chunks held in registers: chunk `k`
/// starts at element [`RowTile::start`]`(k)`. The row is shared by the work-items of the
/// work-group ([`RowTile::load`]) or by the lanes of a wave ([`RowTile::load_of`]). Only
/// valid when the row fits ([`RowTile::fits`], [`RowTile::fits_wave`]).
pub struct RowTile {
    /// Values in `f32`; positions past the row hold the `pad` given to [`RowTile::load`].
    pub v: [[f32; CHUNK]; TILE_CHUNKS],
    /// Chunks in use: [`tile_chunks`] of the element type.
    pub chunks: usize,
    /// This work-item's place among the `parts` that share the row.
    part: usize,
    /// Work-items sharing the row.
    parts: usize,
}

impl RowTile {
    /// `true` when a row of `cols` elements of `T` fits the tiles of the work-group.
    #[inline(always)]
    pub fn fits<T>(cols: usize) -> bool {
        Self::fits_with(cols, row_chunks(core::mem::size_of::<T>(), cols))
    }

    /// `true` when a row of `cols` elements fits tiles of `chunks` chunks per work-item.
    #[inline(always)]
    pub fn fits_with(cols: usize, chunks: usize) -> bool {
        cols <= chunks * CHUNK * flat_block_dim() as usize
    }

    /// `true` when a row of `cols` elements of `T` fits the tiles of one wave's lanes.
    #[inline(always)]
    pub fn fits_wave<T>(cols: usize) -> bool {
        cols <= tile_chunks(core::mem::size_of::<T>()) * CHUNK * wave::size() as usize
    }

    /// First element of chunk `k` of this work-item.
    #[inline(always)]
    pub fn start(&self, k: usize) -> usize {
        (k * self.parts + self.part) * CHUNK
    }

    /// Loads this work-item's chunks of `row` (shared by the work-group).
    #[inline(always)]
    pub fn load<T: Float>(row: &[T], pad: f32) -> RowTile {
        Self::load_of(row, pad, flat_thread_idx() as usize, flat_block_dim() as usize)
    }

    /// Loads the chunks of `row` of the `part`-th of `parts` work-items sharing it (a
    /// lane of the wave that owns the row, for instance).
    #[inline(always)]
    pub fn load_of<T: Float>(row: &[T], pad: f32, part: usize, parts: usize) -> RowTile {
        Self::load_with(row, pad, part, parts, row_chunks(core::mem::size_of::<T>(), row.len()))
    }

    /// [`RowTile::load_of`] with `chunks` (at most [`TILE_CHUNKS`]) chunks per work-item.
    #[inline(always)]
    pub fn load_with<T: Float>(row: &[T], pad: f32, part: usize, parts: usize, chunks: usize) -> RowTile {
        Self::load_as::<T, false>(row, pad, part, parts, chunks)
    }

    /// [`RowTile::load_with`]; with `WHOLE` the caller has checked [`whole_chunks`]`(row)`,
    /// and every chunk is one vector load (or padding past the row): no scalar alternative
    /// for the compiler to predicate into the loop (ptxas sm_90 issued the eight scalar
    /// loads of a misaligned row, switched off, beside every vector load).
    #[inline(always)]
    pub fn load_as<T: Float, const WHOLE: bool>(row: &[T], pad: f32, part: usize, parts: usize, chunks: usize) -> RowTile {
        let mut t = RowTile { v: [[pad; CHUNK]; TILE_CHUNKS], chunks, part, parts };
        if WHOLE {
            each_tile_chunk!(k, t.chunks, {
                let e = t.start(k);
                if e + CHUNK <= row.len() {
                    // SAFETY: in bounds (checked); 16-byte aligned by `whole_chunks(row)`.
                    t.v[k] = unsafe { load_full(row, e, true) };
                }
            });
            return t;
        }
        let vec = vectorizable(row.as_ptr());
        each_tile_chunk!(k, t.chunks, {
            let e = t.start(k);
            t.v[k] = if e + CHUNK <= row.len() {
                // SAFETY: checked just above.
                unsafe { load_full(row, e, vec) }
            } else if e < row.len() {
                load_chunk_scalar(row, e, pad)
            } else {
                // Past the row (a row shorter than the tiles, such as 256 bf16 elements
                // over a wave's 32 lanes): padding without loads.
                [pad; CHUNK]
            };
        });
        t
    }

    /// Folds `f` over the values that lie inside a row of `cols` elements.
    #[inline(always)]
    pub fn fold(&self, cols: usize, init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut acc = init;
        each_tile_chunk!(k, self.chunks, {
            let e = self.start(k);
            each_lane!(j, {
                let next = f(acc, self.v[k][j]);
                acc = if e + j < cols { next } else { acc };
            });
        });
        acc
    }

    /// Folds `f` over all of this work-item's values, padding included: for folds where
    /// the `pad` given to [`RowTile::load`] changes nothing (a sum of squares over 0
    /// padding, a maximum over -inf padding), without [`RowTile::fold`]'s per-element
    /// bounds test.
    #[inline(always)]
    pub fn fold_padded(&self, init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut acc = init;
        each_tile_chunk!(k, self.chunks, {
            each_lane!(j, {
                acc = f(acc, self.v[k][j]);
            });
        });
        acc
    }

    /// Writes `f(chunk k values)` to each of this work-item's chunks of `out`; `f` gets the
    /// chunk's values and its first element index.
    #[inline(always)]
    pub fn store<T: Float>(&self, out: &mut [T], f: impl Fn(&[f32; CHUNK], usize) -> [f32; CHUNK]) {
        self.store_as::<T, false>(out, f)
    }

    /// [`RowTile::store`]; with `WHOLE` the caller has checked [`whole_chunks`]`(out)` and
    /// every chunk is one vector store (see [`RowTile::load_as`]).
    #[inline(always)]
    pub fn store_as<T: Float, const WHOLE: bool>(&self, out: &mut [T], f: impl Fn(&[f32; CHUNK], usize) -> [f32; CHUNK]) {
        if WHOLE {
            each_tile_chunk!(k, self.chunks, {
                let e = self.start(k);
                if e + CHUNK <= out.len() {
                    // SAFETY: in bounds (checked); 16-byte aligned by `whole_chunks(out)`.
                    unsafe { store_full(out, e, &f(&self.v[k], e), true) };
                }
            });
            return;
        }
        let vec = vectorizable(out.as_ptr());
        each_tile_chunk!(k, self.chunks, {
            let e = self.start(k);
            if e + CHUNK <= out.len() {
                // SAFETY: checked just above.
                unsafe { store_full(out, e, &f(&self.v[k], e), vec) };
            } else if e < out.len() {
                store_chunk(out, e, &f(&self.v[k], e));
            }
        });
    }
}

/// A chunk of stored values in `f32`, in pairs: 16-bit types convert a 32-bit word at a
/// time (packed conversions).
#[device]
#[inline(always)]
pub fn unpack_chunk<T: Float>(c: &[T; CHUNK]) -> [f32; CHUNK] {
    let mut v = [0.0; CHUNK];
    each_pair!(j, {
        [v[j], v[j + 1]] = T::to_f32x2([c[j], c[j + 1]]);
    });
    v
}

/// The four 32-bit words of a chunk of a 16-bit type (asserted; the check folds away).
#[device]
#[inline(always)]
pub fn chunk_words<T: Float>(c: &[T; CHUNK]) -> [u32; 4] {
    assert!(core::mem::size_of::<T>() == 2);
    // SAFETY: eight 16-bit values are four words (size checked); read unaligned (the
    // array is aligned for `T` only).
    unsafe { core::ptr::read_unaligned(c.as_ptr() as *const [u32; 4]) }
}

/// [`chunk_words`]' inverse: the chunk of a 16-bit type held in four words.
#[device]
#[inline(always)]
pub fn words_chunk<T: Float>(w: [u32; 4]) -> [T; CHUNK] {
    assert!(core::mem::size_of::<T>() == 2);
    // SAFETY: four words are eight 16-bit values (size checked), any bits a valid `T`
    // (`Float` types of 16 bits: f16, bf16).
    unsafe { core::mem::transmute_copy(&w) }
}

/// A work-item's share of a row of whole chunks ([`whole_chunks`]) of a 16-bit type, at
/// [`RowTile`]'s positions, held packed as loaded (half the registers of a [`RowTile`])
/// and unpacked to `f32` where used. A kernel that reads it before and after a work-group
/// reduction calls [`PackedTile::refresh`] in between, so that the compiler unpacks it a
/// second time instead of keeping the first unpacked copy alive across the reduction:
/// LayerNorm holds four chunks so under the 64-register cap of 1024-item kernels.
pub struct PackedTile<T> {
    v: [[T; CHUNK]; TILE_CHUNKS],
    /// Chunks in use.
    pub chunks: usize,
    part: usize,
    parts: usize,
}

impl<T: Float> PackedTile<T> {
    /// Loads `chunks` chunks (at most [`TILE_CHUNKS`]) of `row`, which is [`whole_chunks`],
    /// for the `part`-th of `parts` work-items sharing it.
    #[inline(always)]
    pub fn load_whole(row: &[T], part: usize, parts: usize, chunks: usize) -> PackedTile<T> {
        Self::load_whole_padded(row, part, parts, chunks, T::ZERO)
    }

    /// [`PackedTile::load_whole`] with chunks past the row holding `pad`: then
    /// [`PackedTile::get_whole`] reads every chunk without a per-element choice.
    #[inline(always)]
    pub fn load_whole_padded(row: &[T], part: usize, parts: usize, chunks: usize, pad: T) -> PackedTile<T> {
        // SAFETY (the load): the start of a chunk inside `row`, 16-byte aligned by
        // `whole_chunks(row)` (see `load_chunks`).
        Self::load_chunks(row, part, parts, chunks, pad, |p| unsafe { core::ptr::read(p as *const Vector<T>) }.0)
    }

    /// The tile's chunks inside `row` from `load` (given the first element of a whole,
    /// 16-byte aligned chunk of `row`: [`whole_chunks`]), the others all `pad`.
    #[inline(always)]
    fn load_chunks(row: &[T], part: usize, parts: usize, chunks: usize, pad: T, load: impl Fn(*const T) -> [T; CHUNK]) -> PackedTile<T> {
        let mut t = PackedTile { v: [[pad; CHUNK]; TILE_CHUNKS], chunks, part, parts };
        each_tile_chunk!(k, t.chunks, {
            let e = t.start(k);
            if e + CHUNK <= row.len() {
                // SAFETY: e + CHUNK <= row.len() (checked).
                t.v[k] = load(unsafe { row.as_ptr().add(e) });
            }
        });
        t
    }

    /// First element of chunk `k`.
    #[inline(always)]
    pub fn start(&self, k: usize) -> usize {
        (k * self.parts + self.part) * CHUNK
    }

    /// Chunk `k` in `f32`, or all `pad` when it starts at or past `len` (the row's length).
    #[inline(always)]
    pub fn get(&self, k: usize, len: usize, pad: f32) -> [f32; CHUNK] {
        if self.start(k) < len {
            unpack_chunk(&self.v[k])
        } else {
            [pad; CHUNK]
        }
    }

    /// [`PackedTile::load_whole`] with loads that leave the first-level cache to other
    /// data ([`kernel_dsl::hint::load_streaming_u32x4`]): for rows read once beside
    /// parameters read by every row.
    #[inline(always)]
    pub fn load_whole_streaming(row: &[T], part: usize, parts: usize, chunks: usize) -> PackedTile<T> {
        Self::load_chunks(row, part, parts, chunks, T::ZERO, |p| {
            if core::mem::size_of::<T>() == 2 {
                // SAFETY: a whole aligned chunk of `row` (see `load_chunks`); kernel buffers
                // are global memory.
                words_chunk(unsafe { kernel_dsl::hint::load_streaming_u32x4(p as *const [u32; 4]) })
            } else {
                // SAFETY: as in `load_whole_padded` (other sizes: plain loads).
                unsafe { core::ptr::read(p as *const Vector<T>) }.0
            }
        })
    }

    /// Chunk `k` in `f32` as loaded (chunks past the row: the load's pad).
    #[inline(always)]
    pub fn get_whole(&self, k: usize) -> [f32; CHUNK] {
        unpack_chunk(&self.v[k])
    }

    /// Passes every packed word through [`kernel_dsl::hint::opaque_u32`] (see the type's
    /// documentation). 16-bit types only (a no-op for others).
    #[inline(always)]
    pub fn refresh(&mut self) {
        if core::mem::size_of::<T>() != 2 {
            return;
        }
        each_tile_chunk!(k, self.chunks, {
            let w = chunk_words(&self.v[k]);
            self.v[k] = words_chunk([kernel_dsl::hint::opaque_u32(w[0]), kernel_dsl::hint::opaque_u32(w[1]), kernel_dsl::hint::opaque_u32(w[2]), kernel_dsl::hint::opaque_u32(w[3])]);
        });
    }
}

/// Several short rows held by one wave: rows of at most `CHUNK * wave::size()` elements
/// ([`ShortRows::fits`]: 256 on waves of 32) take one chunk per lane, so a wave holds
/// [`tile_chunks`] rows at once (tile chunk `k` = this lane's chunk of row `first + k`):
/// every register of the tile holds row data (a row per wave would leave the other
/// chunks as padding), the rows' loads are in flight together, and their wave
/// reductions interleave ([`ShortRows::wave_reduce`]).
pub struct ShortRows {
    /// Values in `f32`; positions past a row (or rows past the last) hold the load's `pad`.
    pub v: [[f32; CHUNK]; TILE_CHUNKS],
    /// Rows (tile chunks) per wave: [`tile_chunks`] of the element type.
    pub rows: usize,
    /// First row of this wave.
    pub first: usize,
    /// First element of this lane's chunk in each row.
    pub e: usize,
}

impl ShortRows {
    /// `true` when rows of `cols` elements take one chunk per lane.
    #[inline(always)]
    pub fn fits(cols: usize) -> bool {
        cols <= CHUNK * wave::size() as usize
    }

    /// Rows each wave takes for elements of `T` (see [`short_rows_config`]).
    #[inline(always)]
    pub fn per_wave<T>() -> usize {
        tile_chunks(core::mem::size_of::<T>())
    }

    /// First row of the wave with global index `global_idx_x() / wave::size()`, or `None`
    /// when all of its rows are past `rows` (wave-uniform).
    #[inline(always)]
    pub fn first_row<T>(rows: usize) -> Option<usize> {
        let first = global_idx_x() / wave::size() as usize * Self::per_wave::<T>();
        if first < rows { Some(first) } else { None }
    }

    /// Loads this lane's chunk of rows `first ..` of `input` (`rows` rows of `cols`).
    #[inline(always)]
    pub fn load<T: Float>(input: &[T], rows: usize, cols: usize, first: usize, pad: f32) -> ShortRows {
        let mut t = ShortRows { v: [[pad; CHUNK]; TILE_CHUNKS], rows: Self::per_wave::<T>(), first, e: wave::lane_id() as usize * CHUNK };
        each_tile_chunk!(k, t.rows, {
            let r = first + k;
            if r < rows && t.e < cols {
                t.v[k] = load_chunk(&input[r * cols..r * cols + cols], t.e, pad);
            }
        });
        t
    }

    /// `f` folded over each row's chunk of this lane (padding included, as
    /// [`RowTile::fold_padded`]).
    #[inline(always)]
    pub fn fold_padded(&self, init: f32, f: impl Fn(f32, f32) -> f32) -> [f32; TILE_CHUNKS] {
        let mut acc = [init; TILE_CHUNKS];
        each_tile_chunk!(k, self.rows, {
            each_lane!(j, {
                acc[k] = f(acc[k], self.v[k][j]);
            });
        });
        acc
    }

    /// Butterfly reduction over the wave of each row's value, the rows' exchanges
    /// interleaved: `op` over all lanes, in every lane (as [`wave::reduce`] per row).
    #[inline(always)]
    pub fn wave_reduce(&self, mut v: [f32; TILE_CHUNKS], op: impl Fn(f32, f32) -> f32) -> [f32; TILE_CHUNKS] {
        let mut offset = wave::size() / 2;
        while offset > 0 {
            each_tile_chunk!(k, self.rows, {
                v[k] = op(v[k], wave::shuffle_xor(v[k], offset));
            });
            offset /= 2;
        }
        v
    }

    /// Writes `f(k, row chunk)` to this lane's chunk of each row of `out` (rows as in
    /// [`ShortRows::load`]).
    #[inline(always)]
    pub fn store<T: Float>(&self, out: &mut [T], rows: usize, cols: usize, f: impl Fn(usize, &[f32; CHUNK]) -> [f32; CHUNK]) {
        each_tile_chunk!(k, self.rows, {
            let r = self.first + k;
            if r < rows && self.e < cols {
                store_chunk(&mut out[r * cols..r * cols + cols], self.e, &f(k, &self.v[k]));
            }
        });
    }
}

/// Launch shape for [`ShortRows`] kernels: `rows` rows, `per_wave` of them per wave
/// ([`tile_chunks_on`] of the device's kernels), work-groups of 256 work-items.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn short_rows_config(rows: usize, per_wave: usize, wave_lanes: u32) -> kernel_dsl::host::LaunchConfig {
    let waves_per_group = (256 / wave_lanes.clamp(32, 64)) as usize;
    let groups = rows.div_ceil(waves_per_group * per_wave.max(1)).max(1);
    kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(groups as u32), kernel_dsl::Dim3::x(256))
}

/// Calls `f(chunk, first element)` for each of this work-item's chunks of `row`, in order,
/// streaming: full chunks two at a time (both loaded before either is used, so two
/// vector loads are in flight per work-item) without per-chunk branches, then the row's
/// partial last chunk, if any, padded with `pad`.
#[device]
#[inline(always)]
pub fn for_each_chunk<T: Float>(row: &[T], pad: f32, f: impl FnMut(&[f32; CHUNK], usize)) {
    for_each_chunk_of(row, pad, flat_thread_idx() as usize, flat_block_dim() as usize, f)
}

/// [`for_each_chunk`] for the `part`-th of `parts` work-items sharing the row (a lane of
/// a wave that owns the row, for instance).
#[device]
#[inline(always)]
pub fn for_each_chunk_of<T: Float>(row: &[T], pad: f32, part: usize, parts: usize, mut f: impl FnMut(&[f32; CHUNK], usize)) {
    let step = parts * CHUNK;
    let full = row.len() - row.len() % CHUNK;
    let vec = vectorizable(row.as_ptr());
    let mut e = part * CHUNK;
    while e + step < full {
        // SAFETY: e + step < full and both are multiples of CHUNK, so both chunks end by
        // `full` <= len.
        let (a, b) = unsafe { (load_full(row, e, vec), load_full(row, e + step, vec)) };
        f(&a, e);
        f(&b, e + step);
        e += 2 * step;
    }
    if e < full {
        // SAFETY: as above.
        f(&unsafe { load_full(row, e, vec) }, e);
        e += step;
    }
    if e < row.len() {
        f(&load_chunk_scalar(row, e, pad), e);
    }
}

/// Writes `f(chunk of row, first element)` over all of `out`, streaming `row` (same
/// length), chunked as in [`for_each_chunk`].
#[device]
#[inline(always)]
pub fn map_chunks<T: Float>(row: &[T], out: &mut [T], f: impl Fn(&[f32; CHUNK], usize) -> [f32; CHUNK]) {
    map_chunks_of(row, out, flat_thread_idx() as usize, flat_block_dim() as usize, f)
}

/// [`map_chunks`] for the `part`-th of `parts` work-items sharing the row.
#[device]
#[inline(always)]
pub fn map_chunks_of<T: Float>(row: &[T], out: &mut [T], part: usize, parts: usize, f: impl Fn(&[f32; CHUNK], usize) -> [f32; CHUNK]) {
    let row = &row[..out.len()];
    let step = parts * CHUNK;
    let full = out.len() - out.len() % CHUNK;
    let (vi, vo) = (vectorizable(row.as_ptr()), vectorizable(out.as_ptr()));
    let mut e = part * CHUNK;
    while e < full {
        // SAFETY: as in `for_each_chunk`, for both slices (same length).
        unsafe { store_full(out, e, &f(&load_full(row, e, vi), e), vo) };
        e += step;
    }
    if e < out.len() {
        store_chunk(out, e, &f(&load_chunk_scalar(row, e, 0.0), e));
    }
}

/// Calls `body(r)` for the row this wave owns, if it is below `rows`: the wave with global
/// index `r` takes row `r`. Wave-uniform, so the body may use wave operations (and no
/// barriers: the waves of a work-group run different rows). One row per wave, no loop: a
/// loop over rows with a wave-uniform bound cost gfx90a more scalar registers than it has.
#[device]
#[inline(always)]
pub fn for_each_row_of_wave(rows: usize, body: impl FnOnce(usize)) {
    let r = global_idx_x() / wave::size() as usize;
    if r < rows {
        body(r);
    }
}

/// Launch shape for the wave-per-row kernels on a device with waves of `wave_lanes`
/// lanes (see `Device::wave_lanes`): work-groups of 256 work-items, one wave per row.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn wave_rows_config(rows: usize, wave_lanes: u32) -> kernel_dsl::host::LaunchConfig {
    let waves_per_group = (256 / wave_lanes.clamp(32, 64)) as usize;
    kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(rows.div_ceil(waves_per_group) as u32), kernel_dsl::Dim3::x(256))
}

/// Rows from which the row families run a wave per row instead of a work-group per row:
/// enough rows to keep every compute unit busy with waves (an H100 holds 132 x 64). On an
/// H100 this took f32 row sums of 4096 x 4096 from 49% to 66-82% of copy bandwidth.
pub const WAVE_ROWS_MIN: usize = 2048;

/// Longest rows softmax and the norms run a wave per row on (with at least
/// [`WAVE_ROWS_MIN`] rows): they read a row twice, and a wave's rows must stay in cache
/// between the passes. At 4096 columns the work-group-per-row tiles (one read) were 2.3x
/// faster on an H100.
pub const WAVE_COLS_MAX: usize = 1024;

/// `true` when softmax and the norms should run a wave per row on `rows x cols`.
pub fn use_wave_rows(rows: usize, cols: usize) -> bool {
    rows >= WAVE_ROWS_MIN && cols <= WAVE_COLS_MAX
}

/// Work-items for a row kernel over rows of `cols` elements of `elem_bytes` bytes.
///
/// Rows that fit get exactly enough work-items for [`tile_chunks`] chunks each (a multiple
/// of 64, whole waves of either size, at least 64): on an H100, softmax and RMSNorm ran
/// fastest with full tiles (4096 columns: 256 work-items beat 512 and 1024 by 1.3x and
/// 3x). Longer rows stream with 512 work-items (256 for 16-bit types), which beat 1024
/// by 2x at 32768 columns: several work-groups per compute unit overlap one group's
/// reductions with another's loads.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn row_threads(cols: usize, elem_bytes: usize) -> u32 {
    row_threads_for(cols, elem_bytes, row_chunks(elem_bytes, cols))
}

/// [`row_threads`] for kernels whose tiles hold `chunks` chunks per work-item.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn row_threads_for(cols: usize, elem_bytes: usize, chunks: usize) -> u32 {
    let tile = (cols.div_ceil(CHUNK * chunks).div_ceil(64) * 64).max(64);
    if tile <= MAX_ROW_THREADS {
        tile as u32
    } else if elem_bytes <= 2 {
        256
    } else {
        512
    }
}

/// Work-items for a reduction over rows of `cols` elements: four chunks each (two
/// double-loads in flight), 64 to [`MAX_ROW_THREADS`].
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn reduce_threads(cols: usize) -> u32 {
    (cols.div_ceil(CHUNK * 4).div_ceil(64) * 64).clamp(64, MAX_ROW_THREADS) as u32
}

/// Launch shape for a row kernel: one work-group per row, [`row_threads`] work-items.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config(kernel: &'static str, rows: usize, cols: usize, elem_bytes: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    launch_config_for(kernel, rows, cols, elem_bytes, row_chunks(elem_bytes, cols))
}

/// [`launch_config`] for kernels whose tiles hold `chunks` chunks per work-item.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config_chunks(kernel: &'static str, rows: usize, cols: usize, elem_bytes: usize, chunks: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    launch_config_for(kernel, rows, cols, elem_bytes, chunks)
}

/// [`launch_config`] for the kernels `dev` runs ([`row_chunks_on`]).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config_on(dev: &crate::runtime::Device, kernel: &'static str, rows: usize, cols: usize, elem_bytes: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    launch_config_for(kernel, rows, cols, elem_bytes, row_chunks_on(dev, elem_bytes, cols))
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
fn launch_config_for(kernel: &'static str, rows: usize, cols: usize, elem_bytes: usize, chunks: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    use kernel_dsl::host::{LaunchConfig, LaunchError};
    let bad = |reason: String| LaunchError::InvalidArgument { kernel, reason };
    let rows32 = u32::try_from(rows).map_err(|_| bad(format!("{rows} rows exceed one work-group per row (2^32)")))?;
    if u32::try_from(cols).is_err() {
        return Err(bad(format!("{cols} columns exceed 2^32")));
    }
    Ok(LaunchConfig::new(kernel_dsl::Dim3::x(rows32), kernel_dsl::Dim3::x(row_threads_for(cols, elem_bytes, chunks))))
}

/// Checks a row kernel's buffers: `x` and `y` hold the same whole number of rows of `cols`
/// elements. Returns the number of rows.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn check_rows(kernel: &'static str, x: usize, y: usize, cols: usize) -> Result<usize, kernel_dsl::host::LaunchError> {
    let bad = |reason: String| kernel_dsl::host::LaunchError::InvalidArgument { kernel, reason };
    if cols == 0 {
        return if x == 0 && y == 0 { Ok(0) } else { Err(bad("rows of 0 columns with a non-empty buffer".into())) };
    }
    if x % cols != 0 {
        return Err(bad(format!("input of {x} elements is not a whole number of rows of {cols}")));
    }
    if y != x {
        return Err(bad(format!("output has {y} elements, input {x}")));
    }
    Ok(x / cols)
}
