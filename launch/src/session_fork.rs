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
use pycell_protocol::session::{
    Restored, SessionForkInfo, SessionInfo, SessionReply, SessionStartRequest, SnapshotInfo,
};
use pycell_runner::session::{SessionOp, SessionRequest, StateReport, MAX_FILE_BYTES};
use pycell_wire::codes::FailureCode;

use crate::session::{Session, SessionError};
use crate::snapshots::{SnapshotStore, StoreError, Stored};

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
    let mut export = Export::begin(from, clocks, bound).await?;
    let mut import = Import::new(to, clocks);
    while let Some(data) = export.next_chunk().await? {
        import.chunk(data).await?;
    }
    let (report, size) = (export.report, export.size);
    let loaded = import.load(size, report.cells).await?;
    Ok(Carried {
        export: bounded(report),
        import: bounded(loaded),
        bytes: size,
    })
}

/// A session's state being read out of it, chunk by chunk.
struct Export<'a> {
    session: &'a Session,
    /// No other reads this session's state meanwhile.
    _alone: tokio::sync::OwnedMutexGuard<()>,
    clocks: Clocks,
    report: StateReport,
    size: u64,
    offset: u64,
}

impl<'a> Export<'a> {
    /// Ask `session` to write its state, at most `bound` bytes.
    async fn begin(session: &'a Session, clocks: Clocks, bound: u64) -> Result<Self, ForkError> {
        let alone = session.read_state().await;
        let asked = SessionRequest::ExportState { max_bytes: bound };
        let exported = ask(session, clocks.op(asked), "source").await?;
        let size = exported.size.unwrap_or(0);
        if size > bound {
            return Err(too_big(size, bound));
        }
        Ok(Export {
            session,
            _alone: alone,
            clocks,
            report: exported.state.unwrap_or_default(),
            size,
            offset: 0,
        })
    }

    /// The next chunk (base64), of the size asked; None once all is read.
    async fn next_chunk(&mut self) -> Result<Option<String>, ForkError> {
        if self.offset >= self.size {
            return Ok(None);
        }
        let want = CHUNK_BYTES.min(self.size - self.offset);
        let read = SessionRequest::ExportChunk {
            export: self.report.export,
            offset: self.offset,
            max_bytes: want,
        };
        let data = ask(self.session, self.clocks.op(read), "source")
            .await?
            .data;
        let data = data.filter(|d| base64_decoded_len(d) == Some(want));
        let Some(data) = data else {
            return Err(refused(
                "the source sent a chunk of its state of another size",
            ));
        };
        self.offset += want;
        Ok(Some(data))
    }
}

/// A session's state being loaded into it, chunk by chunk.
struct Import<'a> {
    session: &'a Session,
    clocks: Clocks,
    offset: u64,
}

impl<'a> Import<'a> {
    fn new(session: &'a Session, clocks: Clocks) -> Self {
        Import {
            session,
            clocks,
            offset: 0,
        }
    }

    /// The next chunk (base64, at most [`CHUNK_BYTES`]).
    async fn chunk(&mut self, data: String) -> Result<(), ForkError> {
        let len = base64_decoded_len(&data).unwrap_or(0);
        let offset = self.offset;
        let write = SessionRequest::ImportChunk { offset, data };
        ask(self.session, self.clocks.op(write), "fork").await?;
        self.offset += len;
        Ok(())
    }

    /// Load the `size` bytes sent; the cells go on after `cells`.
    async fn load(self, size: u64, cells: u64) -> Result<StateReport, ForkError> {
        let load = SessionRequest::ImportState { size, cells };
        let loaded = ask(self.session, self.clocks.op(load), "fork").await?;
        Ok(loaded.state.unwrap_or_default())
    }
}

/// Keep `source`'s state in `store` for `owner` (bounded as a fork's, and
/// by the store's quota); `start` started `source`. A snapshot cut short
/// leaves nothing in the store.
pub async fn snapshot(
    source: &Session,
    handle: &str,
    held: (&pycell_policy::Policy, &RunLimits, &SessionStartRequest),
    store: &SnapshotStore,
    owner: &str,
) -> Result<SnapshotInfo, ForkError> {
    let began = std::time::Instant::now();
    let (policy, limits, start) = held;
    let bound = state_bound(limits).min(store.quota().bytes);
    let mut export = Export::begin(source, Clocks::of(policy, limits), bound).await?;
    let mut writing = store.begin(owner, export.size).map_err(stored)?;
    while let Some(data) = export.next_chunk().await? {
        let bytes = pycell_protocol::messages::decode_b64(&data)
            .map_err(|e| refused(&format!("a chunk of the state: {e}")))?;
        writing.write(&bytes).map_err(stored)?;
    }
    let report = bounded(export.report);
    let info = SnapshotInfo {
        snapshot: writing.id().to_string(),
        session: handle.to_string(),
        policy: policy.name.clone(),
        size_bytes: export.size,
        created_at: writing.expires_at() - store.quota().keep.as_secs(),
        expires_at: writing.expires_at(),
        names: report.names,
        dropped: report.dropped,
        skipped: report.skipped,
        reseeded: report.reseeded,
        threads_not_carried: report.threads,
        evicted: writing.evicted.clone(),
        took_ms: began.elapsed().as_secs_f64() * 1e3,
    };
    let kept = Stored {
        info: info.clone(),
        owner: owner.to_string(),
        start: start.clone(),
        cells: report.cells,
        created_ms: crate::snapshots::now_ms(),
    };
    writing.finish(&kept).map_err(stored)?;
    Ok(info)
}

/// Load snapshot `snapshot` (its description and bundle, from the store)
/// into `to`, a session just started with its request; `to` is ended if
/// this fails (or is dropped), as a fork's.
pub async fn restore(
    to: &Session,
    (kept, bundle): (Stored, std::fs::File),
    policy: &pycell_policy::Policy,
    limits: &RunLimits,
) -> Result<Restored, ForkError> {
    let half_made = HalfMade(Some(to.clone()));
    let bound = state_bound(limits);
    let loaded = match kept.info.size_bytes <= bound {
        true => load_bundle(to, &kept, bundle, Clocks::of(policy, limits)).await,
        false => Err(too_big(kept.info.size_bytes, bound)),
    };
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            half_made.keep();
            to.end().await;
            return Err(e);
        }
    };
    half_made.keep();
    let loaded = bounded(loaded);
    Ok(Restored {
        snapshot: kept.info.snapshot,
        names: loaded.names,
        files: loaded.files,
    })
}

async fn load_bundle(
    to: &Session,
    kept: &Stored,
    mut bundle: std::fs::File,
    clocks: Clocks,
) -> Result<StateReport, ForkError> {
    use std::io::Read;
    let size = kept.info.size_bytes;
    let mut import = Import::new(to, clocks);
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let mut left = size;
    while left > 0 {
        let want = CHUNK_BYTES.min(left) as usize;
        bundle
            .read_exact(&mut buf[..want])
            .map_err(|e| refused(&format!("reading the snapshot: {e}")))?;
        import
            .chunk(pycell_protocol::messages::encode_b64(&buf[..want]))
            .await?;
        left -= want as u64;
    }
    import.load(size, kept.cells).await
}

fn stored(e: StoreError) -> ForkError {
    let code = match e {
        StoreError::Unknown(_) => FailureCode::UnknownSnapshot,
        StoreError::TooBig { .. } => FailureCode::StateRefused,
        StoreError::Io { .. } => FailureCode::Internal,
    };
    (code, e.to_string())
}

/// The snapshot `id` of `owner` in `store`, and the request that starts
/// a session from it; refused if `req` asks for anything else too.
pub fn snapshot_to_start(
    store: &SnapshotStore,
    owner: &str,
    req: &SessionStartRequest,
) -> Result<Option<(Stored, std::fs::File)>, ForkError> {
    let Some(id) = &req.from_snapshot else {
        return Ok(None);
    };
    let bare = SessionStartRequest {
        from_snapshot: Some(id.clone()),
        tools: req.tools.clone(),
        ..SessionStartRequest::default()
    };
    if *req != bare {
        return Err((
            FailureCode::InvalidRequest,
            "from_snapshot starts the session with its snapshot's policy, limits and dependencies: give none of those with it".into(),
        ));
    }
    store.get(owner, id).map(Some).map_err(stored)
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
        "the session's state is {size} bytes, more than the {bound} it may carry (a quarter of its memory limit, at most its disk limit, and for a snapshot at most its owner's snapshot quota): delete large names or files first"
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

/// The store key of `owner`'s paused sessions' snapshots: apart from the
/// snapshots they take themselves, so that a pause never evicts one.
pub fn paused_key(owner: &str) -> String {
    format!("{owner}-paused")
}

/// Keep `table`'s sessions to their lifetime across pauses (end those
/// past it, forget paused ones past it), then pause those due for it
/// (idle for their idle timeout, under a policy that pauses them): each
/// one's state kept in `store` under its owner's paused key (`key` makes
/// an owner's key), then its jail ended; the table then knows it as
/// paused. A session that cannot be paused goes on (its jailer ends it
/// past its idle timeout).
pub async fn pause_idle<T, O>(
    table: &std::sync::Mutex<crate::session_table::SessionTable<T, O>>,
    store: &SnapshotStore,
    key: impl Fn(&O) -> String,
) where
    T: Clone + crate::session_table::HeldPolicy,
    O: Clone + Eq,
{
    let (over, dropped) = table
        .lock()
        .map(|mut t| t.past_lifetime())
        .unwrap_or_default();
    for session in over {
        session.end().await;
    }
    for (owner, snapshot) in dropped {
        store.remove(&paused_key(&key(&owner)), &snapshot);
    }
    let due = table
        .lock()
        .map(|mut t| t.due_for_pause())
        .unwrap_or_default();
    // At once: one slow export does not hold up another owner's pause.
    let pauses = due.into_iter().map(|(handle, e)| {
        let owner = paused_key(&key(&e.owner));
        pause_one(table, store, handle, e, owner)
    });
    futures::future::join_all(pauses).await;
}

/// Pause `handle` (`e`), marked as being paused: see [`pause_idle`].
async fn pause_one<T, O>(
    table: &std::sync::Mutex<crate::session_table::SessionTable<T, O>>,
    store: &SnapshotStore,
    handle: String,
    e: crate::session_table::Entry<T, O>,
    owner: String,
) where
    T: Clone + crate::session_table::HeldPolicy,
    O: Clone + Eq,
{
    let held = (e.info.policy(), e.info.limits(), e.info.start());
    let kept = snapshot(&e.session, &handle, held, store, &owner).await;
    let paused = match (table.lock(), kept) {
        (Ok(mut t), Ok(s)) => {
            let kept = t.paused(&handle, s.snapshot.clone(), e.info.policy());
            if !kept {
                store.remove(&owner, &s.snapshot);
            }
            kept
        }
        (Ok(mut t), Err(_)) => {
            t.pause_failed(&handle);
            false
        }
        (Err(_), _) => false,
    };
    if paused {
        e.session.end().await;
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
