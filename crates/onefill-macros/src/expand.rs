//! The expansion: the function keeps its signature, and its body becomes
//! the loader of one cache call. `docs/expansion.rs` shows the result for a
//! typical function (and a test below keeps it exact).

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ItemFn, Pat};

use crate::key::key_expr;
use crate::options::Options;
use crate::signature::{analyse, Form, Signature};

/// `#[cached(attr)] item`, or the first thing wrong with it.
pub(crate) fn cached(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut options = Options::default();
    let parser = syn::meta::parser(|meta| options.parse_one(meta));
    syn::parse::Parser::parse2(parser, attr)?;
    options.check()?;
    let mut function: ItemFn = syn::parse2(item)?;
    // A second caching attribute would cache this expansion again, in the
    // same namespace and key: its load would wait on the first's lease,
    // which waits on it, until `max_load_time`, at every call.
    let again = function.attrs.iter().find(|a| {
        a.path()
            .segments
            .last()
            .is_some_and(|last| last.ident == "cached")
    });
    if let Some(again) = again {
        return Err(syn::Error::new(
            again.path().span(),
            "the function is cached twice: each load would wait on the other's until \
             `max_load_time`; keep one `#[onefill::cached]`",
        ));
    }
    let signature = analyse(&function)?;
    let key = key_expr(&signature.args, options.key.as_ref(), &options.skip)?;
    // `mut` on an argument concerns the body, which runs in the loader
    // (rebound `mut` there); out here it would only be an unused `mut`.
    for input in &mut function.sig.inputs {
        if let syn::FnArg::Typed(typed) = input {
            if let Pat::Ident(binding) = &mut *typed.pat {
                binding.mutability = None;
            }
        }
    }
    let body = generate(&function, &signature, &options, key);
    let attrs = &function.attrs;
    let vis = &function.vis;
    let sig = &function.sig;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #body
        }
    })
}

/// The new body.
fn generate(
    function: &ItemFn,
    signature: &Signature,
    options: &Options,
    key: TokenStream,
) -> TokenStream {
    // The expansion's own locals cannot meet the function's (`mixed_site`).
    let local = |name: &str| syn::Ident::new(name, Span::mixed_site());
    let key_var = local("__onefill_key");
    let cache_var = local("__onefill_cache");
    let error = local("error");
    let name = function.sig.ident.to_string();
    let ret = &signature.ret;
    let form = format_ident!("{}", signature.form.marker());
    // Every token that asks the return type for its form (`Returns<…>`),
    // and the expressions handed to it, are at the return type's span: a
    // return type the cache cannot answer is one error, there, not one per
    // use in the expansion.
    let returns = quote_spanned!(ret.span()=>
        <__OnefillReturn as ::onefill::__private::Returns<::onefill::__private::#form>>
    );
    let answer = quote_spanned!(ret.span()=> #returns::answer);
    let found = syn::Ident::new("__onefill_found", ret.span());
    let failed = quote_spanned!(ret.span()=> ::core::result::Result::Err(#error));
    let fail = quote_spanned! {ret.span()=>
        return #answer(#failed, &__ONEFILL_SITE)
    };
    let namespace = match &options.namespace {
        Some(namespace) => quote!(::core::option::Option::Some(#namespace)),
        None => quote!(::core::option::Option::None),
    };
    let owned = signature.args.iter().filter_map(|arg| {
        let ident = &arg.ident;
        arg.referent
            .as_ref()
            .map(|_| quote!(let #ident = ::std::borrow::ToOwned::to_owned(#ident);))
    });
    let cache = cache_expr(signature, options, &returns, &fail, &cache_var);
    let loader = loader(function, signature);
    let call = match (signature.form, signature.asyncness) {
        (Form::Value, true) => quote!(#cache_var.get_or_load(&*#key_var, #loader).await),
        (_, true) => quote!(#cache_var.get_or_load_optional(&*#key_var, #loader).await),
        (Form::Value, false) => quote!(#cache_var.get_or_load(&*#key_var, #loader)),
        (_, false) => quote!(#cache_var.get_or_load_optional(&*#key_var, #loader)),
    };
    quote! {
        type __OnefillReturn = #ret;
        fn __onefill_here() -> &'static str {
            ::core::any::type_name_of_val(&__onefill_here)
        }
        const __ONEFILL_SITE: ::onefill::__private::Site = ::onefill::__private::Site::new(
            ::core::module_path!(),
            #name,
            #namespace,
            __onefill_here,
        );
        let #key_var = match #key {
            ::core::result::Result::Ok(key) => key,
            ::core::result::Result::Err(#error) => #fail,
        };
        #(#owned)*
        #cache
        let #found = #call;
        #answer(#found, &__ONEFILL_SITE)
    }
}

/// `let __onefill_cache = …;`: the caller's cache, or the function's own,
/// built at its first call on the crate's default backend.
fn cache_expr(
    signature: &Signature,
    options: &Options,
    returns: &TokenStream,
    fail: &TokenStream,
    var: &syn::Ident,
) -> TokenStream {
    let error = syn::Ident::new("error", Span::mixed_site());
    let kind = if signature.asyncness {
        quote!(Cache)
    } else {
        quote!(BlockingCache)
    };
    if let Some(named) = &options.cache {
        return quote! {
            let #var: &::onefill::#kind<::std::string::String, _> = &#named;
        };
    }
    let (slot, wait) = if signature.asyncness {
        (quote!(AsyncSlot), quote!(.await))
    } else {
        (quote!(BlockingSlot), quote!())
    };
    let settings = options.settings.iter().map(|(_, call)| call);
    // `__OnefillDefault` is the crate root's `default_backend!` item if
    // there is one (the inner glob import shadows the outer), else the
    // placeholder of `missing`, whose trait bound fails with a message
    // saying what to declare.
    let declared = quote_spanned! {Span::call_site()=>
        {
            #[allow(unused_imports)]
            use ::onefill::__private::missing::*;
            {
                use crate::*;
                ::onefill::__private::declared::<__OnefillDefault>()
            }
        }
    };
    // At the return type's span, as `returns` (see `generate`).
    let ret_span = signature.ret.span();
    let slot_type = quote_spanned!(ret_span=> ::onefill::__private::#slot<#returns::Value>);
    let new_slot = quote_spanned!(ret_span=> ::onefill::__private::#slot::new());
    let slot_call = quote_spanned!(ret_span=> __ONEFILL_CACHE.cache);
    let slot_static = quote_spanned!(ret_span=> static __ONEFILL_CACHE: #slot_type = #new_slot;);
    quote! {
        #slot_static
        let #var = match #slot_call(#declared, &__ONEFILL_SITE, |builder| builder #(#settings)*)
            #wait
        {
            ::core::result::Result::Ok(cache) => cache,
            ::core::result::Result::Err(#error) => #fail,
        };
    }
}

/// The body as the loader: the arguments moved in (a reference one as its
/// owned copy, borrowed back), the body run as written, its `return` and
/// `?` its own.
fn loader(function: &ItemFn, signature: &Signature) -> TokenStream {
    let rebind = signature.args.iter().map(|arg| {
        let ident = &arg.ident;
        let mutability = arg.mutable.then(|| quote!(mut));
        match &arg.referent {
            Some(referent) => quote! {
                #[allow(unused_variables)]
                let #mutability #ident: &#referent = ::std::borrow::Borrow::borrow(&#ident);
            },
            None if arg.mutable => quote!(let mut #ident = #ident;),
            None => quote!(),
        }
    });
    let body = &function.block;
    let ignored = quote!(_: ::std::string::String);
    match (signature.form, signature.asyncness) {
        (Form::OptionOnly, true) => quote! {
            move |#ignored| async move {
                #(#rebind)*
                ::onefill::__private::infallible(
                    ::onefill::__private::body::<__OnefillReturn, _>(async move #body).await,
                )
            }
        },
        (_, true) => quote! {
            move |#ignored| async move {
                #(#rebind)*
                ::onefill::__private::body::<__OnefillReturn, _>(async move #body).await
            }
        },
        (Form::OptionOnly, false) => quote! {
            move |#ignored| {
                #(#rebind)*
                ::onefill::__private::infallible((move || -> __OnefillReturn #body)())
            }
        },
        (_, false) => quote! {
            move |#ignored| -> __OnefillReturn {
                #(#rebind)*
                #body
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Token for token (whitespace and comments aside), the expansion the
    /// attribute's documentation shows is the one it makes.
    #[test]
    fn the_documented_expansion_is_the_real_one() {
        let mut item: ItemFn =
            syn::parse_str(include_str!("../docs/expansion_input.rs")).expect("the sample parses");
        let at = item
            .attrs
            .iter()
            .position(|a| {
                a.path()
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "cached")
            })
            .expect("the sample has the attribute");
        let attr = match &item.attrs.remove(at).meta {
            syn::Meta::List(list) => list.tokens.clone(),
            _ => TokenStream::new(),
        };
        let expanded = cached(attr, quote!(#item)).expect("the sample expands");
        let documented: TokenStream = include_str!("../docs/expansion.rs")
            .parse()
            .expect("the documented expansion parses");
        assert_eq!(
            tokens(expanded),
            tokens(documented),
            "docs/expansion.rs no longer shows what the attribute makes; write the new expansion there"
        );
    }

    #[test]
    fn a_function_cached_twice_is_refused() {
        let error = cached(
            TokenStream::new(),
            quote!(
                #[onefill::cached(ttl = "1m")]
                async fn f(id: u64) -> Option<u64> {
                    Some(id)
                }
            ),
        );
        let message = error.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("cached twice"), "{message:?}");
    }

    /// The tokens as text, one by one, without their spacing (`>;` and
    /// `> ;` are the same tokens), invisible groups or trailing commas.
    fn tokens(stream: TokenStream) -> Vec<String> {
        let mut out = Vec::new();
        for tree in stream {
            match tree {
                // Invisible groups (an interpolated type) are no tokens.
                proc_macro2::TokenTree::Group(group)
                    if group.delimiter() == proc_macro2::Delimiter::None =>
                {
                    out.extend(tokens(group.stream()));
                }
                proc_macro2::TokenTree::Group(group) => {
                    out.push(format!("{:?}(", group.delimiter()));
                    let mut inside = tokens(group.stream());
                    if inside.last().is_some_and(|last| last == ",") {
                        inside.pop();
                    }
                    out.extend(inside);
                    out.push(")".to_owned());
                }
                other => out.push(other.to_string()),
            }
        }
        out
    }
}
