//! What this kernel offers that the jail's setup depends on, probed the
//! same way by the jailer (to decide) and by `pycell info` (to report).

use std::path::Path;

/// The per-pid-namespace memfd setting (absent before Linux 6.3).
pub const MEMFD_NOEXEC: &str = "/proc/sys/vm/memfd_noexec";
/// Whether this kernel can seal every memfd of a pid namespace
/// non-executable, and we may set it: /proc/sys is read-only under
/// systemd's ProtectKernelTunables= (pycelld's unit), and then memfd_create
/// is refused instead.
pub fn memfd_noexec_available() -> bool {
    let writable = nix::sys::statvfs::statvfs("/proc/sys/vm")
        .is_ok_and(|s| !s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    Path::new(MEMFD_NOEXEC).exists() && writable
}
