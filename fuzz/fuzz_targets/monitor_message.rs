//! A broker's message to the root monitor (the broker is unprivileged, so
//! root treats it as hostile): decoded, bounds checked, and an order
//! checked against a built-in policy, as the monitor does. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_daemon::link::ToMonitor;
use pycell_wire::framing::decode;

fuzz_target!(|data: &[u8]| {
    let Ok(ToMonitor::Spawn { order, .. }) = decode::<ToMonitor>(data) else {
        return;
    };
    if order.check_bounds().is_err() {
        return;
    }
    let policy = pycell_policy::builtin::load("default").expect("the built-in default parses");
    let _ = order.check(&policy);
});
