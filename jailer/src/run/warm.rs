//! A warm jail's life in the relay: warming up (the runner imports its
//! modules; whatever it prints is kept aside, never streamed as a run's
//! output) until the runner's ready marker; ready (the launcher is told,
//! with an event, and the jail waits, without clocks, for its work); then
//! running, from the moment the work frame is whole.
//!
//! The pure parts (the marker's scan, the work frame's assembly, the CPU
//! clock's arithmetic) are here, with the restart of the program's CPU
//! clock when its work comes ([`restart_cpu_clock`]); the relay does the
//! rest of the I/O.

use std::time::Instant;

use nix::unistd::Pid;
use pycell_host::cgroup::SandboxCgroup;
use pycell_runner::{Work, MAX_WORK_FRAME, READY_MARKER};
use pycell_wire::framing::frame_len;
use pycell_wire::spec::JailSpec;

use crate::setup::rlimits::{self, PrlimitFailed};

/// Warm-up output kept for the jailer's own stderr (when the jail fails
/// before it is ready).
const KEPT_WARM_UP_OUTPUT: usize = 16 << 10;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Phase {
    WarmingUp,
    Ready { since: Instant },
    Running { since: Instant, waited_ms: f64 },
}

/// What the relay tracks of a warm jail before its work runs.
#[derive(Debug)]
pub(crate) struct WarmState {
    pub phase: Phase,
    /// The end of what was scanned so far, in case the marker spans reads.
    tail: Vec<u8>,
    /// Warm-up output, up to [`KEPT_WARM_UP_OUTPUT`].
    pub warm_up_output: Vec<u8>,
    /// The work frame as it arrives.
    incoming: Vec<u8>,
}

/// What a chunk of the work channel amounted to.
#[derive(Debug, PartialEq)]
pub(crate) enum Arrival {
    Partial,
    Whole(Box<Work>),
    Bad(String),
}

impl WarmState {
    pub fn new() -> WarmState {
        WarmState {
            phase: Phase::WarmingUp,
            tail: Vec::new(),
            warm_up_output: Vec::new(),
            incoming: Vec::new(),
        }
    }

    pub fn running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    /// Output before the run: kept aside. True when the runner's ready
    /// marker is in it (on stdout) and the jail has just become ready.
    pub fn warm_up_output(&mut self, stdout: bool, bytes: &[u8], now: Instant) -> bool {
        let room = KEPT_WARM_UP_OUTPUT.saturating_sub(self.warm_up_output.len());
        self.warm_up_output
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        if !stdout || self.phase != Phase::WarmingUp {
            return false;
        }
        let mut scan = std::mem::take(&mut self.tail);
        scan.extend_from_slice(bytes);
        if scan.windows(READY_MARKER.len()).any(|w| w == READY_MARKER) {
            self.phase = Phase::Ready { since: now };
            return true;
        }
        let keep = scan.len().min(READY_MARKER.len() - 1);
        self.tail = scan[scan.len() - keep..].to_vec();
        false
    }

    /// Bytes from the work channel. Work that comes before the jail is
    /// ready, or a frame that does not decode, is [`Arrival::Bad`].
    pub fn work_bytes(&mut self, bytes: &[u8], now: Instant) -> Arrival {
        let Phase::Ready { since } = self.phase else {
            return Arrival::Bad("work arrived before the jail was ready".into());
        };
        self.incoming.extend_from_slice(bytes);
        if self.incoming.len() < 4 {
            return Arrival::Partial;
        }
        let head = [
            self.incoming[0],
            self.incoming[1],
            self.incoming[2],
            self.incoming[3],
        ];
        let len = match frame_len(head, MAX_WORK_FRAME) {
            Ok(l) => l,
            Err(e) => return Arrival::Bad(e.to_string()),
        };
        if self.incoming.len() < 4 + len {
            return Arrival::Partial;
        }
        if self.incoming.len() > 4 + len {
            return Arrival::Bad("bytes after the work frame".into());
        }
        let work: Work = match serde_json::from_slice(&self.incoming[4..]) {
            Ok(w) => w,
            Err(e) => return Arrival::Bad(format!("the work frame: {e}")),
        };
        if let Err(e) = work.validate() {
            return Arrival::Bad(format!("the work frame: {e}"));
        }
        self.incoming = Vec::new();
        self.phase = Phase::Running {
            since: now,
            waited_ms: now.duration_since(since).as_secs_f64() * 1000.0,
        };
        Arrival::Whole(Box::new(work))
    }
}

/// What kills a program that ignores SIGXCPU at its soft CPU limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuBackstop {
    /// The hard limit, a second after the soft one: a warm run's, whose
    /// clock restarts once.
    HardLimit,
    /// Its wall clock (SIGINT, then the session ends): a session's request,
    /// whose clock restarts at every request. Its hard limit stays the
    /// jail's, since one lowered cannot be raised again (that takes a
    /// capability the jailer need not have), and each request needs a
    /// soft limit past what the ones before used.
    WallClock,
}

/// RLIMIT_CPU (soft, hard) for a program that has used `used_ticks` of
/// CPU (clock ticks of `ticks_per_s`) when its run starts with `cpu_time_s`
/// of its own; never above the hard limit it has (`hard_now`: raising one
/// takes a capability the jailer need not have).
pub(crate) fn cpu_clock_from_now(
    used_ticks: u64,
    ticks_per_s: u64,
    cpu_time_s: u64,
    hard_now: u64,
    backstop: CpuBackstop,
) -> (u64, u64) {
    let used_s = used_ticks.div_ceil(ticks_per_s.max(1));
    let soft = used_s
        .saturating_add(cpu_time_s)
        .min(hard_now.saturating_sub(1));
    match backstop {
        CpuBackstop::HardLimit => (soft, soft.saturating_add(1).min(hard_now)),
        CpuBackstop::WallClock => (soft, hard_now),
    }
}

/// Field `n` (numbered from 1, as in proc(5)) of a `/proc/PID/stat` line,
/// parsed; the command (field 2) may hold spaces and parentheses.
fn stat_field<T: std::str::FromStr>(stat: &str, n: usize) -> Option<T> {
    // What follows the command's last `)` starts at field 3 (state).
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(n.checked_sub(3)?)?.parse().ok()
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line.
pub(crate) fn cpu_ticks(stat: &str) -> Option<u64> {
    Some(stat_field::<u64>(stat, 14)? + stat_field::<u64>(stat, 15)?)
}

/// The parent pid (field 4) of a `/proc/PID/stat` line.
pub(crate) fn parent_pid(stat: &str) -> Option<i32> {
    stat_field(stat, 4)
}

/// Why a warm jail's or a session request's CPU clock did not restart.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CpuClockError {
    #[error("the jail's program is gone")]
    ProgramGone,
    #[error("the program's stat is unreadable")]
    StatUnreadable,
    #[error(transparent)]
    Prlimit(#[from] PrlimitFailed),
}

/// A warm jail's work has come: its program (the child of the jail's init,
/// `init`, in the run's `cgroup`) gets `cpu_time_s` of CPU from now,
/// RLIMIT_CPU counting what its warm-up used. Lowering a limit needs no
/// capability. The program is found through the cgroup, not
/// /proc/<init>/task/*/children: init is not dumpable after its credential
/// change, so under pycelld.service (no CAP_SYS_PTRACE, `ProtectProc=
/// invisible`) its /proc directory is hidden from the jailer.
///
/// `jail_cpu_time_s` is the CPU time the jail started with (its hard
/// limit): a run's own for a warm jail, the whole session's for a
/// session, whose requests each get `cpu_time_s` from there.
pub(crate) fn restart_cpu_clock(
    spec: &JailSpec,
    init: Pid,
    cgroup: &SandboxCgroup,
    cpu_time_s: u64,
    jail_cpu_time_s: u64,
    backstop: CpuBackstop,
) -> Result<(), CpuClockError> {
    let program = cgroup
        .processes()
        .into_iter()
        .filter(|p| *p != init)
        .find_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            (parent_pid(&stat) == Some(init.as_raw())).then_some((p, stat))
        });
    let (program, stat) = program.ok_or(CpuClockError::ProgramGone)?;
    let used = cpu_ticks(&stat).ok_or(CpuClockError::StatUnreadable)?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    let hard = rlimits::cpu_seconds_hard(jail_cpu_time_s);
    let (soft, hard) = cpu_clock_from_now(used, ticks, cpu_time_s, hard, backstop);
    // As the owner of the jail's user namespace: pycelld's jailer has no
    // CAP_SYS_RESOURCE over it otherwise (see `crate::setup::ns_owner`).
    crate::setup::ns_owner::as_jail_owner(spec, || {
        pycell_syscall::prlimit(program, libc::RLIMIT_CPU, soft, hard)
    })
    .and_then(|r| r)
    .map_err(|source| {
        CpuClockError::from(PrlimitFailed {
            name: "RLIMIT_CPU",
            soft,
            hard,
            source,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::framing::encode_within;
    use std::time::Duration;

    fn work() -> Work {
        Work {
            code: "print(1)".into(),
            filename: "main.py".into(),
            args: vec![],
            stdin: vec![],
            wall_timeout: std::time::Duration::from_secs(5),
            max_output: pycell_wire::limits::Bytes(1024),
            media: None,
        }
    }

    #[test]
    fn the_marker_is_found_across_reads_and_only_on_stdout() {
        let t0 = Instant::now();
        let mut w = WarmState::new();
        assert!(!w.warm_up_output(false, READY_MARKER, t0));
        assert!(!w.warm_up_output(true, b"numpy says hi\n\0pycell-wa", t0));
        assert_eq!(w.phase, Phase::WarmingUp);
        assert!(w.warm_up_output(true, b"rm-ready\0", t0));
        assert_eq!(w.phase, Phase::Ready { since: t0 });
        assert!(String::from_utf8_lossy(&w.warm_up_output).starts_with("\0pycell"));
        // Once ready, a second marker changes nothing.
        assert!(!w.warm_up_output(true, READY_MARKER, t0));
    }

    #[test]
    fn work_runs_once_whole_and_not_before_ready() {
        let t0 = Instant::now();
        let mut w = WarmState::new();
        let frame = encode_within(&work(), MAX_WORK_FRAME).unwrap();
        assert!(matches!(w.work_bytes(&frame, t0), Arrival::Bad(_)));
        let mut w = WarmState::new();
        w.warm_up_output(true, READY_MARKER, t0);
        let later = t0 + Duration::from_millis(250);
        assert_eq!(w.work_bytes(&frame[..3], later), Arrival::Partial);
        assert_eq!(w.work_bytes(&frame[3..10], later), Arrival::Partial);
        assert_eq!(
            w.work_bytes(&frame[10..], later),
            Arrival::Whole(Box::new(work()))
        );
        match w.phase {
            Phase::Running { since, waited_ms } => {
                assert_eq!(since, later);
                assert!((waited_ms - 250.0).abs() < 1.0, "{waited_ms}");
            }
            other => panic!("{other:?}"),
        }
        // A second piece of work is refused.
        assert!(matches!(w.work_bytes(&frame, later), Arrival::Bad(_)));
    }

    #[test]
    fn bad_work_frames_are_refused() {
        let t0 = Instant::now();
        let ready = || {
            let mut w = WarmState::new();
            w.warm_up_output(true, READY_MARKER, t0);
            w
        };
        let mut bad = work();
        bad.filename = "a/b".into();
        let frame = encode_within(&bad, MAX_WORK_FRAME).unwrap();
        assert!(
            matches!(ready().work_bytes(&frame, t0), Arrival::Bad(m) if m.contains("plain file name"))
        );
        let mut frame = encode_within(&work(), MAX_WORK_FRAME).unwrap();
        frame.push(b'x');
        assert!(matches!(ready().work_bytes(&frame, t0), Arrival::Bad(_)));
        let huge = u32::MAX.to_be_bytes();
        assert!(
            matches!(ready().work_bytes(&huge, t0), Arrival::Bad(m) if m.contains("exceeds the maximum"))
        );
    }

    #[test]
    fn the_cpu_clock_restarts_but_never_above_the_hard_limit() {
        use CpuBackstop::{HardLimit, WallClock};
        // 2.01 s used at 100 ticks/s: 3 s rounded up, plus the run's 10 s.
        assert_eq!(cpu_clock_from_now(201, 100, 10, 131, HardLimit), (13, 14));
        assert_eq!(cpu_clock_from_now(0, 100, 10, 131, HardLimit), (10, 11));
        // A warm-up that used its whole allowance: clamped.
        assert_eq!(
            cpu_clock_from_now(100 * 500, 100, 10, 131, HardLimit),
            (130, 131)
        );
        // A session's requests: the hard limit stays, so that each next
        // request's soft limit can be past what the last ones used.
        assert_eq!(cpu_clock_from_now(100, 100, 1, 131, WallClock), (2, 131));
        assert_eq!(cpu_clock_from_now(2500, 100, 10, 131, WallClock), (35, 131));
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "42 (python3 (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0";
        assert_eq!(cpu_ticks(stat), Some(12));
        assert_eq!(cpu_ticks("garbage"), None);
        assert_eq!(parent_pid(stat), Some(1));
        assert_eq!(parent_pid("7 (a) S x"), None);
    }
}
