//! Global-to-shared copies of 16-byte chunks that run asynchronously where the target can
//! (`cp.async` on NVIDIA sm_80+): issue chunks with [`copy_16`], close a group with
//! [`commit`], wait with [`wait_groups`] (then a barrier before other work-items read).
//! Elsewhere (AMD, the CPU executor) the copy happens at once and the waits do nothing.

/// Copies `valid` bytes (0..=16) from `src` to the shared-memory address `dst` and fills
/// the rest of the 16 bytes with zeros.
///
/// # Safety
/// `dst` is 16-byte aligned work-group shared memory with 16 bytes to write; when `valid`
/// is not 0, `src` is 16-byte aligned global memory with `valid` readable bytes.
#[inline(always)]
pub unsafe fn copy_16(dst: *mut u8, src: *const u8, valid: u32) {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_80"))]
    // SAFETY: the caller's contract; cp.async reads `valid` bytes and zero-fills the rest.
    unsafe {
        let shared: u64;
        core::arch::asm!("cvta.to.shared.u64 {0}, {1};", out(reg64) shared, in(reg64) dst as u64, options(pure, nomem, nostack));
        core::arch::asm!(
            "cp.async.cg.shared.global [{0}], [{1}], 16, {2};",
            in(reg32) shared as u32,
            in(reg64) src as u64,
            in(reg32) valid,
            options(nostack),
        );
    }
    #[cfg(not(all(target_arch = "nvptx64", target_feature = "sm_80")))]
    // SAFETY: the caller's contract.
    unsafe {
        let mut chunk = [0u8; 16];
        if valid == 16 {
            chunk = core::ptr::read(src as *const [u8; 16]);
        } else {
            for (i, b) in chunk.iter_mut().enumerate().take(valid as usize) {
                *b = *src.add(i);
            }
        }
        core::ptr::write(dst as *mut [u8; 16], chunk);
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

/// Waits until at most `pending` (0..=3; more counts as 3) committed groups of this
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
            _ => core::arch::asm!("cp.async.wait_group 3;", options(nostack)),
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
