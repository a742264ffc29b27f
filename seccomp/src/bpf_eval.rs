//! A tiny classic-BPF interpreter for tests: runs a compiled program against
//! a synthetic `seccomp_data` so argument checks (masked 32-bit compares,
//! clone flags, layer precedence) can be verified without installing the
//! filter. It knows only the instructions seccompiler emits and panics on any
//! other, so a change in seccompiler's output shows up as a test failure.

use seccompiler::sock_filter;

pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
pub(crate) const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
pub(crate) const AUDIT_ARCH_I386: u32 = 0x4000_0003;

pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;

pub(crate) const fn ret_errno(errno: i32) -> u32 {
    0x0005_0000 | (errno as u32 & 0xffff)
}

/// The fields of `struct seccomp_data` the filter can read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeccompData {
    pub(crate) nr: u32,
    pub(crate) arch: u32,
    pub(crate) instruction_pointer: u64,
    pub(crate) args: [u64; 6],
}

impl SeccompData {
    fn word_at(&self, offset: u32) -> u32 {
        let half = |value: u64, high: bool| {
            if high {
                (value >> 32) as u32
            } else {
                value as u32
            }
        };
        match offset {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => half(self.instruction_pointer, offset == 12),
            16..=60 if offset % 4 == 0 => {
                let index = ((offset - 16) / 8) as usize;
                half(self.args[index], (offset - 16) % 8 == 4)
            }
            _ => panic!("BPF load from offset {offset} is outside seccomp_data"),
        }
    }
}

/// Runs `program` and returns the seccomp action word it produces.
pub(crate) fn run(program: &[sock_filter], data: &SeccompData) -> u32 {
    let mut accumulator: u32 = 0;
    let mut pc: usize = 0;
    loop {
        let instruction = program
            .get(pc)
            .unwrap_or_else(|| panic!("BPF program ran off its end at {pc}"));
        let k = instruction.k;
        let branch = |taken: bool| {
            1 + usize::from(if taken {
                instruction.jt
            } else {
                instruction.jf
            })
        };
        pc += match instruction.code {
            0x20 => {
                // BPF_LD | BPF_W | BPF_ABS
                accumulator = data.word_at(k);
                1
            }
            0x54 => {
                // BPF_ALU | BPF_AND | BPF_K
                accumulator &= k;
                1
            }
            0x05 => 1 + k as usize,               // BPF_JMP | BPF_JA
            0x15 => branch(accumulator == k),     // BPF_JMP | BPF_JEQ | BPF_K
            0x25 => branch(accumulator > k),      // BPF_JMP | BPF_JGT | BPF_K
            0x35 => branch(accumulator >= k),     // BPF_JMP | BPF_JGE | BPF_K
            0x45 => branch(accumulator & k != 0), // BPF_JMP | BPF_JSET | BPF_K
            0x06 => return k,                     // BPF_RET | BPF_K
            code => panic!("unexpected BPF opcode {code:#x} at {pc}"),
        };
    }
}
