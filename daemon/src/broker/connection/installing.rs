//! A run whose env the monitor is building before it starts: the install's
//! progress goes to the client as `installing` messages, and the client's
//! cancel (or its leaving) stops the build.

use std::os::fd::OwnedFd;

use pycell_deps::build::ProgressLines;
use pycell_protocol::messages::{ClientMessage, ServerMessage};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::lifecycle::reply_during_run;
use super::Conn;
use crate::broker::link::Reply;
use crate::broker::Broker;
use crate::link::{ToBroker, ToMonitor};

/// Longest progress message passed on (a builder's line is far shorter).
const MAX_MESSAGE: usize = 1000;
/// How long the last progress lines get to arrive once the build is over.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The monitor ended its link before it answered a request.
#[derive(Debug, thiserror::Error)]
#[error("the monitor went away")]
pub(super) struct MonitorGone;

/// The monitor's last reply to request `req` (after any `installing`) and
/// whether the client cancelled meanwhile.
pub(super) async fn last_reply(
    broker: &Broker,
    conn: &mut Conn,
    id: &str,
    req: u64,
    mut replies: mpsc::UnboundedReceiver<Reply>,
) -> Result<(Reply, bool), MonitorGone> {
    let mut progress: Option<mpsc::Receiver<String>> = None;
    let (mut abandoned, mut cancelled) = (false, false);
    let abandon = |abandoned: &mut bool| {
        if !*abandoned {
            *abandoned = true;
            let _ = broker.link.send(&ToMonitor::Abandon { req });
        }
    };
    loop {
        tokio::select! {
            reply = replies.recv() => match reply {
                None => return Err(MonitorGone),
                Some((ToBroker::Installing { .. }, fds)) => {
                    progress = fds.into_iter().next().and_then(|fd| read_progress(fd).ok());
                }
                Some(last) => {
                    if let Some(rx) = progress.as_mut() {
                        drain(conn, id, rx).await;
                    }
                    return Ok((last, cancelled));
                }
            },
            line = next_line(&mut progress), if progress.is_some() => match line {
                Some(message) => {
                    conn.out.offer(ServerMessage::Installing { id: id.to_string(), message });
                }
                None => progress = None,
            },
            _ = conn.out.closed(), if !abandoned => abandon(&mut abandoned),
            msg = conn.inbox.recv(), if !abandoned => match msg {
                None => abandon(&mut abandoned),
                Some(Ok(ClientMessage::Cancel { id: cid })) if cid == id => {
                    cancelled = true;
                    abandon(&mut abandoned);
                }
                Some(other) => {
                    conn.out.offer(reply_during_run(other));
                }
            },
        }
    }
}

async fn next_line(progress: &mut Option<mpsc::Receiver<String>>) -> Option<String> {
    match progress {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Pass on the lines still due: the builder has exited, its pipe ends.
async fn drain(conn: &Conn, id: &str, rx: &mut mpsc::Receiver<String>) {
    while let Ok(Some(message)) = timeout(DRAIN, rx.recv()).await {
        conn.out.offer(ServerMessage::Installing {
            id: id.to_string(),
            message,
        });
    }
}

/// Read the builder's progress (its stderr, a line per step; a `pycell: `
/// prefix, if any, taken off) on a task of its own; each line on the
/// channel.
fn read_progress(fd: OwnedFd) -> std::io::Result<mpsc::Receiver<String>> {
    let mut pipe = pipe::Receiver::from_owned_fd(fd)?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let (mut lines, mut chunk) = (ProgressLines::default(), vec![0u8; 8192]);
        while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
            let mut found = Vec::new();
            lines.feed(&chunk[..n], &mut |line| found.push(message(line)));
            for m in found {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// A builder's stderr line as the client sees it (pure).
fn message(line: &str) -> String {
    let m = line.strip_prefix("pycell: ").unwrap_or(line);
    match m.char_indices().nth(MAX_MESSAGE) {
        Some((at, _)) => format!("{}...", &m[..at]),
        None => m.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::message;

    #[test]
    fn progress_lines_lose_their_prefix_and_long_ones_are_cut() {
        assert_eq!(
            message("pycell: installed six 1.16.0 (1 of 1)"),
            "installed six 1.16.0 (1 of 1)"
        );
        assert_eq!(message("uv says hi"), "uv says hi");
        let long = "é".repeat(5000);
        let cut = message(&long);
        assert_eq!(cut.chars().count(), 1003);
    }
}
