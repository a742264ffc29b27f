//! Compiling a profile into one BPF program.
//!
//! seccompiler compiles each filter of the profile separately. Every filter
//! starts with its own architecture check (a foreign `seccomp_data.arch` kills
//! the process) and ends in `RET` instructions. To get a single program, the
//! deny layers are laid out first and each of their `RET ALLOW` ("this layer
//! does not deny the call") is rewritten into a forward jump to the next
//! layer; `main`, the allowlist, comes last and decides everything the deny
//! layers let through. A deny therefore always wins over an allow.
//!
//! One program rather than several stacked filters keeps the precedence in
//! our hands (stacked filters that both return an errno resolve by install
//! order, a kernel detail) and costs one `seccomp()` call.

use std::borrow::Cow;
use std::fmt;

use seccompiler::{sock_filter, BpfProgram, TargetArch};

use crate::profile::{self, Profile};
use crate::SeccompError;

/// The kernel's limit on instructions in one classic BPF program (BPF_MAXINSNS).
pub(crate) const MAX_INSTRUCTIONS: usize = 4096;

// Classic BPF opcodes (linux/bpf_common.h) needed to rewrite returns.
const BPF_RET_K: u16 = 0x06;
const BPF_JMP_JA: u16 = 0x05;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

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

/// The architecture this crate was built for, as seccompiler names it.
pub(crate) fn native_arch() -> Result<(TargetArch, &'static str), SeccompError> {
    if cfg!(target_arch = "x86_64") {
        Ok((TargetArch::x86_64, "x86_64"))
    } else if cfg!(target_arch = "aarch64") {
        Ok((TargetArch::aarch64, "aarch64"))
    } else {
        Err(SeccompError::UnsupportedArch {
            arch: std::env::consts::ARCH,
        })
    }
}

pub(crate) fn compile(profile: &str) -> Result<CompiledFilter, SeccompError> {
    let (arch, arch_name) = native_arch()?;
    let (name, text) = profile::lookup(profile)?;
    compile_text(name, text, arch, arch_name)
}

/// Compiles profile text for `arch`; separate from [`compile`] so tests can
/// target another architecture or feed a synthetic profile.
pub(crate) fn compile_text(
    name: &'static str,
    text: &str,
    arch: TargetArch,
    arch_name: &'static str,
) -> Result<CompiledFilter, SeccompError> {
    let profile = Profile::parse(name, text)?;
    let text = text_for_arch(name, text, arch)?;
    let compile_error = |source| SeccompError::Compile {
        profile: name.to_owned(),
        arch: arch_name,
        source,
    };
    let mut programs =
        seccompiler::compile_from_json(text.as_bytes(), arch).map_err(compile_error)?;

    let mut program = BpfProgram::new();
    let layers = profile.layer_names();
    let last = layers.len() - 1;
    for (position, layer) in layers.into_iter().enumerate() {
        let code = programs
            .remove(layer)
            .ok_or_else(|| SeccompError::InvalidProfile {
                profile: name.to_owned(),
                reason: format!("seccompiler produced no program for filter \"{layer}\""),
            })?;
        let start = program.len();
        let end = start + code.len();
        for (offset, instruction) in code.into_iter().enumerate() {
            let falls_through = position != last
                && instruction.code == BPF_RET_K
                && instruction.k == SECCOMP_RET_ALLOW;
            if falls_through {
                // Jump offsets count from the next instruction.
                let distance = end - (start + offset) - 1;
                program.push(sock_filter {
                    code: BPF_JMP_JA,
                    jt: 0,
                    jf: 0,
                    k: u32::try_from(distance).expect("a layer is shorter than 4096 instructions"),
                });
            } else {
                program.push(instruction);
            }
        }
    }

    if program.len() > MAX_INSTRUCTIONS {
        return Err(SeccompError::TooLarge {
            profile: name.to_owned(),
            instructions: program.len(),
            limit: MAX_INSTRUCTIONS,
        });
    }
    Ok(CompiledFilter {
        profile: name,
        arch: arch_name,
        program,
    })
}

/// On aarch64, drops rules for syscalls that only exist on x86_64; elsewhere
/// the text is used as written.
fn text_for_arch<'t>(
    name: &str,
    text: &'t str,
    arch: TargetArch,
) -> Result<Cow<'t, str>, SeccompError> {
    if arch != TargetArch::aarch64 {
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
                    !NOT_ON_AARCH64.contains(&syscall)
                });
            }
        }
    }
    Ok(Cow::Owned(document.to_string()))
}
