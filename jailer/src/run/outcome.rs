//! How a run ended, decided from what was observed: the pure rule
//! ([`classify`]) the supervisor applies once the jail is gone.

use nix::sys::signal::Signal;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::limits::RunLimits;
use pycell_wire::report::{JailFailure, LandlockReport, RunStatus};

use crate::setup::status::ChildMessage;

/// Everything the supervisor saw of a finished run.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// The wall-clock timeout expired and the supervisor killed the jail.
    pub timed_out: bool,
    /// The supervisor was told to stop the run (SIGTERM/SIGHUP).
    pub cancelled: bool,
    /// OOM kills the cgroup counted.
    pub oom_kills: u64,
    /// The jail's status messages, in order.
    pub messages: Vec<ChildMessage>,
    /// A description of how the jail's init ended, for an error message.
    pub init_status: String,
    /// The jail came from a zygote, which died (and took the jail along).
    pub zygote_died: bool,
}

/// How the run ended, when the code ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub landlock: Option<LandlockReport>,
    /// The jail found the kernel would let it set `security.*` attributes
    /// and refused every xattr write.
    pub xattr_writes_refused: bool,
    pub error: Option<JailFailure>,
}

fn limit(code: FailureCode, message: String, hint: Option<&str>) -> Option<JailFailure> {
    let f = JailFailure::new(code, Layer::Limits, message);
    Some(match hint {
        Some(h) => f.with_hint(h),
        None => f,
    })
}

/// The layers a jail said it had once ready: Landlock's (none in a
/// zygote), and whether it refused xattr writes.
type ReadyLayers = (Option<LandlockReport>, bool);

/// What the jail said: its layers once ready and its last message after
/// that. `Err` if it never got ready.
fn ready_and_end(seen: &Observed) -> Result<(ReadyLayers, Option<&ChildMessage>), JailFailure> {
    let mut ready = None;
    let mut ended = None;
    for m in &seen.messages {
        match m {
            ChildMessage::Ready {
                landlock,
                xattr_writes_refused,
                ..
            } => ready = Some((landlock.clone(), *xattr_writes_refused)),
            ChildMessage::SetupFailed(e) => return Err(e.failure()),
            ChildMessage::Joined => {}
            _ => ended = Some(m),
        }
    }
    let ready = ready.ok_or_else(|| not_ready(seen))?;
    Ok((ready, ended))
}

/// Why a jail that never reported ready ran no code: stopped on
/// purpose while it was set up (a cancel, the wall clock), or ended.
fn not_ready(seen: &Observed) -> JailFailure {
    // As for a run that started: a timeout wins over a cancel.
    if seen.timed_out {
        let m = "the wall-clock timeout expired while the jail was being set up: no code ran";
        return JailFailure::new(FailureCode::Timeout, Layer::Limits, m)
            .with_hint("raise --timeout; if setup alone takes this long, the host is overloaded");
    }
    if seen.cancelled {
        let m = "the run was cancelled while its jail was being set up: no code ran";
        return JailFailure::new(FailureCode::Cancelled, Layer::Jailer, m);
    }
    if seen.zygote_died {
        return zygote_died("while the run's jail was being set up: no code ran");
    }
    JailFailure::new(
        FailureCode::JailSetupFailed,
        Layer::Jailer,
        format!(
            "the jail ended before reporting ready (its init {})",
            seen.init_status
        ),
    )
}

/// The failure of a run whose zygote died `when`.
pub(crate) fn zygote_died(when: &str) -> JailFailure {
    JailFailure::new(
        FailureCode::ZygoteDied,
        Layer::Jailer,
        format!("the zygote this run was forked from died {when}; the run's jail, inside the zygote's, died with it"),
    )
    .with_hint("not the code's fault: run it again (a new zygote is started; meanwhile runs start cold)")
}

/// Whether the jail ended in a way nothing we saw explains: not our timeout
/// or cancel, no OOM kill, and init either killed by SIGKILL or gone
/// without a word. Only then is a zygote's death worth asking about.
pub(crate) fn ended_unexplained(seen: &Observed) -> bool {
    if seen.timed_out || seen.cancelled || seen.oom_kills > 0 {
        return false;
    }
    let last = seen
        .messages
        .iter()
        .rev()
        .find(|m| !matches!(m, ChildMessage::Joined));
    match last {
        None | Some(ChildMessage::Ready { .. }) => true,
        Some(ChildMessage::Signaled { signal }) => *signal == Signal::SIGKILL as i32,
        Some(_) => false,
    }
}

/// How a process ended, in words (for messages).
pub(crate) fn describe_end(status: Option<nix::sys::wait::WaitStatus>) -> String {
    use nix::sys::wait::WaitStatus;
    match status {
        Some(WaitStatus::Exited(_, code)) => format!("exited with status {code}"),
        Some(WaitStatus::Signaled(_, signal, _)) => format!("was killed by {}", signal.as_str()),
        Some(other) => format!("stopped otherwise ({other:?})"),
        None => "had not ended".to_string(),
    }
}

/// Decide the run's outcome. `Err` means the code never ran (the jail
/// failed to set up, or the program could not be executed).
pub(crate) fn classify(seen: &Observed, limits: &RunLimits) -> Result<Outcome, JailFailure> {
    let ((landlock, xattr_writes_refused), ended) = ready_and_end(seen)?;
    let (exit_code, signal) = match ended {
        Some(ChildMessage::Exited { code }) => (Some(*code), None),
        Some(ChildMessage::Signaled { signal }) => (None, Some(*signal)),
        // init was killed before it could say (timeout, cancel, OOM of init).
        _ => (None, Some(Signal::SIGKILL as i32)),
    };
    let killed = signal == Some(Signal::SIGKILL as i32);
    let (status, error) = if seen.timed_out {
        let secs = limits.wall_timeout.as_secs_f64();
        let m = format!("wall-clock timeout of {secs:.1}s expired; the sandbox was killed");
        (
            RunStatus::Timeout,
            limit(
                FailureCode::Timeout,
                m,
                Some("raise --timeout, or make the code faster"),
            ),
        )
    } else if seen.cancelled {
        (RunStatus::Killed, None)
    } else if seen.oom_kills > 0 && killed {
        let m = format!(
            "the memory limit of {} bytes was reached; the kernel killed the program",
            limits.memory.get()
        );
        (
            RunStatus::Oom,
            limit(
                FailureCode::Oom,
                m,
                Some("raise --memory, or use less memory"),
            ),
        )
    } else if seen.zygote_died && killed {
        (RunStatus::Killed, Some(zygote_died("while the run ran")))
    } else if let Some(ChildMessage::ExecFailed { message }) = ended {
        return Err(
            JailFailure::new(FailureCode::ExecFailed, Layer::Exec, message.clone())
                .with_hint("check the policy's interpreter path"),
        );
    } else if signal == Some(Signal::SIGXCPU as i32) {
        let m = format!(
            "the CPU time limit of {}s was reached",
            limits.cpu_time_whole_secs()
        );
        (RunStatus::Killed, limit(FailureCode::CpuTimeLimit, m, None))
    } else if exit_code == Some(0) {
        (RunStatus::Ok, None)
    } else {
        (RunStatus::Error, None)
    };
    Ok(Outcome {
        status,
        exit_code,
        signal,
        landlock,
        xattr_writes_refused,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::pipeline::{Step, StepError};
    use pycell_wire::report::LandlockStatus;

    fn limits() -> RunLimits {
        use pycell_wire::limits::Bytes;
        RunLimits {
            wall_timeout: std::time::Duration::from_secs(5),
            cpu_time: std::time::Duration::from_secs(3),
            memory: Bytes::mib(64),
            pids: 16,
            open_files: 64,
            file_size: Bytes::mib(1),
            disk: Bytes::mib(1),
            max_output: Bytes::mib(1),
            ..RunLimits::default()
        }
    }

    fn ready() -> ChildMessage {
        ChildMessage::Ready {
            landlock: Some(LandlockReport {
                abi: 7,
                status: LandlockStatus::FullyEnforced,
                tcp_connect_only_to: None,
            }),
            xattr_writes_refused: false,
            timings: Vec::new(),
        }
    }

    fn seen(end: Option<ChildMessage>) -> Observed {
        Observed {
            timed_out: false,
            cancelled: false,
            oom_kills: 0,
            messages: [Some(ready()), end].into_iter().flatten().collect(),
            init_status: "exited with status 1".into(),
            zygote_died: false,
        }
    }

    fn outcome(o: &Observed) -> Outcome {
        classify(o, &limits()).unwrap()
    }

    #[test]
    fn a_clean_exit_is_ok_and_a_nonzero_one_an_error() {
        let o = outcome(&seen(Some(ChildMessage::Exited { code: 0 })));
        assert_eq!(
            (o.status, o.exit_code, o.signal, o.error),
            (RunStatus::Ok, Some(0), None, None)
        );
        let o = outcome(&seen(Some(ChildMessage::Exited { code: 3 })));
        assert_eq!((o.status, o.exit_code), (RunStatus::Error, Some(3)));
        assert_eq!(o.landlock.map(|l| l.abi), Some(7));
    }

    #[test]
    fn a_signal_the_program_got_from_itself_is_an_error() {
        let o = outcome(&seen(Some(ChildMessage::Signaled { signal: 11 })));
        assert_eq!(
            (o.status, o.exit_code, o.signal),
            (RunStatus::Error, None, Some(11))
        );
    }

    #[test]
    fn a_timeout_wins_over_everything_else() {
        let mut s = seen(None);
        s.timed_out = true;
        s.cancelled = true;
        s.oom_kills = 1;
        let o = outcome(&s);
        assert_eq!((o.status, o.signal), (RunStatus::Timeout, Some(9)));
        let e = o.error.unwrap();
        assert_eq!((e.code, e.layer), (FailureCode::Timeout, Layer::Limits));
        assert!(e.message.contains("timeout of 5.0s"), "{e:?}");
    }

    #[test]
    fn a_cancelled_run_is_killed_without_an_error() {
        let mut s = seen(None);
        s.cancelled = true;
        let o = outcome(&s);
        assert_eq!((o.status, o.error), (RunStatus::Killed, None));
    }

    #[test]
    fn a_run_killed_with_its_zygote_says_so() {
        for end in [None, Some(ChildMessage::Signaled { signal: 9 })] {
            let mut s = seen(end);
            assert!(ended_unexplained(&s), "{s:?}");
            s.zygote_died = true;
            let o = outcome(&s);
            assert_eq!(o.status, RunStatus::Killed);
            assert_eq!(o.error.unwrap().code, FailureCode::ZygoteDied);
        }
        // Dying in setup: no code ran, and the code says why.
        let mut s = seen(None);
        s.messages.clear();
        s.zygote_died = true;
        assert!(ended_unexplained(&s));
        let e = classify(&s, &limits()).unwrap_err();
        assert_eq!(e.code, FailureCode::ZygoteDied, "{e:?}");
    }

    #[test]
    fn only_an_unexplained_end_asks_about_the_zygote() {
        let explained = [
            seen(Some(ChildMessage::Exited { code: 0 })),
            seen(Some(ChildMessage::Signaled { signal: 11 })),
            Observed {
                timed_out: true,
                ..seen(None)
            },
            Observed {
                cancelled: true,
                ..seen(None)
            },
            Observed {
                oom_kills: 1,
                ..seen(Some(ChildMessage::Signaled { signal: 9 }))
            },
        ];
        for s in explained {
            assert!(!ended_unexplained(&s), "{s:?}");
        }
        // A timeout wins over a zygote's death, as over everything.
        let s = Observed {
            timed_out: true,
            zygote_died: true,
            ..seen(None)
        };
        assert_eq!(outcome(&s).status, RunStatus::Timeout);
    }

    #[test]
    fn an_oom_kill_is_oom_only_when_the_program_died_of_sigkill() {
        let mut s = seen(Some(ChildMessage::Signaled { signal: 9 }));
        s.oom_kills = 1;
        let o = outcome(&s);
        assert_eq!(o.status, RunStatus::Oom);
        assert_eq!(o.error.unwrap().code, FailureCode::Oom);
        // A child process was OOM-killed but the program went on and exited.
        let mut s = seen(Some(ChildMessage::Exited { code: 0 }));
        s.oom_kills = 1;
        assert_eq!(outcome(&s).status, RunStatus::Ok);
    }

    #[test]
    fn sigxcpu_is_the_cpu_time_limit() {
        let o = outcome(&seen(Some(ChildMessage::Signaled { signal: 24 })));
        assert_eq!(o.status, RunStatus::Killed);
        let e = o.error.unwrap();
        assert_eq!(e.code, FailureCode::CpuTimeLimit);
        assert!(e.message.contains("3s"), "{e:?}");
    }

    #[test]
    fn an_exec_failure_refuses_the_run() {
        let s = seen(Some(ChildMessage::ExecFailed {
            message: "execve /x: ENOENT".into(),
        }));
        let f = classify(&s, &limits()).unwrap_err();
        assert_eq!((f.code, f.layer), (FailureCode::ExecFailed, Layer::Exec));
        assert!(f.hint.is_some());
    }

    #[test]
    fn a_setup_failure_refuses_the_run_with_the_steps_code() {
        let mut s = seen(None);
        s.messages = vec![ChildMessage::SetupFailed(StepError::new(
            Step::Rootfs,
            "no /usr",
        ))];
        let f = classify(&s, &limits()).unwrap_err();
        assert_eq!(
            (f.code, f.layer),
            (FailureCode::MountsFailed, Layer::Mounts)
        );
    }

    #[test]
    fn a_jail_that_never_got_ready_says_how_init_ended() {
        let mut s = seen(None);
        s.messages.clear();
        let f = classify(&s, &limits()).unwrap_err();
        assert_eq!(f.code, FailureCode::JailSetupFailed);
        assert!(
            f.message.contains("(its init exited with status 1)"),
            "{f:?}"
        );
    }

    #[test]
    fn a_run_stopped_while_its_jail_was_set_up_says_so() {
        let mut s = seen(None);
        s.messages.clear();
        s.cancelled = true;
        let f = classify(&s, &limits()).unwrap_err();
        assert_eq!(f.code, FailureCode::Cancelled, "{f:?}");
        assert!(
            f.message
                .contains("cancelled while its jail was being set up"),
            "{f:?}"
        );
        s.timed_out = true;
        let f = classify(&s, &limits()).unwrap_err();
        assert_eq!(
            (f.code, f.layer),
            (FailureCode::Timeout, Layer::Limits),
            "{f:?}"
        );
    }

    #[test]
    fn how_init_ended_is_said_in_words() {
        use nix::sys::wait::WaitStatus;
        use nix::unistd::Pid;
        let pid = Pid::from_raw(7);
        assert_eq!(
            describe_end(Some(WaitStatus::Exited(pid, 1))),
            "exited with status 1"
        );
        let killed = WaitStatus::Signaled(pid, Signal::SIGKILL, false);
        assert_eq!(describe_end(Some(killed)), "was killed by SIGKILL");
        assert_eq!(describe_end(None), "had not ended");
    }
}
