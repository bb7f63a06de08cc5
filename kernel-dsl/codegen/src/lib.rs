//! Code generation for `#[amdgpu_kernel]`, used by two callers that must agree exactly:
//!
//! * the proc macro (`kernel-dsl-macros`) expands a kernel for the **host**: the function
//!   stays, and a module of the same name gets the typed launcher, the argument layout
//!   ([`KernelAbi`]) and the CPU-executor entry;
//! * `build-support` expands whole kernel source files for the **device**: every kernel
//!   gets `extern "gpu-kernel"` entry points (one per generic instance) whose flattened
//!   parameters follow the same layout.
//!
//! Both call [`KernelDef::parse`], so validation errors (with the user's spans) and the
//! layout are computed once, the same way.
mod abi;
mod device;
mod host;
mod parse;
mod validate;

pub use abi::{AbiSlot, KernelAbi, SlotKind};
pub use device::{expand_device_file, DeviceExpansion};
pub use host::expand_host;
pub use parse::{Instance, KernelDef, Param, ParamKind, MAX_THREADS};

/// `GeluErf` -> `gelu_erf`, `f16` -> `f16`.
pub fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            if i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_ascii_digit()) {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}

/// The attribute names that mark kernels and device helpers.
pub fn is_kernel_attr(attr: &syn::Attribute) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == "amdgpu_kernel")
}

/// `#[device]` / `#[kernel_dsl::device]`.
pub fn is_device_attr(attr: &syn::Attribute) -> bool {
    let segs: Vec<_> = attr.path().segments.iter().map(|s| s.ident.to_string()).collect();
    segs == ["device"] || segs == ["kernel_dsl", "device"]
}

/// Checks a `#[device]` helper's body with the same rules as a kernel body.
pub fn validate_device_fn(f: &syn::ItemFn) -> syn::Result<()> {
    validate::body(&f.block)
}
