//! A run's lifecycle on a connection: ordered (its policy, limits,
//! dependencies and grants checked), admitted (a slot, or a place in the
//! queue, which it keeps answering for), started by the monitor, and its
//! events relayed to the client until its result.

use super::*;
use crate::link::SpawnedFd;
use pycell_wire::named_fds::{Named, NamedFdsError};
use std::os::fd::OwnedFd;

/// How a run that did not get to start ends, for the client.
pub(super) enum NotStarted {
    Reply(ServerMessage),
    ClientGone,
}

/// One run on a connection. Returns false if the connection is finished.
pub(super) async fn run(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: String,
    request: RunRequest,
) -> bool {
    let started = async {
        let granted = conn.granted.claim(&id);
        let ordered = ordered(broker, peer, &id, request, granted).await?;
        let slot = admit(broker, conn, peer, &id, &ordered.order).await?;
        Ok::<_, NotStarted>((ordered, slot))
    };
    let (ordered, slot) = match started.await {
        Ok(admitted) => admitted,
        Err(NotStarted::Reply(reply)) => return conn.out.send(reply).await,
        Err(NotStarted::ClientGone) => return false,
    };
    let active = broker.active_run();
    let last = run_admitted(broker, conn, peer, &id, ordered).await;
    // Free the slot before the client hears the run is over, so that its
    // next run finds it free (and a client slow to take the rest of its
    // output does not hold it).
    drop(slot);
    for msg in last {
        if !conn.out.send(msg).await {
            return false;
        }
    }
    // A draining daemon waits for active runs: this one is active until
    // its client has the result, not merely until the result is queued.
    conn.out.flushed().await;
    drop(active);
    true
}

/// The run as the monitor will be asked for it (see `order.rs`): a
/// request the broker cannot order is answered here, before it waits for
/// a slot.
pub(super) async fn ordered(
    broker: &Arc<Broker>,
    peer: &Peer,
    id: &str,
    request: RunRequest,
    granted: Vec<std::os::fd::OwnedFd>,
) -> Result<Ordered, NotStarted> {
    if broker.stopping() {
        let msg = "pycelld is shutting down; try again when it is back";
        return Err(NotStarted::Reply(error(
            Some(id),
            ErrorCode::ShuttingDown,
            msg,
        )));
    }
    if let Some(refused) = may_use(broker, peer, id, request.policy_name()) {
        return Err(refused);
    }
    broker.order(request, granted).await.map_err(|n| {
        NotStarted::Reply(match n {
            NotOrdered::Refused(code, message) => error(Some(id), code, message),
            NotOrdered::Failed { policy, failure } => not_started(id, &policy, failure),
        })
    })
}

/// Whether the peer may name `policy` (`policies_by_uid`; a front end's
/// uid for every identity it speaks for).
/// None if it may; else the refusal to send.
pub(super) fn may_use(broker: &Broker, peer: &Peer, id: &str, policy: &str) -> Option<NotStarted> {
    let refused = broker.config.policy_access.check(peer.uid, policy).err()?;
    Some(NotStarted::Reply(error(
        Some(id),
        ErrorCode::InvalidRequest,
        refused.to_string(),
    )))
}

/// A slot for the run: at once, or after waiting in the queue.
pub(super) async fn admit(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    order: &RunOrder,
) -> Result<Slot, NotStarted> {
    let ask = Ask {
        who: peer.principal(),
        memory: order.limits.memory.get(),
    };
    let memory = ask.memory;
    match broker.admission.request(ask) {
        Entry::Admitted(slot) => Ok(slot),
        Entry::Refused(r) => {
            let msg = broker.refusal_message(r, memory);
            Err(NotStarted::Reply(error(Some(id), ErrorCode::Busy, msg)))
        }
        Entry::Waiting(waiting) => wait_turn(broker, conn, id, &order.policy, waiting).await,
    }
}

/// Wait in the queue, telling the client its place every second, until
/// admitted, the wait runs out, the client cancels or leaves, or the
/// daemon stops.
pub(super) async fn wait_turn(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    id: &str,
    policy: &str,
    mut waiting: Waiting,
) -> Result<Slot, NotStarted> {
    let wait = broker.config.queue_wait;
    let give_up = Instant::now() + wait;
    let mut stop = broker.stop.subscribe();
    loop {
        if let Some(position) = waiting.position() {
            conn.out.offer(ServerMessage::Queued {
                id: id.to_string(),
                position,
            });
        }
        tokio::select! {
            _ = waiting.admitted() => return Ok(waiting.into_slot()),
            _ = sleep(QUEUE_TICK) => {}
            _ = tokio::time::sleep_until(give_up) => {
                let msg = format!("no slot became free within queue_wait ({} s; {} runs are going); try again later", wait.as_secs_f64(), broker.config.max_concurrent_runs);
                return Err(NotStarted::Reply(error(Some(id), ErrorCode::Busy, msg)));
            }
            _ = stop.wait_for(|s| *s) => {
                let msg = "pycelld is shutting down; try again when it is back";
                return Err(NotStarted::Reply(error(Some(id), ErrorCode::ShuttingDown, msg)));
            }
            _ = conn.out.closed() => return Err(NotStarted::ClientGone),
            msg = conn.inbox.recv() => match msg {
                None => return Err(NotStarted::ClientGone),
                Some(Ok(ClientMessage::Cancel { id: cid })) if cid == id => {
                    let failure = cancelled_before_start("waiting for a slot");
                    return Err(NotStarted::Reply(not_started(id, policy, failure)));
                }
                Some(other) => {
                    conn.out.offer(reply_during_run(other));
                }
            },
        }
    }
}

/// The result of a run that never started, for its client.
pub(super) fn not_started(id: &str, policy: &str, failure: JailFailure) -> ServerMessage {
    ServerMessage::Result {
        id: id.to_string(),
        result: Box::new(RunResult::refused("", policy, failure)),
    }
}

/// Why a run cancelled before it started did not run: it was `doing` that.
pub(super) fn cancelled_before_start(doing: &str) -> JailFailure {
    use pycell_wire::codes::{FailureCode, Layer};
    let message = format!("cancelled while {doing}; it never started");
    JailFailure::new(FailureCode::Cancelled, Layer::Daemon, message)
}

/// Ask the monitor to start the run (its env built first, if need be);
/// `Err` is the reply to the client.
pub(super) async fn start(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    Ordered {
        order,
        tools,
        egress: narrowed,
        grant_sources,
    }: Ordered,
    upstream: Arc<dyn pycell_tools::service::Upstream>,
) -> Result<SpawnedRun, ServerMessage> {
    let internal = |m: String| error(Some(id), ErrorCode::Internal, m);
    let serves_stdio = order.stdio;
    let (req, replies) = broker
        .link
        .spawn(peer.ids(), order, grant_sources)
        .await
        .map_err(|e| internal(e.to_string()))?;
    let ((reply, fds), cancelled) = installing::last_reply(broker, conn, id, req, replies)
        .await
        .map_err(|e| internal(e.to_string()))?;
    let (run_id, sandbox_uid, policy, limits, media, egress, env, ready, descriptors) = match reply
    {
        ToBroker::Spawned {
            run_id,
            sandbox_uid,
            policy,
            limits,
            media,
            egress,
            env,
            ready,
            descriptors,
            ..
        } => (
            run_id,
            sandbox_uid,
            policy,
            limits,
            media,
            egress,
            env,
            ready,
            descriptors,
        ),
        ToBroker::Refused { code, message, .. } => return Err(error(Some(id), code, message)),
        ToBroker::Failed {
            policy, failure, ..
        } => {
            let failure = match cancelled {
                true => cancelled_before_start("its dependencies were being installed"),
                false => failure,
            };
            return Err(not_started(id, &policy, failure));
        }
        _ => return Err(internal("unexpected reply from the monitor".into())),
    };
    if cancelled {
        // The build was done when the cancel came: the run goes at once.
        let _ = broker.link.send(&ToMonitor::Kill {
            run_id: run_id.clone(),
        });
    }
    let (events, handouts) = match spawned_fds(descriptors, fds) {
        Ok(got) => got,
        Err(m) => {
            let _ = broker.link.send(&ToMonitor::Kill { run_id });
            return Err(internal(format!("the monitor's reply: {m}")));
        }
    };
    let events = pipe::Receiver::from_owned_fd(events).map_err(|e| e.to_string());
    if egress.is_some() && handouts.is_none() {
        let _ = broker.link.send(&ToMonitor::Kill { run_id });
        return Err(internal("the monitor sent no handout channel".into()));
    }
    let (stdio_tx, stdio) = match serves_stdio {
        true => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    let services = Services {
        egress: egress
            .map(|rules| broker.egress_service(&run_id, &policy, narrowed.unwrap_or(rules))),
        tools: tools.map(|grant| broker.tool_service(&run_id, grant, upstream)),
        stdio: stdio_tx,
    };
    match events {
        Ok(events) => Ok(SpawnedRun {
            run_id,
            sandbox_uid,
            ready,
            policy,
            limits,
            media,
            events,
            handouts,
            services,
            stdio,
            env,
        }),
        Err(m) => {
            let _ = broker.link.send(&ToMonitor::Kill { run_id });
            Err(internal(m))
        }
    }
}

/// Start the run and relay it; the messages that end it for the client
/// (output it missed, then the result), none if the client is gone.
pub(super) async fn run_admitted(
    broker: &Arc<Broker>,
    conn: &mut Conn,
    peer: &Peer,
    id: &str,
    ordered: Ordered,
) -> Vec<ServerMessage> {
    let relay = ToolRelay::new(id, conn.out.tx.clone());
    let started = match start(broker, conn, peer, id, ordered, relay.clone()).await {
        Ok(s) => s,
        Err(reply) => return vec![reply],
    };
    let run_id = started.run_id.clone();
    let kill = || {
        let _ = broker.link.send(&ToMonitor::Kill {
            run_id: run_id.clone(),
        });
    };
    let hello = ServerMessage::Started {
        id: id.to_string(),
        run_id: run_id.clone(),
    };
    if !conn.out.send(hello).await {
        kill();
        return Vec::new();
    }
    let interrupt = || {
        let _ = broker.link.send(&ToMonitor::Interrupt {
            run_id: run_id.clone(),
        });
    };
    let monitor_gone = || broker.link.monitor_gone();
    let control = RunControl {
        kill: &kill,
        interrupt: &interrupt,
        monitor_gone: &monitor_gone,
    };
    relay_run(conn, id, started, &relay, &control).await
}

/// What the relay of a run may do to it, and ask about its monitor.
pub(super) struct RunControl<'a> {
    kill: &'a (dyn Fn() + Sync),
    /// SIGINT to its program (the client's ^C).
    interrupt: &'a (dyn Fn() + Sync),
    monitor_gone: &'a (dyn Fn() -> bool + Sync),
}

/// What a run has streamed to its client.
pub(super) struct Streaming {
    /// Bytes of each stream sent as `output` messages.
    sent: [usize; 2],
    /// False once the client fell behind on that stream.
    on: [bool; 2],
}

/// Forward the run's output to the client while answering its messages
/// (cancel); build the result. Returns the messages still due to the
/// client (output it missed, the result), none if it is gone.
pub(super) async fn relay_run(
    conn: &mut Conn,
    id: &str,
    started: SpawnedRun,
    tools: &ToolRelay,
    control: &RunControl<'_>,
) -> Vec<ServerMessage> {
    let kill = control.kill;
    let collector = Collector::new(&started.run_id, &started.policy, Some(started.limits))
        .with_media_limits(started.media);
    let env = started.env;
    let mut stdio = started.stdio;
    let mut stream = RunStream::start(
        started.events,
        collector,
        started.handouts,
        started.services,
    );
    let mut streaming = Streaming {
        sent: [0, 0],
        on: [true, true],
    };
    let (mut connection_alive, mut cancelled) = (true, false);
    loop {
        tokio::select! {
            out = stream.next_output() => match out {
                Some((s, bytes)) if connection_alive => {
                    stream_output(&conn.out, id, &mut streaming, s, &bytes);
                }
                Some(_) => {}
                // At the result (the run is over, though its jailer may
                // still be removing its cgroup), or the stream's end.
                None => break,
            },
            _ = conn.out.closed(), if connection_alive => {
                connection_alive = false;
                kill();
            }
            Some(sock) = next_stdio(&mut stdio), if connection_alive => {
                let msg = ServerMessage::Stdio { id: id.to_string() };
                if !conn.out.send_with_fd(msg, sock).await {
                    connection_alive = false;
                    kill();
                }
            }
            msg = conn.inbox.recv(), if connection_alive => {
                connection_alive = during_run(conn, id, msg, tools, control, &mut cancelled);
            }
        }
    }
    if stream.broken() {
        kill();
    }
    let due = missed(id, &streaming, &stream.collector);
    // The jail is gone: so are its connections (the egress proxy's report).
    let (mut result, _) = stream.finish(JailerEnd::Elsewhere).await;
    // A run killed though nobody here asked, while the monitor is gone:
    // its jailer's parent-death signal killed it (the monitor's end of the
    // link closed before that signal was sent, so this sees it). Its client
    // hears what every run of a dead monitor ends with: the connection
    // closes (daemon_failed), not a bare `killed`.
    let orphaned = result.status == RunStatus::Killed && !cancelled && (control.monitor_gone)();
    if !connection_alive || orphaned {
        return Vec::new();
    }
    let mut due = due;
    result.env = env;
    due.push(ServerMessage::Result {
        id: id.to_string(),
        result: Box::new(result),
    });
    due
}

/// A server over stdio's socket, once its jail has handed it out (then
/// never again).
pub(super) async fn next_stdio(
    stdio: &mut Option<tokio::sync::oneshot::Receiver<std::os::fd::OwnedFd>>,
) -> Option<std::os::fd::OwnedFd> {
    let sock = match stdio.as_mut() {
        Some(rx) => rx.await.ok(),
        None => std::future::pending().await,
    };
    *stdio = None;
    sock
}

/// A client message while its run goes: the run's cancel, tool answers
/// and ^C; anything else answered. False once the client is gone (its
/// run is then killed).
pub(super) fn during_run(
    conn: &Conn,
    id: &str,
    msg: Option<Incoming>,
    tools: &ToolRelay,
    control: &RunControl<'_>,
    cancelled: &mut bool,
) -> bool {
    match msg {
        None => {
            (control.kill)();
            return false;
        }
        Some(Ok(ClientMessage::Cancel { id: cid })) if cid == id => {
            if !*cancelled {
                *cancelled = true;
                (control.kill)();
            }
        }
        Some(Ok(ClientMessage::ToolAnswer {
            id: cid,
            call,
            outcome,
        })) if cid == id => tools.answer(call, &outcome),
        Some(Ok(ClientMessage::Interrupt { id: cid })) if cid == id => (control.interrupt)(),
        Some(other) => {
            conn.out.offer(reply_during_run(other));
        }
    }
    true
}

/// Offer one output chunk to a client; if it is too far behind to take it,
/// stop streaming that stream.
pub(super) fn stream_output(out: &Outbound, id: &str, st: &mut Streaming, s: Stream, bytes: &[u8]) {
    let i = s as usize;
    if !st.on[i] {
        return;
    }
    let msg = ServerMessage::Output {
        id: id.to_string(),
        stream: s,
        data_base64: encode_b64(bytes),
    };
    if out.offer(msg) {
        st.sent[i] += bytes.len();
    } else {
        st.on[i] = false;
    }
}

/// What a client that fell behind did not get streamed, in one piece per
/// stream, to go before the result.
pub(super) fn missed(id: &str, st: &Streaming, collector: &Collector) -> Vec<ServerMessage> {
    [Stream::Stdout, Stream::Stderr]
        .into_iter()
        .filter(|s| !st.on[*s as usize])
        .filter_map(|s| {
            let rest = collector.output(s).get(st.sent[s as usize]..)?;
            (!rest.is_empty()).then(|| ServerMessage::Output {
                id: id.to_string(),
                stream: s,
                data_base64: encode_b64(rest),
            })
        })
        .collect()
}

/// The answer to a client message other than this run's cancel while the
/// run goes (the connection holds one run at a time).
pub(super) fn reply_during_run(msg: Incoming) -> ServerMessage {
    match msg {
        Ok(ClientMessage::Cancel { id } | ClientMessage::Interrupt { id }) => {
            error(Some(&id), ErrorCode::NoSuchRun, NO_SUCH_RUN)
        }
        Ok(ClientMessage::Run { id, .. }) => error(
            Some(&id),
            ErrorCode::RunInProgress,
            "this connection already has a run going; open another connection or wait",
        ),
        Ok(_) => error(
            None,
            ErrorCode::BadMessage,
            "only cancel, interrupt and tool_answer are accepted while a run or session call is going on this connection",
        ),
        Err(reply) => reply,
    }
}

/// The event pipe and (if its jail hands descriptors out) the jailer's
/// stdin, taken by name from what came with `Spawned`.
fn spawned_fds(
    names: Vec<SpawnedFd>,
    fds: Vec<OwnedFd>,
) -> Result<(OwnedFd, Option<OwnedFd>), NamedFdsError> {
    let mut named = Named::pair(names, fds)?;
    let events = named.one(&SpawnedFd::Events)?;
    let stdin = named.take(&SpawnedFd::JailerStdin);
    named.done()?;
    Ok((events, stdin))
}
