//! An operator's policy file: any bytes, parsed as pycell parses
//! /etc/pycell/policies/*.toml. Must never panic; a policy it accepts must
//! be one pycell's own checks accept again (its name is valid).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pycell_policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(policy) = Policy::from_toml_str(text, Path::new("fuzz.toml")) {
        assert!(
            pycell_policy::is_valid_name(&policy.name),
            "{:?}",
            policy.name
        );
    }
});
