//! Unit tests: profile structure, the explicit deny list, and the compiled
//! program's decisions evaluated with `bpf_eval` (no filter is installed).

use std::collections::BTreeSet;

use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, TargetArch};

use crate::bpf::MAX_INSTRUCTIONS;
use crate::bpf_eval::{
    self, ret_errno, SeccompData, AUDIT_ARCH_AARCH64, AUDIT_ARCH_I386, AUDIT_ARCH_X86_64,
    RET_ALLOW, RET_KILL_PROCESS,
};
use crate::compile::{compile_text, CompiledFilter};
use crate::profile::{Condition, Profile, MAIN_FILTER};
use crate::{denials, denied_syscalls, profile_names, profile_source, Denial, SeccompError};

const EPERM: i32 = libc::EPERM;
const ENOSYS: i32 = libc::ENOSYS;
const EAFNOSUPPORT: i32 = libc::EAFNOSUPPORT;

const ARCHES: [(TargetArch, &str, u32); 2] = [
    (TargetArch::x86_64, "x86_64", AUDIT_ARCH_X86_64),
    (TargetArch::aarch64, "aarch64", AUDIT_ARCH_AARCH64),
];

fn default_text() -> &'static str {
    profile_source("default").expect("default profile is embedded")
}

fn default_for(arch: TargetArch, arch_name: &'static str) -> CompiledFilter {
    compile_text("default", default_text(), arch, arch_name).expect("default profile compiles")
}

/// The syscall number seccompiler uses for `name` on `arch`, read back from
/// a one-rule filter so the tests share seccompiler's table instead of
/// keeping their own.
pub(crate) fn syscall_nr(name: &str, arch: TargetArch) -> u32 {
    let json = format!(
        r#"{{"f": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
                    "filter": [{{"syscall": "{name}"}}]}}}}"#
    );
    let programs = seccompiler::compile_from_json(json.as_bytes(), arch)
        .unwrap_or_else(|e| panic!("{name} is not a syscall on {arch:?}: {e}"));
    let program = &programs["f"];
    // arch check (3 instructions), load nr, then the comparison with the number.
    assert_eq!(program[4].code, 0x15, "unexpected seccompiler layout");
    program[4].k
}

fn eval(filter: &CompiledFilter, audit_arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let data = SeccompData {
        nr,
        arch: audit_arch,
        instruction_pointer: 0x7f00_dead_beef,
        args,
    };
    bpf_eval::run(filter.program(), &data)
}

fn x86(name: &str, args: [u64; 6]) -> u32 {
    let filter = default_for(TargetArch::x86_64, "x86_64");
    eval(
        &filter,
        AUDIT_ARCH_X86_64,
        syscall_nr(name, TargetArch::x86_64),
        args,
    )
}

fn args1(a0: u64) -> [u64; 6] {
    [a0, 0, 0, 0, 0, 0]
}

// ---------------------------------------------------------------- structure

#[test]
fn default_profile_compiles_for_x86_64_and_aarch64() {
    for (arch, name, _) in ARCHES {
        let filter = default_for(arch, name);
        assert!(
            filter.instruction_count() > 100,
            "{name}: suspiciously small"
        );
        assert!(filter.instruction_count() <= MAX_INSTRUCTIONS);
        assert_eq!(filter.profile(), "default");
        assert_eq!(filter.arch(), name);
    }
}

#[test]
fn native_compile_works_and_debug_is_short() {
    let filter = crate::compile("default").expect("compiles for the build architecture");
    let debug = format!("{filter:?}");
    assert!(
        debug.starts_with("CompiledFilter { profile: \"default\""),
        "{debug}"
    );
    assert!(
        debug.len() < 120,
        "Debug should not dump the program: {debug}"
    );
}

#[test]
fn profile_names_are_the_embedded_profiles() {
    assert_eq!(profile_names(), &["default"]);
    for name in profile_names() {
        let text = profile_source(name).expect("every listed profile has a source");
        assert!(text.contains("\"main\""));
        crate::compile(name).expect("every listed profile compiles");
    }
    assert!(profile_source("nope").is_none());
}

#[test]
fn unknown_profile_error_lists_known_profiles() {
    let error = crate::compile("nope").unwrap_err();
    assert!(matches!(error, SeccompError::UnknownProfile { .. }));
    assert_eq!(
        error.to_string(),
        "unknown seccomp profile \"nope\" (known profiles: default)"
    );
    assert_eq!(
        denied_syscalls("nope").unwrap_err().to_string(),
        "unknown seccomp profile \"nope\" (known profiles: default)"
    );
}

/// Checked on the raw JSON, independently of the loader's own validation.
#[test]
fn every_rule_and_condition_has_a_comment() {
    let document: serde_json::Value = serde_json::from_str(default_text()).unwrap();
    let mut rules = 0;
    for (filter_name, filter) in document.as_object().unwrap() {
        for rule in filter["filter"].as_array().unwrap() {
            rules += 1;
            let comment = rule.get("comment").and_then(|c| c.as_str()).unwrap_or("");
            assert!(
                comment.trim().len() > 5,
                "{filter_name}: rule {rule} needs a comment saying why"
            );
            for condition in rule
                .get("args")
                .and_then(|a| a.as_array())
                .into_iter()
                .flatten()
            {
                let comment = condition
                    .get("comment")
                    .and_then(|c| c.as_str())
                    .unwrap_or("");
                assert!(
                    !comment.trim().is_empty(),
                    "{filter_name}: condition {condition} needs a comment"
                );
            }
        }
    }
    assert!(rules > 200, "only {rules} rules found");
}

#[test]
fn loader_rejects_a_rule_without_comment() {
    let text = r#"{"main": {"mismatch_action": {"errno": 38}, "match_action": "allow",
                   "filter": [{"syscall": "read"}]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert_eq!(
        error.to_string(),
        "seccomp profile \"test\" is invalid: filter \"main\", rule 0 (read) has no comment; \
         every rule says why it is there"
    );
}

#[test]
fn loader_rejects_mixed_conditional_and_unconditional_rules() {
    let text = r#"{"main": {"mismatch_action": {"errno": 38}, "match_action": "allow",
        "filter": [
          {"syscall": "ioctl", "comment": "all"},
          {"syscall": "ioctl", "comment": "some",
           "args": [{"index": 1, "type": "dword", "op": "eq", "val": 1, "comment": "one"}]}
        ]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert_eq!(
        error.to_string(),
        "seccomp profile \"test\" is invalid: filter \"main\", rule 1 (ioctl) mixes rules with \
         and without \"args\" for the same syscall; seccompiler would drop the unconditional one"
    );
}

#[test]
fn loader_rejects_an_allow_by_default_main() {
    let text = r#"{"main": {"mismatch_action": "allow", "match_action": {"errno": 1},
                   "filter": [{"syscall": "read", "comment": "why"}]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert_eq!(
        error.to_string(),
        "seccomp profile \"test\" is invalid: filter \"main\" must have match_action \"allow\" \
         (it is the allowlist)"
    );
}

#[test]
fn loader_rejects_a_deny_layer_that_allows() {
    let text = r#"{"main": {"mismatch_action": {"errno": 38}, "match_action": "allow",
                   "filter": [{"syscall": "read", "comment": "why"}]},
                   "deny": {"mismatch_action": {"errno": 1}, "match_action": "allow",
                   "filter": [{"syscall": "write", "comment": "why"}]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert_eq!(
        error.to_string(),
        "seccomp profile \"test\" is invalid: deny filter \"deny\" must have mismatch_action \
         \"allow\" and an errno as match_action"
    );
}

#[test]
fn loader_rejects_a_dword_value_wider_than_32_bits() {
    let text = r#"{"main": {"mismatch_action": {"errno": 38}, "match_action": "allow",
        "filter": [{"syscall": "ioctl", "comment": "why",
           "args": [{"index": 1, "type": "dword", "op": "ne", "val": 4294988818,
                     "comment": "0x1_0000_5412 would become 0x5412"}]}]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert_eq!(
        error.to_string(),
        "seccomp profile \"test\" is invalid: filter \"main\", rule 0 (ioctl) compares argument 1 \
         as a dword with a value or mask wider than 32 bits, which seccompiler would truncate"
    );
}

#[test]
fn unknown_syscall_name_is_a_compile_error() {
    let text = r#"{"main": {"mismatch_action": {"errno": 38}, "match_action": "allow",
                   "filter": [{"syscall": "no_such_call", "comment": "typo"}]}}"#;
    let error = compile_text("test", text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert!(matches!(error, SeccompError::Compile { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with("seccomp profile \"test\" failed to compile for x86_64: "),
        "{error}"
    );
}

#[test]
fn oversized_profile_is_refused() {
    let rules: Vec<String> = (0..700)
        .map(|i| {
            format!(
                r#"{{"syscall": "ioctl", "comment": "c", "args": [{{"index": 1, "type": "dword",
                     "op": "eq", "val": {i}, "comment": "c"}}]}}"#
            )
        })
        .collect();
    let rules = rules.join(",");
    // About two instructions per rule in the tree; four layers of 700 rules
    // exceed the limit while each layer alone stays within seccompiler's.
    let deny = |name: &str| {
        format!(
            r#""{name}": {{"mismatch_action": "allow", "match_action": {{"errno": 1}}, "filter": [{rules}]}}"#
        )
    };
    let text = format!(
        r#"{{"main": {{"mismatch_action": {{"errno": 38}}, "match_action": "allow", "filter": [{rules}]}},
            {}, {}, {}}}"#,
        deny("deny"),
        deny("deny2"),
        deny("deny3")
    );
    let error = compile_text("big", &text, TargetArch::x86_64, "x86_64").unwrap_err();
    assert!(
        matches!(error, SeccompError::TooLarge { instructions, .. } if instructions > MAX_INSTRUCTIONS),
        "{error:?}"
    );
}

// --------------------------------------------------------- the deny list

/// The calls DESIGN.md and the seccomp brief require to be denied with EPERM.
const ALWAYS_DENIED_EPERM: &[&str] = &[
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
    "nfsservctl",
    "syslog",
    "iopl",
    "ioperm",
    "modify_ldt",
    "uselib",
    "_sysctl",
    "fanotify_init",
    "chroot",
    "sethostname",
    "setdomainname",
    "pidfd_getfd",
    "kcmp",
    "process_madvise",
    "move_pages",
    "migrate_pages",
];

/// Denied only for some arguments (the rest is allowed by `main`).
const CONDITIONALLY_DENIED_EPERM: &[&str] = &["clone", "personality", "ioctl", "prctl"];

#[test]
fn always_denied_calls_are_explicit_eperm_denials() {
    let denials = denials("default").unwrap();
    for name in ALWAYS_DENIED_EPERM {
        let expected = Denial {
            syscall: name,
            errno: EPERM,
            conditional: false,
        };
        assert!(
            denials.contains(&expected),
            "{name} must be denied with EPERM"
        );
    }
    for name in CONDITIONALLY_DENIED_EPERM {
        let expected = Denial {
            syscall: name,
            errno: EPERM,
            conditional: true,
        };
        assert!(
            denials.contains(&expected),
            "{name} must be denied for some arguments"
        );
    }
    let clone3 = Denial {
        syscall: "clone3",
        errno: ENOSYS,
        conditional: false,
    };
    assert!(
        denials.contains(&clone3),
        "clone3 must be denied with ENOSYS"
    );

    let names = denied_syscalls("default").unwrap();
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
    assert!(names.contains(&"clone3") && names.contains(&"socket"));
}

#[test]
fn nothing_denied_is_allowed_unconditionally() {
    let profile = Profile::parse("default", default_text()).unwrap();
    let unconditional_allows: BTreeSet<&str> = profile.filters[MAIN_FILTER]
        .rules
        .iter()
        .filter(|rule| rule.args.is_none())
        .map(|rule| rule.syscall)
        .collect();
    for name in denied_syscalls("default").unwrap() {
        assert!(
            !unconditional_allows.contains(name),
            "{name} is denied but also allowed unconditionally by \"main\""
        );
    }
}

/// Whether a condition holds for `arg`, by the kernel's reading of the
/// argument (a dword condition sees only the low 32 bits).
fn holds(condition: &Condition, arg: u64) -> bool {
    let dword = matches!(condition.arg_len, SeccompCmpArgLen::Dword);
    let narrow = |v: u64| if dword { v & 0xffff_ffff } else { v };
    let (x, v) = (narrow(arg), narrow(condition.val));
    match condition.op {
        SeccompCmpOp::Eq => x == v,
        SeccompCmpOp::Ne => x != v,
        SeccompCmpOp::Gt => x > v,
        SeccompCmpOp::Ge => x >= v,
        SeccompCmpOp::Lt => x < v,
        SeccompCmpOp::Le => x <= v,
        SeccompCmpOp::MaskedEq(mask) => x & narrow(mask) == v & narrow(mask),
    }
}

/// Arguments that satisfy every condition, or `None` if the small search
/// finds none.
fn satisfy(conditions: &[Condition]) -> Option<[u64; 6]> {
    let mut args = [0u64; 6];
    for index in 0..6u8 {
        let on_arg: Vec<&Condition> = conditions.iter().filter(|c| c.index == index).collect();
        if on_arg.is_empty() {
            continue;
        }
        // Values taken from the rule come first, so a flag rule is tried with
        // just its own bit set rather than with an arbitrary word that would
        // also trip other rules.
        let mut candidates: Vec<u64> = Vec::new();
        for c in &on_arg {
            let v = c.val;
            if let SeccompCmpOp::MaskedEq(mask) = c.op {
                candidates.push(v & mask);
            }
            candidates.extend([v, v.wrapping_add(1), v.wrapping_sub(1)]);
        }
        candidates.extend([0, 1, 8, 17, 38, 0x4_0000, 0xdead_beef]);
        args[usize::from(index)] = candidates
            .into_iter()
            .find(|&candidate| on_arg.iter().all(|c| holds(c, candidate)))?;
    }
    Some(args)
}

/// Every deny rule of the profile, instantiated with arguments that satisfy
/// it, is refused with its layer's errno by the chained program. Where the
/// rule compares dwords, the same call with garbage in the upper 32 bits of
/// those arguments is refused too (the kernel ignores those bits). And the
/// allowlist alone never allows such a call, so removing a deny layer could
/// change an errno but never open a hole.
#[test]
fn every_deny_rule_is_enforced_on_both_architectures() {
    let profile = Profile::parse("default", default_text()).unwrap();
    for (arch, arch_name, audit_arch) in ARCHES {
        let filter = default_for(arch, arch_name);
        let main_only = main_program(arch, arch_name);
        let mut checked = 0;
        for (layer, deny) in profile.filters.iter().filter(|(n, _)| **n != MAIN_FILTER) {
            let errno = i32::try_from(Profile::errno_of(layer, deny).unwrap()).unwrap();
            for rule in &deny.rules {
                if arch == TargetArch::aarch64 && !exists_on(rule.syscall, arch) {
                    continue;
                }
                let nr = syscall_nr(rule.syscall, arch);
                let conditions = rule.args.as_deref().unwrap_or(&[]);
                let args = satisfy(conditions)
                    .unwrap_or_else(|| panic!("no arguments satisfy {layer}/{}", rule.syscall));
                let what = format!("{arch_name} {layer}/{} {args:x?}", rule.syscall);
                assert_eq!(
                    eval(&filter, audit_arch, nr, args),
                    ret_errno(errno),
                    "{what}"
                );
                assert_ne!(
                    eval(&main_only, audit_arch, nr, args),
                    RET_ALLOW,
                    "{what}: allowed by main"
                );

                let mut high = args;
                for c in conditions {
                    if matches!(c.arg_len, SeccompCmpArgLen::Dword) {
                        high[usize::from(c.index)] |= 0xffff_ffff_0000_0000;
                    }
                }
                assert_eq!(
                    eval(&filter, audit_arch, nr, high),
                    ret_errno(errno),
                    "{what} with high bits set"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 70,
            "{arch_name}: only {checked} deny rules checked"
        );
    }
}

pub(crate) fn exists_on(name: &str, arch: TargetArch) -> bool {
    let json = format!(
        r#"{{"f": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
                    "filter": [{{"syscall": "{name}"}}]}}}}"#
    );
    seccompiler::compile_from_json(json.as_bytes(), arch).is_ok()
}

/// The `main` filter compiled on its own, without the deny layers.
fn main_program(arch: TargetArch, arch_name: &'static str) -> CompiledFilter {
    let mut document: serde_json::Value = serde_json::from_str(default_text()).unwrap();
    document
        .as_object_mut()
        .unwrap()
        .retain(|name, _| name == MAIN_FILTER);
    compile_text("main-only", &document.to_string(), arch, arch_name).unwrap()
}

// ------------------------------------------------------ specific decisions

const CLONE_THREAD_FLAGS: u64 = 0x003d_0f00; // VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID
const SIGCHLD: u64 = 17;
const CLONE_NEWUSER: u64 = 0x1000_0000;
const CLONE_NEWNET: u64 = 0x4000_0000;

#[test]
fn clone_is_allowed_without_namespace_flags_only() {
    let allowed = [
        CLONE_THREAD_FLAGS,
        SIGCHLD,                        // fork()
        0x0000_4000 | 0x0100 | SIGCHLD, // CLONE_VFORK|CLONE_VM|SIGCHLD, posix_spawn
        0x1_0000_0000 | SIGCHLD,        // upper bits are ignored by the kernel
    ];
    for flags in allowed {
        assert_eq!(x86("clone", args1(flags)), RET_ALLOW, "clone({flags:#x})");
    }
    let denied = [
        CLONE_NEWUSER | SIGCHLD,
        CLONE_THREAD_FLAGS | CLONE_NEWNET,
        0x0002_0000,                           // CLONE_NEWNS
        0xffff_ffff_0000_0000 | CLONE_NEWUSER, // high garbage must not hide the flag
        0x7e02_0080,                           // every CLONE_NEW* at once
    ];
    for flags in denied {
        assert_eq!(
            x86("clone", args1(flags)),
            ret_errno(EPERM),
            "clone({flags:#x})"
        );
    }
}

#[test]
fn clone3_fails_with_enosys_so_glibc_falls_back_to_clone() {
    assert_eq!(
        x86("clone3", [0x7fff_0000_1000, 88, 0, 0, 0, 0]),
        ret_errno(ENOSYS)
    );
}

#[test]
fn terminal_injection_ioctls_are_denied_on_the_masked_32_bit_value() {
    for request in [
        0x5412u64,
        0x1_0000_5412,
        0xffff_ffff_0000_5412,
        0x541c,
        0x8000_0000_0000_541c,
        0x5423,
    ] {
        assert_eq!(
            x86("ioctl", [0, request, 0, 0, 0, 0]),
            ret_errno(EPERM),
            "ioctl({request:#x})"
        );
    }
    // TCGETS (isatty), FIONREAD, FIONBIO, FIOCLEX stay available, also with high garbage.
    for request in [0x5401u64, 0x541b, 0x5421, 0x5451, 0x1_0000_5401] {
        assert_eq!(
            x86("ioctl", [0, request, 0, 0, 0, 0]),
            RET_ALLOW,
            "ioctl({request:#x})"
        );
    }
}

#[test]
fn personality_allows_only_per_linux_and_query() {
    assert_eq!(x86("personality", args1(0)), RET_ALLOW);
    assert_eq!(x86("personality", args1(0xffff_ffff)), RET_ALLOW);
    for persona in [
        0x0004_0000u64,
        0x0040_0000,
        0x0008,
        0x0020_0000,
        0x1_0004_0000,
    ] {
        assert_eq!(
            x86("personality", args1(persona)),
            ret_errno(EPERM),
            "personality({persona:#x})"
        );
    }
}

#[test]
fn socket_families_outside_the_list_get_eafnosupport() {
    for family in [1u64, 2, 10] {
        assert_eq!(
            x86("socket", [family, 1, 0, 0, 0, 0]),
            RET_ALLOW,
            "family {family}"
        );
    }
    assert_eq!(
        x86("socket", [16, 3, 0, 0, 0, 0]),
        RET_ALLOW,
        "netlink route"
    );
    assert_eq!(
        x86("socket", [16, 3, 9, 0, 0, 0]),
        ret_errno(EPERM),
        "netlink audit"
    );
    assert_eq!(
        x86("socket", [16, 3, 12, 0, 0, 0]),
        ret_errno(EPERM),
        "netlink netfilter"
    );
    // AF_PACKET, AF_ALG, AF_VSOCK, AF_KEY, AF_BLUETOOTH, AF_CAN, and AF_PACKET with high garbage.
    for family in [17u64, 38, 40, 15, 31, 29, 0x1_0000_0011] {
        assert_eq!(
            x86("socket", [family, 3, 0, 0, 0, 0]),
            ret_errno(EAFNOSUPPORT),
            "family {family:#x}"
        );
    }
    assert_eq!(x86("socketpair", [1, 1, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(
        x86("socketpair", [2, 1, 0, 0, 0, 0]),
        ret_errno(EAFNOSUPPORT)
    );
}

#[test]
fn mknod_allows_fifos_and_files_but_not_devices() {
    const S_IFIFO: u64 = 0o010000;
    const S_IFCHR: u64 = 0o020000;
    const S_IFDIR: u64 = 0o040000;
    const S_IFBLK: u64 = 0o060000;
    assert_eq!(x86("mknodat", [0, 0, S_IFIFO | 0o644, 0, 0, 0]), RET_ALLOW);
    assert_eq!(x86("mknodat", [0, 0, 0o644, 0, 0, 0]), RET_ALLOW);
    assert_eq!(
        x86("mknodat", [0, 0, S_IFCHR | 0o666, 0x0103, 0, 0]),
        ret_errno(EPERM)
    );
    assert_eq!(
        x86("mknodat", [0, 0, S_IFBLK | 0o666, 0x0800, 0, 0]),
        ret_errno(EPERM)
    );
    assert_eq!(
        x86("mknod", [0, S_IFCHR | 0o666, 0x0103, 0, 0, 0]),
        ret_errno(EPERM)
    );
    assert_eq!(
        x86("mknodat", [0, 0, S_IFDIR | 0o755, 0, 0, 0]),
        ret_errno(ENOSYS)
    );
}

#[test]
fn prctl_is_allowed_except_memory_map_and_io_flusher() {
    for option in [15u64, 16, 1, 36, 38, 39, 22] {
        assert_eq!(x86("prctl", args1(option)), RET_ALLOW, "prctl({option})");
    }
    assert_eq!(x86("prctl", args1(35)), ret_errno(EPERM), "PR_SET_MM");
    assert_eq!(
        x86("prctl", args1(57)),
        ret_errno(EPERM),
        "PR_SET_IO_FLUSHER"
    );
}

#[test]
fn unlisted_calls_get_enosys_and_foreign_abis_are_refused() {
    let filter = default_for(TargetArch::x86_64, "x86_64");
    // Not on the allowlist: sync, vmsplice, and a number no kernel has yet.
    for name in ["sync", "vmsplice", "memfd_secret", "get_robust_list"] {
        assert_eq!(x86(name, [0; 6]), ret_errno(ENOSYS), "{name}");
    }
    assert_eq!(
        eval(&filter, AUDIT_ARCH_X86_64, 1000, [0; 6]),
        ret_errno(ENOSYS)
    );
    // x32 reuses AUDIT_ARCH_X86_64 with bit 30 set in the number: no rule matches.
    let x32 = 0x4000_0000;
    for name in ["getpid", "read", "ptrace", "mount"] {
        let nr = x32 | syscall_nr(name, TargetArch::x86_64);
        assert_eq!(
            eval(&filter, AUDIT_ARCH_X86_64, nr, [0; 6]),
            ret_errno(ENOSYS),
            "x32 {name}"
        );
    }
    // i386 (int 0x80) carries another audit arch: the process is killed.
    assert_eq!(eval(&filter, AUDIT_ARCH_I386, 20, [0; 6]), RET_KILL_PROCESS);
    let arm = default_for(TargetArch::aarch64, "aarch64");
    assert_eq!(eval(&arm, AUDIT_ARCH_X86_64, 172, [0; 6]), RET_KILL_PROCESS);
}

/// What the jailer's own init (PID 1 of the sandbox) keeps doing after the
/// filter is installed, and what CPython needs to start at all.
#[test]
fn jailer_init_and_interpreter_basics_are_allowed() {
    for (arch, arch_name, audit_arch) in ARCHES {
        let filter = default_for(arch, arch_name);
        let mut names = vec![
            "wait4",
            "waitid",
            "signalfd4",
            "read",
            "write",
            "rt_sigprocmask",
            "rt_sigaction",
            "rt_sigreturn",
            "kill",
            "exit_group",
            "exit",
            "execve",
            "close",
            "dup3",
            "setsid",
            "getpid",
            "pipe2",
            "openat",
            "newfstatat",
            "mmap",
            "mprotect",
            "munmap",
            "brk",
            "futex",
            "set_robust_list",
            "rseq",
            "set_tid_address",
            "getrandom",
            "epoll_pwait",
            "close_range",
            "sched_getaffinity",
            "sched_yield",
            "madvise",
            "mbind",
            "get_mempolicy",
            "eventfd2",
            "getdents64",
            "prlimit64",
            "clock_nanosleep",
        ];
        if arch == TargetArch::x86_64 {
            names.extend(["fork", "vfork", "arch_prctl", "epoll_wait", "dup2", "poll"]);
        }
        for name in names {
            let nr = syscall_nr(name, arch);
            assert_eq!(
                eval(&filter, audit_arch, nr, [0; 6]),
                RET_ALLOW,
                "{arch_name} {name}"
            );
        }
        let clone = syscall_nr("clone", arch);
        assert_eq!(eval(&filter, audit_arch, clone, args1(SIGCHLD)), RET_ALLOW);
        let prctl = syscall_nr("prctl", arch);
        for option in [1u64, 36] {
            // PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER
            assert_eq!(eval(&filter, audit_arch, prctl, args1(option)), RET_ALLOW);
        }
    }
}

/// The running architecture, as the filter's evaluator names it.
fn native_arch() -> (TargetArch, u32) {
    match crate::bpf::Arch::native().expect("supported arch") {
        crate::bpf::Arch::X86_64 => (TargetArch::x86_64, AUDIT_ARCH_X86_64),
        crate::bpf::Arch::Aarch64 => (TargetArch::aarch64, AUDIT_ARCH_AARCH64),
    }
}

#[test]
fn kernel_gaps_can_be_refused_in_front_of_the_profile() {
    let base = crate::compile("default").expect("default compiles");
    let native = native_arch();
    let gap = crate::KernelGap::SecurityXattrs;
    let filter = base.with_refused(gap);
    let call = |name: &str, args| eval(&filter, native.1, syscall_nr(name, native.0), args);
    for &(name, _) in gap.calls() {
        assert_eq!(
            eval(&base, native.1, syscall_nr(name, native.0), args1(0)),
            RET_ALLOW,
            "{name} is allowed by the profile itself"
        );
        assert_eq!(call(name, args1(0)), ret_errno(gap.errno()), "{gap:?}");
    }
    assert_eq!(call("read", args1(0)), RET_ALLOW);
    assert_eq!(call("getxattr", args1(0)), RET_ALLOW);
    assert_eq!(call("io_uring_setup", args1(0)), ret_errno(EPERM));
    assert_eq!(
        filter.instruction_count(),
        base.instruction_count() + 1 + 2 * gap.calls().len()
    );
}

#[test]
fn memfd_create_is_refused_in_every_jail_as_a_kernel_without_memfds_would() {
    // No jail can set vm.memfd_noexec (its init is not host root), so a
    // memfd the code wrote could be executed: there are none.
    let base = crate::compile("default").expect("default compiles");
    let native = native_arch();
    let call = |name: &str, flags| eval(&base, native.1, syscall_nr(name, native.0), args1(flags));
    for flags in [0, 1, 8, 0x10] {
        assert_eq!(
            call("memfd_create", flags),
            ret_errno(ENOSYS),
            "flags {flags:#x}"
        );
    }
    assert_eq!(call("write", 0), RET_ALLOW);
}

#[test]
fn inet_sockets_are_stream_or_datagram_with_tcp_or_udp_only() {
    let (stream, dgram, nonblock_cloexec) = (1u64, 2u64, 0x80800u64);
    let socket = |domain: u64, ty: u64, proto: u64| x86("socket", [domain, ty, proto, 0, 0, 0]);
    for domain in [2, 10] {
        for (ty, proto) in [(stream, 0), (stream, 6), (dgram, 0), (dgram, 17)] {
            assert_eq!(
                socket(domain, ty, proto),
                RET_ALLOW,
                "{domain} {ty} {proto}"
            );
            assert_eq!(socket(domain, ty | nonblock_cloexec, proto), RET_ALLOW);
        }
        // SCTP, MPTCP, UDP-Lite, L2TP, SMC, ICMP.
        for proto in [132, 262, 136, 115, 256, 1] {
            assert_eq!(
                socket(domain, stream, proto),
                ret_errno(libc::EPROTONOSUPPORT),
                "{domain} stream {proto}"
            );
        }
        // SOCK_SEQPACKET, SOCK_DCCP, SOCK_RAW.
        for ty in [5, 6, 3] {
            assert_eq!(
                socket(domain, ty | nonblock_cloexec, 0),
                ret_errno(libc::ESOCKTNOSUPPORT),
                "{domain} type {ty}"
            );
        }
    }
}

#[test]
fn rlimit_core_can_be_read_but_not_set() {
    let new_limit = 0x7ffd_0000_1000u64;
    assert_eq!(x86("prlimit64", [0, 4, 0, new_limit, 0, 0]), RET_ALLOW);
    assert_eq!(
        x86("prlimit64", [0, 4, new_limit, 0, 0, 0]),
        ret_errno(EPERM)
    );
    assert_eq!(x86("prlimit64", [0, 7, new_limit, 0, 0, 0]), RET_ALLOW);
    assert_eq!(
        x86("setrlimit", [4, new_limit, 0, 0, 0, 0]),
        ret_errno(EPERM)
    );
    assert_eq!(x86("setrlimit", [7, new_limit, 0, 0, 0, 0]), RET_ALLOW);
}

// ------------------------------------------------------------ notifying

/// The native filter's verdict on `name` with `args`.
fn native_eval(filter: &CompiledFilter, name: &str, args: [u64; 6]) -> u32 {
    eval(
        filter,
        AUDIT_ARCH_X86_64,
        syscall_nr(name, TargetArch::x86_64),
        args,
    )
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_notifying_filter_hands_over_exactly_the_eperm_refusals() {
    let filter = crate::compile("default").unwrap();
    let notifying = filter.notifying();
    assert_eq!(filter.instruction_count(), notifying.instruction_count());
    let notif = libc::SECCOMP_RET_USER_NOTIF;
    for name in ["mount", "ptrace", "unshare", "bpf", "keyctl"] {
        assert_eq!(
            native_eval(&filter, name, args1(0)),
            ret_errno(libc::EPERM),
            "{name}"
        );
        assert_eq!(native_eval(&notifying, name, args1(0)), notif, "{name}");
    }
    // A listener of the sandbox's own is refused, and handed over too.
    let listener = [1, 8, 0, 0, 0, 0];
    assert_eq!(
        native_eval(&filter, "seccomp", listener),
        ret_errno(libc::EPERM)
    );
    assert_eq!(native_eval(&notifying, "seccomp", listener), notif);
    assert_eq!(
        native_eval(&notifying, "seccomp", [1, 0, 0, 0, 0, 0]),
        RET_ALLOW
    );
    // Everything else is as it was: allowed calls, ENOSYS, other errnos.
    for (name, args) in [
        ("read", args1(0)),
        ("clone3", args1(0)),
        ("socket", args1(17)),
        ("clone", args1(0x11)),
    ] {
        assert_eq!(
            native_eval(&filter, name, args),
            native_eval(&notifying, name, args),
            "{name} {args:x?}"
        );
    }
    assert_eq!(native_eval(&notifying, "read", args1(0)), RET_ALLOW);
    assert_eq!(
        native_eval(&notifying, "socket", args1(17)),
        ret_errno(libc::EAFNOSUPPORT)
    );
    // clone with CLONE_NEWUSER is a deny rule (EPERM): handed over.
    assert_eq!(native_eval(&notifying, "clone", args1(0x1000_0000)), notif);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_refused_calls_number_has_its_name() {
    let filter = crate::compile("default").unwrap();
    for name in ["mount", "read", "seccomp", "clone3"] {
        let nr = syscall_nr(name, TargetArch::x86_64);
        assert_eq!(filter.syscall_name(nr), Some(name));
    }
    assert_eq!(filter.syscall_name(99_999), None);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_embedded_names_are_the_profiles_syscalls_by_number() {
    let table = crate::generate::syscall_table("default", default_text(), crate::bpf::Arch::X86_64)
        .unwrap();
    assert!(table.len() > 300, "{}", table.len());
    let filter = crate::compile("default").unwrap();
    for (nr, name) in &table {
        assert_eq!(filter.syscall_name(*nr), Some(name.as_str()));
        assert_eq!(*nr, syscall_nr(name, TargetArch::x86_64), "{name}");
    }
}
