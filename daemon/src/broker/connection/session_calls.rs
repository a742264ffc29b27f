//! Session messages on a connection: `session_start` (ordered, admitted and
//! started as a run is, then driven by the broker), `session` calls (the
//! connection waits for the answer, a `cancel` with the call's id
//! interrupts it), `session_fork` (a start, then the source's state
//! carried in), `session_end` and `session_list`.

use std::sync::Arc;

use pycell_launch::session_table::Lookup;
use pycell_launch::{session_fork, session_table};
use pycell_protocol::messages::{ClientMessage, ErrorCode, ServerMessage};
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionForkInfo, SessionInfo, SessionStartRequest,
};

use super::lifecycle::{admit, ordered, reply_during_run, start, NotStarted};
use super::{error, Conn};
use crate::broker::sessions::{start_request, Refused};
use crate::broker::tool_relay::{RelaySwitch, ToolRelay};
use crate::broker::{Broker, Peer};

/// `session_start`: false if the connection is finished.
pub(super) async fn start_session(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: String,
    request: SessionStartRequest,
) -> bool {
    let reply = match started(broker, conn, peer, &id, request).await {
        Ok(info) => ServerMessage::SessionStarted {
            id,
            session: Box::new(info),
        },
        Err(NotStarted::Reply(reply)) => reply,
        Err(NotStarted::ClientGone) => return false,
    };
    conn.out.send(reply).await
}

/// `session_fork`: a session started as `session_start` starts one (with
/// the source's request), then the source's state carried into it. False
/// if the connection is finished.
pub(super) async fn fork(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: String,
    handle: String,
) -> bool {
    let reply = match forked(broker, conn, peer, &id, &handle).await {
        Ok(fork) => ServerMessage::SessionForked {
            id,
            fork: Box::new(fork),
        },
        Err(NotStarted::Reply(reply)) => reply,
        Err(NotStarted::ClientGone) => return false,
    };
    conn.out.send(reply).await
}

async fn forked(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    handle: &str,
) -> Result<SessionForkInfo, NotStarted> {
    let began = std::time::Instant::now();
    let refuse = |r| NotStarted::Reply(refusal(id, r));
    let who = peer.principal();
    let source = broker.session_of(&who, handle).map_err(refuse)?;
    let info = started(broker, conn, peer, id, (*source.info.start).clone()).await?;
    let fork = broker.session_of(&who, &info.session).map_err(refuse)?;
    let held = &source.info;
    let carried =
        session_fork::fill_fork(&source.session, &fork.session, &held.policy, &held.limits)
            .await
            .map_err(|(code, m)| refuse((ErrorCode::for_failure(code), m)))?;
    let took = began.elapsed();
    Ok(session_fork::fork_info(info, handle, carried, took))
}

async fn started(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    request: SessionStartRequest,
) -> Result<SessionInfo, NotStarted> {
    started_as(broker, conn, peer, id, request, None).await
}

/// [`started`], as paused session `resume` if given (its snapshot named
/// by `request`), under its handle.
async fn started_as(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    request: SessionStartRequest,
    resume: Option<&str>,
) -> Result<SessionInfo, NotStarted> {
    let refuse = |r| NotStarted::Reply(refusal(id, r));
    let (request, restoring) = broker
        .snapshot_to_start(&peer.principal(), request, resume)
        .map_err(refuse)?;
    if let Some(refused) = super::lifecycle::may_use(broker, peer, id, request.policy_name()) {
        return Err(refused);
    }
    let policy = broker
        .session_policy(request.policy_name())
        .map_err(refuse)?;
    let per_uid = policy.session.per_uid as usize;
    if per_uid == 0 {
        let m = session_table::no_sessions(&policy);
        return Err(refuse((ErrorCode::SessionsUnavailable, m)));
    }
    if broker.sessions_held(&peer.principal()) >= per_uid {
        let m = session_table::too_many(&peer.principal(), &policy);
        return Err(refuse((ErrorCode::TooManySessions, m)));
    }
    let mut ordered = ordered(broker, peer, id, start_request(&request), Vec::new()).await?;
    ordered.order.session = true;
    let slot = admit(broker, conn, peer, id, &ordered.order).await?;
    // Where its tool calls go: the connection of the call being served.
    let switch = Arc::<RelaySwitch>::default();
    let tools = ordered.tools.is_some().then(|| Arc::clone(&switch));
    let spawned = start(broker, conn, peer, id, ordered, switch)
        .await
        .map_err(NotStarted::Reply)?;
    let info = broker
        .open_session(
            peer.principal(),
            spawned,
            (policy, request),
            slot,
            tools,
            resume,
        )
        .await
        .map_err(refuse)?;
    match restoring {
        None => Ok(info),
        Some(snapshot) => broker
            .restore_into(&peer.principal(), info, snapshot, resume)
            .await
            .map_err(refuse),
    }
}

/// How long a call to a session being paused waits for the pause.
const PAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Resume session `handle` if it is paused (then true), waiting first if
/// it is being paused; a live or gone one is left to the call.
async fn resume_if_paused(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    handle: &str,
) -> Result<bool, NotStarted> {
    let deadline = std::time::Instant::now() + PAUSE_WAIT;
    loop {
        match broker.lookup(&peer.principal(), handle) {
            Err(Lookup::Pausing) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(Lookup::Paused(snapshot)) => {
                if !broker.paused_state_kept(&peer.principal(), handle, &snapshot) {
                    let m = format!("session {handle} is over: it was paused while idle, and its kept state is gone (expired); start a new one with session_start");
                    let gone = (ErrorCode::SessionGone, m);
                    return Err(NotStarted::Reply(refusal(id, gone)));
                }
                let request = SessionStartRequest {
                    from_snapshot: Some(snapshot),
                    ..SessionStartRequest::default()
                };
                started_as(broker, conn, peer, id, request, Some(handle)).await?;
                return Ok(true);
            }
            _ => return Ok(false),
        }
    }
}

/// `session_snapshot`. False if the connection is finished.
pub(super) async fn snapshot(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: String,
    handle: String,
) -> bool {
    let reply = match broker.snapshot_session(&peer.principal(), &handle).await {
        Ok(s) => ServerMessage::SessionSnapshotted {
            id,
            snapshot: Box::new(s),
        },
        Err(r) => refusal(&id, r),
    };
    conn.out.send(reply).await
}

/// A `session` call: answered when the session has served it. False if
/// the connection is finished.
/// A `session` message.
pub(super) struct Asked {
    pub id: String,
    pub handle: String,
    pub call: SessionCall,
    pub timeout_s: Option<f64>,
    /// Send the call's output as it comes.
    pub watch: bool,
}

/// Output chunks a watched call may have queued for the connection; past
/// that, chunks are dropped (the answer has the output).
const WATCH_QUEUE: usize = 64;

pub(super) async fn call(broker: &Arc<Broker>, conn: &mut Conn, peer: &Peer, asked: Asked) -> bool {
    let Asked {
        id,
        handle,
        call,
        timeout_s,
        watch,
    } = asked;
    let resumed = match resume_if_paused(broker, conn, peer, &id, &handle).await {
        Ok(resumed) => resumed,
        Err(NotStarted::Reply(reply)) => return conn.out.send(reply).await,
        Err(NotStarted::ClientGone) => return false,
    };
    let (session, op, tools) = match broker.session_op(&peer.principal(), &handle, call, timeout_s)
    {
        Ok(s) => s,
        Err(r) => return conn.out.send(refusal(&id, r)).await,
    };
    let (output_tx, mut output) = tokio::sync::mpsc::channel::<ServerMessage>(WATCH_QUEUE);
    let sink = watch.then(|| {
        let id = id.clone();
        let sink: pycell_launch::session::OutputSink = Arc::new(move |stream, bytes| {
            let data_base64 = pycell_protocol::messages::encode_b64(bytes);
            let _ = output_tx.try_send(ServerMessage::Output {
                id: id.clone(),
                stream,
                data_base64,
            });
        });
        sink
    });
    // The session's tool calls go to this connection while it waits.
    let relay = tools.as_ref().map(|switch| {
        let relay = ToolRelay::new(&id, conn.out.tx.clone());
        switch.set(Some(Arc::clone(&relay)));
        relay
    });
    let _unset = Unset(tools.clone());
    let asked = session.request_watched(op, sink);
    tokio::pin!(asked);
    let answered = loop {
        tokio::select! {
            a = &mut asked => break a,
            Some(chunk) = output.recv() => {
                conn.out.offer(chunk);
            }
            msg = conn.inbox.recv() => match msg {
                // The session outlives its callers: the call goes on, and
                // its answer is dropped.
                None => {
                    let _ = asked.await;
                    return false;
                }
                Some(Ok(ClientMessage::Cancel { id: cid } | ClientMessage::Interrupt { id: cid }))
                    if cid == id =>
                {
                    session.interrupt()
                }
                Some(Ok(ClientMessage::ToolAnswer { id: cid, call, outcome })) if cid == id => {
                    if let Some(relay) = &relay {
                        relay.answer(call, &outcome);
                    }
                }
                Some(other) => {
                    conn.out.offer(reply_during_run(other));
                }
            },
        }
    };
    // Output heard before the answer goes before it (the select above
    // may have taken the answer first).
    while let Ok(chunk) = output.try_recv() {
        conn.out.offer(chunk);
    }
    // Idle from the end of the call, not its start.
    broker.touch_session(&handle);
    let reply = answer_message(broker, id, &handle, answered, resumed);
    conn.out.send(reply).await
}

/// What a session call's outcome is told as.
fn answer_message(
    broker: &Broker,
    id: String,
    handle: &str,
    answered: Result<SessionAnswer, pycell_launch::session::SessionError>,
    resumed: bool,
) -> ServerMessage {
    match answered {
        Ok(answer) => ServerMessage::SessionAnswer {
            id,
            answer: Box::new(SessionAnswer { resumed, ..answer }),
        },
        Err(e) => refusal(&id, broker.session_error(handle, e)),
    }
}

/// `session_end`.
pub(super) async fn end(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: String,
    handle: String,
) -> bool {
    let reply = match broker.end_session(&peer.principal(), &handle).await {
        Ok(ended) => ServerMessage::SessionEnded { id, ended },
        Err(r) => refusal(&id, r),
    };
    conn.out.send(reply).await
}

/// `session_list`.
pub(super) async fn list(broker: &Arc<Broker>, conn: &mut Conn, peer: &Peer, id: String) -> bool {
    let sessions = broker.list_sessions(&peer.principal());
    conn.out
        .send(ServerMessage::Sessions { id, sessions })
        .await
}

/// Takes a session's tool calls away from a connection whose call is over.
struct Unset(Option<Arc<RelaySwitch>>);

impl Drop for Unset {
    fn drop(&mut self) {
        if let Some(switch) = &self.0 {
            switch.set(None);
        }
    }
}

/// The reply for a session message refused.
fn refusal(id: &str, (code, message): Refused) -> ServerMessage {
    error(Some(id), code, message)
}
