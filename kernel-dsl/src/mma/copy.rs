//! Global-to-shared copies of 16-byte chunks that run asynchronously where the target can
//! (`cp.async` on NVIDIA sm_80+): issue chunks with [`copy_16`], close a group with
//! [`commit`], wait with [`wait_groups`] (then a barrier before other work-items read).
//! Elsewhere (AMD, the CPU executor) the copy happens at once and the waits do nothing.
//!
//! [`SharedAddr`] names a shared-memory location the way these instructions (and
//! `ldmatrix`, see [`FragA::load_shared_at`](super::FragA::load_shared_at)) take it: on
//! NVIDIA a 32-bit shared-window address, converted from a pointer once, so per-copy
//! address math stays 32-bit; elsewhere a plain pointer.

/// A byte address in work-group shared memory: the shared-window offset (`u32`) on NVIDIA,
/// a pointer elsewhere. Build it once with [`SharedAddr::new`], then step it with
/// [`SharedAddr::add`] (a 32-bit add on NVIDIA).
#[derive(Clone, Copy)]
pub struct SharedAddr {
    #[cfg(target_arch = "nvptx64")]
    raw: u32,
    #[cfg(not(target_arch = "nvptx64"))]
    raw: *mut u8,
}

impl SharedAddr {
    /// The address of `p`, a pointer into work-group shared memory (not checked).
    #[inline(always)]
    pub fn new<T>(p: *const T) -> SharedAddr {
        #[cfg(target_arch = "nvptx64")]
        {
            let shared: u64;
            // SAFETY: a pure address conversion; no memory is touched.
            unsafe {
                core::arch::asm!("cvta.to.shared.u64 {0}, {1};", out(reg64) shared, in(reg64) p as u64, options(pure, nomem, nostack));
            }
            SharedAddr { raw: shared as u32 }
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            SharedAddr { raw: p as *mut u8 }
        }
    }
    /// The address `bytes` further on (wrapping; stays meaningful only inside the
    /// shared-memory block it started in).
    #[inline(always)]
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, bytes: usize) -> SharedAddr {
        #[cfg(target_arch = "nvptx64")]
        {
            SharedAddr { raw: self.raw.wrapping_add(bytes as u32) }
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            SharedAddr { raw: self.raw.wrapping_add(bytes) }
        }
    }
    /// The first address at or after this one that is a multiple of `align` (a power of
    /// two): on NVIDIA of the shared window, whose swizzled layouts key on those bits.
    #[inline(always)]
    pub fn align_up(self, align: usize) -> SharedAddr {
        #[cfg(target_arch = "nvptx64")]
        {
            let a = align as u32 - 1;
            SharedAddr { raw: self.raw.wrapping_add(a) & !a }
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            let a = align - 1;
            let up = ((self.raw as usize).wrapping_add(a) & !a) - self.raw as usize;
            SharedAddr { raw: self.raw.wrapping_add(up) }
        }
    }
    /// The same location as a generic pointer (for ordinary loads and stores).
    #[inline(always)]
    pub fn as_ptr<T>(self) -> *mut T {
        #[cfg(target_arch = "nvptx64")]
        {
            let generic: u64;
            // SAFETY: a pure address conversion; no memory is touched.
            unsafe {
                core::arch::asm!("cvta.shared.u64 {0}, {1};", out(reg64) generic, in(reg64) self.raw as u64, options(pure, nomem, nostack));
            }
            generic as *mut T
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.raw as *mut T
        }
    }
    /// The raw 32-bit shared-window address (NVIDIA).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub(crate) fn raw(self) -> u32 {
        self.raw
    }
}

/// Copies `valid` bytes (0..=16) from `src` to the shared-memory address `dst` and fills
/// the rest of the 16 bytes with zeros.
///
/// # Safety
/// `dst` is 16-byte aligned work-group shared memory with 16 bytes to write; when `valid`
/// is not 0, `src` is 16-byte aligned global memory with `valid` readable bytes.
#[inline(always)]
pub unsafe fn copy_16(dst: *mut u8, src: *const u8, valid: u32) {
    // SAFETY: the caller's contract.
    unsafe { copy_16_at(SharedAddr::new(dst), src, valid) }
}

/// [`copy_16`] to a [`SharedAddr`] (no address conversion per copy).
///
/// # Safety
/// As [`copy_16`], with `dst` in place of the destination pointer.
#[inline(always)]
pub unsafe fn copy_16_at(dst: SharedAddr, src: *const u8, valid: u32) {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    // SAFETY: the caller's contract; cp.async reads `valid` bytes and zero-fills the rest.
    unsafe {
        core::arch::asm!(
            "cp.async.cg.shared.global [{0}], [{1}], 16, {2};",
            in(reg32) dst.raw(),
            in(reg64) src as u64,
            in(reg32) valid,
            options(nostack),
        );
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_80")))]
    // SAFETY: the caller's contract.
    unsafe {
        let dst: *mut u8 = dst.as_ptr();
        if valid == 16 {
            core::ptr::write(dst as *mut [u8; 16], core::ptr::read(src as *const [u8; 16]));
        } else {
            // Byte by byte straight into shared memory: a local chunk written at a runtime
            // index went to scratch in AMD code objects.
            for i in 0..16 {
                *dst.add(i) = if (i as u32) < valid { *src.add(i) } else { 0 };
            }
        }
    }
}

/// [`copy_16_at`] of a whole chunk (`valid` = 16, no zero fill), past the first-level
/// cache (`cp.async.cg` on NVIDIA).
///
/// # Safety
/// As [`copy_16_at`] with 16 readable bytes at `src`.
#[inline(always)]
pub unsafe fn copy_16_whole_at(dst: SharedAddr, src: *const u8) {
    // SAFETY: the caller's contract.
    unsafe { copy_16_whole_via::<false>(dst, src) }
}

/// [`copy_16_whole_at`] through the first-level cache as well (`cp.async.ca` on NVIDIA):
/// for data many work-groups of a compute unit read (a norm's parameters), where
/// [`copy_16_whole_at`] reads from the second-level cache each time.
///
/// # Safety
/// As [`copy_16_whole_at`].
#[inline(always)]
pub unsafe fn copy_16_whole_cached_at(dst: SharedAddr, src: *const u8) {
    // SAFETY: the caller's contract.
    unsafe { copy_16_whole_via::<true>(dst, src) }
}

/// The whole-chunk copy, cached in the first level (`L1`) or not.
///
/// # Safety
/// As [`copy_16_whole_at`].
#[inline(always)]
unsafe fn copy_16_whole_via<const L1: bool>(dst: SharedAddr, src: *const u8) {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    // SAFETY: the caller's contract.
    unsafe {
        if L1 {
            core::arch::asm!("cp.async.ca.shared.global [{0}], [{1}], 16;", in(reg32) dst.raw(), in(reg64) src as u64, options(nostack));
        } else {
            core::arch::asm!("cp.async.cg.shared.global [{0}], [{1}], 16;", in(reg32) dst.raw(), in(reg64) src as u64, options(nostack));
        }
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_80")))]
    // SAFETY: the caller's contract.
    unsafe {
        copy_16_at(dst, src, 16)
    }
}

/// The 16 bytes at `src`, as four words: `ld.shared.v4.u32` on NVIDIA (a generic pointer
/// to shared memory gives a slower generic load there), a plain read elsewhere. For data a
/// work-item copied in with [`copy_16_at`] and waited for.
///
/// # Safety
/// `src` is 16-byte aligned work-group shared memory holding 16 initialised bytes.
#[inline(always)]
pub unsafe fn load_shared_u32x4(src: SharedAddr) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract.
    unsafe {
        asm_load_u32x4!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];", reg32, src.raw())
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller's contract.
    unsafe {
        core::ptr::read(src.as_ptr::<[u32; 4]>())
    }
}

/// Closes the group of copies issued since the last commit.
#[inline(always)]
pub fn commit() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    // SAFETY: no operands.
    unsafe {
        core::arch::asm!("cp.async.commit_group;", options(nostack))
    }
}

/// Waits until at most `pending` (0..=7; more counts as 7) committed groups of this
/// work-item are still in flight.
#[inline(always)]
pub fn wait_groups(pending: u32) {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    // SAFETY: no operands.
    unsafe {
        match pending {
            0 => core::arch::asm!("cp.async.wait_group 0;", options(nostack)),
            1 => core::arch::asm!("cp.async.wait_group 1;", options(nostack)),
            2 => core::arch::asm!("cp.async.wait_group 2;", options(nostack)),
            3 => core::arch::asm!("cp.async.wait_group 3;", options(nostack)),
            4 => core::arch::asm!("cp.async.wait_group 4;", options(nostack)),
            5 => core::arch::asm!("cp.async.wait_group 5;", options(nostack)),
            6 => core::arch::asm!("cp.async.wait_group 6;", options(nostack)),
            _ => core::arch::asm!("cp.async.wait_group 7;", options(nostack)),
        }
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_80")))]
    let _ = pending;
}

/// `true` when [`copy_16`] runs asynchronously on this target.
#[inline(always)]
pub const fn is_async() -> bool {
    cfg!(all(target_arch = "nvptx64", target_feature = "sm_80"))
}
