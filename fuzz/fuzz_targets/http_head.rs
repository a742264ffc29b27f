//! A request head a jailed program sends the egress proxy, and an answer
//! head an origin sends back. A request the proxy accepts is forwarded as a
//! head that the next hop reads as the same request: same method, target
//! and body framing (no smuggling through the proxy's own rewriting).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pycell_egress::http::{answer_end, forward_head, parse_head, Target, MAX_HEADERS};

fuzz_target!(|data: &[u8]| {
    let _ = answer_end(data, "GET");
    let _ = answer_end(data, "HEAD");
    let Ok(head) = parse_head(data) else {
        return;
    };
    // The forwarded head may add Host and Connection: with them, more
    // headers than the proxy itself takes are the next hop's to refuse.
    if !matches!(head.target, Target::Absolute { .. }) || head.headers.len() > MAX_HEADERS - 2 {
        return;
    }
    let forwarded = forward_head(&head, true);
    let again = parse_head(&forwarded).expect("the proxy's own head parses");
    assert_eq!(again.method, head.method);
    assert_eq!(again.target, head.target);
    assert_eq!(again.body, head.body);
    check_origin_form(&forward_head(&head, false), &head);
});

/// What an origin reads of the head sent to it directly.
fn check_origin_form(raw: &[u8], head: &pycell_egress::http::Head) {
    let mut slots = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut slots);
    let status = req.parse(raw).expect("the origin-form head parses");
    assert_eq!(status, httparse::Status::Complete(raw.len()));
    assert_eq!(req.method, Some(head.method.as_str()));
    let Target::Absolute { path, .. } = &head.target else {
        unreachable!()
    };
    assert_eq!(req.path, Some(path.as_str()));
}
