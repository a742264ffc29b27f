//! A script's `# /// script` block (PEP 723) and its requirements, as the
//! broker reads them from a client's code. Metadata it accepts is within
//! pycell's bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_deps::pep723::{check_requires_python, parse};
use pycell_policy::requirement::{Requirement, MAX_REQUIREMENTS};

fuzz_target!(|data: &[u8]| {
    let Ok(code) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Requirement::parse(code);
    let _ = check_requires_python(code);
    if let Ok(Some(meta)) = parse(code) {
        assert!(meta.dependencies.len() <= MAX_REQUIREMENTS);
        if let Some(spec) = &meta.requires_python {
            assert!(check_requires_python(spec).is_ok(), "{spec:?}");
        }
    }
});
