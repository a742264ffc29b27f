//! `pycell-manpages MANDIR VERSION`: write pycell(1) and one page per
//! subcommand (pycell-run(1), ...) into MANDIR/man1, and pycelld(8) into
//! MANDIR/man8, rendered by clap_mangen from the same `Cli` definitions that
//! the `pycell` and `pycelld` binaries parse, so the pages cannot drift from
//! the flags.
//!
//! Threat model: none; a build tool that only writes files into MANDIR.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};
use clap_mangen::Man;

#[allow(dead_code)] // only the command definition is used here
#[path = "../../../cli/src/cli.rs"]
mod cli;

/// The flags of `pycell mcp`, `mcp-token` and `gateway`, which `cli.rs`
/// names as `crate::mcp_args` (in pycell, `pycell_mcp::args`).
#[allow(dead_code)]
#[path = "../../../mcp/src/args.rs"]
mod mcp_args;

#[allow(dead_code)] // only the command definition is used here
#[path = "../../../daemon/src/bin/pycelld/cli.rs"]
mod pycelld_cli;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(mandir), Some(version)) = (args.next().map(PathBuf::from), args.next()) else {
        eprintln!("usage: pycell-manpages MANDIR VERSION");
        return ExitCode::from(2);
    };
    // The pages carry pycell's version, not this tool's.
    let version: &'static str = Box::leak(version.to_string_lossy().into_owned().into_boxed_str());
    let (man1, man8) = (mandir.join("man1"), mandir.join("man8"));
    for dir in [&man1, &man8] {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("pycell-manpages: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let cmd = cli::Cli::command().version(version);
    // generate_to writes pycell.1 and pycell-<sub>.1 for every visible
    // subcommand, recursively.
    if let Err(e) = clap_mangen::generate_to(cmd, &man1) {
        eprintln!(
            "pycell-manpages: writing pages into {}: {e}",
            man1.display()
        );
        return ExitCode::FAILURE;
    }
    let path = man8.join("pycelld.8");
    if let Err(e) = write_pycelld(&path, version) {
        eprintln!("pycell-manpages: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// pycelld(8): clap_mangen's sections (the hidden internal flags stay out of
/// SYNOPSIS and OPTIONS), then the ones a daemon's page needs that are not
/// part of its command line.
fn write_pycelld(path: &Path, version: &'static str) -> std::io::Result<()> {
    let mut cmd = pycelld_cli::Cli::command().version(version);
    cmd.build(); // adds --help and --version
    let synopsis = synopsis(&cmd);
    // Section 8: system administration commands and daemons. The footer
    // names the package, as pycell's pages do.
    let man = Man::new(cmd)
        .section("8")
        .source(format!("pycell {version}"));
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    synopsis.to_writer(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    daemon_sections().to_writer(&mut page)?;
    man.render_version_section(&mut page)?;
    let mut file = std::fs::File::create(path)?;
    file.write_all(&page)?;
    file.flush()
}

/// SYNOPSIS with the options' value names (`[--config FILE]`), which
/// clap_mangen's own leaves out. Options only: pycelld takes no operands.
fn synopsis(cmd: &clap::Command) -> Roff {
    let mut line = vec![bold(cmd.get_name())];
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        assert!(!arg.is_positional(), "synopsis() renders options only");
        line.push(roman(" ["));
        if let Some(short) = arg.get_short() {
            line.push(bold(format!("-{short}")));
            line.push(roman("|"));
        }
        if let Some(long) = arg.get_long() {
            line.push(bold(format!("--{long}")));
        }
        if arg.get_action().takes_values() {
            let value = arg
                .get_value_names()
                .map(|v| v.join(" "))
                .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
            line.push(roman(" "));
            line.push(italic(value));
        }
        line.push(roman("]"));
    }
    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]);
    r.text(line);
    r
}

/// FILES, SIGNALS, EXIT STATUS and SEE ALSO of pycelld(8). What they state
/// lives in daemon/ (config.rs, monitor.rs, bin/pycelld/main.rs); keep them
/// in step.
fn daemon_sections() -> Roff {
    let mut r = Roff::new();
    let entry = |r: &mut Roff, path: &str, text: Vec<Inline>| {
        r.control("TP", []);
        r.text([italic(path)]);
        r.text(text);
    };
    r.control("SH", ["FILES"]);
    entry(
        &mut r,
        "/etc/pycell/pycelld.toml",
        vec![roman(
            "The configuration: socket path, socket group and mode, broker user, \
             allowed groups and uids, sandbox uid range, concurrency limits, \
             shutdown grace, audit log, policy directory, cgroup parent. Every key \
             is documented in the file. Unknown keys are errors, reported with \
             file, line, column and key.",
        )],
    );
    entry(
        &mut r,
        "/etc/pycell/policies/*.toml",
        vec![roman("Sandbox policies, selected by name.")],
    );
    entry(
        &mut r,
        "/run/pycell/pycell.sock",
        vec![roman(
            "The client socket, unless the configuration's socket key names another.",
        )],
    );
    entry(
        &mut r,
        "/run/pycell/uids/",
        vec![
            roman("Leases of sandbox uids (shared with embedded "),
            bold("pycell run"),
            roman(" as root)."),
        ],
    );
    entry(
        &mut r,
        "/usr/libexec/pycell/pycell-jailer",
        vec![roman(
            "The helper that builds each jail; pycelld's monitor starts one \
             per run (the environment variable PYCELL_JAILER overrides the path).",
        )],
    );

    r.control("SH", ["SIGNALS"]);
    r.text([roman(
        "SIGTERM or SIGINT: stop accepting runs, give runs in flight the \
         shutdown grace, kill what is left, exit.",
    )]);

    r.control("SH", ["EXIT STATUS"]);
    r.text([roman(
        "0 after a clean stop; 1 if the service could not start or failed; \
         2 for a bad command line or configuration.",
    )]);

    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold("pycell"),
        roman("(1), "),
        bold("systemctl"),
        roman("(1), "),
        bold("journalctl"),
        roman("(1), "),
        italic("/usr/share/doc/pycell/install.md.gz"),
        roman(", "),
        italic("/usr/share/doc/pycell/protocol.md.gz"),
    ]);
    r
}
