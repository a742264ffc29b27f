//! The install jail's job: pycell's install script (install.py) run under
//! the `install` policy, with uv and the wheel directories mounted, and
//! what its failures mean.

use std::path::{Path, PathBuf};

use pycell_policy::{Interpreter, Policy};

use crate::{failure, DepsRequest};
use pycell_launch::resolve::Extras;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_wire::codes::FailureCode;
use pycell_wire::report::{JailFailure, RunStatus};
use pycell_wire::spec::WorkspaceFile;

/// The script, run by the install policy's python.
pub const SCRIPT: &str = include_str!("install.py");
/// Where the Debian package, then `scripts/setup`, put the pinned uv.
pub const INSTALLED_UV: [&str; 2] = ["/usr/lib/pycell/uv", "/usr/local/lib/pycell/uv"];

/// The uv to run: `$PYCELL_UV`, else an installed one.
pub fn find_uv() -> Result<PathBuf, JailFailure> {
    let from_env = std::env::var_os("PYCELL_UV").filter(|p| !p.is_empty());
    let candidates: Vec<PathBuf> = match from_env {
        Some(p) => vec![PathBuf::from(p)],
        None => INSTALLED_UV.iter().map(PathBuf::from).collect(),
    };
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let list: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            failure(
                FailureCode::DepsUnavailable,
                format!(
                    "no uv to install dependencies with (looked at {})",
                    list.join(", ")
                ),
            )
            .with_hint(
                "install the pycell package, or run scripts/setup in a checkout, or set PYCELL_UV",
            )
        })
}

/// One install: the request and launch extras for the install jail, and
/// what identifies where its wheels come from (part of the request key).
#[derive(Debug)]
pub struct InstallJob {
    pub request: RunRequest,
    pub extras: Extras,
    pub source: String,
}

/// The job that builds `deps` for `target` (the run policy's interpreter)
/// in `install`'s jail with `uv`.
pub fn job(
    install: &Policy,
    target: &Path,
    deps: &DepsRequest,
    uv: &Path,
) -> Result<InstallJob, JailFailure> {
    let Some(src) = &install.install else {
        return Err(failure(
            FailureCode::DepsUnavailable,
            format!(
                "policy {:?} has no [install] section: it cannot build envs",
                install.name
            ),
        )
        .with_hint("name the shipped `install` policy in [dependencies] install_policy"));
    };
    let reachable = |p: &Path| {
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        install
            .mounts
            .iter()
            .any(|m| m.source == m.target && real.starts_with(&m.source))
    };
    if !reachable(target) {
        return Err(failure(
            FailureCode::DepsUnavailable,
            format!(
                "the interpreter {} is not inside policy {:?}'s [[mounts]], so its install jail cannot build envs for it",
                target.display(),
                install.name
            ),
        ));
    }
    let mut args = vec![
        uv.display().to_string(),
        target.display().to_string(),
        deps.requires_python.clone().unwrap_or_default(),
    ];
    match &src.index_url {
        Some(url) => args.extend(["--index-url".to_string(), url.clone()]),
        None => args.push("--no-index".to_string()),
    }
    for dir in &src.find_links {
        args.extend(["--find-links".to_string(), dir.display().to_string()]);
    }
    let source = source_identity(install, &args[3..]);
    // uv's directory, unless a policy mount already covers it (the
    // launch adds only what is not).
    let mut mounts = src.find_links.clone();
    mounts.extend(uv.parent().map(Path::to_path_buf));
    let requirements: String = deps.requirements.iter().map(|r| format!("{r}\n")).collect();
    Ok(InstallJob {
        request: RunRequest {
            code: SCRIPT.to_string(),
            filename: Some("pycell_install.py".to_string()),
            args,
            ..Default::default()
        },
        extras: Extras {
            env: None,
            mounts,
            files: vec![WorkspaceFile::text("requirements.in", requirements)],
            export_workspace: true,
            limits: None,
        },
        source,
    })
}

/// The index options, and for each wheel directory its modification time
/// (a directory whose wheels change gets new envs).
fn source_identity(install: &Policy, index_args: &[String]) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut s = index_args.join(" ");
    if let Some(src) = &install.install {
        for dir in &src.find_links {
            let mtime = std::fs::metadata(dir).map_or(0, |m| m.mtime_nsec() ^ m.mtime());
            s.push_str(&format!(" {}@{mtime}", dir.display()));
        }
    }
    if let Interpreter::HostPython(p) = &install.interpreter {
        s.push_str(&format!(" by {}", p.display()));
    }
    s
}

/// The lines of uv's messages that say what went wrong.
fn uv_explanation(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.starts_with("error:")
                || l.starts_with("cause:")
                || l.starts_with("hint:")
                || l.starts_with("pycell:")
                || l.starts_with("╰─▶")
        })
        .collect();
    let text = if lines.is_empty() {
        // No line uv marked: its last few.
        let all: Vec<&str> = stderr.lines().collect();
        all[all.len().saturating_sub(5)..].join(" ")
    } else {
        lines.join(" ")
    };
    let text = text
        .replace("error: ", "")
        .replace("cause: ", "")
        .replace("pycell: ", "");
    if text.chars().count() > 1200 {
        format!("{}...", text.chars().take(1200).collect::<String>())
    } else {
        text
    }
}

fn unreachable_index(stderr: &str) -> bool {
    [
        "Failed to fetch",
        "error sending request",
        "dns error",
        "Connect",
        "Could not connect",
        "tunnel",
        "403 Forbidden",
        "Failed to download",
    ]
    .iter()
    .any(|n| stderr.contains(n))
}

/// Why an install run failed, with a stable code and the package named.
pub fn classify(result: &RunResult, policy: &str) -> JailFailure {
    let stderr = result.stderr.as_str();
    let why = uv_explanation(stderr);
    let limit = |what: &str| {
        failure(
            FailureCode::DepsInstallLimit,
            format!("installing the dependencies reached the {what} limit of policy {policy:?}"),
        )
        .with_hint("ask for fewer or smaller packages, or have the operator raise the install policy's limits")
    };
    match (result.status, result.exit_code) {
        (RunStatus::Timeout, _) => limit("time"),
        (RunStatus::Oom, _) => limit("memory"),
        (RunStatus::Refused, _) => {
            let mut f = result.error.clone().unwrap_or_else(|| {
                failure(FailureCode::DepsInstallFailed, "the install jail was refused")
            });
            f.message = format!("the install jail: {}", f.message);
            f
        }
        _ if stderr.contains("No space left on device") || stderr.contains("Disk quota") => {
            limit("disk")
        }
        (_, Some(10)) => failure(FailureCode::DepsPythonUnsatisfiable, why),
        (_, Some(11)) if stderr.contains("no usable wheels") || stderr.contains("Wheels are required") => {
            failure(FailureCode::DepsNoWheel, why)
                .with_hint("pycell installs wheels only (no code runs at install time); pick a version or package that publishes a wheel for this platform")
        }
        (_, Some(11 | 13)) if unreachable_index(stderr) => {
            failure(FailureCode::DepsIndexUnreachable, why)
                .with_hint("the package index could not be reached from the install jail; check the install policy's index_url and [network] allow, and the host's proxy settings")
        }
        (_, Some(11)) => failure(FailureCode::DepsResolutionFailed, why)
            .with_hint("check the package names and version specifiers"),
        _ => failure(
            FailureCode::DepsInstallFailed,
            if why.is_empty() {
                format!("the install ended with status {} and no message", result.status.as_str())
            } else {
                why
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(exit: i32, stderr: &str) -> RunResult {
        let mut r = RunResult::refused("r-1", "install", failure(FailureCode::Internal, "x"));
        r.status = RunStatus::Error;
        r.error = None;
        r.exit_code = Some(exit);
        r.stderr = stderr.to_string();
        r
    }

    #[test]
    fn uv_failures_get_stable_codes_naming_the_package() {
        let cases = [
            (11, "error: No solution found when resolving dependencies\n  cause: Because no-such-pkg was not found in the package registry and you require no-such-pkg, we can conclude that your requirements are unsatisfiable.\n", FailureCode::DepsResolutionFailed, "no-such-pkg"),
            (11, "error: No solution found\n  cause: Because all versions of docopt have no usable wheels and you require docopt, ...\n\nhint: Wheels are required for `docopt` because building from source is disabled\n", FailureCode::DepsNoWheel, "docopt"),
            (11, "error: Request failed after 3 retries\n  cause: Failed to fetch: https://pypi.invalid/simple/six/\n  cause: dns error\n", FailureCode::DepsIndexUnreachable, "pypi.invalid"),
            (10, "pycell: the script needs Python >=3.99; the policy's interpreter /usr/bin/python3 is 3.11.2\n", FailureCode::DepsPythonUnsatisfiable, ">=3.99"),
            (13, "error: Failed to install: No space left on device (os error 28)\n", FailureCode::DepsInstallLimit, "disk"),
        ];
        for (exit, stderr, code, needle) in cases {
            let f = classify(&failed(exit, stderr), "install");
            assert_eq!(f.code, code, "{stderr}");
            assert!(f.message.contains(needle), "{}", f.message);
        }
        let mut t = failed(0, "");
        t.status = RunStatus::Timeout;
        assert_eq!(classify(&t, "install").code, FailureCode::DepsInstallLimit);
    }

    #[test]
    fn python_specifiers_in_the_script_are_consistent_with_the_rust_check() {
        // The script carries its own PEP 440 check; keep its operators in
        // step with what requires-python may use.
        for op in ["===", "~=", "==", "!=", "<=", ">=", "<", ">"] {
            assert!(SCRIPT.contains(&format!("\"{op}\"")), "{op}");
        }
    }
}
