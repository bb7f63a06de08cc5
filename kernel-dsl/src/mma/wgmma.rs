//! Warpgroup matrix multiply-accumulate on NVIDIA sm_90a (`wgmma.mma_async`): four waves
//! (a *warpgroup* of 128 work-items) multiply a 64 x 16 A tile by a 16 x n B tile (n = 256,
//! 160 or 128), both read by the tensor units straight from shared memory, into 64 x n f32
//! accumulators held n / 2 per work-item. The products run asynchronously: [`fence`] before the first
//! product of a batch, [`commit`] after the batch, [`wait`] until at most `N` batches are
//! still running before the accumulators or the shared tiles they read are touched.
//!
//! Shared tiles use the 128-byte swizzled layout the tensor units read ([`sw128_offset`]):
//! rows of 128 bytes in atoms of 8 rows (1024 bytes, 1024-byte aligned), 16-byte chunk `c`
//! of row `r` stored at chunk `c ^ (r % 8)`. A [`descriptor`] names a tile by its address
//! and two strides between atoms:
//! - K-major (rows along M or N, 64 K elements per row): `SBO` = 1024 (next 8 rows); the
//!   16-deep slice `s` of the row starts 32 bytes later per slice.
//! - MN-major (B stored K x N, rows along K of 64 N elements): `LBO` = bytes to the next 64
//!   columns, `SBO` = bytes to the next 8 K rows.
//!
//! The `mma_rs_*` forms take A from registers instead ([`acc_to_a`] turns accumulators
//! into that operand), as FlashAttention's `P V` does.
//!
//! Only the sm_90a PTX has the instructions, and the CPU executor in its `mma.sync` mode
//! emulates them ([`available`]); elsewhere the functions are never to be called (kernels
//! test [`available`] and launchers pick another kernel). The emulation reads the operands
//! from shared memory through the descriptors with the hardware's address arithmetic
//! (swizzle on the address bits), so a kernel whose tiles, descriptors or accumulator
//! indexing disagree with the hardware's layout computes wrong results on the CPU too. The
//! pure parts ([`descriptor_bits`], [`sw128_offset`], [`acc_coord`]) are unit-tested.
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
use super::InputKind;
use super::{MmaFloat, SharedAddr};

/// Whether this target has `wgmma` (NVIDIA sm_90a PTX). On the host see [`available`].
pub const AVAILABLE: bool = cfg!(all(target_arch = "nvptx64", target_feature = "sm_90a"));

/// Whether `wgmma` runs here: [`AVAILABLE`] on a GPU target; on the host, whether the CPU
/// executor emulates NVIDIA's matrix units (`MatrixUnit::MmaSync`).
#[inline(always)]
pub fn available() -> bool {
    #[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
    {
        AVAILABLE
    }
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        super::lowering() == super::Lowering::MmaSync
    }
}

/// Work-items of a warpgroup.
pub const WARPGROUP: usize = 128;

/// Accumulators per work-item of one `m64n256` product.
pub const ACC_N256: usize = 128;

/// Byte offset of 16-byte chunk `chunk` (0..8) of row `row` in a 128-byte-swizzled tile
/// whose rows are 128 bytes (the tile 1024-byte aligned).
#[inline(always)]
pub const fn sw128_offset(row: usize, chunk: usize) -> usize {
    row * 128 + ((chunk ^ (row % 8)) * 16)
}

/// The 64-bit shared-memory matrix descriptor of a 128-byte-swizzled tile at shared-window
/// byte address `addr` with leading / stride byte offsets `lbo`, `sbo` (multiples of 16):
/// bits 0-13 address / 16, 16-29 `lbo` / 16, 32-45 `sbo` / 16, 62-63 swizzle mode 1
/// (128 bytes).
#[inline(always)]
pub const fn descriptor_bits(addr: u32, lbo: u32, sbo: u32) -> u64 {
    ((addr as u64 >> 4) & 0x3fff) | (((lbo as u64 >> 4) & 0x3fff) << 16) | (((sbo as u64 >> 4) & 0x3fff) << 32) | (1u64 << 62)
}

/// [`descriptor_bits`] of a shared address. Kernels only add multiples of 16 bytes (in
/// units of 16) to the address field. On the host (CPU executor) the same arithmetic holds
/// but the fields are wider, to hold a full pointer: bits 0-43 address / 16, 44-53 `lbo` /
/// 16, 54-63 `sbo` / 16.
#[inline(always)]
pub fn descriptor(addr: SharedAddr, lbo: u32, sbo: u32) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        descriptor_bits(addr.raw(), lbo, sbo)
    }
    #[cfg(target_arch = "amdgpu")]
    {
        let _ = (addr, lbo, sbo);
        0
    }
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        let p = addr.as_ptr::<u8>() as u64;
        assert!(p.is_multiple_of(16) && p >> 48 == 0 && lbo >> 14 == 0 && sbo >> 14 == 0, "wgmma descriptor out of range");
        (p >> 4) | ((lbo as u64 >> 4) << 44) | ((sbo as u64 >> 4) << 54)
    }
}

/// The host emulation of one `m64nNk16` product for the calling work-item: its `N / 2`
/// accumulators ([`acc_coord`]) plus the 16-deep dot products of their rows of A and
/// columns of B, read through the descriptors as the tensor units address them.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
fn emulate<T: MmaFloat>(d: &mut [f32], da: u64, db: u64, b_mn_major: bool) {
    let field = |x: u64, at: u32, bits: u32| ((x >> at) & ((1u64 << bits) - 1)) << 4;
    let (a0, a_sbo) = (field(da, 0, 44), field(da, 54, 10));
    // The 128-byte swizzle: address bits 4-6 XOR bits 7-9.
    let swz = |x: u64| x ^ (((x >> 7) & 7) << 4);
    // SAFETY: the caller's contract (the descriptors name initialised shared tiles).
    let load = |x: u64| unsafe { *(swz(x) as *const T) }.to_f32();
    // K-major (A, and B stored N x K): element (row, k) of 8-row atoms `sbo` apart.
    let k_major = |base: u64, sbo: u64, row: usize, k: usize| base + (row / 8) as u64 * sbo + (row % 8) as u64 * 128 + (k * 2) as u64;
    let t = crate::index::flat_thread_idx() as usize % WARPGROUP;
    emulate_b::<T>(d, t, |r, k| load(k_major(a0, a_sbo, r, k)), db, b_mn_major);
}

/// Adds to work-item `t`'s accumulators `d` the 16-deep products of their rows of A
/// (`a(row, k)`) and columns of the B tile at descriptor `db`.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
fn emulate_b<T: MmaFloat>(d: &mut [f32], t: usize, a: impl Fn(usize, usize) -> f32, db: u64, b_mn_major: bool) {
    let field = |x: u64, at: u32, bits: u32| ((x >> at) & ((1u64 << bits) - 1)) << 4;
    let (b0, b_lbo, b_sbo) = (field(db, 0, 44), field(db, 44, 10), field(db, 54, 10));
    let swz = |x: u64| x ^ (((x >> 7) & 7) << 4);
    // SAFETY: the caller's contract (the descriptor names an initialised shared tile).
    let load = |x: u64| unsafe { *(swz(x) as *const T) }.to_f32();
    let k_major = |base: u64, sbo: u64, row: usize, k: usize| base + (row / 8) as u64 * sbo + (row % 8) as u64 * 128 + (k * 2) as u64;
    for (i, acc) in d.iter_mut().enumerate() {
        let (r, c) = acc_coord(t, i);
        let mut sum = *acc;
        for k in 0..16 {
            let b = if b_mn_major {
                // MN-major (B stored K x N): 64-column groups `lbo` apart, 8-row (k) atoms
                // `sbo` apart, rows of 128 bytes.
                load(b0 + (c / 64) as u64 * b_lbo + (k / 8) as u64 * b_sbo + (k % 8) as u64 * 128 + ((c % 64) * 2) as u64)
            } else {
                load(k_major(b0, b_sbo, c, k))
            };
            sum += a(r, k) * b;
        }
        *acc = sum;
    }
}

/// The host emulation of one `m64nNk16` product whose A operand comes from registers
/// ([`mma_rs_m64n128k16`]): the wave's lanes exchange their four registers (the wave's 16
/// rows of A, in [`a_reg_coord`]'s layout), then each work-item adds the products of its
/// accumulators' rows of A and columns of B (read through the descriptor as in
/// [`emulate`]).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
fn emulate_rs<T: MmaFloat>(d: &mut [f32], a: &[u32; 4], db: u64, b_mn_major: bool) {
    use cpu_executor::item;
    assert_eq!(item::wave_size(), 32, "wgmma runs on waves of 32");
    let all = item::wave_exchange(a as *const [u32; 4] as u64);
    assert_eq!(all.active, u32::MAX as u64, "wgmma needs every lane of the warpgroup");
    let mut at = [[0f32; 16]; 16];
    for (l, &ptr) in all.values.iter().take(32).enumerate() {
        // SAFETY: every lane of the wave is suspended in this function until the second
        // exchange below, so its registers are alive.
        let regs = unsafe { *(ptr as *const [u32; 4]) };
        for j in 0..8 {
            let (r, k) = a_reg_coord(l, j);
            at[r][k] = T::from_bits16((regs[j / 2] >> (16 * (j % 2))) as u16).to_f32();
        }
    }
    item::wave_exchange(0);
    let t = crate::index::flat_thread_idx() as usize % WARPGROUP;
    emulate_b::<T>(d, t, |r, k| at[r % 16][k], db, b_mn_major);
}

/// `(row, k)` within its wave's 16 rows of item `j` (0..8) of lane `l`'s register A
/// operand (two 16-bit items per register, the lower first): the `mma.sync.m16n8k16` A
/// layout, which is also [`acc_coord`]'s for 16 columns, so accumulators `8 c .. 8 c + 8`
/// of a product are the A operand over its columns `16 c ..` ([`acc_to_a`]).
#[inline(always)]
pub const fn a_reg_coord(l: usize, j: usize) -> (usize, usize) {
    (l / 4 + 8 * ((j / 2) % 2), 2 * (l % 4) + j % 2 + 8 * (j / 4))
}

/// Accumulators `8 c .. 8 c + 8` (columns `16 c ..` of the product) rounded to `T` and
/// packed as the register A operand of a next product over those columns
/// ([`a_reg_coord`]): FlashAttention's `P` for `P V` without a trip through shared memory.
#[inline(always)]
pub fn acc_to_a<T: MmaFloat, const A: usize>(acc: &[f32; A], c: usize) -> [u32; 4] {
    let mut out = [0u32; 4];
    each!(j in [0, 1, 2, 3] {
        let [x, y] = T::from_f32x2([acc[(8 * c + 2 * j) % A], acc[(8 * c + 2 * j + 1) % A]]);
        out[j] = x.bits() as u32 | (y.bits() as u32) << 16;
    });
    out
}

/// `(row, col)` in the 64 x N accumulator tile of accumulator `i` of work-item `t` (0..128)
/// of the warpgroup: wave `t / 32` holds rows `16 (t / 32) ..`, and within it the layout
/// of `mma.sync`'s m16n8 accumulators repeated along N every 8 columns.
#[inline(always)]
pub const fn acc_coord(t: usize, i: usize) -> (usize, usize) {
    let (w, l) = (t / 32, t % 32);
    (w * 16 + l / 4 + 8 * ((i / 2) % 2), (i / 4) * 8 + (l % 4) * 2 + i % 2)
}

/// Stores the accumulators of work-item `t` (0..128) of warpgroup `w` of a work-group, of
/// that warpgroup's 64 x `cols` product (the first `cols / 2` of `acc`, in [`acc_coord`]'s
/// layout) as f32 pairs into a row-major tile holding the work-group's warpgroups one
/// under another: row `r` of warpgroup `w`'s product at `tile + (64 w + r) * ldt`.
/// Kernels stage their accumulators this way for an epilogue that writes whole rows.
///
/// # Safety
/// The warpgroup's 64 rows, columns `0 .. cols`, of the tile (`ldt` words apart) are
/// writable shared memory, `tile` 8-byte aligned and `ldt` even; `cols` a multiple of 8 and
/// at most `2 * A`.
#[inline(always)]
pub unsafe fn stage_accumulators<const A: usize>(acc: &[f32; A], cols: usize, tile: *mut f32, ldt: usize, (w, t): (usize, usize)) {
    each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
        each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
            let i = (p * 8 + q) * 2;
            if i < A && i / 4 * 8 < cols {
                let (r, c) = acc_coord(t, i);
                // SAFETY: (64 w + r, c..c + 2) lies in the tile (the caller's contract:
                // r < 64, c < cols), 8-byte aligned (c and ldt even).
                unsafe { *(tile.add((w * 64 + r) * ldt + c) as *mut [f32; 2]) = [acc[i], acc[i + 1]] };
            }
        });
    });
}

/// Orders this work-item's earlier register and shared-memory accesses before the
/// warpgroup's next products (`wgmma.fence`). Warpgroup-wide.
#[inline(always)]
pub fn fence() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    // SAFETY: no operands.
    unsafe {
        core::arch::asm!("wgmma.fence.sync.aligned;", options(nostack))
    }
}

/// Closes the batch of products issued since the last commit (`wgmma.commit_group`).
#[inline(always)]
pub fn commit() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    // SAFETY: no operands.
    unsafe {
        core::arch::asm!("wgmma.commit_group.sync.aligned;", options(nostack))
    }
}

/// Waits until at most `N` (0 or 1) committed batches are still running.
#[inline(always)]
pub fn wait<const N: u32>() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    // SAFETY: no operands.
    unsafe {
        if N == 0 {
            core::arch::asm!("wgmma.wait_group.sync.aligned 0;", options(nostack))
        } else {
            core::arch::asm!("wgmma.wait_group.sync.aligned 1;", options(nostack))
        }
    }
}

/// Makes this work-item's earlier shared-memory writes (stores, completed `cp.async`)
/// visible to the tensor units' reads (`fence.proxy.async.shared::cta`); a barrier after
/// it publishes them to the other work-items' products.
#[inline(always)]
pub fn fence_proxy_async() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    // SAFETY: no operands.
    unsafe {
        core::arch::asm!("fence.proxy.async.shared::cta;", options(nostack))
    }
}

/// One `wgmma.mma_async.<shape>` with f32 accumulators `d` (this work-item's, one per
/// index of the list), A and B from shared memory by descriptor, B K-major (`$trans_b`
/// "0") or MN-major ("1"). The register list `{0}, {1}, ..` is built from the indices.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
macro_rules! wgmma_f32 {
    ($shape:literal, $ty:literal, $trans_b:literal, $d:expr, $da:expr, $db:expr, [$first:literal $(, $i:literal)*]) => {{
        let d = $d;
        core::arch::asm!(
            concat!(
                "{{ .reg .pred p; setp.ne.b32 p, {scale}, 0; wgmma.mma_async.sync.aligned.", $shape, ".f32.", $ty, ".", $ty,
                " {{{", $first, "}" $(, ", {", $i, "}")*, "}}, {da}, {db}, p, 1, 1, 0, ", $trans_b, "; }}"
            ),
            inout(reg32) d[$first],
            $(inout(reg32) d[$i],)*
            da = in(reg64) $da,
            db = in(reg64) $db,
            scale = in(reg32) 1u32,
            options(nostack),
        )
    }};
}

/// [`wgmma_f32!`] that starts from zero (`scale-d` false): the accumulators are outputs
/// only, so no instruction but the product defines them (moves that zero them inside a
/// pipeline stage make ptxas serialise the warpgroup's products).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
macro_rules! wgmma_f32_zero {
    ($shape:literal, $ty:literal, $trans_b:literal, $d:expr, $da:expr, $db:expr, [$first:literal $(, $i:literal)*]) => {{
        let d = $d;
        core::arch::asm!(
            concat!(
                "wgmma.mma_async.sync.aligned.", $shape, ".f32.", $ty, ".", $ty,
                " {{{", $first, "}" $(, ", {", $i, "}")*, "}}, {da}, {db}, 0, 1, 1, 0, ", $trans_b, ";"
            ),
            out(reg32) d[$first],
            $(out(reg32) d[$i],)*
            da = in(reg64) $da,
            db = in(reg64) $db,
            options(nostack),
        )
    }};
}

/// [`wgmma_f32!`] with A from this work-item's four registers `$a` ([`a_reg_coord`]).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
macro_rules! wgmma_rs_f32 {
    ($shape:literal, $ty:literal, $trans_b:literal, $d:expr, $a:expr, $db:expr, [$first:literal $(, $i:literal)*]) => {{
        let d = $d;
        let a: &[u32; 4] = $a;
        core::arch::asm!(
            concat!(
                "{{ .reg .pred p; setp.ne.b32 p, {scale}, 0; wgmma.mma_async.sync.aligned.", $shape, ".f32.", $ty, ".", $ty,
                " {{{", $first, "}" $(, ", {", $i, "}")*, "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, p, 1, 1, ", $trans_b, "; }}"
            ),
            inout(reg32) d[$first],
            $(inout(reg32) d[$i],)*
            a0 = in(reg32) a[0],
            a1 = in(reg32) a[1],
            a2 = in(reg32) a[2],
            a3 = in(reg32) a[3],
            db = in(reg64) $db,
            scale = in(reg32) 1u32,
            options(nostack),
        )
    }};
}

/// A public `d += A B` product of one shape with A from registers: as [`wgmma_product!`].
macro_rules! wgmma_rs_product {
    ($(#[$doc:meta])* $name:ident, $acc:ident, $shape:literal, [$($i:literal),*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name<T: MmaFloat, const B_MN_MAJOR: bool>(d: &mut [f32; $acc], a: &[u32; 4], db: u64) {
            #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
            // SAFETY: the caller's contract.
            unsafe {
                match (T::KIND, B_MN_MAJOR) {
                    (InputKind::Bf16, false) => wgmma_rs_f32!($shape, "bf16", "0", d, a, db, [$($i),*]),
                    (InputKind::Bf16, true) => wgmma_rs_f32!($shape, "bf16", "1", d, a, db, [$($i),*]),
                    (_, false) => wgmma_rs_f32!($shape, "f16", "0", d, a, db, [$($i),*]),
                    (_, true) => wgmma_rs_f32!($shape, "f16", "1", d, a, db, [$($i),*]),
                }
            }
            #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
            {
                assert!(available(), "wgmma runs on NVIDIA sm_90a or the CPU executor's mma.sync mode only");
                emulate_rs::<T>(d, a, db, B_MN_MAJOR);
            }
            #[cfg(any(target_arch = "amdgpu", all(target_arch = "nvptx64", not(target_feature = "sm_90a"))))]
            {
                let _ = (d, a, db, T::KIND == InputKind::I8);
                panic!("wgmma runs on NVIDIA sm_90a only");
            }
        }
    };
}

/// A public `d += A B` product of one shape: the PTX instruction on sm_90a (f16 or bf16, B
/// K-major or MN-major), the emulation on the host, a panic elsewhere.
macro_rules! wgmma_product {
    ($(#[$doc:meta])* $name:ident, $acc:ident, $shape:literal, [$($i:literal),*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name<T: MmaFloat, const B_MN_MAJOR: bool>(d: &mut [f32; $acc], da: u64, db: u64) {
            #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
            // SAFETY: the caller's contract.
            unsafe {
                match (T::KIND, B_MN_MAJOR) {
                    (InputKind::Bf16, false) => wgmma_f32!($shape, "bf16", "0", d, da, db, [$($i),*]),
                    (InputKind::Bf16, true) => wgmma_f32!($shape, "bf16", "1", d, da, db, [$($i),*]),
                    (_, false) => wgmma_f32!($shape, "f16", "0", d, da, db, [$($i),*]),
                    (_, true) => wgmma_f32!($shape, "f16", "1", d, da, db, [$($i),*]),
                }
            }
            #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
            {
                assert!(available(), "wgmma runs on NVIDIA sm_90a or the CPU executor's mma.sync mode only");
                emulate::<T>(d, da, db, B_MN_MAJOR);
            }
            #[cfg(any(target_arch = "amdgpu", all(target_arch = "nvptx64", not(target_feature = "sm_90a"))))]
            {
                let _ = (d, da, db, T::KIND == InputKind::I8);
                panic!("wgmma runs on NVIDIA sm_90a only");
            }
        }
    };
}

wgmma_product!(
    /// `d += A B` for the warpgroup: A 64 x 16 K-major at descriptor `da`, B 16 x 256 at `db`,
    /// K-major (stored N x K) or, with `B_MN_MAJOR`, MN-major (stored K x N). Asynchronous:
    /// see the module documentation.
    ///
    /// # Safety
    /// sm_90a only ([`AVAILABLE`]); all 128 work-items of the warpgroup call it together with
    /// the same descriptors, which name valid, initialised, swizzled shared tiles that nothing
    /// writes until a [`wait`] says the product is done.
    mma_m64n256k16, ACC_N256, "m64n256k16", [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
        32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
        64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
        96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127
    ]
);

/// Accumulators per work-item of one `m64n128` product.
pub const ACC_N128: usize = 64;

wgmma_product!(
    /// [`mma_m64n256k16`] for a 16 x 128 B tile (64 accumulators per work-item, the first 128
    /// columns of [`acc_coord`]'s layout).
    ///
    /// # Safety
    /// As [`mma_m64n256k16`].
    mma_m64n128k16, ACC_N128, "m64n128k16", [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
        32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
    ]
);

/// `d = A B` for the warpgroup (A 64 x 16 K-major at `da`, B 16 x 128 at `db` as in
/// [`mma_m64n128k16`]): the first product of a chain, whose accumulators start from zero
/// inside the instruction rather than from registers the kernel zeroes.
///
/// # Safety
/// As [`mma_m64n256k16`].
#[inline(always)]
pub unsafe fn mma_m64n128k16_zero<T: MmaFloat, const B_MN_MAJOR: bool>(da: u64, db: u64) -> [f32; ACC_N128] {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    // SAFETY: the caller's contract; every accumulator is an output of the instruction.
    unsafe {
        let mut d = [0f32; ACC_N128];
        let dr = &mut d;
        // The instruction for an input type and B layout, its 64 outputs listed once.
        macro_rules! zero_start {
            ($ty:literal, $trans_b:literal) => {
                wgmma_f32_zero!("m64n128k16", $ty, $trans_b, dr, da, db, [
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
                ])
            };
        }
        match (T::KIND, B_MN_MAJOR) {
            (InputKind::Bf16, false) => zero_start!("bf16", "0"),
            (InputKind::Bf16, true) => zero_start!("bf16", "1"),
            (_, false) => zero_start!("f16", "0"),
            (_, true) => zero_start!("f16", "1"),
        }
        d
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_90a")))]
    {
        let mut d = [0f32; ACC_N128];
        // SAFETY: the caller's contract.
        unsafe { mma_m64n128k16::<T, B_MN_MAJOR>(&mut d, da, db) };
        d
    }
}

/// Accumulators per work-item of one `m64n160` product.
pub const ACC_N160: usize = 80;

wgmma_product!(
    /// [`mma_m64n256k16`] for a 16 x 160 B tile (80 accumulators per work-item, the first 160
    /// columns of [`acc_coord`]'s layout): tiles of 160 columns divide SD's 320-, 640- and
    /// 1280-channel layers exactly.
    ///
    /// # Safety
    /// As [`mma_m64n256k16`].
    mma_m64n160k16, ACC_N160, "m64n160k16", [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
        64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79
    ]
);

wgmma_rs_product!(
    /// [`mma_m64n128k16`] with A from registers: each work-item passes its four registers
    /// of the warpgroup's 64 x 16 A ([`a_reg_coord`]; wave `w` holds rows `16 w ..`, as for
    /// its accumulators).
    ///
    /// # Safety
    /// As [`mma_m64n256k16`] for B; a [`fence`] orders the registers' writes before it.
    mma_rs_m64n128k16, ACC_N128, "m64n128k16", [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
        32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
    ]
);

/// Accumulators per work-item of one `m64n64` product.
pub const ACC_N64: usize = 32;

wgmma_rs_product!(
    /// [`mma_rs_m64n128k16`] for a 16 x 64 B tile (32 accumulators per work-item).
    ///
    /// # Safety
    /// As [`mma_rs_m64n128k16`].
    mma_rs_m64n64k16, ACC_N64, "m64n64k16", [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31
    ]
);

#[cfg(all(test, not(any(target_arch = "amdgpu", target_arch = "nvptx64"))))]
mod tests {
    use super::*;

    #[test]
    fn descriptor_fields_sit_where_the_ptx_isa_puts_them() {
        let d = descriptor_bits(0x1_2340, 8192, 1024);
        assert_eq!(d & 0x3fff, 0x1234);
        assert_eq!((d >> 16) & 0x3fff, 8192 >> 4);
        assert_eq!((d >> 32) & 0x3fff, 1024 >> 4);
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        assert_eq!((d >> 46) & 0xffff, 0, "base offset and reserved bits stay zero");
    }

    #[test]
    fn swizzled_rows_permute_their_chunks_within_the_row() {
        for r in 0..16 {
            let mut seen: Vec<usize> = (0..8).map(|c| sw128_offset(r, c)).collect();
            seen.sort();
            assert_eq!(seen, (0..8).map(|c| r * 128 + c * 16).collect::<Vec<_>>());
        }
        assert_eq!(sw128_offset(3, 1), 3 * 128 + 2 * 16);
    }

    #[test]
    fn accumulator_coordinates_cover_the_tile_once() {
        let mut hit = vec![0u8; 64 * 256];
        for t in 0..WARPGROUP {
            for i in 0..ACC_N256 {
                let (r, c) = acc_coord(t, i);
                hit[r * 256 + c] += 1;
            }
        }
        assert!(hit.iter().all(|&h| h == 1));
        // Work-item 5 of wave 1: row 16 + 1, columns 2, 3 then 10, 11, ..; rows + 8 at i = 2.
        assert_eq!(acc_coord(37, 0), (17, 2));
        assert_eq!(acc_coord(37, 3), (25, 3));
        assert_eq!(acc_coord(37, 4), (17, 10));
    }

    #[test]
    fn register_a_items_are_the_accumulators_of_sixteen_columns() {
        // Accumulator 8 c + j of work-item t sits at A item j of its lane, columns 16 c ..
        for t in 0..WARPGROUP {
            for c in 0..4 {
                for j in 0..8 {
                    let (r, col) = acc_coord(t, 8 * c + j);
                    let (ra, k) = a_reg_coord(t % 32, j);
                    assert_eq!((r % 16, col), (ra, 16 * c + k));
                }
            }
        }
        let mut hit = [[0u8; 16]; 16];
        for l in 0..32 {
            for j in 0..8 {
                let (r, k) = a_reg_coord(l, j);
                hit[r][k] += 1;
            }
        }
        assert!(hit.iter().flatten().all(|&h| h == 1));
    }
}
