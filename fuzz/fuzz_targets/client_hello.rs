//! The first bytes a jailed program sends through a CONNECT tunnel, read
//! for the server name it asks for. Must never panic; a name it reads is
//! one the egress rules can judge.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_egress::tls::{inspect, Hello};

fuzz_target!(|data: &[u8]| {
    if let Hello::ClientHello {
        server_name: Some(name),
    } = inspect(data)
    {
        assert!(!name.is_empty());
        assert!(name.len() <= 255, "{} bytes", name.len());
    }
});
