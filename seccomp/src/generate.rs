//! Turning a profile into its final BPF program for one architecture.
//!
//! Runs at build time (build.rs includes this file with `#[path]`) and in
//! the tests, never when a sandbox starts. The steps:
//!
//! 1. [`Profile::parse`] checks pycell's rules (layer roles, a comment on
//!    every rule and condition, no dword wider than 32 bits, ...).
//! 2. seccompiler compiles the profile as written. That validates what only
//!    it knows (syscall names on this architecture, condition shapes), and
//!    its output, chained layer after layer, is the reference the tests hold
//!    the generated program to (`reference.rs`).
//! 3. Every syscall number gets a [`Decision`]: the layers are read in
//!    order, deny layers by name and `main` last, exactly as the chained
//!    reference runs them, so a deny rule wins over an allow rule.
//! 4. `tree.rs` lays the decisions out as a decision tree.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use seccompiler::sock_filter;

use crate::bpf::{Arch, DATA_NR, JEQ_K, LD_W_ABS, MAX_INSTRUCTIONS};
use crate::profile::{Profile, Rule, MAIN_FILTER};
use crate::tree::{self, Decision, Step};
use crate::SeccompError;

/// Syscalls that exist on x86_64 but not on aarch64 (legacy calls replaced by
/// their `*at` or generic forms there). Rules naming them are dropped when
/// compiling for aarch64: a syscall that does not exist needs no rule.
const NOT_ON_AARCH64: &[&str] = &[
    "_sysctl",
    "access",
    "afs_syscall",
    "alarm",
    "arch_prctl",
    "chmod",
    "chown",
    "creat",
    "create_module",
    "dup2",
    "epoll_create",
    "epoll_ctl_old",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "fork",
    "futimesat",
    "get_kernel_syms",
    "get_thread_area",
    "getdents",
    "getpgrp",
    "getpmsg",
    "inotify_init",
    "ioperm",
    "iopl",
    "lchown",
    "link",
    "lstat",
    "mkdir",
    "mknod",
    "modify_ldt",
    "open",
    "pause",
    "pipe",
    "poll",
    "putpmsg",
    "query_module",
    "readlink",
    "rename",
    "rmdir",
    "security",
    "select",
    "set_thread_area",
    "signalfd",
    "stat",
    "symlink",
    "sysfs",
    "time",
    "tuxcall",
    "unlink",
    "uretprobe",
    "uselib",
    "ustat",
    "utime",
    "utimes",
    "vfork",
    "vserver",
];

fn exists_on(arch: Arch, syscall: &str) -> bool {
    arch != Arch::Aarch64 || !NOT_ON_AARCH64.contains(&syscall)
}

/// Compiles profile `name` (JSON `text`) for `arch`.
pub(crate) fn generate(
    name: &str,
    text: &str,
    arch: Arch,
) -> Result<Vec<sock_filter>, SeccompError> {
    let profile = Profile::parse(name, text)?;
    let compile_error = |source| SeccompError::Compile {
        profile: name.to_owned(),
        arch: arch.name(),
        source,
    };
    seccompiler::compile_from_json(text_for_arch(name, text, arch)?.as_bytes(), arch.target())
        .map_err(compile_error)?;
    let numbers = syscall_numbers(&profile, arch).map_err(compile_error)?;
    let decisions = decisions(name, &profile, &numbers, arch)?;
    let program = tree::build(arch.audit(), default_action(&profile), &decisions);
    if program.len() > MAX_INSTRUCTIONS {
        return Err(SeccompError::TooLarge {
            profile: name.to_owned(),
            instructions: program.len(),
            limit: MAX_INSTRUCTIONS,
        });
    }
    Ok(program)
}

/// Every syscall profile `name` names that exists on `arch`, with its
/// number there, sorted by number: how the jailer names a call it was
/// told the filter refused.
pub(crate) fn syscall_table(
    name: &str,
    text: &str,
    arch: Arch,
) -> Result<Vec<(u32, String)>, SeccompError> {
    let profile = Profile::parse(name, text)?;
    let numbers = syscall_numbers(&profile, arch).map_err(|source| SeccompError::Compile {
        profile: name.to_owned(),
        arch: arch.name(),
        source,
    })?;
    let mut table: Vec<(u32, String)> = numbers
        .into_iter()
        .map(|(syscall, nr)| (nr, syscall.to_owned()))
        .collect();
    table.sort();
    Ok(table)
}

/// What the chained layers decide for each listed syscall number.
fn decisions<'p>(
    name: &str,
    profile: &'p Profile<'_>,
    numbers: &BTreeMap<&str, u32>,
    arch: Arch,
) -> Result<BTreeMap<u32, Decision<'p>>, SeccompError> {
    // Per number, the rules of each layer that lists it, in layer order.
    type Layers<'p, 'r> = Vec<(usize, u32, Vec<&'p Rule<'r>>)>;
    let mut listed: BTreeMap<u32, Layers<'p, '_>> = BTreeMap::new();
    for (position, layer) in profile.layer_names().into_iter().enumerate() {
        let filter = &profile.filters[layer];
        let action = u32::from(filter.match_action.clone());
        for rule in filter.rules.iter().filter(|r| exists_on(arch, r.syscall)) {
            let layers = listed.entry(numbers[rule.syscall]).or_default();
            match layers.last_mut() {
                Some((last, _, rules)) if *last == position => rules.push(rule),
                _ => layers.push((position, action, vec![rule])),
            }
        }
    }
    let default = default_action(profile);

    let mut decisions = BTreeMap::new();
    for (nr, layers) in listed {
        let mut steps = Vec::new();
        let mut otherwise = default;
        for (_, action, rules) in layers {
            let unconditional = rules.iter().filter(|r| r.args.is_none()).count();
            if unconditional == rules.len() {
                // Nothing after this layer is reached for this number.
                otherwise = action;
                break;
            }
            if unconditional > 0 {
                return Err(SeccompError::InvalidProfile {
                    profile: name.to_owned(),
                    reason: crate::profile::ProfileProblem::MixedByNumber(nr.into()),
                });
            }
            let rules = rules.iter().filter_map(|r| r.args.as_deref()).collect();
            steps.push(Step { rules, action });
        }
        let decision = if steps.is_empty() {
            Decision::Constant(otherwise)
        } else {
            Decision::Check { steps, otherwise }
        };
        decisions.insert(nr, decision);
    }
    Ok(decisions)
}

/// The number of every syscall the profile names, from seccompiler's own
/// table: each name is compiled as a one-rule filter and the number read
/// back from the comparison seccompiler emits for it.
fn syscall_numbers<'a>(
    profile: &Profile<'a>,
    arch: Arch,
) -> Result<BTreeMap<&'a str, u32>, seccompiler::Error> {
    let names: BTreeSet<&'a str> = profile
        .filters
        .values()
        .flat_map(|filter| filter.rules.iter().map(|rule| rule.syscall))
        .filter(|syscall| exists_on(arch, syscall))
        .collect();
    let filters: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|name| {
            let filter = serde_json::json!({
                "mismatch_action": "allow",
                "match_action": { "errno": 1 },
                "filter": [{ "syscall": name }],
            });
            ((*name).to_owned(), filter)
        })
        .collect();
    let json = serde_json::Value::Object(filters).to_string();
    let programs = seccompiler::compile_from_json(json.as_bytes(), arch.target())?;
    Ok(names
        .into_iter()
        .map(|name| {
            let program = &programs[name];
            // arch check (3 instructions), load nr, compare with the number.
            assert!(
                program.len() > 4
                    && program[3].code == LD_W_ABS
                    && program[3].k == DATA_NR
                    && program[4].code == JEQ_K,
                "seccompiler's program for {name} no longer has the layout \
                 generate.rs reads syscall numbers from"
            );
            (name, program[4].k)
        })
        .collect())
}

/// On aarch64, drops rules for syscalls that only exist on x86_64; elsewhere
/// the text is used as written.
pub(crate) fn text_for_arch<'t>(
    name: &str,
    text: &'t str,
    arch: Arch,
) -> Result<Cow<'t, str>, SeccompError> {
    if arch != Arch::Aarch64 {
        return Ok(Cow::Borrowed(text));
    }
    let parse_error = |source| SeccompError::Parse {
        profile: name.to_owned(),
        source,
    };
    let mut document: serde_json::Value = serde_json::from_str(text).map_err(parse_error)?;
    if let Some(filters) = document.as_object_mut() {
        for filter in filters.values_mut() {
            if let Some(rules) = filter.get_mut("filter").and_then(|r| r.as_array_mut()) {
                rules.retain(|rule| {
                    let syscall = rule.get("syscall").and_then(|s| s.as_str()).unwrap_or("");
                    exists_on(arch, syscall)
                });
            }
        }
    }
    Ok(Cow::Owned(document.to_string()))
}

/// What `main` returns for a call it does not list.
fn default_action(profile: &Profile<'_>) -> u32 {
    u32::from(profile.filters[MAIN_FILTER].mismatch_action.clone())
}
