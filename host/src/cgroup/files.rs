//! Reading and writing cgroup control files, and the pure parsing of their
//! contents.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Write `value` to an existing control file (cgroupfs creates them; we
/// never do).
pub(super) fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// mkdir that accepts an existing directory.
pub(super) fn mkdir(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// A control file's text, empty if it cannot be read.
pub(super) fn read_text(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

pub(super) fn read_u64(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The value of `key` in a flat keyed file (`key value` lines), 0 if absent.
pub(super) fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or(0)
}

pub(super) fn read_keyed(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .map(|t| keyed(&t, key))
        .unwrap_or(0)
}

/// `base/rel` for a relative cgroup path, ignoring empty segments.
pub(super) fn join_rel(base: &Path, rel: &str) -> PathBuf {
    let mut p = base.to_path_buf();
    for seg in rel.split('/').filter(|s| !s.is_empty()) {
        p.push(seg);
    }
    p
}

/// rmdir, deepest first, retrying while the kernel still calls a cgroup
/// busy (a moment after its last process is reaped). Other errors end the
/// attempt for that directory.
pub(super) fn remove_dirs(dirs: &[PathBuf]) {
    remove_dirs_with(dirs, |d| fs::remove_dir(d), std::thread::sleep);
}

/// [`remove_dirs`] with its rmdir and its sleep given (pure: unit-tested).
fn remove_dirs_with(
    dirs: &[PathBuf],
    mut remove: impl FnMut(&Path) -> io::Result<()>,
    mut sleep: impl FnMut(Duration),
) {
    for d in dirs.iter().rev() {
        let mut delay = Duration::from_micros(200);
        for _ in 0..12 {
            match remove(d) {
                Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
                    sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(100));
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_reads_flat_files() {
        let t = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n";
        assert_eq!(keyed(t, "oom_kill"), 2);
        assert_eq!(keyed(t, "oom"), 1);
        assert_eq!(keyed(t, "absent"), 0);
    }

    #[test]
    fn join_rel_ignores_empty_segments() {
        assert_eq!(
            join_rel(Path::new("/sys/fs/cgroup/memory"), "/a//b/"),
            PathBuf::from("/sys/fs/cgroup/memory/a/b")
        );
        assert_eq!(join_rel(Path::new("/x"), "/"), PathBuf::from("/x"));
    }

    #[test]
    fn removal_stops_at_errors_other_than_busy() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("f"), "").unwrap();
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let (mut tries, mut sleeps) = (Vec::new(), 0);
        let rmdir = |d: &Path| {
            tries.push(d.to_path_buf());
            fs::remove_dir(d)
        };
        remove_dirs_with(&[empty.clone(), full.clone()], rmdir, |_| sleeps += 1);
        // Deepest (last) first; ENOTEMPTY is not retried.
        assert_eq!(tries, [full.clone(), empty.clone()]);
        assert_eq!(sleeps, 0, "no retry on ENOTEMPTY");
        assert!(full.exists() && !empty.exists());
    }

    #[test]
    fn a_busy_cgroup_is_tried_again_with_growing_pauses_then_given_up() {
        let dir = PathBuf::from("/sys/fs/cgroup/example");
        let busy = || Err(io::Error::from_raw_os_error(nix::libc::EBUSY));
        let mut pauses = Vec::new();
        let mut tries = 0;
        let rmdir = |_: &Path| {
            tries += 1;
            busy()
        };
        remove_dirs_with(&[dir], rmdir, |d| pauses.push(d));
        assert_eq!(tries, 12);
        assert_eq!(pauses.first(), Some(&Duration::from_micros(200)));
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(pauses.last(), Some(&Duration::from_millis(100)));
    }
}
