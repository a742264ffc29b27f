//! What comes out of a jail: the event stream (output, ready, reply and
//! result frames) the launcher reads from the jailer, and a session
//! runner's replies. Must never panic, and a stream is read to its end or
//! to a clear error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_runner::session::RunnerReply;
use pycell_wire::events::read_event;

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    while let Ok(Some(_)) = read_event(&mut stream) {}
    let _ = serde_json::from_slice::<RunnerReply>(data);
});
