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
const EXT_SERVER_NAME: u16 = 0;

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
                return match server_name(&handshake[4..4 + body_len]) {
                    Some(name) => Hello::ClientHello { server_name: name },
                    None => Hello::Malformed,
                };
            }
        }
    }
}

/// A cursor over a ClientHello body; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The SNI host name of a ClientHello body: Some(None) when it has none,
/// None when it is malformed.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Some(None); // no extensions at all
    }
    let mut exts = Reader(r.vec16()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind as u16 == EXT_SERVER_NAME {
            let mut list = Reader(Reader(data).vec16()?);
            while !list.0.is_empty() {
                let name_type = list.u8()?;
                let name = list.vec16()?;
                if name_type == 0 {
                    let name = std::str::from_utf8(name).ok()?;
                    return Some(Some(name.trim_end_matches('.').to_ascii_lowercase()));
                }
            }
            return Some(None);
        }
    }
    Some(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello naming `sni` (or none), split into records of
    /// at most `record` payload bytes.
    pub(crate) fn client_hello(sni: Option<&str>, record: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let n = name.len() as u16;
            exts.extend([0, 0]);
            exts.extend((n + 5).to_be_bytes());
            exts.extend((n + 3).to_be_bytes());
            exts.push(0);
            exts.extend(n.to_be_bytes());
            exts.extend(name.as_bytes());
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
