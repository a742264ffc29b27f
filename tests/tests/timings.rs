//! `pycell run --timings`: where a run's start and end spend their time,
//! each step of pycell, the jailer and the jail marked in order.

#![forbid(unsafe_code)]

use pycell_tests::Pycell;
use serde_json::Value;

/// The steps the result marks, in time order.
fn steps(result: &Value) -> Vec<String> {
    let marks = result["timings"].as_array().expect("timings in the result");
    let mut marks: Vec<(u64, String)> = marks
        .iter()
        .map(|m| {
            let at = m["at_us"].as_u64().expect("at_us");
            (at, m["step"].as_str().expect("step").to_string())
        })
        .collect();
    marks.sort();
    marks.into_iter().map(|(_, s)| s).collect()
}

#[test]
fn timings_mark_every_step_of_pycell_the_jailer_and_the_jail_in_order() {
    let out = Pycell::new(["run", "--timings", "--json", "-"])
        .stdin("print(1)\n")
        .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let steps = steps(&r);
    let at = |step: &str| {
        steps
            .iter()
            .position(|s| s == step)
            .unwrap_or_else(|| panic!("no {step:?} in {steps:#?}"))
    };
    assert_eq!(steps.first().map(String::as_str), Some("pycell: started"));
    assert_eq!(
        steps.last().map(String::as_str),
        Some("pycell: result in hand")
    );
    // The jail's pipeline, each step marked, in its fixed order.
    let pipeline = [
        "jail: wait_for_parent",
        "jail: mount_sources",
        "jail: rootfs",
        "jail: cgroup_attach",
        "jail: capabilities",
        "jail: landlock",
        "jail: seccomp",
    ];
    for pair in pipeline.windows(2) {
        assert!(
            at(pair[0]) < at(pair[1]),
            "{pair:?} out of order: {steps:#?}"
        );
    }
    assert!(at("pycell: spec resolved, uid leased") < at("jailer: started"));
    assert!(at("jailer: jail cloned") < at("jail: wait_for_parent"));
    assert!(at("jail: seccomp") < at("jailer: program ended, output relayed"));
    assert!(at("jailer: report assembled") < at("pycell: jailer ended, its uid given back"));
}

#[test]
fn without_the_flag_a_result_has_no_timings_and_streaming_mode_prints_a_table() {
    let plain = Pycell::new(["run", "--json", "-"])
        .stdin("print(1)\n")
        .run();
    assert_eq!(plain.result().get("timings"), None, "{}", plain.describe());
    let table = Pycell::new(["run", "--timings", "-"])
        .stdin("print(2)\n")
        .run();
    assert_eq!(table.stdout_str(), "2\n", "{}", table.describe());
    assert!(
        table.stderr.contains("where the run's time went")
            && table.stderr.contains("jail: seccomp"),
        "{}",
        table.describe()
    );
}
