//! Who owns a jail's user namespace, and so who pays for what is in it.
//!
//! The kernel charges the per-user counters of everything made inside a
//! user namespace (inotify instances and watches, fanotify groups, nested
//! namespaces, processes under RLIMIT_NPROC, queued signals, ...) to the
//! user inside and then, up the chain, to the uid that created each
//! namespace. A jail created by host root would charge host root: one
//! sandbox could take all of root's 128 inotify instances, for every
//! service of root's and every other sandbox. So the jail's namespace is
//! created with this thread's effective ids switched to the sandbox's own
//! (unique per sandbox, no account): the sandbox uid owns its namespace
//! and pays for it; a zygote likewise creates each run's namespace as
//! that run's slot, so runs of one zygote never share a budget.
//!
//! Only the effective ids change: the real and saved ids stay root's, so
//! switching back needs no privilege. The filesystem ids go back to root's
//! at once, so the clone's cgroup check and the jail's first look at the
//! host's files are what they were. The kernel clears the effective
//! capabilities on the switch; a jailer takes them back from its
//! permitted set (a zygote needs none).
//!
//! While the switch lasts we are the namespace's owner, which the kernel
//! accepts in place of CAP_SYS_ADMIN and CAP_SYS_RESOURCE over it: that is
//! how pycelld's jailer, which has neither on the host, writes a jail's id
//! maps (the files are opened as the owner: the kernel checks the
//! opener) and pins its rlimits.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};

use caps::CapSet;
use nix::sys::signal::Signal;
use nix::unistd::{
    getegid, geteuid, getppid, setfsgid, setfsuid, setresgid, setresuid, Gid, Pid, Uid,
};

/// "Leave this id as it is" for the set*id calls.
const UNCHANGED: u32 = u32::MAX;

/// This thread's effective ids are a namespace owner's until
/// [`AsOwner::leave`] (or drop). In a child cloned meanwhile call
/// [`AsOwner::stay`]: its ids are its own from then on.
#[must_use]
pub(crate) struct AsOwner {
    root: (Uid, Gid),
    owner: Uid,
    /// The parent-death signal we had, and our parent then: the kernel
    /// clears the signal on any change of effective ids, so it is set
    /// again on the way back (and had the parent died meanwhile, we die).
    death: Option<(Signal, Pid)>,
    live: bool,
}

impl AsOwner {
    /// Switch the effective uid (and gid, if given) to the owner's; the
    /// filesystem ids stay ours; with `take_back_caps`, the effective
    /// capabilities are set again from the permitted ones.
    pub fn enter(uid: u32, gid: Option<u32>, take_back_caps: bool) -> io::Result<AsOwner> {
        let root = (geteuid(), getegid());
        let death = nix::sys::prctl::get_pdeathsig()?.map(|sig| (sig, getppid()));
        let permitted = match take_back_caps {
            true => Some(caps::read(None, CapSet::Permitted).map_err(io::Error::other)?),
            false => None,
        };
        let keep_u = Uid::from_raw(UNCHANGED);
        let keep_g = Gid::from_raw(UNCHANGED);
        if let Some(gid) = gid {
            setresgid(keep_g, Gid::from_raw(gid), keep_g)?;
        }
        let mut me = AsOwner {
            root,
            owner: Uid::from_raw(uid),
            death,
            live: true,
        };
        setresuid(keep_u, me.owner, keep_u)?;
        setfsuid(root.0);
        setfsgid(root.1);
        if setfsuid(Uid::from_raw(UNCHANGED)) != root.0 {
            me.live = false;
            me.restore()?;
            return Err(io::Error::other("the filesystem uid did not go back"));
        }
        if let Some(p) = permitted {
            caps::set(None, CapSet::Effective, &p).map_err(io::Error::other)?;
        }
        Ok(me)
    }

    /// The id-map files of `pid`, a child just cloned into a user
    /// namespace we own, opened as its owner (the kernel checks the
    /// opener's credentials when they are written); write them with
    /// [`MapFiles::write`] once back. The switch made us, and so the
    /// child, not dumpable: its /proc files are root's, opened with our
    /// own filesystem ids.
    pub fn open_maps(&self, pid: Pid) -> io::Result<MapFiles> {
        MapFiles::open(pid)
    }

    /// Back to our own ids.
    pub fn leave(mut self) -> io::Result<()> {
        self.live = false;
        self.restore()
    }

    /// In the child of a clone made as the owner: keep the ids.
    pub fn stay(mut self) {
        self.live = false;
    }

    fn restore(&self) -> io::Result<()> {
        let keep_u = Uid::from_raw(UNCHANGED);
        let keep_g = Gid::from_raw(UNCHANGED);
        setresuid(keep_u, self.root.0, keep_u)?;
        setresgid(keep_g, self.root.1, keep_g)?;
        if geteuid() != self.root.0 || getegid() != self.root.1 {
            return Err(io::Error::other("our effective ids did not come back"));
        }
        if let Some((sig, parent)) = self.death {
            nix::sys::prctl::set_pdeathsig(sig)?;
            if getppid() != parent {
                // Our parent died while the signal was off.
                nix::sys::signal::raise(sig)?;
            }
        }
        Ok(())
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        if self.live {
            if let Err(e) = self.restore() {
                eprintln!("pycell-jailer: switching back from a namespace owner's ids: {e}");
                std::process::abort();
            }
        }
    }
}

/// Run `f` as the host uid that owns `spec`'s jail ([`host_owner`]),
/// capabilities taken back, then switch back: the one way a running
/// jail's owner acts on it (its rlimits, its CPU clock).
pub(crate) fn as_jail_owner<T>(
    spec: &pycell_wire::spec::JailSpec,
    f: impl FnOnce() -> T,
) -> io::Result<T> {
    as_owner(host_owner(spec), f)
}

/// Run `f` as the owner `uid` of a user namespace (see the module's
/// doc), capabilities taken back, then switch back.
fn as_owner<T>(uid: u32, f: impl FnOnce() -> T) -> io::Result<T> {
    let owner = AsOwner::enter(uid, None, true)?;
    let out = f();
    owner.leave()?;
    Ok(out)
}

/// A child's setgroups, uid_map and gid_map files, open for writing.
pub(crate) struct MapFiles {
    setgroups: File,
    uid_map: File,
    gid_map: File,
}

impl MapFiles {
    /// Opened with our own ids (a namespace we own as root: an idmap's).
    pub(crate) fn open(pid: Pid) -> io::Result<MapFiles> {
        let base = format!("/proc/{}", pid.as_raw());
        let open = |name: &str| {
            OpenOptions::new()
                .write(true)
                .open(format!("{base}/{name}"))
                .map_err(|e| io::Error::new(e.kind(), format!("{base}/{name}: {e}")))
        };
        Ok(MapFiles {
            setgroups: open("setgroups")?,
            uid_map: open("uid_map")?,
            gid_map: open("gid_map")?,
        })
    }

    /// Write (uid_map, gid_map), setgroups denied first: the jail must
    /// never regain groups.
    pub fn write(mut self, (uid_map, gid_map): &(String, String)) -> io::Result<()> {
        self.setgroups.write_all(b"deny")?;
        self.uid_map.write_all(uid_map.as_bytes())?;
        self.gid_map.write_all(gid_map.as_bytes())
    }
}

/// The host uid that owns the outermost user namespace of `spec`'s jail,
/// the one a process on the host must be to act as its owner: the
/// sandbox's, or for a run forked from a zygote, the zygote's.
fn host_owner(spec: &pycell_wire::spec::JailSpec) -> u32 {
    spec.from_zygote
        .as_ref()
        .map_or(spec.sandbox_uid, |z| z.zygote_uid)
}
/// A jail's uid and gid maps: the jail ids, and nothing else, mapped to
/// `uid` and `gid` of the namespace that writes them.
pub(crate) fn jail_id_maps(uid: u32, gid: u32) -> (String, String) {
    (
        format!("{} {uid} 1\n", pycell_wire::spec::JAIL_UID),
        format!("{} {gid} 1\n", pycell_wire::spec::JAIL_GID),
    )
}
