//! Kept cgroups (v1): a run's cgroup is not removed when its run ends but
//! kept, empty, as one set of a small pool (`pycell-kept-N` in each
//! hierarchy), and the next run takes a set by renaming it to its own
//! name. On v1 a run touches five hierarchies: creating and removing five
//! directories cost twice the CPU of ten renames, and every removed memory
//! cgroup lingers in the kernel (a "dying" memcg, still charged with the
//! page cache its run read) until memory pressure frees it.
//!
//! A rename is the claim: the kernel renames a directory for one caller
//! only, so no lock is needed, and a taken set carries the run's own name
//! from then on (what reclaims a dead jailer's cgroups finds it by that
//! name, as before). v2 offers no rename of cgroups (its directories are
//! made and removed as before: one directory, cloned into).
//!
//! Only a whole set is ever kept: a set broken by a SIGKILL part way
//! through a rename (some hierarchies under the kept name, some not) is
//! removed by the next process that meets it. A kept set holds no process
//! (checked before it is kept and after it is taken) and unlimited memory
//! (so that any run's limits can be written in the usual order).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::files;

/// How many sets are kept under one parent at most: more than the runs a
/// host of this size runs at once.
pub(super) const KEPT_SETS: usize = 16;

/// The name of kept set `k`.
fn kept_name(k: usize) -> String {
    format!("pycell-kept-{k}")
}

/// Take a kept set for a run named `name`: each parent (one per hierarchy,
/// each once) has its `pycell-kept-N` renamed to `name`. The renamed
/// directories, in `parents`' order, or None when no whole set was there
/// (a broken one met on the way is removed).
pub(super) fn take(parents: &[PathBuf], name: &str) -> Option<Vec<PathBuf>> {
    let (first, rest) = parents.split_first()?;
    for k in 0..KEPT_SETS {
        let kept = kept_name(k);
        if fs::rename(first.join(&kept), first.join(name)).is_err() {
            continue;
        }
        let mut taken = vec![first.join(name)];
        for p in rest {
            if fs::rename(p.join(&kept), p.join(name)).is_err() {
                // Broken by a SIGKILL part way: what we took of it goes.
                files::remove_dirs(&taken);
                return None;
            }
            taken.push(p.join(name));
        }
        return Some(taken);
    }
    None
}

/// Keep `dirs` (one run's set, empty, unlimited) under the first free kept
/// name, or remove them: nothing but a whole kept set is left.
pub(super) fn keep_or_remove(dirs: &[PathBuf]) {
    let Some((first, rest)) = dirs.split_first() else {
        return;
    };
    for k in 0..KEPT_SETS {
        let kept = kept_name(k);
        let target = sibling(first, &kept);
        if target.exists() {
            continue;
        }
        match fs::rename(first, target) {
            Ok(()) => {}
            Err(e) if taken_name(&e) => continue,
            Err(_) => break,
        }
        for (i, d) in rest.iter().enumerate() {
            if rename_over_leftover(d, &sibling(d, &kept)).is_err() {
                // Remove the set: its renamed part under the kept name.
                let renamed = dirs[..=i].iter().map(|d| sibling(d, &kept));
                let left: Vec<PathBuf> = renamed.chain(rest[i..].iter().cloned()).collect();
                files::remove_dirs(&left);
                return;
            }
        }
        return;
    }
    files::remove_dirs(dirs);
}

/// `dir`'s sibling named `name`.
fn sibling(dir: &Path, name: &str) -> PathBuf {
    dir.with_file_name(name)
}

/// The rename's target name exists (cgroupfs says EEXIST; a plain
/// directory with something in it, ENOTEMPTY): another keeper's, just now.
fn taken_name(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EEXIST) | Some(nix::libc::ENOTEMPTY)
    )
}

/// Rename `from` to `to`; a `to` that is there already is the leftover of a
/// broken set in this hierarchy (its first hierarchy's part is free, or
/// we would not be here): removed (if empty) and the rename tried again.
fn rename_over_leftover(from: &Path, to: &Path) -> io::Result<()> {
    if to.exists() {
        fs::remove_dir(to)?;
    }
    fs::rename(from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three hierarchies' parents in a temp dir (plain directories rename
    /// as cgroupfs's do, for what is tested here).
    fn parents(tmp: &Path) -> Vec<PathBuf> {
        let p: Vec<PathBuf> = ["memory", "pids", "cpu"]
            .iter()
            .map(|h| tmp.join(h).join("runs"))
            .collect();
        for d in &p {
            fs::create_dir_all(d).unwrap();
        }
        p
    }

    fn set(parents: &[PathBuf], name: &str) -> Vec<PathBuf> {
        parents.iter().map(|p| p.join(name)).collect()
    }

    fn all_exist(dirs: &[PathBuf]) -> bool {
        dirs.iter().all(|d| d.is_dir())
    }

    fn none_exist(dirs: &[PathBuf]) -> bool {
        dirs.iter().all(|d| !d.exists())
    }

    #[test]
    fn a_set_is_kept_then_taken_whole_under_the_next_runs_name() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parents(tmp.path());
        assert_eq!(take(&p, "pycell-5-r-1"), None, "nothing kept yet");
        let run1 = set(&p, "pycell-5-r-1");
        for d in &run1 {
            fs::create_dir(d).unwrap();
        }
        keep_or_remove(&run1);
        assert!(none_exist(&run1));
        assert!(all_exist(&set(&p, "pycell-kept-0")));
        let run2 = take(&p, "pycell-6-r-2").expect("the kept set");
        assert_eq!(run2, set(&p, "pycell-6-r-2"));
        assert!(all_exist(&run2));
        assert!(none_exist(&set(&p, "pycell-kept-0")));
        assert_eq!(take(&p, "pycell-6-r-3"), None, "taken once only");
    }

    #[test]
    fn a_second_set_kept_at_once_gets_the_next_name_and_the_pool_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parents(tmp.path());
        for n in 0..=KEPT_SETS {
            let run = set(&p, &format!("pycell-5-r-{n}"));
            for d in &run {
                fs::create_dir(d).unwrap();
            }
            keep_or_remove(&run);
            assert!(none_exist(&run), "run {n}'s own name is gone");
        }
        for k in 0..KEPT_SETS {
            assert!(all_exist(&set(&p, &kept_name(k))));
        }
        let left = fs::read_dir(&p[0]).unwrap().count();
        assert_eq!(left, KEPT_SETS, "the one past the bound was removed");
    }

    #[test]
    fn a_set_broken_part_way_is_removed_by_whoever_meets_it() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parents(tmp.path());
        // A taker died after its first rename: the rest of set 0 is left.
        fs::create_dir(p[1].join("pycell-kept-0")).unwrap();
        fs::create_dir(p[2].join("pycell-kept-0")).unwrap();
        let run = set(&p, "pycell-5-r-1");
        for d in &run {
            fs::create_dir(d).unwrap();
        }
        keep_or_remove(&run);
        assert!(
            all_exist(&set(&p, "pycell-kept-0")),
            "kept over the leftovers"
        );
        assert!(none_exist(&run));
        // A keeper died after its first rename: only set 1's first part is there.
        fs::create_dir(p[0].join("pycell-kept-1")).unwrap();
        fs::remove_dir(p[0].join("pycell-kept-0")).unwrap();
        assert_eq!(take(&p, "pycell-7-r-2"), None);
        assert!(!p[0].join("pycell-kept-1").exists(), "its part removed");
        assert!(!p[0].join("pycell-7-r-2").exists());
    }
}
