//! Device expansion: `extern "gpu-kernel"` entry points for every kernel instance.
use crate::abi::KernelAbi;
use crate::parse::{Instance, KernelDef, ParamKind};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Item, Result};

/// A kernel source file rewritten for a GPU target.
pub struct DeviceExpansion {
    /// The file's items with kernels expanded and DSL attributes removed.
    pub tokens: TokenStream,
    /// Layout of every GPU symbol the file defines.
    pub abis: Vec<KernelAbi>,
}

/// Shared-memory setup for a work-item: binds every `Shared`/`SharedDyn` parameter to its
/// place in the launch-sized shared memory. `ty` maps a parameter type to the one to use.
pub(crate) fn shared_bindings(def: &KernelDef, ty: impl Fn(&syn::Type) -> syn::Type, dyn_len: TokenStream) -> TokenStream {
    let mut out = TokenStream::new();
    if !def.params.iter().any(|p| matches!(p.kind, ParamKind::Shared { .. } | ParamKind::SharedDyn { .. })) {
        return out;
    }
    out.extend(quote! {
        let __base: *mut u8 = ::kernel_dsl::__private::shared_base();
        let mut __off: usize = 0;
    });
    for p in &def.params {
        let name = &p.name;
        match &p.kind {
            ParamKind::Shared { elem, len } => {
                let elem = ty(elem);
                out.extend(quote! {
                    __off = ::kernel_dsl::__private::align_up(__off, ::core::mem::align_of::<#elem>());
                    #[allow(unused_mut)]
                    let mut #name = unsafe { ::kernel_dsl::Shared::<#elem, { #len }>::from_raw(__base.add(__off) as *mut #elem) };
                    __off += ::core::mem::size_of::<[#elem; #len]>();
                });
            }
            ParamKind::SharedDyn { elem } => {
                let elem = ty(elem);
                out.extend(quote! {
                    __off = ::kernel_dsl::__private::align_up(__off, ::core::mem::align_of::<#elem>());
                    #[allow(unused_mut)]
                    let mut #name = unsafe { ::kernel_dsl::SharedDyn::<#elem>::from_raw(__base.add(__off) as *mut #elem, (#dyn_len) as usize) };
                    __off += ::core::mem::size_of::<#elem>() * ((#dyn_len) as usize);
                });
            }
            _ => {}
        }
    }
    out.extend(quote! { let _ = __off; });
    out
}

/// Turbofish with the instance's types (empty for a non-generic kernel).
pub(crate) fn turbofish(types: &[syn::Type]) -> TokenStream {
    if types.is_empty() {
        TokenStream::new()
    } else {
        quote! { ::<#(#types),*> }
    }
}

fn entry(def: &KernelDef, inst: &Instance) -> TokenStream {
    let symbol = format_ident!("{}", inst.symbol);
    let kernel = def.name();
    let mut params = Vec::new();
    let mut binds = Vec::new();
    let mut call = Vec::new();
    for p in &def.params {
        let name = &p.name;
        match &p.kind {
            ParamKind::Slice { elem, mutable } => {
                let elem = inst.subst(def, elem);
                let ptr = format_ident!("__{}_ptr", name);
                let len = format_ident!("__{}_len", name);
                // Pointers cross the ABI untyped (`*mut u8`): element types such as atomics
                // or half floats are not valid gpu-kernel parameter types themselves.
                params.push(quote! { #ptr: *mut u8, #len: usize });
                if *mutable {
                    binds.push(quote! {
                        let #name: &mut [#elem] = if #len == 0 { &mut [] } else { unsafe { ::core::slice::from_raw_parts_mut(#ptr as *mut #elem, #len) } };
                    });
                } else {
                    binds.push(quote! {
                        let #name: &[#elem] = if #len == 0 { &[] } else { unsafe { ::core::slice::from_raw_parts(#ptr as *const #elem, #len) } };
                    });
                }
            }
            ParamKind::Scalar { ty } => {
                let ty = inst.subst(def, ty);
                let half = crate::parse::last_ident(&ty).is_some_and(|s| s.ident == "f16" || s.ident == "bf16");
                if half {
                    // Half types cross the gpu-kernel ABI as their bits.
                    params.push(quote! { #name: u16 });
                    binds.push(quote! { let #name = <#ty>::from_bits(#name); });
                } else {
                    params.push(quote! { #name: #ty });
                }
            }
            _ => {}
        }
        call.push(quote! { #name });
    }
    if def.shared_dyn().is_some() {
        params.push(quote! { __shared_dyn_len: u32 });
    }
    let shared = shared_bindings(def, |t| inst.subst(def, t), quote! { __shared_dyn_len });
    let tf = turbofish(&inst.types);
    quote! {
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub unsafe extern "gpu-kernel" fn #symbol(#(#params),*) {
            #(#binds)*
            #shared
            super::#kernel #tf (#(#call),*)
        }
    }
}

/// Device expansion of one kernel.
pub fn expand_device(def: &KernelDef) -> TokenStream {
    let mut func = def.func.clone();
    // Each instance's entry is the body's only caller: always inline it (a body over
    // LLVM's size threshold, such as a row kernel with an aligned and a general path,
    // otherwise became a call with its arguments through parameter space).
    func.attrs.push(syn::parse_quote!(#[inline(always)]));
    let entries: Vec<_> = def.instances.iter().map(|i| entry(def, i)).collect();
    let module = format_ident!("__gpu_entry_{}", def.name());
    quote! {
        #func
        #[doc(hidden)]
        #[allow(unused_imports)]
        mod #module {
            use super::*;
            #(#entries)*
        }
    }
}

fn expand_items(items: &mut Vec<Item>, abis: &mut Vec<KernelAbi>) -> Result<Vec<TokenStream>> {
    let mut out = Vec::new();
    for item in items.drain(..) {
        match item {
            Item::Fn(mut f) => {
                if let Some(pos) = f.attrs.iter().position(crate::is_kernel_attr) {
                    let attr = f.attrs.remove(pos);
                    let args = match attr.meta {
                        syn::Meta::List(l) => l.tokens,
                        _ => TokenStream::new(),
                    };
                    let def = KernelDef::parse(args, f)?;
                    for inst in &def.instances {
                        abis.push(def.abi(inst)?);
                    }
                    out.push(expand_device(&def));
                } else {
                    if let Some(pos) = f.attrs.iter().position(crate::is_device_attr) {
                        f.attrs.remove(pos);
                        f.attrs.push(syn::parse_quote!(#[inline]));
                    }
                    out.push(quote! { #f });
                }
            }
            Item::Mod(mut m) => {
                if let Some((brace, mut inner)) = m.content.take() {
                    let expanded = expand_items(&mut inner, abis)?;
                    let attrs = &m.attrs;
                    let vis = &m.vis;
                    let ident = &m.ident;
                    let _ = brace;
                    out.push(quote! { #(#attrs)* #vis mod #ident { #(#expanded)* } });
                } else {
                    out.push(quote! { #m });
                }
            }
            other => out.push(quote! { #other }),
        }
    }
    Ok(out)
}

/// Rewrites a kernel source file for a GPU build: kernels get their entry points,
/// `#[device]` helpers become `#[inline]` functions, everything else is kept.
pub fn expand_device_file(mut file: syn::File) -> Result<DeviceExpansion> {
    let mut abis = Vec::new();
    let items = expand_items(&mut file.items, &mut abis)?;
    let attrs = file.attrs.iter().filter(|a| matches!(a.style, syn::AttrStyle::Inner(_)));
    Ok(DeviceExpansion { tokens: quote! { #(#attrs)* #(#items)* }, abis })
}
