//! One folder per subcommand, owning its flags, its work and its report.

pub mod demo;
pub mod fleet;
