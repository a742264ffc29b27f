//! Whole-file tests: what an operator sees for a good file and for mistakes.

use std::path::Path;
use std::time::Duration;

use super::*;

/// A complete, valid user policy; tests edit one line of it.
const GOOD: &str = r#"name = "custom"
description = "Test policy."
namespaces = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]

[interpreter]
python = "/usr/bin/python3"

[limits]
wall_timeout = "10s"
cpu_time = 5
memory = "256MiB"
pids = 32
cpus = 0.5
open_files = 128
file_size = "1M"
# one tmpfs for /workspace, /tmp and /dev/shm
disk = "48MiB"
max_output = "64KiB"

[network]
mode = "none"

[[mounts]]
source = "/usr"

[[mounts]]
source = "/opt/data"
target = "/data"

[landlock]
min_abi = 4
read_exec = ["/opt/tools"]
read_only = ["/srv"]
read_write = ["/workspace/out"]

[seccomp]
profile = "numpy-ok"

[env]
PATH = "/usr/bin:/bin"
HOME = "/workspace"
"#;

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::from_toml_str(text, Path::new("policies/custom.toml"))
}

/// The error text for GOOD with `from` replaced by `to`.
fn error_with(from: &str, to: &str) -> String {
    assert!(
        GOOD.contains(from),
        "test edits a line that is not in GOOD: {from}"
    );
    parse(&GOOD.replacen(from, to, 1))
        .expect_err("edited policy should be rejected")
        .to_string()
}

#[test]
fn good_policy_parses_into_typed_values() {
    let p = parse(GOOD).unwrap();
    assert_eq!(p.name, "custom");
    assert_eq!(p.description, "Test policy.");
    assert_eq!(
        p.interpreter,
        Interpreter::HostPython("/usr/bin/python3".into())
    );
    assert_eq!(
        p.limits,
        RunLimits {
            wall_timeout: Duration::from_secs(10),
            cpu_time: Duration::from_secs(5),
            memory: Bytes(256 << 20),
            pids: 32,
            cpus: Cores(0.5),
            open_files: 128,
            file_size: Bytes(1 << 20),
            disk: Bytes(48 << 20),
            max_output: Bytes(64 << 10),
            ..RunLimits::default()
        }
    );
    assert_eq!(p.network, NetworkMode::None);
    assert_eq!(
        p.mounts,
        vec![
            ReadOnlyMount {
                source: "/usr".into(),
                target: "/usr".into()
            },
            ReadOnlyMount {
                source: "/opt/data".into(),
                target: "/data".into()
            },
        ]
    );
    assert_eq!(
        p.landlock,
        LandlockRules {
            min_abi: 4,
            read_exec: vec!["/opt/tools".into()],
            read_only: vec!["/srv".into()],
            read_write: vec!["/workspace/out".into()],
        }
    );
    assert_eq!(p.seccomp_profile, "numpy-ok");
    assert_eq!(p.env.len(), 2);
    assert_eq!(p.env["HOME"], "/workspace");
    assert_eq!(p.namespaces(), &Namespace::ALL);
}

#[test]
fn minimal_user_policy_takes_defaults() {
    let text = r#"
name = "custom"
description = "Minimal."
namespaces = ["cgroup", "uts", "ipc", "net", "mount", "pid", "user"]
interpreter = { venv = "/var/lib/pycell/envs/abc" }
"#;
    let p = parse(text).unwrap();
    assert_eq!(
        p.interpreter,
        Interpreter::Venv("/var/lib/pycell/envs/abc".into())
    );
    assert_eq!(p.limits, RunLimits::default());
    assert_eq!(p.network, NetworkMode::None);
    assert!(p.mounts.is_empty());
    assert_eq!(p.landlock, LandlockRules::default());
    assert_eq!(p.seccomp_profile, "default");
    assert!(
        p.env.is_empty(),
        "nothing is inherited, nothing is invented"
    );
}

#[test]
fn some_limits_given_others_default() {
    let text = GOOD
        .replace("cpu_time = 5\n", "")
        .replace("pids = 32\n", "");
    let p = parse(&text).unwrap();
    assert_eq!(p.limits.cpu_time, RunLimits::default().cpu_time);
    assert_eq!(p.limits.pids, RunLimits::default().pids);
    assert_eq!(p.limits.memory, Bytes(256 << 20));
}

#[test]
fn invalid_size_names_position_field_and_fix() {
    assert_eq!(
        error_with(r#"memory = "256MiB""#, r#"memory = "12XB""#),
        "policies/custom.toml:11:10: limits.memory: invalid size \"12XB\": use a number of bytes \
         or a number with a unit (KiB, MiB, GiB; k/M/G also mean 1024-based)"
    );
}

#[test]
fn unknown_field_lists_the_known_ones() {
    assert_eq!(
        error_with("memory = ", "memroy = "),
        "policies/custom.toml:11:1: limits.memroy: unknown field \"memroy\"; expected one of: \
         wall_timeout, cpu_time, memory, pids, cpus, open_files, file_size, disk, \
         workspace_size, tmp_size, max_output, inotify_instances, inotify_watches, max"
    );
    assert_eq!(
        error_with("[network]", "[netwrok]"),
        "policies/custom.toml:20:2: netwrok: unknown field \"netwrok\"; expected one of: \
         name, description, purpose, namespaces, interpreter, limits, network, mounts, landlock, seccomp, env, \
         dependencies, install, warm, session, images, output, tools"
    );
}

#[test]
fn writable_mounts_do_not_exist() {
    assert_eq!(
        error_with("target = \"/data\"\n", "target = \"/data\"\nwritable = true\n"),
        "policies/custom.toml:29:1: mounts[1].writable: unknown field \"writable\"; expected one of: \
         source, target (mounts are always read-only)"
    );
}

#[test]
fn every_namespace_is_required() {
    assert_eq!(
        error_with(r#""net", "#, ""),
        "policies/custom.toml:3:14: namespaces: missing \"net\": pycell always isolates net; \
         it cannot be turned off (list all of: user, pid, mount, net, ipc, uts, cgroup)"
    );
    assert_eq!(
        error_with(r#""uts", "#, r#""pid", "uts", "#),
        "policies/custom.toml:3:53: namespaces[5]: duplicate namespace \"pid\": list each namespace once"
    );
    assert_eq!(
        error_with(r#""net""#, r#""network""#),
        "policies/custom.toml:3:39: namespaces[3]: unknown value \"network\"; expected one of: \
         user, pid, mount, net, ipc, uts, cgroup"
    );
}

#[test]
fn an_allowlist_parses_with_default_limits() {
    let text = GOOD.replacen(
        r#"mode = "none""#,
        "mode = \"allowlist\"\nallow = [\"api.example.net\", \"http://*.example.org:8080\"]\ndeny = [\"bad.example.org\"]\nmax_bytes = \"10MiB\"",
        1,
    );
    let p = parse(&text).unwrap();
    let rules = p.network.egress().expect("allowlist mode");
    assert_eq!(
        rules.allowed(),
        ["api.example.net", "http://*.example.org:8080"]
    );
    assert_eq!(rules.denied(), ["bad.example.org"]);
    assert_eq!(rules.limits.max_bytes, 10 << 20);
    assert_eq!(rules.limits.max_connections, 256);
    assert_eq!(p.network.as_str(), "allowlist");
}

#[test]
fn network_errors_are_located() {
    assert_eq!(
        error_with(r#"mode = "none""#, r#"mode = "open""#),
        "policies/custom.toml:21:8: network.mode: unknown network mode \"open\": use \"none\" \
         (no network) or \"allowlist\" (egress to the hosts in `allow`, through pycell's proxy)"
    );
    assert_eq!(
        error_with(
            r#"mode = "none""#,
            "mode = \"allowlist\"\nallow = [\"ok.example.net\", \"ftp://x.example.net\"]"
        ),
        "policies/custom.toml:22:28: network.allow[1]: unknown scheme \"ftp\": use https:// \
         (the default), http:// or tcp://"
    );
    assert_eq!(
        error_with(
            r#"mode = "none""#,
            "mode = \"none\"\nallow = [\"x.example.net\"]"
        ),
        "policies/custom.toml:22:9: network.allow: only for mode = \"allowlist\": mode \"none\" \
         has no egress to configure"
    );
    assert_eq!(
        error_with(
            r#"mode = "none""#,
            "mode = \"allowlist\"\nmax_connections = 0"
        ),
        "policies/custom.toml:22:19: network.max_connections: must be between 1 and 65536 (got 0)"
    );
}

#[test]
fn missing_required_field_is_named() {
    assert_eq!(
        error_with("description = \"Test policy.\"\n", ""),
        "policies/custom.toml:1:1: description: missing required field"
    );
    assert_eq!(
        error_with(
            "[[mounts]]\nsource = \"/usr\"\n",
            "[[mounts]]\ntarget = \"/usr\"\n"
        ),
        "policies/custom.toml:23:1: mounts[0].source: missing required field"
    );
}

#[test]
fn wrong_types_use_toml_words() {
    assert_eq!(
        error_with("pids = 32", "pids = \"32\""),
        "policies/custom.toml:12:8: limits.pids: expected an integer, found string \"32\""
    );
    assert_eq!(
        error_with("HOME = \"/workspace\"", "HOME = 1"),
        "policies/custom.toml:41:8: env.HOME: expected a string, found integer 1"
    );
    assert_eq!(
        error_with("memory = \"256MiB\"", "memory = 1.5"),
        "policies/custom.toml:11:10: limits.memory: expected an integer or a string with a unit, \
         such as \"30s\" or \"64MiB\", found float 1.5"
    );
}

#[test]
fn ranges_are_checked_with_the_limit_rules() {
    assert_eq!(
        error_with(r#"memory = "256MiB""#, r#"memory = "1MiB""#),
        "policies/custom.toml:11:10: limits.memory: must be at least 16MiB (got 1MiB)"
    );
    assert_eq!(
        error_with("pids = 32", "pids = -1"),
        "policies/custom.toml:12:8: limits.pids: must be between 1 and 65536 (got -1)"
    );
    assert_eq!(
        error_with("pids = 32", "pids = 99999999999"),
        "policies/custom.toml:12:8: limits.pids: must be between 1 and 65536 (got 99999999999)"
    );
    assert_eq!(
        error_with("cpus = 0.5", "cpus = nan"),
        "policies/custom.toml:13:8: limits.cpus: must be between 0.01 and 1024 (got NaN)"
    );
    assert_eq!(
        error_with(r#"wall_timeout = "10s""#, r#"wall_timeout = "2d""#),
        "policies/custom.toml:9:16: limits.wall_timeout: invalid duration \"2d\": use a number of \
         seconds or a number with a unit (ms, s, m, h), e.g. \"500ms\", \"30s\", \"2m\""
    );
    assert_eq!(
        error_with(r#"wall_timeout = "10s""#, "wall_timeout = 0"),
        "policies/custom.toml:9:16: limits.wall_timeout: must be greater than 0"
    );
    assert_eq!(
        error_with("cpu_time = 5", "cpu_time = -5"),
        "policies/custom.toml:10:12: limits.cpu_time: invalid duration -5: must not be negative"
    );
    assert_eq!(
        error_with("min_abi = 4", "min_abi = 8"),
        "policies/custom.toml:31:11: landlock.min_abi: must be between 1 and 7 (got 8)"
    );
}

#[test]
fn paths_must_be_absolute_and_normalized() {
    assert_eq!(
        error_with(r#"python = "/usr/bin/python3""#, r#"python = "python3""#),
        "policies/custom.toml:6:10: interpreter.python: path \"python3\" is not absolute: \
         use a path that starts with /"
    );
    assert_eq!(
        error_with(r#"source = "/opt/data""#, r#"source = "/opt/../etc""#),
        "policies/custom.toml:27:10: mounts[1].source: path \"/opt/../etc\" is not normalized: \
         write it without \".\" or \"..\" components, repeated slashes or a trailing slash"
    );
    assert_eq!(
        error_with(
            r#"read_only = ["/srv"]"#,
            r#"read_only = ["/srv", "/srv/"]"#
        ),
        "policies/custom.toml:33:22: landlock.read_only[1]: path \"/srv/\" is not normalized: \
         write it without \".\" or \"..\" components, repeated slashes or a trailing slash"
    );
}

#[test]
fn mount_targets_stay_out_of_the_jailers_places() {
    assert_eq!(
        error_with(r#"target = "/data""#, r#"target = "/etc/data""#),
        "policies/custom.toml:28:10: mounts[1].target: target \"/etc/data\" is inside /etc, \
         which the jailer builds itself: choose another target"
    );
    assert_eq!(
        error_with(r#"target = "/data""#, r#"target = "/""#),
        "policies/custom.toml:28:10: mounts[1].target: target \"/\" would replace the jail's root: \
         mount a directory below it"
    );
    // Without a target the source is the target, and the error points there.
    assert_eq!(
        error_with(r#"source = "/usr""#, r#"source = "/tmp""#),
        "policies/custom.toml:24:10: mounts[0].source: target \"/tmp\" is inside /tmp, \
         which the jailer builds itself: choose another target"
    );
    assert_eq!(
        error_with(r#"target = "/data""#, r#"target = "/usr""#),
        "policies/custom.toml:28:10: mounts[1].target: target \"/usr\" is already the target of \
         mounts[0]: each target may be mounted once"
    );
}

#[test]
fn read_write_only_below_workspace_or_tmp() {
    assert_eq!(
        error_with(r#"read_write = ["/workspace/out"]"#, r#"read_write = ["/tmp", "/var/tmp"]"#),
        "policies/custom.toml:34:23: landlock.read_write[1]: \"/var/tmp\" is not writable in the jail: \
         read_write paths must be /workspace, /tmp or below them"
    );
    assert!(parse(&GOOD.replace(r#"["/workspace/out"]"#, r#"["/workspace", "/tmp/x"]"#)).is_ok());
}

#[test]
fn interpreter_is_exactly_one() {
    assert_eq!(
        error_with(
            "python = \"/usr/bin/python3\"\n",
            "python = \"/usr/bin/python3\"\nvenv = \"/v\"\n"
        ),
        "policies/custom.toml:5:1: interpreter: set exactly one of python or venv, not both"
    );
    assert_eq!(
        error_with("python = \"/usr/bin/python3\"\n", ""),
        "policies/custom.toml:5:1: interpreter: set one of python (a host python executable) \
         or venv (a virtual environment directory made by uv)"
    );
}

#[test]
fn names_env_and_profile() {
    assert_eq!(
        error_with(r#"name = "custom""#, r#"name = "Custom""#),
        "policies/custom.toml:1:8: name: invalid name \"Custom\": use 1 to 64 lowercase letters, \
         digits, \"_\" or \"-\", starting with a letter or digit"
    );
    assert_eq!(
        error_with(r#"name = "custom""#, r#"name = "other""#),
        "policies/custom.toml:1:8: name: name \"other\" does not match the file name \
         \"custom.toml\": name the file other.toml or set name = \"custom\""
    );
    assert_eq!(
        error_with("HOME = ", "2HOME = "),
        "policies/custom.toml:41:9: env.2HOME: invalid variable name \"2HOME\": use letters, \
         digits and \"_\", not starting with a digit"
    );
    assert_eq!(
        error_with(r#"HOME = "/workspace""#, r#"HOME = "/work\u0000space""#),
        "policies/custom.toml:41:8: env.HOME: value contains a NUL byte"
    );
    assert_eq!(
        error_with(r#"profile = "numpy-ok""#, r#"profile = "../x""#),
        "policies/custom.toml:37:11: seccomp.profile: invalid profile name \"../x\": \
         use 1 to 64 lowercase letters, digits, \"_\" or \"-\""
    );
    assert_eq!(
        error_with("description = \"Test policy.\"", "description = \" \""),
        "policies/custom.toml:2:15: description: must not be empty: say in one line what this \
         policy allows"
    );
}

#[test]
fn syntax_errors_have_a_position_and_no_field() {
    assert_eq!(
        error_with("pids = 32", "pids = 32\npids = 33"),
        "policies/custom.toml:13:1: invalid TOML: duplicate key \"pids\": each key may appear once per table"
    );
    assert_eq!(
        error_with("[seccomp]", "[seccomp"),
        "policies/custom.toml:36:9: invalid TOML: unclosed table, expected `]`"
    );
}

#[test]
fn origin_without_toml_extension_skips_the_name_check() {
    let p = Policy::from_toml_str(GOOD, Path::new("<stdin>")).unwrap();
    assert_eq!(p.name, "custom");
}

#[test]
fn read_errors_name_the_file() {
    let err = Policy::load(Path::new("/nonexistent/pycell/x.toml")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot read policy /nonexistent/pycell/x.toml: No such file or directory (os error 2)"
    );
}

#[test]
fn load_reads_a_file_and_checks_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.toml");
    std::fs::write(&path, GOOD).unwrap();
    assert_eq!(Policy::load(&path).unwrap(), parse(GOOD).unwrap());

    let wrong = dir.path().join("wrong.toml");
    std::fs::write(&wrong, GOOD).unwrap();
    let err = Policy::load(&wrong).unwrap_err();
    let PolicyError::Invalid {
        file,
        line,
        column,
        field,
        ..
    } = &err
    else {
        panic!("expected Invalid, got {err:?}");
    };
    assert_eq!(
        (file.as_path(), *line, *column, field.as_str()),
        (wrong.as_path(), 1, 8, "name")
    );
}

#[test]
fn builtin_files_must_be_complete() {
    let text = builtin::source("default")
        .unwrap()
        .replace("pids = 64\n", "");
    let err = parse_complete(&text).unwrap_err().to_string();
    assert_eq!(
        err,
        "<builtin>/default.toml:29:1: limits.pids: missing required field: shipped policies set \
         every limit explicitly"
    );
    // The same text is fine as a user file.
    assert_eq!(
        Policy::from_toml_str(&text, Path::new("default.toml"))
            .unwrap()
            .limits
            .pids,
        RunLimits::default().pids
    );
}

fn parse_complete(text: &str) -> Result<Policy, PolicyError> {
    crate::parse(
        text,
        Path::new("<builtin>/default.toml"),
        Completeness::Complete,
    )
}

#[test]
fn default_policy_is_what_the_docs_say() {
    let p = builtin::load("default").unwrap();
    assert_eq!(
        p.interpreter,
        Interpreter::HostPython("/usr/bin/python3".into())
    );
    assert_eq!(p.limits, RunLimits::default());
    let targets: Vec<&Path> = p.mounts.iter().map(|m| m.target.as_path()).collect();
    assert_eq!(
        targets,
        ["/usr", "/bin", "/lib", "/lib64", "/sbin"].map(Path::new)
    );
    assert_eq!(p.landlock, LandlockRules::default());
    assert_eq!(p.seccomp_profile, "default");
    assert_eq!(p.env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert_eq!(p.env["PYTHONDONTWRITEBYTECODE"], "1");
}

#[test]
fn mounts_may_be_appended_after_env() {
    // Tools that derive a policy from default.toml append a [[mounts]]
    // entry at the end of the file, after [env]; TOML allows that.
    let text = builtin::source("default").unwrap().to_owned()
        + "\n[[mounts]]\nsource = \"/opt/venvs/numpy\"\n";
    let p = Policy::from_toml_str(&text, Path::new("default.toml")).unwrap();
    assert_eq!(
        p.mounts.last().unwrap().target,
        Path::new("/opt/venvs/numpy")
    );
    assert_eq!(p.env.len(), 5);
}

#[test]
fn the_old_per_mount_sizes_point_to_disk() {
    let e = error_with("disk = \"48MiB\"", "disk = \"48MiB\"\ntmp_size = \"16MiB\"");
    assert!(e.contains("limits.tmp_size: replaced by `disk`"), "{e}");
}

#[test]
fn ceilings_are_checked_and_default_to_the_limits() {
    let p = parse(GOOD).unwrap();
    assert_eq!(p.ceilings, crate::LimitCeilings::at(&p.limits));
    let with_max = format!("{}\n[limits.max]\nmemory = \"1GiB\"\npids = 100\n", GOOD);
    let p = parse(&with_max).unwrap();
    assert_eq!((p.ceilings.memory, p.ceilings.pids), (Bytes(1 << 30), 100));
    assert_eq!(p.ceilings.disk, p.limits.disk);
    let below = format!("{}\n[limits.max]\nmemory = \"16MiB\"\n", GOOD);
    let e = parse(&below).unwrap_err().to_string();
    assert!(
        e.contains("limits.max.memory: 16MiB is below the limit it caps (256MiB)"),
        "{e}"
    );
    let huge = format!("{}\n[limits.max]\nmax_output = \"1GiB\"\n", GOOD);
    let e = parse(&huge).unwrap_err().to_string();
    assert!(
        e.contains("limits.max.max_output: must be between 1KiB and 16MiB (got 1GiB)"),
        "{e}"
    );
}

fn minimal_with(extra: &str) -> Result<Policy, String> {
    let text = format!(
        "name = \"custom\"\ndescription = \"d\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n{extra}"
    );
    Policy::from_toml_str(&text, Path::new("custom.toml")).map_err(|e| e.to_string())
}

#[test]
fn dependencies_are_off_unless_allowed_and_packages_are_checked() {
    let p = minimal_with("").unwrap();
    assert!(!p.dependencies.allow && p.dependencies.packages.is_empty());
    assert_eq!(p.dependencies.install_policy, "install");
    let p = minimal_with("[dependencies]\nallow = true\npackages = [\"NumPy>=2\"]\n").unwrap();
    assert!(p.dependencies.allow);
    assert_eq!(p.dependencies.packages[0].to_string(), "numpy>=2");
    let e =
        minimal_with("[dependencies]\npackages = [\"six\", \"x @ https://example.net/x.whl\"]\n")
            .unwrap_err();
    assert!(
        e.contains("dependencies.packages[1]") && e.contains("direct references"),
        "{e}"
    );
    let e = minimal_with("[dependencies]\ninstall_policy = \"../x\"\n").unwrap_err();
    assert!(e.contains("dependencies.install_policy"), "{e}");
}

#[test]
fn an_install_policy_reaches_its_index_or_has_wheels() {
    let e = minimal_with("[install]\nindex_url = \"https://pypi.org/simple\"\n").unwrap_err();
    assert!(
        e.contains("install.index_url") && e.contains("network mode \"none\""),
        "{e}"
    );
    let e = minimal_with("[install]\n").unwrap_err();
    assert!(
        e.contains("install.find_links") && e.contains("directory of wheels"),
        "{e}"
    );
    let p = minimal_with("[install]\nfind_links = [\"/srv/wheels\"]\n").unwrap();
    let i = p.install.unwrap();
    assert_eq!(
        (i.index_url, i.find_links),
        (None, vec![PathBuf::from("/srv/wheels")])
    );
    let net = "[network]\nmode = \"allowlist\"\nallow = [\"https://pypi.example.net\"]\n";
    let e = minimal_with(&format!(
        "{net}[install]\nindex_url = \"https://other.example.net/simple\"\n"
    ))
    .unwrap_err();
    assert!(
        e.contains("not reachable under this policy's [network] rules"),
        "{e}"
    );
    let e = minimal_with(&format!(
        "{net}[install]\nindex_url = \"ftp://pypi.example.net/\"\n"
    ))
    .unwrap_err();
    assert!(e.contains("must start with https://"), "{e}");
    let p = minimal_with(&format!(
        "{net}[install]\nindex_url = \"https://pypi.example.net/simple\"\n"
    ))
    .unwrap();
    assert!(p.install.unwrap().index_url.is_some());
    let shipped = builtin::load("install").unwrap();
    assert_eq!(
        shipped.install.unwrap().index_url.as_deref(),
        Some("https://pypi.org/simple")
    );
}

#[test]
fn warm_imports_are_module_names_listed_once() {
    let p = minimal_with("[warm]\nimports = [\"numpy\", \"matplotlib.pyplot\"]\n").unwrap();
    assert_eq!(p.warm_imports, ["numpy", "matplotlib.pyplot"]);
    assert!(minimal_with("").unwrap().warm_imports.is_empty());
    let e = minimal_with("[warm]\nimports = [\"numpy\", \"os; rm\"]\n").unwrap_err();
    assert!(
        e.contains("warm.imports[1]") && e.contains("not a module name"),
        "{e}"
    );
    let e = minimal_with("[warm]\nimports = [\"a..b\"]\n").unwrap_err();
    assert!(e.contains("not a module name"), "{e}");
    let e = minimal_with("[warm]\nimports = [\"json\", \"json\"]\n").unwrap_err();
    assert!(e.contains("listed twice"), "{e}");
    let e = minimal_with("[warm]\npreload = []\n").unwrap_err();
    assert!(e.contains("preload"), "{e}");
}

#[test]
fn session_settings_default_and_are_checked() {
    let p = minimal_with("").unwrap();
    assert_eq!(p.session, crate::SessionSettings::default());
    assert_eq!(p.session.idle_timeout, std::time::Duration::from_secs(600));
    let p = minimal_with("[session]\nidle_timeout = \"30s\"\nper_uid = 0\n").unwrap();
    assert_eq!(p.session.idle_timeout.as_secs(), 30);
    assert_eq!(p.session.per_uid, 0);
    let e = minimal_with("[session]\nidle_timeout = \"2h\"\n").unwrap_err();
    assert!(
        e.contains("session.idle_timeout") && e.contains("longer than the lifetime"),
        "{e}"
    );
    let e = minimal_with("[session]\nmax_file = \"9MiB\"\n").unwrap_err();
    assert!(
        e.contains("session.max_file") && e.contains("between"),
        "{e}"
    );
    let e = minimal_with("[session]\nkeep = 1\n").unwrap_err();
    assert!(e.contains("keep"), "{e}");
}

#[test]
fn tool_settings_default_and_are_checked() {
    let p = minimal_with("").unwrap();
    assert_eq!(p.tools, crate::ToolSettings::default());
    assert_eq!(p.tools.allow, ["*/*"]);
    let p = minimal_with("[tools]\nallow = []\n").unwrap();
    assert!(p.tools.allow.is_empty(), "allow = [] forbids every call");
    let p =
        minimal_with("[tools]\nallow = [\"time/get_*\"]\nmax_calls = 10\ncall_timeout = \"5s\"\n")
            .unwrap();
    assert_eq!((p.tools.max_calls, p.tools.call_timeout.as_secs()), (10, 5));
    let e = minimal_with("[tools]\nallow = [\"time/*\", \"time\"]\n").unwrap_err();
    assert!(
        e.contains("tools.allow[1]") && e.contains("SERVER/TOOL"),
        "{e}"
    );
    let e = minimal_with("[tools]\nmax_concurrent = 0\n").unwrap_err();
    assert!(e.contains("tools.max_concurrent"), "{e}");
    let e = minimal_with("[tools]\nmax_result = \"1GiB\"\n").unwrap_err();
    assert!(e.contains("tools.max_result"), "{e}");
}

#[test]
fn image_settings_default_and_are_checked() {
    let p = minimal_with("").unwrap();
    assert_eq!((p.images.max_edge, p.images.max_bytes), (1024, 1 << 20));
    let p = minimal_with("[images]\nmax_edge = 512\nmax_bytes = 0\n").unwrap();
    assert_eq!((p.images.max_edge, p.images.max_bytes), (512, 0));
    let e = minimal_with("[images]\nmax_edge = 4\n").unwrap_err();
    assert!(
        e.contains("images.max_edge") && e.contains("between"),
        "{e}"
    );
    let e = minimal_with("[images]\nmax_bytes = \"17MiB\"\n").unwrap_err();
    assert!(e.contains("images.max_bytes"), "{e}");
    let e = minimal_with("[session]\nimage_edge = 1024\n").unwrap_err();
    assert!(e.contains("image_edge"), "{e}");
}

#[test]
fn output_settings_default_and_are_checked() {
    let p = minimal_with("").unwrap();
    assert_eq!(p.output, pycell_policy_output(16 << 10, 256 << 10, 16));
    let p = minimal_with("[output]\npart_chars = 1000\ndisplay_bytes = \"1MiB\"\ndisplays = 0\n")
        .unwrap();
    assert_eq!(p.output, pycell_policy_output(1000, 1 << 20, 0));
    let e = minimal_with("[output]\npart_chars = 10\n").unwrap_err();
    assert!(
        e.contains("output.part_chars") && e.contains("between"),
        "{e}"
    );
    let e = minimal_with("[output]\ndisplay_bytes = \"3MiB\"\n").unwrap_err();
    assert!(e.contains("output.display_bytes"), "{e}");
    let e = minimal_with("[output]\ndisplays = 257\n").unwrap_err();
    assert!(e.contains("output.displays"), "{e}");
    let e = minimal_with("[output]\nmax_rows = 3\n").unwrap_err();
    assert!(e.contains("max_rows"), "{e}");
}

fn pycell_policy_output(
    part_chars: u32,
    display_bytes: u64,
    displays: u32,
) -> crate::OutputSettings {
    crate::OutputSettings {
        part_chars,
        display_bytes,
        displays,
    }
}

#[test]
fn a_server_policy_serves_stdio_only() {
    let with = |purpose: &str| {
        let text = format!(
            "name = \"custom\"\ndescription = \"d\"\n{purpose}namespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n"
        );
        Policy::from_toml_str(&text, Path::new("custom.toml")).map_err(|e| e.to_string())
    };
    let code = with("").unwrap();
    assert_eq!(code.purpose, Purpose::Code);
    assert_eq!(code.purpose_problem(false), None);
    assert_eq!(code.purpose_problem(true), None);
    let server = with("purpose = \"server\"\n").unwrap();
    assert_eq!(server.purpose_problem(true), None);
    let refused = server.purpose_problem(false).unwrap();
    assert!(
        refused.contains("\"custom\" is for MCP servers over stdio"),
        "{refused}"
    );
    let e = with("purpose = \"daemon\"\n").unwrap_err();
    assert!(
        e.contains("purpose: unknown value \"daemon\"; expected one of: code, server"),
        "{e}"
    );
    assert_eq!(
        builtin::load("mcp-server").unwrap().purpose,
        Purpose::Server
    );
    for name in ["default", "network", "data-science"] {
        assert_eq!(
            builtin::load(name).unwrap().purpose,
            Purpose::Code,
            "{name}"
        );
    }
}
