//! A session's fork: its Python state and /workspace carried into another
//! session of the same owner, policy and limits, which the caller's
//! server has just started. Every server (embedded, pycelld's broker)
//! forks through [`carry_state`]; only where the new session comes from
//! differs.
//!
//! ```text
//! source runner ──export_state──> bundle (kept in the source's jail)
//!               ──export_chunk──> host ──import_chunk──> fork runner
//!                                        ──import_state──> loaded
//! ```
//!
//! The bundle is written and read only by runners, each in its own jail
//! (runner/src/state.py); the host moves its bytes in chunks of at most
//! [`CHUNK_BYTES`] and parses none of them. It checks every size it is
//! told against the bound it set before moving more.

use std::collections::BTreeMap;
use std::time::Duration;

use pycell_protocol::bounds::base64_decoded_len;
use pycell_protocol::result::RunLimits;
use pycell_protocol::session::{SessionForkInfo, SessionInfo, SessionReply};
use pycell_runner::session::{SessionOp, SessionRequest, StateReport, MAX_FILE_BYTES};
use pycell_wire::codes::FailureCode;

use crate::session::{Session, SessionError};

/// The bytes of state moved in one request each way.
pub const CHUNK_BYTES: u64 = MAX_FILE_BYTES;

/// Entries of each list a fork's report keeps, and characters of each
/// text (the rest is cut): what the runners said, from their jails.
const REPORTED: usize = 1000;
const REPORTED_CHARS: usize = 300;

/// The most state a session of `limits` may carry: a quarter of its
/// memory (the source holds its bundle whole, and the fork too while it
/// loads it), and no more than its disk.
pub fn state_bound(limits: &RunLimits) -> u64 {
    (limits.memory.get() / 4).min(limits.disk.get())
}

/// What one request of a fork may take: the session's cell clocks and
/// output cap.
#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    pub wall_timeout: Duration,
    pub cpu_time: Duration,
    pub max_output: pycell_wire::limits::Bytes,
}

impl Clocks {
    /// The clocks of a session of `policy` with `limits`.
    pub fn of(policy: &pycell_policy::Policy, limits: &RunLimits) -> Clocks {
        Clocks {
            wall_timeout: policy.limits.wall_timeout,
            cpu_time: policy.limits.cpu_time,
            max_output: limits.max_output,
        }
    }

    fn op(&self, request: SessionRequest) -> SessionOp {
        SessionOp {
            wall_timeout: self.wall_timeout,
            cpu_time: self.cpu_time,
            max_output: self.max_output,
            request,
        }
    }
}

/// What a fork carried: the source's report of its export, the fork's of
/// its import, and the bundle's size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Carried {
    pub export: StateReport,
    pub import: StateReport,
    pub bytes: u64,
}

/// Why a fork failed: its code and message.
pub type ForkError = (FailureCode, String);

/// Carry `from`'s state into `to` (a new session, nothing run in it yet),
/// at most `bound` bytes of it, each request within `clocks`. `from` goes
/// on as it was, whatever happens; `to` is the caller's to end if this
/// fails.
pub async fn carry_state(
    from: &Session,
    to: &Session,
    clocks: Clocks,
    bound: u64,
) -> Result<Carried, ForkError> {
    let asked = SessionRequest::ExportState { max_bytes: bound };
    let exported = ask(from, clocks.op(asked), "source").await?;
    let size = exported.size.unwrap_or(0);
    let export = exported.state.unwrap_or_default();
    if size > bound {
        return Err(too_big(size, bound));
    }
    let mut offset = 0;
    while offset < size {
        let want = CHUNK_BYTES.min(size - offset);
        let read = SessionRequest::ExportChunk {
            export: export.export,
            offset,
            max_bytes: want,
        };
        let data = ask(from, clocks.op(read), "source").await?.data;
        let data = data.filter(|d| base64_decoded_len(d) == Some(want));
        let Some(data) = data else {
            return Err(refused(
                "the source sent a chunk of its state of another size",
            ));
        };
        let write = SessionRequest::ImportChunk { offset, data };
        ask(to, clocks.op(write), "fork").await?;
        offset += want;
    }
    let load = SessionRequest::ImportState {
        size,
        cells: export.cells,
    };
    let import = ask(to, clocks.op(load), "fork").await?.state;
    Ok(Carried {
        export: bounded(export),
        import: bounded(import.unwrap_or_default()),
        bytes: size,
    })
}

/// The reply of `session` (the `side` of the fork) to `op`, if it served it.
async fn ask(session: &Session, op: SessionOp, side: &str) -> Result<SessionReply, ForkError> {
    match session.request(op).await {
        Ok(answer) => match answer.reply.refused {
            Some(why) => Err(refused(&why)),
            None => Ok(answer.reply),
        },
        Err(SessionError::Ended(ended)) => Err((
            FailureCode::SessionFailed,
            format!(
                "the {side} session ended during the fork ({}): {}",
                ended.reason.as_str(),
                ended.message
            ),
        )),
        Err(SessionError::Busy) => Err((
            FailureCode::SessionBusy,
            format!("the {side} session has as many calls waiting as it queues; fork it once they are done"),
        )),
        Err(SessionError::Refused(code, message)) => Err((code, message)),
    }
}

fn refused(why: &str) -> ForkError {
    (FailureCode::StateRefused, why.to_string())
}

fn too_big(size: u64, bound: u64) -> ForkError {
    refused(&format!(
        "the session's state is {size} bytes, more than the {bound} a fork may carry (a quarter of its memory limit, at most its disk limit): delete large names or files first"
    ))
}

/// A fork as its caller is told of it: `session`, the new one, is a copy
/// of `forked_from` as `carried` says; `took` since the fork was asked.
pub fn fork_info(
    session: SessionInfo,
    forked_from: &str,
    carried: Carried,
    took: Duration,
) -> SessionForkInfo {
    let Carried {
        export,
        import,
        bytes,
    } = carried;
    SessionForkInfo {
        session,
        forked_from: forked_from.to_string(),
        names: import.names,
        files: import.files,
        dropped: export.dropped,
        skipped: export.skipped,
        reseeded: export.reseeded,
        threads_not_carried: export.threads,
        state_bytes: bytes,
        took_ms: took.as_secs_f64() * 1e3,
    }
}

/// Carry `source`'s state into `fork`, a session just started with its
/// request (see [`carry_state`]; its clocks and bound are the source's).
/// If it fails, `fork` is ended before this returns; if whoever waits
/// stops waiting (this future dropped), it is ended then: no half-made
/// fork outlives the call that asked for it.
pub async fn fill_fork(
    source: &Session,
    fork: &Session,
    policy: &pycell_policy::Policy,
    limits: &RunLimits,
) -> Result<Carried, ForkError> {
    let half_made = HalfMade(Some(fork.clone()));
    let (clocks, bound) = (Clocks::of(policy, limits), state_bound(limits));
    match carry_state(source, fork, clocks, bound).await {
        Ok(carried) => {
            half_made.keep();
            Ok(carried)
        }
        Err(e) => {
            half_made.keep();
            fork.end().await;
            Err(e)
        }
    }
}

/// A fork's new session until the fork is done (see [`fill_fork`]).
#[derive(Debug)]
struct HalfMade(Option<Session>);

impl HalfMade {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for HalfMade {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            tokio::spawn(async move { session.end().await });
        }
    }
}

/// `r` with at most [`REPORTED`] entries in each list, each text at most
/// [`REPORTED_CHARS`] characters.
fn bounded(r: StateReport) -> StateReport {
    let cut = |s: String| s.chars().take(REPORTED_CHARS).collect::<String>();
    let list = |v: Vec<String>| v.into_iter().take(REPORTED).map(cut).collect();
    let map = |m: BTreeMap<String, String>| {
        m.into_iter()
            .take(REPORTED)
            .map(|(k, v)| (cut(k), cut(v)))
            .collect()
    };
    StateReport {
        names: list(r.names),
        dropped: map(r.dropped),
        skipped: map(r.skipped),
        reseeded: list(r.reseeded),
        threads: list(r.threads),
        ..r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::limits::Bytes;

    #[test]
    fn a_fork_carries_at_most_a_quarter_of_memory_and_no_more_than_disk() {
        let mut limits = RunLimits {
            memory: Bytes(1 << 30),
            disk: Bytes(1 << 30),
            ..RunLimits::default()
        };
        assert_eq!(state_bound(&limits), 256 << 20);
        limits.disk = Bytes(10 << 20);
        assert_eq!(state_bound(&limits), 10 << 20);
    }

    #[test]
    fn what_the_runners_report_is_cut_to_its_bounds() {
        let long = "x".repeat(5000);
        let r = StateReport {
            names: (0..5000).map(|i| i.to_string()).collect(),
            dropped: [(long.clone(), long.clone())].into(),
            files: 7,
            ..StateReport::default()
        };
        let b = bounded(r);
        assert_eq!(b.names.len(), REPORTED);
        let (k, v) = b.dropped.iter().next().unwrap();
        assert_eq!((k.len(), v.len()), (REPORTED_CHARS, REPORTED_CHARS));
        assert_eq!(b.files, 7);
    }
}
