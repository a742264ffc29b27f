//! Just enough of TLS to read the server name (SNI) a client asks for in
//! its ClientHello, which may span several handshake records. Pure.

/// What the first bytes of a tunnel say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not a TLS handshake record.
    NotTls,
    /// A handshake that is not yet complete: read more.
    Incomplete,
    /// A ClientHello, with the name it asks for if any.
    ClientHello { server_name: Option<String> },
    /// A TLS record that is not a well-formed ClientHello.
    Malformed,
}

/// Largest ClientHello we wait for (a post-quantum key share makes them
/// a few KiB; 16 KiB is one full record).
pub const MAX_HELLO: usize = 16 * 1024 + 5;

const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 0x01;

/// Inspect the bytes a client sent first on a tunnel.
pub fn inspect(buf: &[u8]) -> Hello {
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.is_empty() {
            return Hello::Incomplete;
        }
        if rest[0] != HANDSHAKE || (rest.len() > 1 && rest[1] != 3) {
            return if handshake.is_empty() {
                Hello::NotTls
            } else {
                Hello::Malformed
            };
        }
        if rest.len() < 5 {
            return Hello::Incomplete;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 16 * 1024 + 256 {
            return Hello::Malformed;
        }
        let Some(payload) = rest.get(5..5 + len) else {
            return Hello::Incomplete;
        };
        handshake.extend_from_slice(payload);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != CLIENT_HELLO {
                return Hello::Malformed;
            }
            let body_len =
                u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if body_len > MAX_HELLO {
                return Hello::Malformed;
            }
            if handshake.len() >= 4 + body_len {
                return match server_name(&handshake[..4 + body_len]) {
                    Some(name) => Hello::ClientHello { server_name: name },
                    None => Hello::Malformed,
                };
            }
        }
    }
}

/// The SNI host name of a complete ClientHello handshake message (type
/// and length included), as `tls-parser` reads it: Some(None) when it
/// has no server-name extension, None when it is malformed or breaks a
/// rule TLS libraries enforce (a repeated extension, a server-name list
/// that is not exactly one host name, a name that is not a host name).
fn server_name(handshake: &[u8]) -> Option<Option<String>> {
    use tls_parser::{TlsExtension, TlsExtensionType, TlsMessage, TlsMessageHandshake};
    let (left, msg) = tls_parser::parse_tls_message_handshake(handshake).ok()?;
    let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) = msg else {
        return None;
    };
    if !left.is_empty() {
        return None;
    }
    let Some(raw) = hello.ext else {
        return Some(None);
    };
    let (left, extensions) = tls_parser::parse_tls_client_hello_extensions(raw).ok()?;
    if !left.is_empty() {
        return None;
    }
    let mut kinds: Vec<u16> = extensions
        .iter()
        .map(|e| TlsExtensionType::from(e).0)
        .collect();
    kinds.sort_unstable();
    if kinds.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let names = extensions.iter().find_map(|e| match e {
        TlsExtension::SNI(names) => Some(names),
        _ => None,
    });
    let Some(names) = names else {
        return Some(None);
    };
    let [(kind, name)] = names[..] else {
        return None;
    };
    let name = std::str::from_utf8(name).ok().filter(|_| kind.0 == 0)?;
    let host = name.strip_suffix('.').unwrap_or(name);
    let host_name = (1..=253).contains(&host.len())
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        });
    host_name.then(|| Some(host.to_ascii_lowercase()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello naming `sni` (or none), split into records of
    /// at most `record` payload bytes.
    pub(crate) fn client_hello(sni: Option<&str>, record: usize) -> Vec<u8> {
        let names: Vec<&str> = sni.into_iter().collect();
        client_hello_naming(&names, usize::from(sni.is_some()), 0, record)
    }

    /// A ClientHello with `extensions` server-name extensions, each
    /// listing `names` as host names (type `kind`).
    fn client_hello_naming(names: &[&str], extensions: usize, kind: u8, record: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut exts = Vec::new();
        let mut list = Vec::new();
        for name in names {
            list.push(kind);
            list.extend((name.len() as u16).to_be_bytes());
            list.extend(name.as_bytes());
        }
        for _ in 0..extensions {
            exts.extend([0, 0]);
            exts.extend((list.len() as u16 + 2).to_be_bytes());
            exts.extend((list.len() as u16).to_be_bytes());
            exts.extend(&list);
        }
        exts.extend([0, 0x2b, 0, 3, 2, 3, 4]); // supported_versions
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut hs = vec![CLIENT_HELLO, 0];
        hs.extend((body.len() as u16).to_be_bytes());
        hs.extend(body);
        let mut out = Vec::new();
        for chunk in hs.chunks(record) {
            out.extend([HANDSHAKE, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_even_across_records() {
        for record in [16384, 20, 1] {
            let hello = client_hello(Some("API.Example.NET."), record);
            assert_eq!(
                inspect(&hello),
                Hello::ClientHello {
                    server_name: Some("api.example.net".into())
                },
                "records of {record}"
            );
            assert_eq!(inspect(&hello[..hello.len() - 1]), Hello::Incomplete);
        }
        assert_eq!(
            inspect(&client_hello(None, 16384)),
            Hello::ClientHello { server_name: None }
        );
    }

    #[test]
    fn a_hello_must_name_exactly_one_host_once() {
        let allowed = "allowed.example.net";
        let other = "other.example.net";
        for (hello, what) in [
            (
                client_hello_naming(&[allowed, other], 1, 0, 16384),
                "two names",
            ),
            (
                client_hello_naming(&[allowed], 2, 0, 16384),
                "two extensions",
            ),
            (
                client_hello_naming(&[allowed, allowed], 1, 0, 16384),
                "one name twice",
            ),
            (client_hello_naming(&[], 1, 0, 16384), "an empty list"),
            (
                client_hello_naming(&[allowed], 1, 1, 16384),
                "a name of another type",
            ),
            (
                client_hello_naming(&["a\0.example.net"], 1, 0, 16384),
                "a NUL",
            ),
            (client_hello_naming(&[""], 1, 0, 16384), "an empty name"),
            // Found by fuzzing: a name of dots only was read as "".
            (client_hello_naming(&["."], 1, 0, 16384), "a lone dot"),
            (client_hello_naming(&[".."], 1, 0, 16384), "two dots"),
        ] {
            assert_eq!(inspect(&hello), Hello::Malformed, "{what}");
        }
        assert_eq!(
            inspect(&client_hello_naming(&[allowed], 1, 0, 7)),
            Hello::ClientHello {
                server_name: Some(allowed.into())
            }
        );
    }

    #[test]
    fn other_bytes_are_not_tls_or_malformed() {
        assert_eq!(inspect(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(inspect(b"SSH-2.0-x"), Hello::NotTls);
        assert_eq!(inspect(&[0x16, 3, 1, 0, 0]), Hello::Malformed);
        let mut hello = client_hello(Some("a.example.net"), 16384);
        hello[5] = 2; // a ServerHello
        assert_eq!(inspect(&hello), Hello::Malformed);
        let mut hello = client_hello(Some("a.example.net"), 16384);
        let n = hello.len();
        hello[n - 9] = 0xff; // an extension length past the end
        assert_eq!(inspect(&hello), Hello::Malformed);
        assert_eq!(inspect(&[]), Hello::Incomplete);
    }
}
