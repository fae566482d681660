//! The cache key of a call, from the function's arguments: all of them by
//! default (one as it displays, `%` escaped so that an empty one can be a
//! lone `%`: a key is never empty; several joined by `:`, each escaped), or
//! a format string of the caller's (`key = "{id}:{lang}"`) naming those it
//! wants; `skip(…)` leaves arguments out of the default key.
//!
//! The expression built here evaluates to `Result<String, onefill::Error>`
//! (a key whose `Display` fails is an error, never a panic).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::{Error, LitStr};

use crate::signature::Arg;

/// The key of a call, evaluated before the arguments move into the loader.
pub(crate) fn key_expr(
    args: &[Arg],
    format: Option<&LitStr>,
    skip: &[syn::Ident],
) -> syn::Result<TokenStream> {
    for skipped in skip {
        if !args.iter().any(|a| a.ident == *skipped) {
            return Err(Error::new(
                skipped.span(),
                format!("`skip({skipped})`: the function has no argument `{skipped}`"),
            ));
        }
    }
    if let Some(format) = format {
        return format_key(args, format, skip);
    }
    let parts: Vec<&Arg> = args.iter().filter(|a| !skip.contains(&a.ident)).collect();
    match parts.as_slice() {
        [] => Ok(quote!(::onefill::__private::no_key())),
        [alone] => {
            let part = part_expr(alone, quote!(only));
            Ok(quote!(::onefill::__private::key_fmt(
                ::core::format_args!("{}", #part)
            )))
        }
        several => {
            let placeholders = vec!["{}"; several.len()].join(":");
            let parts = several.iter().map(|arg| part_expr(arg, quote!(escaped)));
            Ok(quote!(::onefill::__private::key_fmt(
                ::core::format_args!(#placeholders, #(#parts),*)
            )))
        }
    }
}

/// One argument as a key part, its `Display` checked at the argument's own
/// span (the helper trait's message says what to do).
fn part_expr(arg: &Arg, wrapper: TokenStream) -> TokenStream {
    let ident = &arg.ident;
    let reference = arg
        .referent
        .is_none()
        .then(|| quote_spanned!(ident.span()=> &));
    quote_spanned!(ident.span()=> ::onefill::__private::#wrapper(#reference #ident))
}

/// `key = "…"`: the caller's format string, whose placeholders must each
/// name an argument not skipped.
fn format_key(args: &[Arg], format: &LitStr, skip: &[syn::Ident]) -> syn::Result<TokenStream> {
    let names = placeholders(&format.value()).map_err(|why| Error::new(format.span(), why))?;
    // A key without placeholders (`key = "id"` for `"{id}"`) is one entry
    // for every call: each caller would get the first caller's value.
    if names.is_empty() && !args.is_empty() {
        return Err(Error::new(
            format.span(),
            "the key names no argument, so every call would share one entry: name them in \
             braces (`key = \"{id}\"`), or `skip(…)` them all for one entry on purpose",
        ));
    }
    for name in names {
        if !args.iter().any(|a| a.ident == name) {
            return Err(Error::new(
                format.span(),
                format!("`{{{name}}}` in the key: the function has no argument `{name}`"),
            ));
        }
        if skip.iter().any(|s| s == name.as_str()) {
            return Err(Error::new(
                format.span(),
                format!("`{name}` is both skipped and in the key"),
            ));
        }
    }
    Ok(quote!(::onefill::__private::key_fmt(
        ::core::format_args!(#format)
    )))
}

/// The argument names a format string's placeholders use.
fn placeholders(format: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                let mut inside = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inside.push(c),
                        None => return Err("an unclosed `{` in the key".to_owned()),
                    }
                }
                let name = inside.split(':').next().unwrap_or_default().trim();
                let is_name = name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && name.chars().all(|c| c.is_alphanumeric() || c == '_');
                if !is_name {
                    return Err(format!(
                        "`{{{inside}}}` in the key: name the argument (`{{id}}`), positions \
                         are not known to the key"
                    ));
                }
                names.push(name.to_owned());
            }
            _ => {}
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    #[test]
    fn placeholders_are_argument_names() {
        assert_eq!(
            placeholders("user:{id}:{lang:>4}{{x}}").unwrap(),
            ["id", "lang"]
        );
        assert!(placeholders("{}").is_err());
        assert!(placeholders("{0}").is_err());
        assert!(placeholders("{id").is_err());
    }

    #[test]
    fn a_key_naming_no_argument_is_refused() {
        let item: syn::ItemFn = syn::parse_quote!(
            fn f(id: u64) -> Option<u64> {
                Some(id)
            }
        );
        let args = crate::signature::analyse(&item).unwrap().args;
        let error = |format: &str| {
            key_expr(&args, Some(&LitStr::new(format, Span::call_site())), &[])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(error("id").contains("names no argument"));
        assert!(error("{{id}}").contains("names no argument"));
        assert!(error("{id}").is_empty());
        let none: syn::ItemFn = syn::parse_quote!(
            fn g() -> Option<u64> {
                None
            }
        );
        let no_args = crate::signature::analyse(&none).unwrap().args;
        let fixed = LitStr::new("config", Span::call_site());
        assert!(key_expr(&no_args, Some(&fixed), &[]).is_ok());
    }
}
