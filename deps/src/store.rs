//! The env store: envs built once, addressed by content, shared read-only.
//!
//! ```text
//! ROOT/envs/KEY/          a venv (KEY: SHA-256 of python, platform, lock)
//! ROOT/meta/KEY.json      what it holds; its mtime is the env's last use
//! ROOT/requests/RKEY      the KEY that answers request RKEY (see request_key)
//! ROOT/locks/             flocks: one build per request, envs in use
//! ROOT/building/PID-N/    an env being copied in, renamed into envs/ when whole
//! ROOT/building/PID-removing-KEY/  an env being removed, renamed out of envs/ first
//! ```
//!
//! An env is published by one `rename` and removed after one, so a reader
//! sees all of it or nothing; nothing half-built or half-deleted is ever
//! under `envs/`. A run holds a shared
//! flock on its env for as long as it runs; removal takes an exclusive one
//! without waiting, so an env in use is never removed. Files are copied out
//! of the install jail's workspace by this process, so they belong to the
//! store's owner and no sandbox uid can write them.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{openat, readlinkat, Flock, FlockArg, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use pycell_protocol::result::Package;
use serde::{Deserialize, Serialize};

/// Where embedded mode keeps envs (root's); pycelld uses its state dir.
pub const EMBEDDED_STORE: &str = "/var/cache/pycell";
/// Deepest directory nesting copied out of an install.
const MAX_DEPTH: usize = 64;
/// Most entries one env may have.
const MAX_ENTRIES: usize = 500_000;

/// What an env holds, as recorded when it was built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvMeta {
    pub key: String,
    /// The interpreter's version, e.g. "3.11.2".
    pub python: String,
    /// `sysconfig.get_platform()`, e.g. "linux-x86_64".
    pub platform: String,
    pub packages: Vec<Package>,
    /// The requirements it was built for.
    pub requirements: Vec<String>,
    /// Seconds since the epoch.
    pub built_at: u64,
    pub install_ms: f64,
    pub size_bytes: u64,
}

/// An env listed by [`EnvStore::list`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvEntry {
    #[serde(flatten)]
    pub meta: EnvMeta,
    /// Seconds since the epoch.
    pub last_used: u64,
    pub in_use: bool,
}

/// An env a run is using: removal waits until this is dropped.
#[derive(Debug)]
pub struct EnvInUse {
    pub dir: PathBuf,
    pub meta: EnvMeta,
    _lock: Flock<File>,
}

#[derive(Debug, Clone)]
pub struct EnvStore {
    root: PathBuf,
}

fn is_key(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Write `bytes` to `path` atomically (a temp file renamed over it).
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

impl EnvStore {
    /// The store at `root`, creating its directories (0755) if needed.
    pub fn open(root: &Path) -> io::Result<EnvStore> {
        for sub in ["", "envs", "meta", "requests", "locks", "building"] {
            let dir = root.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)?;
        }
        let store = EnvStore {
            root: root.to_path_buf(),
        };
        store.remove_abandoned_builds();
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn env_dir(&self, key: &str) -> PathBuf {
        self.root.join("envs").join(key)
    }

    fn meta_path(&self, key: &str) -> PathBuf {
        self.root.join("meta").join(format!("{key}.json"))
    }

    fn lock_file(&self, name: &str) -> io::Result<File> {
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(self.root.join("locks").join(name))
    }

    /// Serialize builds of one request: held while building, so a second
    /// asker waits and then finds the env.
    pub fn build_lock(&self, request_key: &str) -> io::Result<Flock<File>> {
        let f = self.lock_file(&format!("request-{request_key}"))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))
    }

    /// The env that answers `request_key`, marked in use, if it is built.
    pub fn lookup(&self, request_key: &str) -> Option<EnvInUse> {
        let key = fs::read_to_string(self.root.join("requests").join(request_key)).ok()?;
        self.use_env(key.trim())
    }

    /// Env `key`, marked in use and its last use recorded, if it exists.
    pub fn use_env(&self, key: &str) -> Option<EnvInUse> {
        if !is_key(key) {
            return None;
        }
        let lock = self.lock_file(&format!("env-{key}")).ok()?;
        let lock = Flock::lock(lock, FlockArg::LockShared).ok()?;
        let meta_path = self.meta_path(key);
        let meta: EnvMeta = serde_json::from_slice(&fs::read(&meta_path).ok()?).ok()?;
        let dir = self.env_dir(key);
        if !dir.is_dir() {
            return None;
        }
        if let Ok(f) = File::options().write(true).open(&meta_path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(EnvInUse {
            dir,
            meta,
            _lock: lock,
        })
    }

    /// Copy the venv at `env` under the install jail's workspace
    /// (`workspace`, a directory descriptor) into the store as `meta.key`,
    /// unless that env exists already; then point `request_key` at it.
    /// `finish` gets the copy before it is published (under the name it
    /// will never be found by), to add what is built from the env itself.
    pub fn publish(
        &self,
        request_key: &str,
        workspace: BorrowedFd<'_>,
        env: &str,
        mut meta: EnvMeta,
        finish: &mut dyn FnMut(&Path),
    ) -> Result<EnvInUse, StoreError> {
        if !is_key(&meta.key) {
            return Err(StoreError::BadKey(meta.key));
        }
        let target = self.env_dir(&meta.key);
        if !target.is_dir() {
            let staging = self.root.join("building").join(format!(
                "{}-{}",
                std::process::id(),
                pycell_wire::spec::new_run_id()
            ));
            let copied = copy_dir_at(workspace, env, &staging, &mut Budget::default());
            let result = copied.and_then(|size| {
                meta.size_bytes = size;
                finish(&staging);
                fs::rename(&staging, &target).or_else(|e| {
                    if target.is_dir() {
                        Ok(()) // someone else published the same env first
                    } else {
                        Err(StoreError::io(
                            format!("publishing {}", target.display()),
                            e,
                        ))
                    }
                })
            });
            if staging.exists() {
                let _ = fs::remove_dir_all(&staging);
            }
            result?;
            let json = serde_json::to_vec_pretty(&meta).map_err(io::Error::other)?;
            write_atomic(&self.meta_path(&meta.key), &json).map_err(|e| {
                StoreError::io(
                    format!("writing {}", self.meta_path(&meta.key).display()),
                    e,
                )
            })?;
        }
        let alias = self.root.join("requests").join(request_key);
        write_atomic(&alias, meta.key.as_bytes())
            .map_err(|e| StoreError::io(format!("writing {}", alias.display()), e))?;
        self.use_env(&meta.key)
            .ok_or(StoreError::Vanished(meta.key))
    }

    /// Every env, least recently used first.
    pub fn list(&self) -> Vec<EnvEntry> {
        let Ok(dir) = fs::read_dir(self.root.join("meta")) else {
            return Vec::new();
        };
        let mut out: Vec<EnvEntry> = dir
            .flatten()
            .filter_map(|e| {
                let meta: EnvMeta = serde_json::from_slice(&fs::read(e.path()).ok()?).ok()?;
                let last_used = e
                    .metadata()
                    .ok()?
                    .modified()
                    .ok()?
                    .duration_since(UNIX_EPOCH)
                    .ok()?
                    .as_secs();
                let in_use = self.in_use(&meta.key);
                Some(EnvEntry {
                    meta,
                    last_used,
                    in_use,
                })
            })
            .collect();
        out.sort_by_key(|e| (e.last_used, e.meta.key.clone()));
        out
    }

    fn in_use(&self, key: &str) -> bool {
        let Ok(f) = self.lock_file(&format!("env-{key}")) else {
            return false;
        };
        Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err()
    }

    /// Remove env `key` and every request that points at it; refused while
    /// a run uses it.
    pub fn remove(&self, key: &str) -> Result<(), StoreError> {
        if !is_key(key) || !self.meta_path(key).exists() {
            return Err(StoreError::NoSuchEnv {
                key: key.to_string(),
                root: self.root.clone(),
            });
        }
        let lock = self.lock_file(&format!("env-{key}"))?;
        let _held = Flock::lock(lock, FlockArg::LockExclusiveNonblock)
            .map_err(|_| StoreError::InUse(key.to_string()))?;
        if let Ok(dir) = fs::read_dir(self.root.join("requests")) {
            for e in dir.flatten() {
                if fs::read_to_string(e.path()).is_ok_and(|k| k.trim() == key) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        fs::remove_file(self.meta_path(key))?;
        let dir = self.env_dir(key);
        if dir.exists() {
            // Out from under its key in one step, then deleted: a removal
            // cut short leaves its rest among abandoned builds (swept by
            // the next gc), never a half-deleted env a later build of the
            // same key would take for a whole one.
            let aside = self
                .root
                .join("building")
                .join(format!("{}-removing-{key}", std::process::id()));
            fs::rename(&dir, &aside)
                .map_err(|e| StoreError::io(format!("moving {} aside", dir.display()), e))?;
            fs::remove_dir_all(&aside)
                .map_err(|e| StoreError::io(format!("removing {}", aside.display()), e))?;
        }
        let _ = fs::remove_file(self.root.join("locks").join(format!("env-{key}")));
        Ok(())
    }

    /// Remove envs unused for longer than `max_age`, then the least
    /// recently used ones until the rest take at most `max_bytes`; never
    /// one in use. Returns the removed envs.
    pub fn gc(&self, max_bytes: u64, max_age: Duration) -> Vec<EnvEntry> {
        self.remove_abandoned_builds();
        let envs = self.list();
        let mut total: u64 = envs.iter().map(|e| e.meta.size_bytes).sum();
        let cutoff = now_secs().saturating_sub(max_age.as_secs());
        let mut removed = Vec::new();
        for e in envs {
            let stale = e.last_used < cutoff;
            if (stale || total > max_bytes) && self.remove(&e.meta.key).is_ok() {
                total = total.saturating_sub(e.meta.size_bytes);
                removed.push(e);
            }
        }
        removed
    }

    /// Staging directories whose builder process is gone.
    fn remove_abandoned_builds(&self) {
        let Ok(dir) = fs::read_dir(self.root.join("building")) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().and_then(|p| p.parse::<i32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// What a copy may still take.
#[derive(Debug)]
struct Budget {
    entries: usize,
}

/// Why the env store could not publish, remove or copy an env.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("bad env key {0:?}")]
    BadKey(String),
    #[error("no env {key:?} in {}", root.display())]
    NoSuchEnv { key: String, root: PathBuf },
    #[error("env {0} is in use by a run; try again when it has ended")]
    InUse(String),
    #[error("env {0} vanished right after it was published")]
    Vanished(String),
    #[error("{}: nested deeper than {MAX_DEPTH}", .0.display())]
    TooDeep(PathBuf),
    #[error("more than {MAX_ENTRIES} files in the env")]
    TooManyFiles,
    #[error("{}: a strange name", .0.display())]
    StrangeName(PathBuf),
    #[error("{}: not a file, directory or symlink; an env holds nothing else", .0.display())]
    NotAFile(PathBuf),
    /// `what` names the path or the step.
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}: {source}")]
    Sys { what: String, source: nix::Error },
    #[error(transparent)]
    Os(#[from] io::Error),
}

impl StoreError {
    fn io(what: String, source: io::Error) -> StoreError {
        StoreError::Io { what, source }
    }
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            entries: MAX_ENTRIES,
        }
    }
}

fn nix_io(what: &str) -> impl Fn(nix::Error) -> StoreError + '_ {
    move |e| StoreError::Sys {
        what: what.to_string(),
        source: e,
    }
}

/// `path` as the subject of an error.
fn at(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |e| StoreError::io(path.display().to_string(), e)
}

/// Copy directory `name` under `parent` (never following a symlink) to
/// `dest`, which must not exist. Regular files keep their execute bits and
/// lose set-id, sticky and group/other write bits; symlinks are recreated
/// as they are; anything else is refused. Returns the bytes copied.
fn copy_dir_at(
    parent: BorrowedFd<'_>,
    name: &str,
    dest: &Path,
    budget: &mut Budget,
) -> Result<u64, StoreError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let dir = openat(parent, name, flags, Mode::empty()).map_err(nix_io(name))?;
    copy_tree(dir, dest, 0, budget)
}

fn copy_tree(
    dir: OwnedFd,
    dest: &Path,
    depth: usize,
    budget: &mut Budget,
) -> Result<u64, StoreError> {
    if depth > MAX_DEPTH {
        return Err(StoreError::TooDeep(dest.to_path_buf()));
    }
    fs::DirBuilder::new()
        .mode(0o755)
        .create(dest)
        .map_err(at(dest))?;
    let handle = dir.try_clone()?;
    let mut entries = nix::dir::Dir::from_fd(dir).map_err(nix_io("reading a directory"))?;
    let mut names = Vec::new();
    for entry in entries.iter() {
        let entry = entry.map_err(nix_io("reading a directory"))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    let mut total = 0;
    for name in names {
        budget.entries = budget
            .entries
            .checked_sub(1)
            .ok_or(StoreError::TooManyFiles)?;
        total += copy_entry(handle.as_fd(), &name, &dest.join(&name), depth, budget)?;
    }
    Ok(total)
}

fn copy_entry(
    dir: BorrowedFd<'_>,
    name: &str,
    dest: &Path,
    depth: usize,
    budget: &mut Budget,
) -> Result<u64, StoreError> {
    if name.contains('/') || name.contains('\0') {
        return Err(StoreError::StrangeName(dest.to_path_buf()));
    }
    let st = fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix_io(name))?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFDIR {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let sub = openat(dir, name, flags, Mode::empty()).map_err(nix_io(name))?;
        copy_tree(sub, dest, depth + 1, budget)
    } else if kind == SFlag::S_IFLNK {
        let target = readlinkat(dir, name).map_err(nix_io(name))?;
        std::os::unix::fs::symlink(&target, dest).map_err(at(dest))?;
        Ok(0)
    } else if kind == SFlag::S_IFREG {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let src = openat(dir, name, flags, Mode::empty()).map_err(nix_io(name))?;
        let mode = 0o644 | (st.st_mode & 0o111);
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(dest)
            .map_err(at(dest))?;
        let copied = io::copy(&mut File::from(src), &mut out).map_err(at(dest))?;
        out.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(at(dest))?;
        Ok(copied)
    } else {
        Err(StoreError::NotAFile(dest.to_path_buf()))
    }
}

/// Read file `name` of directory `dir` (no symlink), at most `cap` bytes.
pub fn read_file_at(dir: BorrowedFd<'_>, name: &str, cap: u64) -> Result<String, StoreError> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty()).map_err(nix_io(name))?;
    let mut text = String::new();
    File::from(fd)
        .take(cap)
        .read_to_string(&mut text)
        .map_err(|e| StoreError::io(name.to_string(), e))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str) -> EnvMeta {
        EnvMeta {
            key: key.to_string(),
            python: "3.11.2".into(),
            platform: "linux-x86_64".into(),
            packages: vec![Package {
                name: "six".into(),
                version: "1.17.0".into(),
            }],
            requirements: vec!["six".into()],
            built_at: now_secs(),
            install_ms: 1.0,
            size_bytes: 0,
        }
    }

    /// A fake install workspace with an env of one file, one script and a
    /// symlink.
    fn workspace() -> (tempfile::TempDir, OwnedFd) {
        let ws = tempfile::tempdir().unwrap();
        let env = ws.path().join("env");
        fs::create_dir_all(env.join("bin")).unwrap();
        fs::write(env.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        fs::write(env.join("bin/tool"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(env.join("bin/tool"), fs::Permissions::from_mode(0o4777)).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", env.join("bin/python")).unwrap();
        let fd = File::open(ws.path()).unwrap().into();
        (ws, fd)
    }

    #[test]
    fn a_published_env_is_found_by_its_request_and_copied_safely() {
        let root = tempfile::tempdir().unwrap();
        let store = EnvStore::open(root.path()).unwrap();
        let (_ws, fd) = workspace();
        let key = "a".repeat(64);
        assert!(store.lookup("r1").is_none());
        let mut finished = None;
        let mut finish = |staged: &Path| {
            fs::write(staged.join("built-from-the-env"), "x").unwrap();
            finished = Some(staged.to_path_buf());
        };
        let env = store
            .publish("r1", fd.as_fd(), "env", meta(&key), &mut finish)
            .unwrap();
        assert_eq!(env.meta.size_bytes, 16 + 10);
        // What `finish` added is published with the env; it got the copy
        // before it had its name.
        assert!(env.dir.join("built-from-the-env").is_file());
        assert_ne!(finished.as_deref(), Some(env.dir.as_path()));
        let tool = fs::metadata(env.dir.join("bin/tool")).unwrap();
        assert_eq!(tool.permissions().mode() & 0o7777, 0o755);
        let link = fs::read_link(env.dir.join("bin/python")).unwrap();
        assert_eq!(link, Path::new("/usr/bin/python3"));
        drop(env);
        assert_eq!(store.lookup("r1").unwrap().meta.key, key);
        // A second request that resolves to the same env shares it.
        let (_ws2, fd2) = workspace();
        store
            .publish("r2", fd2.as_fd(), "env", meta(&key), &mut |_| {})
            .unwrap();
        assert_eq!(store.list().len(), 1);
        assert!(fs::read_dir(root.path().join("building"))
            .unwrap()
            .next()
            .is_none());
    }

    #[test]
    fn an_env_in_use_is_neither_removed_nor_collected() {
        let root = tempfile::tempdir().unwrap();
        let store = EnvStore::open(root.path()).unwrap();
        let (_ws, fd) = workspace();
        let (k1, k2) = ("1".repeat(64), "2".repeat(64));
        let used = store
            .publish("r1", fd.as_fd(), "env", meta(&k1), &mut |_| {})
            .unwrap();
        drop(
            store
                .publish("r2", fd.as_fd(), "env", meta(&k2), &mut |_| {})
                .unwrap(),
        );
        assert!(store.list().iter().any(|e| e.meta.key == k1 && e.in_use));
        assert!(store
            .remove(&k1)
            .unwrap_err()
            .to_string()
            .contains("in use"));
        let removed = store.gc(0, Duration::from_secs(3600));
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].meta.key, k2);
        assert!(store.lookup("r2").is_none());
        drop(used);
        store.remove(&k1).unwrap();
        assert!(store.list().is_empty() && !root.path().join("envs").join(&k1).exists());
        assert!(store
            .remove(&k1)
            .unwrap_err()
            .to_string()
            .contains("no env"));
    }

    #[test]
    fn special_files_are_refused_and_nothing_half_copied_stays() {
        let root = tempfile::tempdir().unwrap();
        let store = EnvStore::open(root.path()).unwrap();
        let (ws, fd) = workspace();
        nix::unistd::mkfifo(
            &ws.path().join("env/bin/fifo"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let e = store
            .publish("r", fd.as_fd(), "env", meta(&"c".repeat(64)), &mut |_| {})
            .unwrap_err();
        assert!(matches!(e, StoreError::NotAFile(_)), "{e}");
        assert!(e.to_string().contains("not a file, directory or symlink"));
        assert!(store.list().is_empty());
        assert!(fs::read_dir(root.path().join("envs"))
            .unwrap()
            .next()
            .is_none());
        assert!(fs::read_dir(root.path().join("building"))
            .unwrap()
            .next()
            .is_none());
    }
}
