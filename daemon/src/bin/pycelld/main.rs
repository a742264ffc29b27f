//! `pycelld`: the pycell daemon. Started as root (normally by systemd), it
//! runs the monitor, which starts the unprivileged broker as the configured
//! user by running this executable again with the internal `--broker` flag
//! (its link to the monitor as stdin); it runs this executable with the
//! internal `--job` flag for work it must not wait for itself (building an
//! env, the start-up self-check). The command line is defined in
//! `cli.rs`, from which packaging/manpages also renders pycelld(8).
#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;

use clap::Parser;
use pycell_daemon::config::{Config, DEFAULT_CONFIG};
use pycell_daemon::logging;

fn main() {
    // Usage errors exit with status 2 (clap's), like a bad configuration.
    let cli = cli::Cli::parse();
    if let Some(job) = cli.job {
        std::process::exit(pycell_daemon::monitor::jobs::main(&job));
    }
    if cli.broker {
        // The broker gets its configuration from the monitor.
        std::process::exit(pycell_daemon::broker::main(
            cli.allowed_gids.unwrap_or_default(),
        ));
    }
    // A missing default file means built-in defaults; a missing file named
    // with --config is an error.
    let explicit = cli.config.is_some();
    let path = cli.config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let env = std::env::var(logging::LOG_ENV).ok();
    let config = match Config::load(&path, explicit) {
        Ok(c) => c,
        Err(e) => {
            logging::init(&logging::directives(env.as_deref(), Default::default()));
            tracing::error!("{e}");
            std::process::exit(2);
        }
    };
    logging::init(&logging::directives(env.as_deref(), config.log_level));
    if let Err(e) = pycell_daemon::monitor::run(config, &path) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// The help text names the same default file and socket as the code.
    #[test]
    fn help_matches_defaults() {
        let cmd = cli::Cli::command();
        let config = cmd
            .get_arguments()
            .find(|a| a.get_id() == "config")
            .expect("--config");
        for help in [config.get_help(), config.get_long_help()] {
            let help = help.expect("--config has help").to_string();
            assert!(help.contains(DEFAULT_CONFIG), "{help}");
        }
        let about = cmd.get_long_about().expect("long_about").to_string();
        assert!(about.contains(DEFAULT_CONFIG), "{about}");
        let socket = Config::default().socket;
        assert!(about.contains(&*socket.to_string_lossy()), "{about}");
    }
}
