//! The HTTP a proxy needs: the request head a client sends it (CONNECT in
//! authority form, anything else in absolute form), parsed by `httparse`
//! and then held to stricter rules than an origin might apply (so the
//! proxy never judges one request while the origin reads another): no
//! bare CR or LF, no obsolete line folding, one `Host` that agrees with
//! the target, at most one of `Content-Length` and `Transfer-Encoding:
//! chunked`. Also the head it forwards and its own one-line answers. Pure.

use crate::body::Framing;

/// Largest request head accepted (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers a request head may have.
pub const MAX_HEADERS: usize = 100;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: String, port: u16 },
    /// `METHOD http://host[:port]/path`: one plain-HTTP request.
    Absolute {
        host: String,
        port: u16,
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub target: Target,
    pub headers: Vec<(String, String)>,
    /// How a plain-HTTP request's body ends (`None`: it has none).
    pub body: Option<Framing>,
}

/// Where the head ends (just past its blank line), if it has.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Why a request head was refused (each message quotes at most 80
/// characters of the request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is not text")]
    NotText,
    #[error("a bare CR or LF in the request head (lines end with CRLF)")]
    BareLineEnding,
    #[error("malformed request head ({0})")]
    Malformed(String),
    #[error("more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("malformed host:port {0:?}")]
    Authority(String),
    #[error("{0:?} has no port: CONNECT needs host:port")]
    NoPort(String),
    #[error("an https:// URL must be requested with CONNECT (set HTTPS_PROXY)")]
    HttpsWithoutConnect,
    #[error("{0:?} is not an absolute http:// URL: this is pycell's egress proxy, which takes CONNECT host:port or METHOD http://host/path")]
    NotAbsolute(String),
    #[error("more than one {0} header")]
    Duplicate(&'static str),
    #[error("the Host header {header:?} names another host than the request's {target:?}")]
    HostMismatch { header: String, target: String },
    #[error("Content-Length {0:?} is not a number")]
    BadLength(String),
    #[error("Transfer-Encoding {0:?}: the proxy forwards only chunked")]
    BadTransferEncoding(String),
    #[error("both Content-Length and Transfer-Encoding")]
    LengthAndChunked,
}

/// Parse a complete head (through its blank line).
pub fn parse_head(raw: &[u8]) -> Result<Head, HeadError> {
    check_line_endings(raw)?;
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(raw) {
        Ok(httparse::Status::Complete(n)) if n == raw.len() => {}
        Ok(_) => {
            return Err(HeadError::Malformed(
                "the head does not end where its blank line is".into(),
            ))
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("no request line".into()));
    };
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| HeadError::NotText)?;
        headers.push((h.name.to_string(), value.trim().to_string()));
    }
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Head {
            method: method.into(),
            target: Target::Connect { host, port },
            headers,
            body: None,
        });
    }
    let target = absolute(target)?;
    check_host_header(&headers, &target)?;
    let body = framing(&headers, version)?;
    Ok(Head {
        method: method.into(),
        target,
        headers,
        body,
    })
}

/// Every LF is preceded by a CR and every CR followed by an LF.
pub fn check_line_endings(raw: &[u8]) -> Result<(), HeadError> {
    let bare = raw.iter().enumerate().any(|(i, &b)| match b {
        b'\n' => i == 0 || raw[i - 1] != b'\r',
        b'\r' => raw.get(i + 1) != Some(&b'\n'),
        _ => false,
    });
    match bare {
        true => Err(HeadError::BareLineEnding),
        false => Ok(()),
    }
}

/// The values of header `name` (any case).
fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// At most one `Host`, naming the target's host and port.
fn check_host_header(headers: &[(String, String)], target: &Target) -> Result<(), HeadError> {
    let Target::Absolute { host, port, .. } = target else {
        return Ok(());
    };
    match values(headers, "host")[..] {
        [] => Ok(()),
        [value] => {
            let agrees = authority(value, Some(80))
                .is_ok_and(|(h, p)| h.eq_ignore_ascii_case(host) && p == *port);
            match agrees {
                true => Ok(()),
                false => Err(HeadError::HostMismatch {
                    header: clip(value),
                    target: format!("{host}:{port}"),
                }),
            }
        }
        _ => Err(HeadError::Duplicate("Host")),
    }
}

/// How the body ends: at most one `Content-Length` (digits only) or one
/// `Transfer-Encoding: chunked` (HTTP/1.1), never both.
fn framing(headers: &[(String, String)], version: u8) -> Result<Option<Framing>, HeadError> {
    let lengths = values(headers, "content-length");
    let encodings = values(headers, "transfer-encoding");
    match (&lengths[..], &encodings[..]) {
        ([], []) => Ok(None),
        ([_, _, ..], _) => Err(HeadError::Duplicate("Content-Length")),
        (_, [_, _, ..]) => Err(HeadError::Duplicate("Transfer-Encoding")),
        ([_], [_]) => Err(HeadError::LengthAndChunked),
        ([n], []) => {
            let ok = !n.is_empty() && n.len() <= 18 && n.bytes().all(|b| b.is_ascii_digit());
            match ok {
                true => Ok(Some(Framing::Length(n.parse().unwrap_or(0)))),
                false => Err(HeadError::BadLength(clip(n))),
            }
        }
        ([], [te]) if te.eq_ignore_ascii_case("chunked") && version == 1 => {
            Ok(Some(Framing::Chunked))
        }
        ([], [te]) => Err(HeadError::BadTransferEncoding(clip(te))),
    }
}

/// How an origin's answer to one request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerEnd {
    /// An interim (1xx) answer: the final one follows.
    Interim,
    /// Where its framing says (`None`: no body).
    Framed(Option<Framing>),
    /// When the origin closes the connection.
    AtClose,
}

/// Largest answer head the proxy reads.
pub const MAX_ANSWER_HEAD: usize = 64 * 1024;

/// How a complete answer head (through its blank line) to a request whose
/// method is `method` ends, as `httparse` reads it; None if it is not an
/// HTTP/1.x answer head.
pub fn answer_end(raw: &[u8], method: &str) -> Option<AnswerEnd> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut slots);
    let Ok(httparse::Status::Complete(_)) = res.parse(raw) else {
        return None;
    };
    let status = res.code?;
    let value = |name: &str| {
        res.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
            .collect::<Vec<String>>()
    };
    Some(match status {
        101 => AnswerEnd::AtClose,
        100..=199 => AnswerEnd::Interim,
        204 | 304 => AnswerEnd::Framed(None),
        _ if method == "HEAD" => AnswerEnd::Framed(None),
        _ => {
            let encodings = value("transfer-encoding");
            let lengths = value("content-length");
            match (&encodings[..], &lengths[..]) {
                ([], []) => AnswerEnd::AtClose,
                ([te], _) if te.rsplit(',').next().map(str::trim) == Some("chunked") => {
                    AnswerEnd::Framed(Some(Framing::Chunked))
                }
                ([], [n, rest @ ..])
                    if rest.iter().all(|m| m == n)
                        && (1..=18).contains(&n.len())
                        && n.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    AnswerEnd::Framed(Some(Framing::Length(n.parse().unwrap_or(0))))
                }
                _ => AnswerEnd::AtClose,
            }
        }
    })
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

/// `host:port`, `[v6]:port`; `default` when the port is left out.
fn authority(a: &str, default: Option<u16>) -> Result<(String, u16), HeadError> {
    let bad = || HeadError::Authority(clip(a));
    let (host, port): (String, Option<&str>) = match a.strip_prefix('[') {
        Some(rest) => {
            let (h, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(bad)?),
            };
            (format!("[{h}]"), port)
        }
        None => match a.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (a.to_string(), None),
        },
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
        None => default.ok_or_else(|| HeadError::NoPort(clip(a)))?,
    };
    if !host_chars_ok(&host) {
        return Err(bad());
    }
    Ok((host, port))
}

/// A name's characters (letters, digits, `.`, `-`, `_`), or an IPv6
/// address's in brackets: nothing that could end the authority where a
/// next hop would not (`:`, `@`, `'`, `%`, spaces).
fn host_chars_ok(host: &str) -> bool {
    let (inner, ok): (&str, fn(u8) -> bool) = match host.strip_prefix('[') {
        Some(v6) => (v6.strip_suffix(']').unwrap_or(""), |b| {
            b.is_ascii_hexdigit() || matches!(b, b':' | b'.')
        }),
        None => (host, |b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
        }),
    };
    !inner.is_empty() && inner.len() <= 253 && inner.bytes().all(ok)
}

fn absolute(target: &str) -> Result<Target, HeadError> {
    let lower = target
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let rest = match () {
        _ if lower.starts_with("http://") => &target[7..],
        _ if lower.starts_with("https://") => return Err(HeadError::HttpsWithoutConnect),
        _ => return Err(HeadError::NotAbsolute(clip(target))),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (host, port) = authority(&rest[..end], Some(80))?;
    let path = match &rest[end..] {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/{p}"),
    };
    Ok(Target::Absolute { host, port, path })
}

/// Headers that concern only the hop to this proxy.
fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "proxy-connection",
        "proxy-authorization",
        "keep-alive",
        "te",
        "upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// The head that forwards an absolute-form request, one request per
/// connection, with our hop-by-hop headers dropped and a Host header if the
/// client left it out: in origin form to the origin server, or in absolute
/// form when it goes `via_proxy` (the host's own proxy).
pub fn forward_head(head: &Head, via_proxy: bool) -> Vec<u8> {
    let Target::Absolute { host, port, path } = &head.target else {
        return Vec::new();
    };
    let authority = match port {
        80 => host.clone(),
        p => format!("{host}:{p}"),
    };
    let mut out = match via_proxy {
        true => format!("{} http://{authority}{path} HTTP/1.1\r\n", head.method),
        false => format!("{} {path} HTTP/1.1\r\n", head.method),
    };
    if !head
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("host"))
    {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    for (n, v) in head.headers.iter().filter(|(n, _)| !hop_by_hop(n)) {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// One of the proxy's own answers. The line goes into the reason phrase as
/// well as the body: clients that report a failed CONNECT show only the
/// status line (urllib: "Tunnel connection failed: 403 ...").
pub fn answer(status: u16, line: &str) -> Vec<u8> {
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(900)
        .collect();
    format!(
        "HTTP/1.1 {status} {line}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}\n",
        line.len() + 1
    )
    .into_bytes()
}

/// The status code of an upstream proxy's answer to CONNECT, if its head is
/// a well-formed HTTP/1.x response head.
pub fn status_of(head: &[u8]) -> Option<u16> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut slots);
    match res.parse(head) {
        Ok(httparse::Status::Complete(_)) => res.code,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<Head, HeadError> {
        parse_head(s.as_bytes())
    }

    #[test]
    fn connect_and_absolute_requests_parse() {
        let h = head("CONNECT api.example.net:443 HTTP/1.1\r\nHost: api.example.net:443\r\n\r\n")
            .unwrap();
        assert_eq!(
            h.target,
            Target::Connect {
                host: "api.example.net".into(),
                port: 443
            }
        );
        let h = head("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            h.target,
            Target::Connect {
                host: "[::1]".into(),
                port: 8443
            }
        );
        let h =
            head("GET http://x.example.net/a?b HTTP/1.1\r\nHost: x.example.net\r\n\r\n").unwrap();
        assert_eq!(
            h.target,
            Target::Absolute {
                host: "x.example.net".into(),
                port: 80,
                path: "/a?b".into()
            }
        );
        let h = head("POST HTTP://x.example.net:8080 HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(
            h.target,
            Target::Absolute {
                host: "x.example.net".into(),
                port: 8080,
                path: "/".into()
            }
        );
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for (req, why) in [
            ("GET / HTTP/1.1\r\n\r\n", "not an absolute http:// URL"),
            (
                "CONNECT x.example.net HTTP/1.1\r\n\r\n",
                "CONNECT needs host:port",
            ),
            (
                "CONNECT x.example.net:0 HTTP/1.1\r\n\r\n",
                "malformed host:port",
            ),
            (
                "CONNECT x.example.net:443 HTTP/2\r\n\r\n",
                "malformed request head",
            ),
            ("GET  http://x/ HTTP/1.1\r\n\r\n", "malformed request head"),
            ("GET https://x/ HTTP/1.1\r\n\r\n", "with CONNECT"),
            ("GET http://u@x/ HTTP/1.1\r\n\r\n", "malformed host:port"),
            // Found by fuzzing: the host ran to the last colon, so the
            // proxy judged "x:80y" while a next hop read "x".
            (
                "GET http://x.example.net:80y.example.net:80 HTTP/1.1\r\n\r\n",
                "malformed host:port",
            ),
            ("GET http://x'y:80/ HTTP/1.1\r\n\r\n", "malformed host:port"),
            ("GET http://x%41/ HTTP/1.1\r\n\r\n", "malformed host:port"),
            (
                "CONNECT [::1%lo]:443 HTTP/1.1\r\n\r\n",
                "malformed host:port",
            ),
            ("CONNECT []:443 HTTP/1.1\r\n\r\n", "malformed host:port"),
            (
                "GET http://x/ HTTP/1.1\r\nno colon\r\n\r\n",
                "malformed request head",
            ),
            (
                "GET http://x/ HTTP/1.1\r\nA: b\r\n folded: x\r\n\r\n",
                "malformed request head",
            ),
            (
                "GET http://x/ HTTP/1.1\r\nHost : x\r\n\r\n",
                "malformed request head",
            ),
            ("\u{1}\u{2}\r\n\r\n", "malformed request head"),
        ] {
            let e = head(req).unwrap_err().to_string();
            assert!(e.contains(why), "{req:?}: {e}");
        }
        assert_eq!(
            parse_head(b"GET http://x/ HTTP/1.1\r\nA: \xff\xfe\r\n\r\n").unwrap_err(),
            HeadError::NotText
        );
        let many = format!("GET http://x/ HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(101));
        assert_eq!(head(&many).unwrap_err(), HeadError::TooManyHeaders);
        assert!(HeadError::TooManyHeaders
            .to_string()
            .contains("more than 100 headers"));
    }

    #[test]
    fn a_head_the_origin_could_read_otherwise_is_refused() {
        for (req, why) in [
            // A bare LF inside a value would be a new header line to a
            // lenient origin; a bare CR may be either.
            (
                "GET http://x/ HTTP/1.1\r\nA: b\nHost: evil\r\n\r\n",
                HeadError::BareLineEnding,
            ),
            (
                "GET http://x/ HTTP/1.1\r\nA: b\rc\r\n\r\n",
                HeadError::BareLineEnding,
            ),
            (
                "GET http://x/ HTTP/1.1\nA: b\r\n\r\n",
                HeadError::BareLineEnding,
            ),
            (
                "GET http://x/ HTTP/1.1\r\nHost: evil.example.net\r\n\r\n",
                HeadError::HostMismatch {
                    header: "evil.example.net".into(),
                    target: "x:80".into(),
                },
            ),
            (
                "GET http://x/ HTTP/1.1\r\nHost: x:8080\r\n\r\n",
                HeadError::HostMismatch {
                    header: "x:8080".into(),
                    target: "x:80".into(),
                },
            ),
            (
                "GET http://x/ HTTP/1.1\r\nHost: x\r\nHost: x\r\n\r\n",
                HeadError::Duplicate("Host"),
            ),
            (
                "POST http://x/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                HeadError::Duplicate("Content-Length"),
            ),
            (
                "POST http://x/ HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
                HeadError::BadLength("5, 6".into()),
            ),
            (
                "POST http://x/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                HeadError::BadLength("+5".into()),
            ),
            (
                "POST http://x/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::LengthAndChunked,
            ),
            (
                "POST http://x/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                HeadError::BadTransferEncoding("gzip, chunked".into()),
            ),
            (
                "POST http://x/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::Duplicate("Transfer-Encoding"),
            ),
            (
                "POST http://x/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::BadTransferEncoding("chunked".into()),
            ),
        ] {
            assert_eq!(head(req), Err(why), "{req:?}");
        }
    }

    #[test]
    fn a_plain_request_knows_where_its_body_ends() {
        let body = |req: &str| head(req).unwrap().body;
        assert_eq!(body("GET http://x/ HTTP/1.1\r\nHost: X:80\r\n\r\n"), None);
        assert_eq!(
            body("POST http://x:81/ HTTP/1.1\r\nHost: x:81\r\ncontent-length: 12\r\n\r\n"),
            Some(Framing::Length(12))
        );
        assert_eq!(
            body("POST http://x/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            Some(Framing::Chunked)
        );
        assert_eq!(
            body("CONNECT x:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            None
        );
    }

    #[test]
    fn the_origin_gets_origin_form_and_no_proxy_headers() {
        let h = head("GET http://x.example.net:8080/p HTTP/1.1\r\nProxy-Authorization: secret\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n").unwrap();
        let out = String::from_utf8(forward_head(&h, false)).unwrap();
        assert_eq!(
            out,
            "GET /p HTTP/1.1\r\nHost: x.example.net:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(head_end(out.as_bytes()), Some(out.len()));
        let up = String::from_utf8(forward_head(&h, true)).unwrap();
        assert!(
            up.starts_with(
                "GET http://x.example.net:8080/p HTTP/1.1\r\nHost: x.example.net:8080\r\n"
            ),
            "{up}"
        );
    }

    #[test]
    fn answers_are_one_line_in_status_and_body() {
        let a = String::from_utf8(answer(403, "denied\r\nX-Injected: 1")).unwrap();
        assert!(
            a.starts_with("HTTP/1.1 403 denied  X-Injected: 1\r\n"),
            "{a}"
        );
        assert!(a.ends_with("\r\n\r\ndenied  X-Injected: 1\n"), "{a}");
        assert_eq!(
            status_of(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some(200)
        );
        assert_eq!(status_of(b"SSH-2.0\r\n"), None);
    }
}
