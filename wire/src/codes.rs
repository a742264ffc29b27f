//! The stable names a refused or failed run is reported with: a
//! [`FailureCode`] (what went wrong) and the [`Layer`] it concerns. Both are
//! snake_case strings on the wire and in `--json` results; they are part of
//! pycell's interface, so an existing name is never changed. The tables in
//! `docs/errors.md` list every one, and a test keeps them in step.

/// An enum of fixed snake_case names, with `ALL`, `as_str` and `Display`
/// (the protocol's error codes use it too; the caller needs `serde` and
/// `schemars`).
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name as it appears on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub use named_enum;

named_enum! {
    /// Why a run was refused, or ended other than by itself.
    pub enum FailureCode {
        // The run's own limits.
        /// The wall-clock timeout expired; the whole sandbox was killed.
        Timeout = "timeout",
        /// The memory limit was reached and the kernel killed the program.
        Oom = "oom",
        /// The CPU-time limit was reached.
        CpuTimeLimit = "cpu_time_limit",
        /// The run was cancelled before its sandbox started.
        Cancelled = "cancelled",
        /// The zygote the run was forked from died and took the run along
        /// (a run's jail lives inside its zygote's): no fault of the run's.
        ZygoteDied = "zygote_died",

        // The caller's request or the host's configuration.
        /// The policy does not load (a bad file, or an interpreter it names is missing).
        InvalidPolicy = "invalid_policy",
        /// The request cannot be run as given (limits out of range, bad arguments).
        InvalidRequest = "invalid_request",
        /// pycell's own configuration is wrong (e.g. `PYCELL_UID_RANGE`).
        InvalidConfig = "invalid_config",
        /// Every sandbox uid of the range is in use.
        UidUnavailable = "uid_unavailable",
        /// Embedded mode was asked for without root.
        NotRoot = "not_root",

        // Starting and talking to the jailer.
        /// The `pycell-jailer` executable cannot be found or started.
        JailerUnavailable = "jailer_unavailable",
        /// The jailer ended without a result, or its event stream was corrupt.
        JailerFailed = "jailer_failed",
        /// The jailer could not read or write one of its own pipes.
        JailerIo = "jailer_io",
        /// The jail spec the jailer received is malformed or out of range.
        InvalidSpec = "invalid_spec",
        /// The jail died before it reported being ready.
        JailSetupFailed = "jail_setup_failed",

        // Layers that this host cannot provide.
        /// `clone` with the namespace flags failed (user namespaces disabled).
        NamespacesUnavailable = "namespaces_unavailable",
        /// A cgroup controller is missing, or a limit cannot be written.
        CgroupUnavailable = "cgroup_unavailable",
        /// The kernel has no Landlock, or it is disabled.
        LandlockUnavailable = "landlock_unavailable",
        /// The kernel's Landlock ABI is below the policy's `min_abi`.
        LandlockAbiTooOld = "landlock_abi_too_old",
        /// The policy's seccomp profile does not compile.
        SeccompUnavailable = "seccomp_unavailable",

        // A jail step that failed (see docs/jail.md for the steps).
        /// Clearing the jailer's supplementary groups failed.
        SetgroupsFailed = "setgroups_failed",
        /// Writing the uid/gid maps or switching to the jail user failed.
        UserNamespaceFailed = "user_namespace_failed",
        /// Entering the cgroup namespace or setting the hostname failed.
        NamespacesFailed = "namespaces_failed",
        /// Waiting to be attached to the run's cgroup failed.
        CgroupFailed = "cgroup_failed",
        /// A bind source is missing, or a mount step failed.
        MountsFailed = "mounts_failed",
        /// Bringing up the loopback interface failed.
        NetworkFailed = "network_failed",
        /// Setting the rlimits failed.
        RlimitsFailed = "rlimits_failed",
        /// `setsid` failed.
        SessionFailed = "session_failed",
        /// Dropping capabilities failed.
        CapabilitiesFailed = "capabilities_failed",
        /// `PR_SET_NO_NEW_PRIVS` failed.
        NoNewPrivsFailed = "no_new_privs_failed",
        /// Closing inherited file descriptors failed.
        FileDescriptorsFailed = "file_descriptors_failed",
        /// Applying the Landlock ruleset failed.
        LandlockFailed = "landlock_failed",
        /// Loading the seccomp filter failed.
        SeccompFailed = "seccomp_failed",
        /// The interpreter could not be executed.
        ExecFailed = "exec_failed",

        // Dependencies (a PEP 723 block, `--with`, `dependencies`).
        /// The run's dependencies are malformed (metadata, a specifier, a requirements file).
        DepsInvalid = "deps_invalid",
        /// The run names dependencies but its policy does not allow any.
        DepsNotAllowed = "deps_not_allowed",
        /// No set of versions satisfies the dependencies (an unknown package, a conflict).
        DepsResolutionFailed = "deps_resolution_failed",
        /// A package has no wheel for this interpreter and platform (sdists are never built).
        DepsNoWheel = "deps_no_wheel",
        /// The script's `requires-python` excludes the policy's interpreter.
        DepsPythonUnsatisfiable = "deps_python_unsatisfiable",
        /// The package index could not be reached from the install jail.
        DepsIndexUnreachable = "deps_index_unreachable",
        /// The install jail reached one of its limits (time, memory, disk).
        DepsInstallLimit = "deps_install_limit",
        /// Installing failed for another reason (the message says which).
        DepsInstallFailed = "deps_install_failed",
        /// This host cannot build envs (no uv, an env store it cannot write).
        DepsUnavailable = "deps_unavailable",

        // Sessions (a jail whose python lives across calls).
        /// The handle names no session of the caller's (never one, or another uid's).
        UnknownSession = "unknown_session",
        /// The session ended (by its caller, its idle timeout or its lifetime, or a restart of pycelld).
        SessionGone = "session_gone",
        /// The session was killed (a cell ignored KeyboardInterrupt, its memory ran out, its python died).
        SessionKilled = "session_killed",
        /// The session already has as many calls waiting as it queues.
        SessionBusy = "session_busy",
        /// The caller holds as many sessions as the policy allows.
        TooManySessions = "too_many_sessions",
        /// Sessions are not offered here (turned off by the policy, or not by this server).
        SessionsUnavailable = "sessions_unavailable",
        /// A file operation was refused: a path outside /workspace, a symlink, a file too big.
        FileRefused = "file_refused",
        /// A session's state could not be carried to a fork: more than it may carry, or its runner refused it.
        StateRefused = "state_refused",
        /// The snapshot id names no snapshot of the caller's (never one, another's, or expired).
        UnknownSnapshot = "unknown_snapshot",

        // The daemon, as its clients report it (the protocol's error codes,
        // under the same names).
        /// No pycelld answers on the socket.
        DaemonUnavailable = "daemon_unavailable",
        /// The connection to pycelld broke during the run.
        DaemonFailed = "daemon_failed",
        /// The client's uid and groups may not use pycelld.
        Unauthorized = "unauthorized",
        /// pycelld's concurrency limits are reached; try again later.
        Busy = "busy",
        /// pycelld is shutting down (or `pycell mcp` is).
        ShuttingDown = "shutting_down",
        /// Client and daemon speak different protocol versions.
        VersionMismatch = "version_mismatch",
        /// The daemon rejected a frame or message as malformed.
        BadMessage = "bad_message",
        /// A protocol frame was larger than allowed.
        FrameTooLarge = "frame_too_large",
        /// The client skipped the protocol's handshake.
        HandshakeRequired = "handshake_required",
        /// The connection already has a run going.
        RunInProgress = "run_in_progress",
        /// A cancel named no run of the connection.
        NoSuchRun = "no_such_run",
        /// Something failed inside pycell itself.
        Internal = "internal",
    }
}

named_enum! {
    /// The layer or step of the system a failure concerns.
    pub enum Layer {
        /// The run's limits (timeout, memory, CPU time).
        Limits = "limits",
        /// The policy file.
        Policy = "policy",
        /// The request (its code, arguments or limit overrides).
        Request = "request",
        /// Sandbox uid allocation.
        Uid = "uid",
        /// The jailer process and its pipes.
        Jailer = "jailer",
        /// The daemon and the connection to it.
        Daemon = "daemon",
        /// Namespaces other than the user namespace.
        Namespaces = "namespaces",
        /// The user namespace and its uid/gid maps.
        UserNamespace = "user_namespace",
        /// The run's cgroup.
        Cgroup = "cgroup",
        /// Bind mounts and the jail's root file system.
        Mounts = "mounts",
        /// The jail's network namespace.
        Network = "network",
        /// Resource limits (setrlimit).
        Rlimits = "rlimits",
        /// The new session (no controlling terminal).
        Session = "session",
        /// Capabilities.
        Capabilities = "capabilities",
        /// `no_new_privs`.
        NoNewPrivs = "no_new_privs",
        /// Inherited file descriptors.
        FileDescriptors = "file_descriptors",
        /// Landlock.
        Landlock = "landlock",
        /// seccomp.
        Seccomp = "seccomp",
        /// Executing the program.
        Exec = "exec",
        /// Resolving and installing the run's dependencies.
        Dependencies = "dependencies",
        /// A session (a jail whose python lives across calls) and its calls.
        Sessions = "sessions",
    }
}

impl Layer {
    /// The code for a jail step of this layer that failed for a reason
    /// other than a missing kernel feature.
    pub fn step_failed(self) -> FailureCode {
        match self {
            Layer::Cgroup => FailureCode::CgroupFailed,
            Layer::Mounts => FailureCode::MountsFailed,
            Layer::UserNamespace => FailureCode::UserNamespaceFailed,
            Layer::Namespaces => FailureCode::NamespacesFailed,
            Layer::Network => FailureCode::NetworkFailed,
            Layer::Rlimits => FailureCode::RlimitsFailed,
            Layer::Session => FailureCode::SessionFailed,
            Layer::Capabilities => FailureCode::CapabilitiesFailed,
            Layer::NoNewPrivs => FailureCode::NoNewPrivsFailed,
            Layer::FileDescriptors => FailureCode::FileDescriptorsFailed,
            Layer::Landlock => FailureCode::LandlockFailed,
            Layer::Seccomp => FailureCode::SeccompFailed,
            Layer::Exec => FailureCode::ExecFailed,
            Layer::Limits
            | Layer::Policy
            | Layer::Request
            | Layer::Uid
            | Layer::Jailer
            | Layer::Daemon
            | Layer::Sessions => FailureCode::JailerFailed,
            Layer::Dependencies => FailureCode::DepsInstallFailed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_are_snake_case() {
        for c in FailureCode::ALL {
            let json = serde_json::to_string(c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<FailureCode>(&json).unwrap(), *c);
            assert!(c
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
        for l in Layer::ALL {
            let json = serde_json::to_string(l).unwrap();
            assert_eq!(serde_json::from_str::<Layer>(&json).unwrap(), *l);
        }
    }

    #[test]
    fn names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        assert!(FailureCode::ALL.iter().all(|c| seen.insert(c.as_str())));
        let mut seen = std::collections::HashSet::new();
        assert!(Layer::ALL.iter().all(|l| seen.insert(l.as_str())));
    }

    #[test]
    fn step_failures_keep_their_historic_names() {
        // `<layer>_failed` was how these codes were built before they were typed.
        for l in [
            Layer::Mounts,
            Layer::Capabilities,
            Layer::Landlock,
            Layer::Exec,
        ] {
            assert_eq!(l.step_failed().as_str(), format!("{}_failed", l.as_str()));
        }
        assert_eq!(Layer::Jailer.step_failed(), FailureCode::JailerFailed);
    }
}
