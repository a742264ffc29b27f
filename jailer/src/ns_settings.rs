//! Settings of the jail's own namespaces, made by its first process while it
//! still has its namespace capabilities and the host's /proc:
//!
//! - a time namespace for everything it forks, with the monotonic and boot
//!   clocks moved back so that they start near zero: the host's uptime and
//!   boot time are a fingerprint of the machine (`/proc/uptime`,
//!   `CLOCK_BOOTTIME`, `time.monotonic()`), the same for every run on it;
//! - `vm.memfd_noexec = 2` in the jail's pid namespace (Linux 6.3+; the
//!   setting is per pid namespace and can only be raised): every memfd is
//!   sealed non-executable, so code the run writes into one cannot be run.
//!   Without it the jailer refuses `memfd_create` in the seccomp filter
//!   instead (see `supervisor::preflight`).

use std::fs;
use std::io;

use nix::sched::{unshare, CloneFlags};
use nix::time::{clock_gettime, ClockId};
pub(crate) use pycell_host::kernel::{memfd_noexec_available, MEMFD_NOEXEC};

/// "memfd_create() without MFD_NOEXEC_SEAL gets it; MFD_EXEC is refused".
const MEMFD_NOEXEC_ENFORCED: &str = "2";

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

/// Seal every memfd of our pid namespace non-executable, where the kernel
/// can. A pid namespace starts with its parent's setting: a run forked
/// from a zygote finds it set already (and could not write it: the file
/// is the host root's).
pub(crate) fn seal_memfds() -> io::Result<()> {
    if !memfd_noexec_available() {
        return Ok(());
    }
    if fs::read_to_string(MEMFD_NOEXEC).is_ok_and(|v| v.trim() == MEMFD_NOEXEC_ENFORCED) {
        return Ok(());
    }
    fs::write(MEMFD_NOEXEC, MEMFD_NOEXEC_ENFORCED)
        .map_err(|e| io::Error::other(format!("writing {MEMFD_NOEXEC}: {e}")))
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
