//! Why a front end of this crate (`pycell mcp`, `pycell mcp --http`,
//! `pycell gateway`, `pycell mcp-token`) does not start: the flag at
//! fault, flags that do not go together, the host or pycelld refusing,
//! or a part's own error. Each says what to fix; the command prints it
//! and exits 2.

use crate::cluster::tunnel::TunnelError;
use crate::cluster::NodeSpecError;
use crate::http::callers::{BadTokenName, TokensError};
use crate::http::oauth::OAuthConfigError;
use crate::http::public_url::PublicUrlError;
use crate::privileges::UserError;
use crate::server::{BadPolicyFlag, ToolServersFlag};
use crate::tls::TlsError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A flag's value cannot be used (`--http "x": not HOST:PORT`).
    #[error("{flag} {problem}")]
    Flag { flag: &'static str, problem: String },
    /// Flags that do not go together, or one that needs another.
    #[error("{0}")]
    Flags(String),
    /// The host refused what the flags ask for (a port, randomness).
    #[error("{what}: {source}")]
    Host {
        what: String,
        source: std::io::Error,
    },
    /// pycelld is not there, or refuses this front end.
    #[error("{0}")]
    Daemon(String),
    #[error(transparent)]
    User(#[from] UserError),
    #[error(transparent)]
    Tokens(#[from] TokensError),
    #[error(transparent)]
    TokenName(#[from] BadTokenName),
    #[error(transparent)]
    OAuth(#[from] OAuthConfigError),
    #[error(transparent)]
    PublicUrl(#[from] PublicUrlError),
    #[error(transparent)]
    Node(#[from] NodeSpecError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Tunnel(#[from] TunnelError),
    #[error(transparent)]
    Policy(#[from] BadPolicyFlag),
    #[error(transparent)]
    ToolServers(#[from] ToolServersFlag),
}

impl StartError {
    pub(crate) fn flag(flag: &'static str, problem: impl Into<String>) -> StartError {
        StartError::Flag {
            flag,
            problem: problem.into(),
        }
    }

    pub(crate) fn host(what: impl Into<String>, source: std::io::Error) -> StartError {
        StartError::Host {
            what: what.into(),
            source,
        }
    }
}
