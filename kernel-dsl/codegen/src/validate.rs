//! Checks that reject, at the user's span, kernels a GPU build cannot compile.
use syn::visit::Visit;
use syn::{Block, Error, ItemFn, Result, ReturnType};

/// The signature: a plain, safe, synchronous function returning nothing.
pub fn signature(f: &ItemFn) -> Result<()> {
    let s = &f.sig;
    if let Some(a) = &s.asyncness {
        return Err(Error::new_spanned(a, "kernels cannot be `async`: a GPU kernel runs to completion"));
    }
    if let Some(c) = &s.constness {
        return Err(Error::new_spanned(c, "kernels cannot be `const`"));
    }
    if let Some(u) = &s.unsafety {
        return Err(Error::new_spanned(u, "kernels are safe functions; put unsafe operations in `unsafe` blocks"));
    }
    if let Some(abi) = &s.abi {
        return Err(Error::new_spanned(abi, "do not give kernels an ABI; #[amdgpu_kernel] adds the `gpu-kernel` entry point"));
    }
    if let Some(v) = &s.variadic {
        return Err(Error::new_spanned(v, "kernels cannot be variadic"));
    }
    if let ReturnType::Type(_, ty) = &s.output {
        return Err(Error::new_spanned(ty, "kernels return nothing; write results into a `&mut [T]` parameter"));
    }
    Ok(())
}

struct BodyCheck {
    errors: Option<Error>,
}

impl BodyCheck {
    fn push(&mut self, e: Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }
}

impl<'ast> Visit<'ast> for BodyCheck {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if let Some(first) = p.segments.first() {
            if first.ident == "std" && p.segments.len() > 1 {
                self.push(Error::new_spanned(
                    p,
                    "`std` is not available in GPU kernels; use `core` or `kernel_dsl` (math: `kernel_dsl::prelude::FloatMath`)",
                ));
            }
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        if let Some(last) = m.path.segments.last() {
            let name = last.ident.to_string();
            let why = match name.as_str() {
                "println" | "print" | "eprintln" | "eprint" | "dbg" => Some("there is no console on the GPU"),
                "vec" | "format" => Some("GPU kernels have no heap"),
                _ => None,
            };
            if let Some(why) = why {
                self.push(Error::new_spanned(m, format!("`{name}!` cannot be used in a GPU kernel: {why}")));
            }
        }
        syn::visit::visit_macro(self, m);
    }

    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        if let Some(a) = &c.asyncness {
            self.push(Error::new_spanned(a, "async closures cannot run in a GPU kernel"));
        }
        syn::visit::visit_expr_closure(self, c);
    }

    fn visit_expr_await(&mut self, e: &'ast syn::ExprAwait) {
        self.push(Error::new_spanned(e, "`.await` cannot run in a GPU kernel"));
    }
}

/// The body: no `std`, no heap or console macros.
pub fn body(b: &Block) -> Result<()> {
    let mut v = BodyCheck { errors: None };
    v.visit_block(b);
    v.errors.map_or(Ok(()), Err)
}
