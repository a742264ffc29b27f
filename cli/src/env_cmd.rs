//! `pycell env list | gc | rm`: the env store of embedded mode.

use std::time::{SystemTime, UNIX_EPOCH};

use pycell_core::deps::build::embedded_store;
use pycell_core::deps::store::{EnvEntry, EnvStore};

use crate::cli::EnvCommand;

pub fn main(cmd: &EnvCommand) -> i32 {
    let store = match embedded_store() {
        Ok(s) => s,
        Err(f) => {
            eprintln!("pycell: {}", f.message);
            return 1;
        }
    };
    let outcome = match cmd {
        EnvCommand::List { json } => list(&store, *json),
        EnvCommand::Gc { max_size, max_age } => gc(&store, max_size, max_age),
        EnvCommand::Rm { keys } => rm(&store, keys),
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
        println!(
            "{}",
            serde_json::to_string(&envs).map_err(|e| e.to_string())?
        );
    } else {
        for e in &envs {
            println!("{}", line(e));
        }
    }
    Ok(())
}

fn gc(store: &EnvStore, max_size: &str, max_age: &str) -> Result<(), String> {
    let size = pycell_policy::parse_size(max_size).map_err(|e| format!("--max-size: {e}"))?;
    let age = pycell_policy::parse_duration(max_age).map_err(|e| format!("--max-age: {e}"))?;
    for e in store.gc(size, age) {
        println!("removed {}", line(&e));
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
        store.remove(&one.meta.key)?;
        println!("removed {}", one.meta.key);
    }
    Ok(())
}
