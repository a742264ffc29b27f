//! Warm runs: a jail whose python is started (on pycell's runner,
//! `runner.py`) before any request exists, and which is then handed one
//! piece of [`Work`].
//!
//! ```text
//! launcher (pycelld's monitor) ──spec frame──> pycell-jailer ──> jail: python -s -c RUNNER MODULE...
//!                              <──ready event──               <── imports done, READY on stdout
//!                              ──work frame──>                ──> runner frame + stdin on its stdin
//!                              <──output, result──               (runs it as `python -s SCRIPT`)
//! ```
//!
//! The jailer's stdin carries frames ([`pycell_wire::framing`]): a 4-byte
//! big-endian length, then JSON. A cold spec is one frame and EOF; a warm
//! one is followed, whenever the launcher has a run for it, by the work
//! frame. Clocks (wall timeout, CPU time) start when the work arrives.
//!
//! Threat model: the runner's text runs inside the jail, after every layer
//! is applied, on behalf of the untrusted code; the work frame is built by
//! the launcher and re-validated by the jailer ([`Work::validate`]) before
//! it reaches the runner. No `unsafe`.
#![forbid(unsafe_code)]

pub mod session;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use pycell_wire::limits::Bytes;
use std::path::Path;

use pycell_wire::spec::{DisplayLimits, ImageLimits, JailSpec, MediaLimits, RUNNER_PYC, WORKSPACE};

/// The runner's text: `runner.py` (its core, compiled at start), then its
/// parts (each kept as text, compiled when first needed: see `runner.py`).
macro_rules! runner_text {
    ($($name:literal => $file:literal),* $(,)?) => {
        concat!(
            include_str!("runner.py"),
            "\n\n_PYCELL_PARTS = {\n",
            $("    \"", $name, "\": r'''\n", include_str!($file), "''',\n",)*
            "}\n\n_pycell_start()\n",
        )
    };
}

/// The runner's source: every warm jail, zygote and session starts on it
/// (`python -s -c RUNNER MODULE...`); its core is compiled at start, its
/// warm, images, display and session parts are kept as text, compiled
/// when needed (see `runner.py`).
pub const RUNNER: &str = runner_text!(
    "warm" => "warm.py",
    "images" => "media.py",
    "display" => "display.py",
    "session" => "session.py",
    "state" => "state.py",
    "tools" => "tools.py",
    "explain" => "explain.py",
);

/// The runner of a cold run (`python -s -c COLD_RUNNER --pycell-run ...`):
/// the same core without the warm and session parts, which a cold run
/// never uses, so that python has less to read at start.
pub const COLD_RUNNER: &str = runner_text!(
    "images" => "media.py",
    "display" => "display.py",
    "tools" => "tools.py",
    "explain" => "explain.py",
);

/// The flag that makes the runner serve one cold run (no warm-up):
/// `--pycell-run MAX_EDGE MAX_BYTES PART_CHARS DISPLAY_BYTES DISPLAYS
/// SCRIPT ARG...`.
pub const COLD_FLAG: &str = "--pycell-run";

/// The flag that makes the runner a zygote: `--pycell-zygote MODULE...`
/// (see [`zygote_spec`]).
pub const ZYGOTE_FLAG: &str = "--pycell-zygote";

/// The largest work frame (the same, with room to spare).
pub const MAX_WORK_FRAME: u64 = 96 << 20;

/// What the runner writes to stdout, after any warm-up output, when it is
/// ready: the jailer's cue that the jail is warm.
pub const READY_MARKER: &[u8] = b"\0pycell-warm-ready\0";

/// The argv of a warm jail: the interpreter on the runner, importing
/// `modules` before it is ready.
pub fn warm_argv(python: String, modules: &[String]) -> Vec<String> {
    let mut argv = vec![
        python,
        "-s".to_string(),
        "-c".to_string(),
        RUNNER.to_string(),
    ];
    argv.extend(modules.iter().cloned());
    argv
}

/// The jail `cold` describes, its python started on the runner, which
/// runs the script there (`python -s SCRIPT ARG...`) as a warm jail runs
/// its work: how every cold python run starts, so that it sends back its
/// images and displays. None for what is not a python run (no media
/// limits: an install jail), or not cold.
pub fn cold_on_runner(cold: &JailSpec) -> Option<JailSpec> {
    let MediaLimits { images, displays } = cold.media?;
    let script = cold.argv.get(2)?;
    if cold.warm || cold.session.is_some() || cold.argv.get(1).map(String::as_str) != Some("-s") {
        return None;
    }
    let mut spec = cold.clone();
    spec.argv = vec![
        cold.argv[0].clone(),
        "-s".to_string(),
        "-c".to_string(),
        COLD_RUNNER.to_string(),
        COLD_FLAG.to_string(),
        images.max_edge.to_string(),
        images.max_bytes.to_string(),
        displays.part_chars.to_string(),
        displays.total_bytes.to_string(),
        displays.count.to_string(),
        script.clone(),
    ];
    spec.argv.extend(cold.argv[3..].iter().cloned());
    Some(spec)
}

/// A text python starts on as `python -s -c TEXT ...`: a cold run's
/// runner, or the whole one (warm jails, zygotes, sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunnerText {
    Cold,
    Full,
}

impl RunnerText {
    /// The text python starts on under `spec`, if it starts on one.
    pub fn of(spec: &JailSpec) -> Option<RunnerText> {
        match spec.argv.get(1..4)? {
            [s, c, text] if s == "-s" && c == "-c" => [RunnerText::Cold, RunnerText::Full]
                .into_iter()
                .find(|t| t.text() == text),
            _ => None,
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            RunnerText::Cold => COLD_RUNNER,
            RunnerText::Full => RUNNER,
        }
    }

    /// A fingerprint of the text (64-bit FNV-1a, at build time), which
    /// names its compiled forms: a new runner never meets an old one's.
    pub fn id(self) -> u64 {
        match self {
            RunnerText::Cold => COLD_RUNNER_ID,
            RunnerText::Full => RUNNER_ID,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RunnerText::Cold => "cold",
            RunnerText::Full => "full",
        }
    }
}

/// `spec`, which starts python on a runner's text (`python -s -c TEXT
/// ...`), with python started instead on that text compiled for its
/// interpreter ([`PYC_COMPILER`]): the host file `pyc`, which the jailer
/// copies into the jail at [`RUNNER_PYC`]. None if `spec` starts on no
/// runner text.
pub fn on_compiled(spec: &JailSpec, pyc: &Path) -> Option<JailSpec> {
    RunnerText::of(spec)?;
    let mut compiled = spec.clone();
    compiled
        .argv
        .splice(2..4, [RUNNER_PYC.to_string()])
        .for_each(drop);
    compiled.runner_pyc = Some(pyc.to_path_buf());
    Some(compiled)
}

/// What compiles a runner's text for an interpreter, run by that
/// interpreter as `python -I -S -c PYC_COMPILER` with the text on stdin:
/// writes the `.pyc` python runs as its main file (the interpreter's magic
/// number, an unchecked header, the code as `-c` would compile it).
pub const PYC_COMPILER: &str = "import sys, marshal\n\
from importlib.util import MAGIC_NUMBER\n\
code = compile(sys.stdin.buffer.read(), '<string>', 'exec', dont_inherit=True)\n\
sys.stdout.buffer.write(MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n";

const COLD_RUNNER_ID: u64 = fnv1a(COLD_RUNNER.as_bytes());
const RUNNER_ID: u64 = fnv1a(RUNNER.as_bytes());

/// 64-bit FNV-1a of `bytes`: a fingerprint, not a defence against anyone.
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// The warm jail for runs that would get `cold` (a spec resolved for an
/// empty request): the same jail, with python on the runner importing
/// `modules`, and no script or stdin yet.
pub fn warm_spec(cold: &JailSpec, modules: &[String]) -> JailSpec {
    let mut spec = cold.clone();
    spec.argv = warm_argv(cold.argv[0].clone(), modules);
    spec.files.clear();
    spec.stdin.clear();
    spec.warm = true;
    spec
}

/// The zygote for runs of `warm` (a warm jail's spec, [`warm_spec`]): the
/// same jail, its runner a zygote importing the same modules, loading
/// `lib` (the host's `libpycell_zygote.so`, which its jailer hands it as
/// a sealed memfd), with one slot per id pair in `slots`. Its runs are
/// `warm` itself, each with a slot ([`pycell_wire::spec::FromZygote`]).
pub fn zygote_spec(
    warm: &JailSpec,
    lib: &std::path::Path,
    slots: Vec<pycell_wire::spec::SlotIds>,
) -> JailSpec {
    let mut spec = warm.clone();
    spec.argv.insert(4, ZYGOTE_FLAG.to_string());
    spec.zygote = Some(pycell_wire::spec::ZygoteSpec {
        slots,
        lib: lib.to_path_buf(),
    });
    spec
}

/// A run of a zygote's `runs` (its warm jail) forked from it in `slot`:
/// the same jail, which execs nothing (its program is the zygote's
/// runner, already running), so its argv keeps only the interpreter's
/// name (a spec's argv[0]); the runner's text, 30 KB, would only be
/// encoded and parsed again per run, by the jailer and by the zygote.
/// The launcher gives it its own run id, uid and cgroup.
pub fn forked_spec(runs: &JailSpec, slot: u32) -> JailSpec {
    let mut spec = runs.clone();
    spec.argv.truncate(1);
    spec.from_zygote = Some(pycell_wire::spec::FromZygote {
        slot,
        zygote_uid: runs.sandbox_uid,
    });
    // The zygote's channel goes to its jailer with the spec.
    spec.descriptors = vec![pycell_wire::spec::SpecFd::Zygote];
    spec
}

/// Whether a warm jail built from `warm` is exactly the jail `cold` (a
/// run's resolved spec) describes, but for what a run brings with its
/// work: its script, arguments, stdin, wall timeout and output cap.
pub fn fits(warm: &JailSpec, cold: &JailSpec) -> bool {
    let shape = |s: &JailSpec| {
        let mut s = s.clone();
        // What the launcher assigns, not the request.
        s.run_id.clear();
        (s.sandbox_uid, s.sandbox_gid) = (0, 0);
        s.cgroup = Default::default();
        s.descriptors.clear();
        s.argv.truncate(1);
        s.files.clear();
        s.stdin.clear();
        s.warm = false;
        // A warm jail forked from a zygote is that zygote's warm jail.
        s.from_zygote = None;
        s.limits.wall_timeout = Duration::ZERO;
        s.limits.max_output = Bytes(0);
        serde_json::to_value(s).ok()
    };
    if !warm.warm || cold.files.len() != 1 {
        return false;
    }
    let warm = shape(warm);
    warm.is_some() && warm == shape(cold)
}

/// The work a run resolved as `cold` brings to a warm jail.
pub fn work_for(cold: &JailSpec) -> Option<Work> {
    let script = cold.files.first()?;
    Some(Work {
        code: script.contents.clone(),
        filename: script.name.clone(),
        // argv: python, -s, the script, then the run's arguments.
        args: cold.argv.get(3..).unwrap_or_default().to_vec(),
        stdin: cold.stdin.clone(),
        wall_timeout: cold.limits.wall_timeout,
        max_output: cold.limits.max_output,
        media: cold.media,
    })
}

/// One run for a warm jail, from its launcher to its jailer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Work {
    pub code: String,
    /// The script's plain file name in /workspace (`main.py`).
    pub filename: String,
    /// `sys.argv[1:]`.
    pub args: Vec<String>,
    pub stdin: Vec<u8>,
    /// The run's own wall timeout and output cap (a request may set them;
    /// every other limit is the jail's, which the launcher matched),
    /// serialized as the jail's limits are.
    #[serde(rename = "wall_timeout_s", with = "pycell_wire::limits::seconds")]
    pub wall_timeout: Duration,
    #[serde(rename = "max_output_bytes")]
    pub max_output: Bytes,
    /// The images and displays the runner sends back when the code is
    /// done.
    #[serde(default)]
    pub media: Option<MediaLimits>,
}

/// Why a piece of work was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    #[error("{0:?} is not a plain file name")]
    FileName(String),
    #[error("an argument contains a NUL byte")]
    NulInArgument,
    #[error("the wall timeout must be positive and at most 30 days")]
    NoTimeout,
}

/// What the runner reads first on its stdin (its own stdin follows).
#[derive(Serialize)]
struct RunnerFrame<'a> {
    path: String,
    argv: &'a [String],
    code: &'a str,
    images: Option<ImageLimits>,
    displays: Option<DisplayLimits>,
}

impl Work {
    /// Check what the jailer relies on: a plain file name, no NUL in an
    /// argument, a positive timeout.
    pub fn validate(&self) -> Result<(), WorkError> {
        let n = self.filename.as_str();
        if n.is_empty() || n.contains('/') || n.contains('\0') || n == "." || n == ".." {
            return Err(WorkError::FileName(n.to_string()));
        }
        if self.args.iter().any(|a| a.contains('\0')) {
            return Err(WorkError::NulInArgument);
        }
        if self.wall_timeout.is_zero() || self.wall_timeout > pycell_wire::limits::MAX_CLOCK {
            return Err(WorkError::NoTimeout);
        }
        Ok(())
    }

    /// The bytes the jailer writes to the runner's stdin: its frame, then
    /// the run's stdin.
    pub fn runner_input(&self) -> Vec<u8> {
        let frame = RunnerFrame {
            path: format!("{WORKSPACE}/{}", self.filename),
            argv: &self.args,
            code: &self.code,
            images: self.media.map(|m| m.images),
            displays: self.media.map(|m| m.displays),
        };
        let mut out = pycell_wire::framing::encode_within(&frame, MAX_WORK_FRAME)
            .expect("a checked work frame fits, and strings serialize");
        out.extend_from_slice(&self.stdin);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python that defines the runner's core (read from stdin) in `ns`,
    /// without starting it, for a test to load parts and call them.
    const RUNNER_CORE: &str = r#"
import json, sys
src = sys.stdin.read()
core = src.rsplit("_pycell_start()", 1)[0]
ns = {}
exec(compile(core, "<string>", "exec"), ns)
"#;

    fn work() -> Work {
        Work {
            code: "print(1)".into(),
            filename: "main.py".into(),
            args: vec!["a".into()],
            stdin: b"in".to_vec(),
            wall_timeout: Duration::from_secs(1),
            max_output: Bytes(1 << 20),
            media: Some(MediaLimits {
                images: ImageLimits {
                    max_edge: 64,
                    max_bytes: 4096,
                },
                displays: DisplayLimits::default(),
            }),
        }
    }

    #[test]
    fn frames_round_trip_and_refuse_oversize() {
        use pycell_wire::framing::{encode_within, read_sync_within, FrameError};
        let buf = encode_within(&work(), MAX_WORK_FRAME).unwrap();
        let back: Work = read_sync_within(&mut buf.as_slice(), 1 << 20).unwrap();
        assert_eq!(back, work());
        let e = read_sync_within::<Work>(&mut buf.as_slice(), 8).unwrap_err();
        assert!(matches!(e, FrameError::TooLarge(_, 8)), "{e}");
        let e = read_sync_within::<Work>(&mut &b""[..], 8).unwrap_err();
        assert!(matches!(e, FrameError::Closed), "{e}");
        assert!(matches!(
            encode_within(&work(), 8),
            Err(FrameError::TooLarge(_, 8))
        ));
    }

    #[test]
    fn the_runner_gets_its_frame_then_the_stdin() {
        let input = work().runner_input();
        let len = u32::from_be_bytes(input[..4].try_into().unwrap()) as usize;
        let frame: serde_json::Value = serde_json::from_slice(&input[4..4 + len]).unwrap();
        assert_eq!(frame["path"], "/workspace/main.py");
        assert_eq!(frame["argv"], serde_json::json!(["a"]));
        assert_eq!(frame["code"], "print(1)");
        assert_eq!(frame["images"]["max_edge"], 64);
        assert_eq!(&input[4 + len..], b"in");
    }

    #[test]
    fn work_is_checked() {
        let mut w = work();
        w.filename = "../x".into();
        assert!(w.validate().is_err());
        let mut w = work();
        w.args = vec!["a\0b".into()];
        assert!(w.validate().is_err());
        let mut w = work();
        w.wall_timeout = Duration::ZERO;
        assert!(w.validate().is_err());
        assert!(work().validate().is_ok());
    }

    #[test]
    fn the_runner_is_one_argument_and_its_parts_compile() {
        // MAX_ARG_STRLEN: one argument of execve.
        assert!(RUNNER.len() < 128 << 10, "{}", RUNNER.len());
        let parts = [
            include_str!("warm.py"),
            include_str!("media.py"),
            include_str!("display.py"),
            include_str!("session.py"),
            include_str!("state.py"),
            include_str!("tools.py"),
            include_str!("explain.py"),
        ];
        for part in parts {
            assert!(!part.contains("'''"), "a part would end its quotes");
        }
        let check = r#"
import sys
src = sys.stdin.read()
core, start = src.rsplit("_pycell_start()", 1)
assert start.strip() == "", "the runner ends by starting"
ns = {}
exec(compile(core, "<string>", "exec"), ns)
for name, part in ns["_PYCELL_PARTS"].items():
    compile(part, "<string>", "exec")
print(sorted(ns["_PYCELL_PARTS"]))
"#;
        let out = python(&["-c", check], RUNNER.as_bytes());
        assert_eq!(
            out,
            "['display', 'explain', 'images', 'session', 'state', 'tools', 'warm']\n"
        );
        let out = python(&["-c", check], COLD_RUNNER.as_bytes());
        assert_eq!(out, "['display', 'explain', 'images', 'tools']\n");
    }

    #[test]
    fn a_forked_run_carries_no_runner_text_and_still_fits_its_zygote() {
        let python = || "/usr/bin/python3".to_string();
        let mut cold = spec_with_argv(vec![python(), "-s".into(), "/workspace/x.py".into()]);
        cold.files = vec![pycell_wire::spec::WorkspaceFile::text("x.py", "print(1)")];
        let warm = warm_spec(&cold, &[]);
        let forked = forked_spec(&warm, 3);
        assert_eq!(forked.argv, [python()]);
        assert_eq!(forked.from_zygote.as_ref().map(|z| z.slot), Some(3));
        let size = |s: &JailSpec| serde_json::to_vec(s).map(|v| v.len()).unwrap_or(0);
        assert!(size(&warm) > RUNNER.len(), "{}", size(&warm));
        assert!(size(&forked) < 4096, "{}", size(&forked));
        assert!(
            fits(&forked, &cold),
            "a forked run is its zygote's warm jail"
        );
        forked.validate().expect("a forked run's spec is valid");
    }

    #[test]
    fn a_session_jail_fits_whatever_its_launcher_assigned_it() {
        let cold = spec_with_argv(vec!["/usr/bin/python3".into(), "-s".into()]);
        let clocks = pycell_wire::spec::SessionSpec {
            idle_timeout_ms: 1000,
            lifetime_ms: 60_000,
            cell_grace_ms: 500,
        };
        let wanted = session::session_spec(&cold, &[], clocks);
        let mut member = wanted.clone();
        member.run_id = "r-2e".into();
        member.sandbox_uid += 1;
        member.cgroup.keep = true;
        member.descriptors = vec![pycell_wire::spec::SpecFd::Outcome];
        assert!(session::fits_session(&member, &wanted));
        member.limits.pids += 1;
        assert!(!session::fits_session(&member, &wanted));
        assert!(!session::fits_session(&cold, &cold), "not a session");
    }

    fn spec_with_argv(argv: Vec<String>) -> JailSpec {
        serde_json::from_value(serde_json::json!({
            "run_id": "r-1f", "sandbox_uid": 1_800_000_001u32, "sandbox_gid": 1_800_000_001u32,
            "argv": argv, "env": [], "files": [], "mounts": [],
            "limits": {"wall_timeout_s": 1.0, "cpu_time_s": 1.0, "memory_bytes": 64 << 20,
                       "pids": 16, "cpus": 1.0, "open_files": 64,
                       "file_size_bytes": 1 << 20, "disk_bytes": 1 << 20, "max_output_bytes": 1 << 20,
                       "inotify_instances": 16, "inotify_watches": 8192},
            "landlock": {"min_abi": 1, "read_exec": [], "read_only": [], "read_write": []},
            "seccomp_profile": "default", "cgroup": {"parent": "pycell"},
            "media": {"images": {"max_edge": 64, "max_bytes": 4096},
                      "displays": {"part_chars": 100, "total_bytes": 1000, "count": 2}},
        }))
        .unwrap()
    }

    #[test]
    fn a_runner_text_gives_way_to_its_compiled_form_and_nothing_else_does() {
        let python = || "/usr/bin/python3".to_string();
        let cold = spec_with_argv(vec![
            python(),
            "-s".into(),
            "/workspace/a.py".into(),
            "x".into(),
        ]);
        let on = cold_on_runner(&cold).unwrap();
        assert_eq!(RunnerText::of(&on), Some(RunnerText::Cold));
        let pyc = Path::new("/var/cache/pycell/runner/cold-1-2.pyc");
        let compiled = on_compiled(&on, pyc).unwrap();
        assert_eq!(
            compiled.argv[..3],
            [python(), "-s".into(), RUNNER_PYC.to_string()]
        );
        // The rest of the command line is the runner's, unchanged.
        assert_eq!(compiled.argv[3..], on.argv[4..]);
        assert_eq!(compiled.argv.last().map(String::as_str), Some("x"));
        assert_eq!(compiled.runner_pyc.as_deref(), Some(pyc));
        compiled.validate().unwrap();
        // The whole runner (warm jails, zygotes, sessions) too.
        let warm = spec_with_argv(warm_argv(python(), &["json".into()]));
        assert_eq!(RunnerText::of(&warm), Some(RunnerText::Full));
        let compiled = on_compiled(&warm, pyc).unwrap();
        assert_eq!(compiled.argv[2..], [RUNNER_PYC.to_string(), "json".into()]);
        // A script, or any other text, is not a runner.
        assert_eq!(RunnerText::of(&cold), None);
        assert!(on_compiled(&cold, pyc).is_none());
        let other = spec_with_argv(vec![python(), "-s".into(), "-c".into(), "print(1)".into()]);
        assert!(on_compiled(&other, pyc).is_none());
        // A spec naming a compiled runner python does not start on is refused.
        let mut wrong = on.clone();
        wrong.runner_pyc = Some(pyc.to_path_buf());
        assert!(wrong.validate().is_err());
    }

    #[test]
    fn a_cold_run_runs_its_script_with_its_arguments_and_stdin() {
        let dir = std::env::temp_dir().join(format!("pycell-runner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("main.py");
        std::fs::write(
            &script,
            "import sys\nprint(sys.argv[1:], sys.stdin.read())\n",
        )
        .unwrap();
        let script = script.display().to_string();
        let argv = [
            "-s",
            "-c",
            COLD_RUNNER,
            COLD_FLAG,
            "1024",
            "1048576",
            "16384",
            "262144",
            "16",
            &script,
            "a",
        ];
        let out = python(&argv, b"in");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out, "['a'] in\n");
    }

    #[test]
    fn displays_take_the_richest_form_within_their_bounds() {
        let check = RUNNER_CORE.to_string()
            + r#"
ns["_pycell_load"]("display")
ns["_PYCELL_SHOWN"]["limits"] = {"part_chars": 300, "total_bytes": 2000, "count": 4}
class Rich:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "rich", "application/json": {"a": [1]}, "image/png": b"not a png"}
    def _repr_markdown_(self):
        return "**rich**"
class Broken:
    def _repr_html_(self):
        raise ValueError("no")
    def __repr__(self):
        raise RuntimeError("no repr")
big = {"k%d" % i: {"a": i, "b": [1, 2]} for i in range(1000)}
ns["_pycell_show"]((Rich(), Broken(), big, "x" * 1000, 5, 6))
displays, omitted = ns["_pycell_take_displays"]()
print(json.dumps([displays, omitted]))
"#;
        let out = python(&["-c", &check], RUNNER.as_bytes());
        let (displays, omitted): (Vec<serde_json::Value>, u32) =
            serde_json::from_str(&out).unwrap();
        assert_eq!(omitted, 2, "{out}");
        let [rich, broken, big, long] = &displays[..] else {
            panic!("{out}")
        };
        assert_eq!(rich["markdown"], "**rich**");
        assert_eq!(rich["json"], r#"{"a": [1]}"#);
        assert!(rich.get("png").is_none(), "not a PNG: {rich}");
        assert_eq!(broken["text"], "<repr failed: RuntimeError: no repr>");
        let summary = big["text"].as_str().unwrap();
        assert!(
            summary.starts_with("<dict of 1,000 items")
                && summary.contains("shape: {str: {'a': int, 'b': [int]}}")
                && summary.chars().count() <= 300
                && big["truncated"] == true,
            "{summary}"
        );
        let long = long["text"].as_str().unwrap();
        assert!(
            long.chars().count() <= 300 && long.contains("characters cut"),
            "{long}"
        );
    }

    #[test]
    fn an_exception_from_a_refusal_gets_a_line_naming_the_layer_and_others_none() {
        let check = RUNNER_CORE.to_string()
            + r#"
import errno, socket
ns["_pycell_load"]("explain")
line = ns["_pycell_refusal_line"]
def raised(e):
    try:
        raise e
    except BaseException as caught:
        return caught
def chained():
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as e:
        try:
            raise ValueError("saving failed") from e
        except ValueError as v:
            return v
cases = [
    raised(PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")),
    raised(MemoryError()),
    raised(OSError(errno.EPERM, "Operation not permitted")),
    raised(socket.gaierror(-2, "Name or service not known")),
    chained(),
    raised(ValueError("boom")),
    raised(FileNotFoundError(errno.ENOENT, "No such file", "/x")),
    raised(KeyboardInterrupt()),
]
for e in cases:
    print(str(line(e)).rstrip("\n"))
"#;
        let out = python(&["-c", &check], RUNNER.as_bytes());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 8, "{out}");
        let has = |i: usize, words: &[&str]| {
            for w in words {
                assert!(lines[i].contains(w), "line {i} lacks {w:?}: {}", lines[i]);
            }
            assert!(lines[i].starts_with("pycell: "), "{}", lines[i]);
        };
        has(0, &["layer landlock", "/etc/shadow", "/workspace"]);
        has(1, &["layer memory", "limits.memory"]);
        has(2, &["layer seccomp"]);
        has(3, &["no network", "did not resolve"]);
        has(4, &["layer disk", "limits.disk"]);
        assert_eq!(&lines[5..], ["None", "None", "None"], "{out}");
    }

    fn python(args: &[&str], stdin: &[u8]) -> String {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut child = Command::new("python3")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn the_runner_marks_ready_as_the_jailer_expects() {
        let marker = String::from_utf8_lossy(READY_MARKER).replace('\0', "\\0");
        assert!(RUNNER.contains(&format!("b\"{marker}\"")), "{marker}");
        let argv = warm_argv("/usr/bin/python3".into(), &["numpy".into()]);
        assert_eq!(argv[..3], ["/usr/bin/python3", "-s", "-c"]);
        assert_eq!(argv.last().unwrap(), "numpy");
    }

    /// A session's state bundle (`state.py`, on `session.py`'s safe paths),
    /// written from one `__main__` and /workspace and loaded into others.
    #[test]
    fn a_sessions_state_is_carried_to_another_and_what_cannot_be_is_named() {
        let check = r#"
import builtins, os, sys, tempfile, threading, types
ns = {"__name__": "__main__", "__builtins__": builtins}
exec(compile(sys.stdin.read(), "<runner parts>", "exec"), ns)
def session(workspace):
    ns["_PYCELL_WORKSPACE"] = workspace
    m = types.ModuleType("__main__")
    m.__builtins__ = builtins
    sys.modules["__main__"] = m
    return m
source_ws = tempfile.mkdtemp()
source = session(source_ws)
exec("""
import math, random, threading
x = 41
def inc(n, k=1):
    return n + k
class Counter:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += 1
        return self.n
c = Counter()
c.bump()
shared = [1, 2]
holder = {"list": shared}
rng = random.Random(7)
adder = (lambda base: lambda y: y + base)(10)
f = open("/dev/null")
lock = threading.Lock()
""", source.__dict__)
os.makedirs(source_ws + "/data")
with open(source_ws + "/data/a.txt", "w") as out:
    out.write("hello")
os.symlink("/etc/passwd", source_ws + "/link")
bundle, left = ns["_pycell_state_bundle"](source, 1 << 20)
print(sorted(left["dropped"]), left["skipped"], left["reseeded"])
try:
    ns["_pycell_state_bundle"](source, 64)
    print("not refused")
except ns["_PycellRefusal"] as e:
    print("refused:", "more than the 64" in str(e))
for _ in range(2):
    fork_ws = tempfile.mkdtemp()
    fork = session(fork_ws)
    loaded = ns["_pycell_state_load"](fork, bundle)
    print(loaded["files"], "x" in loaded["names"], "f" in loaded["names"])
    exec("""
x += 1
print(x, inc(1), c.bump(), isinstance(c, Counter), holder["list"] is shared, adder(1), math.floor(1.5))
print(rng.random() != random.Random(7).random())
""", fork.__dict__)
    print(open(fork_ws + "/data/a.txt").read(), os.path.lexists(fork_ws + "/link"))
print(source.x, source.c.n)
"#;
        let parts = [include_str!("session.py"), include_str!("state.py")].join("\n");
        let out = python(&["-c", check], parts.as_bytes());
        assert_eq!(
            out,
            "['f', 'lock'] {'link': 'not a regular file (symlink)'} ['Random']\n\
             refused: True\n\
             1 True False\n\
             42 2 2 True True 11 1\n\
             True\n\
             hello False\n\
             1 True False\n\
             42 2 2 True True 11 1\n\
             True\n\
             hello False\n\
             41 1\n"
        );
    }
}
