//! The kernel-argument layout: what the launcher packs and what the GPU entry declares.
use crate::parse::{last_ident, Instance, KernelDef, ParamKind};
use syn::{Error, Result, Type};

/// Pointer or value slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// Pointer to global memory.
    GlobalBuffer,
    /// By-value scalar.
    ByValue,
}

/// One slot of the argument segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbiSlot {
    /// `x`, `x.len`, `__shared_dyn_len`.
    pub name: String,
    /// Byte offset.
    pub offset: u32,
    /// Byte size.
    pub size: u32,
    /// Kind.
    pub kind: SlotKind,
}

/// The layout of one kernel instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelAbi {
    /// Kernel function name.
    pub kernel: String,
    /// GPU symbol.
    pub symbol: String,
    /// Slots in order.
    pub slots: Vec<AbiSlot>,
    /// End of the last slot (bytes).
    pub kernarg_size: u32,
    /// Largest work-group the kernel may be launched with (the PTX entry's `.maxntid`).
    pub max_threads: u32,
}

/// Size of a primitive scalar type, by its name.
pub fn scalar_size(ty: &Type) -> Option<u32> {
    let seg = last_ident(ty)?;
    if !seg.arguments.is_empty() {
        return None;
    }
    Some(match seg.ident.to_string().as_str() {
        "u8" | "i8" => 1,
        "u16" | "i16" | "f16" | "bf16" => 2,
        "u32" | "i32" | "f32" => 4,
        "u64" | "i64" | "f64" | "usize" | "isize" => 8,
        _ => return None,
    })
}

impl KernelDef {
    /// The argument layout of `inst`, with natural alignment of every slot.
    pub fn abi(&self, inst: &Instance) -> Result<KernelAbi> {
        let mut slots = Vec::new();
        let mut offset = 0u32;
        let mut push = |name: String, size: u32, kind: SlotKind| {
            offset = offset.div_ceil(size) * size;
            slots.push(AbiSlot { name, offset, size, kind });
            offset += size;
        };
        for p in &self.params {
            match &p.kind {
                ParamKind::Slice { .. } => {
                    push(p.name.to_string(), 8, SlotKind::GlobalBuffer);
                    push(format!("{}.len", p.name), 8, SlotKind::ByValue);
                }
                ParamKind::Scalar { ty } => {
                    let concrete = inst.subst(self, ty);
                    let size = scalar_size(&concrete).ok_or_else(|| {
                        Error::new_spanned(
                            ty,
                            "by-value kernel parameters must be primitives (u8, u16, u32, i32, u64, i64, usize, f16, bf16, f32, f64)",
                        )
                    })?;
                    push(p.name.to_string(), size, SlotKind::ByValue);
                }
                ParamKind::Shared { .. } | ParamKind::SharedDyn { .. } => {}
            }
        }
        if self.shared_dyn().is_some() {
            push("__shared_dyn_len".to_string(), 4, SlotKind::ByValue);
        }
        Ok(KernelAbi { kernel: self.name().to_string(), symbol: inst.symbol.clone(), slots, kernarg_size: offset, max_threads: self.max_threads })
    }
}
