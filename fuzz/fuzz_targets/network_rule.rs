//! Egress rules and the hosts a jailed program asks for (CONNECT targets,
//! URLs' hosts), in every spelling. A host that parses prints as a
//! spelling that parses back to the same host.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_policy::network::{Host, Rule, RuleKind};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Rule::parse(text, RuleKind::Allow);
    let _ = Rule::parse(text, RuleKind::Deny);
    if let Ok(host) = Host::parse(text) {
        let again = Host::parse(&host.to_string());
        assert_eq!(again.as_ref().ok(), Some(&host), "{text:?} -> {host}");
    }
});
