//! pycell's egress proxy: the only way out of a jail whose policy has
//! network mode `allowlist`.
//!
//! The jailer makes a listening socket on 127.0.0.1 inside the jail's own
//! network namespace (which has no route and no resolver) and hands it out
//! on a unix socket; [`Egress::start`] takes that socket and serves the
//! run's connections until [`Egress::finish`], which ends them all and
//! returns the run's [`NetworkReport`]. It runs wherever the run's launcher
//! runs: in pycelld's unprivileged broker, or in `pycell` itself for
//! embedded runs.
//!
//! For each connection: one request head (bounded in size and time);
//! CONNECT host:port (a tunnel, which must carry TLS naming that host
//! unless a `tcp://` rule allows it) or an absolute-form plain-HTTP request
//! (only under an `http://` rule). The host is judged by the policy's
//! rules; the proxy resolves names itself and refuses addresses in special
//! ranges (loopback, private, link-local, metadata) unless an address rule
//! names them, so no name can be pointed at the host's own services. TLS
//! is relayed, never terminated. Refusals are HTTP answers whose status
//! line says what was refused and what is allowed.
//!
//! Threat model: every byte from the jail is hostile. Heads are capped at
//! 16 KiB and 10 s, a run's connections and bytes are capped by its policy,
//! connections beyond the cap are answered without being read, and a run's
//! connections end with it. A run can only spend its own budget.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use pycell_policy::network::EgressRules;
use pycell_protocol::result::NetworkReport;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

pub mod body;
mod conn;
pub mod http;
mod tally;
pub mod tls;
pub mod upstream;

pub use tally::ConnectionRecord;
pub use upstream::{Upstream, UpstreamError};

/// What the proxy serves one run with.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// The policy's name, for messages.
    pub policy: String,
    pub rules: EgressRules,
    /// The host's own way out, or why its proxy setting cannot be used
    /// (then every request is answered with that reason).
    pub upstream: Result<Upstream, UpstreamError>,
}

impl EgressConfig {
    /// For a run under `policy`, going out the way this process's
    /// environment says (`HTTPS_PROXY`, `NO_PROXY`, ...).
    pub fn from_env(policy: &str, rules: EgressRules) -> EgressConfig {
        EgressConfig {
            policy: policy.to_string(),
            rules,
            upstream: Upstream::from_env(),
        }
    }
}

/// Called once per connection, when it ends (pycelld writes its audit log
/// from it).
pub type AuditHook = Arc<dyn Fn(&ConnectionRecord) + Send + Sync>;

/// The proxy serving one run.
#[derive(Debug)]
pub struct Egress {
    stop: Option<oneshot::Sender<()>>,
    report: oneshot::Receiver<NetworkReport>,
}

impl Egress {
    /// Serve the run whose jail handed out `listener` (its loopback
    /// listening socket), on the current tokio runtime.
    pub fn start(listener: OwnedFd, config: EgressConfig, audit: Option<AuditHook>) -> Egress {
        let (egress, serving) = Egress::prepare(listener, config, audit);
        tokio::spawn(serving);
        egress
    }

    /// [`Egress::start`] for a caller without a runtime: the proxy gets a
    /// thread and a runtime of its own, both gone after `finish`.
    pub fn start_on_thread(
        listener: OwnedFd,
        config: EgressConfig,
        audit: Option<AuditHook>,
    ) -> std::io::Result<Egress> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (egress, serving) = Egress::prepare(listener, config, audit);
        std::thread::Builder::new()
            .name("pycell-egress".into())
            .spawn(move || runtime.block_on(serving))?;
        Ok(egress)
    }

    fn prepare(
        listener: OwnedFd,
        config: EgressConfig,
        audit: Option<AuditHook>,
    ) -> (
        Egress,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (stop_tx, stop_rx) = oneshot::channel();
        let (report_tx, report_rx) = oneshot::channel();
        let serving = async move {
            let report = serve(listener, config, audit, stop_rx).await;
            let _ = report_tx.send(report);
        };
        let egress = Egress {
            stop: Some(stop_tx),
            report: report_rx,
        };
        (egress, serving)
    }

    /// End every connection of the run and say what it did.
    pub async fn finish(mut self) -> NetworkReport {
        drop(self.stop.take());
        self.report.await.unwrap_or_default()
    }

    /// [`Egress::finish`] for a caller without a runtime.
    pub fn finish_blocking(mut self) -> NetworkReport {
        drop(self.stop.take());
        self.report.blocking_recv().unwrap_or_default()
    }
}

/// The jail's listener (handed out by the jail), for tokio.
fn tokio_listener(listener: OwnedFd) -> std::io::Result<tokio::net::TcpListener> {
    let listener = std::net::TcpListener::from(listener);
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

async fn serve(
    listener: OwnedFd,
    config: EgressConfig,
    audit: Option<AuditHook>,
    mut stop: oneshot::Receiver<()>,
) -> NetworkReport {
    let ctx = Arc::new(conn::Ctx::new(config, audit));
    let Ok(listener) = tokio_listener(listener) else {
        return ctx.tally.report();
    };
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) if ctx.tally.admit() => {
                    connections.spawn(conn::serve(sock, ctx.clone()));
                }
                Ok((sock, _)) => conn::refuse_over_limit(sock, &ctx),
                // Out of descriptors or memory for a moment: let the
                // run's own connections finish and try again.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // The run is over: its connections end with it (each records itself
    // as it is dropped).
    connections.shutdown().await;
    ctx.tally.report()
}
