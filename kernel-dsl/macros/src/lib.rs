//! `#[amdgpu_kernel]` and `#[device]`: host expansion of GPU kernels.
//!
//! The expansion itself lives in `kernel-dsl-codegen`, which `build-support` also uses for
//! the device build, so launcher and GPU entry point can never disagree. Use these through
//! `kernel_dsl` (`use kernel_dsl::prelude::*`).
use proc_macro::TokenStream;

/// Marks a GPU kernel. See `kernel_dsl::amdgpu_kernel` for the full description.
#[proc_macro_attribute]
pub fn amdgpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse::<syn::ItemFn>(item) {
        Ok(f) => f,
        Err(e) => {
            let mut e = e;
            e.combine(syn::Error::new(proc_macro2::Span::call_site(), "#[amdgpu_kernel] applies to functions"));
            return e.to_compile_error().into();
        }
    };
    kernel_dsl_codegen::KernelDef::parse(attr.into(), func)
        .and_then(|def| kernel_dsl_codegen::expand_host(&def))
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
}

/// Marks a device helper function: callable from kernels, inlined on the GPU.
#[proc_macro_attribute]
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(proc_macro2::Span::call_site(), "#[device] takes no arguments")
            .to_compile_error()
            .into();
    }
    let mut func = match syn::parse::<syn::ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    if let Err(e) = kernel_dsl_codegen::validate_device_fn(&func) {
        return e.to_compile_error().into();
    }
    func.attrs.push(syn::parse_quote!(#[inline]));
    quote::quote!(#func).into()
}
