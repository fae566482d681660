//! Where a `#[onefill::cached]` function is, and so the namespace of the
//! cache the attribute builds for it: the function's path.
//!
//! `module_path!()` and the function's name are not enough: two associated
//! functions of the same name (`Users::get`, `Orders::get`), two trait
//! implementations (`<A as Load>::load`, `<B as Load>::load`) or two nested
//! functions may share a module and a name, and so would share one
//! namespace and each other's values. The expansion therefore declares an
//! item in the function's body, whose type name the compiler writes with
//! the function's full path (`app::Users::get::__onefill_here`).

use std::borrow::Cow;
use std::fmt::{self, Display};

/// The item the expansion declares in the function's body; its type name
/// ends with this.
const MARKER: &str = "::__onefill_here";

/// Where a cached function is: its default namespace, and its name in
/// warnings.
pub struct Site {
    module: &'static str,
    function: &'static str,
    namespace: Option<&'static str>,
    /// The type name of the item declared in the function's body.
    here: fn() -> &'static str,
}

impl Site {
    /// `module_path!()`, the function's name, `namespace = …`, and the
    /// type name of an item declared in the function's body.
    pub const fn new(
        module: &'static str,
        function: &'static str,
        namespace: Option<&'static str>,
        here: fn() -> &'static str,
    ) -> Self {
        Site {
            module,
            function,
            namespace,
            here,
        }
    }

    /// The function's path: `app::users::user` for a function of a
    /// module; with its type, trait or enclosing function for the others
    /// (`app::users::Users::get`, `<app::A as app::Load>::load`,
    /// `app::outer::inner`), as the compiler names them.
    ///
    /// Rust does not promise how `type_name` writes a path, so the
    /// compiler's is taken only when it has the expected shape (ends with
    /// the function's name, no braces left), else `module::function`; a
    /// function of a module keeps `module::function` whatever it writes.
    fn path(&self) -> Cow<'static, str> {
        match compilers_path(self.module, self.function, (self.here)()) {
            Some(path) => Cow::Owned(path),
            None => Cow::Owned(format!("{}::{}", self.module, self.function)),
        }
    }

    /// `namespace = …`, else the function's path (`app::users::user`),
    /// cut to onefill's 256 bytes with a hash of the whole kept.
    pub(super) fn namespace(&self) -> Cow<'static, str> {
        const MAX: usize = 256;
        if let Some(given) = self.namespace {
            return Cow::Borrowed(given);
        }
        let path = self.path();
        if path.len() <= MAX {
            return path;
        }
        // FNV-1a: stable across builds and releases (std's hashers
        // promise neither), so a namespace never moves.
        let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut cut = MAX - 17;
        while !path.is_char_boundary(cut) {
            cut -= 1;
        }
        Cow::Owned(format!("{}~{hash:016x}", &path[..cut]))
    }
}

impl Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}

/// The function's path from the type name of the item in its body, when
/// it is not simply `module::function` and has the expected shape.
fn compilers_path(module: &str, function: &str, type_name: &str) -> Option<String> {
    let name = function.strip_prefix("r#").unwrap_or(function);
    let named = type_name.strip_suffix(MARKER)?;
    // An `async fn`'s body (and a closure) is `{{closure}}` in the path:
    // not part of where the function is.
    let mut path = String::with_capacity(named.len());
    let mut rest = named;
    while let Some(at) = rest.find("::{{") {
        path.push_str(&rest[..at]);
        let end = rest[at..].find("}}")?;
        rest = &rest[at + end + 2..];
    }
    path.push_str(rest);
    let parent = path.strip_suffix(name)?.strip_suffix("::")?;
    if parent == module || path.contains(['{', '}']) {
        return None;
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(module: &'static str, function: &'static str, here: fn() -> &'static str) -> Site {
        Site::new(module, function, None, here)
    }

    #[test]
    fn a_module_function_is_its_module_and_name() {
        let free = site("app::users", "user", || "app::users::user::__onefill_here");
        assert_eq!(free.namespace(), "app::users::user");
        let in_async = site("app", "user", || "app::user::{{closure}}::__onefill_here");
        assert_eq!(in_async.namespace(), "app::user");
        let raw = site("app", "r#type", || "app::type::__onefill_here");
        assert_eq!(raw.namespace(), "app::r#type");
        let given = Site::new("app", "user", Some("users"), || "app::user::__onefill_here");
        assert_eq!(given.namespace(), "users");
    }

    #[test]
    fn other_functions_have_their_type_or_enclosing_function() {
        let users = site("app", "get", || "app::Users::get::__onefill_here");
        let orders = site("app", "get", || "app::Orders::get::__onefill_here");
        assert_eq!(users.namespace(), "app::Users::get");
        assert_eq!(orders.namespace(), "app::Orders::get");
        let traited = site("app", "load", || {
            "<app::A as app::Load>::load::{{closure}}::__onefill_here"
        });
        assert_eq!(traited.namespace(), "<app::A as app::Load>::load");
        let nested = site("app", "inner", || {
            "app::outer::{{closure}}::inner::__onefill_here"
        });
        assert_eq!(nested.namespace(), "app::outer::inner");
        assert_eq!(users.to_string(), "app::Users::get", "warnings name it so");
    }

    #[test]
    fn an_unexpected_type_name_falls_back_to_module_and_name() {
        for odd in [
            "something else",
            "app::get::{{fn}}::__onefill_here",
            "app::{{unclosed::__onefill_here",
            "app::Users::got::__onefill_here",
            "app::Usersget::__onefill_here",
        ] {
            assert_eq!(compilers_path("app", "get", odd), None, "{odd}");
        }
        let free = site("app", "get", || "something else");
        assert_eq!(free.namespace(), "app::get");
    }

    #[test]
    fn namespaces_stay_within_the_limit() {
        let long: &'static str = Box::leak("m::".repeat(100).into_boxed_str());
        let here = || "";
        let a = site(long, "a", here).namespace();
        let b = site(long, "b", here).namespace();
        assert_eq!(a.len(), 256);
        assert_ne!(a, b, "two long paths keep distinct namespaces");
        assert!(crate::key::validate_namespace(&a).is_ok());
    }
}
