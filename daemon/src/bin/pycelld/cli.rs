//! pycelld's command line. It depends on nothing but clap and std:
//! packaging/manpages compiles this file in by `#[path]` to render
//! pycelld(8), so the man page cannot drift from the flags.

use std::path::PathBuf;

use clap::Parser;

/// `pycelld --help`. clap prints this text as written (no `wrap_help`), and
/// clap_mangen turns each line into a line of the man page's DESCRIPTION (an
/// empty line starts a paragraph), so keep it hard-wrapped, without indented
/// layout.
const LONG_ABOUT: &str = "\
pycelld is the pycell daemon: it runs untrusted Python code in sandboxes for
the clients that connect to its Unix socket (default /run/pycell/pycell.sock)
and returns each run's output and result to them. pycell run and pycell mcp
use it whenever that socket exists.

It is started as root, normally by systemd as pycelld.service, with its
socket held by pycelld.socket so that clients wait across restarts
(both installed and enabled by the Debian package). The root process, the
monitor, uses root only where it must: creating the socket when started by
hand, the runs' cgroups, leasing for each sandbox a host uid that belongs
to no account, starting /usr/libexec/pycell/pycell-jailer (which builds
the jail), killing sandboxes and writing the audit log. It starts the
broker, an unprivileged process running as the configured broker_user
(default pycell), which handles everything clients send: the socket, the
protocol, peer checks and the queue of runs waiting for a slot.

Root and members of the pycell group may connect (the socket group; the
configuration can allow more groups and uids). To let a user run code:
usermod -aG pycell USER (effective at their next login).

The configuration file is /etc/pycell/pycelld.toml (see --config); every key
is documented in the file itself. After editing it: systemctl restart
pycelld. The configuration, the wire protocol and the service's lifecycle
are described in docs/protocol.md (installed as
/usr/share/doc/pycell/protocol.md.gz).";

#[derive(Debug, Parser)]
#[command(
    name = "pycelld",
    version,
    about = "The pycell sandbox service: runs untrusted Python for local clients",
    long_about = LONG_ABOUT
)]
pub struct Cli {
    /// Read the configuration from FILE [default: /etc/pycell/pycelld.toml].
    #[arg(
        long,
        value_name = "FILE",
        long_help = "\
Read the configuration from FILE [default: /etc/pycell/pycelld.toml].
If the default file does not exist, pycelld runs with built-in
defaults; a FILE given here must exist. Unknown keys and bad values
are errors, reported with file, line, column and key (exit status 2)."
    )]
    pub config: Option<PathBuf>,

    /// Internal: run as the broker. The monitor starts pycelld this way, as
    /// the broker user, with its link to the monitor as stdin.
    #[arg(long, hide = true)]
    pub broker: bool,

    /// Internal, with --broker: the gids whose members may connect,
    /// comma-separated (resolved by the monitor from the configuration;
    /// empty for none).
    //
    // `std::vec::Vec`, not `Vec`: clap derive would take a plain `Vec<u32>`
    // as a repeatable flag of single u32s; this is one value, parsed whole.
    #[arg(
        long,
        hide = true,
        value_name = "LIST",
        value_parser = parse_gid_list,
        requires = "broker"
    )]
    pub allowed_gids: Option<std::vec::Vec<u32>>,

    /// Internal: do one job for the monitor (build an env, collect envs,
    /// the start-up self-check) and exit. The monitor starts pycelld this
    /// way, as root, with the job as JSON.
    #[arg(long, hide = true, value_name = "JSON", conflicts_with = "broker")]
    pub job: Option<String>,
}

/// `--allowed-gids`: decimal gids separated by commas, the empty string for
/// none. Anything else is an error (naming the bad entry), never dropped.
fn parse_gid_list(s: &str) -> Result<Vec<u32>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|g| match g.parse::<u32>() {
            // Digits only: u32's FromStr would also take "+5".
            Ok(gid) if g.bytes().all(|b| b.is_ascii_digit()) => Ok(gid),
            _ => Err(format!(
                "{g:?} is not a gid (expected comma-separated numbers)"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn gid_lists() {
        assert_eq!(parse_gid_list(""), Ok(vec![]));
        assert_eq!(parse_gid_list("0"), Ok(vec![0]));
        assert_eq!(parse_gid_list("100,4294967295"), Ok(vec![100, 4294967295]));
        for bad in [
            "x",
            "1,x",
            "1,,2",
            "1,",
            ",1",
            " 1",
            "-1",
            "4294967296",
            "1;2",
        ] {
            assert!(parse_gid_list(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn flags() {
        let cli = Cli::try_parse_from(["pycelld"]).unwrap();
        assert!(cli.config.is_none() && !cli.broker && cli.allowed_gids.is_none());
        let cli = Cli::try_parse_from(["pycelld", "--config", "/x.toml"]).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/x.toml")));
        let cli = Cli::try_parse_from([
            "pycelld",
            "--broker",
            "--config",
            "/x.toml",
            "--allowed-gids",
            "5,7",
        ])
        .unwrap();
        assert!(cli.broker);
        assert_eq!(cli.allowed_gids, Some(vec![5, 7]));
        let cli = Cli::try_parse_from(["pycelld", "--broker", "--allowed-gids", ""]).unwrap();
        assert_eq!(cli.allowed_gids, Some(vec![]));
        // Garbage is refused, and the list means nothing without --broker.
        assert!(Cli::try_parse_from(["pycelld", "--broker", "--allowed-gids", "5,x"]).is_err());
        assert!(Cli::try_parse_from(["pycelld", "--allowed-gids", "5"]).is_err());
        // The descriptor flags of the old broker are gone.
        assert!(Cli::try_parse_from(["pycelld", "--broker", "--listen-fd", "3"]).is_err());
        assert!(Cli::try_parse_from(["pycelld", "stray"]).is_err());
    }
}
