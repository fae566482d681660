//! `onefill`: the command-line face of the onefill library.
//!
//! Subcommands: `demo` (a thundering herd on one cold key under three
//! strategies, then the unsafe-release lesson; `--redis URL` runs it with
//! real worker processes), `fleet` (worker processes against Redis, herd or
//! steady load, measured), and the hidden `worker` (one fleet process).
//! A new subcommand is a variant of [`cli::Command`] plus a folder under
//! `commands/`; what several commands use lives in `shared/`.
//!
//! The files form layers that only look down: `main` → `cli` → `commands`
//! → `shared`. A command's files import their siblings below them and
//! `shared`, never the file that declares them nor the command line;
//! `demo --redis` reaches into `fleet` only for its flags and its run.

mod cli;
mod commands;
mod shared;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::commands::demo::command as demo;
use crate::commands::fleet::command as fleet;
use crate::commands::fleet::worker::process as worker;
use crate::shared::output::{describe, is_broken_pipe};

/// Exit status for arguments that parse but do not make sense together
/// (clap itself uses the same code for the errors it detects).
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(args) => {
            if let Err(message) = args.validate() {
                eprintln!("error: {message}\n\nFor more information, try 'onefill demo --help'.");
                return ExitCode::from(USAGE_ERROR);
            }
            demo::run(args)
        }
        Command::Fleet(args) => fleet::run_command(args),
        Command::Worker(args) => return worker::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Whoever read stdout stopped reading (`| head`): they had what
        // they wanted, nothing went wrong.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}
