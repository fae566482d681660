//! The command line: subcommands and their flags (clap derive).

use clap::{Args, Parser, Subcommand};

/// Largest `--callers`: every caller is a tokio task, and the naive strategy
/// runs one origin load per caller.
pub const MAX_CALLERS: u32 = 100_000;
/// Largest `--instances` (cache instances, i.e. simulated processes).
pub const MAX_INSTANCES: u32 = 1_024;
/// Largest `--load-ms`: one minute.
pub const MAX_LOAD_MS: u64 = 60_000;
/// Longest `--key`, in bytes (the library's default key limit).
pub const MAX_KEY_BYTES: usize = 1_024;

/// Single-flight cache fills across a fleet: demos and tools for onefill.
#[derive(Debug, Parser)]
#[command(name = "onefill", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands. Add new ones here (e.g. `Bench(BenchArgs)`) and dispatch
/// them in `main`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Release a herd of concurrent callers on one cold key and compare naive
    /// cache-aside, in-process coalescing only, and onefill (coalescing plus
    /// the distributed lease); then show why a lease must be released by
    /// token, never by a bare DEL.
    ///
    /// Runs in this process on the embedded MemoryBackend with a simulated
    /// origin that sleeps --load-ms per load. The results table (or JSON with
    /// --json) goes to stdout; progress goes to stderr.
    Demo(DemoArgs),
}

/// Flags of `onefill demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Concurrent callers, all released together on the same cold key.
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=MAX_CALLERS as i64))]
    pub callers: u32,

    /// Cache instances sharing one backend, each standing for one process;
    /// callers are spread over them round-robin. At most --callers.
    #[arg(long, default_value_t = 4, value_name = "M",
          value_parser = clap::value_parser!(u32).range(1..=MAX_INSTANCES as i64))]
    pub instances: u32,

    /// How long one load of the simulated origin takes, in milliseconds.
    #[arg(long, default_value_t = 200, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=MAX_LOAD_MS))]
    pub load_ms: u64,

    /// The cache key the herd asks for (cold at the start of every strategy).
    #[arg(long, default_value = "user:42", value_name = "KEY", value_parser = parse_key)]
    pub key: String,

    /// Print the results as JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,

    /// No progress messages on stderr (errors are still reported).
    #[arg(long, short)]
    pub quiet: bool,
    // Later: `--redis URL` (a shared Redis instead of the embedded backend,
    // with the instances run as worker processes) goes here; see
    // `herd::shared_backend`.
}

impl DemoArgs {
    /// Checks the constraints between flags that clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.instances > self.callers {
            return Err(format!(
                "--instances ({}) must not exceed --callers ({}): every instance needs at least one caller",
                self.instances, self.callers
            ));
        }
        Ok(())
    }
}

fn parse_key(key: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("the key must not be empty".to_owned());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes long; at most {MAX_KEY_BYTES} bytes are allowed",
            key.len()
        ));
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn instances_may_not_exceed_callers() {
        let cli = Cli::try_parse_from(["onefill", "demo", "--callers", "3", "--instances", "4"])
            .expect("parses");
        let Command::Demo(args) = cli.command;
        assert!(args.validate().is_err());
        let cli = Cli::try_parse_from(["onefill", "demo"]).expect("parses");
        let Command::Demo(args) = cli.command;
        assert_eq!((args.callers, args.instances, args.load_ms), (200, 4, 200));
        assert!(args.validate().is_ok());
    }

    #[test]
    fn out_of_range_flags_are_rejected() {
        for bad in [
            &["--callers", "0"][..],
            &["--instances", "0"],
            &["--load-ms", "0"],
            &["--load-ms", "60001"],
            &["--key", ""],
            &["--callers", "-5"],
        ] {
            let argv = ["onefill", "demo"].iter().chain(bad.iter());
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }
}
