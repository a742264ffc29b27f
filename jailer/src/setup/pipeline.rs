//! The jail pipeline: what the sandbox's first process does, in a fixed order,
//! between `clone` and `exec`. The order is the security argument, so it lives
//! in one function ([`run_steps`]) that tests observe through a recording
//! implementation of [`JailSteps`].
//!
//! Order (namespaces were created by `clone`, and the run's cgroup before
//! it; the parent pins every rlimit with `prlimit` and writes the uid/gid
//! maps with setgroups denied):
//!
//!  1. wait for the parent's uid/gid maps (parent death = EOF = exit)
//!  2. settings of the jail's own namespaces: a new time namespace for the
//!     program (its clocks start near zero, not at the host's uptime) and
//!     `vm.memfd_noexec = 2` in its pid namespace (where the kernel has it)
//!  3. mount sources cloned (private propagation; read-only detached copies)
//!  4. credentials: become the jail uid/gid (host: the unique sandbox uid),
//!     then arm the parent-death signal again (the switch cleared it)
//!  5. root file system built, then `pivot_root`, old root detached
//!  6. into the run's cgroup: on v1 we move ourselves in through the
//!     `tasks` files the parent opened; on v2 we were born inside; then wait
//!     for the parent's go (limits apply from here on, before any untrusted
//!     code exists; a jailer that died since step 4 shows as EOF here)
//!  7. cgroup namespace (rooted at the run's cgroup), hostname, loopback up
//!     (the network namespace is otherwise empty); with egress, the proxy's
//!     listener bound on it and sent out on the jailer's stdin socket
//!  8. `setsid` (no controlling terminal)
//!  9. drop all capabilities (bounding, ambient, inheritable, effective, permitted)
//! 10. `no_new_privs`
//! 11. close every inherited fd except 0/1/2 and the jailer's own status fds
//! 12. Landlock
//! 13. seccomp (last)
//!
//! then the init process forks the program, which execs it.

use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use serde::{Deserialize, Serialize};

/// Steps of the pipeline, named for error reports and order tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Step {
    WaitForParent,
    NamespaceSettings,
    MountSources,
    Credentials,
    Rootfs,
    CgroupAttach,
    CgroupNamespace,
    Hostname,
    Loopback,
    Setsid,
    Capabilities,
    NoNewPrivs,
    CloseFds,
    Landlock,
    Seccomp,
    Exec,
}

impl Step {
    /// The layer a failure of this step is reported against.
    pub fn layer(self) -> Layer {
        match self {
            Step::WaitForParent => Layer::Jailer,
            Step::CgroupAttach => Layer::Cgroup,
            Step::CgroupNamespace | Step::Hostname | Step::NamespaceSettings => Layer::Namespaces,
            Step::MountSources | Step::Rootfs => Layer::Mounts,
            Step::Credentials => Layer::UserNamespace,
            Step::Loopback => Layer::Network,
            Step::Setsid => Layer::Session,
            Step::Capabilities => Layer::Capabilities,
            Step::NoNewPrivs => Layer::NoNewPrivs,
            Step::CloseFds => Layer::FileDescriptors,
            Step::Landlock => Layer::Landlock,
            Step::Seccomp => Layer::Seccomp,
            Step::Exec => Layer::Exec,
        }
    }
}

/// A failed step: what failed, why, and what the operator can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{step:?}: {message}")]
pub(crate) struct StepError {
    pub step: Step,
    pub code: FailureCode,
    pub message: String,
    pub hint: Option<String>,
}

impl StepError {
    /// A step that failed: `<layer>_failed` unless [`StepError::with_code`] says more.
    pub fn new(step: Step, message: impl Into<String>) -> StepError {
        StepError {
            step,
            code: step.layer().step_failed(),
            message: message.into(),
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> StepError {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_code(mut self, code: FailureCode) -> StepError {
        self.code = code;
        self
    }

    /// The failure a run reports for it.
    pub fn failure(&self) -> JailFailure {
        JailFailure {
            code: self.code,
            layer: self.step.layer(),
            message: self.message.clone(),
            hint: self.hint.clone(),
        }
    }
}

/// One method per step; the real implementation lives in `child.rs`.
pub(crate) trait JailSteps {
    fn wait_for_id_maps(&mut self) -> Result<(), StepError>;
    fn configure_namespaces(&mut self) -> Result<(), StepError>;
    fn prepare_mount_sources(&mut self) -> Result<(), StepError>;
    fn become_jail_user(&mut self) -> Result<(), StepError>;
    fn build_root_and_pivot(&mut self) -> Result<(), StepError>;
    fn wait_for_cgroup(&mut self) -> Result<(), StepError>;
    fn enter_cgroup_namespace(&mut self) -> Result<(), StepError>;
    fn set_hostname(&mut self) -> Result<(), StepError>;
    fn bring_up_loopback(&mut self) -> Result<(), StepError>;
    fn new_session(&mut self) -> Result<(), StepError>;
    fn drop_capabilities(&mut self) -> Result<(), StepError>;
    fn set_no_new_privs(&mut self) -> Result<(), StepError>;
    fn close_inherited_fds(&mut self) -> Result<(), StepError>;
    fn apply_landlock(&mut self) -> Result<(), StepError>;
    fn apply_seccomp(&mut self) -> Result<(), StepError>;
    /// Called after each step that succeeded (for timings).
    fn finished(&mut self, _step: Step) {}
}

/// Run every step in the one fixed order; stop at the first failure.
pub(crate) fn run_steps<S: JailSteps>(s: &mut S) -> Result<(), StepError> {
    type Do<S> = fn(&mut S) -> Result<(), StepError>;
    let steps: [(Step, Do<S>); 15] = [
        (Step::WaitForParent, S::wait_for_id_maps),
        (Step::NamespaceSettings, S::configure_namespaces),
        (Step::MountSources, S::prepare_mount_sources),
        (Step::Credentials, S::become_jail_user),
        (Step::Rootfs, S::build_root_and_pivot),
        (Step::CgroupAttach, S::wait_for_cgroup),
        (Step::CgroupNamespace, S::enter_cgroup_namespace),
        (Step::Hostname, S::set_hostname),
        (Step::Loopback, S::bring_up_loopback),
        (Step::Setsid, S::new_session),
        (Step::Capabilities, S::drop_capabilities),
        (Step::NoNewPrivs, S::set_no_new_privs),
        (Step::CloseFds, S::close_inherited_fds),
        (Step::Landlock, S::apply_landlock),
        (Step::Seccomp, S::apply_seccomp),
    ];
    for (step, run) in steps {
        run(s)?;
        s.finished(step);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the order of calls; optionally fails at one step.
    struct Recorder {
        calls: Vec<Step>,
        finished: Vec<Step>,
        fail_at: Option<Step>,
    }

    impl Recorder {
        fn step(&mut self, s: Step) -> Result<(), StepError> {
            self.calls.push(s);
            if self.fail_at == Some(s) {
                return Err(StepError::new(s, "injected"));
            }
            Ok(())
        }
    }

    impl JailSteps for Recorder {
        fn wait_for_id_maps(&mut self) -> Result<(), StepError> {
            self.step(Step::WaitForParent)
        }
        fn configure_namespaces(&mut self) -> Result<(), StepError> {
            self.step(Step::NamespaceSettings)
        }
        fn wait_for_cgroup(&mut self) -> Result<(), StepError> {
            self.step(Step::CgroupAttach)
        }
        fn enter_cgroup_namespace(&mut self) -> Result<(), StepError> {
            self.step(Step::CgroupNamespace)
        }
        fn prepare_mount_sources(&mut self) -> Result<(), StepError> {
            self.step(Step::MountSources)
        }
        fn become_jail_user(&mut self) -> Result<(), StepError> {
            self.step(Step::Credentials)
        }
        fn build_root_and_pivot(&mut self) -> Result<(), StepError> {
            self.step(Step::Rootfs)
        }
        fn set_hostname(&mut self) -> Result<(), StepError> {
            self.step(Step::Hostname)
        }
        fn bring_up_loopback(&mut self) -> Result<(), StepError> {
            self.step(Step::Loopback)
        }
        fn new_session(&mut self) -> Result<(), StepError> {
            self.step(Step::Setsid)
        }
        fn drop_capabilities(&mut self) -> Result<(), StepError> {
            self.step(Step::Capabilities)
        }
        fn set_no_new_privs(&mut self) -> Result<(), StepError> {
            self.step(Step::NoNewPrivs)
        }
        fn close_inherited_fds(&mut self) -> Result<(), StepError> {
            self.step(Step::CloseFds)
        }
        fn apply_landlock(&mut self) -> Result<(), StepError> {
            self.step(Step::Landlock)
        }
        fn apply_seccomp(&mut self) -> Result<(), StepError> {
            self.step(Step::Seccomp)
        }
        fn finished(&mut self, step: Step) {
            self.finished.push(step);
        }
    }

    #[test]
    fn steps_run_in_the_documented_order() {
        let mut r = Recorder {
            calls: vec![],
            finished: vec![],
            fail_at: None,
        };
        run_steps(&mut r).unwrap();
        // Each step is marked finished under its own name (timings).
        assert_eq!(r.finished, r.calls);
        use Step::*;
        assert_eq!(
            r.calls,
            vec![
                WaitForParent,
                NamespaceSettings,
                MountSources,
                Credentials,
                Rootfs,
                CgroupAttach,
                CgroupNamespace,
                Hostname,
                Loopback,
                Setsid,
                Capabilities,
                NoNewPrivs,
                CloseFds,
                Landlock,
                Seccomp
            ]
        );
        // Security-relevant relations, stated on their own.
        let pos = |s: Step| r.calls.iter().position(|c| *c == s).unwrap();
        assert!(pos(Rootfs) < pos(CgroupAttach));
        assert!(pos(CgroupAttach) < pos(CgroupNamespace));
        assert!(pos(Capabilities) < pos(NoNewPrivs));
        assert!(pos(NoNewPrivs) < pos(Landlock));
        assert!(pos(CloseFds) < pos(Landlock));
        assert_eq!(
            *r.calls.last().unwrap(),
            Seccomp,
            "seccomp must be the last step"
        );
    }

    #[test]
    fn a_failing_step_stops_the_pipeline() {
        let mut r = Recorder {
            calls: vec![],
            finished: vec![],
            fail_at: Some(Step::Capabilities),
        };
        let e = run_steps(&mut r).unwrap_err();
        assert_eq!(e.step, Step::Capabilities);
        assert_eq!(e.code, FailureCode::CapabilitiesFailed);
        assert_eq!(*r.calls.last().unwrap(), Step::Capabilities);
        assert!(!r.calls.contains(&Step::Landlock));
        assert!(!r.finished.contains(&Step::Capabilities));
    }
}
