//! The attribute's options: where the cache comes from (`cache`), what the
//! key is (`key`, `skip`), the namespace, and the settings (freshness, L1,
//! key length) of a default cache, each turned into its `CacheBuilder` call.

use proc_macro2::TokenStream;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{Error, Expr, ExprLit, Lit, LitStr};

use crate::duration;

/// Every option, by name, for the message about an unknown one.
const KNOWN: &str = "`cache`, `key`, `skip`, `namespace`, `ttl`, `grace`, `negative_ttl`, \
                     `jitter`, `max_load_time`, `soft_timeout`, `fail_safe`, `l1`, \
                     `max_key_bytes`";

#[derive(Default)]
pub(crate) struct Options {
    /// `cache = USERS`: a cache of the caller's own.
    pub cache: Option<Expr>,
    pub namespace: Option<LitStr>,
    /// `key = "{id}:{lang}"`.
    pub key: Option<LitStr>,
    /// `skip(pool, conn)`.
    pub skip: Vec<syn::Ident>,
    /// The builder calls of the freshness settings, each with the option's
    /// name (for duplicates and for `cache = …`, which refuses them).
    pub settings: Vec<(syn::Ident, TokenStream)>,
}

impl Options {
    /// Reads one `name = value` or `name(…)`.
    pub(crate) fn parse_one(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().cloned() else {
            return Err(meta.error(format!("unknown option; the options are {KNOWN}")));
        };
        let seen = self.settings.iter().any(|(n, _)| *n == name)
            || (name == "cache" && self.cache.is_some())
            || (name == "namespace" && self.namespace.is_some())
            || (name == "key" && self.key.is_some());
        if seen {
            return Err(Error::new(name.span(), format!("`{name}` is given twice")));
        }
        match name.to_string().as_str() {
            "cache" => self.cache = Some(meta.value()?.parse()?),
            "namespace" => {
                let namespace: LitStr = meta.value()?.parse()?;
                check_namespace(&namespace)?;
                self.namespace = Some(namespace);
            }
            "key" => self.key = Some(meta.value()?.parse()?),
            "skip" => meta.parse_nested_meta(|skipped| {
                match skipped.path.get_ident() {
                    Some(ident) => self.skip.push(ident.clone()),
                    None => return Err(skipped.error("`skip(…)` takes argument names")),
                }
                Ok(())
            })?,
            "ttl" | "grace" | "negative_ttl" | "max_load_time" | "soft_timeout" => {
                let value = duration_value(meta.value()?.parse()?)?;
                self.settings.push((name.clone(), quote!(.#name(#value))));
            }
            "jitter" | "fail_safe" | "max_key_bytes" => {
                let value: Expr = meta.value()?.parse()?;
                self.settings.push((name.clone(), quote!(.#name(#value))));
            }
            "l1" => {
                let call = match meta.value()?.parse()? {
                    Expr::Lit(ExprLit {
                        lit: Lit::Int(entries),
                        ..
                    }) => quote!(.l1(::onefill::L1::new(#entries))),
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(on), ..
                    }) if !on.value => quote!(.no_l1()),
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(on), ..
                    }) => {
                        return Err(Error::new(
                            on.span(),
                            "`l1 = true`: say how many entries (`l1 = 10_000`), or give an \
                             `onefill::L1`",
                        ))
                    }
                    l1 => quote!(.l1(#l1)),
                };
                self.settings.push((name.clone(), call));
            }
            _ => {
                return Err(Error::new(
                    name.span(),
                    format!("unknown option `{name}`; the options are {KNOWN}"),
                ))
            }
        }
        Ok(())
    }

    /// Options that only make sense for a cache the attribute builds.
    pub(crate) fn check(&self) -> syn::Result<()> {
        if self.cache.is_none() {
            return Ok(());
        }
        let refused = self
            .settings
            .first()
            .map(|(name, _)| name.clone())
            .or_else(|| {
                self.namespace
                    .as_ref()
                    .map(|n| syn::Ident::new("namespace", n.span()))
            });
        match refused {
            Some(name) => Err(Error::new(
                name.span(),
                format!(
                    "`{name}` configures a cache the attribute builds; with `cache = …` the \
                     cache is yours: set it on that cache's builder"
                ),
            )),
            None => Ok(()),
        }
    }
}

/// A literal read now (`"5m"`), or any expression of type `Duration`.
fn duration_value(value: Expr) -> syn::Result<TokenStream> {
    let Expr::Lit(ExprLit {
        lit: Lit::Str(text),
        ..
    }) = &value
    else {
        return Ok(quote!(#value));
    };
    let millis = duration::parse_millis(&text.value()).map_err(|why| {
        Error::new(
            text.span(),
            format!(
                "invalid duration: {why}; write a whole number and a unit: \"250ms\", \"30s\", \
                 \"5m\", \"1h\", \"1d\" (or any expression of type `Duration`)"
            ),
        )
    })?;
    Ok(quote!(::core::time::Duration::from_millis(#millis)))
}

/// onefill's rules for a namespace (`key.rs`), checked at compile time.
fn check_namespace(namespace: &LitStr) -> syn::Result<()> {
    let text = namespace.value();
    let why = if text.is_empty() {
        "it is empty"
    } else if text.contains(['{', '}']) {
        "it contains `{` or `}`, reserved for the Redis Cluster hash tag"
    } else if text.len() > 256 {
        "it is longer than 256 bytes"
    } else {
        return Ok(());
    };
    Err(Error::new(
        namespace.span(),
        format!("invalid namespace: {why}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(attr: TokenStream) -> syn::Result<Options> {
        let mut options = Options::default();
        let parser = syn::meta::parser(|meta| options.parse_one(meta));
        syn::parse::Parser::parse2(parser, attr)?;
        options.check()?;
        Ok(options)
    }

    #[test]
    fn settings_become_builder_calls() {
        let options = parse(quote!(
            ttl = "5m",
            grace = GRACE,
            l1 = 100,
            jitter = 0.0,
            max_key_bytes = 4096
        ))
        .unwrap();
        let calls: Vec<String> = options
            .settings
            .iter()
            .map(|(_, c)| c.to_string())
            .collect();
        assert_eq!(
            calls,
            [
                ". ttl (:: core :: time :: Duration :: from_millis (300000u64))",
                ". grace (GRACE)",
                ". l1 (:: onefill :: L1 :: new (100))",
                ". jitter (0.0)",
                ". max_key_bytes (4096)",
            ]
        );
    }

    #[test]
    fn misuse_is_refused() {
        let error = |attr| parse(attr).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error(quote!(ttl = "5 min")).starts_with("invalid duration"));
        assert!(error(quote!(tll = "5m")).starts_with("unknown option `tll`"));
        assert!(error(quote!(ttl = "5m", ttl = "1m")).contains("given twice"));
        assert!(error(quote!(cache = USERS, ttl = "5m")).contains("that cache's builder"));
        assert!(error(quote!(namespace = "a{b")).starts_with("invalid namespace"));
        assert!(error(quote!(l1 = true)).contains("how many entries"));
    }
}
