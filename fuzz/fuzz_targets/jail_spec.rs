//! The spec frame a jailer reads on its stdin, decoded and validated as the
//! jailer does before it acts on anything in it. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_wire::framing::decode;
use pycell_wire::spec::JailSpec;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = decode::<JailSpec>(data) {
        let _ = spec.validate();
    }
});
