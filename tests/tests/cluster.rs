//! Three pycelld nodes behind one `pycell mcp --http` front end, as on a
//! cluster: each node a real pycelld with its own socket, cgroup parent and
//! sandbox uids, reached through its own `pycell gateway` (mutual TLS with
//! a CA the test makes) on a loopback port. Driven by the MCP SDK's HTTP
//! client (tests/mcp/sdk_http.py, `cluster` phases): runs spread over the
//! nodes, a session stays on its node, SIGKILL of one node's pycelld ends
//! only its sessions (`session_gone`) while new runs go to the others, and
//! a restart of the front end loses nothing but the request in flight,
//! whose sandbox is gone with it.
//!
//! Needs root and the tools venv's python (PYCELL_TEST_TOOLS_PYTHON).

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use pycell_tests::daemon::Daemon;
use pycell_tests::http::{
    credentials, get, start_front, start_front_with_hosts, start_gateway, start_gateway_at, text,
    Served, GATEWAY_UID,
};
use pycell_tests::sdk::{sdk_report_with, tools_python};
use pycell_tests::{repo_root, require_root};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(240);
const NAMES: [&str; 3] = ["a", "b", "c"];

struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<Daemon>,
    _gateways: Vec<Served>,
    token: String,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let tokens = credentials(dir.path());
        let nodes: Vec<Daemon> = NAMES
            .iter()
            .map(|_| {
                Daemon::start(&format!(
                    "socket_mode = \"0666\"\nallowed_uids = [{GATEWAY_UID}]\nfront_end_uids = [{GATEWAY_UID}]\n"
                ))
            })
            .collect();
        let gateways = nodes
            .iter()
            .map(|n| start_gateway(&n.socket(), dir.path()))
            .collect();
        Cluster {
            token: tokens["alice"].as_str().unwrap().to_string(),
            dir,
            nodes,
            _gateways: gateways,
        }
    }

    fn front_args(&self, gateways: &[String]) -> Vec<String> {
        let p = |f: &str| self.dir.path().join(f).to_string_lossy().to_string();
        let mut args = vec!["--tokens".to_string(), p("tokens.toml")];
        for (name, at) in NAMES.iter().zip(gateways) {
            args.extend(["--node".to_string(), format!("{name}={at}")]);
        }
        for (flag, file) in [
            ("--node-tls-cert", "front-cert.pem"),
            ("--node-tls-key", "front-key.pem"),
            ("--node-ca", "ca.pem"),
        ] {
            args.extend([flag.to_string(), p(file)]);
        }
        args
    }

    fn front(&self, gateways: &[String]) -> Served {
        let args = self.front_args(gateways);
        let front = start_front(&args.iter().map(String::as_str).collect::<Vec<_>>());
        // The first status poll of each node.
        std::thread::sleep(Duration::from_millis(1500));
        front
    }

    fn phase(&self, front: &Served, phase: &str, handles: &[String]) -> Value {
        let handles = serde_json::to_string(handles).unwrap();
        let args = [
            "cluster",
            "--url",
            &front.at,
            "--token",
            &self.token,
            "--phase",
            phase,
            "--handles",
            &handles,
        ];
        sdk_report_with("sdk_http.py", &args, GUARD)
    }

    /// The run started last on any node but `skip` (by its audit log):
    /// the node's index and the run_start line.
    fn newest_run(&self, skip: usize) -> Option<(usize, Value)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .filter_map(|(i, n)| n.audit_events("run_start", 0).pop().map(|e| (i, e)))
            .max_by(|a, b| {
                a.1["ts"]
                    .as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&b.1["ts"].as_f64().unwrap_or(0.0))
            })
    }

    /// Runs each node started (its audit log's run_start lines).
    fn runs_per_node(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|n| {
                n.audit()
                    .lines()
                    .filter(|l| l.contains("\"event\":\"run_start\""))
                    .count()
            })
            .collect()
    }
}

#[test]
fn runs_spread_sessions_stay_and_a_lost_node_takes_only_its_sessions() {
    require_root();
    let mut cluster = Cluster::start();
    let gateways: Vec<String> = cluster._gateways.iter().map(|g| g.at.clone()).collect();
    let front = cluster.front(&gateways);

    let r = cluster.phase(&front, "spread", &[]);
    let show = |r: &Value| serde_json::to_string_pretty(r).unwrap();
    let runs = get(&r, "/runs").as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 6, "{}", show(&r));
    assert!(
        runs.iter()
            .all(|x| x["text"].as_str().unwrap_or("").contains("ran")),
        "{}",
        show(&r)
    );
    let per_node = cluster.runs_per_node();
    assert!(
        per_node.iter().all(|n| *n >= 1),
        "runs did not spread over the nodes: {per_node:?}"
    );
    let sessions = get(&r, "/sessions").as_array().cloned().unwrap_or_default();
    let handles: Vec<String> = sessions
        .iter()
        .map(|s| s["handle"].as_str().unwrap_or("").to_string())
        .collect();
    let on: Vec<&str> = handles
        .iter()
        .filter_map(|h| h.rsplit_once('@').map(|(_, n)| n))
        .collect();
    assert_eq!(on.len(), 3, "{}", show(&r));
    let mut sorted = on.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        NAMES,
        "one session per node (the least loaded): {}",
        show(&r)
    );
    assert!(
        handles
            .iter()
            .all(|h| text(&r, "/info/text").contains(h.as_str())),
        "{}",
        show(&r)
    );
    // A fork, a snapshot and a session from it stay on the source's node.
    let node_of = |p: &str| text(&r, p).rsplit_once('@').map(|(_, n)| n.to_string());
    let source = node_of("/fork/source");
    assert!(source.is_some(), "{}", show(&r));
    for p in ["/fork/fork", "/fork/snapshot", "/fork/restored"] {
        assert_eq!(node_of(p), source, "{p}: {}", show(&r));
    }
    assert!(text(&r, "/fork/cell/text").contains("42"), "{}", show(&r));
    assert!(
        text(&r, "/fork/restored_cell/text").contains("43"),
        "{}",
        show(&r)
    );

    // SIGKILL node b's pycelld: its sessions are gone; a's and c's are not;
    // new runs go to a and c.
    let b = NAMES.iter().position(|n| *n == "b").unwrap();
    let before = cluster.runs_per_node();
    cluster.nodes[b].signal(Signal::SIGKILL);
    cluster.nodes[b].wait(Duration::from_secs(10));
    let r = cluster.phase(&front, "after_kill", &handles);
    for (h, node) in handles.iter().zip(&on) {
        let cell = get(&r, &format!("/cells/{h}"));
        match *node {
            "b" => {
                assert_eq!(cell["is_error"], true, "{}", show(&r));
                let t = cell["text"].as_str().unwrap_or("");
                assert!(t.contains("session_gone") || t.contains("is over"), "{t}");
            }
            _ => assert!(
                cell["text"].as_str().unwrap_or("").contains("42"),
                "{h}: {}",
                show(&r)
            ),
        }
    }
    let runs = get(&r, "/runs").as_array().cloned().unwrap_or_default();
    assert!(
        runs.len() == 4 && runs.iter().all(|x| x["is_error"] == false),
        "{}",
        show(&r)
    );
    let after = cluster.runs_per_node();
    assert_eq!(after[b], before[b], "a run went to the killed node");
    assert_eq!(
        after.iter().sum::<usize>(),
        before.iter().sum::<usize>() + 4
    );
    let listed = text(&r, "/list/text");
    assert!(
        !handles
            .iter()
            .zip(&on)
            .any(|(h, n)| *n == "b" && listed.contains(h.as_str())),
        "{listed}"
    );

    // A run in flight when the front end is SIGKILLed: lost, and its
    // sandbox with it; the new front end finds the sessions as they were.
    let slow = Command::new(tools_python())
        .arg(repo_root().join("tests/mcp/sdk_http.py"))
        .args([
            "cluster",
            "--url",
            &front.at,
            "--token",
            &cluster.token,
            "--phase",
            "slow",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let (node, slow_run) = cluster
        .newest_run(b)
        .expect("the slow run started on a node");
    drop(front);
    let out = slow.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        get(&report, "/slow/exception").is_string() || get(&report, "/slow/is_error") == true,
        "{report}"
    );
    // Its connection closed: pycelld killed it, and nothing of it is left
    // (the sessions on the same node live on: they are the caller's).
    let ends = cluster.nodes[node].audit_events("run_end", 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut end = ends.into_iter().find(|e| e["run_id"] == slow_run["run_id"]);
    while end.is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        end = cluster.nodes[node]
            .audit_events("run_end", 0)
            .into_iter()
            .find(|e| e["run_id"] == slow_run["run_id"]);
    }
    let end =
        end.unwrap_or_else(|| panic!("the slow run did not end: {}", cluster.nodes[node].audit()));
    assert_eq!(end["status"], "killed", "{end}");
    let uid = slow_run["sandbox_uid"].as_u64().unwrap() as u32;
    let left: Vec<_> = cluster.nodes[node]
        .sandbox_processes()
        .into_iter()
        .filter(|p| p.uids.contains(&uid))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let front = cluster.front(&gateways);
    let r = cluster.phase(&front, "after_restart", &handles);
    for (h, node) in handles.iter().zip(&on) {
        if *node != "b" {
            let cell = get(&r, &format!("/cells/{h}"));
            assert!(
                cell["text"].as_str().unwrap_or("").contains("42"),
                "{h}: {}",
                show(&r)
            );
        }
    }
    assert!(
        get(&r, "/runs")
            .as_array()
            .is_some_and(|a| a.iter().all(|x| x["is_error"] == false)),
        "{}",
        show(&r)
    );
}

#[test]
fn a_gateway_takes_only_front_ends_of_the_cluster_ca() {
    require_root();
    let cluster = Cluster::start();
    let gateway = &cluster._gateways[0].at;
    // A front end whose certificate another CA signed reaches no node.
    let p = |f: &str| cluster.dir.path().join(f).to_string_lossy().to_string();
    let mut args = vec![
        "--tokens".to_string(),
        p("tokens.toml"),
        "--node".into(),
        format!("a={gateway}"),
    ];
    for (flag, file) in [
        ("--node-tls-cert", "stranger-cert.pem"),
        ("--node-tls-key", "stranger-key.pem"),
        ("--node-ca", "ca.pem"),
    ] {
        args.extend([flag.to_string(), p(file)]);
    }
    let front = start_front(&args.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(1500));
    let r = cluster.phase(&front, "after_restart", &[]);
    let runs = get(&r, "/runs").as_array().cloned().unwrap_or_default();
    assert!(!runs.is_empty(), "{r}");
    for run in &runs {
        assert_eq!(run["is_error"], true, "{r}");
        assert!(
            run["text"]
                .as_str()
                .unwrap_or("")
                .contains("no node of the cluster can take it"),
            "{r}"
        );
    }
    assert_eq!(cluster.runs_per_node().iter().sum::<usize>(), 0);
}

/// Nodes found by DNS (`--nodes-dns`, as a Kubernetes headless Service
/// lists a DaemonSet's pods): a node the name starts to list joins and
/// takes runs; one it no longer lists is gone, and its sessions answer
/// `session_gone`. The name is the front end's own /etc/hosts (a mount
/// namespace of its own), the gateways on 127.0.0.2 and 127.0.0.3.
#[test]
fn nodes_found_by_dns_join_and_leave() {
    require_root();
    let cluster = Cluster::start();
    let first = start_gateway_at(
        &cluster.nodes[0].socket(),
        cluster.dir.path(),
        "127.0.0.2:0",
    );
    let port = first.at.rsplit_once(':').unwrap().1.to_string();
    let _second = start_gateway_at(
        &cluster.nodes[1].socket(),
        cluster.dir.path(),
        &format!("127.0.0.3:{port}"),
    );
    let hosts = cluster.dir.path().join("hosts");
    let name = "pycell-nodes.invalid";
    std::fs::write(&hosts, format!("127.0.0.2 {name}\n")).unwrap();
    let p = |f: &str| cluster.dir.path().join(f).to_string_lossy().to_string();
    let args = [
        "--tokens".to_string(),
        p("tokens.toml"),
        "--nodes-dns".into(),
        format!("{name}:{port}"),
        "--node-tls-cert".into(),
        p("front-cert.pem"),
        "--node-tls-key".into(),
        p("front-key.pem"),
        "--node-ca".into(),
        p("ca.pem"),
    ];
    let front =
        start_front_with_hosts(&hosts, &args.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(1500));
    let show = |r: &Value| serde_json::to_string_pretty(r).unwrap();

    // One node listed: every run goes to it.
    let r = cluster.phase(&front, "after_restart", &[]);
    assert!(
        get(&r, "/runs")
            .as_array()
            .is_some_and(|a| a.len() == 4 && a.iter().all(|x| x["is_error"] == false)),
        "{}",
        show(&r)
    );
    assert_eq!(cluster.runs_per_node()[..2], [4, 0]);

    // The second joins: sessions land on both (the least loaded first).
    std::fs::write(&hosts, format!("127.0.0.2 {name}\n127.0.0.3 {name}\n")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let r = cluster.phase(&front, "spread", &[]);
    let handles: Vec<String> = get(&r, "/sessions")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| s["handle"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        handles.iter().any(|h| h.ends_with("@127.0.0.3")),
        "{}\nthe front end said:\n{}",
        show(&r),
        front.said()
    );
    assert!(
        handles.iter().any(|h| h.ends_with("@127.0.0.2")),
        "{}",
        show(&r)
    );
    assert!(
        cluster.runs_per_node()[1] >= 1,
        "{:?}",
        cluster.runs_per_node()
    );

    // It leaves the listing: its sessions are gone, the first's are not.
    std::fs::write(&hosts, format!("127.0.0.2 {name}\n")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let before = cluster.runs_per_node();
    let r = cluster.phase(&front, "after_kill", &handles);
    for h in &handles {
        let t = get(&r, &format!("/cells/{h}/text"))
            .as_str()
            .unwrap_or("")
            .to_string();
        match h.ends_with("@127.0.0.3") {
            true => assert!(t.contains("left the cluster"), "{h}: {t}"),
            false => assert!(t.contains("42"), "{h}: {t}"),
        }
    }
    assert_eq!(
        cluster.runs_per_node()[1],
        before[1],
        "a run went to the node that left"
    );
}
