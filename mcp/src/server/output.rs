//! The `run_python` result as the MCP client sees it: the structured content
//! (whose JSON schema is the tool's `outputSchema`) and its short text
//! rendering.

use schemars::JsonSchema;
use serde::Serialize;

use pycell_protocol::refusals::{Refusal, Termination};
use pycell_protocol::result::{EnvReport, NetworkReport, RunLimits, RunResult};

use rmcp::model::{CallToolResult, ContentBlock};

use super::cell_output::{display_info, image_info, CellInfo, DisplayInfo, FileChange, ImageInfo};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::{CgroupVersion, LandlockStatus, RunStatus, StreamTail};

/// How the run ended; `running` only for a session cell still going
/// after the call's wait (see `detached`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The program exited with code 0 (a cell: ended without an exception).
    Ok,
    /// The program exited non-zero (e.g. an uncaught exception: see stderr) or died of a signal it did not get from pycell.
    Error,
    /// The wall-clock limit expired: the run was killed, the cell interrupted.
    Timeout,
    /// The memory limit was reached; the kernel killed the program.
    Oom,
    /// Killed on request (the run was cancelled) or by the CPU-time limit.
    Killed,
    /// The sandbox could not be built, so the code never ran; `error` says why.
    Refused,
    /// A session cell still running after the call's wait: `detached` says how to get its result.
    Running,
}

impl From<RunStatus> for Status {
    fn from(s: RunStatus) -> Status {
        match s {
            RunStatus::Ok => Status::Ok,
            RunStatus::Error => Status::Error,
            RunStatus::Timeout => Status::Timeout,
            RunStatus::Oom => Status::Oom,
            RunStatus::Killed => Status::Killed,
            RunStatus::Refused => Status::Refused,
        }
    }
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Ok => RunStatus::Ok.as_str(),
            Status::Error => RunStatus::Error.as_str(),
            Status::Timeout => RunStatus::Timeout.as_str(),
            Status::Oom => RunStatus::Oom.as_str(),
            Status::Killed => RunStatus::Killed.as_str(),
            Status::Refused => RunStatus::Refused.as_str(),
        }
    }
}

/// A session cell that outlived its call's wait (`pycell mcp
/// --hand-off-after`): it goes on within the session's limits, and the
/// session's next `run_python` call collects its result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DetachedInfo {
    /// How long the cell has run (or ran), in seconds.
    pub running_for_s: f64,
    /// Whether this call's own code ran: false while an earlier detached cell is pending.
    pub code_run: bool,
    /// What happened and what to do next.
    pub note: String,
}

/// Why a run did not end normally.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorInfo {
    /// Stable code, e.g. `timeout`, `oom`, `cpu_time_limit`, `cancelled`, `not_root`, `landlock_unavailable`.
    pub code: FailureCode,
    /// The layer or step concerned, e.g. `limits`, `landlock`, `cgroup`, `jailer`.
    pub layer: Layer,
    pub message: String,
    /// What to do about it, when there is something to do.
    pub hint: Option<String>,
}

/// Landlock as enforced for the run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LandlockInfo {
    /// The kernel's Landlock ABI version.
    pub abi: u8,
    pub status: LandlockStatus,
}

/// The seccomp filter the run had.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SeccompInfo {
    pub profile: String,
    pub instructions: usize,
}

/// The run's cgroup.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CgroupInfo {
    pub version: CgroupVersion,
    pub name: String,
}

/// The isolation layers that were enforced for the run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LayersInfo {
    /// New namespaces the sandbox ran in.
    pub namespaces: Vec<String>,
    /// Host uid the code ran as (unique to the run, no account has it).
    pub sandbox_uid: u32,
    pub landlock: LandlockInfo,
    pub seccomp: SeccompInfo,
    pub cgroup: CgroupInfo,
    pub no_new_privs: bool,
    /// Capabilities the code had: `none`.
    pub capabilities: String,
}

/// The result of one `run_python` call.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunPythonOutput {
    /// Identifies the run (`r-` and hex); empty if it was refused before it got one.
    pub run_id: String,
    pub status: Status,
    /// The program's exit code; null if it was killed by a signal or never ran.
    pub exit_code: Option<i32>,
    /// The signal that killed the program, if one did.
    pub signal: Option<i32>,
    /// What the program printed on stdout (UTF-8; invalid bytes replaced).
    pub stdout: String,
    /// What the program printed on stderr (tracebacks go here).
    pub stderr: String,
    /// True if stdout went over the output cap and the rest was dropped
    /// (but its last bytes: `stdout_tail`).
    pub stdout_truncated: bool,
    /// True if stderr went over the output cap and the rest was dropped
    /// (but its last bytes: `stderr_tail`).
    pub stderr_truncated: bool,
    /// When stdout went over the cap: its last bytes (at most 16 KiB,
    /// `tail`) and how many between them and `stdout` were dropped
    /// (`skipped_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_tail: Option<StreamTail>,
    /// The same for stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<StreamTail>,
    /// Wall-clock time of the run, in milliseconds.
    pub duration_ms: f64,
    /// CPU time the program used, in milliseconds.
    pub cpu_ms: f64,
    /// Peak memory of the sandbox, in bytes.
    pub peak_memory_bytes: u64,
    /// Bytes stored in /workspace, /tmp and /dev/shm together when the run ended.
    pub disk_used_bytes: u64,
    /// True if the run went to a sandbox prepared ahead (python already
    /// started, the policy's modules imported); its time counts from the
    /// moment the code arrived.
    pub warm: bool,
    /// The policy the run used.
    pub policy: String,
    /// The limits the run had (null if it was refused before they were known).
    pub limits: Option<RunLimits>,
    /// The isolation layers enforced (null if the run was refused).
    pub layers: Option<LayersInfo>,
    /// Why the run did not end normally (timeout, oom, CPU limit, cancelled, refused); null otherwise.
    pub error: Option<ErrorInfo>,
    /// Under a policy with network `allowlist`: the hosts reached, the
    /// requests the proxy refused (host, port, reason, count), bytes in and
    /// out; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// When the call had dependencies: the environment's key, every package
    /// in it with its version, whether it was cached ("hit") or installed
    /// for this call ("miss"), and the install time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvReport>,
    /// When the code called tools (`import pycell_tools`): calls made,
    /// how many failed and why (denied, bad_arguments, ...), bytes sent
    /// and received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<pycell_protocol::tools::ToolCallsReport>,
    /// The files the run created or changed in /workspace (path, size,
    /// sha256, created), at most 100; read them in a session, or print
    /// them. A session cell lists the files it changed.
    pub files: Vec<FileChange>,
    /// True if more files changed than are listed.
    pub files_truncated: bool,
    /// Images returned as image content, in order: figures the code left
    /// open (matplotlib; saved full size under /workspace/figures) and
    /// PNG/JPEG files it wrote, scaled down to the policy's bounds.
    pub images: Vec<ImageInfo>,
    /// Images not returned because the result's image budget was used up
    /// (their files are listed).
    pub images_omitted: u32,
    /// What the code showed with `display()` (a builtin, as in a
    /// notebook), and a cell's value when it has a richer form than its
    /// text: MIME parts, each text part within the policy's `[output]`
    /// bounds; the markdown (or text) is in the text content.
    pub displays: Vec<DisplayInfo>,
    /// Displays not returned (past `[output] displays`, or over its
    /// `display_bytes`).
    pub displays_omitted: u32,
    /// A session cell (run_python with `session`): its number, the last
    /// expression's value, its exception; absent for a one-shot run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<CellInfo>,
    /// What the sandbox refused the code, one entry per layer and object:
    /// `layer` (memory, pids, cpu, wall_timeout, disk, output, egress,
    /// dns, tools, rlimit, seccomp, landlock), `object` (the limit and its
    /// value, the host, the tool), `count`, the `rule` that decided (the
    /// policy's field) and a `remedy` to act on. Empty when nothing was
    /// refused.
    pub refusals: Vec<Refusal>,
    /// Why the run or cell ended: `reason` (exited, signaled, pids_limit,
    /// wall_timeout, cpu_limit, oom_kill, cancelled, session_ended,
    /// jailer_died, zygote_died, daemon_gone, refused; a cell: finished, raised,
    /// wall_timeout) and a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination: Option<Termination>,
    /// A session cell past the call's wait: still running (`status`
    /// `running`), or collected by this call; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detached: Option<DetachedInfo>,
}

/// Hints written for a `pycell run` user name its flags; say what to change
/// in a tool call instead.
fn mcp_hint(code: FailureCode, hint: Option<String>) -> Option<String> {
    match code {
        FailureCode::Timeout => Some(
            "pass a larger timeout_s (up to the policy's ceiling, which sandbox_info shows), or make the code faster"
                .into(),
        ),
        FailureCode::Oom => Some(
            "use less memory (process data in chunks), or use a policy with a larger memory limit (see sandbox_info)"
                .into(),
        ),
        FailureCode::CpuTimeLimit => Some(
            "make the code do less work, or use a policy with a larger CPU-time limit (see sandbox_info)"
                .into(),
        ),
        _ => hint,
    }
}

impl From<RunResult> for RunPythonOutput {
    fn from(r: RunResult) -> Self {
        RunPythonOutput {
            network: r.network,
            env: r.env,
            tool_calls: r.tool_calls,
            files: r.files.iter().map(FileChange::from).collect(),
            files_truncated: r.files_truncated,
            images: r.images.iter().map(image_info).collect(),
            images_omitted: r.images_omitted,
            displays: r.displays.iter().map(display_info).collect(),
            displays_omitted: r.displays_omitted,
            cell: None,
            refusals: r.refusals,
            termination: r.termination,
            detached: None,
            run_id: r.run_id,
            status: r.status.into(),
            exit_code: r.exit_code,
            signal: r.signal,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            stdout_tail: r.stdout_tail,
            stderr_tail: r.stderr_tail,
            duration_ms: r.wall_ms,
            cpu_ms: r.cpu_ms,
            peak_memory_bytes: r.peak_memory_bytes,
            disk_used_bytes: r.disk_used_bytes,
            warm: r.warm,
            policy: r.policy,
            limits: r.limits,
            layers: r.layers.map(|l| LayersInfo {
                namespaces: l.namespaces,
                sandbox_uid: l.sandbox_uid,
                landlock: LandlockInfo {
                    abi: l.landlock.abi,
                    status: l.landlock.status,
                },
                seccomp: SeccompInfo {
                    profile: l.seccomp.profile,
                    instructions: l.seccomp.instructions,
                },
                cgroup: CgroupInfo {
                    version: l.cgroup.version,
                    name: l.cgroup.name,
                },
                no_new_privs: l.no_new_privs,
                capabilities: l.capabilities,
            }),
            error: match (r.error, r.status) {
                (Some(e), _) => Some(ErrorInfo {
                    hint: mcp_hint(e.code, e.hint),
                    code: e.code,
                    layer: e.layer,
                    message: e.message,
                }),
                // The jailer reports a kill on request without an error.
                (None, RunStatus::Killed) => Some(ErrorInfo {
                    code: FailureCode::Cancelled,
                    layer: Layer::Jailer,
                    message: "the run was cancelled; its sandbox was killed".into(),
                    hint: None,
                }),
                (None, _) => None,
            },
        }
    }
}

/// A tool's result: `value` as structured content, `text` and then `extra`
/// as its content (an error result if `value` cannot be encoded).
pub(super) fn structured<T: Serialize>(
    value: &T,
    text: String,
    extra: Vec<ContentBlock>,
) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(v) => {
            let mut r = CallToolResult::structured(v);
            let mut content = vec![ContentBlock::text(text)];
            content.extend(extra);
            r.content = content;
            r.is_error = Some(false);
            r
        }
        Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
            "pycell mcp failed: cannot encode the result: {e}"
        ))]),
    }
}

/// `1.5 KiB`, `8.4 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// The most of each stream the text content shows: its head and its tail
/// around a line that says how much was cut (the structured content has
/// the stream as kept, up to the output cap, and its tail).
pub const STREAM_TEXT_CHARS: usize = 24 << 10;

/// One stream as kept (`body`, up to the cap), and its tail past the cap.
struct Kept<'a> {
    name: &'a str,
    body: &'a str,
    truncated: bool,
    tail: Option<&'a StreamTail>,
}

/// What the text shows of a stream: its head and, past the cap, its tail,
/// each within half of [`STREAM_TEXT_CHARS`] (the whole budget for a
/// stream without a tail), with the line between them that says how much
/// was dropped, and one at the end if either was cut here.
fn shown_stream(name: &str, body: &str, tail: Option<&StreamTail>) -> String {
    let budget = match tail {
        Some(_) => STREAM_TEXT_CHARS / 2,
        None => STREAM_TEXT_CHARS,
    };
    let mut shown = body.to_string();
    let mut cut = pycell_protocol::bounds::cut_middle(&mut shown, budget);
    if let Some(t) = tail {
        let mut last = t.tail.clone();
        cut |= pycell_protocol::bounds::cut_middle(&mut last, budget);
        shown.push_str(&format!(
            "{}[... {} bytes of {name} past the output cap were not kept; its last {} follow ...]\n{last}",
            line_end(&shown),
            t.skipped_bytes,
            human_bytes(t.tail.len() as u64),
        ));
    }
    if cut {
        shown.push_str(&format!(
            "{}[{name} was cut to its head and tail here: the structured result's {name} and {name}_tail have more]",
            line_end(&shown)
        ));
    }
    shown
}

/// A newline, unless `text` is empty or ends a line already.
fn line_end(text: &str) -> &'static str {
    match text.is_empty() || text.ends_with('\n') {
        true => "",
        false => "\n",
    }
}

fn push_stream(text: &mut String, s: Kept<'_>, cap: Option<u64>) {
    let Kept {
        name,
        body,
        truncated,
        tail,
    } = s;
    if body.is_empty() && !truncated {
        return;
    }
    text.push_str(&format!("\n--- {name} ---\n"));
    let shown = shown_stream(name, body, tail);
    text.push_str(&shown);
    if !shown.ends_with('\n') && !shown.is_empty() {
        text.push('\n');
    }
    if truncated {
        match cap {
            Some(c) => text.push_str(&format!(
                "[{name} truncated: only the first {} and the last bytes were kept]\n",
                human_bytes(c)
            )),
            None => text.push_str(&format!("[{name} truncated]\n")),
        }
    }
    if let Some(t) = tail {
        push_rest_file(text, name, t);
    }
}

/// Where a session cell's stream past the part kept is, whole.
fn push_rest_file(text: &mut String, name: &str, t: &StreamTail) {
    let Some(file) = &t.rest_file else { return };
    let past = t.skipped_bytes + t.tail.len() as u64;
    let n = t.rest_file_bytes;
    let line = match n >= past {
        true => format!("all {n} bytes are in {file}"),
        false => format!(
            "its first {n} bytes are in {file} (a file may take a quarter of the disk budget)"
        ),
    };
    text.push_str(&format!(
        "[{name} past the part kept: {line}; read it with read_file]\n"
    ));
}

impl RunPythonOutput {
    /// A result with nothing in it but `status` (a cell's, in `session`).
    pub fn bare(status: Status, session: &str) -> RunPythonOutput {
        RunPythonOutput {
            run_id: String::new(),
            status,
            exit_code: None,
            signal: None,
            tool_calls: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_tail: None,
            stderr_tail: None,
            duration_ms: 0.0,
            cpu_ms: 0.0,
            peak_memory_bytes: 0,
            disk_used_bytes: 0,
            warm: true,
            policy: String::new(),
            limits: None,
            layers: None,
            error: None,
            network: None,
            env: None,
            files: Vec::new(),
            files_truncated: false,
            images: Vec::new(),
            images_omitted: 0,
            displays: Vec::new(),
            displays_omitted: 0,
            cell: Some(super::cell_output::no_cell(session)),
            refusals: Vec::new(),
            termination: None,
            detached: None,
        }
    }

    /// The tool result: this as structured content, its text, then
    /// `images` as image content; an error only if it was refused.
    pub fn tool_result(&self, images: Vec<ContentBlock>) -> CallToolResult {
        let mut r = structured(self, self.render(), images);
        if self.status == Status::Refused {
            r.is_error = Some(true);
        }
        r
    }

    /// The text content of the tool result: one status line, then the
    /// output streams, then what went wrong and what to do about it.
    pub fn render(&self) -> String {
        let note = self.detached.as_ref().map(|d| format!("{}\n", d.note));
        if self.status == Status::Running {
            return format!("status: running\n{}", note.unwrap_or_default());
        }
        let mut text = note.unwrap_or_default();
        text.push_str(&self.status_line());
        self.push_streams(&mut text);
        if let Some(c) = &self.cell {
            super::cell_output::render_cell(c, &self.displays, &mut text);
        }
        super::cell_output::render_displays(&self.displays, self.displays_omitted, &mut text);
        self.push_files(&mut text);
        super::cell_output::render_images(&self.images, self.images_omitted, &mut text);
        self.push_ending(&mut text);
        text
    }

    /// `status: ok (17 ms, 9 ms CPU, 8.4 MiB peak memory; policy default)`.
    fn status_line(&self) -> String {
        let mut head = format!("status: {}", self.status.as_str());
        match (self.exit_code, self.signal) {
            (Some(c), _) if self.status != Status::Ok => head.push_str(&format!(", exit code {c}")),
            (None, Some(s)) if self.status == Status::Error => {
                head.push_str(&format!(", killed by signal {s}"))
            }
            _ => {}
        }
        if self.status != Status::Refused {
            head.push_str(&format!(
                " ({:.0} ms, {:.0} ms CPU, {} peak memory; policy {})",
                self.duration_ms,
                self.cpu_ms,
                human_bytes(self.peak_memory_bytes),
                self.policy
            ));
        }
        head.push('\n');
        head
    }

    /// Each stream within the text's budget, or a line saying there was
    /// no output.
    fn push_streams(&self, text: &mut String) {
        let cap = self.limits.as_ref().map(|l| l.max_output.get());
        let streams = [
            (
                "stdout",
                &self.stdout,
                self.stdout_truncated,
                &self.stdout_tail,
            ),
            (
                "stderr",
                &self.stderr,
                self.stderr_truncated,
                &self.stderr_tail,
            ),
        ];
        for (name, body, truncated, tail) in streams {
            let tail = tail.as_ref();
            push_stream(
                text,
                Kept {
                    name,
                    body,
                    truncated,
                    tail,
                },
                cap,
            );
        }
        let has_value = !self.displays.is_empty()
            || self
                .cell
                .as_ref()
                .is_some_and(|c| c.value.is_some() || c.exception.is_some());
        if self.stdout.is_empty() && self.stderr.is_empty() && !has_value {
            match self.status {
                Status::Ok | Status::Error => {
                    text.push_str("(no output: print what you want to see)\n")
                }
                Status::Refused => {}
                _ => text.push_str("(no output)\n"),
            }
        }
    }

    fn push_files(&self, text: &mut String) {
        for f in &self.files {
            let verb = if f.created { "created" } else { "changed" };
            text.push_str(&format!("file {verb}: {} ({} bytes)\n", f.path, f.size));
        }
        if self.files_truncated {
            text.push_str("(more files changed)\n");
        }
    }

    /// What was refused, the network's failures, why it ended, and the
    /// error with what to do about it.
    fn push_ending(&self, text: &mut String) {
        for r in &self.refusals {
            text.push_str(&format!("{}\n", r.line()));
        }
        for note in self.network.iter().flat_map(NetworkReport::failure_notes) {
            text.push_str(&format!("{note}\n"));
        }
        match (&self.termination, &self.error, self.status) {
            (Some(t), None, s) if s != Status::Ok => {
                text.push_str(&format!("ended ({}): {}\n", t.reason_str(), t.detail))
            }
            _ => {}
        }
        if let Some(e) = &self.error {
            let status = self.status.as_str();
            text.push_str(&format!("\n{status} ({}): {}\n", e.code, e.message));
            if let Some(h) = &e.hint {
                text.push_str(&format!("hint: {h}\n"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::report::{JailFailure, JailReport};

    fn report(status: RunStatus, code: Option<i32>) -> JailReport {
        JailReport {
            status,
            exit_code: code,
            signal: None,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_tail: None,
            stderr_tail: None,
            wall_ms: 17.4,
            cpu_ms: 9.2,
            peak_memory_bytes: 8_839_168,
            disk_used_bytes: 4096,
            warm_waited_ms: None,
            session_end: None,
            files: Vec::new(),
            files_truncated: false,
            grant_cleanups: Vec::new(),
            layers: None,
            error: None,
            timings: Vec::new(),
            limit_events: Default::default(),
            seccomp_refused: Default::default(),
        }
    }

    #[test]
    fn an_ok_run_renders_its_output() {
        let r = RunResult::new(
            "r-1",
            "default",
            Some(pycell_policy::RunLimits::default()),
            report(RunStatus::Ok, Some(0)),
            b"1\n",
            b"",
        );
        let o = RunPythonOutput::from(r);
        assert_eq!(o.limits.as_ref().unwrap().max_output.get(), 1 << 20);
        assert_eq!(
            o.render(),
            "status: ok (17 ms, 9 ms CPU, 8.4 MiB peak memory; policy default)\n\n--- stdout ---\n1\n"
        );
    }

    #[test]
    fn a_long_stream_shows_its_head_and_its_tail_within_the_text_budget() {
        let mut rep = report(RunStatus::Ok, Some(0));
        rep.stdout_truncated = true;
        rep.stdout_tail = Some(StreamTail {
            skipped_bytes: 4_000_000,
            tail: format!("{}the last line\n", "late line\n".repeat(1600)),
            rest_file: None,
            rest_file_bytes: 0,
        });
        let head = "first line\n".repeat(100_000);
        let r = RunResult::new(
            "r-3",
            "default",
            Some(pycell_policy::RunLimits::default()),
            rep,
            head.as_bytes(),
            b"",
        );
        let o = RunPythonOutput::from(r);
        let text = o.render();
        assert!(
            text.chars().count() < STREAM_TEXT_CHARS + 1000,
            "{}",
            text.len()
        );
        assert!(text.contains("--- stdout ---\nfirst line\n"), "{text}");
        assert!(text.contains("characters cut"), "{text}");
        assert!(
            text.contains("4000000 bytes of stdout past the output cap"),
            "{text}"
        );
        assert!(text.contains("the last line\n[stdout was cut"), "{text}");
        assert_eq!(
            o.stdout.len(),
            head.len(),
            "the structured stdout is as kept"
        );
        assert!(!text.contains("read_file"), "a run keeps no rest: {text}");
    }

    #[test]
    fn a_cells_rest_file_is_named_and_a_short_one_said_so() {
        let tail = |written| StreamTail {
            skipped_bytes: 1000,
            tail: "end\n".into(),
            rest_file: Some("/workspace/outputs/cell-2-stdout.txt".into()),
            rest_file_bytes: written,
        };
        let mut text = String::new();
        push_rest_file(&mut text, "stdout", &tail(1004));
        assert_eq!(text, "[stdout past the part kept: all 1004 bytes are in /workspace/outputs/cell-2-stdout.txt; read it with read_file]\n");
        let mut text = String::new();
        push_rest_file(&mut text, "stdout", &tail(500));
        assert!(text.contains("its first 500 bytes are in"), "{text}");
    }

    #[test]
    fn a_timeout_says_what_to_change_in_the_call() {
        let mut rep = report(RunStatus::Timeout, None);
        rep.signal = Some(9);
        rep.stdout_truncated = true;
        rep.error = Some(JailFailure {
            code: FailureCode::Timeout,
            layer: Layer::Limits,
            message: "wall-clock timeout of 1.0s expired; the sandbox was killed".into(),
            hint: Some("raise --timeout, or make the code faster".into()),
        });
        let o = RunPythonOutput::from(RunResult::new(
            "r-2",
            "default",
            Some(pycell_policy::RunLimits::default()),
            rep,
            b"x",
            b"",
        ));
        let text = o.render();
        assert!(text.starts_with("status: timeout ("), "{text}");
        assert!(
            text.contains("[stdout truncated: only the first 1 MiB and the last bytes were kept]"),
            "{text}"
        );
        assert!(text.contains("hint: pass a larger timeout_s"), "{text}");
        assert!(!text.contains("--timeout"), "{text}");
    }

    #[test]
    fn sizes_read_naturally() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(512 << 20), "512 MiB");
    }
}
