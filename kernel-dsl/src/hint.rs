//! Hints to the compiler about register use.

/// Returns `v` unchanged, but hides the fact from the compiler (LLVM and, on NVIDIA, the
/// PTX assembler see an opaque value): a computation from the result is not merged with
/// the same computation from `v` earlier. A kernel that keeps 16-bit data packed and
/// unpacks it twice (once before a work-group reduction, once after) uses it so that the
/// unpacked copy, twice the registers, is not kept alive across the reduction.
/// An identity everywhere but NVIDIA (AMD code keeps such tiles at two chunks).
#[inline(always)]
pub fn opaque_u32(v: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let out: u32;
        // SAFETY: a register-to-register permute that returns its input (selector 0x3210:
        // bytes 3, 2, 1, 0 of the first operand); no memory, no side effects.
        unsafe {
            core::arch::asm!("prmt.b32 {0}, {1}, 0, 0x3210;", out(reg32) out, in(reg32) v, options(nomem, nostack));
        }
        out
    }
    #[cfg(not(target_arch = "nvptx64"))]
    v
}

/// Loads 16 aligned bytes that this work-group reads once (a row a kernel streams),
/// telling the caches to evict them first: on NVIDIA `ld.global.cs` (cache streaming), so
/// data read again and again (a norm's weights) stays in the first-level cache; a plain
/// load elsewhere.
///
/// # Safety
/// `p` is valid for a 16-byte read, 16-byte aligned, and in global memory.
#[inline(always)]
pub unsafe fn load_streaming_u32x4(p: *const [u32; 4]) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract (a global address: generic and global addresses of
    // device allocations agree, made explicit by `cvta.to.global`).
    unsafe {
        asm_load_u32x4!("{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.global.cs.v4.u32 {{{a}, {b}, {c}, {d}}}, [g]; }}", reg64, p as u64)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller's contract.
    unsafe {
        core::ptr::read(p)
    }
}
