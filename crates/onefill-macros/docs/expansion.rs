// What `#[onefill::cached(ttl = "5m", skip(pool))]` makes of
// `pub async fn user(id: u64, pool: &Pool) -> anyhow::Result<User>`
// (a unit test of onefill-macros checks it token for token).
pub async fn user(id: u64, pool: &Pool) -> anyhow::Result<User> {
    type __OnefillReturn = anyhow::Result<User>;
    // The namespace: `module_path!()` and the name (`my_app::users::user`);
    // for an associated or nested function, the path the compiler gives an
    // item in its body (`my_app::users::Users::user::__onefill_here`).
    fn __onefill_here() -> &'static str {
        ::core::any::type_name_of_val(&__onefill_here)
    }
    const __ONEFILL_SITE: ::onefill::__private::Site = ::onefill::__private::Site::new(
        ::core::module_path!(),
        "user",
        ::core::option::Option::None,
        __onefill_here,
    );
    // The key, from the arguments not skipped: here `id` as it displays
    // (`%` escaped, an empty one `%`: a key is never empty).
    let __onefill_key = match ::onefill::__private::key_fmt(::core::format_args!(
        "{}",
        ::onefill::__private::only(&id)
    )) {
        ::core::result::Result::Ok(key) => key,
        ::core::result::Result::Err(error) => return <__OnefillReturn as ::onefill::__private::Returns<::onefill::__private::Value>>::answer(
            ::core::result::Result::Err(error),
            &__ONEFILL_SITE,
        ),
    };
    // A reference argument, copied for the detached loader.
    let pool = ::std::borrow::ToOwned::to_owned(pool);
    // The function's own cache: built at the first call on the crate's
    // default backend (`onefill::default_backend!` at the crate root), with
    // the attribute's options; afterwards one atomic load.
    static __ONEFILL_CACHE: ::onefill::__private::AsyncSlot<
        <__OnefillReturn as ::onefill::__private::Returns<::onefill::__private::Value>>::Value
    > = ::onefill::__private::AsyncSlot::new();
    let __onefill_cache = match __ONEFILL_CACHE
        .cache(
            {
                #[allow(unused_imports)]
                use ::onefill::__private::missing::*;
                {
                    use crate::*;
                    ::onefill::__private::declared::<__OnefillDefault>()
                }
            },
            &__ONEFILL_SITE,
            |builder| builder.ttl(::core::time::Duration::from_millis(300000u64)),
        )
        .await
    {
        ::core::result::Result::Ok(cache) => cache,
        ::core::result::Result::Err(error) => return <__OnefillReturn as ::onefill::__private::Returns<::onefill::__private::Value>>::answer(
            ::core::result::Result::Err(error),
            &__ONEFILL_SITE,
        ),
    };
    // The body, as the loader of one `get_or_load`.
    let __onefill_found = __onefill_cache
        .get_or_load(
            &*__onefill_key,
            move |_: ::std::string::String| async move {
                #[allow(unused_variables)]
                let pool: &Pool = ::std::borrow::Borrow::borrow(&pool);
                ::onefill::__private::body::<__OnefillReturn, _>(async move { pool.user(id).await })
                    .await
            },
        )
        .await;
    // `Err(e)` becomes `Err(anyhow::Error::from(e))`.
    <__OnefillReturn as ::onefill::__private::Returns<::onefill::__private::Value>>::answer(
        __onefill_found,
        &__ONEFILL_SITE,
    )
}
