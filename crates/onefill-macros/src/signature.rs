//! What the attribute needs to know of the function: its arguments (each
//! moved into the loader, a reference one turned into its owned form), its
//! return type and which of the three forms it is, and every shape it
//! cannot cache, refused with a span and what to do instead.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Error, FnArg, GenericArgument, GenericParam, ItemFn, Pat, PathArguments, ReturnType, Type,
};

/// The function as the expansion sees it.
pub(crate) struct Signature {
    pub asyncness: bool,
    pub args: Vec<Arg>,
    /// The return type, as written.
    pub ret: Type,
    pub form: Form,
}

/// One argument: a plain name and its type.
pub(crate) struct Arg {
    pub ident: syn::Ident,
    /// Declared `mut`: rebound `mut` inside the loader, where the body runs.
    pub mutable: bool,
    /// For `&T`, `T`: the argument is copied (`ToOwned`) before the loader
    /// and borrowed back inside it.
    pub referent: Option<Type>,
}

/// Which cache call the return type maps to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Form {
    /// `Result<T, E>`: `get_or_load`.
    Value,
    /// `Result<Option<T>, E>`: `get_or_load_optional`, absence cached.
    Optional,
    /// `Option<T>`: `get_or_load_optional` with a loader that cannot fail.
    OptionOnly,
}

impl Form {
    /// The marker type of `onefill::__private` naming this form.
    pub(crate) fn marker(self) -> &'static str {
        match self {
            Form::Value => "Value",
            Form::Optional => "Optional",
            Form::OptionOnly => "OptionOnly",
        }
    }
}

/// Reads the function, refusing what a detached loader cannot run.
pub(crate) fn analyse(item: &ItemFn) -> syn::Result<Signature> {
    let sig = &item.sig;
    if let Some(constness) = &sig.constness {
        return Err(Error::new(
            constness.span(),
            "`#[onefill::cached]` cannot cache a `const fn`: remove `const`",
        ));
    }
    if let Some(abi) = &sig.abi {
        return Err(Error::new(
            abi.span(),
            "`#[onefill::cached]` cannot cache an `extern` function: cache a Rust function it calls",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        return Err(Error::new(
            variadic.span(),
            "`#[onefill::cached]` cannot cache a variadic function",
        ));
    }
    for param in &sig.generics.params {
        if !matches!(param, GenericParam::Lifetime(_)) {
            return Err(Error::new(
                param.span(),
                "`#[onefill::cached]` cannot cache a generic function: each cached function has \
                 one cache of one value type; cache a non-generic function for each type \
                 (it may call the generic one)",
            ));
        }
    }
    let mut args = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                return Err(Error::new(
                    // `self` itself: a span over `&self` is only its first
                    // token (`&`) on a stable compiler.
                    receiver.self_token.span,
                    "`#[onefill::cached]` cannot cache a method: its body becomes a loader that \
                     runs detached (`'static`), which cannot borrow `self`; make it an associated \
                     function taking what it needs (a clone of the pool, an id) as arguments",
                ));
            }
            FnArg::Typed(typed) => {
                if let Some(cfg) = typed.attrs.iter().find(|a| a.path().is_ident("cfg")) {
                    return Err(Error::new(
                        cfg.path().span(),
                        "`#[onefill::cached]` cannot take an argument under `#[cfg]`: the key \
                         and the body name every argument, whether or not it is compiled in; \
                         give the function one signature (two functions, one per `cfg`)",
                    ));
                }
                args.push(argument(&typed.pat, &typed.ty)?)
            }
        }
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => {
            return Err(Error::new(
                sig.ident.span(),
                "a `#[onefill::cached]` function returns `Result<T, E>`, \
                 `Result<Option<T>, E>` or `Option<T>`: what it returns is what is cached",
            ))
        }
    };
    refuse_in_type(&ret, "return type")?;
    Ok(Signature {
        asyncness: sig.asyncness.is_some(),
        args,
        form: form_of(&ret),
        ret,
    })
}

fn argument(pat: &Pat, ty: &Type) -> syn::Result<Arg> {
    let Pat::Ident(binding) = pat else {
        return Err(Error::new(
            pat.span(),
            "`#[onefill::cached]` needs each argument to be a plain name (`id: u64`), \
             which the key and the loader refer to: destructure inside the body",
        ));
    };
    if binding.by_ref.is_some() || binding.subpat.is_some() {
        return Err(Error::new(
            pat.span(),
            "`#[onefill::cached]` needs each argument to be a plain name (`id: u64`)",
        ));
    }
    refuse_in_type(ty, "argument")?;
    let referent = match ty {
        Type::Reference(reference) => {
            if let Some(mutability) = &reference.mutability {
                return Err(Error::new(
                    mutability.span(),
                    "`#[onefill::cached]` cannot take a `&mut` argument: the body runs detached, \
                     on a copy of its arguments, so what it changed would never reach the caller",
                ));
            }
            Some((*reference.elem).clone())
        }
        _ => None,
    };
    Ok(Arg {
        ident: binding.ident.clone(),
        mutable: binding.mutability.is_some(),
        referent,
    })
}

/// `impl Trait` (a hidden generic) and `Self` (not nameable in the items
/// the expansion declares in the body) anywhere in `ty`.
fn refuse_in_type(ty: &Type, what: &str) -> syn::Result<()> {
    let mut found = None;
    visit(ty.to_token_stream(), &mut |tree| {
        if found.is_some() {
            return;
        }
        if let proc_macro2::TokenTree::Ident(ident) = tree {
            if ident == "impl" {
                found = Some(Error::new(
                    ident.span(),
                    format!(
                        "`#[onefill::cached]` cannot cache a function with an `impl Trait` \
                         {what}: it makes the function generic; name a concrete type"
                    ),
                ));
            } else if ident == "Self" {
                found = Some(Error::new(
                    ident.span(),
                    format!(
                        "`#[onefill::cached]` cannot use `Self` in an {what}: the cache is a \
                         static inside the function, where `Self` is not in scope; name the type"
                    ),
                ));
            }
        }
    });
    match found {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn visit(tokens: TokenStream, f: &mut impl FnMut(&proc_macro2::TokenTree)) {
    for tree in tokens {
        f(&tree);
        if let proc_macro2::TokenTree::Group(group) = &tree {
            visit(group.stream(), f);
        }
    }
}

/// By the return type's spelling: `Option<T>` is the option form, a type
/// whose first generic argument is `Option<…>` (`Result<Option<T>, E>`,
/// `anyhow::Result<Option<T>>`) the optional form, anything else the value
/// form (an alias that hides the `Option` caches `None` as a value).
fn form_of(ret: &Type) -> Form {
    let Some(last) = last_segment(ret) else {
        return Form::Value;
    };
    if last.ident == "Option" {
        return Form::OptionOnly;
    }
    let PathArguments::AngleBracketed(generics) = &last.arguments else {
        return Form::Value;
    };
    match generics.args.first() {
        Some(GenericArgument::Type(first))
            if last_segment(first).is_some_and(|s| s.ident == "Option") =>
        {
            Form::Optional
        }
        _ => Form::Value,
    }
}

fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(path) if path.qself.is_none() => path.path.segments.last(),
        Type::Group(group) => last_segment(&group.elem),
        Type::Paren(paren) => last_segment(&paren.elem),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(ret: &str) -> Form {
        form_of(&syn::parse_str(ret).unwrap())
    }

    #[test]
    fn an_argument_under_cfg_is_refused() {
        let item: ItemFn = syn::parse_quote!(
            fn f(#[cfg(feature = "x")] a: u32, b: u32) -> Option<u32> {
                Some(b)
            }
        );
        let error = analyse(&item).err().map(|e| e.to_string());
        assert!(error.unwrap_or_default().contains("under `#[cfg]`"));
        let allowed: ItemFn = syn::parse_quote!(
            fn f(#[allow(unused)] a: u32) -> Option<u32> {
                None
            }
        );
        assert!(analyse(&allowed).is_ok());
    }

    #[test]
    fn forms_follow_the_spelling_of_the_return_type() {
        assert_eq!(form("Result<User, Error>"), Form::Value);
        assert_eq!(form("anyhow::Result<User>"), Form::Value);
        assert_eq!(form("Result<Option<User>, Error>"), Form::Optional);
        assert_eq!(
            form("anyhow::Result<std::option::Option<User>>"),
            Form::Optional
        );
        assert_eq!(form("Option<User>"), Form::OptionOnly);
        assert_eq!(form("core::option::Option<User>"), Form::OptionOnly);
    }
}
