//! Before pycelld takes its first client it builds one real jail: a run of
//! the built-in `default` policy, embedded (a child of the monitor doing
//! [`Job::SelfCheck`], with the daemon's jailer, sandbox uids and cgroup
//! parent), that must end `ok`.
//! Every layer is built or the jailer refuses the run, so a host (or a
//! container: a pod without what docs/cluster.md lists) that cannot build
//! one makes pycelld refuse to start, saying which step failed and why,
//! rather than serve runs that would all be refused, and never with a
//! weaker jail.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use pycell_launch::launcher::Launcher;
use pycell_protocol::result::RunResult;
use pycell_wire::codes::Layer;
use pycell_wire::report::RunStatus;

use super::MonitorError;
use crate::config::Config;
use crate::monitor::envs::{job_command, job_env};
use crate::monitor::jobs::Job;

/// What the probe prints when its jail ran it.
const SAID: &str = "pycell self-check: jail built";
const PROBE: &str = "import os\nassert os.getuid() != 0\nprint('pycell self-check: jail built')\n";
/// A cold run takes well under a second; a slow emulated host, seconds.
const WITHIN: Duration = Duration::from_secs(60);

pub(super) fn check(config: &Config, launcher: &Launcher) -> Result<Duration, MonitorError> {
    let started = Instant::now();
    let (exe, env) = job_env(config, launcher)
        .map_err(|e| MonitorError::SelfCheck(format!("cannot start its run: {e}")))?;
    let job = Job::SelfCheck {
        policy: "default".into(),
        code: PROBE.into(),
    };
    let mut child = job_command(&exe, &env, &job)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| MonitorError::SelfCheck(format!("{}: {e}", exe.display())))?;
    let mut out = String::new();
    let reader = child.stdout.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = s.by_ref().take(1 << 20).read_to_string(&mut buf);
            buf
        })
    });
    loop {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        if started.elapsed() > WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            return Err(MonitorError::SelfCheck(format!(
                "its run did not end within {} s",
                WITHIN.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(r) = reader {
        out = r.join().unwrap_or_default();
    }
    verdict(&out).map(|()| started.elapsed())
}

/// Whether the run's JSON result says its jail was built, and if not, why.
fn verdict(json: &str) -> Result<(), MonitorError> {
    let result: RunResult = serde_json::from_str(json.trim())
        .map_err(|e| MonitorError::SelfCheck(format!("its run gave no result ({e})")))?;
    if result.status == RunStatus::Ok && result.stdout.contains(SAID) {
        return Ok(());
    }
    let why = match &result.error {
        Some(f) => {
            let hint = f
                .hint
                .as_deref()
                .or_else(|| profile_hint(f.layer, &f.message))
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            format!("{} at {}: {}{hint}", f.code, f.layer, f.message)
        }
        None => format!(
            "the run ended {:?} (exit {:?}): {}",
            result.status,
            result.exit_code,
            result.stderr.trim()
        ),
    };
    Err(MonitorError::SelfCheck(why))
}

/// Where a step a jail takes in its own namespaces was refused with EPERM
/// and the jailer named no cause: in a container, that is the runtime's
/// seccomp or AppArmor profile (root in a user namespace may make these
/// calls; only a filter or an LSM says no).
fn profile_hint(layer: Layer, message: &str) -> Option<&'static str> {
    let own_namespaces = matches!(
        layer,
        Layer::Namespaces | Layer::UserNamespace | Layer::Mounts | Layer::Network
    );
    (own_namespaces && (message.contains("EPERM") || message.contains("Operation not permitted")))
        .then_some("in a container, its seccomp or AppArmor profile refuses this call: a node pod needs seccompProfile Localhost pycell/pycelld.json and appArmorProfile Unconfined")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_run_that_said_so_passes() {
        let ok = serde_json::to_string(&RunResult {
            status: RunStatus::Ok,
            stdout: format!("{SAID}\n"),
            ..RunResult::refused("r", "default", dummy())
        })
        .unwrap();
        assert!(verdict(&ok).is_ok());
        let refused = serde_json::to_string(&RunResult::refused("r", "default", dummy())).unwrap();
        let e = verdict(&refused).unwrap_err().to_string();
        assert!(
            e.contains("mount /proc failed") && e.contains("procMount"),
            "{e}"
        );
        assert!(verdict("not json").is_err());
    }

    #[test]
    fn a_refused_namespace_call_points_at_the_profiles() {
        let hint = profile_hint(
            Layer::Namespaces,
            "sethostname: EPERM: Operation not permitted",
        );
        assert!(hint.is_some_and(|h| h.contains("pycell/pycelld.json")));
        assert_eq!(profile_hint(Layer::Cgroup, "EPERM"), None);
        assert_eq!(profile_hint(Layer::Namespaces, "ENOSPC"), None);
    }

    fn dummy() -> pycell_wire::report::JailFailure {
        pycell_wire::report::JailFailure::new(
            pycell_wire::codes::FailureCode::MountsFailed,
            pycell_wire::codes::Layer::Mounts,
            "mount /proc failed: Operation not permitted",
        )
        .with_hint("the container's /proc is masked: give the pod procMount: Unmasked")
    }
}
