//! Classic BPF as this crate writes it: the few opcodes the generated
//! programs use, the architectures they are built for, and the byte format
//! in which build.rs hands a program to the library.
//!
//! Shared with build.rs (`#[path]`), which encodes; the library decodes.

use seccompiler::{sock_filter, TargetArch};

/// The kernel's limit on instructions in one classic BPF program (BPF_MAXINSNS).
pub(crate) const MAX_INSTRUCTIONS: usize = 4096;

// Opcodes (linux/bpf_common.h). These are exactly the ones the kernel's
// constant-action emulation (seccomp_is_const_allow) understands, so a path
// that loads only `nr` and `arch` is cached by the kernel's bitmap.
pub(crate) const LD_W_ABS: u16 = 0x20;
pub(crate) const ALU_AND_K: u16 = 0x54;
pub(crate) const JA: u16 = 0x05;
pub(crate) const JEQ_K: u16 = 0x15;
pub(crate) const JGT_K: u16 = 0x25;
pub(crate) const JGE_K: u16 = 0x35;
pub(crate) const RET_K: u16 = 0x06;

// Offsets into `struct seccomp_data`.
pub(crate) const DATA_NR: u32 = 0;
pub(crate) const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;

/// Offset of the low (`high == false`) or high 32 bits of argument `index`.
/// Both supported architectures are little-endian, so the low word comes
/// first.
pub(crate) fn arg_word(index: u8, high: bool) -> u32 {
    DATA_ARGS + 8 * u32::from(index) + if high { 4 } else { 0 }
}

pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;
/// SECCOMP_RET_ERRNO; the errno goes in the low 16 bits.
pub(crate) const RET_ERRNO: u32 = 0x0005_0000;

/// One instruction without jumps.
pub(crate) fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// One conditional jump: `jt`/`jf` instructions ahead when true/false.
pub(crate) fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// x32 syscalls reach the filter with the x86_64 audit arch and this bit set
/// in the number.
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The architectures pycell builds filters for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    pub(crate) const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture this crate is compiled for, if it is supported.
    pub(crate) fn native() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// `seccomp_data.arch` of a native call (AUDIT_ARCH_*).
    pub(crate) fn audit(self) -> u32 {
        match self {
            Arch::X86_64 => 0xC000_003E,
            Arch::Aarch64 => 0xC000_00B7,
        }
    }

    pub(crate) fn target(self) -> TargetArch {
        match self {
            Arch::X86_64 => TargetArch::x86_64,
            Arch::Aarch64 => TargetArch::aarch64,
        }
    }

    pub(crate) fn from_target(target: TargetArch) -> Option<Arch> {
        Arch::ALL.into_iter().find(|arch| arch.target() == target)
    }
}

/// Bytes per encoded instruction: `code` (u16), `jt`, `jf` (u8), `k` (u32),
/// little-endian, the same layout as `struct sock_filter`.
const ENCODED_SIZE: usize = 8;

pub(crate) fn encode(program: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * ENCODED_SIZE);
    for instruction in program {
        bytes.extend_from_slice(&instruction.code.to_le_bytes());
        bytes.push(instruction.jt);
        bytes.push(instruction.jf);
        bytes.extend_from_slice(&instruction.k.to_le_bytes());
    }
    bytes
}

/// Decodes what [`encode`] wrote. build.rs only writes whole instructions,
/// so a trailing partial instruction cannot occur; it would be ignored.
pub(crate) fn decode(bytes: &[u8]) -> Vec<sock_filter> {
    bytes
        .chunks_exact(ENCODED_SIZE)
        .map(|b| sock_filter {
            code: u16::from_le_bytes([b[0], b[1]]),
            jt: b[2],
            jf: b[3],
            k: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
        .collect()
}
