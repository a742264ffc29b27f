//! `pycelld`: the pycell daemon. Started as root (normally by systemd), it
//! runs the monitor and starts the unprivileged broker (`--broker`, an
//! internal mode) as the configured user.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use pycell_daemon::config::{Config, DEFAULT_CONFIG};

const USAGE: &str = "usage: pycelld [--config FILE]\n\nServes pycell sandbox runs on a Unix socket (see docs/protocol.md).\nConfiguration: /etc/pycell/pycelld.toml (missing file = defaults).";

fn main() {
    let mut args = std::env::args().skip(1);
    let mut config_path: Option<PathBuf> = None;
    let mut broker = false;
    let (mut listen_fd, mut monitor_fd, mut audit_fd) = (None, None, None);
    let mut allowed_gids = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" => config_path = args.next().map(PathBuf::from),
            "--broker" => broker = true,
            "--listen-fd" => listen_fd = args.next().and_then(|s| s.parse().ok()),
            "--monitor-fd" => monitor_fd = args.next().and_then(|s| s.parse().ok()),
            "--audit-fd" => audit_fd = args.next().and_then(|s| s.parse().ok()),
            "--allowed-gids" => {
                allowed_gids = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect()
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            "-V" | "--version" => {
                println!("pycelld {}", env!("CARGO_PKG_VERSION"));
                return;
            }
            other => {
                eprintln!("pycelld: unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let explicit = config_path.is_some();
    let path = config_path.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let config = match Config::load(&path, explicit) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pycelld: {e}");
            std::process::exit(2);
        }
    };
    if broker {
        let (Some(l), Some(m)) = (listen_fd, monitor_fd) else {
            eprintln!("pycelld: --broker is internal (started by the monitor)");
            std::process::exit(2);
        };
        std::process::exit(pycell_daemon::broker::main(
            config,
            l,
            m,
            audit_fd,
            allowed_gids,
        ));
    }
    if let Err(e) = pycell_daemon::monitor::run(config, &path) {
        eprintln!("pycelld: {e}");
        std::process::exit(1);
    }
}
