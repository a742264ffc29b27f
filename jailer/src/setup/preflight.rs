//! What must hold before the jailer creates anything: checked first, so
//! that a run that cannot be jailed as its spec says is refused before any
//! namespace, cgroup or mount exists.

use pycell_host::cgroup::CgroupLayout;
use pycell_seccomp::{CompiledFilter, KernelGap};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use pycell_wire::spec::JailSpec;

use crate::setup::sources::{self, SourceId};

/// What preflight established, for the clone.
pub(crate) struct Checked {
    pub filter: CompiledFilter,
    /// What `filter` refuses on top of its profile for this kernel.
    pub gaps: Vec<KernelGap>,
    pub layout: CgroupLayout,
    /// Where each of `spec.mounts` leads, checked on the host.
    pub sources: Vec<SourceId>,
    /// A cold run's compiled runner, opened for reading.
    pub runner_pyc: Option<std::os::fd::OwnedFd>,
}

fn check_sources(spec: &JailSpec) -> Result<Vec<SourceId>, JailFailure> {
    spec.mounts
        .iter()
        .map(|m| {
            sources::check_on_host(&m.source).map_err(|e| {
                JailFailure::new(FailureCode::MountsFailed, Layer::Mounts, e.to_string())
                    .with_hint("bind only root-owned directories (/usr, a venv made by root, ...); move or chown the source, or remove the mount from the policy")
            })
        })
        .collect()
}

/// What must hold before anything is created: a valid spec, root, a
/// compilable seccomp profile, a usable cgroup layout, bind sources that
/// are root's.
pub(crate) fn preflight(spec: &JailSpec) -> Result<Checked, JailFailure> {
    spec.validate()
        .map_err(|e| JailFailure::new(FailureCode::InvalidSpec, Layer::Jailer, e.to_string()))?;
    if !nix::unistd::geteuid().is_root() {
        return Err(JailFailure::new(
            FailureCode::NotRoot,
            Layer::Jailer,
            "pycell-jailer must run as root (it creates cgroups and maps a sandbox uid)",
        )
        .with_hint("run pycell as root, or through the pycelld service"));
    }
    let filter = pycell_seccomp::compile(&spec.seccomp_profile).map_err(|e| {
        JailFailure::new(
            FailureCode::SeccompUnavailable,
            Layer::Seccomp,
            e.to_string(),
        )
    })?;
    let gaps = Vec::new();
    let layout = CgroupLayout::detect().map_err(cgroup_failure)?;
    let sources = check_sources(spec)?;
    let runner_pyc = match &spec.runner_pyc {
        Some(path) => Some(
            sources::open_trusted_file(path, pycell_wire::spec::MAX_RUNNER_PYC).map_err(|e| {
                JailFailure::new(FailureCode::MountsFailed, Layer::Mounts, e.to_string())
                    .with_hint("a compiled runner is root's, in a directory only root may change; pycell makes it so in /var/cache/pycell/runner (remove the directory to have it made again)")
            })?,
        ),
        None => None,
    };
    Ok(Checked {
        filter,
        gaps,
        layout,
        sources,
        runner_pyc,
    })
}

pub(crate) fn cgroup_failure(e: pycell_host::cgroup::CgroupError) -> JailFailure {
    JailFailure::new(FailureCode::CgroupUnavailable, Layer::Cgroup, e.to_string())
}
