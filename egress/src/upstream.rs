//! The proxy's own way out: direct, or through the proxy its host must use
//! (`HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY`, minus `NO_PROXY`, read from the
//! environment of the process that runs it: pycelld's unit, or the user's
//! shell for embedded runs). Pure apart from reading the environment.

/// An upstream HTTP proxy: `host:port` (credentials in the URL are not
/// supported and refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyAddr {
    pub host: String,
    pub port: u16,
}

/// How the egress proxy reaches hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstream {
    /// For CONNECT tunnels (HTTPS_PROXY, else ALL_PROXY).
    pub https: Option<ProxyAddr>,
    /// For plain HTTP (HTTP_PROXY, else ALL_PROXY).
    pub http: Option<ProxyAddr>,
    /// NO_PROXY entries, lowercased, without a leading dot.
    pub no_proxy: Vec<String>,
}

fn var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .or_else(|| env(&name.to_ascii_lowercase()))
        .filter(|v| !v.trim().is_empty())
}

/// Why the host's proxy settings (`HTTPS_PROXY` and the like) cannot be
/// used; each names the variable and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("{name}={url:?}: only http:// proxies are supported")]
    NotHttp { name: String, url: String },
    #[error("{name}={url:?}: proxy credentials are not supported")]
    Credentials { name: String, url: String },
    #[error("{name}={url:?}: bad port")]
    Port { name: String, url: String },
    #[error("{name}={url:?}: no host")]
    NoHost { name: String, url: String },
}

/// `http://host:port[/]` (or `host:port`).
fn parse_proxy_url(name: &str, url: &str) -> Result<ProxyAddr, UpstreamError> {
    let (name, url_text) = (name.to_string(), url.to_string());
    let rest = url.trim();
    let rest = rest.strip_prefix("http://").unwrap_or(rest);
    if rest.contains("://") {
        return Err(UpstreamError::NotHttp {
            name,
            url: url_text,
        });
    }
    if rest.contains('@') {
        return Err(UpstreamError::Credentials {
            name,
            url: url_text,
        });
    }
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() => (
            h,
            p.parse::<u16>().map_err(|_| UpstreamError::Port {
                name: name.clone(),
                url: url_text.clone(),
            })?,
        ),
        _ => (rest, 80),
    };
    if host.is_empty() {
        return Err(UpstreamError::NoHost {
            name,
            url: url_text,
        });
    }
    Ok(ProxyAddr {
        host: host.trim_matches(['[', ']']).to_string(),
        port,
    })
}

impl Upstream {
    /// From this process's environment.
    pub fn from_env() -> Result<Upstream, UpstreamError> {
        Upstream::from_vars(&|k| std::env::var(k).ok())
    }

    pub fn from_vars(env: &dyn Fn(&str) -> Option<String>) -> Result<Upstream, UpstreamError> {
        let all = var(env, "ALL_PROXY");
        let pick = |name: &str| -> Result<Option<ProxyAddr>, UpstreamError> {
            match (var(env, name), &all) {
                (Some(url), _) => parse_proxy_url(name, &url).map(Some),
                (None, Some(url)) => parse_proxy_url("ALL_PROXY", url).map(Some),
                (None, None) => Ok(None),
            }
        };
        Ok(Upstream {
            https: pick("HTTPS_PROXY")?,
            http: pick("HTTP_PROXY")?,
            no_proxy: var(env, "NO_PROXY")
                .unwrap_or_default()
                .split(',')
                .map(|s| {
                    s.trim()
                        .trim_start_matches("*.")
                        .trim_start_matches('.')
                        .to_ascii_lowercase()
                })
                .filter(|s| !s.is_empty())
                .collect(),
        })
    }

    /// The upstream proxy for a request to `host` (`tunnel`: CONNECT), or
    /// None to go direct.
    pub fn for_host(&self, host: &str, tunnel: bool) -> Option<&ProxyAddr> {
        let proxy = if tunnel {
            self.https.as_ref()
        } else {
            self.http.as_ref()
        }?;
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        let bypass = self.no_proxy.iter().any(|n| {
            n == "*"
                || host == *n
                || (host.ends_with(n.as_str()) && host[..host.len() - n.len()].ends_with('.'))
        });
        (!bypass).then_some(proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Upstream, UpstreamError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Upstream::from_vars(&|k| map.get(k).cloned())
    }

    #[test]
    fn the_hosts_proxy_is_used_except_for_no_proxy() {
        let u = from(&[
            ("https_proxy", "http://proxy.example.net:3128/"),
            (
                "NO_PROXY",
                "internal.example.net, .corp.example.net,127.0.0.1",
            ),
        ])
        .unwrap();
        let p = u.for_host("api.example.org", true).unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.example.net", 3128));
        assert!(
            u.for_host("api.example.org", false).is_none(),
            "no HTTP_PROXY"
        );
        assert!(u.for_host("internal.example.net", true).is_none());
        assert!(u.for_host("a.corp.example.net", true).is_none());
        assert!(u.for_host("xcorp.example.net", true).is_some());
        assert!(u.for_host("127.0.0.1", true).is_none());
        let u = from(&[("ALL_PROXY", "proxy.example.net:8080"), ("no_proxy", "*")]).unwrap();
        assert!(u.https.is_some() && u.http.is_some());
        assert!(u.for_host("x.example.org", true).is_none());
        assert_eq!(from(&[]).unwrap(), Upstream::default());
    }

    #[test]
    fn unusable_proxies_are_refused() {
        assert!(from(&[("HTTPS_PROXY", "socks5://p.example.net:1080")])
            .unwrap_err()
            .to_string()
            .contains("only http://"));
        assert!(from(&[("HTTPS_PROXY", "http://u:p@p.example.net:1")])
            .unwrap_err()
            .to_string()
            .contains("credentials"));
        assert!(from(&[("HTTP_PROXY", "http://p.example.net:x")])
            .unwrap_err()
            .to_string()
            .contains("bad port"));
    }
}
