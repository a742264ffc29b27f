//! matplotlib's font cache, built once with the env instead of by every
//! plotting run. matplotlib lists the fonts it can use in
//! `MPLCONFIGDIR/fontlist-v<VERSION>.json` and rebuilds that list
//! (half a second, and a fontconfig error on stderr, in a jail without
//! /etc/fonts) whenever it finds none. An env with matplotlib gets the list
//! at [`CACHE_DIR`], made by a jail of the run's own policy (no network
//! beyond the policy's; the env at /venv exactly as runs see it), before the
//! env is published. Runs get it copied into a writable `MPLCONFIGDIR` by
//! pycell's runner ([`cache_env`]). The list is the jail's output, so it is
//! as trusted as what any run of the env prints: it is checked for shape and
//! size, and only runs of the same env ever read it.

use std::path::Path;

pub use pycell_launch::resolve::MATPLOTLIB_CACHE_DIR as CACHE_DIR;
/// The largest font list taken (matplotlib's own: tens of KiB).
pub const MAX_LIST: usize = 4 << 20;

/// What the font jail runs: matplotlib builds its list, the jail prints its
/// file name, then its contents.
pub const BUILD_CODE: &str = r#"import glob, os, sys
os.environ["MPLCONFIGDIR"] = "/tmp/pycell-fonts"
import matplotlib.font_manager
[path] = glob.glob("/tmp/pycell-fonts/fontlist-v*.json")
sys.stdout.write(os.path.basename(path) + "\n")
with open(path) as f:
    sys.stdout.write(f.read())
"#;

/// Whether `env` (a venv) has matplotlib installed.
pub fn has_matplotlib(env: &Path) -> bool {
    let Ok(lib) = std::fs::read_dir(env.join("lib")) else {
        return false;
    };
    lib.flatten().any(|d| {
        d.path()
            .join("site-packages/matplotlib/__init__.py")
            .is_file()
    })
}

/// Why the font jail's output is not a font list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAFontList {
    #[error("no file name on the first line")]
    NoName,
    #[error("{0:?} is not a fontlist-v<VERSION>.json name")]
    Name(String),
    #[error("{0:?}: not a version matplotlib names")]
    Version(String),
    #[error("{0} bytes; at most {MAX_LIST}")]
    TooLarge(usize),
    #[error("not a matplotlib font list (no \"_version\")")]
    NoVersion,
    #[error("not JSON: {0}")]
    NotJson(String),
}

/// The font list's file name and contents, from the font jail's stdout, if
/// it is one.
pub fn parse_output(stdout: &str) -> Result<(&str, &str), NotAFontList> {
    let (name, body) = stdout.split_once('\n').ok_or(NotAFontList::NoName)?;
    let version = name
        .strip_prefix("fontlist-v")
        .and_then(|v| v.strip_suffix(".json"))
        .ok_or_else(|| NotAFontList::Name(name.to_string()))?;
    let version_ok = !version.is_empty()
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'+' || b == b'_');
    if !version_ok {
        return Err(NotAFontList::Version(name.to_string()));
    }
    if body.len() > MAX_LIST {
        return Err(NotAFontList::TooLarge(body.len()));
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(o)) if o.get("_version").is_some_and(|v| v.is_string()) => {
            Ok((name, body))
        }
        Ok(_) => Err(NotAFontList::NoVersion),
        Err(e) => Err(NotAFontList::NotJson(e.to_string())),
    }
}

/// Keep the list `(name, body)` in `env`'s [`CACHE_DIR`].
pub fn store(env: &Path, name: &str, body: &str) -> std::io::Result<()> {
    let dir = env.join(CACHE_DIR);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_matplotlib_font_list_is_taken() {
        let ok = "fontlist-v3.11.0.json\n{\"_version\": \"3.11.0\", \"ttflist\": []}";
        assert_eq!(parse_output(ok).unwrap().0, "fontlist-v3.11.0.json");
        for bad in [
            "",
            "{\"_version\": \"1\"}",
            "../../etc/x.json\n{\"_version\": \"1\"}",
            "fontlist-v../x.json\n{\"_version\": \"1\"}",
            "fontlist-v3.json\n[1]",
            "fontlist-v3.json\n{\"ttflist\": []}",
            "fontlist-v3.json\n{\"_version\": ",
        ] {
            assert!(parse_output(bad).is_err(), "{bad:?}");
        }
        let huge = format!(
            "fontlist-v3.json\n{{\"_version\": \"3\", \"x\": \"{}\"}}",
            "a".repeat(MAX_LIST)
        );
        assert!(matches!(
            parse_output(&huge),
            Err(NotAFontList::TooLarge(_))
        ));
    }

    #[test]
    fn matplotlib_is_found_in_any_python_directory_of_an_env() {
        let env = tempfile::tempdir().unwrap();
        assert!(!has_matplotlib(env.path()));
        let pkg = env.path().join("lib/python3.11/site-packages/matplotlib");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "").unwrap();
        assert!(has_matplotlib(env.path()));
    }
}
