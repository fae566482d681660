//! What the expansion of `#[onefill::cached]` calls: each function's cache
//! slot (built at its first call on the default backend), its key, and how
//! a cache call's result becomes the function's answer. Public for the
//! expansion only (as `onefill::__private`), not an API.

use std::convert::Infallible;
use std::fmt::{self, Display, Write};
use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};

use futures_util::FutureExt;

use super::*;
use crate::error::{InputError, IntoLoaderError};

/// The key of a function whose arguments are all left out of it.
pub const NO_ARGUMENTS_KEY: &str = "()";

/// The placeholder of a crate that declared no default backend.
pub mod missing {
    /// Found when the crate root has no `default_backend!`.
    pub enum __OnefillDefault {}
}

/// What `default_backend!` implements at the crate root.
#[diagnostic::on_unimplemented(
    message = "`#[onefill::cached]` without `cache = …` needs a default backend, and this crate declares none",
    label = "this function's cache would be built on the crate's default backend",
    note = "declare it once, at the crate root: `onefill::default_backend!(onefill::MemoryBackend::new());` (or `onefill::DefaultBackend::redis_from_env()`, or `onefill::DefaultBackend::set_at_start()` and `onefill::set_default_backend(…)` in `main`)",
    note = "or give the function a cache of yours: `#[onefill::cached(cache = USERS)]`"
)]
pub trait DeclaredDefault {
    /// Where the declared backend is kept once resolved.
    fn slot() -> &'static DeclaredSlot;
    /// The declaration.
    fn source() -> DefaultBackend;
}

/// A declared default, resolved once.
pub struct DeclaredSlot(tokio::sync::OnceCell<Resolved>);

impl DeclaredSlot {
    /// Not resolved yet.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        DeclaredSlot(tokio::sync::OnceCell::const_new())
    }
}

/// A crate's declaration, as the expansion hands it over.
#[derive(Clone, Copy)]
pub struct Declared {
    slot: &'static DeclaredSlot,
    source: fn() -> DefaultBackend,
}

/// The declaration of the crate root (whose bound says what to do
/// when there is none).
pub fn declared<D: DeclaredDefault>() -> Declared {
    Declared {
        slot: D::slot(),
        source: D::source,
    }
}

impl Declared {
    async fn resolve(self) -> Result<Resolved, Error> {
        self.slot
            .0
            .get_or_try_init(|| resolve((self.source)()))
            .await
            .cloned()
    }
}

pub use super::site::Site;

/// The cache of an async function without `cache = …`.
pub struct AsyncSlot<V>(tokio::sync::OnceCell<Cache<String, V>>);

impl<V> AsyncSlot<V> {
    /// Not built yet.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        AsyncSlot(tokio::sync::OnceCell::const_new())
    }
}

impl<V> AsyncSlot<V>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    /// The cache, built at the first call (once: callers of the first
    /// moment wait for that one build).
    #[inline]
    pub async fn cache(
        &'static self,
        declared: Declared,
        site: &Site,
        setup: impl FnOnce(CacheBuilder<String, V>) -> CacheBuilder<String, V>,
    ) -> Result<&'static Cache<String, V>, Error> {
        if let Some(cache) = self.0.get() {
            return Ok(cache);
        }
        self.0
            .get_or_try_init(|| async move { build(&declared.resolve().await?, site, setup) })
            .await
    }
}

/// The cache of a synchronous function without `cache = …`.
pub struct BlockingSlot<V> {
    cache: OnceLock<BlockingCache<String, V>>,
    building: Mutex<()>,
}

impl<V> BlockingSlot<V> {
    /// Not built yet.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        BlockingSlot {
            cache: OnceLock::new(),
            building: Mutex::new(()),
        }
    }
}

impl<V> BlockingSlot<V>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    /// The cache, built at the first call, on the runtime the backend
    /// lives in or the default's own.
    #[inline]
    pub fn cache(
        &'static self,
        declared: Declared,
        site: &Site,
        setup: impl FnOnce(CacheBuilder<String, V>) -> CacheBuilder<String, V>,
    ) -> Result<&'static BlockingCache<String, V>, Error> {
        if let Some(cache) = self.cache.get() {
            return Ok(cache);
        }
        // A panic in `setup` (the attribute's expressions) leaves
        // nothing half-built behind the lock.
        let _building = self.building.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = self.cache.get() {
            return Ok(cache);
        }
        // Ready at once unless Redis must be connected (or another
        // declaration is being resolved): then on the own runtime.
        let resolved = match declared.resolve().now_or_never() {
            Some(resolved) => resolved?,
            None => own_runtime()
                .map_err(Error::Config)?
                .run(declared.resolve())??,
        };
        let driver = match &resolved.home {
            Some(home) => home.clone(),
            None => own_runtime().map_err(Error::Config)?.clone(),
        };
        let cache = build(&resolved, site, setup)?;
        let blocking = cache
            .blocking_on(driver.handle().clone())
            .map_err(Error::Config)?;
        Ok(self.cache.get_or_init(|| blocking))
    }
}

/// The three return types, as types (see `Returns`).
pub enum Value {}
/// `Result<Option<T>, E>`.
pub enum Optional {}
/// `Option<T>`.
pub enum OptionOnly {}

/// What a cached function returns, by form: the value type its cache
/// holds, and how a cache call's result becomes the function's answer.
#[diagnostic::on_unimplemented(
    message = "a `#[onefill::cached]` function cannot return `{Self}`",
    label = "what the function returns is what is cached",
    note = "return `Result<T, E>` (a value), `Result<Option<T>, E>` (a value, or its cached absence) or `Option<T>`",
    note = "the form is read from the return type as written: spell `Option<…>` out, not through an alias"
)]
pub trait Returns<Form>: Sized {
    /// The cache's value type.
    type Value;
    /// What the cache call answers.
    type Found;
    /// The function's answer.
    fn answer(found: Result<Self::Found, Error>, site: &Site) -> Self;
}

/// The error type of a cached function.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of a `#[onefill::cached]` function",
    label = "needs `From<onefill::Error>` (to carry the cache's own errors) and `Send + Sync + 'static` (the body runs detached)",
    note = "`anyhow::Error` and `Box<dyn std::error::Error + Send + Sync>` work as they are",
    note = "give an error enum of yours a variant for the cache's errors, e.g. with thiserror: `#[error(transparent)] Cache(#[from] onefill::Error)`"
)]
pub trait CachedError: From<Error> + IntoLoaderError {}

impl<E: From<Error> + IntoLoaderError> CachedError for E {}

impl<T, E: CachedError> Returns<Value> for Result<T, E> {
    type Value = T;
    type Found = T;
    #[inline]
    fn answer(found: Result<T, Error>, _: &Site) -> Self {
        found.map_err(E::from)
    }
}

impl<T, E: CachedError> Returns<Optional> for Result<Option<T>, E> {
    type Value = T;
    type Found = Option<T>;
    #[inline]
    fn answer(found: Result<Option<T>, Error>, _: &Site) -> Self {
        found.map_err(E::from)
    }
}

/// `None` for the cache's own errors too, which an `Option` cannot
/// tell apart: each is logged at warn.
impl<T> Returns<OptionOnly> for Option<T> {
    type Value = T;
    type Found = Option<T>;
    #[inline]
    fn answer(found: Result<Option<T>, Error>, site: &Site) -> Self {
        found.unwrap_or_else(|error| {
            tracing::warn!(
                function = %site,
                %error,
                "a cached function returning `Option` answers None: its cache failed"
            );
            None
        })
    }
}

/// The body, typed as the function's answer (so `?` and `return` in it
/// mean what they meant).
#[inline]
pub fn body<R, F: Future<Output = R>>(body: F) -> F {
    body
}

/// The answer of an `Option` function's loader, which cannot fail.
#[inline]
pub fn infallible<T>(value: T) -> Result<T, Infallible> {
    Ok(value)
}

/// A type that may be part of a key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of a cache key: it does not implement `Display`",
    label = "an argument of this `#[onefill::cached]` function, so part of its key",
    note = "leave it out of the key: `skip(name)`, or a `key = \"…\"` that does not name it",
    note = "or implement `Display` for it: its string form is the key's part"
)]
pub trait KeyPart {
    /// Writes the part.
    fn fmt_part(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: Display + ?Sized> KeyPart for T {
    #[inline]
    fn fmt_part(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Display::fmt(self, f)
    }
}

/// A key part, as it displays, unescaped. (The part's `fmt` is taken
/// where its bound is checked, so this displays whatever `T` is: a
/// type without `Display` is one error, the bound's, not two.)
pub struct Whole<'a, T: ?Sized> {
    part: &'a T,
    fmt: fn(&T, &mut fmt::Formatter<'_>) -> fmt::Result,
}

/// A key part, unescaped (what [`only`] and [`escaped`] escape).
#[inline]
pub fn whole<T: KeyPart + ?Sized>(part: &T) -> Whole<'_, T> {
    Whole {
        part,
        fmt: T::fmt_part,
    }
}

impl<T: ?Sized> Display for Whole<'_, T> {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.fmt)(self.part, f)
    }
}

/// The key of a function with one argument in it, when that argument
/// displays as nothing: a key cannot be empty, and no other argument's
/// key is a lone `%` (`Only` escapes each `%` it writes).
pub const EMPTY_ARGUMENT_KEY: &str = "%";

/// The argument alone in the key: as it displays, `%` escaped (`%25`),
/// and an empty one as [`EMPTY_ARGUMENT_KEY`].
pub struct Only<'a, T: ?Sized>(Whole<'a, T>);

/// The argument alone in the key.
#[inline]
pub fn only<T: KeyPart + ?Sized>(part: &T) -> Only<'_, T> {
    Only(whole(part))
}

impl<T: ?Sized> Display for Only<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Escaping {
            out: f,
            colons: false,
            wrote: false,
        };
        write!(out, "{}", self.0)?;
        if out.wrote {
            Ok(())
        } else {
            f.write_str(EMPTY_ARGUMENT_KEY)
        }
    }
}

/// One of several parts: `%` and `:` escaped (`%25`, `%3A`), so the
/// parts joined by `:` name one tuple of arguments only.
pub struct Escaped<'a, T: ?Sized>(Whole<'a, T>);

/// An argument among several in the key.
#[inline]
pub fn escaped<T: KeyPart + ?Sized>(part: &T) -> Escaped<'_, T> {
    Escaped(whole(part))
}

impl<T: ?Sized> Display for Escaped<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Escaping {
            out: f,
            colons: true,
            wrote: false,
        };
        write!(out, "{}", self.0)
    }
}

/// A key part's text on its way to the key: `%` escaped, `:` too when
/// `colons`, and whether anything was written.
struct Escaping<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    colons: bool,
    wrote: bool,
}

impl Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.wrote |= !s.is_empty();
        let mut run = 0;
        for (at, byte) in s.bytes().enumerate() {
            let escaped = match byte {
                b'%' => "%25",
                b':' if self.colons => "%3A",
                _ => continue,
            };
            self.out.write_str(&s[run..at])?;
            self.out.write_str(escaped)?;
            run = at + 1;
        }
        self.out.write_str(&s[run..])
    }
}

/// The key, or [`InputError::KeyDisplay`] if a part's `Display` failed.
#[inline]
pub fn key_fmt(args: fmt::Arguments<'_>) -> Result<String, Error> {
    let mut key = String::new();
    key.write_fmt(args)
        .map_err(|_| Error::InvalidInput(InputError::KeyDisplay))?;
    Ok(key)
}

/// The key of a function whose arguments are all left out of it.
#[inline]
pub fn no_key() -> Result<String, Error> {
    Ok(NO_ARGUMENTS_KEY.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;

    /// A crate's declaration, as `default_backend!` makes it.
    enum Declaration {}

    impl DeclaredDefault for Declaration {
        fn slot() -> &'static DeclaredSlot {
            static SLOT: DeclaredSlot = DeclaredSlot::new();
            &SLOT
        }
        fn source() -> DefaultBackend {
            MemoryBackend::new().into()
        }
    }

    const SITE: Site = Site::new("tests", "f", None, || "tests::f::__onefill_here");

    /// Each function's cache is built once: its L1, its flights and its
    /// stats are the function's, not a call's.
    #[tokio::test]
    async fn a_function_has_one_cache() {
        static SLOT: AsyncSlot<u64> = AsyncSlot::new();
        let first = SLOT
            .cache(declared::<Declaration>(), &SITE, |b| b)
            .await
            .unwrap();
        let again = SLOT
            .cache(declared::<Declaration>(), &SITE, |b| b)
            .await
            .unwrap();
        assert!(std::ptr::eq(first, again));
        assert_eq!(first.namespace(), "tests::f");
    }

    #[test]
    fn a_plain_function_has_one_cache() {
        static SLOT: BlockingSlot<u64> = BlockingSlot::new();
        let first = SLOT.cache(declared::<Declaration>(), &SITE, |b| b).unwrap();
        let again = SLOT.cache(declared::<Declaration>(), &SITE, |b| b).unwrap();
        assert!(std::ptr::eq(first, again));
    }

    /// The options' builder calls are the cache's: one out of range makes
    /// every call fail with the build's error, typed.
    #[tokio::test]
    async fn a_bad_option_is_a_config_error() {
        static SLOT: AsyncSlot<u64> = AsyncSlot::new();
        let built = SLOT
            .cache(declared::<Declaration>(), &SITE, |b| b.jitter(2.0))
            .await;
        assert!(
            matches!(
                built,
                Err(Error::Config(ConfigError::Option {
                    option: "jitter",
                    ..
                }))
            ),
            "{built:?}"
        );
    }

    #[test]
    fn several_parts_are_escaped_one_is_not() {
        let one = key_fmt(format_args!("{}", only("a:b%"))).unwrap();
        assert_eq!(one, "a:b%25", "one part: only `%` escaped");
        let empty = key_fmt(format_args!("{}", only(""))).unwrap();
        assert_eq!(empty, EMPTY_ARGUMENT_KEY, "a key is never empty");
        let percent = key_fmt(format_args!("{}", only("%"))).unwrap();
        assert_ne!(percent, empty);
        let two = key_fmt(format_args!("{}:{}", escaped("a:b"), escaped(&7))).unwrap();
        assert_eq!(two, "a%3Ab:7");
        let left = key_fmt(format_args!("{}:{}", escaped("a:b"), escaped("c"))).unwrap();
        let right = key_fmt(format_args!("{}:{}", escaped("a"), escaped("b:c"))).unwrap();
        assert_ne!(left, right);
        let percent = key_fmt(format_args!("{}", escaped("100%"))).unwrap();
        assert_eq!(percent, "100%25");
    }

    #[test]
    fn a_failing_display_is_an_error_not_a_panic() {
        struct Broken;
        impl std::fmt::Display for Broken {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                Err(std::fmt::Error)
            }
        }
        assert!(key_fmt(format_args!("{}", whole(&Broken))).is_err());
    }
}
