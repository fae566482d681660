//! The `#[cached]` attribute of [onefill](https://docs.rs/onefill). Use it
//! as `#[onefill::cached]`, through onefill's `macros` feature: the
//! expansion calls onefill's own items, and its documentation is the
//! reference.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use proc_macro::TokenStream;

mod duration;
mod expand;
mod key;
mod options;
mod signature;

#[doc = include_str!("../docs/cached.md")]
#[doc = concat!("```rust,ignore\n", include_str!("../docs/expansion_input.rs"), "```\n")]
#[doc = "becomes\n"]
#[doc = concat!("```rust,ignore\n", include_str!("../docs/expansion.rs"), "```")]
#[proc_macro_attribute]
pub fn cached(attr: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    match expand::cached(attr.into(), item.into()) {
        Ok(expanded) => expanded.into(),
        // The function as written too: its callers then compile, and the
        // one error is the attribute's.
        Err(error) => {
            let error = error.into_compile_error();
            quote::quote!(#error #original).into()
        }
    }
}
