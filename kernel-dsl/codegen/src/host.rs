//! Host expansion: the kernel function, plus a module with its launcher and layout.
use crate::abi::SlotKind;
use crate::device::{shared_bindings, turbofish};
use crate::parse::{KernelDef, ParamKind};
use proc_macro2::TokenStream;
use quote::quote;

/// Host expansion of one kernel (see the crate docs).
pub fn expand_host(def: &KernelDef) -> syn::Result<TokenStream> {
    let func = &def.func;
    let name = def.name();
    let name_str = name.to_string();
    let vis = &func.vis;

    // Layout table, one entry per instance.
    let mut instances = Vec::new();
    for inst in &def.instances {
        let abi = def.abi(inst)?;
        let symbol = &abi.symbol;
        let size = abi.kernarg_size;
        let max_threads = abi.max_threads;
        let slots = abi.slots.iter().map(|s| {
            let (n, o, z) = (&s.name, s.offset, s.size);
            let kind = match s.kind {
                SlotKind::GlobalBuffer => quote!(GlobalBuffer),
                SlotKind::ByValue => quote!(ByValue),
            };
            quote! { ::kernel_dsl::host::ArgSlot { name: #n, offset: #o, size: #z, kind: ::kernel_dsl::host::SlotKind::#kind } }
        });
        instances.push(quote! {
            ::kernel_dsl::host::KernelInstance { kernel: #name_str, symbol: #symbol, abi: &[#(#slots),*], kernarg_size: #size, max_threads: #max_threads }
        });
    }

    // Launcher parameters, packed arguments and CPU-entry bindings.
    let mut l_params = Vec::new();
    let mut packs = Vec::new();
    let mut binds = Vec::new();
    let mut call = Vec::new();
    let mut idx = 0usize;
    for p in &def.params {
        let pname = &p.name;
        match &p.kind {
            ParamKind::Slice { elem, mutable } => {
                if *mutable {
                    l_params.push(quote! { #pname: &mut (impl ::kernel_dsl::host::KernelArgSliceMut<#elem> + ?Sized) });
                    binds.push(quote! { let #pname: &mut [#elem] = unsafe { __args[#idx].host_slice_mut::<#elem>() }; });
                } else {
                    l_params.push(quote! { #pname: &(impl ::kernel_dsl::host::KernelArgSlice<#elem> + ?Sized) });
                    binds.push(quote! { let #pname: &[#elem] = unsafe { __args[#idx].host_slice::<#elem>() }; });
                }
                packs.push(quote! { ::kernel_dsl::host::KernelArgSlice::<#elem>::kernel_arg(#pname) });
                idx += 1;
            }
            ParamKind::Scalar { ty } => {
                l_params.push(quote! { #pname: #ty });
                packs.push(quote! { ::kernel_dsl::host::ScalarArg::to_arg(#pname) });
                binds.push(quote! { let #pname: #ty = __args[#idx].scalar::<#ty>(); });
                idx += 1;
            }
            _ => {}
        }
        call.push(quote! { #pname });
    }
    let dyn_len = if def.shared_dyn().is_some() {
        packs.push(quote! { ::kernel_dsl::host::ScalarArg::to_arg(__dyn_len) });
        let i = idx;
        quote! { __args[#i].scalar::<u32>() }
    } else {
        quote! { 0u32 }
    };
    let shared = shared_bindings(def, |t| t.clone(), dyn_len);
    // Shared bytes: the same offsets, evaluated on the host without binding anything.
    let mut shared_size = quote! { let mut __off: usize = 0; };
    for p in &def.params {
        match &p.kind {
            ParamKind::Shared { elem, len } => shared_size.extend(quote! {
                __off = ::kernel_dsl::__private::align_up(__off, ::core::mem::align_of::<#elem>()) + ::core::mem::size_of::<[#elem; #len]>();
            }),
            ParamKind::SharedDyn { elem } => shared_size.extend(quote! {
                __off = ::kernel_dsl::__private::align_up(__off, ::core::mem::align_of::<#elem>()) + ::core::mem::size_of::<#elem>() * __config.dynamic_shared_elems;
            }),
            _ => {}
        }
    }

    let type_params = &def.type_params;
    let tf = turbofish(&type_params.iter().map(|t| syn::parse_quote!(#t)).collect::<Vec<syn::Type>>());
    let generics = &func.sig.generics;
    let mut l_generics = Vec::new();
    for g in &generics.params {
        if let syn::GenericParam::Type(t) = g {
            let id = &t.ident;
            let bounds = &t.bounds;
            if bounds.is_empty() {
                l_generics.push(quote! { #id: 'static });
            } else {
                l_generics.push(quote! { #id: #bounds + 'static });
            }
        }
    }
    // Scalars of generic type must be packable: `T: ScalarArg` for each scalar parameter.
    let mut predicates: Vec<TokenStream> = generics
        .where_clause
        .as_ref()
        .map(|w| w.predicates.iter().map(|p| quote! { #p }).collect())
        .unwrap_or_default();
    for p in &def.params {
        if let ParamKind::Scalar { ty } = &p.kind {
            predicates.push(quote! { #ty: ::kernel_dsl::host::ScalarArg });
        }
    }
    let where_clause = if predicates.is_empty() { quote! {} } else { quote! { where #(#predicates),* } };
    let select = if def.is_generic() {
        let parts = type_params.iter().map(|t| quote! { ::kernel_dsl::host::symbol_part::<#t>() });
        quote! { ::kernel_dsl::host::find_instance(#name_str, INSTANCES, &[#(#parts),*])? }
    } else {
        quote! { &INSTANCES[0] }
    };
    let dyn_check = if def.shared_dyn().is_some() {
        quote! {
            let __dyn_len: u32 = u32::try_from(__config.dynamic_shared_elems).map_err(|_| {
                ::kernel_dsl::host::LaunchError::InvalidConfig(format!("dynamic shared length {} does not fit u32", __config.dynamic_shared_elems))
            })?;
        }
    } else {
        quote! {}
    };
    let doc_mod = format!("Launcher and argument layout of the [`{name}`](fn@{name}) kernel.");
    let doc_launch = format!(
        "Launches `{name}` on `exec` with `config`: the CPU executor runs it now; GPU executors enqueue it on their stream."
    );
    Ok(quote! {
        #func

        #[doc = #doc_mod]
        // `multiple_bound_locations`: a generic scalar parameter's `ScalarArg` bound goes to
        // the launcher's where-clause beside the bounds the kernel declares inline.
        #[allow(non_snake_case, unused_imports, clippy::too_many_arguments, clippy::multiple_bound_locations)]
        #vis mod #name {
            use super::*;

            /// GPU symbols of this kernel with their argument layouts (one per instance).
            pub const INSTANCES: &[::kernel_dsl::host::KernelInstance] = &[#(#instances),*];

            ::kernel_dsl::__private::inventory::submit! {
                ::kernel_dsl::host::KernelRegistration {
                    module: ::core::module_path!(),
                    instances: INSTANCES,
                    binaries: &crate::__KERNEL_BINARIES,
                }
            }

            #[doc = #doc_launch]
            pub fn launch<#(#l_generics),*>(
                exec: &(impl ::kernel_dsl::host::Executor + ?Sized),
                __config: ::kernel_dsl::host::LaunchConfig,
                #(#l_params),*
            ) -> ::core::result::Result<(), ::kernel_dsl::host::LaunchError> #where_clause {
                let __instance = #select;
                __instance.check_block(&__config)?;
                #dyn_check
                let __args = [#(#packs),*];
                let __shared_bytes = { #shared_size __off };
                let __entry = |__args: &[::kernel_dsl::host::ArgValue]| {
                    #(#binds)*
                    #shared
                    super::#name #tf (#(#call),*)
                };
                exec.launch(&::kernel_dsl::host::Launch {
                    kernel: __instance,
                    config: __config,
                    shared_bytes: __shared_bytes,
                    args: &__args,
                    cpu_entry: &__entry,
                    binaries: &crate::__KERNEL_BINARIES,
                })
            }
        }
    })
}

