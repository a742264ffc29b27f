//! The jail's root file system, built inside the new mount namespace:
//! a small tmpfs root holding read-only binds of the interpreter (and any
//! policy mounts), a fresh /proc, a minimal /dev, one size-limited tmpfs
//! whose directories are /workspace, /tmp and /dev/shm (so the policy's
//! `disk` bounds what a run stores in all of them together), and a
//! synthetic /etc; then `pivot_root` and the old root detached. The code's files are written into /workspace, never bind-mounted
//! from the host (that would leak host paths through mountinfo).
//!
//! Sources are cloned with `open_tree` *before* anything is mounted on top of
//! the staging directory, so a source below it is still reachable, and made
//! read-only/nosuid/nodev recursively with `mount_setattr` while detached.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root};

use crate::setup::sources::{self, SourceId};
use pycell_syscall::{
    self as syscall, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
use pycell_wire::spec::{BindMount, WorkspaceFile, JAIL_GID, JAIL_UID, WORKSPACE};

/// Staging directory for the new root inside our private mount namespace.
/// Anything mounted here is invisible outside the namespace.
const STAGING: &str = "/tmp";

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct MountError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

/// What mounting a fresh /proc needs, when the kernel refuses it.
const PROC_MASKED: &str = "the kernel mounts a fresh /proc in a new user namespace only where the /proc above is whole, and this one has files covered or read-only (a container runtime's masked paths do that): run pycell where /proc is unmasked (Kubernetes: securityContext.procMount: Unmasked; podman: --security-opt unmask=/proc/*); see docs/cluster.md";

impl MountError {
    /// What to change, for failures whose cause is known.
    pub fn hint(&self) -> Option<&'static str> {
        let eperm = self.source.raw_os_error() == Some(libc::EPERM);
        (eperm && self.what == PROC_MOUNT).then_some(PROC_MASKED)
    }
}

const PROC_MOUNT: &str = "mounting a fresh /proc";

fn err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MountError {
    let what = what.into();
    move |source| MountError { what, source }
}

fn invalid(what: impl Into<String>) -> MountError {
    MountError {
        what: what.into(),
        source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
    }
}

fn nix_err(what: impl Into<String>) -> impl FnOnce(nix::Error) -> MountError {
    let what = what.into();
    move |e| MountError {
        what,
        source: std::io::Error::from(e),
    }
}

/// What a bind turns into once its source has been looked at.
#[derive(Debug)]
enum Prepared {
    /// A detached, already read-only copy of the source mount tree.
    Tree {
        fd: OwnedFd,
        target: PathBuf,
        is_dir: bool,
        /// Attach it as an overlay that names no host path
        /// ([`BindMount::hide_source`]).
        hide_source: bool,
    },
    /// The source is a symlink on the host; recreate it verbatim.
    Symlink { target: PathBuf, link: PathBuf },
}

/// Sources cloned while we still have the host credentials needed to reach
/// them (see `pipeline`: this runs before switching to the jail uid).
#[derive(Debug)]
pub struct PreparedSources {
    binds: Vec<Prepared>,
    devices: Vec<(String, OwnedFd)>,
}

/// Where the binds' sources are.
#[derive(Debug, Clone, Copy)]
pub enum SourcesIn<'a> {
    /// On the host, at their sources, each checked by the jailer
    /// (its [`SourceId`]).
    Host(&'a [SourceId]),
    /// In a zygote's root, at their targets: the zygote's jail mounted
    /// them there (checked, read-only) from the same spec's mounts.
    ZygoteRoot,
}

/// Step 1: private propagation, then clone every source.
pub fn prepare_sources(
    binds: &[BindMount],
    from: SourcesIn<'_>,
) -> Result<PreparedSources, MountError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(nix_err("making / private in the new mount namespace"))?;
    let mut prepared = Vec::with_capacity(binds.len());
    if matches!(from, SourcesIn::Host(checked) if checked.len() != binds.len()) {
        return Err(invalid(
            "the jailer checked a different list of mount sources",
        ));
    }
    for (i, b) in binds.iter().enumerate() {
        let walked = match from {
            SourcesIn::Host(checked) => {
                sources::reopen_in_jail(&b.source, checked[i]).map_err(|e| e.to_string())
            }
            SourcesIn::ZygoteRoot => sources::walk(&b.target, |_, _| Ok(()))
                .map_err(|e| format!("{} in the zygote: {e}", b.target.display())),
        }
        .map_err(invalid)?;
        if walked.is_symlink() {
            let link = nix::fcntl::readlinkat(&walked.parent, walked.name.as_os_str())
                .map_err(nix_err(format!("readlink {}", b.source.display())))?;
            prepared.push(Prepared::Symlink {
                target: b.target.clone(),
                link: PathBuf::from(link),
            });
            continue;
        }
        let fd = syscall::open_tree_clone_fd(walked.fd.as_fd(), true)
            .map_err(err(format!("cloning mount {}", b.source.display())))?;
        syscall::mount_setattr_fd(
            &fd,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            true,
        )
        .map_err(err(format!("making {} read-only", b.source.display())))?;
        prepared.push(Prepared::Tree {
            fd,
            target: b.target.clone(),
            is_dir: walked.is_dir(),
            // A zygote's copy names no host path already.
            hide_source: b.hide_source && matches!(from, SourcesIn::Host(_)),
        });
    }
    let mut devices = Vec::with_capacity(DEVICES.len());
    for d in DEVICES {
        let src = Path::new("/dev").join(d);
        let fd = syscall::open_tree_clone(&src, false)
            .map_err(err(format!("cloning {}", src.display())))?;
        syscall::mount_setattr_fd(&fd, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, false)
            .map_err(err(format!("setting nosuid,noexec on {}", src.display())))?;
        devices.push((d.to_string(), fd));
    }
    Ok(PreparedSources {
        binds: prepared,
        devices,
    })
}

impl PreparedSources {
    /// A grant of the caller's (`crate::setup::grants`): its detached mount,
    /// attached after the policy's binds.
    pub(crate) fn add_granted(&mut self, granted: crate::setup::grants::GrantedTree) {
        self.binds.push(Prepared::Tree {
            fd: granted.mount,
            target: granted.target,
            is_dir: granted.is_dir,
            hide_source: false,
        });
    }
}

/// What goes into the root besides the binds.
#[derive(Debug)]
pub struct RootfsLayout<'a> {
    pub disk_size: u64,
    pub files: &'a [WorkspaceFile],
    pub hostname: &'a str,
    /// Cover /proc's host-wide files. A zygote's /proc stays whole: a
    /// user namespace may mount a new /proc only where one is fully
    /// visible, and the zygote's children must.
    pub cover_proc: bool,
    /// `/proc/sys/user` limits of the jail's user namespace, written in
    /// the fresh /proc (`crate::setup::ns_settings::set_user_limits`).
    pub user_limits: Vec<(&'static str, u64)>,
    /// A cold run's compiled runner, to copy to `RUNNER_PYC`.
    pub runner_pyc: Option<fs::File>,
}

fn staged(p: &Path) -> PathBuf {
    let rel = p.strip_prefix("/").unwrap_or(p);
    Path::new(STAGING).join(rel)
}

fn mkdir_p(p: &Path) -> Result<(), MountError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(p)
        .map_err(err(format!("mkdir {}", p.display())))
}

fn tmpfs(target: &Path, flags: MsFlags, data: &str) -> Result<(), MountError> {
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, Some(data)).map_err(nix_err(format!(
        "mounting tmpfs on {} ({data})",
        target.display()
    )))
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), MountError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err(format!("creating {}", path.display())))?;
    f.write_all(contents)
        .map_err(err(format!("writing {}", path.display())))
}

/// Step 2 (as the jail uid, which owns everything created here): build the
/// root under the staging directory.
pub fn build_root(sources: PreparedSources, layout: &RootfsLayout<'_>) -> Result<(), MountError> {
    tmpfs(
        Path::new(STAGING),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        "size=1m,nr_inodes=1024,mode=0755",
    )?;
    for p in sources.binds {
        attach_bind(p)?;
    }
    crate::timings::mark("jail: rootfs: binds attached");
    mount_proc()?;
    crate::setup::ns_settings::set_user_limits(&staged(Path::new("/proc")), &layout.user_limits)
        .map_err(err(
            "limiting the jail's per-user kernel counters".to_string()
        ))?;
    let dev = build_dev(sources.devices)?;
    crate::timings::mark("jail: rootfs: /proc and /dev");
    if layout.cover_proc {
        mask_proc()?;
        crate::timings::mark("jail: rootfs: /proc files covered");
    }
    mount_disk(&dev, layout)?;
    write_etc(layout.hostname)?;
    match &layout.runner_pyc {
        Some(pyc) => copy_runner_pyc(pyc),
        None => Ok(()),
    }
}

/// Copy a cold run's compiled runner (opened and checked by the jailer)
/// into the root, read-only like the rest of it once pivoted.
fn copy_runner_pyc(mut pyc: &fs::File) -> Result<(), MountError> {
    use std::io::Read;
    let target = staged(Path::new(pycell_wire::spec::RUNNER_PYC));
    let mut bytes = Vec::new();
    (&mut pyc)
        .take(pycell_wire::spec::MAX_RUNNER_PYC)
        .read_to_end(&mut bytes)
        .map_err(err("reading the compiled runner".to_string()))?;
    if let Some(dir) = target.parent() {
        mkdir_p(dir)?;
    }
    write_file(&target, &bytes, 0o444)
}

/// A prepared bind at its target: a symlink recreated, or a tree attached.
fn attach_bind(p: Prepared) -> Result<(), MountError> {
    match p {
        Prepared::Symlink { target, link } => {
            let at = staged(&target);
            if let Some(parent) = at.parent() {
                mkdir_p(parent)?;
            }
            std::os::unix::fs::symlink(&link, &at).map_err(err(format!(
                "symlink {} -> {}",
                at.display(),
                link.display()
            )))
        }
        Prepared::Tree {
            fd,
            target,
            is_dir: true,
            hide_source: true,
        } => attach_hidden(fd, &target),
        Prepared::Tree {
            fd, target, is_dir, ..
        } => {
            let at = staged(&target);
            if is_dir {
                mkdir_p(&at)?;
            } else {
                if let Some(parent) = at.parent() {
                    mkdir_p(parent)?;
                }
                write_file(&at, b"", 0o644)?;
            }
            syscall::move_mount_to(&fd, &at)
                .map_err(err(format!("attaching bind at {}", target.display())))
        }
    }
}

/// Where a hidden source is attached while its overlay is mounted, in the
/// staging root (so a path of the jail's own, never the host's, is what
/// the overlay's options name); removed again at once.
const HIDDEN_LOWER: &str = "/.pycell-lower";

/// A directory whose host path must not show in the jail's mountinfo (an
/// env of pycell's store; a bind's line there names its source's path
/// within its file system): attached under [`HIDDEN_LOWER`], mounted at
/// `target` as a read-only overlay whose options name only the relative
/// `src` (and an empty second layer, which overlayfs needs without an
/// upper one), then detached again (the overlay holds its own clone).
fn attach_hidden(fd: OwnedFd, target: &Path) -> Result<(), MountError> {
    let lower = staged(Path::new(HIDDEN_LOWER));
    let (src, empty) = (lower.join("src"), lower.join("empty"));
    mkdir_p(&src)?;
    mkdir_p(&empty)?;
    syscall::move_mount_to(&fd, &src)
        .map_err(err(format!("attaching the source of {}", target.display())))?;
    let at = staged(target);
    mkdir_p(&at)?;
    chdir(&lower).map_err(nix_err(format!("chdir {}", lower.display())))?;
    let mounted = mount(
        Some("pycell"),
        &at,
        Some("overlay"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("lowerdir=src:empty"),
    )
    .map_err(nix_err(format!(
        "mounting an overlay at {}",
        target.display()
    )));
    chdir("/").map_err(nix_err("chdir /"))?;
    umount2(&src, MntFlags::MNT_DETACH).map_err(nix_err("detaching a hidden source"))?;
    for d in [&src, &empty, &lower] {
        fs::remove_dir(d).map_err(err(format!("rmdir {}", d.display())))?;
    }
    mounted
}

/// A fresh /proc of the jail's own pid namespace.
fn mount_proc() -> Result<(), MountError> {
    let proc_dir = staged(Path::new("/proc"));
    mkdir_p(&proc_dir)?;
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(nix_err(PROC_MOUNT))
}

/// Host-wide /proc files hidden behind /dev/null: counters and lists that
/// tell runs apart by machine (boot id, command line, boot time in `stat`)
/// or let one run watch the host and its co-tenants (interrupts, disk and
/// scheduler statistics, kernel memory), plus what runc's default masks.
/// What stays visible, and why, is in docs/threat-model.md.
pub(crate) const MASKED_PROC_FILES: &[&str] = &[
    "stat",
    "interrupts",
    "softirqs",
    "diskstats",
    "partitions",
    "cmdline",
    "loadavg",
    "vmstat",
    "zoneinfo",
    "buddyinfo",
    "pagetypeinfo",
    "slabinfo",
    "vmallocinfo",
    "swaps",
    "modules",
    "kallsyms",
    "iomem",
    "ioports",
    "keys",
    "key-users",
    "kcore",
    "kpagecount",
    "kpageflags",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "schedstat",
    "lock_stat",
    "sysrq-trigger",
    "uptime",
    "sys/kernel/random/boot_id",
];

/// Host-wide /proc directories covered by an empty read-only tmpfs.
pub(crate) const MASKED_PROC_DIRS: &[&str] = &[
    "acpi", "asound", "bus", "driver", "fs", "irq", "scsi", "tty", "sysvipc",
];

/// Hide [`MASKED_PROC_FILES`] and [`MASKED_PROC_DIRS`] in the staged /proc;
/// entries this kernel does not have are skipped.
fn mask_proc() -> Result<(), MountError> {
    let proc_dir = staged(Path::new("/proc"));
    let present: Vec<PathBuf> = MASKED_PROC_FILES
        .iter()
        .map(|f| proc_dir.join(f))
        .filter(|at| at.exists())
        .collect();
    cover_files(&present)?;
    for d in MASKED_PROC_DIRS {
        let at = proc_dir.join(d);
        if at.is_dir() {
            tmpfs(
                &at,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                "size=0,nr_inodes=1,mode=0555",
            )?;
        }
    }
    Ok(())
}

/// Cover each of `files` with one empty, read-only regular file: it reads
/// as empty, and opening it for writing fails (EROFS). Not /dev/null, which
/// reads the same but takes writes, and Landlock grants the jail writing
/// /dev/null wherever it is bound (its rule is on the device's inode).
fn cover_files(files: &[PathBuf]) -> Result<(), MountError> {
    let holder = staged(Path::new("/.pycell-cover"));
    mkdir_p(&holder)?;
    tmpfs(
        &holder,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "size=4k,nr_inodes=2,mode=0755",
    )?;
    let empty = holder.join("empty");
    write_file(&empty, b"", 0o444)?;
    // The holder's tmpfs read-only as a whole (its superblock and its
    // mount): every bind of its one file is then read-only too (EROFS,
    // whatever the bind's own flags), with one system call per cover
    // instead of two (0.5 ms of a jail's setup for about 35 covers).
    mount(
        None::<&str>,
        &holder,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(nix_err("making the covers' tmpfs read-only"))?;
    for at in files {
        bind(&empty, at)?;
    }
    // The covers keep the tmpfs alive; its mount point goes.
    umount2(&holder, MntFlags::MNT_DETACH).map_err(nix_err("detaching the covers' tmpfs"))?;
    fs::remove_dir(&holder).map_err(err(format!("rmdir {}", holder.display())))
}

/// A minimal /dev: the cloned device nodes, the fd links, a /dev/shm mount
/// point, and a devpts of the jail's own (`newinstance`: it shows none of
/// the host's terminals) with /dev/ptmx leading to its multiplexer, so
/// programs can open pseudo-terminals (TIOCSTI and TIOCLINUX stay refused
/// by the seccomp filter). Returns its staged path.
fn build_dev(devices: Vec<(String, OwnedFd)>) -> Result<PathBuf, MountError> {
    let dev = staged(Path::new("/dev"));
    mkdir_p(&dev)?;
    tmpfs(
        &dev,
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "size=64k,nr_inodes=64,mode=0755",
    )?;
    for (name, fd) in devices {
        let at = dev.join(&name);
        write_file(&at, b"", 0o666)?;
        syscall::move_mount_to(&fd, &at).map_err(err(format!("attaching /dev/{name}")))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))
            .map_err(err(format!("symlink /dev/{link}")))?;
    }
    mkdir_p(&dev.join("shm"))?;
    mount_devpts(&dev)?;
    Ok(dev)
}

/// The jail's own devpts instance on `dev`/pts, and `dev`/ptmx -> pts/ptmx.
fn mount_devpts(dev: &Path) -> Result<(), MountError> {
    let pts = dev.join("pts");
    mkdir_p(&pts)?;
    let data = "newinstance,ptmxmode=0666,mode=0620,max=64";
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(data),
    )
    .map_err(nix_err(format!("mounting devpts on /dev/pts ({data})")))?;
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx")).map_err(err("symlink /dev/ptmx"))
}

/// Where the run's one writable tmpfs is mounted while its directories are
/// bound into place; detached again before the pivot.
const DISK: &str = "/.pycell-disk";

/// Inodes of the writable tmpfs: one per 8 KiB of its size (at least 1024),
/// so that millions of empty files cannot pin kernel memory.
pub(crate) fn disk_inodes(size: u64) -> u64 {
    (size / 8192).max(1024)
}

/// One size-limited tmpfs for everything the run can write: its `workspace`
/// directory (with the code's files) becomes /workspace, its `tmp`
/// directory /tmp and /dev/shm.
fn mount_disk(dev: &Path, layout: &RootfsLayout<'_>) -> Result<(), MountError> {
    let disk = staged(Path::new(DISK));
    mkdir_p(&disk)?;
    let size = layout.disk_size;
    // noexec: besides Landlock's refusal to execve anything here, no file
    // the run writes can be mapped executable (a library for ctypes, say).
    tmpfs(
        &disk,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        &format!("size={size},nr_inodes={},mode=0755", disk_inodes(size)),
    )?;
    let (ws, tmp) = (disk.join("workspace"), disk.join("tmp"));
    mkdir_p(&ws)?;
    mkdir_p(&tmp)?;
    fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
        .map_err(err("chmod 1777 /tmp"))?;
    for f in layout.files {
        write_file(&ws.join(&f.name), f.bytes(), 0o644)?;
    }
    for (from, to) in [
        (&ws, staged(Path::new(WORKSPACE))),
        (&tmp, staged(Path::new("/tmp"))),
        (&tmp, dev.join("shm")),
    ] {
        mkdir_p(&to)?;
        bind(from, &to)?;
    }
    umount2(&disk, MntFlags::MNT_DETACH).map_err(nix_err("detaching the disk's staging mount"))?;
    fs::remove_dir(&disk).map_err(err(format!("rmdir {}", disk.display())))
}

fn bind(from: &Path, to: &Path) -> Result<(), MountError> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_err(format!(
        "binding {} at {}",
        from.display(),
        to.display()
    )))
}

/// A synthetic /etc: the jail's own users, groups, hosts and hostname.
fn write_etc(hostname: &str) -> Result<(), MountError> {
    let etc = staged(Path::new("/etc"));
    mkdir_p(&etc)?;
    let passwd = format!("root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{JAIL_UID}:{JAIL_GID}:pycell sandbox:{WORKSPACE}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    let group = format!("root:x:0:\nsandbox:x:{JAIL_GID}:\nnogroup:x:65534:\n");
    let hosts =
        format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost {hostname}\n");
    let files: [(&str, &[u8]); 5] = [
        ("passwd", passwd.as_bytes()),
        ("group", group.as_bytes()),
        ("hosts", hosts.as_bytes()),
        ("hostname", &format!("{hostname}\n").into_bytes()),
        (
            "nsswitch.conf",
            b"passwd: files\ngroup: files\nhosts: files\n",
        ),
    ];
    for (name, contents) in files {
        write_file(&etc.join(name), contents, 0o644)?;
    }
    std::os::unix::fs::symlink("/usr/share/zoneinfo/UTC", etc.join("localtime"))
        .map_err(err("symlink /etc/localtime"))
}

/// Step 3: make the staging directory the root, detach the old root, and make
/// the root (and /dev) read-only. Ends with the working directory at /workspace.
pub fn pivot() -> Result<(), MountError> {
    chdir(STAGING).map_err(nix_err("chdir to the new root"))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; the
    // detach below removes it without needing a directory for it.
    pivot_root(".", ".").map_err(nix_err("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(nix_err("detaching the old root"))?;
    chdir("/").map_err(nix_err("chdir /"))?;
    syscall::mount_setattr_path(
        Path::new("/"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
    )
    .map_err(err("making / read-only"))?;
    syscall::mount_setattr_path(Path::new("/dev"), MOUNT_ATTR_RDONLY, false)
        .map_err(err("making /dev read-only"))?;
    chdir(WORKSPACE).map_err(nix_err("chdir /workspace"))?;
    Ok(())
}

/// In-jail targets of every bind; Landlock grants read+execute on these (a
/// bind whose source is a symlink becomes a symlink, and the grant then
/// covers what it points to, itself a bind).
pub fn tree_targets(binds: &[BindMount]) -> Vec<PathBuf> {
    binds.iter().map(|b| b.target.clone()).collect()
}
