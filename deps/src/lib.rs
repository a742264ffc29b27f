//! A run's dependencies: gathered from its policy, its code's PEP 723 block
//! and its request, built once by uv in the install jail (see
//! [`install`]), kept in a content-addressed store (see [`store`]) and
//! mounted read-only into the run's jail as its venv.
//!
//! Threat model: PEP 723 blocks and requirement lists are client input,
//! parsed here by kept parsers (`toml`, pycell's requirement grammar) with
//! sizes checked first; wheels are installed by uv inside the install jail
//! (wheels only, so no build backend runs), and the env is copied out of it
//! without following a symlink. No `unsafe`.
#![forbid(unsafe_code)]

pub mod build;
pub mod fonts;
pub mod install;
pub mod pep723;
pub mod store;

use std::collections::HashSet;
use std::path::Path;

use pycell_policy::requirement::{self, Requirement};
use pycell_policy::Policy;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;

/// What one run needs installed, merged from every source: what pycelld's
/// broker hands its root monitor, which only checks its bounds
/// ([`DepsRequest::check_bounds`]) and never parses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepsRequest {
    /// The policy's packages, then the script's, then the request's; each
    /// once, normalized (a parsed [`Requirement`], printed).
    pub requirements: Vec<String>,
    /// The script's `requires-python`, checked.
    pub requires_python: Option<String>,
}

/// The longest `requires-python` a [`DepsRequest`] may carry.
pub const MAX_REQUIRES_PYTHON_LEN: usize = 256;

impl DepsRequest {
    /// The checks root makes of a request the broker gathered: counts and
    /// lengths, and no control characters; a constant amount of work per
    /// byte, and nothing parsed.
    pub fn check_bounds(&self) -> Result<(), BoundsError> {
        let plain = |s: &str| !s.trim().is_empty() && !s.chars().any(char::is_control);
        if self.requirements.is_empty() || self.requirements.len() > requirement::MAX_REQUIREMENTS {
            return Err(BoundsError::Count(self.requirements.len()));
        }
        if let Some((i, _)) = self
            .requirements
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() > requirement::MAX_REQUIREMENT_LEN || !plain(r))
        {
            return Err(BoundsError::Requirement(i));
        }
        match &self.requires_python {
            Some(rp) if pep723::check_requires_python(rp).is_err() => {
                Err(BoundsError::RequiresPython)
            }
            _ => Ok(()),
        }
    }
}

/// A dependency request outside the bounds root accepts from the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("{0} requirements: a run's env has 1 to {max}", max = requirement::MAX_REQUIREMENTS)]
    Count(usize),
    #[error("requirement {0} is empty, longer than {max} bytes, or has a control character", max = requirement::MAX_REQUIREMENT_LEN)]
    Requirement(usize),
    #[error(
        "requires-python is longer than {MAX_REQUIRES_PYTHON_LEN} bytes or not a version specifier"
    )]
    RequiresPython,
}

/// A refusal about dependencies.
pub fn failure(code: FailureCode, message: impl Into<String>) -> JailFailure {
    JailFailure::new(code, Layer::Dependencies, message)
}

fn invalid(message: impl Into<String>) -> JailFailure {
    failure(FailureCode::DepsInvalid, message)
}

/// A requirement of a requirements file that is not one: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin} line {line}: {error}")]
pub struct RequirementsFileError {
    pub origin: String,
    pub line: usize,
    pub error: requirement::RequirementError,
}

/// The requirements of a requirements file (`pycell run --requirements`):
/// one per line, `#` comments, `\` continuations; no options (`-r`,
/// `--index-url`, `-e`: pycell installs from its configured index only).
/// Errors name the file and line.
pub fn requirements_file(text: &str, origin: &str) -> Result<Vec<String>, RequirementsFileError> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut first_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = match raw.find(" #").or_else(|| raw.starts_with('#').then_some(0)) {
            Some(at) => &raw[..at],
            None => raw,
        };
        if pending.is_empty() {
            first_line = i + 1;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                continue;
            }
            None => pending.push_str(line),
        }
        let entry = std::mem::take(&mut pending);
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        Requirement::parse(entry).map_err(|error| RequirementsFileError {
            origin: origin.to_string(),
            line: first_line,
            error,
        })?;
        out.push(entry.to_string());
    }
    Ok(out)
}

/// Everything `policy`'s run of `code` with `listed` dependencies needs, or
/// `None` when it needs nothing beyond the interpreter.
pub fn gather(
    policy: &Policy,
    code: &str,
    listed: &[String],
) -> Result<Option<DepsRequest>, JailFailure> {
    let script = pep723::parse(code).map_err(|e| {
        invalid(format!("the script's `# /// script` metadata, {e}"))
            .with_hint("fix the block (PEP 723: https://peps.python.org/pep-0723/)")
    })?;
    let listed = requirement::parse_list(listed)
        .map_err(|(i, m)| invalid(format!("dependencies[{i}]: {m}")))?;
    let (script_deps, requires_python) = match script {
        Some(m) => (m.dependencies, m.requires_python),
        None => (Vec::new(), None),
    };
    let asked = !listed.is_empty() || !script_deps.is_empty();
    if asked && !policy.dependencies.allow {
        let names: Vec<String> = script_deps
            .iter()
            .chain(&listed)
            .map(|r| r.to_string())
            .collect();
        return Err(failure(
            FailureCode::DepsNotAllowed,
            format!(
                "the run asks for {} but policy {:?} does not allow dependencies",
                names.join(", "),
                policy.name
            ),
        )
        .with_hint("use a policy whose [dependencies] allow = true (the shipped `default` does), or drop them"));
    }
    let requirements = merge(
        policy
            .dependencies
            .packages
            .iter()
            .chain(&script_deps)
            .chain(&listed),
    )?;
    if requirements.is_empty() {
        return Ok(None);
    }
    Ok(Some(DepsRequest {
        requirements,
        requires_python,
    }))
}

/// What every run of `policy` needs installed (its `[dependencies]
/// packages`), or `None`: the operator's list only, no client input.
pub fn for_policy(policy: &Policy) -> Result<Option<DepsRequest>, JailFailure> {
    let requirements = merge(policy.dependencies.packages.iter())?;
    Ok((!requirements.is_empty()).then_some(DepsRequest {
        requirements,
        requires_python: None,
    }))
}

/// Each requirement once, in order, normalized; more than
/// [`requirement::MAX_REQUIREMENTS`] is refused as soon as it is seen (the
/// work is linear in what was asked).
fn merge<'a>(all: impl Iterator<Item = &'a Requirement>) -> Result<Vec<String>, JailFailure> {
    let mut seen = HashSet::new();
    let mut merged = Vec::new();
    for r in all {
        if seen.insert(r) {
            merged.push(r.to_string());
        }
        if merged.len() > requirement::MAX_REQUIREMENTS {
            return Err(invalid(format!(
                "too many requirements: at most {} are allowed (the policy's, the script's and the request's together)",
                requirement::MAX_REQUIREMENTS
            )));
        }
    }
    Ok(merged)
}

/// Hex SHA-256 of `parts`, each length-prefixed (so no two part lists
/// collide by concatenation).
pub fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of a request in the store: which env answers it without
/// resolving again. It covers the interpreter (its real path and file
/// identity, so an upgraded python gets new envs), the sorted requirements,
/// `requires-python`, and where the install policy finds wheels.
pub fn request_key(req: &DepsRequest, interpreter: &Path, source: &str) -> String {
    let identity = interpreter_identity(interpreter);
    let mut reqs = req.requirements.clone();
    reqs.sort();
    let reqs = reqs.join("\n");
    let rp = req.requires_python.clone().unwrap_or_default();
    digest([
        // v3 with the env key's v3 (byte-compiled envs with their font
        // cache).
        b"pycell-request-v3".as_slice(),
        identity.as_bytes(),
        reqs.as_bytes(),
        rp.as_bytes(),
        source.as_bytes(),
    ])
}

/// The interpreter's real path, device, inode, size and mtime.
fn interpreter_identity(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match std::fs::metadata(&real) {
        Ok(m) => format!(
            "{}:{}:{}:{}:{}",
            real.display(),
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime()
        ),
        Err(_) => real.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &str) -> Policy {
        let text = format!(
            "name = \"p\"\ndescription = \"d\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n{extra}"
        );
        Policy::from_toml_str(&text, Path::new("p.toml")).unwrap()
    }

    #[test]
    fn sources_merge_in_order_without_repeats() {
        let p = policy("[dependencies]\nallow = true\npackages = [\"numpy\"]\n");
        let code = "# /// script\n# dependencies = [\"six\", \"NumPy\"]\n# requires-python = \">=3.9\"\n# ///\n";
        let r = gather(&p, code, &["six".into(), "attrs>=23".into()])
            .unwrap()
            .unwrap();
        assert_eq!(r.requirements, ["numpy", "six", "attrs>=23"]);
        assert_eq!(r.requires_python.as_deref(), Some(">=3.9"));
        assert_eq!(
            gather(&p, "print(1)", &[])
                .unwrap()
                .unwrap()
                .requirements
                .len(),
            1
        );
        assert!(gather(&policy(""), "print(1)", &[]).unwrap().is_none());
    }

    #[test]
    fn a_policy_without_dependencies_refuses_them_by_name() {
        let e = gather(
            &policy(""),
            "# /// script\n# dependencies = [\"six\"]\n# ///\n",
            &[],
        )
        .unwrap_err();
        assert_eq!(e.code, FailureCode::DepsNotAllowed);
        assert!(
            e.message.contains("six") && e.message.contains("\"p\""),
            "{}",
            e.message
        );
    }

    #[test]
    fn bad_dependencies_are_invalid_with_where() {
        let p = policy("[dependencies]\nallow = true\n");
        let e = gather(&p, "x", &["ok".into(), "bad >> 1".into()]).unwrap_err();
        assert_eq!(e.code, FailureCode::DepsInvalid);
        assert!(e.message.starts_with("dependencies[1]: "), "{}", e.message);
        let e = gather(&p, "\n# /// script\n# dependencies = [1]\n# ///\n", &[]).unwrap_err();
        assert!(e.message.contains("line 3"), "{}", e.message);
    }

    #[test]
    fn requirements_files_skip_comments_and_refuse_options() {
        let text = "# pinned\nsix==1.17.0  # why\n\nrequests \\\n  >=2\n";
        assert_eq!(
            requirements_file(text, "r.txt").unwrap(),
            ["six==1.17.0", "requests   >=2"]
        );
        let e =
            requirements_file("six\n--extra-index-url https://example.net\n", "r.txt").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().starts_with("r.txt line 2: "), "{e}");
    }

    #[test]
    fn request_keys_ignore_order_but_not_content() {
        let r = |names: &[&str]| DepsRequest {
            requirements: names.iter().map(|n| n.to_string()).collect(),
            requires_python: None,
        };
        let py = Path::new("/usr/bin/python3");
        let k = request_key(&r(&["six", "attrs"]), py, "index");
        assert_eq!(k, request_key(&r(&["attrs", "six"]), py, "index"));
        assert_ne!(k, request_key(&r(&["six"]), py, "index"));
        assert_ne!(k, request_key(&r(&["six", "attrs"]), py, "other"));
        assert_eq!(k.len(), 64);
    }

    #[test]
    fn root_checks_only_the_bounds_of_a_gathered_request() {
        let ok = DepsRequest {
            requirements: vec!["six==1.17.0".into()],
            requires_python: Some(">=3.9".into()),
        };
        assert!(ok.check_bounds().is_ok());
        let with = |reqs: Vec<String>, rp: Option<&str>| DepsRequest {
            requirements: reqs,
            requires_python: rp.map(str::to_string),
        };
        let too_many = (0..65).map(|i| format!("p{i}")).collect();
        for bad in [
            with(Vec::new(), None),
            with(too_many, None),
            with(vec!["x".repeat(257)], None),
            with(vec!["six\n--index-url x".into()], None),
            with(vec!["six".into()], Some("")),
            with(vec!["six".into()], Some(">=3\n")),
        ] {
            assert!(bad.check_bounds().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_huge_script_block_is_refused_in_linear_time() {
        let p = policy("[dependencies]\nallow = true\n");
        let names: Vec<String> = (0..100_000).map(|i| format!("\"p{i}\"")).collect();
        let code = format!(
            "# /// script\n# dependencies = [{}]\n# ///\n",
            names.join(", ")
        );
        let e = gather(&p, &code, &[]).unwrap_err();
        assert_eq!(e.code, FailureCode::DepsInvalid);
        assert!(
            e.message.contains("at most 65536 are read"),
            "{}",
            e.message
        );
        let listed: Vec<String> = (0..64).map(|i| format!("q{i}")).collect();
        let code = "# /// script\n# dependencies = [\"r1\"]\n# ///\n";
        let e = gather(&p, code, &listed).unwrap_err();
        assert!(
            e.message.starts_with("too many requirements"),
            "{}",
            e.message
        );
    }
}
