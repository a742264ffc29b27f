//! `--public-url`: the URL clients use, taken apart and checked.

use super::front::METADATA_PREFIX;

/// The URL clients use, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    pub url: String,
    /// `https://host:port`.
    pub origin: String,
    /// The Host header clients send (host, with its port if it has one).
    pub authority: String,
    pub path: String,
}

/// A `--public-url` clients cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--public-url {url:?}: {problem}")]
pub struct PublicUrlError {
    pub url: String,
    pub problem: UrlProblem,
}

/// What is wrong with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("not a URL")]
    NotAUrl,
    #[error("no scheme")]
    NoScheme,
    #[error("use https:// (or http:// behind a proxy)")]
    Scheme,
    #[error("no host")]
    NoHost,
    #[error("no user information in the URL")]
    UserInfo,
    #[error("no query in the URL")]
    Query,
    #[error("that path is the server's own")]
    OwnPath,
}

impl PublicUrl {
    pub fn parse(url: &str) -> Result<PublicUrl, PublicUrlError> {
        let bad = |problem| PublicUrlError {
            url: url.to_string(),
            problem,
        };
        let uri: http::Uri = url.parse().map_err(|_| bad(UrlProblem::NotAUrl))?;
        let scheme = uri.scheme_str().ok_or_else(|| bad(UrlProblem::NoScheme))?;
        if scheme != "https" && scheme != "http" {
            return Err(bad(UrlProblem::Scheme));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| bad(UrlProblem::NoHost))?
            .to_string();
        if authority.contains('@') {
            return Err(bad(UrlProblem::UserInfo));
        }
        if uri.query().is_some() {
            return Err(bad(UrlProblem::Query));
        }
        let path = match uri.path() {
            "" | "/" => "/mcp".to_string(),
            p if p.starts_with(METADATA_PREFIX) || p == "/healthz" => {
                return Err(bad(UrlProblem::OwnPath))
            }
            p => p.to_string(),
        };
        Ok(PublicUrl {
            url: format!("{scheme}://{authority}{path}"),
            origin: format!("{scheme}://{authority}"),
            authority,
            path,
        })
    }

    /// The host without a port (rmcp's Host check takes either form).
    pub(crate) fn host(&self) -> &str {
        match self.authority.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
            _ => &self.authority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_url_gives_origin_host_and_path() {
        let u = PublicUrl::parse("https://pycell.example.net/agents/mcp").unwrap();
        assert_eq!(u.origin, "https://pycell.example.net");
        assert_eq!(u.path, "/agents/mcp");
        assert_eq!(u.host(), "pycell.example.net");
        let u = PublicUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(u.url, "http://127.0.0.1:8080/mcp");
        assert_eq!(u.host(), "127.0.0.1");
        assert_eq!(u.authority, "127.0.0.1:8080");
        let u = PublicUrl::parse("http://[::1]:9/mcp").unwrap();
        assert_eq!(u.host(), "[::1]");
        let problem = |url: &str| PublicUrl::parse(url).unwrap_err().problem;
        assert_eq!(problem("ftp://x.example.net/"), UrlProblem::Scheme);
        assert_eq!(problem("https://a@x.example.net/"), UrlProblem::UserInfo);
        assert_eq!(
            problem("https://x.example.net/healthz"),
            UrlProblem::OwnPath
        );
        assert_eq!(problem("/mcp"), UrlProblem::NoScheme);
    }
}
