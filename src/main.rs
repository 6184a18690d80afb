use std::process::ExitCode;

use clap::Parser;
use shardcron::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Check(args) => cli::check(args),
        Command::Next(args) => cli::next(args),
        Command::Run(_) | Command::Status(_) | Command::Dev(_) => {
            Err(anyhow::anyhow!("not built yet"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("shardcron: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
