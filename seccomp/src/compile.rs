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
    /// Every syscall the profile names, by number, sorted.
    x86_64_names: &'static [(u32, &'static str)],
    aarch64_names: &'static [(u32, &'static str)],
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
    /// The syscalls the profile names, by number (for naming a refused one).
    names: &'static [(u32, &'static str)],
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
            names: self.names,
        }
    }

    /// This filter with every call it refuses with `EPERM` handed to a
    /// supervisor instead (`SECCOMP_RET_USER_NOTIF`): installed with a
    /// listener, whose holder (the jailer) answers each with `EPERM` and
    /// so learns which calls the sandbox was refused. Only those return
    /// instructions change: every allowed call, and every other refusal
    /// (`ENOSYS` for what the profile does not list, the socket families'
    /// errnos, a kernel gap's), takes the same path as before, at the
    /// same cost. Without a listener the kernel fails the handed-over
    /// calls with `ENOSYS`.
    pub fn notifying(&self) -> CompiledFilter {
        let eperm = bpf::RET_ERRNO | libc::EPERM as u32;
        let mut program = self.program.clone();
        for insn in program.iter_mut() {
            if insn.code == bpf::RET_K && insn.k == eperm {
                insn.k = libc::SECCOMP_RET_USER_NOTIF;
            }
        }
        CompiledFilter {
            program,
            ..self.clone()
        }
    }

    /// The program as the kernel's `seccomp()` takes it.
    pub fn kernel_program(&self) -> Vec<libc::sock_filter> {
        self.program
            .iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect()
    }

    /// The name of syscall `nr` on this filter's architecture, if the
    /// profile names it.
    pub fn syscall_name(&self, nr: u32) -> Option<&'static str> {
        self.syscall_names().name(nr)
    }

    /// The names of the syscalls the profile names, by number, to keep.
    pub fn syscall_names(&self) -> SyscallNames {
        SyscallNames(self.names)
    }
}

/// The syscalls a profile names, by number on one architecture.
#[derive(Debug, Clone, Copy)]
pub struct SyscallNames(&'static [(u32, &'static str)]);

impl SyscallNames {
    /// The name of syscall `nr`, if the profile names it.
    pub fn name(self, nr: u32) -> Option<&'static str> {
        let i = self.0.binary_search_by_key(&nr, |&(n, _)| n).ok()?;
        Some(self.0[i].1)
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
        names: embedded_names(programs, arch),
    })
}

fn embedded(programs: &Programs, arch: Arch) -> &'static [u8] {
    match arch {
        Arch::X86_64 => programs.x86_64,
        Arch::Aarch64 => programs.aarch64,
    }
}

fn embedded_names(programs: &Programs, arch: Arch) -> &'static [(u32, &'static str)] {
    match arch {
        Arch::X86_64 => programs.x86_64_names,
        Arch::Aarch64 => programs.aarch64_names,
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
        names: &[],
    })
}
