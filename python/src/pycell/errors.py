"""pycell's errors: one exception class per stable failure code
(docs/errors.md), grouped by what went wrong. Every class has `code`, the
stable name to match on; an instance has the daemon's `message`, its `hint`
where there is one, and the run's `result` where there is one.

Generated from the codes of docs/errors.md (tests/test_errors.py checks that
they match); keep them in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pycell.types import Result

__all__ = ["CODES", "ProtocolError", "PycellError", "error_for"]


class PycellError(Exception):
    """Anything pycell refused or could not do. `code` is stable."""

    code: str = "internal"

    def __init__(self, message: str, *, hint: str | None = None, result: Result | None = None) -> None:
        super().__init__(message if hint is None else f"{message} ({hint})")
        self.message = message
        self.hint = hint
        self.result = result


class ProtocolError(PycellError):
    """The daemon sent something this client cannot read (a bug or a
    version skew): the connection cannot be trusted after it."""

    code = "bad_message"


class RunStopped(PycellError):
    """A run that was stopped: its limits, or its caller."""


__all__ += ["RunStopped"]


class DependencyError(PycellError):
    """A run's dependencies could not be installed, or are not allowed."""


__all__ += ["DependencyError"]


class SessionError(PycellError):
    """A session call that got no answer, or a file operation refused."""


__all__ += ["SessionError"]


class RequestError(PycellError):
    """The request or the policy it names is not valid."""


__all__ += ["RequestError"]


class DaemonError(PycellError):
    """pycelld refused or could not take the request."""


__all__ += ["DaemonError"]


class JailError(PycellError):
    """A layer of the jail could not be built: the run never started."""


__all__ += ["JailError"]


class RunTimeout(RunStopped):
    """`timeout` (docs/errors.md)."""

    code = "timeout"


class OutOfMemory(RunStopped):
    """`oom` (docs/errors.md)."""

    code = "oom"


class CpuTimeLimit(RunStopped):
    """`cpu_time_limit` (docs/errors.md)."""

    code = "cpu_time_limit"


class Cancelled(RunStopped):
    """`cancelled` (docs/errors.md)."""

    code = "cancelled"


class ZygoteDied(RunStopped):
    """`zygote_died` (docs/errors.md)."""

    code = "zygote_died"


class InvalidPolicy(RequestError):
    """`invalid_policy` (docs/errors.md)."""

    code = "invalid_policy"


class InvalidRequest(RequestError):
    """`invalid_request` (docs/errors.md)."""

    code = "invalid_request"


class InvalidConfig(RequestError):
    """`invalid_config` (docs/errors.md)."""

    code = "invalid_config"


class UidUnavailable(JailError):
    """`uid_unavailable` (docs/errors.md)."""

    code = "uid_unavailable"


class NotRoot(JailError):
    """`not_root` (docs/errors.md)."""

    code = "not_root"


class JailerUnavailable(JailError):
    """`jailer_unavailable` (docs/errors.md)."""

    code = "jailer_unavailable"


class JailerFailed(JailError):
    """`jailer_failed` (docs/errors.md)."""

    code = "jailer_failed"


class JailerIo(JailError):
    """`jailer_io` (docs/errors.md)."""

    code = "jailer_io"


class InvalidSpec(JailError):
    """`invalid_spec` (docs/errors.md)."""

    code = "invalid_spec"


class JailSetupFailed(JailError):
    """`jail_setup_failed` (docs/errors.md)."""

    code = "jail_setup_failed"


class NamespacesUnavailable(JailError):
    """`namespaces_unavailable` (docs/errors.md)."""

    code = "namespaces_unavailable"


class CgroupUnavailable(JailError):
    """`cgroup_unavailable` (docs/errors.md)."""

    code = "cgroup_unavailable"


class LandlockUnavailable(JailError):
    """`landlock_unavailable` (docs/errors.md)."""

    code = "landlock_unavailable"


class LandlockAbiTooOld(JailError):
    """`landlock_abi_too_old` (docs/errors.md)."""

    code = "landlock_abi_too_old"


class SeccompUnavailable(JailError):
    """`seccomp_unavailable` (docs/errors.md)."""

    code = "seccomp_unavailable"


class SetgroupsFailed(JailError):
    """`setgroups_failed` (docs/errors.md)."""

    code = "setgroups_failed"


class UserNamespaceFailed(JailError):
    """`user_namespace_failed` (docs/errors.md)."""

    code = "user_namespace_failed"


class NamespacesFailed(JailError):
    """`namespaces_failed` (docs/errors.md)."""

    code = "namespaces_failed"


class CgroupFailed(JailError):
    """`cgroup_failed` (docs/errors.md)."""

    code = "cgroup_failed"


class MountsFailed(JailError):
    """`mounts_failed` (docs/errors.md)."""

    code = "mounts_failed"


class NetworkFailed(JailError):
    """`network_failed` (docs/errors.md)."""

    code = "network_failed"


class RlimitsFailed(JailError):
    """`rlimits_failed` (docs/errors.md)."""

    code = "rlimits_failed"


class SessionFailed(SessionError):
    """`session_failed` (docs/errors.md)."""

    code = "session_failed"


class CapabilitiesFailed(JailError):
    """`capabilities_failed` (docs/errors.md)."""

    code = "capabilities_failed"


class NoNewPrivsFailed(JailError):
    """`no_new_privs_failed` (docs/errors.md)."""

    code = "no_new_privs_failed"


class FileDescriptorsFailed(JailError):
    """`file_descriptors_failed` (docs/errors.md)."""

    code = "file_descriptors_failed"


class LandlockFailed(JailError):
    """`landlock_failed` (docs/errors.md)."""

    code = "landlock_failed"


class SeccompFailed(JailError):
    """`seccomp_failed` (docs/errors.md)."""

    code = "seccomp_failed"


class ExecFailed(JailError):
    """`exec_failed` (docs/errors.md)."""

    code = "exec_failed"


class DepsInvalid(DependencyError):
    """`deps_invalid` (docs/errors.md)."""

    code = "deps_invalid"


class DepsNotAllowed(DependencyError):
    """`deps_not_allowed` (docs/errors.md)."""

    code = "deps_not_allowed"


class DepsResolutionFailed(DependencyError):
    """`deps_resolution_failed` (docs/errors.md)."""

    code = "deps_resolution_failed"


class DepsNoWheel(DependencyError):
    """`deps_no_wheel` (docs/errors.md)."""

    code = "deps_no_wheel"


class DepsPythonUnsatisfiable(DependencyError):
    """`deps_python_unsatisfiable` (docs/errors.md)."""

    code = "deps_python_unsatisfiable"


class DepsIndexUnreachable(DependencyError):
    """`deps_index_unreachable` (docs/errors.md)."""

    code = "deps_index_unreachable"


class DepsInstallLimit(DependencyError):
    """`deps_install_limit` (docs/errors.md)."""

    code = "deps_install_limit"


class DepsInstallFailed(DependencyError):
    """`deps_install_failed` (docs/errors.md)."""

    code = "deps_install_failed"


class DepsUnavailable(DependencyError):
    """`deps_unavailable` (docs/errors.md)."""

    code = "deps_unavailable"


class UnknownSession(SessionError):
    """`unknown_session` (docs/errors.md)."""

    code = "unknown_session"


class SessionGone(SessionError):
    """`session_gone` (docs/errors.md)."""

    code = "session_gone"


class SessionKilled(SessionError):
    """`session_killed` (docs/errors.md)."""

    code = "session_killed"


class SessionBusy(SessionError):
    """`session_busy` (docs/errors.md)."""

    code = "session_busy"


class TooManySessions(SessionError):
    """`too_many_sessions` (docs/errors.md)."""

    code = "too_many_sessions"


class SessionsUnavailable(SessionError):
    """`sessions_unavailable` (docs/errors.md)."""

    code = "sessions_unavailable"


class FileRefused(SessionError):
    """`file_refused` (docs/errors.md)."""

    code = "file_refused"


class StateRefused(SessionError):
    """`state_refused` (docs/errors.md)."""

    code = "state_refused"


class UnknownSnapshot(SessionError):
    """`unknown_snapshot` (docs/errors.md)."""

    code = "unknown_snapshot"


class DaemonUnavailable(DaemonError):
    """`daemon_unavailable` (docs/errors.md)."""

    code = "daemon_unavailable"


class DaemonFailed(DaemonError):
    """`daemon_failed` (docs/errors.md)."""

    code = "daemon_failed"


class Unauthorized(DaemonError):
    """`unauthorized` (docs/errors.md)."""

    code = "unauthorized"


class Busy(DaemonError):
    """`busy` (docs/errors.md)."""

    code = "busy"


class ShuttingDown(DaemonError):
    """`shutting_down` (docs/errors.md)."""

    code = "shutting_down"


class VersionMismatch(DaemonError):
    """`version_mismatch` (docs/errors.md)."""

    code = "version_mismatch"


class BadMessage(DaemonError):
    """`bad_message` (docs/errors.md)."""

    code = "bad_message"


class FrameTooLarge(DaemonError):
    """`frame_too_large` (docs/errors.md)."""

    code = "frame_too_large"


class HandshakeRequired(DaemonError):
    """`handshake_required` (docs/errors.md)."""

    code = "handshake_required"


class RunInProgress(DaemonError):
    """`run_in_progress` (docs/errors.md)."""

    code = "run_in_progress"


class NoSuchRun(DaemonError):
    """`no_such_run` (docs/errors.md)."""

    code = "no_such_run"


class InternalError(DaemonError):
    """`internal` (docs/errors.md)."""

    code = "internal"


__all__ += [
    "BadMessage",
    "Busy",
    "Cancelled",
    "CapabilitiesFailed",
    "CgroupFailed",
    "CgroupUnavailable",
    "CpuTimeLimit",
    "DaemonFailed",
    "DaemonUnavailable",
    "DepsIndexUnreachable",
    "DepsInstallFailed",
    "DepsInstallLimit",
    "DepsInvalid",
    "DepsNoWheel",
    "DepsNotAllowed",
    "DepsPythonUnsatisfiable",
    "DepsResolutionFailed",
    "DepsUnavailable",
    "ExecFailed",
    "FileDescriptorsFailed",
    "FileRefused",
    "FrameTooLarge",
    "HandshakeRequired",
    "InternalError",
    "InvalidConfig",
    "InvalidPolicy",
    "InvalidRequest",
    "InvalidSpec",
    "JailSetupFailed",
    "JailerFailed",
    "JailerIo",
    "JailerUnavailable",
    "LandlockAbiTooOld",
    "LandlockFailed",
    "LandlockUnavailable",
    "MountsFailed",
    "NamespacesFailed",
    "NamespacesUnavailable",
    "NetworkFailed",
    "NoNewPrivsFailed",
    "NoSuchRun",
    "NotRoot",
    "OutOfMemory",
    "RlimitsFailed",
    "RunInProgress",
    "RunTimeout",
    "SeccompFailed",
    "SeccompUnavailable",
    "SessionBusy",
    "SessionFailed",
    "SessionGone",
    "SessionKilled",
    "SessionsUnavailable",
    "SetgroupsFailed",
    "ShuttingDown",
    "StateRefused",
    "TooManySessions",
    "UidUnavailable",
    "Unauthorized",
    "UnknownSession",
    "UnknownSnapshot",
    "UserNamespaceFailed",
    "VersionMismatch",
    "ZygoteDied",
]

#: Every stable failure code, and its exception class.
CODES: dict[str, type[PycellError]] = {
    cls.code: cls
    for cls in [
        RunTimeout,
        OutOfMemory,
        CpuTimeLimit,
        Cancelled,
        ZygoteDied,
        InvalidPolicy,
        InvalidRequest,
        InvalidConfig,
        UidUnavailable,
        NotRoot,
        JailerUnavailable,
        JailerFailed,
        JailerIo,
        InvalidSpec,
        JailSetupFailed,
        NamespacesUnavailable,
        CgroupUnavailable,
        LandlockUnavailable,
        LandlockAbiTooOld,
        SeccompUnavailable,
        SetgroupsFailed,
        UserNamespaceFailed,
        NamespacesFailed,
        CgroupFailed,
        MountsFailed,
        NetworkFailed,
        RlimitsFailed,
        SessionFailed,
        CapabilitiesFailed,
        NoNewPrivsFailed,
        FileDescriptorsFailed,
        LandlockFailed,
        SeccompFailed,
        ExecFailed,
        DepsInvalid,
        DepsNotAllowed,
        DepsResolutionFailed,
        DepsNoWheel,
        DepsPythonUnsatisfiable,
        DepsIndexUnreachable,
        DepsInstallLimit,
        DepsInstallFailed,
        DepsUnavailable,
        UnknownSession,
        SessionGone,
        SessionKilled,
        SessionBusy,
        TooManySessions,
        SessionsUnavailable,
        FileRefused,
        StateRefused,
        UnknownSnapshot,
        DaemonUnavailable,
        DaemonFailed,
        Unauthorized,
        Busy,
        ShuttingDown,
        VersionMismatch,
        BadMessage,
        FrameTooLarge,
        HandshakeRequired,
        RunInProgress,
        NoSuchRun,
        InternalError,
    ]
}


def error_for(code: str, message: str, *, hint: str | None = None, result: Result | None = None) -> PycellError:
    """The exception for `code` (a code this client does not know yet
    gives a plain PycellError that still carries it)."""
    cls = CODES.get(code)
    if cls is None:
        error = PycellError(message, hint=hint, result=result)
        error.code = code
        return error
    return cls(message, hint=hint, result=result)
