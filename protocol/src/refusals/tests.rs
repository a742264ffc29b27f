use super::*;
use pycell_wire::codes::Layer;
use pycell_wire::limits::Bytes;

fn limits() -> RunLimits {
    RunLimits {
        memory: Bytes::mib(64),
        pids: 16,
        disk: Bytes::mib(8),
        max_output: Bytes(64 << 10),
        ..RunLimits::default()
    }
}

fn facts(l: &RunLimits) -> LimitFacts<'_> {
    LimitFacts {
        limits: Some(l),
        wall_timeout_s: Some(l.wall_timeout.as_secs_f64()),
        max_output: Some(l.max_output.get()),
        ..LimitFacts::default()
    }
}

#[test]
fn nothing_refused_gives_no_entry() {
    let l = limits();
    assert_eq!(of_limits(&facts(&l)), Vec::<Refusal>::new());
    assert!(of_network(&NetworkReport::default()).is_empty());
    assert!(of_tools(&ToolCallsReport::default()).is_empty());
}

#[test]
fn each_limit_names_its_value_rule_and_a_remedy() {
    let l = limits();
    let mut f = facts(&l);
    f.events = LimitEvents {
        oom_kills: 2,
        pids_refused: 5,
        disk_full: true,
    };
    f.timed_out = true;
    f.failure = Some(FailureCode::CpuTimeLimit);
    f.signal = Some(25);
    f.truncated = [true, false];
    let got = of_limits(&f);
    let layers: Vec<_> = got.iter().map(|r| r.layer).collect();
    use RefusalLayer as L;
    assert_eq!(
        layers,
        [
            L::Memory,
            L::Pids,
            L::Disk,
            L::WallTimeout,
            L::Cpu,
            L::Rlimit,
            L::Output
        ]
    );
    let by = |layer| got.iter().find(|r| r.layer == layer).unwrap();
    assert_eq!(by(L::Memory).count, 2);
    assert!(
        by(L::Memory).object.contains("64 MiB"),
        "{:?}",
        by(L::Memory)
    );
    assert_eq!(by(L::Memory).rule, "limits.memory");
    assert_eq!(
        (by(L::Pids).count, by(L::Pids).rule.as_str()),
        (5, "limits.pids")
    );
    assert!(by(L::Pids).object.contains("limit 16"));
    assert!(by(L::Disk).object.contains("8 MiB"));
    assert!(by(L::WallTimeout).object.contains("30 s"));
    assert!(by(L::Output).object.starts_with("stdout past 64 KiB"));
    for r in &got {
        assert!(
            !r.remedy.is_empty() && !r.remedy.contains("disable"),
            "{r:?}"
        );
    }
}

#[test]
fn refusals_of_one_object_count_together_and_the_list_is_bounded() {
    let mut list = Vec::new();
    for i in 0..40u64 {
        let d = Denied {
            host: format!("h{}.example.net", i % 20),
            port: 443,
            reason: "not_allowlisted".into(),
            count: 1,
        };
        add(&mut list, egress_refusal(&d));
    }
    assert_eq!(list.len(), MAX_REFUSALS);
    assert_eq!(list[0].count, 2);
    assert_eq!(list[0].object, "h0.example.net:443 (not_allowlisted)");
    assert!(list[0].rule.starts_with("network.allow"));
}

#[test]
fn a_long_object_from_the_sandbox_is_cut() {
    let r = Refusal::new(RefusalLayer::Tools, "x".repeat(1000), "r", "m");
    assert!(r.object.len() <= MAX_OBJECT + 3, "{}", r.object.len());
    let r = Refusal::new(RefusalLayer::Tools, "é".repeat(200), "r", "m");
    assert!(r.object.ends_with('…'));
}

#[test]
fn egress_dns_and_limits_of_the_proxy_are_refusals() {
    let report = NetworkReport {
        denied: vec![Denied {
            host: "10.0.0.1".into(),
            port: 80,
            reason: "private_address".into(),
            count: 3,
        }],
        failed: vec![
            Denied {
                host: "nowhere.invalid".into(),
                port: 443,
                reason: "dns_failed".into(),
                count: 1,
            },
            Denied {
                host: "slow.example.net".into(),
                port: 443,
                reason: "connect_timeout".into(),
                count: 1,
            },
        ],
        limit_reached: Some("max_connections".into()),
        ..NetworkReport::default()
    };
    let got = of_network(&report);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!((got[0].layer, got[0].count), (RefusalLayer::Egress, 3));
    assert!(got[0].rule.contains("private"));
    assert_eq!(got[1].layer, RefusalLayer::Dns);
    assert!(got[1].object.starts_with("nowhere.invalid"));
    assert_eq!(got[2].rule, "network.max_connections");
}

#[test]
fn tool_refusals_say_which_rule() {
    let mut report = ToolCallsReport::default();
    report.refused.insert("fs.delete (denied)".into(), 2);
    report.refused.insert("nope.x (unknown)".into(), 1);
    let got = of_tools(&report);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].object, "fs.delete (denied)");
    assert_eq!(got[0].count, 2);
    assert!(got[0].rule.starts_with("tools.allow"));
    assert!(got[1].rule.contains("catalog"));
}

fn end(status: RunStatus) -> EndFacts<'static> {
    EndFacts {
        status,
        exit_code: None,
        signal: None,
        error: None,
        session_end: None,
        peak_memory_bytes: 0,
        limits: None,
        pids_refused: false,
    }
}

#[test]
fn each_end_has_its_reason() {
    use EndReason as R;
    let ok = EndFacts {
        exit_code: Some(0),
        ..end(RunStatus::Ok)
    };
    assert_eq!(termination(&ok).reason, R::Exited);
    let failed = EndFacts {
        exit_code: Some(1),
        ..end(RunStatus::Error)
    };
    assert_eq!(termination(&failed).reason, R::Exited);
    let after_pids = EndFacts {
        pids_refused: true,
        ..failed
    };
    assert_eq!(termination(&after_pids).reason, R::PidsLimit);
    let crashed = EndFacts {
        signal: Some(11),
        ..end(RunStatus::Error)
    };
    let t = termination(&crashed);
    assert_eq!(t.reason, R::Signaled);
    assert!(t.detail.contains("SIGSEGV"), "{t:?}");
    let l = limits();
    let oom = EndFacts {
        peak_memory_bytes: 64 << 20,
        limits: Some(&l),
        ..end(RunStatus::Oom)
    };
    let t = termination(&oom);
    assert_eq!((t.reason, t.memory_bytes), (R::OomKill, Some(64 << 20)));
    assert!(t.detail.contains("64 MiB"), "{t:?}");
    assert_eq!(termination(&end(RunStatus::Killed)).reason, R::Cancelled);
    let cpu = JailFailure::new(FailureCode::CpuTimeLimit, Layer::Limits, "cpu");
    let killed = EndFacts {
        error: Some(&cpu),
        ..end(RunStatus::Killed)
    };
    assert_eq!(termination(&killed).reason, R::CpuLimit);
    let zygote = JailFailure::new(FailureCode::ZygoteDied, Layer::Jailer, "died");
    let killed = EndFacts {
        error: Some(&zygote),
        ..end(RunStatus::Killed)
    };
    let t = termination(&killed);
    assert_eq!((t.reason, t.detail.as_str()), (R::ZygoteDied, "died"));
    let idle = EndFacts {
        session_end: Some(SessionEnd::Idle),
        ..end(RunStatus::Killed)
    };
    assert_eq!(termination(&idle).reason, R::SessionEnded);
    assert_eq!(termination(&end(RunStatus::Timeout)).reason, R::WallTimeout);
}

#[test]
fn a_run_that_never_ran_says_which_process_failed() {
    use EndReason as R;
    for (code, want) in [
        (FailureCode::JailerFailed, R::JailerDied),
        (FailureCode::DaemonFailed, R::DaemonGone),
        (FailureCode::Cancelled, R::Cancelled),
        (FailureCode::ZygoteDied, R::ZygoteDied),
        (FailureCode::MountsFailed, R::Refused),
    ] {
        let f = JailFailure::new(code, Layer::Jailer, "m");
        let facts = EndFacts {
            error: Some(&f),
            ..end(RunStatus::Refused)
        };
        assert_eq!(termination(&facts).reason, want, "{code:?}");
    }
}

#[test]
fn a_cell_ends_finished_raised_or_interrupted() {
    assert_eq!(
        cell_termination(false, None, 30.0).reason,
        EndReason::Finished
    );
    let t = cell_termination(false, Some("ValueError"), 30.0);
    assert_eq!(t.reason, EndReason::Raised);
    assert!(t.detail.contains("ValueError"));
    let t = cell_termination(true, None, 2.5);
    assert_eq!(t.reason, EndReason::WallTimeout);
    assert!(t.detail.contains("2.5 s"), "{t:?}");
}

#[test]
fn sizes_and_signals_are_said_as_a_reader_writes_them() {
    assert_eq!(size(512 << 20), "512 MiB");
    assert_eq!(size(1536), "1.5 KiB");
    assert_eq!(size(100), "100 bytes");
    assert_eq!(signal_name(9), "SIGKILL");
    assert_eq!(signal_name(99), "signal 99");
}
