//! `completions` and `man`: generated from the same definitions that parse the arguments, so
//! they never fall behind them.

use std::io::Write;

use anyhow::Result;
use clap::{Args, CommandFactory};

use super::Cli;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// `completions SHELL`.
pub fn completions(args: &CompletionsArgs) -> Result<()> {
    let mut command = Cli::command();
    // Into memory first: `generate` panics on a failed write, such as to a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "shardcron", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}

/// `man`: the manual page, with a section per subcommand.
pub fn man() -> Result<()> {
    let command = Cli::command();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let page = clap_mangen::Man::new(command.clone());
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        writeln!(out, ".SH \"SHARDCRON {}\"", sub.get_name().to_uppercase())?;
        let sub_page = clap_mangen::Man::new(sub.clone().bin_name(format!("shardcron {}", sub.get_name())));
        sub_page.render_synopsis_section(&mut out)?;
        sub_page.render_description_section(&mut out)?;
        sub_page.render_options_section(&mut out)?;
    }
    page.render_version_section(&mut out)?;
    writeln!(out, ".SH FILES\n.TP\n/etc/shardcron/jobs.toml\nThe jobs, when neither --config nor SHARDCRON_CONFIG names a file and ./config/jobs.toml does not exist.")?;
    out.flush()?;
    Ok(())
}
