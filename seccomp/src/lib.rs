//! pycell's seccomp filters: profiles kept as data (`profiles/*.json`, in
//! seccompiler's JSON format), compiled at build time (build.rs) to one BPF
//! program per profile and architecture, a decision tree over syscall
//! numbers, and embedded in the binary.
//!
//! Threat model: the filter is the last layer the jailer applies before it
//! execs the sandboxed interpreter, after namespaces, mounts, capability drop,
//! no_new_privs and Landlock. It cuts the kernel surface that untrusted Python
//! can reach down to what CPython, its threads, asyncio, subprocess and
//! numpy-style native libraries need. Calls that are known to be dangerous
//! (io_uring, bpf, keyrings, mounts, nested namespaces, ptrace, terminal input
//! injection, ...) are denied explicitly with `EPERM`; everything not on the
//! allowlist fails with `ENOSYS`, so libraries treat it as missing and fall
//! back. A foreign architecture (i386 via `int 0x80`) kills the process.
//! See `docs/seccomp.md`.
//!
//! ```no_run
//! let filter = pycell_seccomp::compile("default")?;   // before cloning the sandbox
//! // ... namespaces, mounts, caps, no_new_privs, Landlock ...
//! pycell_seccomp::apply(&filter)?;                    // last step before execve
//! # Ok::<(), pycell_seccomp::SeccompError>(())
//! ```

#![forbid(unsafe_code)]

mod apply;
// Shared with build.rs, which uses the encoder, opcodes and arch table; the
// library itself only decodes the embedded programs.
#[cfg_attr(not(test), allow(dead_code))]
mod bpf;
#[cfg(test)]
mod bpf_eval;
mod compile;
#[cfg(test)]
mod equivalence;
mod error;
// build.rs compiles the profiles with these two; the tests compile synthetic
// profiles and other architectures with them.
#[cfg(test)]
mod generate;
mod profile;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tree;

pub use compile::{CompiledFilter, KernelGap, SyscallNames};
pub use error::SeccompError;

use profile::{Profile, MAIN_FILTER};

/// The profile used when a policy names none.
pub const DEFAULT_PROFILE: &str = "default";

/// Names of the profiles built into this crate.
pub fn profile_names() -> &'static [&'static str] {
    profile::names()
}

/// The JSON text of a built-in profile, as shipped.
pub fn profile_source(name: &str) -> Option<&'static str> {
    profile::source(name)
}

/// The filter of a built-in profile for the architecture this crate was
/// built for.
///
/// The program was compiled and checked when the crate was built; this only
/// decodes it (tens of nanoseconds). It allocates, so call it before cloning
/// the sandbox, and [`apply`] in the child.
pub fn compile(profile: &str) -> Result<CompiledFilter, SeccompError> {
    compile::compile(profile)
}

/// Installs `filter` on the calling thread (not on other threads).
///
/// no_new_privs must already be set on the thread; otherwise this returns
/// [`SeccompError::NoNewPrivs`] without installing anything. Filters stack:
/// applying twice keeps both.
pub fn apply(filter: &CompiledFilter) -> Result<(), SeccompError> {
    apply::apply(filter)
}

/// One explicit denial of a profile: a syscall that a deny layer refuses, with
/// the errno the caller sees. `conditional` is true when only some argument
/// values are refused (e.g. `clone` with `CLONE_NEW*` flags, `ioctl(TIOCSTI)`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Denial {
    pub syscall: &'static str,
    pub errno: i32,
    pub conditional: bool,
}

/// Every explicit denial of a profile, sorted by syscall name. Calls that are
/// simply not on the allowlist are not listed: they fail with the profile's
/// default errno (`ENOSYS` for `default`).
pub fn denials(profile: &str) -> Result<Vec<Denial>, SeccompError> {
    let (name, text) = profile::lookup(profile)?;
    let parsed = Profile::parse(name, text)?;
    let mut denials = Vec::new();
    for (filter_name, filter) in &parsed.filters {
        if *filter_name == MAIN_FILTER {
            continue;
        }
        let errno = Profile::errno_of(filter_name, filter)
            .and_then(|errno| i32::try_from(errno).ok())
            .unwrap_or(libc::EPERM);
        for rule in &filter.rules {
            denials.push(Denial {
                syscall: rule.syscall,
                errno,
                conditional: rule.args.is_some(),
            });
        }
    }
    denials.sort();
    denials.dedup();
    Ok(denials)
}

/// Names of the syscalls a profile denies explicitly (unconditionally or for
/// some arguments), sorted and without duplicates.
pub fn denied_syscalls(profile: &str) -> Result<Vec<&'static str>, SeccompError> {
    let mut names: Vec<&'static str> = denials(profile)?
        .into_iter()
        .map(|denial| denial.syscall)
        .collect();
    names.dedup();
    Ok(names)
}
