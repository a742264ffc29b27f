//! The link between pycelld's broker and its root monitor: the closed set
//! of messages each side may send, imported by both (the monitor reads
//! only [`ToMonitor`], the broker only [`ToBroker`]). Frames are JSON with
//! unknown fields rejected, bounded by the protocol's frame size; the
//! monitor re-checks every field it acts on (see docs/threat-model.md,
//! "What root trusts from the broker").

use std::path::PathBuf;

use pycell_policy::network::EgressRules;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::EnvReport;
use pycell_protocol::result::LimitsReport;
use pycell_wire::report::JailFailure;
use serde::{Deserialize, Serialize};

/// Broker → monitor: the only things the broker can ask for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToMonitor {
    /// The broker is accepting connections (for readiness).
    Ready,
    /// The broker's event loop is turning (sent every second; the
    /// monitor's systemd watchdog pings depend on it).
    Alive,
    /// Start a run for a peer (whose credentials the broker checked).
    Spawn {
        req: u64,
        peer: PeerIds,
        request: RunRequest,
    },
    /// Stop a run (cancel, client gone, shutdown).
    Kill { run_id: String },
    /// The client of request `req` is gone or cancelled while its env was
    /// being built: stop the build.
    Abandon { req: u64 },
    /// One connection of a run's egress proxy ended: for the audit log.
    Egress {
        run_id: String,
        connection: EgressLine,
    },
}

/// A client's credentials, as the kernel gave them to the broker.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerIds {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// Monitor → broker. `Spawned` carries the read end of the jailer's event
/// pipe as SCM_RIGHTS (and, with egress, the jailer's stdin socket).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToBroker {
    Spawned {
        req: u64,
        run_id: String,
        sandbox_uid: u32,
        policy: String,
        limits: LimitsReport,
        /// With egress: the policy's rules; the second descriptor is the
        /// jailer's stdin, on which it sends the proxy's listener.
        egress: Option<EgressRules>,
        /// The env of the run's dependencies, if it has any.
        env: Option<EnvReport>,
    },
    /// The run's env is being built; the descriptor carries the install's
    /// progress, a line per step. `Spawned`, `Refused` or `Failed` follows.
    Installing {
        req: u64,
    },
    Refused {
        req: u64,
        code: ErrorCode,
        message: String,
    },
    /// The run could not start for a reason its result reports (its
    /// dependencies could not be installed, say).
    Failed {
        req: u64,
        policy: String,
        failure: JailFailure,
    },
    Exited {
        run_id: String,
    },
    /// The warm pools changed (members started, ready, taken or gone).
    WarmPools {
        pools: Vec<pycell_protocol::info::WarmPoolStatus>,
    },
    /// The first message, with the listening socket attached, and the
    /// configuration's text: the broker parses what the monitor read (a
    /// missing default file is the empty text, the defaults), never a file
    /// of its own.
    Handoff {
        config_path: PathBuf,
        config_text: String,
    },
}

/// One connection through a run's egress proxy, as the broker reports it
/// (bounded: every text field is cut to 256 bytes before it is logged).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressLine {
    pub scheme: String,
    pub host: String,
    pub port: u16,
    pub verdict: String,
    pub reason: Option<String>,
    pub address: Option<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl From<&pycell_egress::ConnectionRecord> for EgressLine {
    fn from(c: &pycell_egress::ConnectionRecord) -> EgressLine {
        EgressLine {
            scheme: c.scheme.to_string(),
            host: c.host.clone(),
            port: c.port,
            verdict: c.verdict.to_string(),
            reason: c.reason.clone(),
            address: c.address.clone(),
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
        }
    }
}
