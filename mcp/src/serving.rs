//! What the network servers (`pycell mcp --http`, `pycell gateway`)
//! share: accepting connections until SIGTERM or SIGINT.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Accepts until told to stop.
#[derive(Debug)]
pub struct UntilStopped {
    term: Signal,
    int: Signal,
}

impl UntilStopped {
    pub fn new() -> std::io::Result<UntilStopped> {
        Ok(UntilStopped {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves when SIGTERM or SIGINT arrives.
    pub async fn stopped(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// The next connection (Nagle off), or None once told to stop. A
    /// failed accept (out of descriptors, say) pauses rather than spins.
    pub async fn accept(&mut self, listener: &TcpListener) -> Option<TcpStream> {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.stopped() => return None,
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return Some(stream);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}
