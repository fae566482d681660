//! Flags of `onefill demo`.

use clap::Args;

use crate::shared::args::{parse_key, MAX_CALLERS, MAX_LOAD_MS};

/// Largest `--instances` (cache instances, i.e. simulated processes).
pub const MAX_INSTANCES: u32 = 1_024;

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

    /// Run the herd against this Redis instead of the embedded backend, with
    /// --instances real worker processes (each --callers / --instances
    /// callers), and report the Redis commands each strategy cost.
    ///
    /// It writes under a fresh `fleet-<random>` namespace per strategy: the
    /// key's value (10-minute TTL), the lease (with its TTL) and a load
    /// counter (deleted after the run; 6-hour TTL if the run is cut short).
    /// It reads INFO commandstats before and after each strategy and never
    /// resets the server's statistics.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::args::parse_flags;

    #[test]
    fn instances_may_not_exceed_callers() {
        let args: DemoArgs = parse_flags(&["--callers", "3", "--instances", "4"]).expect("parses");
        assert!(args.validate().is_err());
        let args: DemoArgs = parse_flags(&[]).expect("parses");
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
            assert!(parse_flags::<DemoArgs>(bad).is_err(), "{bad:?} accepted");
        }
    }
}
