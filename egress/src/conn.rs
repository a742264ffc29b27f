//! One connection from a jail: read its head, judge it, open the way out,
//! relay. Every step is bounded in bytes and time; whatever happens, the
//! connection is recorded once, when it is dropped.

use std::net::SocketAddr;
use std::time::Duration;

use pycell_policy::network::{Denial, Host, Scheme};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{splice, FcntlArg, OFlag, SpliceFFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::body::Body;
use crate::http::{self, AnswerEnd, Head, Target};
use crate::tally::{ConnectionRecord, Tally};
use crate::tls::{self, Hello};
use crate::upstream::ProxyAddr;
use crate::{AuditHook, EgressConfig};

/// How long a client has to send its request head, or its TLS ClientHello.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes moved per splice call (and the relay pipe's size).
const CHUNK: usize = 1 << 20;

/// What every connection of a run shares.
pub(crate) struct Ctx {
    config: EgressConfig,
    audit: Option<AuditHook>,
    pub(crate) tally: Tally,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("policy", &self.config.policy)
            .finish()
    }
}

impl Ctx {
    pub(crate) fn new(config: EgressConfig, audit: Option<AuditHook>) -> Ctx {
        Ctx {
            tally: crate::tally::Tally::new(config.rules.limits),
            config,
            audit,
        }
    }

    fn allowed_list(&self) -> String {
        let all = self.config.rules.allowed();
        if all.is_empty() {
            return "nothing (the policy's allow list is empty)".into();
        }
        let mut out = String::new();
        for rule in all {
            if out.len() > 400 {
                out.push_str(", ...");
                break;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&rule);
        }
        out
    }
}

/// The connection's record, written to the tally and the audit hook when
/// it is dropped (also when the run ends and its task is aborted).
struct Recorded<'a> {
    ctx: &'a Ctx,
    rec: ConnectionRecord,
}

impl Drop for Recorded<'_> {
    fn drop(&mut self) {
        if self.rec.verdict.is_empty() {
            // Ended before anything was decided (the run ended first).
            self.rec.verdict = "denied";
            self.rec
                .reason
                .get_or_insert_with(|| "incomplete_request".into());
        }
        self.ctx.tally.record(&self.rec);
        if let Some(audit) = &self.ctx.audit {
            audit(&self.rec);
        }
    }
}

/// A refusal: the status, the reason word, and the line the client reads.
struct Refusal {
    status: u16,
    verdict: &'static str,
    reason: String,
    line: String,
}

impl Refusal {
    fn bad_request(status: u16, line: impl std::fmt::Display) -> Refusal {
        Refusal {
            status,
            verdict: "denied",
            reason: "bad_request".into(),
            line: format!("pycell egress proxy: bad request: {line}"),
        }
    }

    fn failed(status: u16, reason: &str, line: String) -> Refusal {
        Refusal {
            status,
            verdict: "failed",
            reason: reason.into(),
            line: format!("pycell egress proxy: {line}"),
        }
    }
}

/// A connection past the run's `max_connections`: answered at once, not
/// read (so a flood costs next to nothing).
pub(crate) fn refuse_over_limit(sock: TcpStream, ctx: &Ctx) {
    let line = format!(
        "pycell egress proxy: refused: this run has opened its {} connections (network.max_connections of policy \"{}\")",
        ctx.tally.limits().max_connections,
        ctx.config.policy
    );
    let _ = sock.try_write(&http::answer(429, &line));
    let rec = ConnectionRecord {
        host: "*".into(),
        verdict: "denied",
        reason: Some("connection_limit".into()),
        ..Default::default()
    };
    // Counted every time; audited the first time only (a flood must not
    // become a flood of log lines).
    if ctx.tally.record(&rec) == 1 {
        if let Some(audit) = &ctx.audit {
            audit(&rec);
        }
    }
}

pub(crate) async fn serve(mut client: TcpStream, ctx: std::sync::Arc<crate::conn::Ctx>) {
    let _ = client.set_nodelay(true);
    let mut rec = Recorded {
        ctx: &ctx,
        rec: ConnectionRecord::default(),
    };
    if let Err(r) = handle(&mut client, &ctx, &mut rec.rec).await {
        rec.rec.verdict = r.verdict;
        rec.rec.reason = Some(r.reason);
        if r.status != 0 {
            let _ = timeout(
                HEAD_TIMEOUT,
                client.write_all(&http::answer(r.status, &r.line)),
            )
            .await;
        }
    }
}

async fn handle(
    client: &mut TcpStream,
    ctx: &Ctx,
    rec: &mut ConnectionRecord,
) -> Result<(), Refusal> {
    let (head, rest) = read_head(client).await?;
    let (host_text, port, tunnel) = match &head.target {
        Target::Connect { host, port } => (host.clone(), *port, true),
        Target::Absolute { host, port, .. } => (host.clone(), *port, false),
    };
    rec.host = host_text.to_ascii_lowercase();
    rec.port = port;
    let host = Host::parse(&host_text).map_err(|e| Refusal::bad_request(400, e))?;
    let scheme = judge(ctx, &host, port, tunnel).map_err(|d| {
        rec.scheme = if tunnel { "https" } else { "http" };
        denied(ctx, tunnel, &host, port, d)
    })?;
    rec.scheme = scheme.as_str();
    let (upstream, address, via_proxy) = open(ctx, scheme, &host, port).await?;
    rec.address = Some(address);
    if !tunnel {
        rec.verdict = "allowed";
        let forwarded = http::forward_head(&head, via_proxy);
        let one = relay_one_request(client, upstream, &head, &forwarded, &rest, &ctx.tally).await;
        (rec.bytes_in, rec.bytes_out) = (one.bytes_in, one.bytes_out);
        return one.cut.map_or(Ok(()), |e| Err(quiet(e)));
    }
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .map_err(|_| quiet("client_gone"))?;
    let first = match scheme {
        Scheme::Https => client_hello(client, rest, &host).await?,
        _ => rest,
    };
    rec.verdict = "allowed";
    let (bytes_in, bytes_out) = relay(client, upstream, &first, &ctx.tally).await;
    rec.bytes_in = bytes_in;
    rec.bytes_out = bytes_out;
    Ok(())
}

/// A refusal whose answer cannot be sent (the tunnel is already open, or
/// the client is gone): just close.
fn quiet(reason: &str) -> Refusal {
    Refusal {
        status: 0,
        verdict: "denied",
        reason: reason.into(),
        line: String::new(),
    }
}

/// The scheme the policy allows this request under: a tunnel is judged as
/// https, then as tcp; anything else as plain http.
fn judge(ctx: &Ctx, host: &Host, port: u16, tunnel: bool) -> Result<Scheme, Denial> {
    let rules = &ctx.config.rules;
    if !tunnel {
        return rules.check(Scheme::Http, host, port).map(|_| Scheme::Http);
    }
    match rules.check(Scheme::Https, host, port) {
        Ok(_) => Ok(Scheme::Https),
        Err(d) => rules
            .check(Scheme::Tcp, host, port)
            .map(|_| Scheme::Tcp)
            .map_err(|_| d),
    }
}

fn denied(ctx: &Ctx, tunnel: bool, host: &Host, port: u16, d: Denial) -> Refusal {
    let what = if tunnel {
        format!("CONNECT {host}:{port}")
    } else {
        format!("plain HTTP to {host}:{port}")
    };
    Refusal {
        status: 403,
        verdict: "denied",
        reason: d.reason.to_string(),
        line: format!(
            "pycell egress proxy: {what} denied by network policy \"{}\": {}. Allowed: {}",
            ctx.config.policy,
            d.detail,
            ctx.allowed_list()
        ),
    }
}

/// Read one request head; what came after it stays with the caller.
async fn read_head(client: &mut TcpStream) -> Result<(Head, Vec<u8>), Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let end = timeout(HEAD_TIMEOUT, async {
        loop {
            if let Some(end) = http::head_end(&buf) {
                return Ok(end);
            }
            if buf.len() > http::MAX_HEAD {
                return Err(Refusal::bad_request(
                    431,
                    format!("the request head is larger than {} bytes", http::MAX_HEAD),
                ));
            }
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(quiet("incomplete_request")),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .map_err(|_| {
        Refusal::bad_request(
            408,
            format!(
                "no complete request head within {} s",
                HEAD_TIMEOUT.as_secs()
            ),
        )
    })??;
    let head = http::parse_head(&buf[..end]).map_err(|e| Refusal::bad_request(400, e))?;
    Ok((head, buf[end..].to_vec()))
}

/// Read the tunnel's first bytes until they show a ClientHello, and check
/// the name it asks for against the CONNECT host.
async fn client_hello(
    client: &mut TcpStream,
    mut buf: Vec<u8>,
    host: &Host,
) -> Result<Vec<u8>, Refusal> {
    let mut chunk = [0u8; 4096];
    let hello = timeout(HEAD_TIMEOUT, async {
        loop {
            match tls::inspect(&buf) {
                Hello::Incomplete if buf.len() <= tls::MAX_HELLO => {}
                Hello::Incomplete => return Hello::Malformed,
                other => return other,
            }
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return Hello::Incomplete,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .unwrap_or(Hello::Incomplete);
    match hello {
        Hello::ClientHello { server_name: None } => Ok(buf),
        Hello::ClientHello {
            server_name: Some(sni),
        } => match host {
            Host::Name(n) if *n == sni => Ok(buf),
            _ => Err(quiet("sni_mismatch")),
        },
        Hello::NotTls => Err(quiet("not_tls")),
        Hello::Malformed => Err(quiet("bad_client_hello")),
        Hello::Incomplete => Err(quiet("incomplete_request")),
    }
}

/// Connect to the host (or the host's own upstream proxy), within the
/// policy's connect timeout. Returns the stream, the address it leads to,
/// and whether it is an upstream proxy.
async fn open(
    ctx: &Ctx,
    scheme: Scheme,
    host: &Host,
    port: u16,
) -> Result<(TcpStream, String, bool), Refusal> {
    let limit = ctx.tally.limits().connect_timeout;
    let host_text = host.to_string();
    let upstream = ctx.config.upstream.as_ref().map_err(|e| {
        Refusal::failed(
            502,
            "upstream_unusable",
            format!("the host's proxy setting is unusable: {e}"),
        )
    })?;
    if let Some(proxy) = upstream.for_host(&host_text, scheme.tunnels()) {
        let stream = timeout(
            limit,
            via_upstream(proxy, &host_text, port, scheme.tunnels()),
        )
        .await
        .map_err(|_| timed_out(&host_text, port, limit))??;
        return Ok((stream, format!("proxy {}:{}", proxy.host, proxy.port), true));
    }
    let addrs = timeout(limit, resolve(ctx, scheme, host, port))
        .await
        .map_err(|_| timed_out(&host_text, port, limit))??;
    let connecting = async {
        let mut last = None;
        for addr in &addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok((s, addr.to_string())),
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        Err(last.unwrap_or_default())
    };
    match timeout(limit, connecting).await {
        Ok(Ok((s, a))) => {
            let _ = s.set_nodelay(true);
            Ok((s, a, false))
        }
        Ok(Err(e)) => Err(Refusal::failed(
            502,
            "connect_failed",
            format!("cannot connect to {host_text}:{port} ({e})"),
        )),
        Err(_) => Err(timed_out(&host_text, port, limit)),
    }
}

fn timed_out(host: &str, port: u16, limit: Duration) -> Refusal {
    Refusal::failed(
        504,
        "connect_timeout",
        format!(
            "{host}:{port} did not answer within {} ms (network.connect_timeout)",
            limit.as_millis()
        ),
    )
}

/// The addresses the proxy may connect to for `host`: the literal, or what
/// the name resolves to, minus what the rules refuse.
async fn resolve(
    ctx: &Ctx,
    scheme: Scheme,
    host: &Host,
    port: u16,
) -> Result<Vec<SocketAddr>, Refusal> {
    let all: Vec<SocketAddr> = match host {
        Host::Addr(a) => vec![SocketAddr::new(*a, port)],
        Host::Name(n) => tokio::net::lookup_host((n.as_str(), port))
            .await
            .map_err(|e| Refusal::failed(502, "dns_failed", format!("cannot resolve {n}: {e}")))?
            .collect(),
    };
    let mut first_denial = None;
    let ok: Vec<SocketAddr> = all
        .into_iter()
        .filter(
            |a| match ctx.config.rules.address_allowed(scheme, a.ip(), port) {
                Ok(()) => true,
                Err(d) => {
                    first_denial.get_or_insert(d);
                    false
                }
            },
        )
        .collect();
    match (ok.is_empty(), first_denial) {
        (false, _) => Ok(ok),
        (true, Some(d)) => Err(denied(ctx, scheme.tunnels(), host, port, d)),
        (true, None) => Err(Refusal::failed(
            502,
            "dns_failed",
            format!("{host} has no addresses"),
        )),
    }
}

/// A way out through the host's proxy: for a tunnel, a CONNECT it accepted.
async fn via_upstream(
    proxy: &ProxyAddr,
    host: &str,
    port: u16,
    tunnel: bool,
) -> Result<TcpStream, Refusal> {
    let fail = |e: String| Refusal::failed(502, "upstream_refused", e);
    let mut s = TcpStream::connect((proxy.host.as_str(), proxy.port))
        .await
        .map_err(|e| {
            fail(format!(
                "cannot reach the host's proxy {}:{} ({e})",
                proxy.host, proxy.port
            ))
        })?;
    let _ = s.set_nodelay(true);
    if !tunnel {
        return Ok(s);
    }
    s.write_all(
        format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| fail(format!("the host's proxy: {e}")))?;
    // Read its answer byte by byte, so nothing of the tunnel is consumed.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while http::head_end(&head).is_none() {
        if head.len() > http::MAX_HEAD
            || s.read(&mut b).await.map_err(|e| fail(e.to_string()))? == 0
        {
            return Err(fail("the host's proxy closed the connection".into()));
        }
        head.push(b[0]);
    }
    match http::status_of(&head) {
        Some(200..=299) => Ok(s),
        Some(code) => Err(fail(format!(
            "the host's proxy answered {code} to CONNECT {host}:{port}"
        ))),
        None => Err(fail("the host's proxy sent a malformed answer".into())),
    }
}

/// Relay both ways until both sides are done (or the run's byte budget is
/// spent); `first` goes to the host before anything else. Returns the bytes
/// relayed in and out.
async fn relay(
    client: &mut TcpStream,
    mut upstream: TcpStream,
    first: &[u8],
    tally: &Tally,
) -> (u64, u64) {
    let sent_first = first.is_empty()
        || (tally.charge(first.len() as u64, false) && upstream.write_all(first).await.is_ok());
    if !sent_first {
        return (0, 0);
    }
    let (out, inn) = tokio::join!(
        pump(client, &upstream, tally, false),
        pump(&upstream, client, tally, true)
    );
    (inn, out + first.len() as u64)
}

/// What became of one plain-HTTP request.
struct OneRequest {
    bytes_in: u64,
    bytes_out: u64,
    /// Why the request was cut off, if it was (a malformed body).
    cut: Option<&'static str>,
}

/// Forward `head`, then the request's body as its framing bounds it
/// (`rest` is what came after the head), and nothing after the body;
/// meanwhile relay the one answer, as its own framing bounds it. Then the
/// connection ends, whatever the client or the origin would send next.
async fn relay_one_request(
    client: &mut TcpStream,
    upstream: TcpStream,
    head: &Head,
    forwarded: &[u8],
    rest: &[u8],
    tally: &Tally,
) -> OneRequest {
    let mut one = OneRequest {
        bytes_in: 0,
        bytes_out: 0,
        cut: None,
    };
    if !send(&upstream, forwarded, tally, false).await {
        return one;
    }
    let request = forward_body(client, &upstream, rest, Body::new(head.body), tally);
    let answer = forward_answer(&upstream, client, &head.method, tally);
    tokio::pin!(request, answer);
    let mut sent = None;
    one.bytes_in = loop {
        tokio::select! {
            r = &mut request, if sent.is_none() => sent = Some(r),
            n = &mut answer => break n,
        }
    };
    let _ = nix::sys::socket::shutdown(client.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    one.bytes_out = forwarded.len() as u64;
    match sent {
        Some(Ok(n)) => one.bytes_out += n,
        Some(Err(e)) => one.cut = Some(e),
        None => {}
    }
    one
}

/// Relay the origin's answer: interim (1xx) heads, then the final head
/// and its body as its framing bounds it (or, unframed, until the origin
/// closes). The bytes relayed.
async fn forward_answer(
    upstream: &TcpStream,
    client: &TcpStream,
    method: &str,
    tally: &Tally,
) -> u64 {
    let mut total = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let end = loop {
            if let Some(end) = http::head_end(&buf) {
                break Some(end);
            }
            if buf.len() > http::MAX_ANSWER_HEAD {
                break None;
            }
            match read_some(upstream, &mut chunk).await {
                Some(n) => buf.extend_from_slice(&chunk[..n]),
                None => break None,
            }
        };
        let how = end.and_then(|end| http::answer_end(&buf[..end], method));
        let (end, framing) = match (end, how) {
            (Some(end), Some(AnswerEnd::Interim)) => {
                if !send(client, &buf[..end], tally, true).await {
                    return total;
                }
                total += end as u64;
                buf.drain(..end);
                continue;
            }
            (Some(end), Some(AnswerEnd::Framed(framing))) => (end, framing),
            _ => {
                // Unframed (or not HTTP): what came, then all until close.
                if !send(client, &buf, tally, true).await {
                    return total;
                }
                return total + buf.len() as u64 + pump(upstream, client, tally, true).await;
            }
        };
        let mut body = Body::new(framing);
        let taken = end + body.feed(&buf[end..]).unwrap_or(0);
        if !send(client, &buf[..taken], tally, true).await {
            return total;
        }
        total += taken as u64;
        while !body.is_done() {
            let Some(n) = read_some(upstream, &mut chunk).await else {
                return total;
            };
            let Ok(taken) = body.feed(&chunk[..n]) else {
                return total;
            };
            if !send(client, &chunk[..taken], tally, true).await {
                return total;
            }
            total += taken as u64;
        }
        return total;
    }
}

/// Charge `bytes` to the run's budget and write them; false if either
/// fails.
async fn send(to: &TcpStream, bytes: &[u8], tally: &Tally, inbound: bool) -> bool {
    bytes.is_empty()
        || (tally.charge(bytes.len() as u64, inbound) && write_all(to, bytes).await.is_ok())
}

/// Copy the request's body from the client (first what is in `rest`)
/// until its framing says it ended; a malformed body shuts the origin's
/// connection both ways, so its answer ends too. The bytes forwarded.
async fn forward_body(
    client: &TcpStream,
    upstream: &TcpStream,
    rest: &[u8],
    mut body: Body,
    tally: &Tally,
) -> Result<u64, &'static str> {
    let mut total = 0u64;
    let mut pending = rest.len();
    let mut buf = rest.to_vec();
    buf.resize(pending.max(64 * 1024), 0);
    loop {
        let taken = match body.feed(&buf[..pending]) {
            Ok(n) => n,
            Err(_) => {
                let _ = nix::sys::socket::shutdown(
                    upstream.as_raw_fd(),
                    nix::sys::socket::Shutdown::Both,
                );
                return Err("bad_request_body");
            }
        };
        if !send(upstream, &buf[..taken], tally, false).await {
            return Ok(total);
        }
        total += taken as u64;
        if body.is_done() {
            return Ok(total);
        }
        pending = match read_some(client, &mut buf).await {
            Some(n) => n,
            None => return Ok(total),
        };
    }
}

/// Read what the socket has (at least a byte); None at EOF or on an error.
async fn read_some(from: &TcpStream, buf: &mut [u8]) -> Option<usize> {
    loop {
        from.readable().await.ok()?;
        match from.try_read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    }
}

async fn write_all(to: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        to.writable().await?;
        match to.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Move bytes from `from` to `to` until EOF, an error or the budget's end,
/// through a pipe with splice(2): the kernel moves the pages, the proxy
/// never copies them. Then shut `to` for writing.
async fn pump(from: &TcpStream, to: &TcpStream, tally: &Tally, inbound: bool) -> u64 {
    let mut total = 0u64;
    if let Ok((pipe_out, pipe_in)) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK) {
        // A bigger pipe moves more per call; the default (64 KiB) also works.
        let _ = nix::fcntl::fcntl(&pipe_in, FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
        while let Some(n) = splice_once(from, &pipe_in, &pipe_out, to, tally, inbound).await {
            total += n as u64;
        }
    }
    let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    total
}

/// One chunk: socket → pipe, then pipe → socket until the pipe is empty.
/// None at EOF, on an error, or when the budget is spent.
async fn splice_once(
    from: &TcpStream,
    pipe_in: &OwnedFd,
    pipe_out: &OwnedFd,
    to: &TcpStream,
    tally: &Tally,
    inbound: bool,
) -> Option<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let n = loop {
        from.readable().await.ok()?;
        let moved = from.try_io(Interest::READABLE, || {
            splice(from, None, pipe_in, None, CHUNK, flags).map_err(std::io::Error::from)
        });
        match moved {
            Ok(0) => return None,
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    };
    if !tally.charge(n as u64, inbound) {
        return None;
    }
    let mut left = n;
    while left > 0 {
        to.writable().await.ok()?;
        let moved = to.try_io(Interest::WRITABLE, || {
            splice(pipe_out, None, to, None, left, flags).map_err(std::io::Error::from)
        });
        match moved {
            Ok(m) => left -= m,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    }
    Some(n)
}
