//! The `allowlist` network mode's rules and how a request is judged by them.
//! Pure: no resolution, no sockets. The egress proxy (crate `pycell-egress`)
//! asks [`EgressRules::check`] about each request's host and
//! [`EgressRules::address_allowed`] about each address the name resolved to.
//!
//! A rule is `[SCHEME://]HOST[:PORT]`:
//! - SCHEME: `https` (the default: an HTTP CONNECT tunnel that must carry
//!   TLS, whose SNI must name HOST), `http` (plain HTTP requests, proxied
//!   in absolute form), `tcp` (a CONNECT tunnel carrying anything);
//! - HOST: a name (`api.github.com`), `*.NAME` (any name below NAME, not
//!   NAME itself), `*` (any name), an IP address (`10.0.0.5`, `[fd00::1]`)
//!   or a network (`10.0.0.0/8`);
//! - PORT: one port; by default 443 for https, 80 for http (tcp needs one).
//!
//! A `deny` rule wins over every `allow` rule; in it, a left-out scheme or
//! port means all of them. Names never match address requests, and an
//! address in a special range (loopback, private, link-local, ...) is
//! reachable only through an address rule that covers it, whatever name
//! led there.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a request reaches its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// A CONNECT tunnel carrying TLS.
    Https,
    /// A plain-HTTP request in absolute form.
    Http,
    /// A CONNECT tunnel carrying any protocol.
    Tcp,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Https => "https",
            Scheme::Http => "http",
            Scheme::Tcp => "tcp",
        }
    }

    fn default_port(self) -> Option<u16> {
        match self {
            Scheme::Https => Some(443),
            Scheme::Http => Some(80),
            Scheme::Tcp => None,
        }
    }

    /// Whether a CONNECT tunnel may be opened under a rule of this scheme.
    pub fn tunnels(self) -> bool {
        matches!(self, Scheme::Https | Scheme::Tcp)
    }
}

/// An IP network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(u32::from(net)) << 96,
                u128::from(u32::from(ip)) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    a & mask == b & mask
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is judged as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What a rule's host part matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPattern {
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any name that ends in `.SUFFIX`.
    Below(String),
    /// Any name at all (never an address).
    AnyName,
    /// Addresses in this network (a single address is a /32 or /128).
    Net(IpNet),
}

/// One allow or deny rule, as parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// None: every scheme (deny rules only).
    pub scheme: Option<Scheme>,
    pub host: HostPattern,
    /// None: every port (deny rules only).
    pub port: Option<u16>,
    /// The rule as the operator wrote it.
    pub text: String,
}

/// Which list a rule is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    Allow,
    Deny,
}

/// Why a host, a rule or a list of rules could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{0:?} is not a host name or IP address (names are ASCII: write internationalized names in punycode, xn--...)")]
    NotAHost(String),
    #[error("{0:?}: a tcp:// rule needs a port (tcp://HOST:PORT)")]
    TcpWithoutPort(String),
    #[error("unknown scheme {0:?}: use https:// (the default), http:// or tcp://")]
    UnknownScheme(String),
    #[error("{0:?}: unclosed \"[\"")]
    UnclosedBracket(String),
    #[error("{0:?}: expected \":PORT\" after \"]\"")]
    AfterBracket(String),
    #[error("{0:?}: write IPv6 addresses in brackets, [::1]:443")]
    UnbracketedIpv6(String),
    #[error("invalid port {0:?}: expected 1 to 65535")]
    Port(String),
    #[error("{0:?}: \"*\" may only stand alone or start a pattern (*.example.org)")]
    Wildcard(String),
    #[error("{0:?}: expected an IP network, such as 10.0.0.0/8")]
    NotANetwork(String),
    #[error("{pattern:?}: prefix length must be 0 to {max}")]
    PrefixLength { pattern: String, max: u8 },
}

/// The host a request names: a DNS name or an address literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Addr(IpAddr),
}

impl Host {
    /// Parse a request's host (already split from its port): an IP literal
    /// (IPv6 with or without brackets) or a DNS name, which is lowercased.
    /// A host that a resolver would read as an IPv4 address in any of the
    /// spellings `inet_aton` accepts (`3325256724`, `0xc6.0x33.0x64.0x14`,
    /// `0306.063.0144.024`, `127.1`) is that address; one whose last label
    /// is a number but that is no such address is refused, not taken as a
    /// name.
    pub fn parse(s: &str) -> Result<Host, RuleError> {
        let bare = s
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(s);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Addr(canonical(ip)));
        }
        if ends_in_a_number(bare) {
            return legacy_ipv4(bare)
                .map(|a| Host::Addr(IpAddr::V4(a)))
                .ok_or_else(|| RuleError::NotAHost(s.to_string()));
        }
        check_name(s).map(Host::Name)
    }
}

/// Whether the last label of `host` (a trailing dot aside) is a number
/// as `inet_aton` reads one: decimal digits, or `0x` and hex digits. Such
/// a host is an IPv4 address or nothing (the URL standard's rule).
pub fn ends_in_a_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// `host` read the way `inet_aton` reads it: one to four parts, each
/// decimal, octal (a leading `0`) or hex (`0x`); the last part fills the
/// bytes the others left. A trailing dot is allowed, as resolvers allow it.
pub fn legacy_ipv4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|p| inet_number(p))
        .collect::<Option<Vec<u64>>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (4 - leading.len() as u32);
    if *last >= 1u64 << last_bits {
        return None;
    }
    let high = leading
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, &n)| acc | n << (24 - 8 * i as u32));
    Some(Ipv4Addr::from((high | last) as u32))
}

/// One part of an `inet_aton` address, if it is one (at most 32 bits).
fn inet_number(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // `0x` alone is 0 to inet_aton; an empty part is nothing.
        return (radix == 16).then_some(0);
    }
    if digits.len() > 32 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|&n| n <= u64::from(u32::MAX))
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Addr(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Addr(a) => write!(f, "{a}"),
        }
    }
}

/// A DNS name, lowercased and without a trailing dot: labels of letters,
/// digits, `-` and `_`, 1 to 63 bytes each, 253 in all.
fn check_name(s: &str) -> Result<String, RuleError> {
    let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(RuleError::NotAHost(s.to_string()));
    }
    Ok(name)
}

impl Rule {
    /// Parse `[SCHEME://]HOST[:PORT]`.
    pub fn parse(text: &str, kind: RuleKind) -> Result<Rule, RuleError> {
        let (scheme, rest) = match text.split_once("://") {
            Some((s, rest)) => (Some(parse_scheme(s)?), rest),
            None => (None, text),
        };
        let (host, port) = split_host_port(rest)?;
        let host = parse_pattern(host)?;
        let scheme = match kind {
            RuleKind::Allow => Some(scheme.unwrap_or(Scheme::Https)),
            RuleKind::Deny => scheme,
        };
        let port = match (kind, port) {
            (_, Some(p)) => Some(p),
            (RuleKind::Deny, None) => None,
            (RuleKind::Allow, None) => {
                let s = scheme.expect("allow rules have a scheme");
                let port = s.default_port();
                Some(port.ok_or_else(|| RuleError::TcpWithoutPort(text.to_string()))?)
            }
        };
        Ok(Rule {
            scheme,
            host,
            port,
            text: text.to_owned(),
        })
    }

    fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostPattern::Name(n), Host::Name(h)) => n == h,
            (HostPattern::Below(s), Host::Name(h)) => {
                h.len() > s.len() + 1
                    && h.ends_with(s.as_str())
                    && h.as_bytes()[h.len() - s.len() - 1] == b'.'
            }
            (HostPattern::AnyName, Host::Name(_)) => true,
            (HostPattern::Net(net), Host::Addr(a)) => net.contains(*a),
            _ => false,
        }
    }

    fn matches(&self, scheme: Scheme, host: &Host, port: u16) -> bool {
        self.scheme.is_none_or(|s| s == scheme)
            && self.port.is_none_or(|p| p == port)
            && self.matches_host(host)
    }
}

/// The one host a pattern names, if it names one.
fn one_host(p: &HostPattern) -> Option<Host> {
    match p {
        HostPattern::Name(n) => Some(Host::Name(n.clone())),
        HostPattern::Net(net) if net.prefix == if net.addr.is_ipv4() { 32 } else { 128 } => {
            Some(Host::Addr(net.addr))
        }
        _ => None,
    }
}

fn parse_scheme(s: &str) -> Result<Scheme, RuleError> {
    match s.to_ascii_lowercase().as_str() {
        "https" => Ok(Scheme::Https),
        "http" => Ok(Scheme::Http),
        "tcp" => Ok(Scheme::Tcp),
        other => Err(RuleError::UnknownScheme(other.to_string())),
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, `net/len` (no port inside).
fn split_host_port(s: &str) -> Result<(&str, Option<u16>), RuleError> {
    if s.contains('/') && !s.starts_with('[') {
        // A network: 10.0.0.0/8 or 10.0.0.0/8:5432; v6 networks go in brackets.
        return match s.rsplit_once(':') {
            Some((h, p)) if h.contains('/') => Ok((h, Some(parse_port(p)?))),
            _ => Ok((s, None)),
        };
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or_else(|| RuleError::UnclosedBracket(s.to_string()))?;
        return match after {
            "" => Ok((inner, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((inner, Some(parse_port(p)?))),
                None => Err(RuleError::AfterBracket(s.to_string())),
            },
        };
    }
    match s.split_once(':') {
        Some((h, p)) if !p.contains(':') => Ok((h, Some(parse_port(p)?))),
        Some(_) => Err(RuleError::UnbracketedIpv6(s.to_string())),
        None => Ok((s, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, RuleError> {
    p.parse::<u16>()
        .ok()
        .filter(|&n| n != 0)
        .ok_or_else(|| RuleError::Port(p.to_string()))
}

fn parse_pattern(h: &str) -> Result<HostPattern, RuleError> {
    if h == "*" {
        return Ok(HostPattern::AnyName);
    }
    if let Some(suffix) = h.strip_prefix("*.") {
        return Ok(HostPattern::Below(check_name(suffix)?));
    }
    if h.contains('*') {
        return Err(RuleError::Wildcard(h.to_string()));
    }
    if let Some((addr, len)) = h.split_once('/') {
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| RuleError::NotANetwork(h.to_string()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = len
            .parse::<u8>()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| RuleError::PrefixLength {
                pattern: h.to_string(),
                max,
            })?;
        return Ok(HostPattern::Net(IpNet {
            addr: canonical(addr),
            prefix,
        }));
    }
    match Host::parse(h)? {
        Host::Addr(a) => Ok(HostPattern::Net(IpNet {
            addr: a,
            prefix: if a.is_ipv4() { 32 } else { 128 },
        })),
        Host::Name(n) => Ok(HostPattern::Name(n)),
    }
}

/// Per-run bounds on what the proxy does for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLimits {
    /// Connections (allowed or denied) a run may open to the proxy in all.
    pub max_connections: u32,
    /// Bytes relayed, both directions together.
    pub max_bytes: u64,
    /// How long the proxy waits for an upstream connection.
    #[serde(with = "millis")]
    pub connect_timeout: Duration,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_connections: 256,
            max_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// The `allowlist` mode: what a run may reach, and its limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRules {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    pub limits: EgressLimits,
}

/// Why a request was refused: a short reason (for the result's `denied`
/// list) and a sentence the caller can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: &'static str,
    pub detail: String,
}

/// Why rules cannot be cut down to a run's list ([`EgressRules::narrowed_to`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NarrowError {
    #[error("{text:?}: {error}")]
    Rule { text: String, error: RuleError },
    #[error("{text:?} is not on the policy's allowlist ({})", match .allowlist.is_empty() {
        true => "which is empty".to_string(),
        false => .allowlist.join(", "),
    })]
    NotAllowed {
        text: String,
        allowlist: Vec<String>,
    },
}

impl EgressRules {
    /// Rules from their text (as a policy file writes them), for callers
    /// that build an allowlist themselves: the install jail's index host,
    /// tests, benchmarks. The error names the first bad rule.
    pub fn from_texts<A: AsRef<str>, D: AsRef<str>>(
        allow: &[A],
        deny: &[D],
        limits: EgressLimits,
    ) -> Result<EgressRules, RuleError> {
        let parse = |texts: &[&str], kind| -> Result<Vec<Rule>, RuleError> {
            texts.iter().map(|t| Rule::parse(t, kind)).collect()
        };
        let allow: Vec<&str> = allow.iter().map(AsRef::as_ref).collect();
        let deny: Vec<&str> = deny.iter().map(AsRef::as_ref).collect();
        Ok(EgressRules {
            allow: parse(&allow, RuleKind::Allow)?,
            deny: parse(&deny, RuleKind::Deny)?,
            limits,
        })
    }

    /// These rules cut down to `texts` (`pycell mcp-server --allow`
    /// through pycelld): each an allow rule these rules already allow,
    /// either written the same or naming one host (a name or one
    /// address) and port that [`EgressRules::check`] lets through. The
    /// deny rules and limits stay. The error names the first rule that is
    /// not allowed.
    pub fn narrowed_to<S: AsRef<str>>(&self, texts: &[S]) -> Result<EgressRules, NarrowError> {
        let mut allow = Vec::with_capacity(texts.len());
        for text in texts {
            let text = text.as_ref();
            let rule = Rule::parse(text, RuleKind::Allow).map_err(|error| NarrowError::Rule {
                text: text.to_string(),
                error,
            })?;
            let same =
                |a: &Rule| a.scheme == rule.scheme && a.host == rule.host && a.port == rule.port;
            let passes = match (rule.scheme, one_host(&rule.host), rule.port) {
                (Some(s), Some(h), Some(p)) => self.check(s, &h, p).is_ok(),
                _ => false,
            };
            if !self.allow.iter().any(same) && !passes {
                return Err(NarrowError::NotAllowed {
                    text: text.to_string(),
                    allowlist: self.allowed(),
                });
            }
            allow.push(rule);
        }
        Ok(EgressRules {
            allow,
            deny: self.deny.clone(),
            limits: self.limits,
        })
    }

    /// The allow rule that lets `scheme://host:port` through, or why none does.
    pub fn check(&self, scheme: Scheme, host: &Host, port: u16) -> Result<&Rule, Denial> {
        if let Some(d) = self.deny.iter().find(|r| r.matches(scheme, host, port)) {
            return Err(Denial {
                reason: "denied_by_rule",
                detail: format!("deny rule {:?} matches it", d.text),
            });
        }
        if let Some(a) = self.allow.iter().find(|r| r.matches(scheme, host, port)) {
            return Ok(a);
        }
        Err(self.not_allowed(scheme, host, port))
    }

    fn not_allowed(&self, scheme: Scheme, host: &Host, port: u16) -> Denial {
        let for_host: Vec<&Rule> = self.allow.iter().filter(|r| r.matches_host(host)).collect();
        let same_scheme: Vec<String> = for_host
            .iter()
            .filter(|r| r.scheme == Some(scheme))
            .filter_map(|r| r.port.map(|p| p.to_string()))
            .collect();
        let (reason, detail) = match host {
            _ if !same_scheme.is_empty() => (
                "port_not_allowed",
                format!(
                    "port {port} is not allowed for this host (allowed: {})",
                    same_scheme.join(", ")
                ),
            ),
            _ if scheme == Scheme::Http && !for_host.is_empty() => (
                "plain_http_not_allowed",
                "plain HTTP is not allowed for this host: use https://".to_owned(),
            ),
            _ if !for_host.is_empty() => (
                "scheme_not_allowed",
                format!(
                    "a {} connection is not allowed for this host; its rules: {}",
                    scheme.as_str(),
                    for_host
                        .iter()
                        .map(|r| r.text.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Host::Addr(_) => (
                "not_allowlisted",
                "IP addresses are reachable only through address rules; use the host's name"
                    .to_owned(),
            ),
            Host::Name(_) => ("not_allowlisted", "not on the allowlist".to_owned()),
        };
        Denial { reason, detail }
    }

    /// Whether the proxy may connect to `addr` for a request allowed as
    /// `scheme` on `port`: addresses in a special range need an address
    /// rule covering them; any address may be denied by one.
    pub fn address_allowed(&self, scheme: Scheme, addr: IpAddr, port: u16) -> Result<(), Denial> {
        let host = Host::Addr(canonical(addr));
        if let Some(d) = self.deny.iter().find(|r| r.matches(scheme, &host, port)) {
            return Err(Denial {
                reason: "denied_by_rule",
                detail: format!(
                    "it resolves to {addr}, which deny rule {:?} matches",
                    d.text
                ),
            });
        }
        match special_range(addr) {
            None => Ok(()),
            Some(_) if self.allow.iter().any(|r| r.matches(scheme, &host, port)) => Ok(()),
            Some(range) => Err(Denial {
                reason: "private_address",
                detail: format!(
                    "it resolves to {addr}, a {range} address, which only an address rule (such as \"{}\") may allow",
                    Host::Addr(canonical(addr))
                ),
            }),
        }
    }

    /// The allow rules as written, for people and models to read.
    pub fn allowed(&self) -> Vec<String> {
        self.allow.iter().map(|r| r.text.clone()).collect()
    }

    /// The deny rules as written.
    pub fn denied(&self) -> Vec<String> {
        self.deny.iter().map(|r| r.text.clone()).collect()
    }
}

/// The kind of special address `ip` is, if it is one: an address a name
/// must not lead to unless a rule names it (the host's own services, its
/// LAN, the cloud's metadata service).
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(a) => special_v4(a),
        IpAddr::V6(a) => special_v6(a),
    }
}

fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    let in_net = |net: [u8; 4], prefix: u8| {
        IpNet {
            addr: IpAddr::V4(Ipv4Addr::from(net)),
            prefix,
        }
        .contains(IpAddr::V4(a))
    };
    Some(match () {
        _ if a.is_loopback() => "loopback",
        _ if a.is_unspecified() || o[0] == 0 => "unspecified",
        _ if a == Ipv4Addr::new(169, 254, 169, 254) => "cloud metadata",
        _ if a.is_link_local() => "link-local",
        _ if a.is_private() => "private",
        _ if in_net([100, 64, 0, 0], 10) => "shared (carrier-grade NAT)",
        _ if in_net([192, 0, 0, 0], 24) => "IETF protocol assignment",
        _ if in_net([198, 18, 0, 0], 15) => "benchmarking",
        _ if a.is_multicast() => "multicast",
        _ if o[0] >= 240 => "reserved",
        _ => return None,
    })
}

fn special_v6(a: Ipv6Addr) -> Option<&'static str> {
    let seg = a.segments();
    Some(match () {
        _ if a.is_loopback() => "loopback",
        _ if a.is_unspecified() => "unspecified",
        _ if a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => "cloud metadata",
        _ if seg[0] & 0xfe00 == 0xfc00 => "private (unique local)",
        _ if seg[0] & 0xffc0 == 0xfe80 => "link-local",
        _ if a.is_multicast() => "multicast",
        // IPv4-compatible, NAT64 and 6to4 forms can carry any IPv4 address.
        _ if seg[..6] == [0; 6] => "IPv4-compatible",
        _ if seg[..2] == [0x64, 0xff9b] => "NAT64",
        _ if seg[0] == 0x2002 => "6to4",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> EgressRules {
        EgressRules::from_texts(allow, deny, EgressLimits::default()).unwrap()
    }

    fn name(n: &str) -> Host {
        Host::parse(n).unwrap()
    }

    #[test]
    fn a_narrowed_allowlist_keeps_only_what_the_policy_allows() {
        let policy = rules(
            &["*.example.net", "http://10.0.0.0/8:8080"],
            &["bad.example.net"],
        );
        let n = policy
            .narrowed_to(&["api.example.net", "http://10.1.2.3:8080", "*.example.net"])
            .unwrap();
        assert_eq!(
            n.allowed(),
            ["api.example.net", "http://10.1.2.3:8080", "*.example.net"]
        );
        assert_eq!(n.deny, policy.deny);
        assert!(n
            .check(Scheme::Https, &name("api.example.net"), 443)
            .is_ok());
        assert!(n
            .check(Scheme::Https, &name("other.example.net"), 443)
            .is_ok());
        let only = policy.narrowed_to(&["api.example.net"]).unwrap();
        assert!(only
            .check(Scheme::Https, &name("other.example.net"), 443)
            .is_err());
        for outside in [
            "example.org",
            "api.example.net:8443",
            "http://api.example.net",
            "*.net",
            "http://10.0.0.0/16:8080",
            "bad.example.net",
        ] {
            let e = policy.narrowed_to(&[outside]).unwrap_err().to_string();
            assert!(
                e.contains("not on the policy's allowlist"),
                "{outside}: {e}"
            );
        }
        assert!(matches!(
            policy.narrowed_to(&["ftp://x"]),
            Err(NarrowError::Rule { .. })
        ));
        assert!(rules(&[], &[])
            .narrowed_to(&["a.example.net"])
            .unwrap_err()
            .to_string()
            .contains("which is empty"));
    }

    #[test]
    fn rules_parse_with_default_schemes_and_ports() {
        let r = Rule::parse("api.github.com", RuleKind::Allow).unwrap();
        assert_eq!((r.scheme, r.port), (Some(Scheme::Https), Some(443)));
        assert_eq!(r.host, HostPattern::Name("api.github.com".into()));
        let r = Rule::parse("http://Mirror.Example.NET.", RuleKind::Allow).unwrap();
        assert_eq!((r.scheme, r.port), (Some(Scheme::Http), Some(80)));
        assert_eq!(r.host, HostPattern::Name("mirror.example.net".into()));
        let r = Rule::parse("data.example.com:8443", RuleKind::Allow).unwrap();
        assert_eq!(r.port, Some(8443));
        let r = Rule::parse("*.example.org", RuleKind::Deny).unwrap();
        assert_eq!((r.scheme, r.port), (None, None));
        let r = Rule::parse("10.0.0.0/8:5432", RuleKind::Allow).unwrap();
        assert_eq!(r.port, Some(5432));
        assert!(matches!(r.host, HostPattern::Net(IpNet { prefix: 8, .. })));
        let r = Rule::parse("tcp://[fd00::1]:22", RuleKind::Allow).unwrap();
        assert_eq!((r.scheme, r.port), (Some(Scheme::Tcp), Some(22)));
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        let err = |s: &str| Rule::parse(s, RuleKind::Allow).unwrap_err().to_string();
        assert!(err("ftp://x.example.net").contains("unknown scheme \"ftp\""));
        assert!(err("x.example.net:0").contains("invalid port \"0\""));
        assert!(err("x.example.net:99999").contains("invalid port"));
        assert!(err("tcp://x.example.net").contains("needs a port"));
        assert!(err("a.*.example.net").contains("may only stand alone"));
        assert!(err("bad host.example").contains("not a host name"));
        assert!(err("bücher.example").contains("punycode"));
        assert!(err("::1").contains("brackets"));
        assert!(err("10.0.0.0/33").contains("prefix length"));
        assert!(err("[::1").contains("unclosed"));
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let r = rules(&["api.example.net", "*.example.org"], &[]);
        assert!(r
            .check(Scheme::Https, &name("API.example.net"), 443)
            .is_ok());
        assert!(r
            .check(Scheme::Https, &name("a.b.example.org"), 443)
            .is_ok());
        assert!(r.check(Scheme::Https, &name("example.org"), 443).is_err());
        assert!(r
            .check(Scheme::Https, &name("badexample.org"), 443)
            .is_err());
        assert!(r.check(Scheme::Https, &name("x.example.net"), 443).is_err());
        assert!(r.check(Scheme::Tcp, &name("api.example.net"), 443).is_err());
    }

    #[test]
    fn deny_wins_and_reasons_say_what_to_change() {
        let r = rules(
            &["*.example.org", "http://plain.example.net"],
            &["secret.example.org"],
        );
        let d = r
            .check(Scheme::Https, &name("secret.example.org"), 443)
            .unwrap_err();
        assert_eq!(d.reason, "denied_by_rule");
        assert!(d.detail.contains("\"secret.example.org\""), "{}", d.detail);
        let d = r
            .check(Scheme::Http, &name("a.example.org"), 80)
            .unwrap_err();
        assert_eq!(d.reason, "plain_http_not_allowed");
        let d = r
            .check(Scheme::Https, &name("a.example.org"), 8443)
            .unwrap_err();
        assert_eq!(d.reason, "port_not_allowed");
        let d = r
            .check(Scheme::Https, &name("plain.example.net"), 443)
            .unwrap_err();
        assert_eq!(d.reason, "scheme_not_allowed");
        assert!(
            d.detail.contains("http://plain.example.net"),
            "{}",
            d.detail
        );
        assert!(r
            .check(Scheme::Http, &name("plain.example.net"), 80)
            .is_ok());
        let d = r.check(Scheme::Https, &name("1.2.3.4"), 443).unwrap_err();
        assert_eq!(d.reason, "not_allowlisted");
        assert!(d.detail.contains("address rules"));
    }

    #[test]
    fn special_addresses_need_an_address_rule() {
        let r = rules(&["*", "127.0.0.1:8443", "10.0.0.0/8"], &["10.9.0.0/16"]);
        let https = Scheme::Https;
        for a in [
            "127.0.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.2",
            "0.0.0.0",
            "100.64.0.1",
            "fd00:ec2::254",
            "::127.0.0.1",
        ] {
            let d = r
                .address_allowed(https, a.parse().unwrap(), 443)
                .unwrap_err();
            assert_eq!(d.reason, "private_address", "{a}");
        }
        assert!(r
            .address_allowed(https, "93.184.215.14".parse().unwrap(), 443)
            .is_ok());
        assert!(r
            .address_allowed(https, "127.0.0.1".parse().unwrap(), 8443)
            .is_ok());
        assert!(r
            .address_allowed(https, "::ffff:127.0.0.1".parse().unwrap(), 8443)
            .is_ok());
        assert!(r
            .address_allowed(https, "127.0.0.1".parse().unwrap(), 443)
            .is_err());
        assert!(r
            .address_allowed(https, "10.1.2.3".parse().unwrap(), 443)
            .is_ok());
        let d = r
            .address_allowed(https, "10.9.2.3".parse().unwrap(), 443)
            .unwrap_err();
        assert_eq!(d.reason, "denied_by_rule");
        assert!(special_range("169.254.169.254".parse().unwrap()) == Some("cloud metadata"));
    }

    #[test]
    fn ipv4_addresses_in_every_inet_aton_spelling_are_addresses() {
        let denied: IpAddr = "198.51.100.20".parse().unwrap();
        for spelling in [
            "3325256724",
            "0xc6336414",
            "0XC6336414",
            "0xc6.0x33.0x64.0x14",
            "0306.063.0144.024",
            "198.51.25620",
            "198.3367956",
            "0306.51.0x64.20",
            "198.51.100.20.",
        ] {
            assert_eq!(
                Host::parse(spelling).unwrap(),
                Host::Addr(denied),
                "{spelling}"
            );
        }
        assert_eq!(
            Host::parse("127.1").unwrap(),
            Host::Addr("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            Host::parse("0x").unwrap(),
            Host::Addr("0.0.0.0".parse().unwrap())
        );
        // Numbers that are no address are not names either.
        for bad in [
            "4294967296",
            "1.2.3.4.5",
            "08",
            "1.2.3.256",
            "example.123",
            "1..2",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad}");
        }
        // Names with digits stay names.
        for ok in ["1e100.net", "123.example.net", "0x10.example.net", "a1"] {
            assert!(matches!(Host::parse(ok), Ok(Host::Name(_))), "{ok}");
        }
        // So `*` (any name, never an address) no longer lets them through.
        let r = rules(&["*"], &["denied.example.net"]);
        for spelling in ["3325256724", "0xc6336414", "0306.063.0144.024"] {
            assert!(r.check(Scheme::Https, &name(spelling), 443).is_err());
        }
    }

    #[test]
    fn address_requests_match_only_address_rules() {
        let r = rules(&["*", "127.0.0.1:8443"], &[]);
        assert!(r.check(Scheme::Https, &name("127.0.0.1"), 8443).is_ok());
        assert!(r
            .check(Scheme::Https, &name("[::ffff:127.0.0.1]"), 8443)
            .is_ok());
        assert!(r.check(Scheme::Https, &name("8.8.8.8"), 443).is_err());
    }
}
