//! The argument layout a launcher packs, compared at build time with the code objects.

/// What a kernel-argument slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotKind {
    /// A pointer to global memory (AMDGPU `global_buffer`).
    GlobalBuffer,
    /// A value passed by value (AMDGPU `by_value`).
    ByValue,
}

/// One slot of the kernel-argument segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArgSlot {
    /// Parameter name (`x`, `x.len` for a slice length, `__shared_dyn_len`).
    pub name: &'static str,
    /// Byte offset in the argument segment.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Pointer or value.
    pub kind: SlotKind,
}

/// One GPU symbol of a kernel (a generic kernel has one per instance).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInstance {
    /// The kernel function's name.
    pub kernel: &'static str,
    /// The symbol in the code object / PTX.
    pub symbol: &'static str,
    /// Argument slots in order.
    pub abi: &'static [ArgSlot],
    /// Size of the argument segment in bytes.
    pub kernarg_size: u32,
    /// Largest work-group it may be launched with (`#[amdgpu_kernel(max_threads = N)]`,
    /// else 1024): the PTX entry's `.maxntid` and the AMDGPU code object's
    /// `amdgpu-flat-work-group-size`, which let `ptxas` and LLVM give each work-item the
    /// registers of a work-group of that size.
    pub max_threads: u32,
}

impl KernelInstance {
    /// Rejects a launch whose configuration no backend runs
    /// ([`LaunchConfig::validate`](super::LaunchConfig::validate)) or whose work-group is
    /// larger than [`KernelInstance::max_threads`], before anything runs.
    pub fn check_block(&self, config: &super::LaunchConfig) -> Result<(), super::LaunchError> {
        config.validate()?;
        let work_items = config.block.volume();
        if work_items > self.max_threads as u64 {
            return Err(super::LaunchError::BlockTooLarge { kernel: self.symbol, work_items, max: self.max_threads });
        }
        Ok(())
    }

    /// Packs `args` into the argument segment (little-endian), as a GPU launch needs it.
    pub fn pack(&self, args: &[super::ArgValue]) -> Vec<u8> {
        let mut out = vec![0u8; self.kernarg_size as usize];
        let mut slot = 0;
        for a in args {
            for (bytes, len) in a.slot_bytes() {
                let s = &self.abi[slot];
                debug_assert_eq!(s.size as usize, len, "slot {} of {}", s.name, self.symbol);
                out[s.offset as usize..s.offset as usize + len].copy_from_slice(&bytes[..len]);
                slot += 1;
            }
        }
        debug_assert_eq!(slot, self.abi.len(), "argument count of {}", self.symbol);
        out
    }
}

/// `GeluErf` -> `gelu_erf`, `f16` -> `f16`, `U8x4` -> `u8x4`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev_lower = i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_ascii_digit());
            if prev_lower {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}
