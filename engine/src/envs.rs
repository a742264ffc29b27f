//! Dependency envs built by this process: `pycell env build` and pycelld's
//! env builders (a child of pycelld's monitor, which never runs the
//! client) both come here.

use pycell_deps::build::BuildOutcome;
use pycell_deps::store::EnvStore;
use pycell_deps::{self as deps, pep723};
use pycell_launch::launcher::{Launcher, PolicyChoice};
use pycell_protocol::result::EnvReport;
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;

use crate::local::{self, ensure_here};

/// What to build an env of: the policy's packages, a script's and the
/// ones listed, for a Python the spec allows.
#[derive(Debug, Clone, Copy)]
pub struct EnvWanted<'a> {
    /// The policy's name, or a path to a policy file (embedded only).
    pub policy: &'a str,
    /// A script whose `# /// script` block names packages, or "".
    pub code: &'a str,
    /// Requirements named besides (`--with`, a requirements file, a run's).
    pub listed: &'a [String],
    pub requires_python: Option<&'a str>,
}

/// The env `wanted` asks for, from `store` or built now by this process
/// (which waits for the install jail; SIGTERM or SIGHUP stop it), the
/// install's progress to `progress`.
pub fn build(
    launcher: &Launcher,
    store: &EnvStore,
    wanted: EnvWanted<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<EnvReport, JailFailure> {
    let invalid = |m: String| deps::failure(FailureCode::DepsInvalid, m);
    let policy = launcher
        .load_policy(PolicyChoice::from_arg(wanted.policy))
        .map_err(|e| e.failure())?;
    let Some(mut request) = deps::gather(&policy, wanted.code, wanted.listed)? else {
        return Err(invalid(format!(
            "nothing to install: policy {:?} lists no packages, and neither a script's block, --with nor --requirements names any",
            policy.name
        )));
    };
    if let Some(spec) = wanted.requires_python {
        pep723::check_requires_python(spec)
            .map_err(|m| invalid(format!("--requires-python: {m}")))?;
        request.requires_python = Some(spec.to_string());
    }
    let mut here = local::Here::start()?;
    let ensured = ensure_here(
        launcher,
        store,
        &policy,
        &request,
        &mut here.installer,
        progress,
    )?;
    Ok(ensured.report)
}

/// A build's result as a builder reports it, a failure's message cut to
/// 16 KiB: pycelld reads the outcome only once the builder has exited,
/// so it must fit a pipe's buffer.
pub fn outcome(built: Result<EnvReport, JailFailure>) -> BuildOutcome {
    match built {
        Ok(env) => BuildOutcome::Ready { env },
        Err(mut failure) => {
            cap_message(&mut failure.message);
            BuildOutcome::Failed { failure }
        }
    }
}

/// The outcome's JSON line (what pycelld reads from a builder's stdout;
/// empty if it cannot be encoded, which pycelld reports as no outcome).
pub fn outcome_line(outcome: &BuildOutcome) -> String {
    serde_json::to_string(outcome).unwrap_or_default()
}

fn cap_message(m: &mut String) {
    const CAP: usize = 16 << 10;
    if m.len() > CAP {
        let mut at = CAP;
        while !m.is_char_boundary(at) {
            at -= 1;
        }
        m.truncate(at);
        m.push_str(" [...]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_is_cut_on_a_char_boundary_and_still_decodes() {
        let long = "é".repeat(10_000);
        let failure = deps::failure(FailureCode::DepsInstallFailed, long);
        let out = outcome(Err(failure));
        let line = outcome_line(&out);
        assert!(line.len() < (17 << 10), "{}", line.len());
        let back: BuildOutcome = serde_json::from_str(&line).unwrap();
        let BuildOutcome::Failed { failure } = back else {
            panic!("not a failure: {line}")
        };
        assert!(failure.message.ends_with(" [...]"));
    }
}
