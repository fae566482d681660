//! Misuse of `#[onefill::cached]` fails to compile, at the right span, with
//! a message saying what to do: each case in `ui/` with the compiler's
//! output it must give (`.stderr`). One test binary, one trybuild run: the
//! cases share one build of their dependencies.
//!
//! After a deliberate change of a message: `TRYBUILD=overwrite cargo test
//! -p onefill-macros --test ui`, then review the `.stderr` diffs.

#[test]
fn misuse_fails_to_compile_saying_what_to_do() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
