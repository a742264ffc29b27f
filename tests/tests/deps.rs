//! Dependencies: PEP 723 blocks, --with and --requirements, resolved and
//! installed by uv in the install jail (wheels only), cached by content,
//! mounted read-only. A wheelhouse the tests write by hand
//! (tests/deps/make_wheels.py) keeps them deterministic and offline; one
//! test installs a real wheel from the real package index.

#![forbid(unsafe_code)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_protocol::client::{ClientError, Stage};
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_tests::daemon::Daemon;
use pycell_tests::{
    descendants_of, pycell_bin, repo_root, run_args, still_alive_after, Outcome, Pycell, Script,
};
use serde_json::Value;

/// Root-owned, not under a world-writable directory: the jailer mounts the
/// wheelhouse and the envs only from such places.
const BASE: &str = "/var/cache/pycell-tests/deps";

const MOUNTS: &str = "[[mounts]]\nsource = \"/usr\"\n[[mounts]]\nsource = \"/bin\"\n[[mounts]]\nsource = \"/lib\"\n[[mounts]]\nsource = \"/lib64\"\n[[mounts]]\nsource = \"/sbin\"\n";

fn head(name: &str) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"test\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n"
    )
}

/// An install policy for the wheelhouse (offline) or an index URL.
fn install_policy(name: &str, disk: &str, source: &str) -> String {
    install_policy_with_cpus(name, disk, source, "2.0")
}

/// [`install_policy`] with a CPU share (a small one makes an install slow
/// enough to be killed midway).
fn install_policy_with_cpus(name: &str, disk: &str, source: &str, cpus: &str) -> String {
    format!(
        "{}[limits]\nwall_timeout = \"2m\"\ncpu_time = \"2m\"\nmemory = \"1GiB\"\npids = 256\ncpus = {cpus}\nopen_files = 4096\ndisk = \"{disk}\"\n{source}\n{MOUNTS}[env]\nPATH = \"/usr/bin:/bin\"\nHOME = \"/workspace\"\nUV_CACHE_DIR = \"/tmp/uv-cache\"\nUV_PYTHON_DOWNLOADS = \"never\"\nUV_NO_PROGRESS = \"1\"\n",
        head(name)
    )
}

fn run_policy(name: &str, install: &str) -> String {
    format!(
        "{}[dependencies]\nallow = true\ninstall_policy = \"{install}\"\n{MOUNTS}[env]\nPATH = \"/usr/bin:/bin\"\nHOME = \"/workspace\"\n",
        head(name)
    )
}

/// The wheelhouse and the policies, made once per test process.
fn base() -> &'static Path {
    static BASE_DIR: OnceLock<PathBuf> = OnceLock::new();
    BASE_DIR.get_or_init(|| {
        pycell_tests::require_root();
        let base = pycell_tests::own_dir_under(std::path::Path::new(BASE));
        fs::create_dir_all(base.join("policies")).expect("create the test base");
        let wheels = base.join("wheels");
        let made = std::process::Command::new("python3")
            .arg(repo_root().join("tests/deps/make_wheels.py"))
            .arg(&wheels)
            .status()
            .expect("run make_wheels.py");
        assert!(made.success(), "make_wheels.py failed");
        let offline = format!("[install]\nfind_links = [{:?}]\n", wheels.display().to_string());
        let unreachable = "[network]\nmode = \"allowlist\"\nallow = [\"https://pypi.example.invalid\"]\n[install]\nindex_url = \"https://pypi.example.invalid/simple\"\n";
        let policies = [
            ("test-install", install_policy("test-install", "512MiB", &offline)),
            ("tiny-install", install_policy("tiny-install", "2MiB", &offline)),
            ("far-install", install_policy("far-install", "512MiB", unreachable)),
            ("slow-install", install_policy_with_cpus("slow-install", "512MiB", &offline, "0.03")),
            ("deps-slow", run_policy("deps-slow", "slow-install")),
            ("deps", run_policy("deps", "test-install")),
            ("deps-tiny", run_policy("deps-tiny", "tiny-install")),
            ("deps-far", run_policy("deps-far", "far-install")),
            ("nodeps", format!("{}{MOUNTS}", head("nodeps"))),
        ];
        for (name, text) in policies {
            fs::write(base.join("policies").join(format!("{name}.toml")), text).unwrap();
        }
        base
    })
}

/// A fresh env store for one test.
fn store(name: &str) -> PathBuf {
    let s = base().join(format!("store-{name}"));
    let _ = fs::remove_dir_all(&s);
    s
}

fn run_in(store: &Path, policy: &str, code: &str, opts: &[&str]) -> Outcome {
    let script = Script::new("main.py", code);
    let mut all = vec!["--embedded", "--policy", policy];
    all.extend(opts);
    Pycell::new(run_args(&script.path, &all, &[]))
        .env("PYCELL_POLICY_DIR", base().join("policies"))
        .env("PYCELL_ENV_STORE", store)
        .guard(Duration::from_secs(240))
        .run()
}

fn field<'a>(r: &'a Value, pointer: &str) -> &'a Value {
    r.pointer(pointer).unwrap_or(&Value::Null)
}

fn packages(r: &Value) -> Vec<String> {
    field(r, "/env/packages")
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    format!(
                        "{} {}",
                        p["name"].as_str().unwrap(),
                        p["version"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn envs_in(store: &Path) -> usize {
    fs::read_dir(store.join("envs")).map_or(0, |d| d.count())
}

fn nothing_building(store: &Path) -> bool {
    fs::read_dir(store.join("building")).map_or(true, |mut d| d.next().is_none())
}

const IMPORT_A: &str = "# /// script\n# dependencies = [\"pycell-test-a\"]\n# ///\nimport pycell_test_a, pycell_test_b\nprint(pycell_test_a.__file__, pycell_test_b.VERSION)\n";

#[test]
fn a_script_block_is_installed_once_then_found_in_the_store() {
    let store = store("once");
    let first = run_in(&store, "deps", IMPORT_A, &[]);
    let r = first.result();
    assert_eq!(r["status"], "ok", "{}", first.describe());
    assert_eq!(
        r["stdout"],
        "/venv/lib/python3.11/site-packages/pycell_test_a/__init__.py 2.0\n",
        "{}",
        first.describe()
    );
    assert_eq!(field(&r, "/env/cache"), "miss", "{}", first.describe());
    assert_eq!(packages(&r), ["pycell-test-a 1.0", "pycell-test-b 2.0"]);
    assert!(
        first.stderr.contains("installed pycell-test-a 1.0"),
        "no progress: {}",
        first.describe()
    );
    let key = field(&r, "/env/key").as_str().unwrap().to_string();

    let second = run_in(&store, "deps", IMPORT_A, &[]);
    let r2 = second.result();
    assert_eq!(r2["status"], "ok", "{}", second.describe());
    assert_eq!(field(&r2, "/env/cache"), "hit");
    assert_eq!(field(&r2, "/env/key"), key.as_str());
    assert!(
        !second.stderr.contains("installed"),
        "{}",
        second.describe()
    );

    // --with adds to the block: another set, another env.
    let third = run_in(&store, "deps", IMPORT_A, &["--with", "pycell-test-b==1.0"]);
    let r3 = third.result();
    assert_eq!(
        r3["stdout"].as_str().unwrap().split(' ').nth(1),
        Some("1.0\n"),
        "{}",
        third.describe()
    );
    assert_eq!(field(&r3, "/env/cache"), "miss");
    assert_eq!(envs_in(&store), 2);
    assert!(nothing_building(&store));
}

#[test]
fn a_requirements_file_works_and_its_options_are_refused() {
    let store = store("reqfile");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("requirements.txt");
    fs::write(&good, "# pinned\npycell-test-b==1.0  # old\n").unwrap();
    let code = "import pycell_test_b\nprint(pycell_test_b.VERSION)\n";
    let out = run_in(
        &store,
        "deps",
        code,
        &["--requirements", good.to_str().unwrap()],
    );
    assert_eq!(out.result()["stdout"], "1.0\n", "{}", out.describe());
    let bad = dir.path().join("bad.txt");
    fs::write(
        &bad,
        "pycell-test-b\n--extra-index-url https://example.net/simple\n",
    )
    .unwrap();
    let out = run_in(
        &store,
        "deps",
        code,
        &["--requirements", bad.to_str().unwrap()],
    );
    let r = out.result();
    assert_eq!(r["status"], "refused", "{}", out.describe());
    let m = field(&r, "/error/message").as_str().unwrap_or_default();
    assert!(m.contains("bad.txt line 2") && m.contains("options"), "{m}");
}

/// A run of a built env compiles none of the env's modules: they come
/// byte-compiled (hash-based, unchecked) from the install jail.
const SPY_ON_COMPILES: &str = "# /// script\n# dependencies = [\"pycell-test-a\"]\n# ///\nimport importlib.machinery as m, importlib.util, sys\ncompiled = []\nsource_to_code = m.SourceFileLoader.source_to_code\ndef spy(self, data, path, *a, **k):\n    compiled.append(path)\n    return source_to_code(self, data, path, *a, **k)\nm.SourceFileLoader.source_to_code = spy\nimport pycell_test_a, pycell_test_b\nprint('compiled', [p for p in compiled if p.startswith('/venv/')])\nwith open(importlib.util.cache_from_source(pycell_test_b.__file__), 'rb') as f:\n    print('pyc flags', int.from_bytes(f.read(8)[4:], 'little'))\n";

#[test]
fn an_env_is_byte_compiled_when_built_and_its_runs_compile_nothing() {
    let store = store("bytecode");
    for _ in 0..2 {
        let out = run_in(&store, "deps", SPY_ON_COMPILES, &[]);
        let r = out.result();
        assert_eq!(r["status"], "ok", "{}", out.describe());
        // flags 1: hash-based, not checked against the source.
        assert_eq!(
            r["stdout"],
            "compiled []\npyc flags 1\n",
            "{}",
            out.describe()
        );
    }
}

/// A wheel's `.pth` file runs when python starts with `site`: not while
/// its env is built (the marker it leaves would then be in the env), only
/// in the runs that use it (where the env is read-only, so it cannot).
#[test]
fn an_install_runs_no_package_code_not_even_a_pth_file() {
    let store = store("pth");
    let code = "# /// script\n# dependencies = [\"pycell-test-pth\"]\n# ///\nimport os, sys\nprint(sys.prefix, os.path.exists(os.path.join(sys.prefix, 'pth-ran')))\n";
    let out = run_in(&store, "deps", code, &[]);
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(packages(&r), ["pycell-test-pth 1.0"], "{}", out.describe());
    assert_eq!(r["stdout"], "/venv False\n", "{}", out.describe());
    let markers: Vec<PathBuf> = walk(&store)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "pth-ran"))
        .collect();
    assert_eq!(markers, Vec::<PathBuf>::new(), "a .pth file ran at install");
}

/// An env with matplotlib carries its font cache, built once when the env
/// was (by a jail like the run's), and runs find it instead of building
/// it: the wheelhouse's stand-in matplotlib says whether it had to.
#[test]
fn an_env_with_matplotlib_is_built_with_its_font_cache_and_runs_use_it() {
    let store = store("fonts");
    let code = "# /// script\n# dependencies = [\"matplotlib\"]\n# ///\nimport os, matplotlib.font_manager as fm\nprint(fm.BUILT_NOW, fm.fontManager['_version'], os.environ['MPLCONFIGDIR'])\n";
    for cache in ["miss", "hit"] {
        let out = run_in(&store, "deps", code, &[]);
        let r = out.result();
        assert_eq!(r["status"], "ok", "{}", out.describe());
        assert_eq!(field(&r, "/env/cache"), cache, "{}", out.describe());
        assert_eq!(
            r["stdout"],
            "False 0.1 /tmp/matplotlib\n",
            "{}",
            out.describe()
        );
        // Nothing of it lands in the run's workspace.
        assert_eq!(r["files"], serde_json::json!([]), "{}", out.describe());
        let key = field(&r, "/env/key").as_str().unwrap();
        let list = store
            .join("envs")
            .join(key)
            .join("share/pycell/matplotlib/fontlist-v0.1.json");
        assert!(list.is_file(), "{} missing", list.display());
    }
}

#[test]
fn the_env_is_read_only_to_the_run() {
    let store = store("readonly");
    let code = "# /// script\n# dependencies = [\"pycell-test-b\"]\n# ///\nimport os, pycell_test_b\nd = os.path.dirname(pycell_test_b.__file__)\nfor path in (d + '/__init__.py', d + '/new.py'):\n    try:\n        open(path, 'a').write('x')\n        print('WROTE', path)\n    except OSError as e:\n        print('refused', e.errno)\n";
    let out = run_in(&store, "deps", code, &[]);
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let stdout = r["stdout"].as_str().unwrap();
    assert!(
        !stdout.contains("WROTE") && stdout.matches("refused").count() == 2,
        "{}",
        out.describe()
    );
    // And on the host the files belong to the store's owner (root), not to
    // any sandbox uid.
    use std::os::unix::fs::MetadataExt;
    let key = field(&r, "/env/key").as_str().unwrap();
    for entry in walk(&store.join("envs").join(key)) {
        let m = fs::symlink_metadata(&entry).unwrap();
        assert_eq!(m.uid(), 0, "{} is not root's", entry.display());
        if !m.file_type().is_symlink() {
            assert_eq!(
                m.mode() & 0o022,
                0,
                "{} is group/other-writable",
                entry.display()
            );
        }
    }
}

#[test]
fn the_jail_does_not_show_where_the_store_keeps_its_env() {
    let store = store("hidden");
    let code = "# /// script\n# dependencies = [\"pycell-test-b\"]\n# ///\nimport pycell_test_b, sys\nprint(pycell_test_b.__file__)\nprint(open('/proc/self/mountinfo').read())\nprint(open('/proc/self/mounts').read())\n";
    let out = run_in(&store, "deps", code, &[]);
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("/venv/lib/"), "{stdout}");
    let key = field(&r, "/env/key").as_str().unwrap();
    let store = store.display().to_string();
    for secret in [store.as_str(), key, "/envs/"] {
        assert!(
            !stdout.contains(secret),
            "{secret:?} shows in the jail:\n{stdout}"
        );
    }
    assert!(stdout.contains(" /venv ro,"), "{stdout}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn concurrent_requests_for_one_env_build_it_once() {
    let store = store("concurrent");
    let code = "# /// script\n# dependencies = [\"pycell-test-b==2.0\"]\n# ///\nimport pycell_test_b\nprint(pycell_test_b.VERSION)\n";
    let results: Vec<Value> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| run_in(&store, "deps", code, &[])))
            .collect();
        runs.into_iter()
            .map(|h| h.join().unwrap().result())
            .collect()
    });
    let caches: Vec<&str> = results
        .iter()
        .map(|r| field(r, "/env/cache").as_str().unwrap_or("?"))
        .collect();
    for r in &results {
        assert_eq!(r["stdout"], "2.0\n", "{r}");
    }
    assert_eq!(
        caches.iter().filter(|c| **c == "miss").count(),
        1,
        "{caches:?}"
    );
    assert_eq!(envs_in(&store), 1);
}

/// (policy, code, extra flags, expected code, what the message names)
const BAD: &[(&str, &str, &[&str], &str, &str)] = &[
    ("deps", "print(1)", &["--with", "pycell-test-nonexistent"], "deps_resolution_failed", "pycell-test-nonexistent"),
    ("deps", "print(1)", &["--with", "pycell-test-sdist"], "deps_no_wheel", "pycell-test-sdist"),
    ("deps", "print(1)", &["--with", "pycell-test-b==1.0", "--with", "pycell-test-b>=2"], "deps_resolution_failed", "pycell-test-b"),
    ("deps", "# /// script\n# requires-python = \">=3.99\"\n# dependencies = [\"pycell-test-b\"]\n# ///\n", &[], "deps_python_unsatisfiable", ">=3.99"),
    ("deps", "\n# /// script\n# dependencies = [\"pycell-test-b >> 1\"]\n# ///\n", &[], "deps_invalid", "line 3"),
    ("deps", "print(1)", &["--with", "x @ https://example.net/x.whl"], "deps_invalid", "direct references"),
    ("nodeps", "print(1)", &["--with", "pycell-test-b"], "deps_not_allowed", "pycell-test-b"),
    ("deps-far", "print(1)", &["--with", "pycell-test-b"], "deps_index_unreachable", "pypi.example.invalid"),
    ("deps-tiny", "print(1)", &["--with", "pycell-test-big"], "deps_install_limit", "disk"),
];

#[test]
fn bad_dependencies_are_refused_with_stable_codes_and_nothing_is_cached() {
    let store = store("bad");
    for (policy, code, flags, expected, named) in BAD {
        let out = run_in(&store, policy, code, flags);
        let r = out.result();
        assert_eq!(r["status"], "refused", "{}", out.describe());
        assert_eq!(field(&r, "/error/code"), *expected, "{}", out.describe());
        let m = field(&r, "/error/message").as_str().unwrap_or_default();
        assert!(
            m.contains(named),
            "{expected}: the message does not name {named:?}: {m}"
        );
        assert_eq!(
            field(&r, "/error/layer"),
            "dependencies",
            "{}",
            out.describe()
        );
    }
    assert_eq!(envs_in(&store), 0);
    assert!(nothing_building(&store));
}

#[test]
fn the_real_package_index_serves_a_wheel_the_host_lacks() {
    let host = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import iniconfig"])
        .output()
        .unwrap();
    assert!(
        !host.status.success(),
        "this host's python already has iniconfig; pick another package"
    );
    let store = store("pypi");
    let code = "# /// script\n# dependencies = [\"iniconfig\"]\n# ///\nimport iniconfig\nprint(iniconfig.__name__)\n";
    // The shipped `default` and `install` policies (built in, or the
    // operator's copies if installed).
    let script = Script::new("main.py", code);
    let out = Pycell::new(run_args(&script.path, &["--embedded"], &[]))
        .env("PYCELL_ENV_STORE", &store)
        .guard(Duration::from_secs(240))
        .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(r["stdout"], "iniconfig\n");
    assert_eq!(field(&r, "/env/cache"), "miss");
    assert!(
        packages(&r).iter().any(|p| p.starts_with("iniconfig ")),
        "{r}"
    );
}

fn env_cmd(store: &Path, args: &[&str]) -> Outcome {
    let mut all = vec!["env"];
    all.extend(args);
    Pycell::new(all).env("PYCELL_ENV_STORE", store).run()
}

#[test]
fn pycell_env_lists_removes_and_collects_envs() {
    let store = store("envcmd");
    for b in ["1.0", "2.0"] {
        let code = format!("# /// script\n# dependencies = [\"pycell-test-b=={b}\"]\n# ///\n");
        let out = run_in(&store, "deps", &code, &[]);
        assert_eq!(out.result()["status"], "ok", "{}", out.describe());
    }
    let listed: Value =
        serde_json::from_slice(&env_cmd(&store, &["list", "--json"]).stdout).unwrap();
    let keys: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 2, "{listed}");
    let out = env_cmd(&store, &["rm", &keys[0][..12]]);
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let out = env_cmd(&store, &["rm", "ffffffff"]);
    assert_eq!(out.exit_code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("matches 0 envs"), "{}", out.describe());
    assert_eq!(envs_in(&store), 1);
    let out = env_cmd(&store, &["gc", "--max-size", "0"]);
    assert!(
        out.stdout_str().contains(&keys[1][..16]),
        "{}",
        out.describe()
    );
    assert_eq!(envs_in(&store), 0);
    // A removed env is built again on the next request.
    let out = run_in(
        &store,
        "deps",
        "# /// script\n# dependencies = [\"pycell-test-b==1.0\"]\n# ///\n",
        &[],
    );
    assert_eq!(
        field(&out.result(), "/env/cache"),
        "miss",
        "{}",
        out.describe()
    );
}

// --- pycelld ----------------------------------------------------------------

/// A pycelld whose policies are the tests' and whose env store is `store`.
fn daemon_for(store: &Path) -> Daemon {
    Daemon::start(&daemon_config(store))
}

fn daemon_config(store: &Path) -> String {
    format!(
        "policy_dir = {:?}\nenv_store = {:?}\n",
        base().join("policies").display().to_string(),
        store.display().to_string()
    )
}

/// A run through `d`: its result (as JSON) and the install steps it heard.
fn daemon_run(d: &Daemon, policy: &str, code: &str, deps: &[&str]) -> (Value, Vec<String>) {
    let mut steps = Vec::new();
    let request = RunRequest {
        code: code.to_string(),
        policy: Some(policy.to_string()),
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        ..RunRequest::default()
    };
    let r = d
        .client()
        .run_queued(
            request,
            |_, _| {},
            |stage| {
                if let Stage::Installing(m) = stage {
                    steps.push(m.to_string());
                }
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    (serde_json::to_value(r).unwrap(), steps)
}

#[test]
fn pycelld_builds_an_env_once_tells_its_steps_and_later_runs_find_it() {
    let store = store("daemon");
    // Without the `pycell` client anywhere: pycelld's self-check and its
    // env builders are pycelld's own (`pycelld --job`).
    let d = Daemon::start_alone(&daemon_config(&store));
    let (r, steps) = daemon_run(&d, "deps", IMPORT_A, &[]);
    assert_eq!(r["status"], "ok", "{r}\n{}", d.log());
    assert_eq!(
        r["stdout"],
        "/venv/lib/python3.11/site-packages/pycell_test_a/__init__.py 2.0\n"
    );
    assert_eq!(field(&r, "/env/cache"), "miss", "{r}");
    assert_eq!(packages(&r), ["pycell-test-a 1.0", "pycell-test-b 2.0"]);
    assert!(
        steps
            .iter()
            .any(|s| s.starts_with("installed pycell-test-a 1.0 (") && s.ends_with(" of 2)")),
        "{steps:?}"
    );
    // The env is root's, in pycelld's store, and runs cannot write it.
    let key = field(&r, "/env/key").as_str().unwrap().to_string();
    let env_dir = store.join("envs").join(&key);
    assert_eq!(fs::metadata(&env_dir).unwrap().uid(), 0);
    let write =
        "# /// script\n# dependencies = [\"pycell-test-a\"]\n# ///\nopen('/venv/pwned', 'w')\n";
    let (w, _) = daemon_run(&d, "deps", write, &[]);
    assert!(
        field(&w, "/stderr")
            .as_str()
            .unwrap_or("")
            .contains("Read-only file system"),
        "{w}"
    );
    // Found the second time: no install, the same env.
    let (again, steps) = daemon_run(&d, "deps", IMPORT_A, &[]);
    assert_eq!(field(&again, "/env/cache"), "hit", "{again}");
    assert_eq!(field(&again, "/env/key"), key.as_str());
    assert!(steps.is_empty(), "{steps:?}");
    // A package without a wheel: refused with its code, nothing cached.
    let (bad, _) = daemon_run(&d, "deps", "print(1)", &["pycell-test-sdist"]);
    assert_eq!(bad["status"], "refused", "{bad}");
    assert_eq!(field(&bad, "/error/code"), "deps_no_wheel", "{bad}");
    assert_eq!(field(&bad, "/error/layer"), "dependencies", "{bad}");
    // `pycell run` through the daemon shows the steps on stderr.
    let script = Script::new(
        "main.py",
        "import pycell_test_b\nprint(pycell_test_b.VERSION)\n",
    );
    let sock = d.socket();
    let opts = [
        "--socket",
        sock.to_str().unwrap(),
        "--policy",
        "deps",
        "--with",
        "pycell-test-b==1.0",
    ];
    let out = Pycell::new(run_args(&script.path, &opts, &[])).run();
    assert_eq!(out.result()["stdout"], "1.0\n", "{}", out.describe());
    assert!(
        out.stderr
            .contains("pycell: installed pycell-test-b 1.0 (1 of 1)"),
        "{}",
        out.describe()
    );
    assert_eq!(envs_in(&store), 2);
    assert!(nothing_building(&store));
    // The monitor audited each build: who asked for what, and what came of it.
    let started = d.audit_events("env_build_start", 3);
    let ended = d.audit_events("env_build_end", 3);
    assert_eq!((started.len(), ended.len()), (3, 3), "{}", d.audit());
    assert_eq!(started[0]["request_key"].as_str().unwrap().len(), 64);
    assert_eq!(started[0]["peer_uid"], 0);
    assert_eq!(started[0]["policy"], "deps");
    assert_eq!(
        started[0]["requirements"][0],
        "pycell-test-a",
        "{}",
        d.audit()
    );
    assert_eq!(ended[0]["request_key"], started[0]["request_key"]);
    assert_eq!(ended[0]["env"], key.as_str());
    assert_eq!(ended[0]["failure"], Value::Null, "{}", d.audit());
    assert_eq!(
        ended[0]["packages"][0],
        "pycell-test-a==1.0",
        "{}",
        d.audit()
    );
    assert_eq!(ended[1]["failure"], "deps_no_wheel", "{}", d.audit());
    assert_eq!(
        (&ended[1]["packages"], &ended[1]["env"]),
        (&Value::Null, &Value::Null)
    );
}

const SLOW_B: &str = "# /// script\n# dependencies = [\"pycell-test-b==2.0\"]\n# ///\nimport pycell_test_b\nprint(pycell_test_b.VERSION)\n";

#[test]
fn pycelld_collects_the_least_recently_used_env_after_a_build_without_the_client() {
    let store = store("collected");
    let config = format!("{}env_store_max_size = \"1\"\n", daemon_config(&store));
    let d = Daemon::start_alone(&config);
    let (a, _) = daemon_run(&d, "deps", IMPORT_A, &[]);
    assert_eq!(a["status"], "ok", "{a}\n{}", d.log());
    let first = store
        .join("envs")
        .join(field(&a, "/env/key").as_str().unwrap());
    assert!(
        first.exists(),
        "in use while it ran, so kept: {}",
        first.display()
    );
    // A second env's build: the collection after it (a job of pycelld's
    // own) finds the store over its 1-byte cap and removes the first env,
    // no longer in use.
    let import_b = "import pycell_test_b\nprint(pycell_test_b.VERSION)\n";
    let (b, _) = daemon_run(&d, "deps", import_b, &["pycell-test-b"]);
    assert_eq!(b["status"], "ok", "{b}\n{}", d.log());
    assert_ne!(field(&a, "/env/key"), field(&b, "/env/key"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while first.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first env was never collected\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_sigkilled_embedded_install_leaves_nothing_behind() {
    let store = store("killed-embedded");
    let script = Script::new("main.py", SLOW_B);
    let mut child = Command::new(pycell_bin())
        .args(run_args(
            &script.path,
            &["--embedded", "--policy", "deps-slow"],
            &[],
        ))
        .env("PYCELL_POLICY_DIR", base().join("policies"))
        .env("PYCELL_ENV_STORE", &store)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no install step");
    assert!(first.contains("resolving"), "{first}");
    let tree = descendants_of(child.id());
    assert!(
        tree.iter().any(|p| p.name == "pycell-jailer"),
        "the install jail is going: {tree:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let left = still_alive_after(&tree, Duration::from_secs(15));
    assert!(left.is_empty(), "outlived a SIGKILLed pycell run: {left:?}");
    assert_eq!(envs_in(&store), 0, "a half-built env was published");
    // The next run builds it whole.
    let out = run_in(&store, "deps", SLOW_B, &[]);
    assert_eq!(
        field(&out.result(), "/env/cache"),
        "miss",
        "{}",
        out.describe()
    );
    assert_eq!(out.result()["stdout"], "2.0\n");
    assert!(nothing_building(&store));
}

/// Start a run of `policy` needing `SLOW_B` through `d` on a thread; return
/// once its first install step is heard.
fn slow_daemon_run(
    d: &Daemon,
    policy: &'static str,
) -> std::thread::JoinHandle<Result<RunResult, ClientError>> {
    let mut client = d.client();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let request = RunRequest {
            code: SLOW_B.to_string(),
            policy: Some(policy.to_string()),
            ..RunRequest::default()
        };
        client.run_queued(
            request,
            |_, _| {},
            |stage| {
                if let Stage::Installing(m) = stage {
                    let _ = tx.send(m.to_string());
                }
            },
        )
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("no install step heard\n{}", d.log()));
    assert!(first.contains("resolving"), "{first}");
    handle
}

#[test]
fn pycelld_outlives_a_sigkilled_builder_and_takes_its_builds_along_when_killed() {
    let store = store("killed-daemon");
    let mut d = daemon_for(&store);
    // The builder is SIGKILLed: the run fails, its install jail goes, and
    // pycelld goes on serving.
    let run = slow_daemon_run(&d, "deps-slow");
    let below = descendants_of(d.pid() as u32);
    // pycelld run again with a build_env job (never the `pycell` client).
    let builds_an_env = |pid: u32| {
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(r#""job":"build_env""#)
    };
    let builder = below
        .iter()
        .find(|p| p.name == "pycelld" && builds_an_env(p.pid))
        .unwrap_or_else(|| panic!("no builder below pycelld: {below:?}"));
    let tree = descendants_of(builder.pid);
    kill(Pid::from_raw(builder.pid as i32), Signal::SIGKILL).unwrap();
    let r = serde_json::to_value(run.join().unwrap().unwrap()).unwrap();
    assert_eq!(r["status"], "refused", "{r}");
    assert_eq!(field(&r, "/error/code"), "deps_install_failed", "{r}");
    assert!(
        field(&r, "/error/message")
            .as_str()
            .unwrap()
            .contains("SIGKILL"),
        "{r}"
    );
    let left = still_alive_after(&tree, Duration::from_secs(15));
    assert!(left.is_empty(), "outlived its builder: {left:?}");
    assert_eq!(envs_in(&store), 0);
    let (ok, _) = daemon_run(&d, "deps", SLOW_B, &[]);
    assert_eq!(ok["stdout"], "2.0\n", "{ok}\n{}", d.log());
    // pycelld itself is SIGKILLed mid-install: nothing of it stays.
    fs::remove_dir_all(store.join("envs")).unwrap();
    let run = slow_daemon_run(&d, "deps-slow");
    let tree = descendants_of(d.pid() as u32);
    d.signal(Signal::SIGKILL);
    d.wait(Duration::from_secs(10));
    let left = still_alive_after(&tree, Duration::from_secs(20));
    assert!(left.is_empty(), "outlived a SIGKILLed pycelld: {left:?}");
    assert!(
        run.join().unwrap().is_err(),
        "the client hears its daemon went"
    );
    assert!(nothing_building(&store));
}

#[test]
fn an_env_store_the_jailer_would_not_mount_is_refused_before_any_install() {
    // Under /var/tmp, which anyone may write: the jailer would refuse to
    // mount an env from there, so nothing is installed into it first.
    let dir = tempfile::Builder::new()
        .prefix("pycell-store-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let store = dir.path().join("store");
    let out = run_in(&store, "deps", IMPORT_A, &[]);
    let r = out.result();
    assert_eq!(r["status"], "refused", "{}", out.describe());
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("/var/tmp is writable by others"),
        "{}",
        out.describe()
    );
    let hint = r["error"]["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("PYCELL_ENV_STORE"), "{hint}");
    assert!(!out.stderr.contains("installing"), "{}", out.describe());
}
