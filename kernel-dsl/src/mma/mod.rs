//! Wave-level matrix multiply-accumulate: `D = A * B + C` on 16x16x16 tiles held in the
//! registers of one wave.
//!
//! A wave holds a 16x16 `A` tile (rows x k) in a [`FragA`], a 16x16 `B` tile (k x cols) in
//! a [`FragB`] and a 16x16 accumulator in a [`FragC`]; [`mma`] multiplies and accumulates.
//! Inputs are `f16`/`bf16` with `f32` accumulation, or `i8` with `i32` accumulation.
//! Each lane holds some items of each tile; which ones depends on the lowering:
//!
//! | [`Lowering`] | targets | wave | A/B items | C items |
//! |---|---|---|---|---|
//! | `Mfma` | gfx90a, gfx942, gfx950 (`v_mfma_*_16x16x16*`; i8 on gfx942/950: `16x16x32`, half zero) | 64 | 4 | 4 |
//! | `Wmma` | gfx11: gfx1100, gfx1101, gfx1151 (`v_wmma_*_16x16x16_*`) | 32 | 16 (lanes 16-31 repeat 0-15) | 8 |
//! | `Wmma12` | gfx12: gfx1200, gfx1201 (`v_wmma_*_16x16x16_*`, RDNA4 operand widths) | 32 | 8 | 8 |
//! | `MmaSync` | NVIDIA sm_80+ (two `mma.sync.m16n8k16` per tile) | 32 | 8 | 8 |
//! | `Valu` | gfx1030, NVIDIA before sm_80 (shuffles + FMAs, `MmaSync` layout) | 32 | 8 | 8 |
//!
//! Kernels never depend on the layout: they build fragments with `from_fn(|row, k| ..)`
//! and read results with [`FragC::coord`] / [`FragC::for_each`], which ask the layout.
//! The exact layouts are the `layout` functions (`a_coord`, `b_coord`, `c_coord`):
//!
//! - `Mfma`: A item j of lane l = `(l%16, 4(l/16)+j)`, B = `(4(l/16)+j, l%16)`,
//!   C = `(4(l/16)+j, l%16)`.
//! - `Wmma`: A = `(l%16, j)`, B = `(j, l%16)`, C = `(2j + l/16, l%16)`.
//! - `Wmma12` with h = l/16: A = `(l%16, j%4 + 4h + 8(j/4))`, B = `(j%4 + 4h + 8(j/4), l%16)`,
//!   C = `(j + 8h, l%16)`; for i8: A = `(l%16, j + 8h)`, B = `(j + 8h, l%16)` (AMD's matrix
//!   instruction calculator, RDNA4).
//! - `MmaSync`/`Valu` with g = l/4, t = l%4: A = `(g + 8((j/2)%2), 2t + j%2 + 8(j/4))`,
//!   B = `(2t + j%2 + 8((j/2)%2), g + 8(j/4))`, C = `(g + 8((j/2)%2), 2t + j%2 + 8(j/4))`;
//!   for i8: A = `(g + 8(j/4), 4t + j%4)`, B = `(4t + j%4, g + 8(j/4))`.
//!
//! For attention: [`FragC::to_a`] turns an accumulator (`S = Q K^T`) into the A operand of
//! the next product (`P V`) in registers (free on `MmaSync`/`Valu`, lane shuffles
//! elsewhere), and [`FragC::row_max`] / [`FragC::row_sum`] reduce each row over the lanes
//! that hold it.
//!
//! On the CPU executor the lowering is the executor's [`MatrixUnit`](crate::host::MatrixUnit)
//! (by default MFMA for waves of 64, WMMA for 32): fragments use that lowering's layout
//! exactly, so a kernel that mixes layouts up computes wrong results on the CPU too.
//!
//! Every function that takes or builds a whole fragment is a wave operation: all lanes
//! of the wave call it together, in uniform control flow, with full waves.

/// [`each!`]'s GPU form: straight-line code (see the host form's docs).
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[macro_export]
macro_rules! each {
    ($i:ident in [$($n:literal),*] $body:block) => {$({
        #[allow(non_upper_case_globals)]
        const $i: usize = $n;
        $body
    })*};
}
/// Runs `$body` with `$i` (a `usize`) bound to each listed constant. On the GPU targets as
/// straight-line code, so register and fragment arrays are indexed by constants and stay in
/// registers (a loop the compiler leaves rolled would index them dynamically and put them in
/// local or scratch memory). On the host, where the CPU executor runs the same kernels, a
/// plain loop: unrolled, every instance of a kernel carries every copy of the body at
/// `opt-level = 0` (the flash tile step's were ~1 MB each, some 190 of them in each test
/// binary) and a larger frame on the executor's work-item stacks. So `$i` is a value, not a
/// constant expression, and the body may not `break` or `continue` an enclosing loop.
/// Kernels use it as `kernel_dsl::each!`.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
#[macro_export]
macro_rules! each {
    ($i:ident in [$($n:literal),*] $body:block) => {
        for $i in [$($n),*] {
            let $i: usize = $i;
            $body
        }
    };
}

pub mod copy;
pub mod wgmma;
mod layout;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host;
#[cfg(target_arch = "amdgpu")]
mod amdgpu;
#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
mod valu;

pub use copy::SharedAddr;
pub use layout::{a_coord, b_coord, c_coord, c_locate};

use crate::types::{bf16, f16, Element};
use crate::wave;

/// Tile rows (of A and C).
pub const M: usize = 16;
/// Tile columns (of B and C).
pub const N: usize = 16;
/// Tile depth (columns of A, rows of B).
pub const K: usize = 16;

/// How [`mma`] is carried out; decides the per-lane fragment layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// AMD CDNA matrix cores, waves of 64.
    Mfma,
    /// AMD RDNA3 WMMA, waves of 32.
    Wmma,
    /// AMD RDNA4 (gfx12) WMMA, waves of 32: 8 items per lane, no repeated half-wave.
    Wmma12,
    /// NVIDIA `mma.sync` (sm_80+), warps of 32.
    MmaSync,
    /// No matrix unit: lane shuffles and FMAs in the `MmaSync` layout, waves of 32.
    Valu,
}

impl Lowering {
    /// Lanes per wave the lowering works with.
    pub const fn wave_lanes(self) -> u32 {
        match self {
            Lowering::Mfma => 64,
            _ => 32,
        }
    }
    /// Items of an A or B fragment per lane.
    pub const fn ab_len(self) -> usize {
        layout::ab_len(self)
    }
    /// Items of an accumulator fragment per lane.
    pub const fn c_len(self) -> usize {
        layout::c_len(self)
    }
}

#[cfg(all(target_arch = "amdgpu", amdgpu_gen = "gfx9"))]
const DEVICE_LOWERING: Lowering = Lowering::Mfma;
#[cfg(all(target_arch = "amdgpu", amdgpu_gen = "gfx11"))]
const DEVICE_LOWERING: Lowering = Lowering::Wmma;
#[cfg(all(target_arch = "amdgpu", amdgpu_gen = "gfx12"))]
const DEVICE_LOWERING: Lowering = Lowering::Wmma12;
#[cfg(all(target_arch = "amdgpu", amdgpu_gen = "gfx10"))]
const DEVICE_LOWERING: Lowering = Lowering::Valu;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
const DEVICE_LOWERING: Lowering = Lowering::MmaSync;
#[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_80")))]
const DEVICE_LOWERING: Lowering = Lowering::Valu;

/// The lowering of this target (device) or of the running CPU-executor launch (host).
#[inline(always)]
pub fn lowering() -> Lowering {
    #[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
    {
        DEVICE_LOWERING
    }
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        host::lowering()
    }
}

/// Storage per lane: the lowering's count on a GPU, the largest count on the host (where
/// the lowering is chosen at run time).
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
const AB_CAP: usize = layout::ab_len(DEVICE_LOWERING);
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
const C_CAP: usize = layout::c_len(DEVICE_LOWERING);
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
const AB_CAP: usize = 16;
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
const C_CAP: usize = 8;

/// Which input family a type belongs to (selects instructions and the i8 layouts).
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InputKind {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 8-bit integer.
    I8,
}

/// An accumulator element: `f32` or `i32`.
pub trait MmaAcc: Element + PartialEq {}
impl MmaAcc for f32 {}
impl MmaAcc for i32 {}

/// An input element of [`mma`]: `f16`, `bf16` (accumulating in `f32`) or `i8` (in `i32`).
pub trait MmaInput: Element {
    /// The accumulator element.
    type Acc: MmaAcc;
    #[doc(hidden)]
    const KIND: InputKind;
    /// The raw bits (`i8` zero-extended).
    #[doc(hidden)]
    fn bits(self) -> u16;
    /// The value with these raw bits (`i8`: the low byte).
    #[doc(hidden)]
    fn from_bits16(b: u16) -> Self;
    /// `acc + a * b` as the matrix units compute it: the product exact, the sum rounded
    /// to `f32` (float), wrapping (i8).
    #[doc(hidden)]
    fn mac(acc: Self::Acc, a: Self, b: Self) -> Self::Acc;
}

impl MmaInput for f16 {
    type Acc = f32;
    const KIND: InputKind = InputKind::F16;
    #[inline(always)]
    fn bits(self) -> u16 { self.to_bits() }
    #[inline(always)]
    fn from_bits16(b: u16) -> Self { f16::from_bits(b) }
    #[inline(always)]
    fn mac(acc: f32, a: Self, b: Self) -> f32 { acc + a.to_f32() * b.to_f32() }
}
impl MmaInput for bf16 {
    type Acc = f32;
    const KIND: InputKind = InputKind::Bf16;
    #[inline(always)]
    fn bits(self) -> u16 { self.to_bits() }
    #[inline(always)]
    fn from_bits16(b: u16) -> Self { bf16::from_bits(b) }
    #[inline(always)]
    fn mac(acc: f32, a: Self, b: Self) -> f32 { acc + a.to_f32() * b.to_f32() }
}
impl MmaInput for i8 {
    type Acc = i32;
    const KIND: InputKind = InputKind::I8;
    #[inline(always)]
    fn bits(self) -> u16 { self as u8 as u16 }
    #[inline(always)]
    fn from_bits16(b: u16) -> Self { b as u8 as i8 }
    #[inline(always)]
    fn mac(acc: i32, a: Self, b: Self) -> i32 { acc.wrapping_add(a as i32 * b as i32) }
}

/// A 16-bit float input (`f16`, `bf16`): the ones an accumulator converts to.
pub trait MmaFloat: MmaInput<Acc = f32> + crate::types::Float {}
impl MmaFloat for f16 {}
impl MmaFloat for bf16 {}

/// Runs `$body` for `$j` = 0, 1, ... `$len - 1` (at most 16) as straight-line code with
/// constant indices, so fragments stay in registers (a loop that is not unrolled would
/// index them dynamically and put them in scratch memory).
macro_rules! unroll {
    ($j:ident < $len:expr, $body:block) => {
        unroll!(@ $j, $len, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $j:ident, $len:expr, $body:block, $($n:literal)*) => {{
        let len = $len;
        $(
            // Indices of steps past `len` sit in branches never taken; clippy sees the
            // constant index, not the guard.
            #[allow(clippy::out_of_bounds_indexing)]
            {
                #[allow(non_upper_case_globals)]
                const $j: usize = $n;
                if $j < len $body
            };
        )*
    }};
}

#[inline(always)]
fn lane() -> usize {
    wave::lane_id() as usize
}

macro_rules! fragment {
    ($(#[$doc:meta])* $name:ident, $cap:ident, $len:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<T> {
            /// This lane's items, in layout order (only the first `len()` are used).
            pub v: [T; $cap],
        }

        impl<T: Element> $name<T> {
            /// All zeros.
            #[inline(always)]
            pub fn zero() -> Self {
                Self { v: [T::ZERO; $cap] }
            }
            /// Items this lane holds.
            #[inline(always)]
            pub fn len(&self) -> usize {
                layout::$len(lowering())
            }
            /// `true` when the lane holds no items (never).
            #[inline(always)]
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
        }
    };
}

fragment!(
    /// This lane's part of a 16x16 A tile (rows x k).
    FragA, AB_CAP, ab_len
);
fragment!(
    /// This lane's part of a 16x16 B tile (k x cols).
    FragB, AB_CAP, ab_len
);
fragment!(
    /// This lane's part of a 16x16 accumulator tile (rows x cols), `f32` or `i32`.
    FragC, C_CAP, c_len
);

/// 32-bit words of an A or B fragment's items ([`FragA::to_words`]).
pub const AB_WORDS: usize = AB_CAP.div_ceil(2);

macro_rules! fragment_words {
    ($name:ident) => {
        impl<T: MmaInput> $name<T> {
            /// This lane's items two to a 32-bit word (item `2w` in the low half of word
            /// `w`). Fragments carried around a loop keep half the registers this way:
            /// LLVM does not narrow a loop's phi of 16-bit items into words, and then
            /// unpacks and repacks them for every product.
            #[inline(always)]
            pub fn to_words(&self) -> [u32; AB_WORDS] {
                let mut w = [0u32; AB_WORDS];
                unroll!(j < AB_WORDS, {
                    let hi = if 2 * j + 1 < AB_CAP { self.v[(2 * j + 1) % AB_CAP].bits() as u32 } else { 0 };
                    w[j] = self.v[2 * j].bits() as u32 | hi << 16;
                });
                w
            }
            /// The fragment whose items [`to_words`](Self::to_words) gave `w`.
            #[inline(always)]
            pub fn from_words(w: [u32; AB_WORDS]) -> Self {
                let mut out = Self::zero();
                unroll!(j < AB_WORDS, {
                    out.v[2 * j] = T::from_bits16(w[j] as u16);
                    if 2 * j + 1 < AB_CAP {
                        out.v[(2 * j + 1) % AB_CAP] = T::from_bits16((w[j] >> 16) as u16);
                    }
                });
                out
            }
        }
    };
}
fragment_words!(FragA);
fragment_words!(FragB);

impl<T: MmaInput> FragA<T> {
    /// `(row, k)` of this lane's item `j`.
    #[inline(always)]
    pub fn coord(&self, j: usize) -> (usize, usize) {
        a_coord(lowering(), T::KIND == InputKind::I8, lane(), j)
    }
    /// The fragment whose element `(row, k)` is `f(row, k)`; `f` is called for this
    /// lane's items only.
    #[inline(always)]
    pub fn from_fn(mut f: impl FnMut(usize, usize) -> T) -> Self {
        let mut out = Self::zero();
        let (low, i8, l) = (lowering(), T::KIND == InputKind::I8, lane());
        unroll!(j < layout::ab_len(low), {
            let (r, k) = a_coord(low, i8, l, j);
            out.v[j % AB_CAP] = f(r, k);
        });
        out
    }
}

impl<T: MmaInput> FragA<T> {
    /// The fragment of the row-major tile at `base` in work-group shared memory: element
    /// `(row, k)` at `base[row * ld + k]`. On `MmaSync` with 16-bit inputs this is one
    /// `ldmatrix.x4` (rows must start on 16-byte boundaries); elsewhere element loads.
    ///
    /// # Safety
    /// `base` points into shared memory with the 16 x 16 tile readable, and (for
    /// `ldmatrix`) `base` and `ld * size_of::<T>()` are multiples of 16 bytes.
    #[inline(always)]
    pub unsafe fn load_shared(base: *const T, ld: usize) -> Self {
        let at = SharedAddr::new(base).add(Self::lane_offset(ld) * core::mem::size_of::<T>());
        // SAFETY: the caller's contract.
        unsafe { Self::load_shared_at(at, ld) }
    }
    /// Elements from a tile's origin to the address this lane passes to
    /// [`load_shared_at`](Self::load_shared_at) (the row it names for `ldmatrix`; 0 where
    /// fragments are loaded element by element). Loop-invariant: compute it once.
    #[inline(always)]
    pub fn lane_offset(ld: usize) -> usize {
        // Lane l names row (l % 8) + 8 (q % 2), columns 8 (q / 2) .. + 8 of matrix q = l / 8;
        // register q then holds items 2q, 2q + 1 of the mma.sync A layout.
        ldmatrix_lane_offset::<T>(ld)
    }
    /// [`load_shared`](Self::load_shared) from `at` = the tile's origin plus
    /// [`lane_offset`](Self::lane_offset)`(ld)` elements: per load one `ldmatrix` on a
    /// 32-bit address (constant tile offsets fold into its immediate).
    ///
    /// # Safety
    /// As [`load_shared`](Self::load_shared) for the tile at `at` minus the lane offset.
    #[inline(always)]
    pub unsafe fn load_shared_at(at: SharedAddr, ld: usize) -> Self {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { ldmatrix_items::<T, false>(at) } {
            return FragA { v };
        }
        let base: *const T = at.as_ptr();
        // SAFETY: the caller's contract (the lane offset is 0 on this path).
        Self::from_fn(|r, k| unsafe { *base.add(r * ld + k) })
    }
}

impl<T: MmaInput> FragB<T> {
    /// The fragment of the row-major (k-major) tile at `base` in shared memory: element
    /// `(k, col)` at `base[k * ld + col]`. On `MmaSync` with 16-bit inputs this is one
    /// `ldmatrix.x4.trans`; elsewhere element loads.
    ///
    /// # Safety
    /// As [`FragA::load_shared`].
    #[inline(always)]
    pub unsafe fn load_shared(base: *const T, ld: usize) -> Self {
        let at = SharedAddr::new(base).add(Self::lane_offset(ld) * core::mem::size_of::<T>());
        // SAFETY: the caller's contract.
        unsafe { Self::load_shared_at(at, ld) }
    }
    /// As [`FragA::lane_offset`], for [`load_shared_at`](Self::load_shared_at).
    #[inline(always)]
    pub fn lane_offset(ld: usize) -> usize {
        // Matrix q = l / 8 covers k 8 (q % 2) .. + 8 and columns 8 (q / 2) .. + 8; transposed,
        // register q holds items 2q, 2q + 1 of the mma.sync B layout.
        ldmatrix_lane_offset::<T>(ld)
    }
    /// As [`FragA::load_shared_at`] (`ldmatrix.x4.trans` on `MmaSync`).
    ///
    /// # Safety
    /// As [`FragA::load_shared_at`].
    #[inline(always)]
    pub unsafe fn load_shared_at(at: SharedAddr, ld: usize) -> Self {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { ldmatrix_items::<T, true>(at) } {
            return FragB { v };
        }
        let base: *const T = at.as_ptr();
        // SAFETY: the caller's contract (the lane offset is 0 on this path).
        Self::from_fn(|k, c| unsafe { *base.add(k * ld + c) })
    }
}

impl<T: MmaInput> FragB<T> {
    /// The fragment of the column-major (n-major) tile at `base` in shared memory: element
    /// `(k, col)` at `base[col * ld + k]`, i.e. the B operand `M^T` of a row-major `N x K`
    /// matrix `M` (attention's `K^T` from keys stored as rows) without transposing it. On
    /// `MmaSync` with 16-bit inputs one `ldmatrix.x4` (not `.trans`), its four registers
    /// already in B order; elsewhere element loads.
    ///
    /// # Safety
    /// As [`FragA::load_shared`].
    #[inline(always)]
    pub unsafe fn load_shared_cols(base: *const T, ld: usize) -> Self {
        let at = SharedAddr::new(base).add(Self::cols_lane_offset(ld) * core::mem::size_of::<T>());
        // SAFETY: the caller's contract.
        unsafe { Self::load_shared_cols_at(at, ld) }
    }
    /// As [`FragA::lane_offset`], for [`load_shared_cols_at`](Self::load_shared_cols_at).
    #[inline(always)]
    pub fn cols_lane_offset(ld: usize) -> usize {
        if uses_ldmatrix::<T>() {
            // Matrix q = l / 8 covers columns 8 (q / 2) .. + 8 (the stored rows) and k
            // 8 (q % 2) .. + 8: register q holds items 2q, 2q + 1 of the B layout.
            let (l, q) = (lane(), lane() / 8);
            (l % 8 + 8 * (q / 2)) * ld + 8 * (q % 2)
        } else {
            0
        }
    }
    /// [`load_shared_cols`](Self::load_shared_cols) from `at` = the tile's origin plus
    /// [`cols_lane_offset`](Self::cols_lane_offset)`(ld)` elements (constant tile offsets
    /// fold into the load's immediate).
    ///
    /// # Safety
    /// As [`load_shared_cols`](Self::load_shared_cols) for the tile at `at` minus the lane
    /// offset.
    #[inline(always)]
    pub unsafe fn load_shared_cols_at(at: SharedAddr, ld: usize) -> Self {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { ldmatrix_items::<T, false>(at) } {
            return FragB { v };
        }
        let base: *const T = at.as_ptr();
        // SAFETY: the caller's contract (the lane offset is 0 on this path).
        Self::from_fn(|k, c| unsafe { *base.add(c * ld + k) })
    }
}

/// The 16-byte segment of a 16 x 16 tile of 16-bit elements that this lane names for
/// [`FragA::load_segments`] / [`FragB::load_segments`], as `(row, first column)`: lane `l`
/// names row `l % 8 + 8 (q % 2)`, columns `8 (q / 2) .. + 8` of the tile, `q = l / 8`
/// (`ldmatrix.x4`'s order). For B the rows are k.
#[inline(always)]
pub fn segment() -> (usize, usize) {
    let (l, q) = (lane(), lane() / 8);
    (l % 8 + 8 * (q % 2), 8 * (q / 2))
}

/// This lane's segment ([`segment`]) at `at`, as four words.
///
/// # Safety
/// `at` holds 16 readable bytes of shared memory.
#[inline(always)]
unsafe fn read_segment<T: MmaInput>(at: SharedAddr) -> [u32; 4] {
    if core::mem::size_of::<T>() != 2 {
        panic!("mma: segment loads take 16-bit elements");
    }
    let p: *const u32 = at.as_ptr();
    // SAFETY: the caller's contract.
    unsafe { [*p, *p.add(1), *p.add(2), *p.add(3)] }
}

/// Item `(r, c)` (row, column of the stored rows) of a tile whose segments the lanes read
/// with [`read_segment`]: fetched from the lane that read it by shuffles (every lane
/// shuffles all four words; each keeps its own). The path of targets without
/// `ldmatrix`, and of the CPU executor, in any lowering.
#[inline(always)]
fn segment_item<T: MmaInput>(seg: &[u32; 4], r: usize, c: usize) -> T {
    let src = 8 * (r / 8 + 2 * (c / 8)) + r % 8;
    let pos = c % 8;
    let mut word = 0;
    unroll!(w < 4, {
        let v = wave::shuffle(seg[w], src as u32);
        if w == pos / 2 {
            word = v;
        }
    });
    T::from_bits16((word >> (16 * (pos % 2))) as u16)
}

impl<T: MmaInput> FragA<T> {
    /// The fragment of a 16 x 16 tile of 16-bit elements whose rows lie in shared memory
    /// as 16-byte segments in any order (a swizzled layout): `at` is the address of the
    /// segment this lane names ([`segment`]: row, first k). One `ldmatrix.x4` on NVIDIA;
    /// elsewhere each lane reads its segment and the wave exchanges them by shuffles.
    ///
    /// # Safety
    /// `at` is 16-byte aligned shared memory holding this lane's segment, for every lane.
    #[inline(always)]
    pub unsafe fn load_segments(at: SharedAddr) -> Self {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { ldmatrix_items::<T, false>(at) } {
            return FragA { v };
        }
        // SAFETY: the caller's contract.
        let seg = unsafe { read_segment::<T>(at) };
        Self::from_fn(|r, k| segment_item(&seg, r, k))
    }
}

impl<T: MmaInput> FragB<T> {
    /// As [`FragA::load_segments`] for a k-major B tile: this lane's segment is k row,
    /// first column ([`segment`]); one `ldmatrix.x4.trans` on NVIDIA.
    ///
    /// # Safety
    /// As [`FragA::load_segments`].
    #[inline(always)]
    pub unsafe fn load_segments(at: SharedAddr) -> Self {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { ldmatrix_items::<T, true>(at) } {
            return FragB { v };
        }
        // SAFETY: the caller's contract.
        let seg = unsafe { read_segment::<T>(at) };
        Self::from_fn(|k, c| segment_item(&seg, k, c))
    }
}

/// This lane's A (`TRANS = false`) or B (`TRANS = true`, `ldmatrix.trans`) items from one
/// `ldmatrix.x4` at the row address `at`, where fragments of `T` load with `ldmatrix`
/// ([`uses_ldmatrix`]); `None` elsewhere (the caller loads element by element).
///
/// # Safety
/// `at` is 16-byte aligned shared memory holding the row segment this lane names, for
/// every lane.
#[inline(always)]
#[allow(unused_variables)]
unsafe fn ldmatrix_items<T: MmaInput, const TRANS: bool>(at: SharedAddr) -> Option<[T; AB_CAP]> {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    if uses_ldmatrix::<T>() {
        // SAFETY: the caller's contract.
        let w = unsafe { nvptx::ldmatrix_x4::<TRANS>(at.raw()) };
        // SAFETY: T is a 16-bit type here.
        return Some(unsafe { cast(unpack16(w)) });
    }
    None
}

/// `true` where 16x16 fragments of `T` load with `ldmatrix` (NVIDIA sm_80+, 16-bit inputs).
#[inline(always)]
fn uses_ldmatrix<T: MmaInput>() -> bool {
    cfg!(all(target_arch = "nvptx64", target_feature = "sm_80")) && T::KIND != InputKind::I8
}

/// Elements from a 16 x 16 tile's origin (row stride `ld`) to the row this lane names for
/// `ldmatrix.x4` (row `l % 8 + 8 (q % 2)`, column `8 (q / 2)` with `q = l / 8`); 0 where
/// fragments load element by element. The same for A and (transposed) B fragments.
#[inline(always)]
fn ldmatrix_lane_offset<T: MmaInput>(ld: usize) -> usize {
    if uses_ldmatrix::<T>() {
        let (l, q) = (lane(), lane() / 8);
        (l % 8 + 8 * (q % 2)) * ld + 8 * (q / 2)
    } else {
        0
    }
}

/// Four registers of two 16-bit values each, as 8 values (low half first).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
#[inline(always)]
fn unpack16(w: [u32; 4]) -> [u16; 8] {
    [w[0] as u16, (w[0] >> 16) as u16, w[1] as u16, (w[1] >> 16) as u16, w[2] as u16, (w[2] >> 16) as u16, w[3] as u16, (w[3] >> 16) as u16]
}

impl<T: MmaInput> FragB<T> {
    /// `(k, col)` of this lane's item `j`.
    #[inline(always)]
    pub fn coord(&self, j: usize) -> (usize, usize) {
        b_coord(lowering(), T::KIND == InputKind::I8, lane(), j)
    }
    /// The fragment whose element `(k, col)` is `f(k, col)`.
    #[inline(always)]
    pub fn from_fn(mut f: impl FnMut(usize, usize) -> T) -> Self {
        let mut out = Self::zero();
        let (low, i8, l) = (lowering(), T::KIND == InputKind::I8, lane());
        unroll!(j < layout::ab_len(low), {
            let (k, c) = b_coord(low, i8, l, j);
            out.v[j % AB_CAP] = f(k, c);
        });
        out
    }
}

impl<T: Element> FragC<T> {
    /// `(row, col)` of this lane's item `j`.
    #[inline(always)]
    pub fn coord(&self, j: usize) -> (usize, usize) {
        c_coord(lowering(), lane(), j)
    }
    /// The fragment whose element `(row, col)` is `f(row, col)`.
    #[inline(always)]
    pub fn from_fn(mut f: impl FnMut(usize, usize) -> T) -> Self {
        let mut out = Self::zero();
        let (low, l) = (lowering(), lane());
        unroll!(j < layout::c_len(low), {
            let (r, c) = c_coord(low, l, j);
            out.v[j % C_CAP] = f(r, c);
        });
        out
    }
    /// Calls `f(row, col, value)` for this lane's items (stores, epilogues).
    #[inline(always)]
    pub fn for_each(&self, mut f: impl FnMut(usize, usize, T)) {
        let (low, l) = (lowering(), lane());
        unroll!(j < layout::c_len(low), {
            let (r, c) = c_coord(low, l, j);
            f(r, c, self.v[j % C_CAP]);
        });
    }
    /// Applies `f(row, col, value)` to every item.
    #[inline(always)]
    pub fn map(mut self, mut f: impl FnMut(usize, usize, T) -> T) -> Self {
        let (low, l) = (lowering(), lane());
        unroll!(j < layout::c_len(low), {
            let (r, c) = c_coord(low, l, j);
            self.v[j % C_CAP] = f(r, c, self.v[j % C_CAP]);
        });
        self
    }
}

impl FragC<f32> {
    /// Every item replaced by `op` folded over its row (all 16 columns), in every lane
    /// that holds part of the row. `op` must be associative and commutative (max, sum).
    // Out of line on the CPU executor (as `to_a`): inlined, its unrolled shuffles were
    // copied into every call site of every kernel instance in unoptimised host builds.
    #[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
    #[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
    #[track_caller]
    pub fn row_reduce(&self, op: impl Fn(f32, f32) -> f32) -> FragC<f32> {
        let low = lowering();
        let mut out = *self;
        if matches!(low, Lowering::MmaSync | Lowering::Valu) {
            // Items 0, 1, 4, 5 are row g; 2, 3, 6, 7 row g + 8: fold them, exchange the two
            // row values across the row's lanes (two shuffles per step, not one per item),
            // then broadcast.
            let (mut lo, mut hi) = (out.v[0], out.v[2 % C_CAP]);
            unroll!(j < C_CAP, {
                if j % 2 == 1 || j / 4 == 1 {
                    if (j / 2) & 1 == 0 { lo = op(lo, out.v[j % C_CAP]) } else { hi = op(hi, out.v[j % C_CAP]) }
                }
            });
            for &mask in layout::row_lane_masks(low) {
                lo = op(lo, wave::shuffle_xor(lo, mask));
                hi = op(hi, wave::shuffle_xor(hi, mask));
            }
            unroll!(j < C_CAP, {
                out.v[j % C_CAP] = if (j / 2) & 1 == 0 { lo } else { hi };
            });
            return out;
        }
        for &mask in layout::row_lane_masks(low) {
            unroll!(j < layout::c_len(low), {
                out.v[j % C_CAP] = op(out.v[j % C_CAP], wave::shuffle_xor(out.v[j % C_CAP], mask));
            });
        }
        out
    }
    /// Row maxima (NaN-ignoring, like `f32::max`), broadcast to every item of the row.
    #[inline(always)]
    #[track_caller]
    pub fn row_max(&self) -> FragC<f32> {
        self.row_reduce(f32::max)
    }
    /// Row sums, broadcast to every item of the row.
    #[inline(always)]
    #[track_caller]
    pub fn row_sum(&self) -> FragC<f32> {
        self.row_reduce(|a, b| a + b)
    }
    /// This accumulator as the A operand of a next product (element `(row, col)` becomes
    /// `(row, k = col)`), rounded to `T`, without going through memory.
    // Out of line on the CPU executor: inlined, the MFMA path's 16 x 16 unrolled shuffles
    // were copied into every call site (hundreds of KB per flash tile step instance in
    // unoptimised host builds).
    #[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
    #[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
    #[track_caller]
    pub fn to_a<T: MmaFloat>(&self) -> FragA<T> {
        let low = lowering();
        let mut out = FragA::<T>::zero();
        if matches!(low, Lowering::MmaSync | Lowering::Valu) {
            // The accumulator and A layouts coincide item by item. On `MmaSync` items 2q,
            // 2q + 1 share a register and convert as a pair (one `cvt.rn.bf16x2.f32`, sm_80+;
            // the VALU lowering also runs on older NVIDIA GPUs, which lack it).
            if low == Lowering::MmaSync {
                unroll!(j < layout::c_len(low) / 2, {
                    let [x, y] = T::from_f32x2([self.v[(2 * j) % C_CAP], self.v[(2 * j + 1) % C_CAP]]);
                    out.v[(2 * j) % AB_CAP] = x;
                    out.v[(2 * j + 1) % AB_CAP] = y;
                });
            } else {
                unroll!(j < layout::c_len(low), {
                    out.v[j % AB_CAP] = T::from_f32(self.v[j % C_CAP]);
                });
            }
            return out;
        }
        if low == Lowering::Wmma {
            return wmma_to_a(self);
        }
        if low == Lowering::Wmma12 {
            return wmma12_to_a(self);
        }
        let l = lane();
        unroll!(j < layout::ab_len(low), {
            let (r, k) = a_coord(low, false, l, j);
            let (src, item) = c_locate(low, r, k);
            let mut v = 0.0f32;
            unroll!(q < layout::c_len(low), {
                let x = wave::shuffle(self.v[q % C_CAP], src as u32);
                if q == item {
                    v = x;
                }
            });
            out.v[j % AB_CAP] = T::from_f32(v);
        });
        out
    }
}

/// The first 8 accumulator items reversed: item `t` is `c[-t mod 8]` (with
/// [`rotate_right`] by `a`, item `t` is `c[(a - t) mod 8]`, the order the WMMA `to_a`
/// paths send them in).
#[inline(always)]
fn reversed_items(c: &FragC<f32>) -> [f32; 8] {
    let mut p = [0.0f32; 8];
    unroll!(t < 8, {
        p[t % 8] = c.v[((8 - t) % 8) % C_CAP];
    });
    p
}

/// `v` rotated right by `by` (`N` a power of two, at most 16; `by < N`): item `t` becomes
/// `v[(t - by) mod N]`. A barrel shifter on the bits of `by`, so every index is a constant
/// and the items stay in registers (selects, no memory).
#[inline(always)]
fn rotate_right<const N: usize>(mut v: [f32; N], by: usize) -> [f32; N] {
    unroll!(bi < 4, {
        let bit = 1usize << bi;
        if bit < N {
            let take = by & bit != 0;
            let prev = v;
            unroll!(t < N, {
                if take {
                    v[t % N] = prev[(t + N - bit) % N];
                }
            });
        }
    });
    v
}

/// [`FragC::to_a`] in the WMMA layouts with 16 shuffles: lane `l` (row `r = l % 16`)
/// needs `C[r][0..16]`, held one per lane by the lanes of its row parity. In round `s` it
/// reads column `(r + s) % 16`; each source lane first rotates its 8 items so that the row
/// its reader wants sits at a fixed position, and the reader rotates the 16 values it
/// collected back into column order at the end (selects, no memory).
// Out of line on the CPU executor: inlined, every unrolled copy's locals would sit in
// the frame of each kernel that converts an accumulator, on its work-item stack.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
#[track_caller]
fn wmma_to_a<T: MmaFloat>(c: &FragC<f32>) -> FragA<T> {
    let l = lane();
    let (col, r) = (l % 16, l % 16);
    let (a, b) = (col / 2, col % 2);
    // rot[i] = c[(a - i) mod 8].
    let rot = rotate_right(reversed_items(c), a);
    let mut t = [0.0f32; 16];
    unroll!(s < 16, {
        let (sigma, tau) = (s / 2, s % 2);
        let send = if tau == 1 && b == 0 { rot[(sigma + 1) % 8] } else { rot[sigma % 8] };
        let src = (r + s) % 16 + 16 * (r % 2);
        t[s % 16] = wave::shuffle(send, src as u32);
    });
    // a[k] = t[(k - r) mod 16].
    let t = rotate_right(t, r);
    let mut out = FragA::<T>::zero();
    unroll!(k < 16, {
        out.v[k % AB_CAP] = T::from_f32(t[k % 16]);
    });
    out
}

/// [`FragC::to_a`] in the gfx12 WMMA layouts with 8 shuffles. Lane `l` (row `r = l % 16`,
/// half `h = l / 16`) needs `C[r][k]` for the 8 columns `K_h = {4h..4h+3, 8+4h..8+4h+3}`
/// (its A items, in order); `C[r][k]` is item `r % 8` of lane `k + 16 (r / 8)`. In round
/// `s` lane `l` reads column `K_h[(s + r) % 8]`. Each source lane then has exactly one
/// reader per round, wanting its item `(i - s) % 8` (`i`: the position of the lane's
/// column in its `K_h`): the source rotates its items once so that round `s` sends
/// position `s`, and the reader rotates what it collected back into item order (selects,
/// no memory).
// Out of line on the CPU executor: inlined, every unrolled copy's locals would sit in
// the frame of each kernel that converts an accumulator, on its work-item stack.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
#[track_caller]
fn wmma12_to_a<T: MmaFloat>(c: &FragC<f32>) -> FragA<T> {
    let l = lane();
    // This lane's row as a reader, and its column as a source: r = l % 16 both.
    let (r, h) = (l % 16, l / 16);
    // As a source: the position of column r in K_(r/4 % 2); rot[t] = c[(i - t) mod 8].
    let i = r % 4 + 4 * (r / 8);
    let rot = rotate_right(reversed_items(c), i);
    // As a reader: round s fetches position p = (s + r) % 8 of K_h.
    let mut got = [0.0f32; 8];
    unroll!(s < 8, {
        let p = (s + r) % 8;
        let k = p % 4 + 4 * h + 8 * (p / 4);
        let src = k + 16 * (r / 8);
        got[s % 8] = wave::shuffle(rot[s % 8], src as u32);
    });
    // Item p = got[(p - r) mod 8].
    let got = rotate_right(got, r % 8);
    let mut out = FragA::<T>::zero();
    unroll!(p < 8, {
        out.v[p % AB_CAP] = T::from_f32(got[p % 8]);
    });
    out
}

/// A scheduling fence: on AMDGPU the compiler may not move instructions across it
/// (`llvm.amdgcn.sched.barrier(0)`), which bounds how many loads it hoists ahead and so
/// the registers held at once; nothing elsewhere.
#[inline(always)]
pub fn schedule_fence() {
    #[cfg(target_arch = "amdgpu")]
    valu::sched_barrier();
}

/// `a * b + c` for one 16x16x16 tile on the wave's matrix unit (a wave operation).
#[inline(always)]
#[track_caller]
pub fn mma<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        host::mma(a, b, c)
    }
    #[cfg(target_arch = "amdgpu")]
    {
        match DEVICE_LOWERING {
            Lowering::Valu => valu::mma(a, b, c),
            _ => amdgpu::mma(a, b, c),
        }
    }
    #[cfg(target_arch = "nvptx64")]
    {
        match DEVICE_LOWERING {
            Lowering::Valu => valu::mma(a, b, c),
            _ => nvptx::mma(a, b, c),
        }
    }
}

/// `true` where [`mma_pair`] multiplies both slices in one instruction: gfx950's double-rate
/// `v_mfma_f32_16x16x32_{f16,bf16}` for 16-bit inputs, and the CPU executor's MFMA mode,
/// which runs the same pairing (so kernels test the path gfx950 takes).
#[inline(always)]
pub fn pairs_k<T: MmaInput>() -> bool {
    let wide = T::KIND != InputKind::I8;
    #[cfg(target_arch = "amdgpu")]
    {
        wide && cfg!(amdgpu_arch = "gfx950")
    }
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = wide;
        false
    }
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        wide && lowering() == Lowering::Mfma
    }
}

/// `a0 * b0 + a1 * b1 + c`: a tile product over two consecutive 16-deep slices (`a0`,
/// `b0` the first). One 16x16x32 instruction where [`pairs_k`] says so, two [`mma`]s
/// elsewhere (the CPU executor emulates the pair as the two products; only the order of
/// the f32 additions inside the instruction differs). A wave operation.
#[inline(always)]
#[track_caller]
pub fn mma_pair<T: MmaInput>(a0: &FragA<T>, b0: &FragB<T>, a1: &FragA<T>, b1: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    #[cfg(target_arch = "amdgpu")]
    {
        match DEVICE_LOWERING {
            Lowering::Mfma => amdgpu::mma_pair(a0, b0, a1, b1, c),
            _ => mma(a1, b1, mma(a0, b0, c)),
        }
    }
    #[cfg(not(target_arch = "amdgpu"))]
    {
        mma(a1, b1, mma(a0, b0, c))
    }
}

/// Reinterprets `x` as `U` (same size, checked at compile time by the caller's match on
/// `InputKind`).
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn cast<T: Copy, U: Copy>(x: T) -> U {
    debug_assert!(core::mem::size_of::<T>() == core::mem::size_of::<U>());
    // SAFETY: the caller guarantees that T and U are the same type or same-size plain data.
    unsafe { core::mem::transmute_copy(&x) }
}
