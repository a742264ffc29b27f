//! `pycell gateway`: a cluster node's door for front ends on other hosts.
//! It accepts mutual-TLS connections (the client's certificate must be of
//! the cluster's CA) and carries each, byte for byte, to this node's
//! pycelld socket; pycelld, which lists the gateway's uid in
//! `front_end_uids`, then takes the identities the front end names. The
//! gateway parses TLS only (rustls), unprivileged (see `--user`), and no
//! byte of the daemon protocol.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio_rustls::TlsAcceptor;

use super::tunnel::{self, TlsFiles};
use crate::args::GatewayArgs;
use crate::start_error::StartError;

/// How long a client's TLS handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// After SIGTERM: how long connections still open may go on.
const DRAIN_GRACE: Duration = Duration::from_secs(20);

pub fn main(args: &GatewayArgs) -> i32 {
    match prepare(args) {
        Ok((listener, acceptor, socket)) => serve(listener, acceptor, socket),
        Err(e) => {
            eprintln!("pycell gateway: {e}");
            2
        }
    }
}

fn prepare(args: &GatewayArgs) -> Result<(TcpListener, TlsAcceptor, PathBuf), StartError> {
    let user = crate::privileges::planned_user(
        args.user.as_deref(),
        "it takes connections from the network",
    )?;
    let addr: SocketAddr = args
        .listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| StartError::flag("--listen", format!("{:?}: not HOST:PORT", args.listen)))?;
    let files = TlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        ca: args.client_ca.clone(),
    };
    let acceptor = tunnel::acceptor(&files)?;
    let listening = format!("cannot listen on {addr}");
    let listener = TcpListener::bind(addr).map_err(|e| StartError::host(&listening, e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| StartError::host(listening, e))?;
    if let Some(user) = user {
        crate::privileges::become_user(&user)?;
    }
    let socket = pycell_engine::service::Backend::choose_now(false, args.socket.clone())
        .ok_or_else(|| StartError::Daemon("no pycelld socket here: give --socket".into()))?;
    Ok((listener, acceptor, socket))
}

fn serve(listener: TcpListener, acceptor: TlsAcceptor, socket: PathBuf) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pycell-gateway")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pycell gateway: cannot start the async runtime: {e}");
            return 1;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("pycell gateway: cannot listen: {e}");
                return 1;
            }
        };
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        eprintln!(
            "pycell gateway: carrying mutual-TLS connections on {addr} to pycelld at {}",
            socket.display()
        );
        let tracker = tokio_util::task::TaskTracker::new();
        carry_until_stopped(&listener, &acceptor, &socket, &tracker).await;
        drop(listener);
        tracker.close();
        let _ = tokio::time::timeout(DRAIN_GRACE, tracker.wait()).await;
        0
    })
}

async fn carry_until_stopped(
    listener: &tokio::net::TcpListener,
    acceptor: &TlsAcceptor,
    socket: &std::path::Path,
    tracker: &tokio_util::task::TaskTracker,
) {
    let Ok(mut until) = crate::serving::UntilStopped::new() else {
        eprintln!("pycell gateway: cannot handle signals");
        return;
    };
    while let Some(tcp) = until.accept(listener).await {
        let (acceptor, socket) = (acceptor.clone(), socket.to_path_buf());
        tracker.spawn(async move {
            let Ok(Ok(far)) = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await
            else {
                return;
            };
            if let Ok(daemon) = UnixStream::connect(&socket).await {
                tunnel::splice(far, daemon).await;
            }
        });
    }
}
