//! Settings of the jail's own namespaces, made by its first process while it
//! still has its namespace capabilities and the host's /proc:
//!
//! - a time namespace for everything it forks, with the monotonic and boot
//!   clocks moved back so that they start near zero: the host's uptime and
//!   boot time are a fingerprint of the machine (`/proc/uptime`,
//!   `CLOCK_BOOTTIME`, `time.monotonic()`), the same for every run on it;
//!
//! - the per-user counters its user namespace bounds
//!   (`/proc/sys/user/max_*`): inotify instances and watches as the policy
//!   says, fanotify none. Written in the jail's own fresh /proc (the
//!   host's /proc/sys is read-only under pycelld's unit) while the jail's
//!   init still has CAP_SYS_RESOURCE over its namespace; the program,
//!   without it, can only read them.
//!
//! No `vm.memfd_noexec`: the kernel lets only host root set it, and a
//! jail's init is its sandbox uid (the owner of its user namespace, see
//! `crate::setup::ns_owner`); `memfd_create` is refused by the seccomp profile
//! instead.

use std::fs;
use std::io;
use std::path::Path;

use pycell_wire::limits::RunLimits;

use nix::sched::{unshare, CloneFlags};
use nix::time::{clock_gettime, ClockId};

/// The `/proc/self/timens_offsets` text that moves `monotonic` and
/// `boottime` back by their whole seconds now, so that they read between 0
/// and 1 s when the program starts. The kernel refuses offsets that would
/// make a clock negative; whole seconds never do.
pub(crate) fn clock_offsets(monotonic_s: i64, boottime_s: i64) -> String {
    format!("monotonic {} 0\nboottime {} 0\n", -monotonic_s, -boottime_s)
}

fn seconds(clock: ClockId) -> io::Result<i64> {
    Ok(clock_gettime(clock).map_err(io::Error::from)?.tv_sec())
}

/// The offsets (whole seconds) of the time namespace we are in, from
/// `/proc/self/timens_offsets` ("monotonic S N" and "boottime S N"
/// lines): 0 in the host's, the zygote's in a run forked from a zygote.
pub(crate) fn current_offsets(text: &str) -> Option<(i64, i64)> {
    let mut found = (None, None);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(clock), Some(secs)) = (words.next(), words.next()) else {
            continue;
        };
        let secs = secs.parse::<i64>().ok();
        match clock {
            "monotonic" => found.0 = secs,
            "boottime" => found.1 = secs,
            _ => {}
        }
    }
    Some((found.0?, found.1?))
}

/// A new time namespace for the children of this process, its clocks near
/// 0. Offsets count from the host's clocks, not ours (which a zygote's
/// time namespace moved already): ours minus our own offsets.
pub(crate) fn new_time_namespace() -> io::Result<()> {
    let ours = fs::read_to_string("/proc/self/timens_offsets")
        .map_err(|e| io::Error::other(format!("reading /proc/self/timens_offsets: {e}")))?;
    let (mono_off, boot_off) = current_offsets(&ours)
        .ok_or_else(|| io::Error::other(format!("/proc/self/timens_offsets reads {ours:?}")))?;
    let offsets = clock_offsets(
        seconds(ClockId::CLOCK_MONOTONIC)? - mono_off,
        seconds(ClockId::CLOCK_BOOTTIME)? - boot_off,
    );
    unshare(CloneFlags::from_bits_retain(libc::CLONE_NEWTIME))
        .map_err(|e| io::Error::other(format!("unshare(CLONE_NEWTIME): {e}")))?;
    fs::write("/proc/self/timens_offsets", offsets)
        .map_err(|e| io::Error::other(format!("writing /proc/self/timens_offsets: {e}")))
}

/// The `/proc/sys/user` limits of a jail's user namespace, by file name.
pub(crate) fn user_limits(l: &RunLimits) -> Vec<(&'static str, u64)> {
    vec![
        ("max_inotify_instances", u64::from(l.inotify_instances)),
        ("max_inotify_watches", l.inotify_watches),
        ("max_fanotify_groups", 0),
        ("max_fanotify_marks", 0),
    ]
}

/// Write `limits` into `proc_dir/sys/user` (the kernel applies them to the
/// writer's user namespace) and read each back. A kernel without the
/// counter (no inotify or fanotify built in) has no file and nothing to
/// bound.
pub(crate) fn set_user_limits(proc_dir: &Path, limits: &[(&str, u64)]) -> io::Result<()> {
    for (name, value) in limits {
        let path = proc_dir.join("sys/user").join(name);
        let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        match fs::write(&path, value.to_string()) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            other => other.map_err(context)?,
        }
        let read = fs::read_to_string(&path).map_err(context)?;
        if read.trim() != value.to_string() {
            return Err(io::Error::other(format!(
                "{} reads {:?} after writing {value}",
                path.display(),
                read.trim()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_offsets_are_read_from_the_kernels_lines() {
        assert_eq!(
            current_offsets("monotonic 0 0\nboottime 0 0\n"),
            Some((0, 0))
        );
        assert_eq!(
            current_offsets("monotonic -4242 0\nboottime -4250 0\n"),
            Some((-4242, -4250))
        );
        assert_eq!(current_offsets("monotonic -1 0\n"), None);
    }

    #[test]
    fn offsets_move_both_clocks_back_by_whole_seconds() {
        assert_eq!(
            clock_offsets(12345, 23456),
            "monotonic -12345 0\nboottime -23456 0\n"
        );
    }
}
