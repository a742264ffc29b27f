//! The generated decision tree against the reference, seccompiler's chained
//! programs (`reference.rs`): both are run in `bpf_eval` and must return the
//! same action for every syscall number up to 1024, for x32 and
//! foreign-architecture calls, and for boundary and random argument values
//! of every syscall with argument rules. The embedded programs (what ships)
//! are checked on both architectures, and synthetic profiles cover what the
//! default profile does not use (qword and ordering comparisons, trampolines
//! in a program too long for 8-bit jumps).
//!
//! Also: the tree is small, has the shape the kernel accepts, keeps constant
//! paths short and free of argument loads, so the kernel's install-time
//! emulation can cache every constant call.

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{sock_filter, SeccompCmpOp};

use crate::bpf::{self, Arch, MAX_INSTRUCTIONS, RET_K, X32_SYSCALL_BIT};
use crate::bpf_eval::{self, SeccompData, AUDIT_ARCH_I386, RET_KILL_PROCESS};
use crate::compile::embedded_program;
use crate::generate::generate;
use crate::profile::{Condition, Profile, PROFILES};
use crate::reference::reference;
use crate::tests::{exists_on, syscall_nr};

/// Every number up to this one is tried; both tables end well below it.
const HIGHEST_NR: u32 = 1024;

/// The bound the tree must stay under, per program.
const MAX_TREE_INSTRUCTIONS: usize = 700;

/// The longest path (instructions executed) allowed for a syscall whose
/// outcome does not depend on its arguments.
const MAX_CONSTANT_PATH: usize = 40;

/// A program under test and the reference it must agree with.
struct Subject {
    what: String,
    arch: Arch,
    tree: Vec<sock_filter>,
    reference: Vec<sock_filter>,
    boundaries: BTreeMap<u32, Boundaries>,
}

/// For one syscall with argument rules: per argument index, the values
/// worth trying, and the sets of indices some rule compares together.
#[derive(Default)]
struct Boundaries {
    values: BTreeMap<u8, BTreeSet<u64>>,
    together: BTreeSet<BTreeSet<u8>>,
}

/// Above this many combinations, indices are only combined as rules do.
const MAX_COMBINATIONS: usize = 100_000;

impl Boundaries {
    /// Every combination of the values of the indices a rule compares
    /// together, and of all indices if that is not too many.
    fn combinations(&self) -> Vec<[u64; 6]> {
        let all: BTreeSet<u8> = self.values.keys().copied().collect();
        let size: usize = all.iter().map(|i| self.values[i].len()).product();
        let groups: Vec<&BTreeSet<u8>> = if size <= MAX_COMBINATIONS {
            vec![&all]
        } else {
            self.together.iter().collect()
        };
        let mut vectors = Vec::new();
        for group in groups {
            let mut product = vec![[0u64; 6]];
            for &index in group {
                product = product
                    .iter()
                    .flat_map(|vector| {
                        self.values[&index].iter().map(move |&value| {
                            let mut vector = *vector;
                            vector[usize::from(index)] = value;
                            vector
                        })
                    })
                    .collect();
            }
            vectors.extend(product);
        }
        vectors
    }
}

impl Subject {
    fn new(name: &str, text: &str, arch: Arch, tree: Vec<sock_filter>) -> Subject {
        let reference = reference(name, text, arch).expect("reference compiles");
        Subject {
            what: format!("{name} on {}", arch.name()),
            arch,
            tree,
            reference,
            boundaries: boundaries(name, text, arch),
        }
    }

    /// The embedded program of a built-in profile.
    fn embedded(name: &str, text: &str, arch: Arch) -> Subject {
        let tree = embedded_program(name, arch).expect("every profile is embedded");
        Subject::new(name, text, arch, tree)
    }

    /// A synthetic profile, compiled the way build.rs compiles.
    fn generated(name: &str, text: &str, arch: Arch) -> Subject {
        let tree = generate(name, text, arch).expect("synthetic profile compiles");
        Subject::new(name, text, arch, tree)
    }

    /// Runs both programs; returns the (common) action.
    fn same(&self, audit_arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let data = SeccompData {
            nr,
            arch: audit_arch,
            instruction_pointer: 0x7f00_dead_beef,
            args,
        };
        let expected = bpf_eval::run(&self.reference, &data);
        let got = bpf_eval::run(&self.tree, &data);
        assert_eq!(
            got, expected,
            "{}: tree returns {got:#x}, reference {expected:#x} for arch {audit_arch:#x} \
             nr {nr} args {args:#x?}",
            self.what
        );
        got
    }

    /// Every number, x32 numbers, odd numbers near the x32 bit, and calls
    /// from foreign architectures; arguments all zero, all ones, and random.
    fn check_numbers(&self, random: &mut Random) {
        let native = self.arch.audit();
        for nr in 0..=HIGHEST_NR {
            for args in [[0; 6], [u64::MAX; 6], random.args()] {
                self.same(native, nr, args);
                self.same(native, X32_SYSCALL_BIT | nr, args);
            }
        }
        for nr in [
            X32_SYSCALL_BIT - 1,
            X32_SYSCALL_BIT,
            0x7fff_ffff,
            0x8000_0000,
            u32::MAX,
        ] {
            self.same(native, nr, [0; 6]);
        }
        let other = Arch::ALL.into_iter().find(|a| *a != self.arch).unwrap();
        for audit_arch in [AUDIT_ARCH_I386, other.audit(), 0, u32::MAX, native ^ 1] {
            for nr in [0, 1, 16, 56, 59, 101, 435, HIGHEST_NR, X32_SYSCALL_BIT | 39] {
                assert_eq!(
                    self.same(audit_arch, nr, [0; 6]),
                    RET_KILL_PROCESS,
                    "{}: arch {audit_arch:#x}",
                    self.what
                );
            }
        }
    }

    /// Every combination of the boundary values of a syscall's conditions
    /// (other arguments zero, then all ones). Returns how many calls ran.
    fn check_boundaries(&self) -> usize {
        let mut calls = 0;
        for (&nr, boundaries) in &self.boundaries {
            let mut actions = BTreeSet::new();
            for args in boundaries.combinations() {
                let mut noisy = args;
                for (index, value) in noisy.iter_mut().enumerate() {
                    if !boundaries.values.contains_key(&(index as u8)) {
                        *value = u64::MAX;
                    }
                }
                actions.insert(self.same(self.arch.audit(), nr, args));
                actions.insert(self.same(self.arch.audit(), nr, noisy));
                calls += 2;
            }
            assert!(
                actions.len() > 1,
                "{}: the boundary values of syscall {nr} reach only {actions:x?}",
                self.what
            );
        }
        calls
    }

    /// Random arguments, mixing boundary values and random words, for every
    /// syscall with argument rules.
    fn check_random_arguments(&self, random: &mut Random, per_syscall: usize) {
        for (&nr, boundaries) in &self.boundaries {
            for _ in 0..per_syscall {
                let mut args = random.args();
                for (&index, values) in &boundaries.values {
                    if !random.next().is_multiple_of(4) {
                        let pick = random.next() as usize % values.len();
                        args[usize::from(index)] = *values.iter().nth(pick).unwrap();
                    }
                }
                self.same(self.arch.audit(), nr, args);
            }
        }
    }

    fn check_all(&self) {
        let mut random = Random(0x5eed_1234_abcd_ef01);
        self.check_numbers(&mut random);
        let calls = self.check_boundaries();
        assert!(
            calls > 10 * self.boundaries.len(),
            "{}: {calls} boundary calls",
            self.what
        );
        self.check_random_arguments(&mut random, 2000);
    }
}

/// Per syscall number with argument rules, per argument index, the values
/// worth trying: each condition's value and its neighbours, the value with
/// each bit of a mask flipped and with the bits outside the mask set, and
/// all of these with garbage in the upper 32 bits, plus the extremes.
fn boundaries(name: &str, text: &str, arch: Arch) -> BTreeMap<u32, Boundaries> {
    let profile = Profile::parse(name, text).unwrap();
    let mut boundaries: BTreeMap<u32, Boundaries> = BTreeMap::new();
    for filter in profile.filters.values() {
        for rule in &filter.rules {
            let Some(conditions) = &rule.args else {
                continue;
            };
            if !exists_on(rule.syscall, arch.target()) {
                continue;
            }
            let nr = syscall_nr(rule.syscall, arch.target());
            let entry = boundaries.entry(nr).or_default();
            for condition in conditions {
                entry
                    .values
                    .entry(condition.index)
                    .or_default()
                    .extend(values_around(condition));
            }
            entry
                .together
                .insert(conditions.iter().map(|c| c.index).collect());
        }
    }
    boundaries
}

fn values_around(condition: &Condition) -> BTreeSet<u64> {
    let value = condition.val;
    let mut values = vec![
        0,
        1,
        u64::MAX,
        u64::from(u32::MAX),
        1 << 32,
        1 << 63,
        value,
        value.wrapping_add(1),
        value.wrapping_sub(1),
        value ^ (1 << 32),
        value ^ (1 << 31),
    ];
    if let SeccompCmpOp::MaskedEq(mask) = condition.op {
        values.extend([value & mask, (value & mask) | !mask, mask, !mask]);
        for bit in 0..64 {
            if mask & (1 << bit) != 0 {
                values.push((value & mask) ^ (1 << bit));
            }
        }
    }
    let high_garbage = |v: u64| [v, v | 1 << 32, v | 0xffff_ffff_0000_0000, v & 0xffff_ffff];
    values.into_iter().flat_map(high_garbage).collect()
}

/// xorshift64: deterministic, so a failure reproduces.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn args(&mut self) -> [u64; 6] {
        let mut args = [0; 6];
        for arg in &mut args {
            *arg = match self.next() % 3 {
                0 => self.next(),
                1 => self.next() & 0xffff,
                _ => self.next() & 0xffff_ffff,
            };
        }
        args
    }
}

/// What the kernel checks before it accepts a classic BPF seccomp filter
/// (bpf_check_classic, seccomp_check_filter), for the opcodes we emit.
fn assert_kernel_accepts(what: &str, program: &[sock_filter]) {
    assert!(
        !program.is_empty() && program.len() <= MAX_INSTRUCTIONS,
        "{what}: length"
    );
    assert_eq!(
        program.last().map(|i| i.code),
        Some(RET_K),
        "{what}: the last instruction must be a return"
    );
    for (pc, instruction) in program.iter().enumerate() {
        let after = program.len() - pc - 1;
        match instruction.code {
            bpf::LD_W_ABS => assert!(
                instruction.k < 64 && instruction.k % 4 == 0,
                "{what}: load at {pc} outside seccomp_data"
            ),
            bpf::JA => assert!((instruction.k as usize) < after, "{what}: JA at {pc}"),
            bpf::JEQ_K | bpf::JGT_K | bpf::JGE_K => assert!(
                usize::from(instruction.jt) < after && usize::from(instruction.jf) < after,
                "{what}: jump at {pc} leaves the program"
            ),
            bpf::ALU_AND_K | bpf::RET_K => {}
            code => panic!("{what}: unexpected opcode {code:#x} at {pc}"),
        }
    }
}

// ------------------------------------------------------------- the tests

#[test]
fn embedded_programs_are_what_the_generator_makes_now() {
    for (name, text) in PROFILES {
        for arch in Arch::ALL {
            let embedded = embedded_program(name, arch).expect("embedded");
            let generated = generate(name, text, arch).expect("generates");
            assert_eq!(embedded, generated, "{name} on {}", arch.name());
            assert_eq!(bpf::decode(&bpf::encode(&generated)), generated);
        }
    }
}

#[test]
fn embedded_programs_match_the_reference() {
    for (name, text) in PROFILES {
        for arch in Arch::ALL {
            let subject = Subject::embedded(name, text, arch);
            assert_kernel_accepts(&subject.what, &subject.tree);
            assert!(
                subject.boundaries.len() >= 6,
                "{}: conditional syscalls missing",
                subject.what
            );
            subject.check_all();
        }
    }
}

#[test]
fn embedded_programs_are_small_with_short_constant_paths() {
    for (name, _) in PROFILES {
        for arch in Arch::ALL {
            let tree = embedded_program(name, arch).unwrap();
            let what = format!("{name} on {}", arch.name());
            assert!(
                tree.len() < MAX_TREE_INSTRUCTIONS,
                "{what}: {} instructions",
                tree.len()
            );
            let mut longest = 0;
            for nr in (0..=HIGHEST_NR).chain((0..=HIGHEST_NR).map(|nr| nr | X32_SYSCALL_BIT)) {
                let data = SeccompData {
                    nr,
                    arch: arch.audit(),
                    instruction_pointer: 0,
                    args: [0; 6],
                };
                let trace = bpf_eval::trace(&tree, &data);
                if !trace.read_args {
                    longest = longest.max(trace.steps);
                }
            }
            assert!(
                longest < MAX_CONSTANT_PATH,
                "{what}: a constant syscall runs {longest} instructions"
            );
        }
    }
}

/// Every syscall without argument rules gets its action from the kernel's
/// install-time emulation (so an allowed one is cached and never runs the
/// filter); the ones with argument rules are left to run it.
#[test]
fn kernel_emulation_resolves_every_constant_syscall() {
    for (name, text) in PROFILES {
        for arch in Arch::ALL {
            let subject = Subject::embedded(name, text, arch);
            let mut allowed = 0;
            for nr in 0..=HIGHEST_NR {
                let emulated = bpf_eval::constant_action(&subject.tree, arch.audit(), nr);
                if subject.boundaries.contains_key(&nr) {
                    assert_eq!(
                        emulated, None,
                        "{}: nr {nr} has argument rules",
                        subject.what
                    );
                } else {
                    let action = subject.same(arch.audit(), nr, [0; 6]);
                    assert_eq!(emulated, Some(action), "{}: nr {nr}", subject.what);
                    allowed += usize::from(action == bpf_eval::RET_ALLOW);
                }
                assert_eq!(
                    bpf_eval::constant_action(&subject.tree, AUDIT_ARCH_I386, nr),
                    Some(RET_KILL_PROCESS)
                );
            }
            assert!(allowed > 200, "{}: only {allowed} cached", subject.what);
        }
    }
}

/// Qword and dword conditions with every operator, rules spread over
/// layers with different errnos, a syscall conditional in one layer and
/// unconditional in a later one.
const ALL_OPERATORS: &str = r#"{
  "main": {
    "mismatch_action": { "errno": 38 },
    "match_action": "allow",
    "filter": [
      { "syscall": "read", "comment": "unconditional" },
      { "syscall": "mount", "comment": "unconditional, but denied first" },
      { "syscall": "ioctl", "comment": "qword gt",
        "args": [{ "index": 0, "type": "qword", "op": "gt", "val": 4294967296, "comment": "> 1<<32" }] },
      { "syscall": "ioctl", "comment": "qword ge and le",
        "args": [{ "index": 1, "type": "qword", "op": "ge", "val": 4294967295, "comment": ">= u32::MAX" },
                 { "index": 1, "type": "qword", "op": "le", "val": 8589934597, "comment": "<= 2<<32 | 5" }] },
      { "syscall": "ioctl", "comment": "qword lt",
        "args": [{ "index": 2, "type": "qword", "op": "lt", "val": 7, "comment": "< 7" }] },
      { "syscall": "ioctl", "comment": "qword masked_eq",
        "args": [{ "index": 3, "type": "qword", "op": { "masked_eq": 280375465083135 }, "val": 20014547621428, "comment": "mask 0xff00_0000_00ff, value 0x1234_0000_5634 (bits outside the mask too)" }] },
      { "syscall": "ioctl", "comment": "dword le and ge",
        "args": [{ "index": 4, "type": "dword", "op": "le", "val": 100, "comment": "<= 100" },
                 { "index": 5, "type": "dword", "op": "ge", "val": 50, "comment": ">= 50" }] },
      { "syscall": "ioctl", "comment": "qword ne and dword lt",
        "args": [{ "index": 4, "type": "qword", "op": "ne", "val": 21474836485, "comment": "!= 5<<32 | 5" },
                 { "index": 5, "type": "dword", "op": "lt", "val": 3, "comment": "< 3" }] },
      { "syscall": "fcntl", "comment": "qword eq",
        "args": [{ "index": 0, "type": "qword", "op": "eq", "val": 9223372036854775809, "comment": "1<<63 | 1" }] },
      { "syscall": "fcntl", "comment": "dword gt",
        "args": [{ "index": 2, "type": "dword", "op": "gt", "val": 4294967280, "comment": "> 0xfffffff0" }] }
    ]
  },
  "deny": {
    "mismatch_action": "allow",
    "match_action": { "errno": 1 },
    "filter": [
      { "syscall": "mount", "comment": "unconditional deny" },
      { "syscall": "ioctl", "comment": "qword eq",
        "args": [{ "index": 0, "type": "qword", "op": "eq", "val": 4294967297, "comment": "1<<32 | 1" }] },
      { "syscall": "fcntl", "comment": "dword masked_eq",
        "args": [{ "index": 1, "type": "dword", "op": { "masked_eq": 240 }, "val": 48, "comment": "& 0xf0 == 0x30" }] },
      { "syscall": "write", "comment": "conditional here, unconditional in deny_x",
        "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 2, "comment": "fd 2" }] }
    ]
  },
  "deny_x": {
    "mismatch_action": "allow",
    "match_action": { "errno": 22 },
    "filter": [
      { "syscall": "ioctl", "comment": "dword ge and qword lt",
        "args": [{ "index": 2, "type": "dword", "op": "ge", "val": 3, "comment": ">= 3" },
                 { "index": 2, "type": "qword", "op": "lt", "val": 5, "comment": "< 5" }] },
      { "syscall": "write", "comment": "everything deny left over" }
    ]
  }
}"#;

#[test]
fn every_operator_matches_the_reference() {
    for arch in Arch::ALL {
        let subject = Subject::generated("operators", ALL_OPERATORS, arch);
        assert_kernel_accepts(&subject.what, &subject.tree);
        subject.check_all();
    }
}

/// The default profile plus a deny layer with hundreds of rules on one
/// syscall: too long for 8-bit jump offsets, so the tree needs `JA`
/// trampolines and repeated `RET`s.
#[test]
fn long_programs_with_trampolines_match_the_reference() {
    let mut document: serde_json::Value =
        serde_json::from_str(crate::profile_source("default").unwrap()).unwrap();
    let rules: Vec<serde_json::Value> = (0..300u64)
        .map(|i| {
            serde_json::json!({
                "syscall": "fcntl",
                "comment": "many rules",
                "args": [{ "index": 1, "type": "dword", "op": "eq", "val": 1000 + 7 * i,
                           "comment": "one command" }]
            })
        })
        .collect();
    document.as_object_mut().unwrap().insert(
        "deny_long".to_owned(),
        serde_json::json!({
            "mismatch_action": "allow",
            "match_action": { "errno": 1 },
            "filter": rules,
        }),
    );
    let text = document.to_string();
    for arch in Arch::ALL {
        let subject = Subject::generated("long", &text, arch);
        assert_kernel_accepts(&subject.what, &subject.tree);
        let trampolines = subject.tree.iter().filter(|i| i.code == bpf::JA).count();
        let eperm_returns = subject
            .tree
            .iter()
            .filter(|i| i.code == RET_K && i.k == bpf_eval::ret_errno(libc::EPERM))
            .count();
        assert!(
            trampolines > 0 && eperm_returns > 1,
            "{}: {trampolines} trampolines, {eperm_returns} RET EPERM",
            subject.what
        );
        subject.check_all();
    }
}
