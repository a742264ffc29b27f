//! A plain-HTTP request body, framed by Content-Length or chunks. However
//! the bytes arrive (one read or many), the proxy takes the same prefix as
//! the body and reaches the same verdict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_egress::body::{Body, Framing};

fuzz_target!(|data: &[u8]| {
    let [kind, cut, rest @ ..] = data else {
        return;
    };
    let framing = match kind % 3 {
        0 => Framing::Chunked,
        1 => Framing::Length(u64::from(*cut)),
        _ => Framing::Length(u64::from(*kind) << 20),
    };
    let whole = Body::new(Some(framing)).feed(rest);
    let at = usize::from(*cut).min(rest.len());
    let mut split = Body::new(Some(framing));
    let in_two = split.feed(&rest[..at]).and_then(|first| {
        if first < at {
            return Ok(first);
        }
        split.feed(&rest[at..]).map(|second| first + second)
    });
    assert_eq!(whole, in_two, "framing {framing:?}, cut at {at}");
    if let Ok(n) = whole {
        assert!(n <= rest.len());
    }
});
