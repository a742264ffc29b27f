//! `pycell-manpages OUTDIR VERSION`: write pycell(1) and one page per subcommand
//! (pycell-run(1), ...) rendered by clap_mangen from the same `Cli` that the
//! `pycell` binary parses, so the pages cannot drift from the flags.
//!
//! Threat model: none; a build tool that only writes files into OUTDIR.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;

#[allow(dead_code)] // only the command definition is used here
#[path = "../../../mcp/src/cli.rs"]
mod cli;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), Some(version)) = (args.next().map(PathBuf::from), args.next()) else {
        eprintln!("usage: pycell-manpages OUTDIR VERSION");
        return ExitCode::from(2);
    };
    // The pages carry pycell's version, not this tool's.
    let version: &'static str = Box::leak(version.to_string_lossy().into_owned().into_boxed_str());
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("pycell-manpages: creating {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let cmd = cli::Cli::command().version(version);
    // generate_to writes pycell.1 and pycell-<sub>.1 for every visible
    // subcommand, recursively.
    if let Err(e) = clap_mangen::generate_to(cmd, &out) {
        eprintln!("pycell-manpages: writing pages into {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
