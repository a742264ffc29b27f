//! The front end's way to a node on another host: mutual TLS (rustls)
//! between the front end and the node's `pycell gateway`, each side
//! proving itself with a certificate of the cluster's own CA. The gateway's
//! certificate is for the name [`GATEWAY_NAME`] (one name for every node:
//! nodes come and go by IP), the front end's for any name the CA signs.
//!
//! Neither side parses the daemon protocol: the front end's daemon client
//! connects to a Unix socket this process serves ([`serve_tunnel`]), each
//! of whose connections is carried over TLS to the gateway, which carries
//! it on to its pycelld's socket ([`gateway`](super::gateway)). pycelld
//! parses the requests, as it does a local client's, and trusts the
//! gateway's uid as a front end.

use std::path::PathBuf;
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixListener};
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub use crate::tls::TlsFiles;

/// The name on every gateway's certificate.
pub const GATEWAY_NAME: &str = "pycell-gateway";
/// How long connecting to a gateway (TCP and TLS) may take.
pub const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// The front end's side: connects to gateways.
pub fn connector(files: &TlsFiles) -> Result<TlsConnector, crate::tls::TlsError> {
    crate::tls::client(files).map(TlsConnector::from)
}

/// The gateway's side: only clients with a certificate of the CA.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, crate::tls::TlsError> {
    crate::tls::server(&files.cert, &files.key, Some(&files.ca)).map(TlsAcceptor::from)
}

/// Why a tunnel could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("cannot make a directory for the tunnels: {0}")]
    Directory(std::io::Error),
    #[error("{}: {source}", .path.display())]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The front end's tunnels: a Unix socket per remote node, in a directory
/// of this process's own (removed when it ends), each carried over TLS to
/// the node's gateway.
pub struct Tunnels {
    dir: tempfile::TempDir,
    tls: TlsConnector,
}

impl std::fmt::Debug for Tunnels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnels")
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Tunnels {
    pub fn new(tls: TlsConnector) -> Result<Tunnels, TunnelError> {
        let dir = tempfile::Builder::new()
            .prefix("pycell-tunnels-")
            .tempdir()
            .map_err(TunnelError::Directory)?;
        Ok(Tunnels { dir, tls })
    }

    /// The socket for node `name`, whose gateway is at `remote` (from
    /// within the runtime: it starts serving at once).
    pub fn open(&self, name: &str, remote: String) -> Result<PathBuf, TunnelError> {
        let path = self.dir.path().join(format!("{name}.sock"));
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(source) => return Err(TunnelError::Socket { path, source }),
        };
        tokio::spawn(serve_tunnel(listener, remote, self.tls.clone()));
        Ok(path)
    }
}

/// Carry bytes both ways until either side ends, then close both: a
/// client that goes away must not leave half a connection open to
/// pycelld, which ends a run when its client's connection closes.
pub async fn splice<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_in, mut a_out) = tokio::io::split(a);
    let (mut b_in, mut b_out) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut a_in, &mut b_out) => {}
        _ = tokio::io::copy(&mut b_in, &mut a_out) => {}
    }
}

/// Serve `listener` (a socket of this process's own, in a directory only
/// it reaches): each connection is carried over TLS to the gateway at
/// `remote`. A gateway that cannot be reached closes the connection at
/// once, which the daemon client takes as a node it cannot reach.
pub async fn serve_tunnel(listener: UnixListener, remote: String, tls: TlsConnector) {
    let name = ServerName::try_from(GATEWAY_NAME).expect("a valid DNS name");
    loop {
        let Ok((local, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (remote, tls, name) = (remote.clone(), tls.clone(), name.clone());
        tokio::spawn(async move {
            let connected = tokio::time::timeout(CONNECT_WITHIN, async {
                let tcp = TcpStream::connect(&remote).await?;
                let _ = tcp.set_nodelay(true);
                tls.connect(name, tcp).await
            })
            .await;
            if let Ok(Ok(far)) = connected {
                splice(local, far).await;
            }
        });
    }
}
