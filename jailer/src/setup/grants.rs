//! Host paths the caller granted the jail (`JailSpec::grants`). Each
//! comes as a descriptor the caller opened itself (proof it could reach
//! the path; no path is walked here), inherited by the jailer, and becomes
//! a detached, idmapped copy of its mount: on it the owner of the granted
//! path is the jail's sandbox user, so the jail has the owner's rights
//! there and nobody else's (files of other owners show as the overflow
//! id, reachable only as "others"). Read-only unless granted writable; a
//! writable grant is `noexec`; neither honours set-uid bits or devices.
//!
//! Made here, in the host's user namespace, before the clone: only a
//! process privileged over a file system's own user namespace may idmap
//! its mounts. The jail clones each copy again in its own mount namespace
//! and attaches it after its policy's binds (`mounts::PreparedSources`).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, SFlag};
use nix::sys::wait::waitpid;
use nix::unistd::pipe2;
use pycell_syscall::{
    self as syscall, CloneResult, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use pycell_wire::spec::{grant_source_problem, Grant, JailSpec};

const OTHER_NAMESPACE: &str = "the granted path is not in pycell's mount namespace: pycelld's systemd service has a namespace of its own (no /home), so it cannot take grants; run `pycell mcp-server --embedded` as root for them";
const NOT_PRIVILEGED: &str = "cloning and idmapping a host mount needs CAP_SYS_ADMIN, which pycelld's systemd service does not have: run `pycell mcp-server --embedded` as root for grants";

/// A grant made ready for the jail: its idmapped, detached mount.
#[derive(Debug)]
pub(crate) struct GrantedTree {
    pub mount: OwnedFd,
    pub target: PathBuf,
    pub is_dir: bool,
}

/// A writable grant to sweep once its jail has ended
/// (`crate::run::grant_sweep`): the descriptor its caller opened on it.
#[derive(Debug)]
pub(crate) struct GrantRoot {
    pub source: OwnedFd,
    pub target: PathBuf,
}

/// Every grant of `spec`, from the descriptors that came for them (`sources`, in order),
/// parents first: a grant inside another (`--ro PROJECT/.git` in `--rw
/// PROJECT`) is attached on top of it, never hidden under it. Also the
/// writable grants' own descriptors, to sweep once the jail has ended
/// (`crate::run::grant_sweep`).
pub(crate) fn prepare(
    spec: &JailSpec,
    sources: Vec<OwnedFd>,
) -> Result<(Vec<GrantedTree>, Vec<GrantRoot>), JailFailure> {
    let ids = (spec.sandbox_uid, spec.sandbox_gid);
    let mut trees = Vec::new();
    let mut roots = Vec::new();
    if sources.len() != spec.grants.len() {
        return Err(JailFailure::new(
            FailureCode::MountsFailed,
            Layer::Mounts,
            format!(
                "{} grants but {} descriptors came for them",
                spec.grants.len(),
                sources.len()
            ),
        ));
    }
    for (g, source) in spec.grants.iter().zip(sources) {
        let (tree, source) = prepare_one(source, g, ids)?;
        if g.writable {
            roots.push(GrantRoot {
                source,
                target: g.target.clone(),
            });
        }
        trees.push(tree);
    }
    trees.sort_by_key(|t| attach_order(&t.target));
    Ok((trees, roots))
}

/// Attached in this order: by depth, so that parents come first.
fn attach_order(target: &std::path::Path) -> usize {
    target.components().count()
}

/// The mount flags of a grant: never set-uid or devices; read-only, or
/// writable and never executable.
pub(crate) fn grant_attrs(writable: bool) -> u64 {
    let always = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    match writable {
        true => always | MOUNT_ATTR_NOEXEC,
        false => always | MOUNT_ATTR_RDONLY,
    }
}

fn prepare_one(
    source: OwnedFd,
    g: &Grant,
    (uid, gid): (u32, u32),
) -> Result<(GrantedTree, OwnedFd), JailFailure> {
    let t = g.target.display();
    let fail = |what: String| {
        JailFailure::new(
            FailureCode::MountsFailed,
            Layer::Mounts,
            format!("the grant of {t}: {what}"),
        )
    };
    let flags = nix::fcntl::fcntl(&source, nix::fcntl::FcntlArg::F_GETFL)
        .map_err(|e| fail(format!("fcntl: {e}")))?;
    let st = fstat(&source).map_err(|e| fail(format!("fstat: {e}")))?;
    if let Some(problem) = grant_source_problem(flags as u32, st.st_mode) {
        return Err(fail(problem.into()));
    }
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let mount = syscall::open_tree_clone_fd(source.as_fd(), false).map_err(|e| {
        let f = fail(format!("cloning its mount: {e}"));
        match e.raw_os_error() {
            // The path's mount is not in our mount namespace: pycelld as a
            // systemd service has one of its own (ProtectHome, ...).
            Some(libc::EINVAL) => f.with_hint(OTHER_NAMESPACE),
            Some(libc::EPERM) => f.with_hint(NOT_PRIVILEGED),
            _ => f,
        }
    })?;
    let (owner, group) = g.owner.map_or((st.st_uid, st.st_gid), |o| (o.uid, o.gid));
    let userns = owner_seen_as(owner, group, uid, gid)
        .map_err(|e| fail(format!("a user namespace for its idmap: {e}")))?;
    syscall::mount_setattr_idmapped(&mount, grant_attrs(g.writable), userns.as_fd()).map_err(
        |e| {
            let hint = match e.raw_os_error() {
                Some(libc::EPERM) => NOT_PRIVILEGED,
                _ => "grant paths on a file system that supports idmapped mounts (ext4, xfs, btrfs; tmpfs from Linux 6.3)",
            };
            fail(format!("idmapping its mount: {e}")).with_hint(hint)
        },
    )?;
    let tree = GrantedTree {
        mount,
        target: g.target.clone(),
        is_dir: kind == SFlag::S_IFDIR,
    };
    Ok((tree, source))
}

/// The id maps that show files of `owner`:`group` as the sandbox's
/// `uid`:`gid` (and the sandbox's new files as the owner's).
pub(crate) fn idmap(owner: u32, group: u32, uid: u32, gid: u32) -> (String, String) {
    (format!("{owner} {uid} 1\n"), format!("{group} {gid} 1\n"))
}

/// A user namespace with [`idmap`]'s maps, held by a descriptor: made by
/// a child that waits, unprivileged, until its maps are written and its
/// namespace opened, then exits.
fn owner_seen_as(owner: u32, group: u32, uid: u32, gid: u32) -> std::io::Result<OwnedFd> {
    let (wait_r, wait_w) = pipe2(OFlag::O_CLOEXEC)?;
    match syscall::clone_fork(libc::CLONE_NEWUSER)? {
        CloneResult::Child => {
            drop(wait_w);
            let mut byte = [0u8; 1];
            let _ = nix::unistd::read(&wait_r, &mut byte);
            syscall::exit_now(0);
        }
        CloneResult::Parent(pid) => {
            drop(wait_r);
            let maps = idmap(owner, group, uid, gid);
            let ns = crate::setup::ns_owner::MapFiles::open(pid)
                .and_then(|files| files.write(&maps))
                .and_then(|()| File::open(format!("/proc/{}/ns/user", pid.as_raw())));
            drop(wait_w);
            let _ = waitpid(pid, None);
            Ok(OwnedFd::from(ns?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_never_setuid_nor_devices_and_writable_ones_never_execute() {
        let ro = grant_attrs(false);
        let rw = grant_attrs(true);
        for attrs in [ro, rw] {
            assert_ne!(attrs & MOUNT_ATTR_NOSUID, 0);
            assert_ne!(attrs & MOUNT_ATTR_NODEV, 0);
        }
        assert_ne!(ro & MOUNT_ATTR_RDONLY, 0);
        assert_eq!(rw & MOUNT_ATTR_RDONLY, 0);
        assert_ne!(rw & MOUNT_ATTR_NOEXEC, 0);
    }

    #[test]
    fn a_grant_inside_another_is_attached_after_it() {
        let mut targets = vec!["/p/.git/hooks", "/p/.git", "/p", "/q/file"];
        targets.sort_by_key(|t| attach_order(std::path::Path::new(t)));
        assert_eq!(targets, ["/p", "/p/.git", "/q/file", "/p/.git/hooks"]);
    }

    #[test]
    fn the_owner_of_a_grant_is_seen_as_the_sandbox_user() {
        let (uid_map, gid_map) = idmap(1000, 100, 1_800_000_007, 1_800_000_008);
        assert_eq!(uid_map, "1000 1800000007 1\n");
        assert_eq!(gid_map, "100 1800000008 1\n");
    }
}
