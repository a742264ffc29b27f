//! The compiled filters: programs built from the profiles by build.rs
//! (see `generate.rs` and `tree.rs`) and embedded in the binary, one per
//! profile and architecture. Compiling a profile at run time only decodes
//! the embedded bytes for the running architecture.
//!
//! One program rather than several stacked filters keeps the precedence of
//! deny over allow in our hands (stacked filters that both return an errno
//! resolve by install order, a kernel detail) and costs one `seccomp()` call.

use std::fmt;

use seccompiler::{sock_filter, BpfProgram};

use crate::bpf::{self, Arch};
use crate::profile;
use crate::SeccompError;

/// The embedded programs of one profile.
struct Programs {
    profile: &'static str,
    x86_64: &'static [u8],
    aarch64: &'static [u8],
}

// `const PROGRAMS: &[Programs]`, one entry per profile in `profile::PROFILES`,
// written by build.rs.
include!(concat!(env!("OUT_DIR"), "/programs.rs"));

/// A profile compiled to a BPF program for the running architecture, ready
/// for [`crate::apply`]. Compiling allocates; applying does not, so the jailer
/// compiles before it clones the sandbox.
#[derive(Clone)]
pub struct CompiledFilter {
    profile: &'static str,
    arch: &'static str,
    program: BpfProgram,
}

impl CompiledFilter {
    /// Number of BPF instructions in the program (at most 4096).
    pub fn instruction_count(&self) -> usize {
        self.program.len()
    }

    /// Name of the profile this filter was compiled from, for reporting which
    /// layers a run enforced.
    pub fn profile(&self) -> &'static str {
        self.profile
    }

    /// Architecture the program checks for (`x86_64` or `aarch64`).
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    pub(crate) fn program(&self) -> &[sock_filter] {
        &self.program
    }

    /// This filter with the calls of `gap` refused in front of it, for a
    /// kernel on which they would open a hole the other layers do not close
    /// (see [`KernelGap`]). Each call costs two instructions after one load
    /// of the syscall number; they read nothing else, so the kernel still
    /// caches the verdict for every other call.
    pub fn with_refused(&self, gap: KernelGap) -> CompiledFilter {
        let errno = bpf::RET_ERRNO | gap.errno() as u32;
        let mut program = vec![bpf::stmt(bpf::LD_W_ABS, bpf::DATA_NR)];
        for &(_, nr) in gap.calls() {
            program.push(bpf::jump(bpf::JEQ_K, nr as u32, 0, 1));
            program.push(bpf::stmt(bpf::RET_K, errno));
        }
        program.extend_from_slice(&self.program);
        CompiledFilter {
            profile: self.profile,
            arch: self.arch,
            program,
        }
    }
}

/// Calls a profile allows that some kernels let the jail misuse; the
/// jailer refuses them on those kernels only ([`CompiledFilter::with_refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelGap {
    /// The kernel lets an unprivileged process set `security.*` (or
    /// `trusted.*`) attributes on the jail's own files (seen on Debian 12's
    /// 6.1, whose BPF LSM answers the xattr hook before the capability
    /// check). Seccomp cannot read the attribute's name, so every xattr write
    /// fails with `EOPNOTSUPP`, what a filesystem without xattrs answers.
    SecurityXattrs,
}

impl KernelGap {
    /// The calls refused, by name and number for the running architecture.
    pub fn calls(self) -> &'static [(&'static str, i64)] {
        match self {
            KernelGap::SecurityXattrs => &[
                ("setxattr", libc::SYS_setxattr),
                ("lsetxattr", libc::SYS_lsetxattr),
                ("fsetxattr", libc::SYS_fsetxattr),
                ("removexattr", libc::SYS_removexattr),
                ("lremovexattr", libc::SYS_lremovexattr),
                ("fremovexattr", libc::SYS_fremovexattr),
            ],
        }
    }

    /// The errno the refused calls fail with.
    pub fn errno(self) -> i32 {
        match self {
            KernelGap::SecurityXattrs => libc::EOPNOTSUPP,
        }
    }
}

impl fmt::Debug for CompiledFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledFilter")
            .field("profile", &self.profile)
            .field("arch", &self.arch)
            .field("instructions", &self.program.len())
            .finish()
    }
}

/// The architecture this crate was built for.
fn native_arch() -> Result<Arch, SeccompError> {
    Arch::native().ok_or(SeccompError::UnsupportedArch {
        arch: std::env::consts::ARCH,
    })
}

pub(crate) fn compile(profile: &str) -> Result<CompiledFilter, SeccompError> {
    let arch = native_arch()?;
    let programs = PROGRAMS
        .iter()
        .find(|programs| programs.profile == profile)
        .ok_or_else(|| SeccompError::UnknownProfile {
            name: profile.to_owned(),
            known: profile::names(),
        })?;
    Ok(CompiledFilter {
        profile: programs.profile,
        arch: arch.name(),
        program: bpf::decode(embedded(programs, arch)),
    })
}

fn embedded(programs: &Programs, arch: Arch) -> &'static [u8] {
    match arch {
        Arch::X86_64 => programs.x86_64,
        Arch::Aarch64 => programs.aarch64,
    }
}

/// The embedded program of a profile for `arch`, as shipped.
#[cfg(test)]
pub(crate) fn embedded_program(profile: &str, arch: Arch) -> Option<Vec<sock_filter>> {
    let programs = PROGRAMS.iter().find(|p| p.profile == profile)?;
    Some(bpf::decode(embedded(programs, arch)))
}

/// Compiles profile text for another architecture or a synthetic profile,
/// the way build.rs compiles the embedded ones.
#[cfg(test)]
pub(crate) fn compile_text(
    name: &'static str,
    text: &str,
    arch: seccompiler::TargetArch,
    arch_name: &'static str,
) -> Result<CompiledFilter, SeccompError> {
    let arch = Arch::from_target(arch)
        .filter(|arch| arch.name() == arch_name)
        .ok_or(SeccompError::UnsupportedArch { arch: arch_name })?;
    Ok(CompiledFilter {
        profile: name,
        arch: arch.name(),
        program: crate::generate::generate(name, text, arch)?,
    })
}
