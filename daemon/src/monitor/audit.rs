//! The audit log, written by the root monitor (the broker, which parses
//! untrusted input, cannot reach it): one JSON line when a run starts (who
//! asked, the code's hash, the policy and limits it got, its sandbox uid)
//! and one when its jailer ends (how long, the run's status and exit code
//! as the jailer told the monitor, how the jailer ended, who stopped it);
//! two per env build (who asked for what; what it installed or why it
//! failed); one per tool call and one per connection through a run's
//! egress proxy (host, verdict, bytes), as the broker reports them.
//! The run's output goes to its client only.

use crate::link::{EgressLine, PeerIds};
use pycell_launch::supervisor::StoppedBy;
use std::fs;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pycell_deps::DepsRequest;
use pycell_protocol::result::EnvReport;
use pycell_protocol::result::RunLimits;
use pycell_wire::outcome::Outcome;
use pycell_wire::report::JailFailure;
use sha2::{Digest, Sha256};

use crate::config::AuditSink;

#[derive(Debug)]
pub struct AuditLog {
    sink: Sink,
}

#[derive(Debug)]
enum Sink {
    Off,
    Stderr,
    File(fs::File),
}

/// A run as it starts.
#[derive(Debug)]
pub struct RunStart<'a> {
    pub run_id: &'a str,
    pub peer: &'a PeerIds,
    pub code: &'a str,
    pub policy: &'a str,
    pub limits: &'a RunLimits,
    pub sandbox_uid: u32,
    /// It went to a warm jail of the pool.
    pub warm: bool,
}

/// A run as its jailer ends.
#[derive(Debug)]
pub struct RunEnd<'a> {
    pub run_id: &'a str,
    pub wall: Duration,
    /// The jailer's outcome line, if it wrote one.
    pub outcome: Option<&'a Outcome>,
    /// The jailer's wait status as text (`exited 0`, `killed by SIGKILL`).
    pub jailer: &'a str,
    pub stopped_by: StoppedBy,
}

/// The most requirements or packages an audit line lists.
const MAX_LISTED: usize = 256;

fn cut(s: &str) -> &str {
    let mut end = s.len().min(256);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// How the audit log names who ended a run's jailer early, if anyone.
fn stopped_by_label(by: StoppedBy) -> Option<&'static str> {
    match by {
        StoppedBy::Nobody => None,
        StoppedBy::Request => Some("request"),
        StoppedBy::Deadline => Some("monitor_deadline"),
        StoppedBy::Shutdown => Some("shutdown"),
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl AuditLog {
    /// Open the configured sink (as root, before any client is served).
    pub fn open(sink: &AuditSink) -> std::io::Result<AuditLog> {
        use std::os::unix::fs::OpenOptionsExt;
        let sink = match sink {
            AuditSink::Off => Sink::Off,
            AuditSink::Stderr => Sink::Stderr,
            AuditSink::File(p) => Sink::File(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(p)?,
            ),
        };
        Ok(AuditLog { sink })
    }

    fn write(&mut self, line: serde_json::Value) {
        match &mut self.sink {
            Sink::Off => {}
            // Under systemd: a journal entry whose fields name the run,
            // so `journalctl -u pycelld RUN_ID=...` finds its lines.
            Sink::Stderr if crate::logging::to_journal() => tracing::info!(
                target: crate::logging::AUDIT_TARGET,
                audit_event = line["event"].as_str(),
                run_id = line["run_id"].as_str(),
                peer_uid = line["peer_uid"].as_u64(),
                policy = line["policy"].as_str(),
                "{line}"
            ),
            Sink::Stderr => eprintln!("{line}"),
            // One write per line: O_APPEND keeps lines whole.
            Sink::File(f) => {
                let _ = f.write_all(format!("{line}\n").as_bytes());
            }
        }
    }

    pub fn run_started(&mut self, r: &RunStart<'_>) {
        self.write(serde_json::json!({
            "ts": now(),
            "event": "run_start",
            "run_id": r.run_id,
            "peer_uid": r.peer.uid,
            "peer_gid": r.peer.gid,
            "peer_pid": r.peer.pid,
            "identity": r.peer.identity,
            "policy": r.policy,
            "code_sha256": format!("{:x}", Sha256::digest(r.code.as_bytes())),
            "limits": r.limits,
            "sandbox_uid": r.sandbox_uid,
            "warm": r.warm,
        }));
    }

    /// A run's dependencies are not in the env store: a builder starts.
    /// `key`: the request's key in the store (its requirements, the
    /// policy's interpreter and index); the env built gets a key of its own.
    pub fn env_build_started(
        &mut self,
        key: &str,
        peer: &PeerIds,
        policy: &str,
        deps: &DepsRequest,
    ) {
        self.write(serde_json::json!({
            "ts": now(),
            "event": "env_build_start",
            "request_key": cut(key),
            "peer_uid": peer.uid,
            "peer_gid": peer.gid,
            "peer_pid": peer.pid,
            "identity": peer.identity,
            "policy": policy,
            "requirements": deps.requirements.iter().take(MAX_LISTED).map(|r| cut(r)).collect::<Vec<_>>(),
            "requires_python": deps.requires_python.as_deref().map(cut),
        }));
    }

    /// A builder ended: the env it stored, or why it failed.
    pub fn env_build_ended(
        &mut self,
        key: &str,
        wall: Duration,
        builder: &str,
        outcome: &Result<EnvReport, JailFailure>,
    ) {
        let packages = outcome.as_ref().ok().map(|env| {
            env.packages
                .iter()
                .take(MAX_LISTED)
                .map(|p| format!("{}=={}", cut(&p.name), cut(&p.version)))
                .collect::<Vec<_>>()
        });
        self.write(serde_json::json!({
            "ts": now(),
            "event": "env_build_end",
            "request_key": cut(key),
            "env": outcome.as_ref().ok().map(|env| cut(&env.key)),
            "wall_ms": wall.as_secs_f64() * 1000.0,
            "builder": builder,
            "failure": outcome.as_ref().err().map(|f| f.code.as_str()),
            "message": outcome.as_ref().err().map(|f| cut(&f.message)),
            "packages": packages,
        }));
    }

    /// One connection of a run's egress proxy.
    pub fn egress(&mut self, run_id: &str, c: &EgressLine) {
        self.write(serde_json::json!({
            "ts": now(),
            "event": "egress",
            "run_id": cut(run_id),
            "scheme": cut(&c.scheme),
            "host": cut(&c.host),
            "port": c.port,
            "verdict": cut(&c.verdict),
            "reason": c.reason.as_deref().map(cut),
            "address": c.address.as_deref().map(cut),
            "bytes_in": c.bytes_in,
            "bytes_out": c.bytes_out,
        }));
    }

    /// One tool call of a run's code (code mode).
    pub fn tool_call(&mut self, run_id: &str, c: &pycell_tools::service::CallRecord) {
        self.write(serde_json::json!({
            "ts": now(),
            "event": "tool_call",
            "run_id": cut(run_id),
            "server": cut(&c.server),
            "tool": cut(&c.tool),
            "arguments_sha256": cut(&c.arguments_sha256),
            "status": cut(&c.status),
            "duration_ms": c.duration_ms,
            "bytes_out": c.bytes_out,
            "bytes_in": c.bytes_in,
        }));
    }

    /// A run's jailer was reaped: how the run ended, as its jailer said
    /// (`None` if it was killed before it could), and how the jailer did.
    pub fn run_ended(&mut self, e: &RunEnd<'_>) {
        let outcome = e.outcome;
        self.write(serde_json::json!({
            "ts": now(),
            "event": "run_end",
            "run_id": e.run_id,
            "wall_ms": e.wall.as_secs_f64() * 1000.0,
            "status": outcome.map(|o| o.status.as_str()),
            "exit_code": outcome.and_then(|o| o.exit_code),
            "signal": outcome.and_then(|o| o.signal),
            "failure": outcome.and_then(|o| o.failure.as_deref()),
            "jailer": e.jailer,
            "stopped_by": stopped_by_label(e.stopped_by),
        }));
    }
}
