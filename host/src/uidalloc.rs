//! Host uid/gid allocation for sandboxes: one id per concurrent sandbox, from
//! a configured range, never root and never an id that an account or group
//! uses. A lease is an exclusive `flock` on `<lock_dir>/<uid>`, so separate
//! processes (several embedded `pycell run`s, or the daemon) never hand out
//! the same id twice; the kernel releases it when the holder dies.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{Gid, Group, Uid, User};

/// Default range: far above regular accounts, subordinate-id ranges
/// (100000+ in /etc/subuid) and systemd's dynamic/container ranges.
pub const DEFAULT_RANGE: RangeInclusive<u32> = 1_800_000_000..=1_800_065_535;

#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error("uid range {start}..={end} is invalid: it must not include 0 or 4294967295")]
    BadRange { start: u32, end: u32 },
    #[error("cannot use the uid lock directory {path}: {source}")]
    LockDir { path: PathBuf, source: io::Error },
    #[error("no free sandbox uid in {start}..={end}: every id is in use or belongs to an account; wait for runs to finish or widen the range")]
    Exhausted { start: u32, end: u32 },
}

/// A sandbox uid (and the gid with the same number), held until dropped.
#[derive(Debug)]
pub struct UidLease {
    pub uid: u32,
    pub gid: u32,
    /// Where this uid's run cgroups live, if its release must wait for them.
    cgroup_parent: Option<String>,
    holder: Holder,
}

/// What keeps the id ours: its lock file's lock, or a zygote's slot that
/// lent it to one run.
#[derive(Debug)]
enum Holder {
    Lock(#[allow(dead_code)] Flock<File>),
    Slot(std::sync::Arc<SlotLease>),
    /// Moved into a [`SlotLease`].
    Moved,
}

/// A uid a zygote holds for its whole life (its user namespace maps it)
/// and lends to one run at a time ([`SlotLease::lend`]).
#[derive(Debug)]
pub struct SlotLease {
    pub uid: u32,
    pub gid: u32,
    busy: std::sync::atomic::AtomicBool,
    _lock: Flock<File>,
}

impl SlotLease {
    /// Hold `lease`'s id for a zygote's life.
    pub fn hold(mut lease: UidLease) -> Result<std::sync::Arc<SlotLease>, UidLease> {
        if !matches!(lease.holder, Holder::Lock(_)) {
            return Err(lease);
        }
        // What is left of `lease` releases nothing when dropped.
        lease.cgroup_parent = None;
        let Holder::Lock(lock) = std::mem::replace(&mut lease.holder, Holder::Moved) else {
            unreachable!("checked above");
        };
        Ok(std::sync::Arc::new(SlotLease {
            uid: lease.uid,
            gid: lease.gid,
            busy: false.into(),
            _lock: lock,
        }))
    }

    /// The id, for one run, if no other run has it: a lease that, once
    /// dropped (after its run's cgroups, see
    /// [`UidLease::release_after_cgroups`]), gives the id back to the slot.
    pub fn lend(self: &std::sync::Arc<SlotLease>) -> Option<UidLease> {
        use std::sync::atomic::Ordering;
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(UidLease {
            uid: self.uid,
            gid: self.gid,
            cgroup_parent: None,
            holder: Holder::Slot(self.clone()),
        })
    }

    /// Whether a run has the id now.
    pub fn is_lent(&self) -> bool {
        self.busy.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl UidLease {
    /// Hold the uid, when this lease is dropped, until every cgroup of it
    /// under `parent` is killed and removed: a jailer that died (SIGKILL, the
    /// OOM killer) cannot clean up, and the uid must not pass to another run
    /// while processes of this one may still live.
    pub fn release_after_cgroups(&mut self, parent: &str) {
        self.cgroup_parent = Some(parent.to_string());
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        if let Some(parent) = &self.cgroup_parent {
            crate::cgroup::reclaim_uid(parent, self.uid);
        }
        if let Holder::Slot(slot) = &self.holder {
            slot.busy.store(false, std::sync::atomic::Ordering::Release);
        }
        // The lock is released after this, when the fields are dropped.
    }
}

fn id_is_taken(id: u32) -> bool {
    // A failed lookup counts as taken: better to skip an id than to share it.
    !matches!(User::from_uid(Uid::from_raw(id)), Ok(None))
        || !matches!(Group::from_gid(Gid::from_raw(id)), Ok(None))
}

/// Parse "START-END" (inclusive).
pub fn parse_range(s: &str) -> Option<RangeInclusive<u32>> {
    let (a, b) = s.split_once('-')?;
    let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b).then_some(a..=b)
}

pub fn allocate(range: &RangeInclusive<u32>, lock_dir: &Path) -> Result<UidLease, UidError> {
    let (start, end) = (*range.start(), *range.end());
    if start == 0 || end == u32::MAX || start > end {
        return Err(UidError::BadRange { start, end });
    }
    let lock_dir_err = |source| UidError::LockDir {
        path: lock_dir.to_path_buf(),
        source,
    };
    // Parents as searchable as /run/pycell must be (pycelld's socket lives
    // there), the lock directory itself root's alone.
    if let Some(parent) = lock_dir.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(lock_dir_err)?;
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(lock_dir)
        .map_err(lock_dir_err)?;
    let span = u64::from(end - start) + 1;
    // Start somewhere different each time so concurrent allocators rarely
    // contend for the same lock file.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ (std::process::id() as u64) << 20)
        .unwrap_or(0);
    for i in 0..span.min(4096) {
        let uid = start + ((seed + i) % span) as u32;
        let path = lock_dir.join(uid.to_string());
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| UidError::LockDir {
                path: path.clone(),
                source,
            })?;
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if id_is_taken(uid) {
            continue;
        }
        return Ok(UidLease {
            uid,
            gid: uid,
            cgroup_parent: None,
            holder: Holder::Lock(lock),
        });
    }
    Err(UidError::Exhausted { start, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let range = 1_800_100_000..=1_800_100_001;
        let a = allocate(&range, dir.path()).unwrap();
        let b = allocate(&range, dir.path()).unwrap();
        assert_ne!(a.uid, b.uid);
        let e = allocate(&range, dir.path()).unwrap_err();
        assert!(matches!(e, UidError::Exhausted { .. }), "{e}");
        drop(a);
        let c = allocate(&range, dir.path()).unwrap();
        assert!(range.contains(&c.uid));
    }

    #[test]
    fn a_slot_lends_its_id_to_one_run_at_a_time_and_keeps_it_from_others() {
        let dir = tempfile::tempdir().unwrap();
        let range = 1_800_100_010..=1_800_100_010;
        let slot = SlotLease::hold(allocate(&range, dir.path()).unwrap()).unwrap();
        let run = slot.lend().expect("a free slot lends");
        assert_eq!((run.uid, run.gid), (slot.uid, slot.gid));
        assert!(slot.is_lent());
        assert!(slot.lend().is_none(), "lent twice at once");
        drop(run);
        assert!(!slot.is_lent());
        let again = slot.lend().expect("given back on drop");
        // The slot's lock holds the id even while no run has it, and
        // after the slot is dropped while a run still does.
        drop(slot);
        assert!(allocate(&range, dir.path()).is_err());
        drop(again);
        assert_eq!(allocate(&range, dir.path()).unwrap().uid, 1_800_100_010);
        // A lent lease is not held again as a slot.
        let s = SlotLease::hold(allocate(&range, dir.path()).unwrap()).unwrap();
        assert!(SlotLease::hold(s.lend().unwrap()).is_err());
    }

    #[test]
    fn ranges_with_root_or_minus_one_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            allocate(&(0..=10), dir.path()),
            Err(UidError::BadRange { .. })
        ));
        assert!(matches!(
            allocate(&(5..=u32::MAX), dir.path()),
            Err(UidError::BadRange { .. })
        ));
        assert_eq!(parse_range("10-20"), Some(10..=20));
        assert_eq!(parse_range("20-10"), None);
    }

    #[test]
    fn ids_of_existing_accounts_are_skipped() {
        // uid 0 exists on every host; ask for a range of just the root group id's neighbour.
        assert!(id_is_taken(0));
    }
}
