//! The snapshot store: sessions' state bundles kept on disk, each under
//! its owner, so that they outlive the session and the server
//! (`session_snapshot`, `session_start` with `from_snapshot`).
//!
//! ```text
//! ROOT/OWNER/snap-<32 hex>.bundle   the bundle's bytes (as its runner wrote them)
//! ROOT/OWNER/snap-<32 hex>.json     what it is: its info, owner, start request
//! ROOT/OWNER/snap-<32 hex>.partial  one being written (removed when the store opens)
//! ```
//!
//! OWNER is a key the server makes of its caller (`uid-1000`), never a
//! name the caller chose; an id is looked up only under its caller's own
//! key, so another's id is an unknown one. The store keeps at most
//! [`Quota::count`] snapshots and [`Quota::bytes`] per owner, each for
//! [`Quota::keep`]: a new snapshot that needs room evicts its owner's
//! oldest ones; one larger than the whole quota is refused. The bundle is
//! written to a `.partial` file and renamed when whole, its description
//! after it: a store killed while writing keeps no half snapshot.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pycell_protocol::session::{SessionStartRequest, SnapshotInfo};
use serde::{Deserialize, Serialize};

/// What one owner may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub count: usize,
    pub bytes: u64,
    pub keep: Duration,
}

impl Default for Quota {
    fn default() -> Quota {
        Quota {
            count: 8,
            bytes: 1 << 30,
            keep: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A snapshot's description, next to its bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stored {
    pub info: SnapshotInfo,
    pub owner: String,
    /// What started its session: what starts a session from it.
    pub start: SessionStartRequest,
    /// The cells its session had run.
    pub cells: u64,
    /// When it was taken, in milliseconds since the epoch (what orders
    /// an owner's snapshots, oldest first).
    #[serde(default)]
    pub created_ms: u64,
}

/// Why a snapshot could not be kept or found.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("there is no snapshot {0:?} of yours (snapshot ids come from session_snapshot; a snapshot expires, and a newer one may have taken its room)")]
    Unknown(String),
    #[error("the session's state is {size} bytes, more than the {quota} bytes of snapshots one owner may keep")]
    TooBig { size: u64, quota: u64 },
    #[error("the snapshot store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The store at a directory its server alone may write.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    root: PathBuf,
    quota: Quota,
}

/// A snapshot id: `snap-` and 32 hex digits (128 random bits).
pub fn is_snapshot_id(s: &str) -> bool {
    s.len() == 5 + 32
        && s.starts_with("snap-")
        && s[5..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `key` may name an owner's directory.
fn is_owner_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 100
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn new_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("snap-{hex}"))
}

fn now_s() -> u64 {
    now_ms() / 1000
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SnapshotStore {
    /// The store at `root` (made, mode 0700, if missing), its expired
    /// snapshots removed, and its half-written ones at least `stale` old
    /// (a server alone on its store: all of them).
    pub fn open(root: &Path, quota: Quota, stale: Duration) -> Result<SnapshotStore, StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(io(root))?;
        let store = SnapshotStore {
            root: root.to_path_buf(),
            quota,
        };
        for owner in std::fs::read_dir(root).map_err(io(root))?.flatten() {
            let dir = owner.path();
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let age = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().unwrap_or_default());
                let stale_enough = age.map_or(true, |a| a >= stale);
                if entry.path().extension().is_some_and(|e| e == "partial") && stale_enough {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            store.sweep(&dir);
        }
        Ok(store)
    }

    pub fn quota(&self) -> Quota {
        self.quota
    }

    fn dir(&self, owner: &str) -> Result<PathBuf, StoreError> {
        if !is_owner_key(owner) {
            let e = std::io::Error::other(format!("{owner:?} is not an owner's key"));
            return Err(io(&self.root)(e));
        }
        Ok(self.root.join(owner))
    }

    /// `owner`'s snapshots, oldest first (expired ones removed).
    pub fn list(&self, owner: &str) -> Result<Vec<Stored>, StoreError> {
        let dir = self.dir(owner)?;
        Ok(self.sweep(&dir))
    }

    /// Remove `dir`'s expired snapshots and bundles without a description;
    /// the rest, oldest first.
    fn sweep(&self, dir: &Path) -> Vec<Stored> {
        let now = now_s();
        let mut kept = Vec::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".bundle") else {
                continue;
            };
            match read_stored(&dir.join(format!("{id}.json"))) {
                Some(s) if s.info.expires_at > now && s.info.snapshot == id => kept.push(s),
                _ => remove(dir, id),
            }
        }
        kept.sort_by_key(|s| (s.created_ms, s.info.snapshot.clone()));
        kept
    }

    /// Snapshot `id` of `owner`: its description and its bundle, open.
    pub fn get(&self, owner: &str, id: &str) -> Result<(Stored, std::fs::File), StoreError> {
        let unknown = || StoreError::Unknown(id.to_string());
        if !is_snapshot_id(id) {
            return Err(unknown());
        }
        let dir = self.dir(owner)?;
        let stored = read_stored(&dir.join(format!("{id}.json"))).ok_or_else(unknown)?;
        if stored.info.expires_at <= now_s() || stored.owner != owner {
            return Err(unknown());
        }
        let bundle = open_nofollow(&dir.join(format!("{id}.bundle"))).map_err(|_| unknown())?;
        Ok((stored, bundle))
    }

    /// Remove every paused session's snapshot (the owners' keys that end
    /// in `-paused`: see `session_fork::paused_key`), which only the
    /// server that paused them could resume.
    pub fn clear_paused(&self) {
        for owner in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            if owner.file_name().to_string_lossy().ends_with("-paused") {
                let _ = std::fs::remove_dir_all(owner.path());
            }
        }
    }

    /// Remove snapshot `id` of `owner`, if it is there.
    pub fn remove(&self, owner: &str, id: &str) {
        if let (Ok(dir), true) = (self.dir(owner), is_snapshot_id(id)) {
            remove(&dir, id);
        }
    }

    /// Begin a snapshot of `size` bytes for `owner`: room made for it
    /// (its owner's oldest evicted), its bundle's `.partial` file open.
    pub fn begin(&self, owner: &str, size: u64) -> Result<Writing, StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        if size > self.quota.bytes {
            return Err(StoreError::TooBig {
                size,
                quota: self.quota.bytes,
            });
        }
        let dir = self.dir(owner)?;
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(&dir)(e)),
            _ => {}
        }
        let mut kept = self.sweep(&dir);
        let mut evicted = Vec::new();
        // Paused sessions' snapshots never make room for one another: a
        // pause over the quota is refused (the session goes on).
        if owner.ends_with("-paused") && !fits(&kept, size, self.quota) {
            return Err(StoreError::TooBig {
                size,
                quota: self.quota.bytes,
            });
        }
        while !kept.is_empty()
            && (kept.len() + 1 > self.quota.count
                || kept.iter().map(|s| s.info.size_bytes).sum::<u64>() + size > self.quota.bytes)
        {
            let old = kept.remove(0);
            remove(&dir, &old.info.snapshot);
            evicted.push(old.info.snapshot);
        }
        let id = new_id().map_err(io(&dir))?;
        let partial = dir.join(format!("{id}.partial"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(io(&partial))?;
        Ok(Writing {
            dir,
            id,
            file: Some(file),
            expected: size,
            written: 0,
            evicted,
            keep: self.quota.keep,
        })
    }
}

/// `path` open for reading, if it is not a symlink: a snapshot's files
/// never are.
fn open_nofollow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}

/// Whether one more snapshot of `size` fits beside `kept` in `quota`.
fn fits(kept: &[Stored], size: u64, quota: Quota) -> bool {
    let used: u64 = kept.iter().map(|s| s.info.size_bytes).sum();
    kept.len() < quota.count && used + size <= quota.bytes
}

fn read_stored(path: &Path) -> Option<Stored> {
    let mut text = String::new();
    open_nofollow(path)
        .ok()?
        .take(4 << 20)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text).ok()
}

fn remove(dir: &Path, id: &str) {
    for ext in ["json", "bundle"] {
        let _ = std::fs::remove_file(dir.join(format!("{id}.{ext}")));
    }
}

/// A snapshot being written: removed if dropped before [`Writing::finish`].
#[derive(Debug)]
pub struct Writing {
    dir: PathBuf,
    id: String,
    file: Option<std::fs::File>,
    expected: u64,
    written: u64,
    /// Ids removed to make room for it.
    pub evicted: Vec<String>,
    keep: Duration,
}

impl Writing {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// When it expires if finished now (seconds since the epoch).
    pub fn expires_at(&self) -> u64 {
        now_s() + self.keep.as_secs()
    }

    /// The bundle's next bytes; no more than it said it has.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.dir.join(format!("{}.partial", self.id));
        let over = self.written + bytes.len() as u64 > self.expected;
        let file = self.file.as_mut().filter(|_| !over).ok_or_else(|| {
            io(&path)(std::io::Error::other("more bytes than the snapshot's size"))
        })?;
        file.write_all(bytes).map_err(io(&path))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// The bundle whole: kept, with `stored` as its description.
    pub fn finish(mut self, stored: &Stored) -> Result<(), StoreError> {
        let partial = self.dir.join(format!("{}.partial", self.id));
        let file = self.file.take().expect("finished once");
        if self.written != self.expected {
            let e = std::io::Error::other("fewer bytes than the snapshot's size");
            return Err(io(&partial)(e));
        }
        file.sync_all().map_err(io(&partial))?;
        let bundle = self.dir.join(format!("{}.bundle", self.id));
        std::fs::rename(&partial, &bundle).map_err(io(&bundle))?;
        let json = self.dir.join(format!("{}.json", self.id));
        let tmp = self.dir.join(format!("{}.json.partial", self.id));
        let text = serde_json::to_vec(stored).map_err(|e| io(&tmp)(e.into()))?;
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &json).map_err(io(&json))?;
        self.id.clear();
        Ok(())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.id.is_empty() {
            let _ = std::fs::remove_file(self.dir.join(format!("{}.partial", self.id)));
            remove(&self.dir, &self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(w: &Writing, owner: &str, size: u64, created_at: u64) -> Stored {
        Stored {
            info: SnapshotInfo {
                snapshot: w.id().to_string(),
                session: "s-x".into(),
                policy: "default".into(),
                size_bytes: size,
                created_at,
                expires_at: w.expires_at(),
                names: vec!["x".into()],
                dropped: Default::default(),
                skipped: Default::default(),
                reseeded: vec![],
                threads_not_carried: vec![],
                evicted: w.evicted.clone(),
                took_ms: 1.0,
            },
            owner: owner.into(),
            start: SessionStartRequest::default(),
            cells: 2,
            created_ms: created_at,
        }
    }

    fn take(store: &SnapshotStore, owner: &str, bytes: &[u8], at: u64) -> (String, Vec<String>) {
        let mut w = store.begin(owner, bytes.len() as u64).unwrap();
        w.write(bytes).unwrap();
        let s = stored(&w, owner, bytes.len() as u64, at);
        let (id, evicted) = (w.id().to_string(), w.evicted.clone());
        w.finish(&s).unwrap();
        (id, evicted)
    }

    #[test]
    fn a_snapshot_is_its_owners_alone_and_the_oldest_make_room() {
        let root = tempfile::tempdir().unwrap();
        let quota = Quota {
            count: 2,
            bytes: 10,
            keep: Duration::from_secs(60),
        };
        let store = SnapshotStore::open(root.path(), quota, Duration::ZERO).unwrap();
        let (a, _) = take(&store, "uid-1", b"aaaa", 1);
        let (mut got, mut bundle) = store.get("uid-1", &a).unwrap();
        let mut bytes = Vec::new();
        bundle.read_to_end(&mut bytes).unwrap();
        assert_eq!((bytes.as_slice(), got.cells), (&b"aaaa"[..], 2));
        assert!(matches!(
            store.get("uid-2", &a),
            Err(StoreError::Unknown(_))
        ));
        assert!(matches!(
            store.get("uid-1", "snap-../x"),
            Err(StoreError::Unknown(_))
        ));
        let (b, evicted) = take(&store, "uid-1", b"bbbb", 2);
        assert!(evicted.is_empty());
        // A third: over the count, and over the bytes: a goes.
        let (_, evicted) = take(&store, "uid-1", b"cccccc", 3);
        assert_eq!(evicted, std::slice::from_ref(&a));
        got = store.get("uid-1", &b).unwrap().0;
        assert_eq!(got.info.snapshot, b);
        assert!(store.get("uid-1", &a).is_err());
        assert!(matches!(
            store.begin("uid-1", 11),
            Err(StoreError::TooBig { .. })
        ));
        assert!(store.begin("../etc", 1).is_err());
    }

    #[test]
    fn half_written_snapshots_are_gone_and_never_found() {
        let root = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(root.path(), Quota::default(), Duration::ZERO).unwrap();
        let mut w = store.begin("uid-1", 8).unwrap();
        w.write(b"half").unwrap();
        let id = w.id().to_string();
        // Killed while writing: its partial file stays, until the store opens.
        std::mem::forget(w);
        let partial = root.path().join("uid-1").join(format!("{id}.partial"));
        assert!(partial.exists());
        assert!(store.get("uid-1", &id).is_err());
        SnapshotStore::open(root.path(), Quota::default(), Duration::ZERO).unwrap();
        assert!(!partial.exists());
        // Dropped, or short of its size: nothing kept.
        let w = store.begin("uid-1", 8).unwrap();
        drop(w);
        let mut w = store.begin("uid-1", 8).unwrap();
        w.write(b"short").unwrap();
        let s = stored(&w, "uid-1", 8, 1);
        assert!(w.finish(&s).is_err());
        let left: Vec<_> = std::fs::read_dir(root.path().join("uid-1"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
