//! Parsing a kernel function and its attribute into a [`KernelDef`].
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::visit_mut::VisitMut;
use syn::{Error, Expr, FnArg, GenericArgument, GenericParam, Ident, ItemFn, Pat, PathArguments, Result, Token, Type};

/// How a kernel parameter reaches the kernel.
#[derive(Clone, Debug)]
pub enum ParamKind {
    /// `&[T]` or `&mut [T]`: a global buffer (pointer slot and length slot).
    Slice {
        /// Element type.
        elem: Type,
        /// `&mut`.
        mutable: bool,
    },
    /// A primitive passed by value.
    Scalar {
        /// Its type.
        ty: Type,
    },
    /// `Shared<T, N>`: compile-time-sized shared memory (no argument slot).
    Shared {
        /// Element type.
        elem: Type,
        /// Length expression (boxed: an `Expr` is large and the other variants are not).
        len: Box<Expr>,
    },
    /// `SharedDyn<T>`: launch-sized shared memory (a hidden `u32` length slot at the end).
    SharedDyn {
        /// Element type.
        elem: Type,
    },
}

/// One kernel parameter.
#[derive(Clone, Debug)]
pub struct Param {
    /// Its name.
    pub name: Ident,
    /// The declared type.
    pub ty: Type,
    /// Classification.
    pub kind: ParamKind,
}

/// One generic instance: the GPU symbol and the concrete types of the generic parameters.
#[derive(Clone, Debug)]
pub struct Instance {
    /// GPU symbol (`unary_f32_neg`).
    pub symbol: String,
    /// Concrete type per generic type parameter, in declaration order.
    pub types: Vec<Type>,
}

/// A parsed and validated kernel.
#[derive(Clone, Debug)]
pub struct KernelDef {
    /// The function as written (attribute removed).
    pub func: ItemFn,
    /// Parameters in order.
    pub params: Vec<Param>,
    /// Generic type parameters, in order.
    pub type_params: Vec<Ident>,
    /// Instances to build (one, with no types, for a non-generic kernel).
    pub instances: Vec<Instance>,
    /// Largest work-group the kernel may be launched with (`max_threads = N` in the
    /// attribute; [`MAX_THREADS`] when not given).
    pub max_threads: u32,
}

/// Largest work-group of any kernel, and the launch bound of kernels that give none.
pub const MAX_THREADS: u32 = 1024;

struct AttrArgs {
    types: Vec<(Ident, Vec<Type>)>,
    max_threads: Option<u32>,
}

impl Parse for AttrArgs {
    fn parse(input: ParseStream) -> Result<Self> {
        let mut out = Vec::new();
        let mut max_threads = None;
        while !input.is_empty() {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            if name == "max_threads" {
                let lit: syn::LitInt = input.parse()?;
                let n: u32 = lit.base10_parse()?;
                if !(1..=MAX_THREADS).contains(&n) {
                    return Err(Error::new(lit.span(), format!("`max_threads = {n}` is outside 1..={MAX_THREADS}")));
                }
                if max_threads.replace(n).is_some() {
                    return Err(Error::new(name.span(), "`max_threads` is given twice"));
                }
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
                continue;
            }
            let content;
            syn::bracketed!(content in input);
            let types: Punctuated<Type, Token![,]> = content.parse_terminated(Type::parse, Token![,])?;
            if types.is_empty() {
                return Err(Error::new(name.span(), format!("`{name} = []` lists no types; name at least one")));
            }
            out.push((name, types.into_iter().collect()));
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(AttrArgs { types: out, max_threads })
    }
}

/// Last path segment of a type, if it is a plain path.
pub(crate) fn last_ident(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        _ => None,
    }
}

fn classify(ty: &Type) -> Result<ParamKind> {
    match ty {
        Type::Reference(r) => match &*r.elem {
            Type::Slice(s) => Ok(ParamKind::Slice { elem: (*s.elem).clone(), mutable: r.mutability.is_some() }),
            other => Err(Error::new_spanned(
                ty,
                format!(
                    "kernel parameters cannot be references to `{}`; pass buffers as `&[T]` / `&mut [T]` and scalars by value",
                    other.to_token_stream()
                ),
            )),
        },
        Type::Array(_) => Err(Error::new_spanned(
            ty,
            "arrays cannot be passed by value to a GPU kernel (the gpu-kernel ABI passes them indirectly); pass a slice `&[T]`",
        )),
        Type::Path(_) => {
            let seg = last_ident(ty).expect("path type");
            let generic_args = |n: usize| -> Result<Vec<GenericArgument>> {
                match &seg.arguments {
                    PathArguments::AngleBracketed(a) if a.args.len() == n => Ok(a.args.iter().cloned().collect()),
                    _ => Err(Error::new_spanned(ty, format!("`{}` takes {n} generic argument(s)", seg.ident))),
                }
            };
            match seg.ident.to_string().as_str() {
                "Shared" => {
                    let a = generic_args(2)?;
                    let elem = match &a[0] {
                        GenericArgument::Type(t) => t.clone(),
                        other => return Err(Error::new_spanned(other, "expected the element type")),
                    };
                    let len = match &a[1] {
                        GenericArgument::Const(e) => e.clone(),
                        GenericArgument::Type(t) => syn::parse2::<Expr>(t.to_token_stream())?,
                        other => return Err(Error::new_spanned(other, "expected the length")),
                    };
                    Ok(ParamKind::Shared { elem, len: Box::new(len) })
                }
                "SharedDyn" => match &generic_args(1)?[0] {
                    GenericArgument::Type(t) => Ok(ParamKind::SharedDyn { elem: t.clone() }),
                    other => Err(Error::new_spanned(other, "expected the element type")),
                },
                "Vec" | "String" | "Box" | "Rc" | "Arc" | "HashMap" | "BTreeMap" => Err(Error::new_spanned(
                    ty,
                    format!("`{}` needs a heap, which GPU kernels do not have; pass a slice `&[T]` instead", seg.ident),
                )),
                "bool" => Err(Error::new_spanned(ty, "pass flags as `u32` (bool has no defined kernel-argument layout)")),
                _ => Ok(ParamKind::Scalar { ty: ty.clone() }),
            }
        }
        _ => Err(Error::new_spanned(ty, "unsupported kernel parameter type; use `&[T]`, `&mut [T]`, a primitive, `Shared<T, N>` or `SharedDyn<T>`")),
    }
}

/// Replaces generic type parameters by concrete types.
pub(crate) struct Subst<'a> {
    pub params: &'a [Ident],
    pub types: &'a [Type],
}

impl VisitMut for Subst<'_> {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::Path(p) = ty {
            if p.qself.is_none() && p.path.segments.len() == 1 && p.path.segments[0].arguments.is_empty() {
                if let Some(i) = self.params.iter().position(|g| *g == p.path.segments[0].ident) {
                    *ty = self.types[i].clone();
                    return;
                }
            }
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

impl Instance {
    /// `ty` with this instance's generic arguments substituted.
    pub fn subst(&self, def: &KernelDef, ty: &Type) -> Type {
        let mut t = ty.clone();
        Subst { params: &def.type_params, types: &self.types }.visit_type_mut(&mut t);
        t
    }
}

impl KernelDef {
    /// Parses `#[amdgpu_kernel(attr)] func`, validating everything the GPU build needs.
    pub fn parse(attr: TokenStream, mut func: ItemFn) -> Result<Self> {
        func.attrs.retain(|a| !crate::is_kernel_attr(a));
        crate::validate::signature(&func)?;
        crate::validate::body(&func.block)?;
        let args: AttrArgs = syn::parse2(attr)?;

        let mut params = Vec::new();
        let mut errors: Option<Error> = None;
        let mut push_err = |e: Error| match &mut errors {
            Some(all) => all.combine(e),
            None => errors = Some(e),
        };
        for input in &func.sig.inputs {
            let FnArg::Typed(pt) = input else {
                push_err(Error::new_spanned(input, "a kernel cannot take `self`"));
                continue;
            };
            let name = match &*pt.pat {
                Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => pi.ident.clone(),
                other => {
                    push_err(Error::new_spanned(other, "kernel parameters must be plain names"));
                    continue;
                }
            };
            match classify(&pt.ty) {
                Ok(kind) => params.push(Param { name, ty: (*pt.ty).clone(), kind }),
                Err(e) => push_err(e),
            }
        }
        if let Some(e) = errors {
            return Err(e);
        }
        let dyn_count = params.iter().filter(|p| matches!(p.kind, ParamKind::SharedDyn { .. })).count();
        if dyn_count > 1 {
            let p = params.iter().filter(|p| matches!(p.kind, ParamKind::SharedDyn { .. })).nth(1).unwrap();
            return Err(Error::new_spanned(&p.ty, "a kernel can have at most one `SharedDyn` parameter"));
        }

        let mut type_params = Vec::new();
        for g in &func.sig.generics.params {
            match g {
                GenericParam::Type(t) => type_params.push(t.ident.clone()),
                GenericParam::Lifetime(_) => {}
                GenericParam::Const(c) => {
                    return Err(Error::new_spanned(c, "const generic kernels are not supported; use a `const` item or a type parameter"))
                }
            }
        }
        for (name, _) in &args.types {
            if !type_params.contains(name) {
                return Err(Error::new(name.span(), format!("`{name}` is not a type parameter of `{}`", func.sig.ident)));
            }
        }
        let mut lists = Vec::new();
        for tp in &type_params {
            match args.types.iter().find(|(n, _)| n == tp) {
                Some((_, types)) => lists.push(types.clone()),
                None => {
                    return Err(Error::new(
                        tp.span(),
                        format!(
                            "generic kernels need their instances: write #[amdgpu_kernel({tp} = [f32, ...])] so every GPU symbol can be built"
                        ),
                    ))
                }
            }
        }
        let base = func.sig.ident.to_string();
        let mut instances = vec![Instance { symbol: base.clone(), types: Vec::new() }];
        for list in &lists {
            let mut next = Vec::new();
            for inst in &instances {
                for ty in list {
                    let part = last_ident(ty)
                        .map(|s| crate::snake_case(&s.ident.to_string()))
                        .ok_or_else(|| Error::new_spanned(ty, "instance types must be named types"))?;
                    let mut types = inst.types.clone();
                    types.push(ty.clone());
                    next.push(Instance { symbol: format!("{}_{}", inst.symbol, part), types });
                }
            }
            instances = next;
        }
        let def = KernelDef { func, params, type_params, instances, max_threads: args.max_threads.unwrap_or(MAX_THREADS) };
        for inst in &def.instances {
            def.abi(inst)?;
        }
        Ok(def)
    }

    /// The kernel's name.
    pub fn name(&self) -> &Ident {
        &self.func.sig.ident
    }

    /// `true` when the kernel has type parameters.
    pub fn is_generic(&self) -> bool {
        !self.type_params.is_empty()
    }

    /// The parameter with a `SharedDyn` type, if any.
    pub fn shared_dyn(&self) -> Option<&Param> {
        self.params.iter().find(|p| matches!(p.kind, ParamKind::SharedDyn { .. }))
    }

    /// Span of the kernel name, for generated items.
    pub fn span(&self) -> Span {
        self.func.sig.ident.span()
    }
}
