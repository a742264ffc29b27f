//! Landlock inside the jail, after `pivot_root`: read+execute on the
//! interpreter and read-only binds, read on the synthetic /etc, /proc and the
//! random devices, read+write only on /workspace, /tmp and the null devices.
//! Every filesystem right the kernel knows is handled, so anything not granted
//! here is denied. With ABI >= 6 the sandbox is also scoped: no signals to,
//! and no abstract-socket connections into, anything outside it.
//!
//! Fail closed: a kernel ABI below the policy's `min_abi`, or anything short
//! of full enforcement, refuses the run.

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use pycell_syscall as syscall;
use pycell_wire::report::{LandlockReport, LandlockStatus};
use pycell_wire::spec::LandlockSpec;

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("Landlock is not available on this kernel ({0}); pycell needs it. Enable it at boot (lsm=...,landlock) or use a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y")]
    Unavailable(std::io::Error),
    #[error("the kernel's Landlock ABI is {kernel}, the policy requires at least {required} (set landlock.min_abi lower only if you accept weaker file-system confinement)")]
    AbiTooOld { kernel: u32, required: u8 },
    #[error("Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("Landlock was only {0:?} for this ruleset; refusing to run with partial confinement")]
    NotFullyEnforced(RulesetStatus),
}

/// The paths a jail grants, in-jail and absolute.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub read_exec: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    /// With egress: the only TCP port the sandbox may connect to (the
    /// proxy's). Enforced where the kernel has Landlock's network rules
    /// (ABI 4 and up); without egress TCP connects are not handled (the
    /// empty network namespace has nowhere to go but its own loopback).
    pub connect_tcp: Option<u16>,
}

impl Grants {
    /// The caller's grants (`JailSpec::grants`): read, or read and write.
    pub fn add_granted(&mut self, granted: &[pycell_wire::spec::Grant]) {
        for g in granted {
            match g.writable {
                true => self.read_write.push(g.target.clone()),
                false => self.read_only.push(g.target.clone()),
            }
        }
    }

    /// The jailer's own layout plus the policy's extras.
    pub fn for_jail(
        spec: &LandlockSpec,
        mount_targets: &[PathBuf],
        network: pycell_wire::spec::NetworkSpec,
    ) -> Grants {
        let mut read_exec: Vec<PathBuf> = mount_targets.to_vec();
        read_exec.extend(spec.read_exec.iter().cloned());
        let mut read_only: Vec<PathBuf> = ["/etc", "/proc", "/dev/random", "/dev/urandom"]
            .iter()
            .map(PathBuf::from)
            .collect();
        read_only.extend(spec.read_only.iter().cloned());
        let mut read_write: Vec<PathBuf> = [
            pycell_wire::spec::WORKSPACE,
            "/tmp",
            "/dev/shm",
            "/dev/null",
            "/dev/zero",
            "/dev/full",
            "/dev/pts",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        read_write.extend(spec.read_write.iter().cloned());
        let connect_tcp = match network {
            pycell_wire::spec::NetworkSpec::Loopback => None,
            pycell_wire::spec::NetworkSpec::Proxy { port } => Some(port),
        };
        Grants {
            read_exec,
            read_only,
            read_write,
            connect_tcp,
        }
    }
}

fn existing(paths: &[PathBuf]) -> Vec<&Path> {
    // A granted path that does not exist in the jail grants nothing; skipping
    // it is not a weakening.
    paths
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| p.symlink_metadata().is_ok())
        .collect()
}

/// Restrict the calling process (and its future children).
pub fn restrict(min_abi: u8, grants: &Grants) -> Result<LandlockReport, LandlockError> {
    let kernel = syscall::landlock_abi().map_err(LandlockError::Unavailable)?;
    if kernel < u32::from(min_abi) {
        return Err(LandlockError::AbiTooOld {
            kernel,
            required: min_abi,
        });
    }
    let abi = ABI::from(kernel as i32);
    let all: BitFlags<AccessFs> = AccessFs::from_all(abi);
    let read_exec = AccessFs::from_read(abi);
    let read_only = read_exec & !AccessFs::Execute;
    let read_write = all & !(AccessFs::Execute | AccessFs::MakeChar | AccessFs::MakeBlock);

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    if kernel >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi))?;
    }
    let net_port = grants.connect_tcp.filter(|_| kernel >= 4);
    if net_port.is_some() {
        ruleset = ruleset.handle_access(AccessNet::ConnectTcp)?;
    }
    let mut created = ruleset.create()?;
    if let Some(port) = net_port {
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    let status = created
        .add_rules(path_beneath_rules(existing(&grants.read_exec), read_exec))?
        .add_rules(path_beneath_rules(existing(&grants.read_only), read_only))?
        .add_rules(path_beneath_rules(existing(&grants.read_write), read_write))?
        // Listing directories anywhere in the (synthetic) root is harmless and
        // expected (os.listdir("/"), glob); reading files is not granted by it.
        .add_rules(path_beneath_rules(["/"], AccessFs::ReadDir))?
        .restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(LandlockReport {
            abi: abi as u8,
            status: LandlockStatus::FullyEnforced,
            tcp_connect_only_to: net_port,
        }),
        other => Err(LandlockError::NotFullyEnforced(other)),
    }
}
