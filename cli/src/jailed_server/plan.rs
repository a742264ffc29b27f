//! What `pycell mcp-server` is asked for, checked without touching the
//! host: which entry of the installed packages to run, the variables the
//! server gets, where granted paths go, and the egress it may have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pycell_policy::network::{Rule, RuleKind};
use pycell_policy::requirement::normalize_name;
use pycell_protocol::messages::check_variable;
use serde::Deserialize;

/// What the jail that looks at the installed env found (see
/// [`RESOLVER`]): every console script (name → `module:object`), and the
/// names of those PACKAGE's own distribution declares.
#[derive(Debug, Default, Deserialize)]
pub struct Found {
    pub scripts: BTreeMap<String, String>,
    pub own: Vec<String>,
}

/// Prints [`Found`] as JSON for the distribution `sys.argv[1]` names
/// (PEP 503 normalized). Reads metadata only: no package code runs.
pub const RESOLVER: &str = r#"import json, re, sys
from importlib import metadata

def norm(name):
    return re.sub(r"[-_.]+", "-", name or "").lower()

want, scripts, own = sys.argv[1], {}, []
for dist in metadata.distributions():
    for ep in dist.entry_points:
        if ep.group == "console_scripts":
            scripts[ep.name] = ep.value
            if norm(dist.metadata["Name"]) == want:
                own.append(ep.name)
print(json.dumps({"scripts": scripts, "own": sorted(set(own))}))
"#;

/// Starts the server: `sys.argv[1:4]` are the kind (`object` or
/// `module`), the target and the server's argv[0]; the rest are its
/// arguments. An object must be a callable (a console script's function);
/// its return value is the exit status, as a console script's is.
pub const LAUNCHER: &str = r#"import importlib, runpy, sys
kind, target, name = sys.argv[1:4]
sys.argv = [name] + sys.argv[4:]
if kind == "module":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
    sys.exit(0)
module, _, path = target.partition(":")
try:
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
except (ImportError, AttributeError) as e:
    sys.exit(f"pycell: the entry {target} is not in the installed packages: {e}")
if not callable(obj):
    sys.exit(f"pycell: the entry {target} is not a callable")
sys.exit(obj())
"#;

/// What the server's jail runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `module:object`, called.
    Object(String),
    /// A module run as `python -m` runs it.
    Module(String),
}

/// The launch: what to run, under which argv[0].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub target: Target,
    pub argv0: String,
}

impl Launch {
    /// The launcher's arguments before the server's own.
    pub fn launcher_args(&self) -> [String; 3] {
        let (kind, target) = match &self.target {
            Target::Object(o) => ("object", o),
            Target::Module(m) => ("module", m),
        };
        [kind.into(), target.clone(), self.argv0.clone()]
    }
}

fn is_dotted_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
                && chars.all(|c| c == '_' || c.is_alphanumeric())
        })
}

/// `module:object` (an entry point's value, extras after it dropped), if
/// it is one.
fn object_reference(value: &str) -> Option<String> {
    let value = value.split('[').next().unwrap_or("").trim();
    let (module, object) = value.split_once(':')?;
    let (module, object) = (module.trim(), object.trim());
    (is_dotted_name(module) && is_dotted_name(object)).then(|| format!("{module}:{object}"))
}

/// Which entry to run: `-m MODULE`, `--entry NAME` (a console script) or
/// `--entry MODULE:OBJECT`, else PACKAGE's console script (the one, or
/// the one named as the package).
pub fn choose(
    package: &str,
    found: &Found,
    entry: Option<&str>,
    module: Option<&str>,
) -> Result<Launch, String> {
    if let Some(m) = module {
        return match is_dotted_name(m) {
            true => Ok(Launch {
                target: Target::Module(m.into()),
                argv0: m.into(),
            }),
            false => Err(format!("-m {m:?} is not a module name")),
        };
    }
    let script = |name: &str| -> Result<Launch, String> {
        let value = found.scripts.get(name).ok_or_else(|| {
            let names: Vec<&str> = found.scripts.keys().map(String::as_str).collect();
            format!(
                "no console script {name:?} in the installed packages (they have: {})",
                list(&names)
            )
        })?;
        let object = object_reference(value)
            .ok_or_else(|| format!("console script {name:?} is {value:?}, not module:function"))?;
        Ok(Launch {
            target: Target::Object(object),
            argv0: name.into(),
        })
    };
    match entry {
        Some(e) if e.contains(':') => match object_reference(e) {
            Some(object) => Ok(Launch {
                argv0: package.into(),
                target: Target::Object(object),
            }),
            None => Err(format!("--entry {e:?} is not MODULE:FUNCTION")),
        },
        Some(name) => script(name),
        None => match found.own.as_slice() {
            [one] => script(one),
            [] => Err(format!(
                "{package} has no console script: name what to run with --entry MODULE:FUNCTION or -m MODULE"
            )),
            many => match many.iter().find(|n| normalize_name(n) == normalize_name(package)) {
                Some(n) => script(n),
                None => Err(format!(
                    "{package} has console scripts {}: pick one with --entry NAME",
                    list(&many.iter().map(String::as_str).collect::<Vec<_>>())
                )),
            },
        },
    }
}

fn list(names: &[&str]) -> String {
    match names.is_empty() {
        true => "none".into(),
        false => names.join(", "),
    }
}

/// `--env NAME` (its value from `lookup`: our environment) and `--env
/// NAME=VALUE`, checked (the last of a name wins).
pub fn variables(
    items: &[String],
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in items {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (item.as_str(), None),
        };
        let value = value.or_else(|| lookup(name)).unwrap_or_default();
        check_variable(name, &value).map_err(|e| format!("--env {e}"))?;
        if !item.contains('=') && lookup(name).is_none() {
            return Err(format!(
                "--env {name}: not set in pycell's environment (set it, or pass {name}=VALUE)"
            ));
        }
        out.insert(name.to_string(), value);
    }
    Ok(out)
}

/// `--allow` rules that do not parse, refused before anything is
/// installed (the run service checks them again where they are used).
pub fn check_allow(rules: &[String]) -> Result<(), String> {
    for r in rules {
        Rule::parse(r, RuleKind::Allow).map_err(|e| format!("--allow {r:?}: {e}"))?;
    }
    Ok(())
}

/// Where a granted host path shows in the jail: at its own (canonical)
/// path, which must not be one the jail has its own of.
pub fn grant_target(canonical: &Path) -> Result<PathBuf, String> {
    match pycell_wire::spec::grant_target_problem(canonical) {
        Some(problem) => Err(problem),
        None => Ok(canonical.to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(scripts: &[(&str, &str)], own: &[&str]) -> Found {
        Found {
            scripts: scripts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            own: own.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn object(o: &str, argv0: &str) -> Launch {
        Launch {
            target: Target::Object(o.into()),
            argv0: argv0.into(),
        }
    }

    #[test]
    fn a_package_runs_its_own_console_script() {
        let f = found(
            &[
                ("mcp-server-time", "mcp_server_time:main"),
                ("uvicorn", "uvicorn.main:main"),
            ],
            &["mcp-server-time"],
        );
        assert_eq!(
            choose("mcp-server-time", &f, None, None),
            Ok(object("mcp_server_time:main", "mcp-server-time"))
        );
        // Another package's script, by name.
        assert_eq!(
            choose("mcp-server-time", &f, Some("uvicorn"), None),
            Ok(object("uvicorn.main:main", "uvicorn"))
        );
    }

    #[test]
    fn of_several_scripts_the_one_named_as_the_package_runs_else_the_caller_picks() {
        let f = found(
            &[
                ("srv", "a:main"),
                ("Srv_Tool", "a:tool"),
                ("other", "a:other"),
            ],
            &["Srv_Tool", "other"],
        );
        assert_eq!(
            choose("srv-tool", &f, None, None),
            Ok(object("a:tool", "Srv_Tool"))
        );
        let e = choose("srv", &f, None, None).unwrap_err();
        assert!(
            e.contains("Srv_Tool, other") && e.contains("--entry"),
            "{e}"
        );
    }

    #[test]
    fn a_package_without_a_script_asks_for_an_entry_and_bad_entries_are_refused() {
        let f = found(&[("x", "not an object")], &[]);
        let e = choose("lib", &f, None, None).unwrap_err();
        assert!(
            e.contains("no console script") && e.contains("--entry"),
            "{e}"
        );
        assert!(choose("lib", &f, Some("x"), None)
            .unwrap_err()
            .contains("not module:function"));
        assert!(choose("lib", &f, Some("missing"), None)
            .unwrap_err()
            .contains("(they have: x)"));
        assert!(choose("lib", &f, Some("a b:c"), None).is_err());
        assert!(choose("lib", &f, Some("pkg:1x"), None).is_err());
        assert_eq!(
            choose("lib", &f, Some("pkg.mod:app.run"), None),
            Ok(object("pkg.mod:app.run", "lib"))
        );
        assert_eq!(
            choose("lib", &f, None, Some("pkg.server")),
            Ok(Launch {
                target: Target::Module("pkg.server".into()),
                argv0: "pkg.server".into()
            })
        );
        assert!(choose("lib", &f, None, Some("pkg/server")).is_err());
    }

    #[test]
    fn console_script_values_may_carry_extras() {
        assert_eq!(
            object_reference("pkg.cli:main [fast]"),
            Some("pkg.cli:main".into())
        );
        assert_eq!(object_reference("pkg.cli"), None);
    }

    #[test]
    fn variables_come_from_our_environment_or_the_command_line_and_pycells_own_are_refused() {
        let lookup = |n: &str| (n == "TOKEN").then(|| "s3cret".to_string());
        let got = variables(
            &["TOKEN".into(), "MODE=fast".into(), "MODE=slow".into()],
            lookup,
        )
        .unwrap();
        let want: BTreeMap<String, String> = [("TOKEN", "s3cret"), ("MODE", "slow")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert_eq!(got, want);
        assert!(variables(&["UNSET".into()], lookup)
            .unwrap_err()
            .contains("not set"));
        assert!(variables(&["1X=2".into()], lookup).is_err());
        assert!(variables(&["https_proxy=http://x".into()], lookup)
            .unwrap_err()
            .contains("itself"));
        assert!(variables(&["PYCELL_TOOLS_FD=3".into()], lookup).is_err());
    }

    #[test]
    fn allow_rules_that_do_not_parse_are_named_with_their_flag() {
        assert!(check_allow(&["http://127.0.0.1:8080".into(), "example.net".into()]).is_ok());
        assert!(check_allow(&["ftp://x".into()])
            .unwrap_err()
            .contains("--allow \"ftp://x\""));
    }

    #[test]
    fn grants_show_at_their_own_path_outside_the_jails_own_places() {
        assert_eq!(
            grant_target(Path::new("/srv/repo")),
            Ok(PathBuf::from("/srv/repo"))
        );
        assert!(grant_target(Path::new("/tmp/repo"))
            .unwrap_err()
            .contains("grant a path elsewhere"));
    }
}
