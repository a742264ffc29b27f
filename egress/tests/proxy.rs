//! The proxy on its own, against servers on loopback that the tests start
//! (no jail: the jail tests are the workspace's `tests/tests/egress.rs`).
//! The proxy listens where a jailer would hand it a listener, here on
//! 127.0.0.1 of the test's own namespace.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use pycell_egress::{Egress, EgressConfig, Upstream};
use pycell_policy::network::{EgressLimits, EgressRules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn rules(allow: &[String], deny: &[&str], limits: EgressLimits) -> EgressRules {
    EgressRules::from_texts(allow, deny, limits).unwrap()
}

/// A proxy serving `rules`, as a jailer's listener would be served.
fn proxy(rules: EgressRules, upstream: Upstream) -> (Egress, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = EgressConfig {
        policy: "test".into(),
        rules,
        upstream: Ok(upstream),
    };
    (Egress::start(OwnedFd::from(listener), config, None), addr)
}

/// An HTTP server that answers every request with its request line.
async fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&buf).to_string();
                let body = text.lines().next().unwrap_or("").to_string();
                let host = text
                    .lines()
                    .find(|l| l.starts_with("Host:"))
                    .unwrap_or("")
                    .to_string();
                let body = format!("{body}|{host}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

/// A server that echoes whatever it gets (a stand-in for a TLS server).
async fn echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Send `req` to the proxy and close our side; everything it answers
/// until it closes.
async fn ask(proxy: SocketAddr, req: &[u8]) -> String {
    ask_and(proxy, req, true).await
}

async fn ask_and(proxy: SocketAddr, req: &[u8], close: bool) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(req).await.unwrap();
    if close {
        s.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn limits() -> EgressLimits {
    EgressLimits::default()
}

#[tokio::test]
async fn plain_http_is_relayed_in_origin_form_under_an_http_rule() {
    let o = origin().await;
    let (egress, p) = proxy(
        rules(&[format!("http://127.0.0.1:{}", o.port())], &[], limits()),
        Upstream::default(),
    );
    let req = format!(
        "GET http://127.0.0.1:{}/data?x=1 HTTP/1.1\r\nProxy-Authorization: x\r\n\r\n",
        o.port()
    );
    let answer = ask(p, req.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with(&format!(
            "GET /data?x=1 HTTP/1.1|Host: 127.0.0.1:{}",
            o.port()
        )),
        "{answer}"
    );
    let report = egress.finish().await;
    assert_eq!(report.allowed.len(), 1, "{report:?}");
    assert_eq!(
        (report.allowed[0].host.as_str(), report.allowed[0].count),
        ("127.0.0.1", 1)
    );
    assert!(report.bytes_in > 0 && report.bytes_out > 0);
}

#[tokio::test]
async fn a_denied_host_gets_403_with_one_line_that_says_what_is_allowed() {
    let (egress, p) = proxy(
        rules(
            &["api.example.net".into(), "*.example.org".into()],
            &["bad.example.org"],
            limits(),
        ),
        Upstream::default(),
    );
    let a = ask(p, b"CONNECT evil.example.net:443 HTTP/1.1\r\n\r\n").await;
    let line = a.lines().next().unwrap();
    assert_eq!(
        line,
        "HTTP/1.1 403 pycell egress proxy: CONNECT evil.example.net:443 denied by network policy \"test\": not on the allowlist. Allowed: api.example.net, *.example.org"
    );
    let a = ask(p, b"CONNECT bad.example.org:443 HTTP/1.1\r\n\r\n").await;
    assert!(
        a.contains("deny rule \"bad.example.org\" matches it"),
        "{a}"
    );
    let a = ask(p, b"GET http://api.example.net/ HTTP/1.1\r\n\r\n").await;
    assert!(
        a.contains("plain HTTP is not allowed for this host: use https://"),
        "{a}"
    );
    let a = ask(p, b"CONNECT 93.184.215.14:443 HTTP/1.1\r\n\r\n").await;
    assert!(a.contains("reachable only through address rules"), "{a}");
    let report = egress.finish().await;
    let reasons: Vec<&str> = report.denied.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(reasons.len(), 4, "{report:?}");
    for r in [
        "not_allowlisted",
        "denied_by_rule",
        "plain_http_not_allowed",
    ] {
        assert!(reasons.contains(&r), "{reasons:?}");
    }
    assert!(report.allowed.is_empty() && report.bytes_in == 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_unless_an_address_rule_names_it() {
    let o = origin().await;
    let (egress, p) = proxy(
        rules(&[format!("http://localhost:{}", o.port())], &[], limits()),
        Upstream::default(),
    );
    let req = format!("GET http://localhost:{}/ HTTP/1.1\r\n\r\n", o.port());
    let a = ask(p, req.as_bytes()).await;
    assert!(a.starts_with("HTTP/1.1 403"), "{a}");
    assert!(
        a.contains("a loopback address, which only an address rule"),
        "{a}"
    );
    assert_eq!(egress.finish().await.denied[0].reason, "private_address");

    let allow = [
        format!("http://localhost:{}", o.port()),
        format!("http://127.0.0.1:{}", o.port()),
        format!("http://[::1]:{}", o.port()),
    ];
    let (egress, p) = proxy(rules(&allow, &[], limits()), Upstream::default());
    let a = ask(p, req.as_bytes()).await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(egress.finish().await.allowed[0].host, "localhost");
}

/// A ClientHello naming `sni`.
fn client_hello(sni: &str) -> Vec<u8> {
    let n = sni.len() as u16;
    let mut ext = vec![0, 0];
    ext.extend((n + 5).to_be_bytes());
    ext.extend((n + 3).to_be_bytes());
    ext.push(0);
    ext.extend(n.to_be_bytes());
    ext.extend(sni.as_bytes());
    let mut body = vec![3, 3];
    body.extend([1u8; 32]);
    body.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut hs = vec![1, 0];
    hs.extend((body.len() as u16).to_be_bytes());
    hs.extend(body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[tokio::test]
async fn tunnels_must_carry_tls_naming_their_host_unless_a_tcp_rule_allows_them() {
    let e = echo().await;
    let port = e.port();
    let allow = [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ];
    let (egress, p) = proxy(rules(&allow, &[], limits()), Upstream::default());
    let connect = format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n");
    // The right name: relayed (the echo server sends the hello back).
    let hello = client_hello("localhost");
    let a = ask(p, &[connect.as_bytes(), &hello].concat()).await;
    assert!(
        a.starts_with("HTTP/1.1 200 Connection established\r\n\r\n"),
        "{a}"
    );
    let mut s = TcpStream::connect(p).await.unwrap();
    s.write_all(connect.as_bytes()).await.unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).await.unwrap();
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, hello);
    drop(s);
    // Another name, or no TLS: closed without relaying a byte.
    let a = ask(
        p,
        &[connect.as_bytes(), &client_hello("evil.example.net")].concat(),
    )
    .await;
    assert_eq!(a, "HTTP/1.1 200 Connection established\r\n\r\n");
    let a = ask(p, &[connect.as_bytes(), b"GET / HTTP/1.1\r\n\r\n"].concat()).await;
    assert_eq!(a, "HTTP/1.1 200 Connection established\r\n\r\n");
    let report = egress.finish().await;
    let mut reasons: Vec<&str> = report.denied.iter().map(|d| d.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons, ["not_tls", "sni_mismatch"], "{report:?}");
    assert_eq!(report.allowed[0].count, 2);

    let (egress, p) = proxy(
        rules(&[format!("tcp://127.0.0.1:{port}")], &[], limits()),
        Upstream::default(),
    );
    let a = ask(
        p,
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nplain bytes").as_bytes(),
    )
    .await;
    assert!(a.ends_with("\r\n\r\nplain bytes"), "{a}");
    assert!(egress.finish().await.denied.is_empty());
}

#[tokio::test]
async fn garbage_gets_a_400_and_huge_heads_a_431() {
    let (egress, p) = proxy(
        rules(&["a.example.net".into()], &[], limits()),
        Upstream::default(),
    );
    for (req, status) in [
        (b"\x00\x01\x02 garbage\r\n\r\n".to_vec(), "400"),
        (b"GET / HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (b"CONNECT a.example.net HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (
            [
                b"GET http://a.example.net/ HTTP/1.1\r\nX: ".as_slice(),
                &[b'a'; 20000],
            ]
            .concat(),
            "431",
        ),
    ] {
        let a = ask(p, &req).await;
        assert!(
            a.starts_with(&format!(
                "HTTP/1.1 {status} pycell egress proxy: bad request"
            )),
            "{a}"
        );
    }
    let report = egress.finish().await;
    assert_eq!(
        report.denied.iter().map(|d| d.count).sum::<u64>(),
        5,
        "{report:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_client_is_answered_408_after_ten_seconds() {
    let (egress, p) = proxy(
        rules(&["a.example.net".into()], &[], limits()),
        Upstream::default(),
    );
    let a = ask_and(p, b"CONNECT a.example.net:443 HTTP/1.1\r\n", false).await;
    assert!(
        a.starts_with(
            "HTTP/1.1 408 pycell egress proxy: bad request: no complete request head within 10 s"
        ),
        "{a}"
    );
    egress.finish().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_get_429_and_bytes_beyond_it_end_the_relay() {
    let o = origin().await;
    let lim = EgressLimits {
        max_connections: 3,
        max_bytes: 10_000,
        ..limits()
    };
    let (egress, p) = proxy(
        rules(&[format!("http://127.0.0.1:{}", o.port())], &[], lim),
        Upstream::default(),
    );
    let req = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", o.port());
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(ask(p, req.as_bytes()).await);
    }
    assert!(
        answers[..3].iter().all(|a| a.starts_with("HTTP/1.1 200")),
        "{answers:?}"
    );
    assert!(
        answers[3..].iter().all(|a| a.starts_with(
            "HTTP/1.1 429 pycell egress proxy: refused: this run has opened its 3 connections"
        )),
        "{answers:?}"
    );
    let report = egress.finish().await;
    assert_eq!(report.limit_reached.as_deref(), Some("max_connections"));
    assert_eq!(report.denied[0].count, 17);

    let e = echo().await;
    let lim = EgressLimits {
        max_bytes: 100_000,
        ..limits()
    };
    let (egress, p) = proxy(
        rules(&[format!("tcp://127.0.0.1:{}", e.port())], &[], lim),
        Upstream::default(),
    );
    let mut s = TcpStream::connect(p).await.unwrap();
    s.write_all(format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", e.port()).as_bytes())
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        let (mut r, mut w) = s.into_split();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            let _ = r.read_to_end(&mut got).await;
            got.len()
        });
        for _ in 0..100 {
            if w.write_all(&[7u8; 10_000]).await.is_err() {
                break;
            }
        }
        reading.await.unwrap()
    });
    let got = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        got < 100_000,
        "relayed {got} bytes past a 100000-byte budget"
    );
    let report = egress.finish().await;
    assert_eq!(report.limit_reached.as_deref(), Some("max_bytes"));
    assert!(report.bytes_in + report.bytes_out <= 100_000, "{report:?}");
}

#[tokio::test]
async fn thousands_of_connects_are_answered_and_the_run_ends_them_all() {
    let e = echo().await;
    let lim = EgressLimits {
        max_connections: 64,
        ..limits()
    };
    let (egress, p) = proxy(
        rules(&[format!("tcp://127.0.0.1:{}", e.port())], &[], lim),
        Upstream::default(),
    );
    let connect = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", e.port());
    let mut open = Vec::new();
    for _ in 0..64 {
        let mut s = TcpStream::connect(p).await.unwrap();
        s.write_all(connect.as_bytes()).await.unwrap();
        let mut head = [0u8; 39];
        s.read_exact(&mut head).await.unwrap();
        open.push(s);
    }
    let mut refused = 0;
    for _ in 0..2000 {
        if ask(p, connect.as_bytes()).await.starts_with("HTTP/1.1 429") {
            refused += 1;
        }
    }
    assert_eq!(refused, 2000);
    let report = egress.finish().await;
    assert_eq!(report.allowed[0].count, 64);
    // The run is over: every tunnel it had open is closed.
    for mut s in open {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}

/// An upstream proxy that accepts one CONNECT and relays to `target`.
async fn upstream_proxy(target: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        let mut t = TcpStream::connect(target).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut s, &mut t).await;
        String::from_utf8(head).unwrap()
    });
    (addr, task)
}

#[tokio::test]
async fn the_hosts_own_proxy_is_used_when_its_environment_names_one() {
    let e = echo().await;
    let (up, seen) = upstream_proxy(e).await;
    let upstream = Upstream::from_vars(&|k| match k {
        "HTTPS_PROXY" => Some(format!("http://{up}")),
        _ => None,
    })
    .unwrap();
    let (egress, p) = proxy(rules(&["data.example.net".into()], &[], limits()), upstream);
    let hello = client_hello("data.example.net");
    let a = ask(
        p,
        &[
            b"CONNECT data.example.net:443 HTTP/1.1\r\n\r\n".as_slice(),
            &hello,
        ]
        .concat(),
    )
    .await;
    assert!(
        a.starts_with("HTTP/1.1 200 Connection established\r\n\r\n"),
        "{a}"
    );
    assert_eq!(
        seen.await.unwrap(),
        "CONNECT data.example.net:443 HTTP/1.1\r\nHost: data.example.net:443\r\n\r\n"
    );
    assert_eq!(egress.finish().await.allowed[0].host, "data.example.net");
}
