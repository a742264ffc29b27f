//! Does this kernel stop the jail from labelling its own files?
//!
//! An unprivileged process must not set `security.*` attributes (LSM labels,
//! IMA/EVM data) or `trusted.*` ones, even on a tmpfs its user namespace
//! owns: the kernel's capability check refuses them with `EPERM`. Some
//! kernels skip that check. On Debian 12's 6.1 the BPF LSM answers the
//! `inode_setxattr` hook with 0, and the capability check only runs when no
//! LSM answered. The jail's init asks its own kernel, as the program will
//! run (no capabilities left, in the jail's /workspace), and where the answer is
//! anything but `EPERM` the seccomp filter refuses every xattr write
//! ([`pycell_seccomp::KernelGap::SecurityXattrs`]); seccomp cannot read the
//! attribute's name, so `user.*` goes too on such a kernel.

use std::io;
use std::os::fd::AsFd;

use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;

use pycell_syscall as syscall;

/// The attributes tried: the labels the LSMs and IMA/EVM read, one name no
/// LSM owns (the plain capability check), and `trusted.*`.
const TRIED: [&str; 8] = [
    "security.selinux",
    "security.SMACK64",
    "security.apparmor",
    "security.ima",
    "security.evm",
    "security.pycell-check",
    "trusted.pycell-check",
    "trusted.overlay.opaque",
];

/// Whether the kernel refused every attempt with `EPERM`. Anything else
/// (success, another errno, no attempt at all) means it cannot be relied on.
pub(crate) fn kernel_refuses(attempts: &[io::Result<()>]) -> bool {
    !attempts.is_empty()
        && attempts
            .iter()
            .all(|a| matches!(a, Err(e) if e.raw_os_error() == Some(libc::EPERM)))
}

/// Try to set the [`TRIED`] attributes on an unnamed file in `dir` (an
/// `O_TMPFILE`, gone when closed). To be called with the jail's credentials
/// and no capabilities, before the seccomp filter.
pub(crate) fn kernel_refuses_in(dir: &str) -> bool {
    let file = match open(
        dir,
        OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    ) {
        Ok(fd) => fd,
        Err(_) => return false,
    };
    let attempts: Vec<io::Result<()>> = TRIED
        .iter()
        .map(|name| syscall::fsetxattr(file.as_fd(), name, b"1"))
        .collect();
    kernel_refuses(&attempts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(n: i32) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(n))
    }

    #[test]
    fn only_eperm_for_every_attempt_counts_as_refused() {
        assert!(kernel_refuses(&[errno(libc::EPERM), errno(libc::EPERM)]));
        assert!(!kernel_refuses(&[errno(libc::EPERM), Ok(())]));
        assert!(!kernel_refuses(&[Ok(()), errno(libc::EPERM)]));
        // A filesystem without the handler, a full disk, anything unexpected:
        // not a refusal we can rely on.
        assert!(!kernel_refuses(&[
            errno(libc::EOPNOTSUPP),
            errno(libc::EPERM)
        ]));
        assert!(!kernel_refuses(&[errno(libc::ENOSPC), errno(libc::EPERM)]));
        assert!(!kernel_refuses(&[]));
    }
}
