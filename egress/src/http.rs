//! The HTTP a proxy needs: the request head a client sends it (CONNECT in
//! authority form, anything else in absolute form), the head it forwards,
//! and its own one-line answers. Pure.

/// Largest request head accepted (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 100;

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
}

/// Where the head ends (just past its blank line), if it has.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Why a request head was refused (each message quotes at most 80
/// characters of the request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is not text")]
    NotText,
    #[error("malformed request line {0:?}")]
    RequestLine(String),
    #[error("malformed header line {0:?}")]
    HeaderLine(String),
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
}

/// Parse a complete head (through its blank line).
pub fn parse_head(raw: &[u8]) -> Result<Head, HeadError> {
    let text = std::str::from_utf8(raw).map_err(|_| HeadError::NotText)?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::RequestLine(clip(line)));
    };
    if !is_token(method) || !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(HeadError::RequestLine(clip(line)));
    }
    let target = if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        Target::Connect { host, port }
    } else {
        absolute(target)?
    };
    let mut headers = Vec::new();
    for l in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = l
            .split_once(':')
            .filter(|(n, _)| is_token(n))
            .ok_or_else(|| HeadError::HeaderLine(clip(l)))?;
        if headers.len() == MAX_HEADERS {
            return Err(HeadError::TooManyHeaders);
        }
        headers.push((name.to_string(), value.trim().to_string()));
    }
    Ok(Head {
        method: method.to_string(),
        target,
        headers,
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
    if host.is_empty() || host.contains('@') {
        return Err(bad());
    }
    Ok((host, port))
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
/// well formed.
pub fn status_of(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?.split("\r\n").next()?;
    let mut parts = line.splitn(3, ' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
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
                "malformed request line",
            ),
            ("GET  http://x/ HTTP/1.1\r\n\r\n", "malformed request line"),
            ("GET https://x/ HTTP/1.1\r\n\r\n", "with CONNECT"),
            ("GET http://u@x/ HTTP/1.1\r\n\r\n", "malformed host:port"),
            (
                "GET http://x/ HTTP/1.1\r\nno colon\r\n\r\n",
                "malformed header line",
            ),
            (
                "GET http://x/ HTTP/1.1\r\n folded: x\r\n\r\n",
                "malformed header line",
            ),
            ("\u{1}\u{2}\r\n\r\n", "malformed request line"),
        ] {
            let e = head(req).unwrap_err().to_string();
            assert!(e.contains(why), "{req:?}: {e}");
        }
        assert_eq!(
            parse_head(b"\xff\xfe\r\n\r\n").unwrap_err(),
            HeadError::NotText
        );
        let many = format!("GET http://x/ HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(101));
        assert_eq!(head(&many).unwrap_err(), HeadError::TooManyHeaders);
        assert!(HeadError::TooManyHeaders
            .to_string()
            .contains("more than 100 headers"));
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
