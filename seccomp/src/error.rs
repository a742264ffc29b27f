//! Errors of this crate, one variant per step that can fail.

/// Why a profile could not be looked up, compiled or applied.
///
/// The built-in profiles are compiled by build.rs, so `Parse`,
/// `InvalidProfile`, `Compile` and `TooLarge` stop the build there (with this
/// message); at run time only `denials` re-reads a profile.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The profile name is not one of [`crate::profile_names`].
    #[error("unknown seccomp profile \"{name}\" (known profiles: {})", .known.join(", "))]
    UnknownProfile {
        name: String,
        known: &'static [&'static str],
    },

    /// The profile's JSON does not have the expected shape.
    #[error("seccomp profile \"{profile}\" is not valid JSON in seccompiler's format: {source}")]
    Parse {
        profile: String,
        #[source]
        source: serde_json::Error,
    },

    /// The profile parsed but breaks one of this crate's rules (see `docs/seccomp.md`).
    #[error("seccomp profile \"{profile}\" is invalid: {reason}")]
    InvalidProfile {
        profile: String,
        reason: crate::profile::ProfileProblem,
    },

    /// The build targets an architecture that has no profile support.
    #[error(
        "seccomp profiles are only built for x86_64 and aarch64, not {arch}; \
         pycell refuses to run without a filter"
    )]
    UnsupportedArch { arch: &'static str },

    /// seccompiler rejected the profile (unknown syscall name, bad condition, ...).
    #[error("seccomp profile \"{profile}\" failed to compile for {arch}: {source}")]
    Compile {
        profile: String,
        arch: &'static str,
        #[source]
        source: seccompiler::Error,
    },

    /// The generated program exceeds the kernel's limit of instructions per filter.
    #[error(
        "seccomp profile \"{profile}\" compiles to {instructions} BPF instructions, \
         more than the kernel's limit of {limit}; split or shorten the profile"
    )]
    TooLarge {
        profile: String,
        instructions: usize,
        limit: usize,
    },

    /// `prctl(PR_GET_NO_NEW_PRIVS)` itself failed.
    #[error("could not read no_new_privs of the calling thread before applying seccomp: {source}")]
    CheckNoNewPrivs {
        #[source]
        source: nix::Error,
    },

    /// The calling thread has not set no_new_privs, which must come first.
    #[error(
        "seccomp filter not applied: no_new_privs is not set on the calling thread; \
         call prctl(PR_SET_NO_NEW_PRIVS, 1) (the jailer's no_new_privs step) before applying seccomp"
    )]
    NoNewPrivs,

    /// The kernel refused to install the filter.
    #[error("the kernel refused to install the seccomp filter: {source}")]
    Apply {
        #[source]
        source: seccompiler::Error,
    },
}
