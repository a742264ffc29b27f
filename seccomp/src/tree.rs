//! Laying out the final BPF program as a decision tree over syscall numbers.
//!
//! ```text
//! load arch;  arch != native            -> KILL_PROCESS
//! load nr;    nr >= 0x40000000 (x32)    -> the profile's default errno
//! binary search over ranges of numbers that share one outcome (JGE splits,
//! JEQ for a single number inside a range) ending in
//!   RET <action>                    constant outcome, no argument is loaded
//!   the syscall's argument checks   the few calls with rules on arguments
//! ```
//!
//! The kernel runs the program for every call whose outcome is not cached,
//! and when the filter is installed it emulates the program once per syscall
//! number to find the calls that are always allowed. A linear chain makes
//! both cost hundreds of instructions; the tree costs about a dozen on
//! constant paths, whose instructions (loads of `nr`/`arch`, JEQ/JGE, RET)
//! the emulation understands.
//!
//! The program is emitted back to front, so every jump target already has a
//! position: `RET`s are shared by the jumps within reach (a conditional jump
//! reaches 255 instructions), and a `JA` trampoline is inserted where a
//! subtree is too far away.

use std::collections::{BTreeMap, HashMap};

use seccompiler::{sock_filter, SeccompCmpArgLen, SeccompCmpOp};

use crate::bpf::{
    arg_word, ALU_AND_K, DATA_ARCH, DATA_NR, JA, JEQ_K, JGE_K, JGT_K, LD_W_ABS, RET_K,
    RET_KILL_PROCESS, X32_SYSCALL_BIT,
};
use crate::profile::Condition;

/// What the program does for one listed syscall number.
#[derive(Debug)]
pub(crate) enum Decision<'p> {
    /// Always the same action, whatever the arguments.
    Constant(u32),
    /// The steps in order (the first whose rules match decides), then
    /// `otherwise`.
    Check {
        steps: Vec<Step<'p>>,
        otherwise: u32,
    },
}

/// One layer's rules for one syscall: if any rule (all its conditions)
/// matches, the result is `action`.
#[derive(Debug)]
pub(crate) struct Step<'p> {
    pub(crate) rules: Vec<&'p [Condition]>,
    pub(crate) action: u32,
}

/// The outcome of a range of syscall numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Action(u32),
    /// The argument checks of this syscall number.
    Check(u32),
}

#[derive(Debug, Clone, Copy)]
struct Range {
    start: u32,
    end: u32,
    outcome: Outcome,
}

/// Builds the program for `decisions`; unlisted numbers get `default`.
/// All numbers must be below [`X32_SYSCALL_BIT`].
pub(crate) fn build(
    audit_arch: u32,
    default: u32,
    decisions: &BTreeMap<u32, Decision<'_>>,
) -> Vec<sock_filter> {
    let ranges = ranges(default, decisions);
    let mut emitter = Emitter::default();
    // The kernel requires the last instruction to be a return.
    emitter.ret(default);
    let root = emitter.node(&ranges, decisions);
    emitter.jump(JGE_K, X32_SYSCALL_BIT, Target::Ret(default), root);
    let load_nr = Target::At(emitter.stmt(LD_W_ABS, DATA_NR));
    emitter.jump(JEQ_K, audit_arch, load_nr, Target::Ret(RET_KILL_PROCESS));
    emitter.stmt(LD_W_ABS, DATA_ARCH);
    emitter.reversed.reverse();
    emitter.reversed
}

/// Splits `0..X32_SYSCALL_BIT` into maximal runs of numbers with the same
/// outcome. Numbers with argument checks are runs of their own.
fn ranges(default: u32, decisions: &BTreeMap<u32, Decision<'_>>) -> Vec<Range> {
    let mut ranges: Vec<Range> = Vec::new();
    let mut push = |start: u32, end: u32, outcome: Outcome| {
        if let Some(last) = ranges.last_mut() {
            if last.outcome == outcome && matches!(outcome, Outcome::Action(_)) {
                last.end = end;
                return;
            }
        }
        ranges.push(Range {
            start,
            end,
            outcome,
        });
    };
    let mut next = 0;
    for (&nr, decision) in decisions {
        assert!(
            nr < X32_SYSCALL_BIT,
            "syscall number {nr:#x} overlaps the x32 bit"
        );
        if nr > next {
            push(next, nr, Outcome::Action(default));
        }
        let outcome = match decision {
            Decision::Constant(action) => Outcome::Action(*action),
            Decision::Check { .. } => Outcome::Check(nr),
        };
        push(nr, nr + 1, outcome);
        next = nr + 1;
    }
    if next < X32_SYSCALL_BIT {
        push(next, X32_SYSCALL_BIT, Outcome::Action(default));
    }
    ranges
}

/// Where a jump goes: a return of some action (any `RET` of it within
/// reach will do) or a given instruction.
#[derive(Debug, Clone, Copy)]
enum Target {
    Ret(u32),
    /// Index into `Emitter::reversed`.
    At(usize),
}

/// Emits instructions back to front into `reversed`.
#[derive(Debug, Default)]
struct Emitter {
    reversed: Vec<sock_filter>,
    /// For each action, the position of the closest `RET` of it emitted so
    /// far (the latest one, since emission goes backwards).
    closest_ret: HashMap<u32, usize>,
}

/// The exceptions a leaf may test with JEQ before its base outcome.
const MAX_LEAF_EXCEPTIONS: usize = 2;

impl Emitter {
    /// Emits an instruction that falls through to the one emitted just before.
    fn stmt(&mut self, code: u16, k: u32) -> usize {
        self.reversed.push(sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        });
        self.reversed.len() - 1
    }

    fn ret(&mut self, action: u32) -> usize {
        let at = self.stmt(RET_K, action);
        self.closest_ret.insert(action, at);
        at
    }

    /// The jump offset from the next instruction to `target`, if a
    /// conditional jump can reach it.
    fn reach(&self, target: Target) -> Option<u8> {
        let at = match target {
            Target::Ret(action) => *self.closest_ret.get(&action)?,
            Target::At(at) => at,
        };
        u8::try_from(self.reversed.len() - at - 1).ok()
    }

    /// Puts `target` right next to the instruction about to be emitted.
    fn bring_near(&mut self, target: Target) -> Target {
        match target {
            Target::Ret(action) => {
                self.ret(action);
                target
            }
            Target::At(at) => {
                let distance = self.reversed.len() - at - 1;
                let distance = u32::try_from(distance).expect("programs are short");
                Target::At(self.stmt(JA, distance))
            }
        }
    }

    /// Emits a conditional jump, adding a `RET` or `JA` after it where a
    /// target is out of reach.
    fn jump(&mut self, code: u16, k: u32, jt: Target, jf: Target) -> Target {
        let (mut jt, mut jf) = (jt, jf);
        loop {
            match (self.reach(jt), self.reach(jf)) {
                (Some(jt), Some(jf)) => {
                    self.reversed.push(sock_filter { code, jt, jf, k });
                    return Target::At(self.reversed.len() - 1);
                }
                (None, _) => jt = self.bring_near(jt),
                (_, None) => jf = self.bring_near(jf),
            }
        }
    }

    /// The search over `ranges` (sorted, contiguous).
    fn node(&mut self, ranges: &[Range], decisions: &BTreeMap<u32, Decision<'_>>) -> Target {
        if let [only] = ranges {
            return self.outcome(only.outcome, decisions);
        }
        if let Some((base, exceptions)) = exceptions(ranges) {
            let mut next = self.outcome(base, decisions);
            for exception in exceptions.iter().rev() {
                let hit = self.outcome(exception.outcome, decisions);
                next = self.jump(JEQ_K, exception.start, hit, next);
            }
            return next;
        }
        let middle = ranges.len() / 2;
        let above = self.node(&ranges[middle..], decisions);
        let below = self.node(&ranges[..middle], decisions);
        self.jump(JGE_K, ranges[middle].start, above, below)
    }

    fn outcome(&mut self, outcome: Outcome, decisions: &BTreeMap<u32, Decision<'_>>) -> Target {
        match outcome {
            Outcome::Action(action) => Target::Ret(action),
            Outcome::Check(nr) => match &decisions[&nr] {
                Decision::Constant(action) => Target::Ret(*action),
                Decision::Check { steps, otherwise } => self.checks(steps, *otherwise),
            },
        }
    }

    /// The argument checks of one syscall: steps in order, each an OR of
    /// rules, each rule an AND of conditions.
    fn checks(&mut self, steps: &[Step<'_>], otherwise: u32) -> Target {
        let mut next = Target::Ret(otherwise);
        for step in steps.iter().rev() {
            for rule in step.rules.iter().rev() {
                let mut entry = Target::Ret(step.action);
                for condition in rule.iter().rev() {
                    entry = self.condition(condition, entry, next);
                }
                next = entry;
            }
        }
        next
    }

    /// One condition, with seccompiler's semantics: a dword compares the low
    /// 32 bits of the argument with the low 32 bits of the value (and mask);
    /// a qword compares all 64 bits, unsigned.
    fn condition(&mut self, condition: &Condition, pass: Target, fail: Target) -> Target {
        let index = condition.index;
        let value = condition.val;
        let (high, low) = ((value >> 32) as u32, value as u32);
        let qword = matches!(condition.arg_len, SeccompCmpArgLen::Qword);
        match condition.op {
            SeccompCmpOp::MaskedEq(mask) => {
                let masked = value & mask;
                let low_check = self.masked(index, false, mask as u32, masked as u32, pass, fail);
                if !qword {
                    return low_check;
                }
                let (mask, masked) = ((mask >> 32) as u32, (masked >> 32) as u32);
                self.masked(index, true, mask, masked, low_check, fail)
            }
            SeccompCmpOp::Eq => {
                let low_check = self.compare(index, false, JEQ_K, low, pass, fail);
                if !qword {
                    return low_check;
                }
                self.compare(index, true, JEQ_K, high, low_check, fail)
            }
            SeccompCmpOp::Ne => {
                let low_check = self.compare(index, false, JEQ_K, low, fail, pass);
                if !qword {
                    return low_check;
                }
                self.compare(index, true, JEQ_K, high, low_check, pass)
            }
            // x > v:  hi > vh, or hi == vh and lo > vl (>= for Ge).
            SeccompCmpOp::Gt | SeccompCmpOp::Ge => {
                let op = if matches!(condition.op, SeccompCmpOp::Gt) {
                    JGT_K
                } else {
                    JGE_K
                };
                let low_check = self.compare(index, false, op, low, pass, fail);
                if !qword {
                    return low_check;
                }
                let equal = self.jump(JEQ_K, high, low_check, fail);
                self.compare(index, true, JGT_K, high, pass, equal)
            }
            // x < v is !(x >= v); x <= v is !(x > v).
            SeccompCmpOp::Lt | SeccompCmpOp::Le => {
                let op = if matches!(condition.op, SeccompCmpOp::Lt) {
                    JGE_K
                } else {
                    JGT_K
                };
                let low_check = self.compare(index, false, op, low, fail, pass);
                if !qword {
                    return low_check;
                }
                let equal = self.jump(JEQ_K, high, low_check, pass);
                self.compare(index, true, JGT_K, high, fail, equal)
            }
        }
    }

    /// `load word; jump op k`.
    fn compare(
        &mut self,
        index: u8,
        high: bool,
        op: u16,
        k: u32,
        jt: Target,
        jf: Target,
    ) -> Target {
        self.jump(op, k, jt, jf);
        Target::At(self.stmt(LD_W_ABS, arg_word(index, high)))
    }

    /// `load word; and mask; jeq value`.
    fn masked(
        &mut self,
        index: u8,
        high: bool,
        mask: u32,
        value: u32,
        pass: Target,
        fail: Target,
    ) -> Target {
        self.jump(JEQ_K, value, pass, fail);
        self.stmt(ALU_AND_K, mask);
        Target::At(self.stmt(LD_W_ABS, arg_word(index, high)))
    }
}

/// If `ranges` is one outcome interrupted by at most
/// [`MAX_LEAF_EXCEPTIONS`] single numbers, returns that outcome and the
/// exceptions; a short chain of JEQs then beats further JGE splits.
fn exceptions(ranges: &[Range]) -> Option<(Outcome, Vec<Range>)> {
    if ranges.len().is_multiple_of(2) || ranges.len() > 2 * MAX_LEAF_EXCEPTIONS + 1 {
        return None;
    }
    let base = ranges[0].outcome;
    let mut exceptions = Vec::new();
    for (position, range) in ranges.iter().enumerate() {
        if position % 2 == 0 {
            if range.outcome != base {
                return None;
            }
        } else if range.end - range.start == 1 {
            exceptions.push(*range);
        } else {
            return None;
        }
    }
    Some((base, exceptions))
}
