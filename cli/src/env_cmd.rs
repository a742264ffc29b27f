//! `pycell env build | list | gc | rm`: an env store (embedded mode's by
//! default). The build itself is `pycell_engine::envs`'s, shared with
//! pycelld's env builders.

use std::time::{SystemTime, UNIX_EPOCH};

use pycell_deps as deps;
use pycell_deps::build::{open_store, BuildOutcome};
use pycell_deps::store::{EnvEntry, EnvStore};
use pycell_engine::envs::{self, EnvWanted};
use pycell_launch::launcher::Launcher;
use pycell_protocol::result::{CacheOutcome, EnvReport};
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;

use crate::cli::{EnvArgs, EnvBuildArgs, EnvCommand};
use crate::run::{listed_dependencies, read_code};
use crate::say::say;

pub fn main(args: &EnvArgs) -> i32 {
    let store = open_store(args.store.as_deref());
    let opened = || store.clone().map_err(|f| f.message);
    let outcome = match &args.command {
        EnvCommand::Build(build_args) => return build_main(build_args, store),
        EnvCommand::List { json } => opened().and_then(|s| list(&s, *json)),
        EnvCommand::Gc { max_size, max_age } => opened().and_then(|s| gc(&s, max_size, max_age)),
        EnvCommand::Rm { keys } => opened().and_then(|s| rm(&s, keys)),
    };
    match outcome {
        Ok(()) => 0,
        Err(m) => {
            eprintln!("pycell: {m}");
            1
        }
    }
}

fn line(e: &EnvEntry) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let age = now.saturating_sub(e.last_used);
    let packages: Vec<String> = e
        .meta
        .packages
        .iter()
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();
    format!(
        "{}  {:>9}  used {} ago{}  python {}  {}",
        &e.meta.key[..16],
        pycell_policy::format_size(e.meta.size_bytes),
        pycell_policy::format_duration(std::time::Duration::from_secs(age)),
        if e.in_use { " (in use)" } else { "" },
        e.meta.python,
        packages.join(", ")
    )
}

fn list(store: &EnvStore, json: bool) -> Result<(), String> {
    let envs = store.list();
    if json {
        say!(
            "{}",
            serde_json::to_string(&envs).map_err(|e| e.to_string())?
        );
    } else {
        for e in &envs {
            say!("{}", line(e));
        }
    }
    Ok(())
}

fn gc(store: &EnvStore, max_size: &str, max_age: &str) -> Result<(), String> {
    let size = pycell_policy::parse_size(max_size).map_err(|e| format!("--max-size: {e}"))?;
    let age = pycell_policy::parse_duration(max_age).map_err(|e| format!("--max-age: {e}"))?;
    for e in store.gc(size, age) {
        say!("removed {}", line(&e));
    }
    Ok(())
}

fn rm(store: &EnvStore, keys: &[String]) -> Result<(), String> {
    let envs = store.list();
    for prefix in keys {
        let matching: Vec<&EnvEntry> = envs
            .iter()
            .filter(|e| e.meta.key.starts_with(prefix.as_str()))
            .collect();
        let [one] = matching.as_slice() else {
            return Err(format!(
                "{prefix:?} matches {} envs; give a longer prefix of a key from `pycell env list`",
                matching.len()
            ));
        };
        store.remove(&one.meta.key).map_err(|e| e.to_string())?;
        say!("removed {}", one.meta.key);
    }
    Ok(())
}

/// `pycell env build`: exit 0 with the env ready, 1 if it cannot be.
fn build_main(args: &EnvBuildArgs, store: Result<EnvStore, JailFailure>) -> i32 {
    // Started from a shell that goes away: stop, and let the install jail
    // clean up (SIGTERM is read, not fatal, once building).
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    let outcome = envs::outcome(store.and_then(|s| build(args, &s)));
    if args.json {
        say!("{}", envs::outcome_line(&outcome));
    }
    match outcome {
        BuildOutcome::Ready { env } => {
            if !args.json {
                say!("{}", ready_line(&env));
            }
            0
        }
        BuildOutcome::Failed { failure } => {
            if !args.json {
                eprintln!("pycell: {}: {}", failure.code, failure.message);
                if let Some(hint) = &failure.hint {
                    eprintln!("pycell: hint: {hint}");
                }
            }
            1
        }
    }
}

fn ready_line(env: &EnvReport) -> String {
    let packages: Vec<String> = env
        .packages
        .iter()
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();
    let how = match env.cache {
        CacheOutcome::Hit => "already built".to_string(),
        CacheOutcome::Miss => format!("built in {:.1}s", env.install_ms / 1000.0),
    };
    format!("env {} ({how}): {}", env.key, packages.join(", "))
}

fn build(args: &EnvBuildArgs, store: &EnvStore) -> Result<EnvReport, JailFailure> {
    let invalid = |m: String| deps::failure(FailureCode::DepsInvalid, m);
    let launcher = Launcher::embedded_from_env()?;
    let code = match &args.script {
        Some(script) => read_code(script).map_err(invalid)?,
        None => String::new(),
    };
    let listed = listed_dependencies(args.requirements.as_deref(), &args.with).map_err(invalid)?;
    let wanted = EnvWanted {
        policy: &args.policy,
        code: &code,
        listed: &listed,
        requires_python: args.requires_python.as_deref(),
    };
    envs::build(&launcher, store, wanted, &mut |m| eprintln!("pycell: {m}"))
}
