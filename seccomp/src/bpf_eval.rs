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
            16..=60 if offset.is_multiple_of(4) => {
                let index = ((offset - 16) / 8) as usize;
                half(self.args[index], (offset - 16) % 8 == 4)
            }
            _ => panic!("BPF load from offset {offset} is outside seccomp_data"),
        }
    }
}

/// Runs `program` and returns the seccomp action word it produces.
pub(crate) fn run(program: &[sock_filter], data: &SeccompData) -> u32 {
    trace(program, data).action
}

/// The outcome of one run of a program.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trace {
    pub(crate) action: u32,
    /// Instructions executed, the final `RET` included.
    pub(crate) steps: usize,
    /// Whether the run read a syscall argument (or the instruction pointer).
    pub(crate) read_args: bool,
}

/// Runs `program`, counting what it does on the way.
pub(crate) fn trace(program: &[sock_filter], data: &SeccompData) -> Trace {
    let mut accumulator: u32 = 0;
    let mut pc: usize = 0;
    let mut steps = 0;
    let mut read_args = false;
    loop {
        let instruction = program
            .get(pc)
            .unwrap_or_else(|| panic!("BPF program ran off its end at {pc}"));
        steps += 1;
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
                read_args |= k >= 8;
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
            0x06 => {
                // BPF_RET | BPF_K
                return Trace {
                    action: k,
                    steps,
                    read_args,
                };
            }
            code => panic!("unexpected BPF opcode {code:#x} at {pc}"),
        };
    }
}

/// A model of the kernel's `seccomp_is_const_allow()` (kernel/seccomp.c),
/// which runs when a filter is installed, once per syscall number, to build
/// the bitmap of calls that skip the filter: it emulates the program for
/// `nr` and gives up (`None`) at the first instruction it does not know or
/// that loads anything but `nr` and `arch`. The kernel caches the call only
/// when this reaches `RET ALLOW`; here the action reached is returned.
pub(crate) fn constant_action(program: &[sock_filter], arch: u32, nr: u32) -> Option<u32> {
    let mut accumulator: u32 = 0;
    let mut pc: usize = 0;
    while let Some(instruction) = program.get(pc) {
        let k = instruction.k;
        let jump = |taken: bool| {
            usize::from(if taken {
                instruction.jt
            } else {
                instruction.jf
            })
        };
        match instruction.code {
            0x20 => match k {
                0 => accumulator = nr,
                4 => accumulator = arch,
                _ => return None,
            },
            0x06 => return Some(k),
            0x05 => pc += k as usize,
            0x15 => pc += jump(accumulator == k),
            0x25 => pc += jump(accumulator > k),
            0x35 => pc += jump(accumulator >= k),
            0x45 => pc += jump(accumulator & k != 0),
            0x54 => accumulator &= k,
            _ => return None,
        }
        pc += 1;
    }
    None
}
