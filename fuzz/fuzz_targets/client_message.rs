//! A client's frame on pycelld's socket, as the broker decodes it, and the
//! size checks it makes before anything else. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_protocol::framing::decode_client_message;
use pycell_protocol::messages::ClientMessage;

fuzz_target!(|data: &[u8]| {
    if let Ok(ClientMessage::Run { request, .. }) = decode_client_message(data) {
        if request.check_bounds().is_ok() {
            let _ = request.stdin_bytes();
        }
    }
});
