//! pycell's runner compiled once per interpreter, so that python starts
//! on a `.pyc` instead of compiling the runner's text from `-c` (about
//! 2 ms of every cold run's start, more for a warm jail's, a zygote's or
//! a session's, which start on the whole runner).
//!
//! The compiled runner is kept in [`CACHE_DIR`] (root's, like every
//! directory above it), named by the runner's text and by the interpreter
//! (its real path, inode, size and modification time): a new runner or an
//! upgraded python never meets an old file. It is made by that
//! interpreter, run on the host as `nobody` in isolated mode without
//! `site` (`python -I -S -c PYC_COMPILER`: no environment, no path of
//! anyone's, nothing of a request), and only for an interpreter the jail
//! sees at the same path as the host (a bind of it onto itself): a venv's
//! python in the jail, or an interpreter bound elsewhere, starts on `-c`
//! as before. Whatever goes wrong, the run starts on `-c`: slower, not
//! less isolated. The jailer checks the file again (root's, in a
//! directory only root may change) and copies it into the jail's root.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pycell_runner::RunnerText;
use pycell_wire::spec::{trusted, BindMount, JailSpec, MAX_RUNNER_PYC};

/// Where compiled runners are kept.
pub const CACHE_DIR: &str = "/var/cache/pycell/runner";

/// How long an interpreter may take to compile the runner.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(20);

/// The uid and gid the compiling interpreter runs as (`nobody`).
const NOBODY: u32 = 65534;

/// Each interpreter's compiled runners, as this process found or made
/// them (None: it cannot have one; not asked again).
type Known = HashMap<(PathBuf, RunnerText), Option<PathBuf>>;
static KNOWN: Mutex<Option<Known>> = Mutex::new(None);

/// `spec` with python started on its runner compiled for its interpreter
/// (made now if it is not there yet), instead of on the runner's text;
/// None when `spec` starts on no runner text or cannot have it compiled.
pub fn compiled(spec: &JailSpec) -> Option<JailSpec> {
    let text = RunnerText::of(spec)?;
    if spec.from_zygote.is_some() {
        // Its python is a fork of the zygote's, started already.
        return None;
    }
    let interpreter = Path::new(spec.argv.first()?);
    if !same_path_in_jail(&spec.mounts, interpreter) {
        return None;
    }
    let pyc = {
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        let known = known.get_or_insert_with(HashMap::new);
        let key = (interpreter.to_path_buf(), text);
        match known.get(&key) {
            // A file found earlier is used only while it is still there
            // and still root's alone (someone may clear the cache).
            Some(Some(path)) if trusted_chain(path) => Some(path.clone()),
            Some(None) => None,
            _ => {
                let found = find_or_make(interpreter, text, Path::new(CACHE_DIR));
                known.insert(key, found.clone());
                found
            }
        }
    }?;
    pycell_runner::on_compiled(spec, &pyc)
}

/// Whether the jail sees `path` where the host does: the mount that
/// holds it in the jail (the longest target above it) binds its own
/// source path.
pub fn same_path_in_jail(mounts: &[BindMount], path: &Path) -> bool {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.target))
        .max_by_key(|m| m.target.components().count())
        .is_some_and(|m| m.source == m.target && !m.hide_source)
}

/// `text` compiled for `interpreter`, in `dir`, made if missing.
fn find_or_make(interpreter: &Path, text: RunnerText, dir: &Path) -> Option<PathBuf> {
    let real = fs::canonicalize(interpreter).ok()?;
    let meta = fs::metadata(&real).ok()?;
    if !trusted_chain(&real) {
        return None;
    }
    let path = dir.join(file_name(text, &real, &meta));
    if trusted_chain(&path) {
        return Some(path);
    }
    make_trusted_dir(dir).ok()?;
    compile_to(&real, text, &path).ok()?;
    trusted_chain(&path).then_some(path)
}

/// The file's name: the runner text's fingerprint and the interpreter's.
fn file_name(text: RunnerText, real: &Path, meta: &fs::Metadata) -> String {
    let id = format!(
        "{}\0{}\0{}\0{}\0{}",
        real.display(),
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
    );
    format!(
        "{}-{:016x}-{:016x}.pyc",
        text.name(),
        text.id(),
        pycell_runner::fnv1a(id.as_bytes())
    )
}

/// Whether `path` and every directory above it are root's and writable
/// by no one else, with no symlink on the way (what the jailer insists on).
fn trusted_chain(path: &Path) -> bool {
    let mut at = PathBuf::from("/");
    let check = |p: &Path| {
        fs::symlink_metadata(p).is_ok_and(|m| {
            !m.file_type().is_symlink() && trusted(m.uid(), m.gid(), m.mode()).is_ok()
        })
    };
    if !check(&at) {
        return false;
    }
    for c in path.components() {
        match c {
            Component::Normal(name) => at.push(name),
            Component::RootDir => continue,
            _ => return false,
        }
        if !check(&at) {
            return false;
        }
    }
    true
}

/// Make `dir` (and what is missing above it) root's, mode 0755, and
/// insist that all of it is trusted.
fn make_trusted_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    match trusted_chain(dir) {
        true => Ok(()),
        false => Err(io::Error::other(format!(
            "{} is not root's alone",
            dir.display()
        ))),
    }
}

/// Have `interpreter` compile `text` into `path` (through a temporary
/// file beside it, renamed into place once checked).
fn compile_to(interpreter: &Path, text: RunnerText, path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tmp = dir.join(format!(".compiling-{}", std::process::id()));
    let result = compile_into_file(interpreter, text, &tmp).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn compile_into_file(interpreter: &Path, text: RunnerText, tmp: &Path) -> io::Result<()> {
    let out = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(tmp)?;
    let mut child = Command::new(interpreter)
        .args(["-I", "-S", "-c", pycell_runner::PYC_COMPILER])
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(Stdio::null())
        .uid(NOBODY)
        .gid(NOBODY)
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let written = stdin.write_all(text.text().as_bytes());
    drop(stdin);
    let deadline = Instant::now() + COMPILE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the interpreter took too long"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    written?;
    let size = out.metadata()?.len();
    if !status.success() || !(17..=MAX_RUNNER_PYC).contains(&size) {
        return Err(io::Error::other(format!(
            "the interpreter failed ({status}, {size} bytes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_interpreter_bound_onto_itself_is_the_hosts() {
        let usr = BindMount::new("/usr", "/usr");
        let venv = BindMount::new("/var/lib/pycell/envs/abc", "/venv");
        let local = BindMount::new("/opt/python", "/usr/local");
        let mounts = [usr.clone(), venv, local];
        assert!(same_path_in_jail(&mounts, Path::new("/usr/bin/python3")));
        assert!(!same_path_in_jail(&mounts, Path::new("/venv/bin/python")));
        // The longest target wins: /usr/local is another source.
        assert!(!same_path_in_jail(
            &mounts,
            Path::new("/usr/local/bin/python3")
        ));
        assert!(!same_path_in_jail(&[], Path::new("/usr/bin/python3")));
        let hidden = BindMount {
            hide_source: true,
            ..usr
        };
        assert!(!same_path_in_jail(&[hidden], Path::new("/usr/bin/python3")));
    }

    #[test]
    fn the_name_changes_with_the_text_and_the_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        fs::write(&a, b"x").unwrap();
        let name = |text| file_name(text, &a, &fs::metadata(&a).unwrap());
        let before = name(RunnerText::Cold);
        assert!(before.starts_with("cold-") && before.ends_with(".pyc"));
        assert!(name(RunnerText::Full).starts_with("full-"));
        fs::write(&a, b"xy").unwrap();
        assert_ne!(before, name(RunnerText::Cold));
    }

    #[test]
    fn a_chain_through_a_directory_others_may_write_is_not_trusted() {
        // /tmp is writable by everyone (sticky): nothing under it is
        // trusted, whoever owns it.
        let dir = tempfile::tempdir().unwrap();
        assert!(!trusted_chain(dir.path()));
        assert!(trusted_chain(Path::new("/usr")));
    }
}
