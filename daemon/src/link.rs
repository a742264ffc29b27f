//! The link between pycelld's broker and its root monitor: the closed set
//! of messages each side may send, imported by both (the monitor reads
//! only [`ToMonitor`], the broker only [`ToBroker`]). Frames are JSON with
//! unknown fields rejected, bounded by the protocol's frame size; the
//! monitor re-checks every field it acts on (see docs/threat-model.md,
//! "What root trusts from the broker").

use std::path::PathBuf;

use pycell_deps::DepsRequest;
use pycell_launch::launcher::LaunchError;
use pycell_policy::network::EgressRules;
use pycell_policy::Policy;
use pycell_protocol::messages::{ErrorCode, LimitOverrides, RunRequest};
use pycell_protocol::result::EnvReport;
use pycell_protocol::result::RunLimits;
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;
use serde::{Deserialize, Serialize};

/// Broker → monitor: the only things the broker can ask for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
// One message a run, decoded and moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ToMonitor {
    /// The broker is accepting connections (for readiness).
    Ready,
    /// The broker's event loop is turning (sent every second; the
    /// monitor's systemd watchdog pings depend on it).
    Alive,
    /// Start a run for a peer (whose credentials the broker checked), as
    /// the broker resolved it.
    Spawn {
        req: u64,
        peer: PeerIds,
        order: RunOrder,
        /// What each descriptor that came with this message is, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        descriptors: Vec<SpawnFd>,
    },
    /// Stop a run (cancel, client gone, shutdown).
    Kill { run_id: String },
    /// Pass SIGINT to a session's running cell (its caller cancelled it).
    Interrupt { run_id: String },
    /// The client of request `req` is gone or cancelled while its env was
    /// being built: stop the build.
    Abandon { req: u64 },
    /// One connection of a run's egress proxy ended: for the audit log.
    Egress {
        run_id: String,
        connection: EgressLine,
    },
    /// One tool call of a run's code, for the audit log.
    ToolCall {
        run_id: String,
        call: pycell_tools::service::CallRecord,
    },
}

impl ToMonitor {
    /// The message's `op`, for logs.
    pub fn op(&self) -> &'static str {
        match self {
            ToMonitor::Ready => "ready",
            ToMonitor::Alive => "alive",
            ToMonitor::Spawn { .. } => "spawn",
            ToMonitor::Kill { .. } => "kill",
            ToMonitor::Interrupt { .. } => "interrupt",
            ToMonitor::Abandon { .. } => "abandon",
            ToMonitor::Egress { .. } => "egress",
            ToMonitor::ToolCall { .. } => "tool_call",
        }
    }
}

/// A run as the broker resolved it from a client's request: what root
/// needs to start it, and nothing root has to parse. The broker did the
/// parsing (the policy's name, the limits against the policy's ceilings,
/// the PEP 723 block and the requirement lists); the monitor re-checks
/// each field with a constant amount of work per byte ([`RunOrder::check`])
/// and never looks inside the code, which it hands to the jailer as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOrder {
    /// An operator's policy, by name; the monitor loads it itself.
    pub policy: String,
    /// Every limit, final: the policy's, with the request's overrides
    /// applied and checked against its ceilings (the monitor checks them
    /// again, `resolve::settled_limits`, and launches with them).
    pub limits: RunLimits,
    /// The program, opaque to root.
    pub code: String,
    pub filename: Option<String>,
    pub args: Vec<String>,
    pub stdin_base64: Option<String>,
    /// Files for /workspace, opaque to root too (bounded and named as
    /// the launch path checks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<pycell_protocol::messages::InputFile>,
    /// The run's dependencies, gathered and normalized, if it has any.
    pub dependencies: Option<DepsRequest>,
    /// A session's jail (see `pycell_runner::session`), not a run's: its
    /// code is empty, and the jailer's stdin goes to the broker, which
    /// sends the session's requests on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session: bool,
    /// Code mode: the jail gets a tool channel (its calls are the
    /// broker's to check and relay; root sees only that there is one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools: bool,
    /// A server over stdio: the jail hands out its stdin and stdout, for
    /// the broker to pass to the client (root never reads them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdio: bool,
    /// The request's variables, checked by the broker (opaque to root,
    /// which bounds them and re-checks their names).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// Host paths the client granted, checked by the broker; their
    /// descriptors come with the `spawn` message, each named
    /// [`SpawnFd::GrantSource`] with its index here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<pycell_protocol::messages::PathGrant>,
}

impl RunOrder {
    /// The request the launch path takes: no limits (the order's are
    /// settled) and no dependencies, since the env comes from
    /// [`RunOrder::dependencies`].
    pub fn to_request(&self) -> RunRequest {
        RunRequest {
            code: self.code.clone(),
            filename: self.filename.clone(),
            args: self.args.clone(),
            stdin_base64: self.stdin_base64.clone(),
            policy: Some(self.policy.clone()),
            // The order's limits are settled: the monitor checks them
            // (`resolve::settled_limits`) and launches with them.
            limits: LimitOverrides::default(),
            dependencies: Vec::new(),
            files: self.files.clone(),
            // What the launch path needs of the catalog is that there is
            // one: the broker serves the channel with the client's.
            tools: self.tools.then(Default::default),
            serve_stdio: self.stdio,
            env: self.env.clone(),
            allow: Vec::new(),
            grants: self.grants.clone(),
        }
    }

    /// The order's sizes and counts, checked by the monitor before it does
    /// anything else with it (lengths only: linear, no allocation).
    pub fn check_bounds(&self) -> Result<(), pycell_protocol::bounds::OutOfBounds> {
        use pycell_protocol::bounds::*;
        check_code(&self.code)?;
        check_filename(self.filename.as_deref())?;
        check_args(&self.args)?;
        check_stdin(self.stdin_base64.as_deref())?;
        check_files(&self.files)?;
        check_variables(self.env.iter())?;
        check_grants(&self.grants)
    }

    /// What the monitor checks of an order under the policy it names,
    /// beyond what the launch path checks (limits, sizes, names): its
    /// dependencies' bounds, and that the policy lets it have them.
    pub fn check(&self, policy: &Policy) -> Result<(), JailFailure> {
        for (name, value) in &self.env {
            pycell_protocol::messages::check_variable(name, value).map_err(|m| {
                JailFailure::new(
                    FailureCode::InvalidRequest,
                    pycell_wire::codes::Layer::Request,
                    m.to_string(),
                )
            })?;
        }
        if self.session && (policy.session.per_uid == 0 || !self.code.is_empty()) {
            return Err(JailFailure::new(
                FailureCode::SessionsUnavailable,
                pycell_wire::codes::Layer::Sessions,
                pycell_launch::session_table::no_sessions(policy),
            ));
        }
        let Some(deps) = &self.dependencies else {
            return Ok(());
        };
        let refused = |m: String| pycell_deps::failure(FailureCode::DepsInvalid, m);
        deps.check_bounds().map_err(|e| refused(e.to_string()))?;
        let own: Vec<String> = policy
            .dependencies
            .packages
            .iter()
            .map(|r| r.to_string())
            .collect();
        if !policy.dependencies.allow && deps.requirements != own {
            return Err(pycell_deps::failure(
                FailureCode::DepsNotAllowed,
                format!(
                    "policy {:?} does not allow dependencies beyond its own packages",
                    policy.name
                ),
            ));
        }
        Ok(())
    }
}

/// A client's credentials, as the kernel gave them to the broker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerIds {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
    /// The identity a trusted front end said the client speaks for (the
    /// broker checked it: printable ASCII, bounded); for the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// What a descriptor that comes with [`ToBroker::Spawned`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnedFd {
    /// The read end of the jailer's event pipe.
    Events,
    /// The jailer's stdin socket: the jail hands its descriptors out on
    /// it (the egress proxy's listener, the tool channel, stdio), and a
    /// session's requests go in on it.
    JailerStdin,
}

/// What a descriptor that comes with [`ToMonitor::Spawn`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnFd {
    /// The host path the client granted as `order.grants[grant]`, opened
    /// by the broker (`O_PATH`).
    GrantSource { grant: usize },
}

/// Monitor → broker. `Spawned` carries the jailer's descriptors as
/// SCM_RIGHTS, each named in `descriptors`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
// One message a run, decoded and moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ToBroker {
    Spawned {
        req: u64,
        run_id: String,
        sandbox_uid: u32,
        policy: String,
        limits: RunLimits,
        /// The run's `[images]` and `[output]` bounds, for its images and
        /// displays to be held to.
        #[serde(default)]
        media: Option<pycell_wire::spec::MediaLimits>,
        /// With egress: the policy's rules (the jail hands out the proxy's
        /// listener on its jailer's stdin, `pycell_wire::handout`).
        egress: Option<EgressRules>,
        /// What each descriptor that came with this message is, in order.
        descriptors: Vec<SpawnedFd>,
        /// The env of the run's dependencies, if it has any.
        env: Option<EnvReport>,
        /// A jail of the pool, already ready (a session's: its ready event
        /// was read by the monitor).
        #[serde(default)]
        ready: bool,
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
        /// The memory the warm pools' members may use, which admission
        /// sets aside from `memory_budget` (the monitor plans the pools).
        warm_reserved_bytes: u64,
        /// The pools as planned, none of their members ready yet: what
        /// `pycell info` shows until the monitor's first report.
        pools: Vec<pycell_protocol::info::WarmPoolStatus>,
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

/// How a run that did not start is refused on the wire.
pub fn refusal(e: LaunchError) -> (ErrorCode, String) {
    let code = match &e {
        LaunchError::Request(_) => ErrorCode::InvalidRequest,
        LaunchError::Refused(f) => match f.code {
            FailureCode::UidUnavailable => ErrorCode::Busy,
            FailureCode::InvalidPolicy => ErrorCode::InvalidRequest,
            _ => ErrorCode::Internal,
        },
    };
    (code, e.failure().message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(deps: Option<Vec<&str>>) -> RunOrder {
        RunOrder {
            policy: "p".into(),
            limits: pycell_policy::RunLimits::default(),
            code: "print(1)".into(),
            filename: None,
            args: Vec::new(),
            stdin_base64: None,
            files: Vec::new(),
            dependencies: deps.map(|d| DepsRequest {
                requirements: d.into_iter().map(str::to_string).collect(),
                requires_python: None,
            }),
            session: false,
            tools: false,
            stdio: false,
            env: Default::default(),
            grants: Vec::new(),
        }
    }

    fn policy(deps: &str) -> Policy {
        let text = format!(
            "name = \"p\"\ndescription = \"d\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n{deps}"
        );
        Policy::from_toml_str(&text, std::path::Path::new("p.toml")).unwrap()
    }

    #[test]
    fn root_refuses_dependencies_a_policy_does_not_allow_or_out_of_bounds() {
        let closed = policy("[dependencies]\npackages = [\"six\"]\n");
        assert!(order(None).check(&closed).is_ok());
        assert!(order(Some(vec!["six"])).check(&closed).is_ok());
        let e = order(Some(vec!["six", "attrs"]))
            .check(&closed)
            .unwrap_err();
        assert_eq!(e.code, FailureCode::DepsNotAllowed);
        let open = policy("[dependencies]\nallow = true\n");
        assert!(order(Some(vec!["six", "attrs"])).check(&open).is_ok());
        let e = order(Some(vec!["six\n--index-url=x"]))
            .check(&open)
            .unwrap_err();
        assert_eq!(e.code, FailureCode::DepsInvalid);
        let many: Vec<&str> = vec!["six"; 65];
        assert!(order(Some(many)).check(&open).is_err());
    }

    #[test]
    fn an_orders_request_leaves_limits_and_dependencies_to_the_order() {
        let o = order(Some(vec!["six"]));
        let r = o.to_request();
        assert_eq!(r.policy.as_deref(), Some("p"));
        assert_eq!(r.limits, LimitOverrides::default());
        assert!(r.dependencies.is_empty());
        assert_eq!(r.code, "print(1)");
    }
}
