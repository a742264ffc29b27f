//! pycelld's own log (what it did and what went wrong; the audit log is
//! separate): `tracing` events at the configured level (`log_level`, or
//! `PYCELLD_LOG` in `tracing`'s filter syntax). Under systemd, whose
//! journal is then the service's stderr (`JOURNAL_STREAM`), each event goes
//! to the journal with its fields as journal fields (`RUN_ID`, `PEER_UID`,
//! `POLICY`, `LAYER`, ...), so `journalctl -u pycelld RUN_ID=r-...` finds a
//! run's lines; elsewhere, one formatted line per event on stderr.

use std::os::fd::AsFd;
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Filter directives that replace the configured level.
pub const LOG_ENV: &str = "PYCELLD_LOG";
/// systemd's `DEV:INODE` of the journal stream it gave a service.
pub const JOURNAL_ENV: &str = "JOURNAL_STREAM";
/// The target of audit lines sent to the journal (always enabled).
pub const AUDIT_TARGET: &str = "pycelld_audit";

/// How much pycelld logs (`log_level` in pycelld.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const NAMES: [&'static str; 5] = ["error", "warn", "info", "debug", "trace"];

    pub fn parse(s: &str) -> Option<LogLevel> {
        use LogLevel::*;
        let i = Self::NAMES.iter().position(|n| *n == s)?;
        Some([Error, Warn, Info, Debug, Trace][i])
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// The filter: `PYCELLD_LOG`'s directives if set, else `level` for
/// everything; audit lines are never filtered out.
pub fn directives(env: Option<&str>, level: LogLevel) -> String {
    let base = env
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .unwrap_or(level.as_str());
    format!("{base},{AUDIT_TARGET}=info")
}

/// Whether `JOURNAL_STREAM`'s value names the stream whose device and
/// inode numbers are `dev` and `ino`.
pub fn is_journal_stream(value: &str, dev: u64, ino: u64) -> bool {
    value
        .split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        == Some((dev, ino))
}

static TO_JOURNAL: OnceLock<bool> = OnceLock::new();

/// Whether events (and audit lines for stderr) go to the journal.
pub fn to_journal() -> bool {
    TO_JOURNAL.get().copied().unwrap_or(false)
}

/// Set up this process's log with `directives` (see [`directives`]); once.
pub fn init(directives: &str) {
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|e| {
        eprintln!("pycelld: {LOG_ENV}: {e}; logging at info");
        EnvFilter::new("info")
    });
    let journal = stderr_is_journal()
        .then(tracing_journald::layer)
        .and_then(Result::ok)
        .map(|l| {
            l.with_field_prefix(None)
                .with_syslog_identifier("pycelld".to_string())
        });
    let _ = TO_JOURNAL.set(journal.is_some());
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match journal {
        Some(layer) => registry.with(layer).try_init(),
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false),
            )
            .try_init(),
    };
}

fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os(JOURNAL_ENV) else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    is_journal_stream(&value.to_string_lossy(), st.st_dev, st.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives() {
        for name in LogLevel::NAMES {
            assert_eq!(LogLevel::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(LogLevel::parse("verbose"), None);
        assert_eq!(LogLevel::default(), LogLevel::Info);
        assert_eq!(directives(None, LogLevel::Warn), "warn,pycelld_audit=info");
        assert_eq!(
            directives(Some("pycell_daemon::broker=debug"), LogLevel::Warn),
            "pycell_daemon::broker=debug,pycelld_audit=info"
        );
        assert_eq!(
            directives(Some(" "), LogLevel::Error),
            "error,pycelld_audit=info"
        );
    }

    #[test]
    fn the_journal_stream_is_known_by_device_and_inode() {
        assert!(is_journal_stream("8:1234", 8, 1234));
        assert!(!is_journal_stream("8:1234", 8, 1235));
        assert!(!is_journal_stream("8", 8, 1234));
        assert!(!is_journal_stream("x:1234", 8, 1234));
        assert!(!is_journal_stream("", 0, 0));
    }
}
