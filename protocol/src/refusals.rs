//! What the sandbox refused a run or a cell, layer by layer, and why it
//! ended: the typed account every result carries (`refusals`,
//! `termination`), explained on the host from facts the kernel, the
//! jailer, the egress proxy and the tool broker gave (docs/refusals.md).
//! Pure: the facts come in, the account goes out.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use pycell_wire::codes::FailureCode;
use pycell_wire::limits::RunLimits;
use pycell_wire::report::{JailFailure, LimitEvents, RunStatus, SeccompRefused, SessionEnd};

use crate::result::{Denied, NetworkReport};
use crate::tools::ToolCallsReport;

/// At most this many distinct refusals are listed; the same layer and
/// object count together.
pub const MAX_REFUSALS: usize = 16;

/// The longest `object` kept (an egress host or a tool name comes from
/// the sandbox).
const MAX_OBJECT: usize = 160;

/// The layer of the sandbox that refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefusalLayer {
    Seccomp,
    Landlock,
    Memory,
    Pids,
    Cpu,
    WallTimeout,
    Disk,
    Output,
    Egress,
    Dns,
    Tools,
    Rlimit,
}

impl RefusalLayer {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalLayer::Seccomp => "seccomp",
            RefusalLayer::Landlock => "landlock",
            RefusalLayer::Memory => "memory",
            RefusalLayer::Pids => "pids",
            RefusalLayer::Cpu => "cpu",
            RefusalLayer::WallTimeout => "wall_timeout",
            RefusalLayer::Disk => "disk",
            RefusalLayer::Output => "output",
            RefusalLayer::Egress => "egress",
            RefusalLayer::Dns => "dns",
            RefusalLayer::Tools => "tools",
            RefusalLayer::Rlimit => "rlimit",
        }
    }
}

/// One thing the sandbox refused, how often, by which rule, and what to
/// do instead (never "turn the sandbox off").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Refusal {
    pub layer: RefusalLayer,
    /// What was refused: the limit and its value, a host and port, a tool.
    pub object: String,
    /// How many times (at least 1).
    pub count: u64,
    /// What decided: the policy's field (`limits.memory`, `network.allow`,
    /// ...), or "pycell's fixed profile".
    pub rule: String,
    /// What the program (or the model writing it) can do instead.
    pub remedy: String,
}

impl Refusal {
    fn new(layer: RefusalLayer, object: String, rule: &str, remedy: &str) -> Refusal {
        Refusal {
            layer,
            object: bounded(object),
            count: 1,
            rule: rule.to_string(),
            remedy: remedy.to_string(),
        }
    }

    fn times(mut self, n: u64) -> Refusal {
        self.count = n.max(1);
        self
    }

    /// The refusal as one line for a reader: `LAYER: OBJECT (xN); RULE; REMEDY`.
    pub fn line(&self) -> String {
        let times = match self.count {
            1 => String::new(),
            n => format!(" x{n}"),
        };
        format!(
            "refused by {}: {}{times} (rule: {}); {}",
            self.layer.as_str(),
            self.object,
            self.rule,
            self.remedy
        )
    }
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_OBJECT {
        let mut end = MAX_OBJECT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Add `r` to `list`: one of the same layer and object counts with it;
/// past [`MAX_REFUSALS`] distinct ones the rest are dropped.
pub fn add(list: &mut Vec<Refusal>, r: Refusal) {
    let full = list.len() >= MAX_REFUSALS;
    match list
        .iter_mut()
        .find(|e| e.layer == r.layer && e.object == r.object)
    {
        Some(e) => e.count = e.count.saturating_add(r.count),
        None if !full => list.push(r),
        None => {}
    }
}

/// `n` bytes in the unit a policy would write them in.
pub fn size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{} {name}", n / unit);
        }
        if n >= unit {
            return format!("{:.1} {name}", n as f64 / unit as f64);
        }
    }
    format!("{n} bytes")
}

/// A duration in seconds, as short as it can be said.
fn seconds(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// What the jail's own limits refused, from the kernel's counts and how
/// the jail ended.
pub fn of_limits(facts: &LimitFacts<'_>) -> Vec<Refusal> {
    let checks: [fn(&LimitFacts<'_>) -> Option<Refusal>; 6] =
        [memory, pids, disk, wall_timeout, cpu_time, file_size];
    let mut out: Vec<Refusal> = checks.iter().filter_map(|check| check(facts)).collect();
    out.extend(facts.seccomp.map(of_seccomp).unwrap_or_default());
    out.extend(output(facts));
    out
}

/// `what` of the run's limits, as ` of 512 MiB` say; empty when they are
/// not known.
fn of_limit(facts: &LimitFacts<'_>, what: impl Fn(&RunLimits) -> String) -> String {
    facts.limits.map_or(String::new(), what)
}

fn memory(facts: &LimitFacts<'_>) -> Option<Refusal> {
    let kills = facts.events.oom_kills;
    (kills > 0).then_some(())?;
    let memory = of_limit(facts, |l| format!(" of {}", size(l.memory.get())));
    let object = format!(
        "memory limit{memory} (all processes together; the kernel's OOM killer killed a process)"
    );
    let remedy = "use less memory (load and process the data in chunks, free what is done, use smaller dtypes), or ask for a higher memory limit (up to the policy's limits.max.memory)";
    Some(Refusal::new(RefusalLayer::Memory, object, "limits.memory", remedy).times(kills))
}

fn pids(facts: &LimitFacts<'_>) -> Option<Refusal> {
    let refused = facts.events.pids_refused;
    (refused > 0).then_some(())?;
    let pids = of_limit(facts, |l| format!(" (limit {})", l.pids));
    let object = format!("a new process or thread{pids}");
    let remedy = "start fewer processes or threads (a smaller pool, join workers before starting more), or ask for a higher pids limit (up to the policy's limits.max.pids)";
    Some(Refusal::new(RefusalLayer::Pids, object, "limits.pids", remedy).times(refused))
}

fn disk(facts: &LimitFacts<'_>) -> Option<Refusal> {
    facts.events.disk_full.then_some(())?;
    let disk = of_limit(facts, |l| format!(" of {}", size(l.disk.get())));
    let object = format!("disk budget{disk} (/workspace, /tmp and /dev/shm together), full");
    let remedy = "write less (compress, delete temporary files as you go, stream instead of saving), or ask for a larger disk limit (up to the policy's limits.max.disk)";
    Some(Refusal::new(
        RefusalLayer::Disk,
        object,
        "limits.disk",
        remedy,
    ))
}

fn wall_timeout(facts: &LimitFacts<'_>) -> Option<Refusal> {
    facts.timed_out.then_some(())?;
    let wall = facts
        .wall_timeout_s
        .map_or(String::new(), |s| format!(" of {}", seconds(s)));
    let object = format!("wall-clock time{wall}");
    let remedy = if facts.cell {
        "do the work in smaller cells, or pass a larger timeout for the cell (up to the policy's limits.max.wall_timeout); the session keeps what earlier cells made"
    } else {
        "make the code faster, split the work across several runs or session cells, or ask for a longer timeout (up to the policy's limits.max.wall_timeout)"
    };
    let rule = "limits.wall_timeout";
    Some(Refusal::new(
        RefusalLayer::WallTimeout,
        object,
        rule,
        remedy,
    ))
}

fn cpu_time(facts: &LimitFacts<'_>) -> Option<Refusal> {
    (facts.failure == Some(FailureCode::CpuTimeLimit)).then_some(())?;
    let cpu = of_limit(facts, |l| format!(" of {} s", l.cpu_time_whole_secs()));
    let object = format!("CPU time{cpu} (RLIMIT_CPU)");
    let remedy = "do less work per run (sample the data, vectorize loops), or ask for a policy with a larger limits.cpu_time";
    Some(Refusal::new(
        RefusalLayer::Cpu,
        object,
        "limits.cpu_time",
        remedy,
    ))
}

fn file_size(facts: &LimitFacts<'_>) -> Option<Refusal> {
    (facts.signal == Some(SIGXFSZ)).then_some(())?;
    let fsize = of_limit(facts, |l| format!(" of {}", size(l.file_size.get())));
    let object = format!("a file larger than the file size limit{fsize} (RLIMIT_FSIZE; SIGXFSZ)");
    let remedy = "write smaller files (split or compress them), or ask for a policy with a larger limits.file_size";
    Some(Refusal::new(
        RefusalLayer::Rlimit,
        object,
        "limits.file_size",
        remedy,
    ))
}

/// A stream past the output cap, each.
fn output(facts: &LimitFacts<'_>) -> Vec<Refusal> {
    let cap = facts
        .max_output
        .map_or(String::new(), |n| format!(" past {}", size(n)));
    let remedy = "print less (a summary, the head and tail), and write the full output to a file in /workspace";
    let streams = facts.truncated.iter().zip(["stdout", "stderr"]);
    streams
        .filter(|(truncated, _)| **truncated)
        .map(|(_, stream)| {
            let object = format!("{stream}{cap} (the rest was dropped but its last 16 KiB)");
            Refusal::new(RefusalLayer::Output, object, "limits.max_output", remedy)
        })
        .collect()
}

const SIGXFSZ: i32 = 25;

/// The calls pycell's seccomp profile refused, as the kernel handed each
/// to the jailer.
fn of_seccomp(refused: &SeccompRefused) -> Vec<Refusal> {
    let rule = "pycell's fixed seccomp profile (the same in every sandbox)";
    let mut out: Vec<Refusal> = refused
        .calls
        .iter()
        .map(|c| {
            let object = format!("the system call {} (EPERM)", c.syscall);
            Refusal::new(
                RefusalLayer::Seccomp,
                object,
                rule,
                syscall_remedy(&c.syscall),
            )
            .times(c.count)
        })
        .collect();
    if refused.uncounted {
        let object = "more refused system calls than are counted (the jailer's listener broke; later ones failed with ENOSYS)"
            .to_string();
        out.push(Refusal::new(
            RefusalLayer::Seccomp,
            object,
            rule,
            "stop retrying a call the sandbox refuses: it is refused every time",
        ));
    }
    out
}

/// What to do instead of a system call the profile refuses.
fn syscall_remedy(syscall: &str) -> &'static str {
    match syscall {
        "mount" | "umount2" | "pivot_root" | "fsopen" | "fsmount" | "move_mount" | "open_tree" => {
            "mounts cannot be made in a sandbox: work with the files in /workspace (a policy grant can bring a host directory in)"
        }
        "unshare" | "setns" | "clone" => {
            "namespaces cannot be made in a sandbox (it is one already): run the code directly, without unshare, containers or user namespaces"
        }
        "ptrace" | "process_vm_readv" | "process_vm_writev" | "pidfd_getfd" => {
            "processes cannot be traced or read in a sandbox: debug with prints, logging or faulthandler"
        }
        "bpf" | "perf_event_open" => "kernel tracing and BPF are not available in a sandbox",
        "keyctl" | "add_key" | "request_key" => {
            "the kernel's keyrings are not available: keep keys in memory or in a file in /workspace"
        }
        "io_uring_setup" | "io_uring_enter" | "io_uring_register" => {
            "io_uring is not available: use ordinary reads and writes (asyncio, threads)"
        }
        "seccomp" => "a seccomp filter with a listener of its own is not available: filters without one are",
        _ => "this call is refused in every pycell sandbox: do it another way (docs/seccomp.md lists what is refused and why)",
    }
}

/// What a run or cell's limits saw, for [`of_limits`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitFacts<'a> {
    pub limits: Option<&'a RunLimits>,
    pub events: LimitEvents,
    pub timed_out: bool,
    /// The wall timeout that expired (a cell's is its own).
    pub wall_timeout_s: Option<f64>,
    pub failure: Option<FailureCode>,
    pub signal: Option<i32>,
    pub truncated: [bool; 2],
    pub max_output: Option<u64>,
    /// A session cell (its remedies say cells).
    pub cell: bool,
    /// The calls the seccomp filter refused.
    pub seccomp: Option<&'a SeccompRefused>,
}

/// What the egress proxy refused, and the names it could not resolve.
pub fn of_network(report: &NetworkReport) -> Vec<Refusal> {
    let mut out: Vec<Refusal> = report.denied.iter().map(egress_refusal).collect();
    for f in report.failed.iter().filter(|f| f.reason == "dns_failed") {
        let object = format!("{} (the name did not resolve)", f.host);
        let rule = "the egress proxy resolves every name; this one has no address";
        let remedy = "check the host name's spelling; a name that resolves only inside another network cannot be reached from here";
        out.push(Refusal::new(RefusalLayer::Dns, object, rule, remedy).times(f.count));
    }
    if let Some(limit) = &report.limit_reached {
        let object = format!("more network use than the policy's network.{limit}");
        let remedy = "make fewer connections or transfer less (reuse one session, ask for smaller responses)";
        out.push(Refusal::new(
            RefusalLayer::Egress,
            object,
            &format!("network.{limit}"),
            remedy,
        ));
    }
    out
}

fn egress_refusal(d: &Denied) -> Refusal {
    let (rule, remedy) = match d.reason.as_str() {
        "not_allowlisted" => ("network.allow (the host is not in it)", "use a host the policy allows (the result's network.allowed lists those reached), or ask for a policy whose network.allow lists this host"),
        "denied_by_rule" => ("network.deny", "this host is denied by the policy; use another source"),
        "port_not_allowed" => ("network.allow (the port is not allowed for this host)", "use the port the policy allows for this host (443 for https)"),
        "plain_http_not_allowed" | "scheme_not_allowed" => ("network.allow (the scheme)", "use https:// instead of http://"),
        "private_address" => ("pycell's fixed egress rules: private, loopback and link-local addresses are never reached", "reach the service at a public address the policy allows"),
        "sni_mismatch" => ("pycell's fixed egress rules: the TLS server name must be the host connected to", "connect by the host name the policy allows, without overriding the TLS server name"),
        "not_tls" => ("network.allow (TLS only)", "use https:// (the host allows TLS only)"),
        "connection_limit" => ("network.max_connections", "make fewer connections (reuse one session)"),
        _ => ("the egress proxy's request checks", "send a well-formed HTTP request through the proxy (HTTP_PROXY/HTTPS_PROXY are set)"),
    };
    let object = format!("{}:{} ({})", d.host, d.port, d.reason);
    Refusal::new(RefusalLayer::Egress, object, rule, remedy).times(d.count)
}

/// What the tool broker refused.
pub fn of_tools(report: &ToolCallsReport) -> Vec<Refusal> {
    report
        .refused
        .iter()
        .map(|(call, n)| {
            let (rule, remedy) = if call.ends_with("(limit)") {
                ("tools.max_calls or tools.max_result", "make fewer tool calls in one run, or ask for smaller results (narrower queries, pagination)")
            } else if call.ends_with("(unknown)") {
                ("the run's tool catalog (no such server or tool)", "call a tool that pycell_tools.list_servers() lists")
            } else {
                ("tools.allow (or the client's allowTools)", "use a tool the policy allows (pycell_tools.list_servers() lists them), or ask for a policy that allows this one")
            };
            Refusal::new(RefusalLayer::Tools, call.clone(), rule, remedy).times(u64::from(*n))
        })
        .collect()
}

/// Why a run or a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The program exited by itself (`exit_code` says with what).
    Exited,
    /// The program died of a signal from its own code (a crash, its own kill).
    Signaled,
    /// It exited with an error after the pids limit refused it a process.
    PidsLimit,
    /// The wall-clock limit expired; every process of the sandbox was killed.
    WallTimeout,
    /// The CPU time limit (RLIMIT_CPU) was reached.
    CpuLimit,
    /// The kernel's OOM killer killed it at the memory limit.
    OomKill,
    /// The client cancelled it (a signal to pycell, a cancelled call).
    Cancelled,
    /// Its session ended (idle, lifetime, closed) and took it along.
    SessionEnded,
    /// The jailer ended without a result (killed, or crashed).
    JailerDied,
    /// The zygote it was forked from died and took it along.
    ZygoteDied,
    /// The daemon restarted, shut down, or the connection to it broke.
    DaemonGone,
    /// No code ran: the sandbox could not be built, or the request was refused.
    Refused,
    /// A session cell: it ran to its end.
    Finished,
    /// A session cell: it ended with an exception (see `cell.exception`).
    Raised,
}

/// How a run or cell ended, in one word and one sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Termination {
    pub reason: EndReason,
    pub detail: String,
    /// An OOM kill: the memory in use at the kill (the jail's peak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl Termination {
    /// The reason as the wire says it (`oom_kill`, ...).
    pub fn reason_str(&self) -> String {
        serde_json::to_value(self.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    fn new(reason: EndReason, detail: String) -> Termination {
        Termination {
            reason,
            detail,
            memory_bytes: None,
        }
    }
}

/// What a run's end is explained from.
#[derive(Debug, Clone, Copy)]
pub struct EndFacts<'a> {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<&'a JailFailure>,
    pub session_end: Option<SessionEnd>,
    pub peak_memory_bytes: u64,
    pub limits: Option<&'a RunLimits>,
    /// The pids limit refused it something.
    pub pids_refused: bool,
}

/// Why the run ended.
pub fn termination(f: &EndFacts<'_>) -> Termination {
    use EndReason as R;
    let code = f.error.map(|e| e.code);
    let why = || f.error.map_or(String::new(), |e| e.message.clone());
    match f.status {
        RunStatus::Refused => refused_end(code, why()),
        RunStatus::Timeout => Termination::new(R::WallTimeout, why()),
        RunStatus::Oom => Termination {
            memory_bytes: Some(f.peak_memory_bytes),
            ..Termination::new(R::OomKill, oom_detail(f))
        },
        RunStatus::Killed if code == Some(FailureCode::CpuTimeLimit) => {
            Termination::new(R::CpuLimit, why())
        }
        RunStatus::Killed if code == Some(FailureCode::ZygoteDied) => {
            Termination::new(R::ZygoteDied, why())
        }
        RunStatus::Killed => match f.session_end {
            Some(end) => session_end(end),
            None => Termination::new(
                R::Cancelled,
                "the run was cancelled by its client; every process of the sandbox was killed"
                    .into(),
            ),
        },
        RunStatus::Ok | RunStatus::Error => program_end(f),
    }
}

fn oom_detail(f: &EndFacts<'_>) -> String {
    let limit = f
        .limits
        .map_or(String::new(), |l| format!(" of {}", size(l.memory.get())));
    format!(
        "the kernel's OOM killer killed the program at the memory limit{limit} ({} in use at the kill)",
        size(f.peak_memory_bytes)
    )
}

fn refused_end(code: Option<FailureCode>, why: String) -> Termination {
    use EndReason as R;
    let reason = match code {
        Some(FailureCode::JailerFailed | FailureCode::JailerIo) => R::JailerDied,
        Some(FailureCode::DaemonFailed | FailureCode::ShuttingDown) => R::DaemonGone,
        Some(FailureCode::Cancelled) => R::Cancelled,
        Some(FailureCode::Timeout) => R::WallTimeout,
        Some(FailureCode::ZygoteDied) => R::ZygoteDied,
        _ => R::Refused,
    };
    Termination::new(reason, why)
}

fn session_end(end: SessionEnd) -> Termination {
    let detail = match end {
        SessionEnd::Closed => "its session was closed",
        SessionEnd::Idle => "its session reached its idle timeout",
        SessionEnd::Lifetime => "its session reached its maximum lifetime",
        SessionEnd::CellTimeout => {
            "a cell overran its timeout and did not stop when interrupted, so the session was ended"
        }
        SessionEnd::Protocol => "its session's protocol broke",
    };
    Termination::new(EndReason::SessionEnded, detail.into())
}

fn program_end(f: &EndFacts<'_>) -> Termination {
    use EndReason as R;
    if let Some(sig) = f.signal {
        let detail = format!(
            "the program was killed by {} from its own code",
            signal_name(sig)
        );
        return Termination::new(R::Signaled, detail);
    }
    let code = f.exit_code.unwrap_or(-1);
    match (code, f.pids_refused) {
        (0, _) => Termination::new(R::Exited, "the program exited with status 0".into()),
        (_, true) => Termination::new(
            R::PidsLimit,
            format!("the program exited with status {code} after the pids limit refused it a new process or thread"),
        ),
        _ => Termination::new(R::Exited, format!("the program exited with status {code}")),
    }
}

/// A signal's name, as `kill -l` says it.
pub fn signal_name(sig: i32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(sig - 1)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("signal {sig}"), |n| n.to_string())
}

/// How a session cell ended.
pub fn cell_termination(interrupted: bool, raised: Option<&str>, timeout_s: f64) -> Termination {
    match (interrupted, raised) {
        (true, _) => Termination::new(
            EndReason::WallTimeout,
            format!("the cell ran past its timeout of {} and was interrupted (KeyboardInterrupt); the session goes on", seconds(timeout_s)),
        ),
        (false, Some(kind)) => Termination::new(EndReason::Raised, format!("the cell raised {kind}")),
        (false, None) => Termination::new(EndReason::Finished, "the cell ran to its end".into()),
    }
}

#[cfg(test)]
mod tests;
