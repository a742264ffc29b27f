//! A blocking client of pycelld, used by `pycell run`, `pycell info` and
//! `pycell mcp` (on a worker thread), and where clients find the daemon.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::framing::{self, FrameError};
use crate::info::{DaemonInfo, DaemonStatus};
use crate::messages::{
    decode_b64, ClientMessage, ErrorCode, RunRequest, ServerMessage, Stream, PROTOCOL_VERSION,
};
use crate::result::RunResult;
use crate::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest,
    SessionSummary, SnapshotInfo,
};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;

/// Where clients look for the daemon unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/pycell/pycell.sock";

/// The pycelld socket a client should use, if any: `explicit` (a flag), else
/// `$PYCELL_SOCKET`, else [`DEFAULT_SOCKET`] if it exists. None means no
/// daemon: the client builds the sandbox itself (embedded mode, as root).
/// An explicit or configured path is returned even if nothing listens
/// there, so that connecting to it fails loudly instead of falling back.
pub fn daemon_socket(explicit: Option<&Path>) -> Option<PathBuf> {
    let configured = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("PYCELL_SOCKET").map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty());
    configured.or_else(|| {
        let d = Path::new(DEFAULT_SOCKET);
        d.exists().then(|| d.to_path_buf())
    })
}

/// Where a client's requests go: pycelld's socket, and the identity a
/// trusted front end speaks for there (none: the connecting uid's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub socket: PathBuf,
    pub identity: Option<std::sync::Arc<str>>,
}

impl Endpoint {
    /// The socket, for the connecting uid itself.
    pub fn local(socket: PathBuf) -> Endpoint {
        Endpoint {
            socket,
            identity: None,
        }
    }

    /// A connection, after the handshake (see [`DaemonClient::connect`]).
    pub fn connect(&self) -> Result<DaemonClient, ClientError> {
        DaemonClient::connect_as(&self.socket, self.identity.as_deref())
    }

    /// A connection for one run, whose handshake is read with the run's
    /// first answer: the hello is written now and the run right behind it,
    /// one round trip where there were two (see
    /// [`DaemonClient::run_attached`]).
    pub fn connect_for_run(&self) -> Result<DaemonClient, ClientError> {
        DaemonClient::open(&self.socket, self.identity.as_deref())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to pycelld at {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("pycelld: {0}")]
    Frame(#[from] FrameError),
    #[error("pycelld refused ({code}): {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("pycelld sent an unexpected message: {0}")]
    Unexpected(String),
    /// What was asked could not be done, for this reason (a session whose
    /// dependencies could not be installed, say).
    #[error("{}", .0.message)]
    Failed(JailFailure),
}

fn unexpected(m: ServerMessage) -> ClientError {
    ClientError::Unexpected(format!("{m:?}"))
}

impl ClientError {
    /// The result of a run this error kept from running: pycelld's own
    /// refusal with its code, or why it could not be reached
    /// (`daemon_unavailable`) or broke off (`daemon_failed`).
    pub fn into_result(self, policy: &str) -> RunResult {
        let (code, message) = match self {
            ClientError::Refused { code, message } => (code.into(), message),
            ClientError::Failed(f) => (f.code, f.message),
            e @ ClientError::Connect { .. } => (FailureCode::DaemonUnavailable, e.to_string()),
            e => (FailureCode::DaemonFailed, e.to_string()),
        };
        RunResult::refused("", policy, JailFailure::new(code, Layer::Daemon, message))
    }
}

/// An `output` message's bytes.
fn output_bytes(data_base64: &str) -> Result<Vec<u8>, ClientError> {
    decode_b64(data_base64).map_err(|e| ClientError::Unexpected(e.to_string()))
}

/// Hears output as it comes: the stream, and the bytes.
pub type OnOutput<'a> = dyn FnMut(Stream, &[u8]) + 'a;

#[derive(Debug)]
pub struct DaemonClient {
    stream: UnixStream,
    /// Held while a message is written from another thread (a cancel, a
    /// tool call's answer), so that frames never interleave.
    writing: Arc<Mutex<()>>,
    /// A hello whose answer is still to be read: the socket's path, and
    /// whether the hello could be written.
    unanswered: Option<(PathBuf, Result<(), FrameError>)>,
}

/// How long a client keeps trying a socket that is missing or refuses
/// connections (pycelld restarting without systemd's socket activation,
/// which would keep the socket there and queue the client instead).
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// Connect to `path`, retrying while it is missing or nobody listens, for
/// at most `patience`.
pub fn connect_patiently(path: &Path, patience: Duration) -> io::Result<UnixStream> {
    let give_up = Instant::now() + patience;
    let mut pause = Duration::from_millis(20);
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) if retryable(&e) && Instant::now() + pause < give_up => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Errors that a restarting daemon causes, and that go away.
fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

impl DaemonClient {
    /// Connect (waiting up to [`CONNECT_PATIENCE`] for a restarting
    /// daemon) and do the version handshake.
    pub fn connect(path: &Path) -> Result<DaemonClient, ClientError> {
        DaemonClient::connect_as(path, None)
    }

    /// [`DaemonClient::connect`], speaking for `identity` (a front end's
    /// authenticated caller; pycelld refuses it unless this process's uid
    /// is one of its trusted front ends).
    pub fn connect_as(path: &Path, identity: Option<&str>) -> Result<DaemonClient, ClientError> {
        let mut c = DaemonClient::open(path, identity)?;
        c.answered()?;
        Ok(c)
    }

    /// Connect and write the hello; its answer is read by [`Self::answered`].
    fn open(path: &Path, identity: Option<&str>) -> Result<DaemonClient, ClientError> {
        let mut stream =
            connect_patiently(path, CONNECT_PATIENCE).map_err(|source| ClientError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let hello = framing::write_sync(
            &mut stream,
            &ClientMessage::Hello {
                version: PROTOCOL_VERSION,
                client: format!("pycell {}", env!("CARGO_PKG_VERSION")),
                identity: identity.map(str::to_string),
            },
        );
        Ok(DaemonClient {
            stream,
            writing: Arc::default(),
            unanswered: Some((path.to_path_buf(), hello)),
        })
    }

    /// The answer to our hello, if not read yet: a welcome, or why not.
    fn answered(&mut self) -> Result<(), ClientError> {
        let Some((path, hello)) = self.unanswered.take() else {
            return Ok(());
        };
        // A daemon that refuses us (unauthorized) says why and hangs up
        // without reading: its reason may already be waiting even though
        // our hello could not be written.
        let reply = framing::read_sync::<ServerMessage>(&mut self.stream);
        // No handshake: nothing was asked of this daemon (a router may
        // try another), as when the socket cannot be connected at all.
        let unreachable = |e: FrameError| ClientError::Connect {
            path,
            source: io::Error::other(format!("the handshake broke off: {e}")),
        };
        let reply = match (hello, reply) {
            (_, Ok(r)) => r,
            (Err(e), Err(_)) => return Err(unreachable(e)),
            (Ok(()), Err(e)) => return Err(unreachable(e)),
        };
        match reply {
            ServerMessage::Welcome { .. } => Ok(()),
            ServerMessage::Error { code, message, .. } => {
                Err(ClientError::Refused { code, message })
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// A handle that can cancel the current run from another thread.
    pub fn canceller(&self) -> io::Result<Canceller> {
        Ok(Canceller {
            stream: self.stream.try_clone()?,
            writing: Arc::clone(&self.writing),
        })
    }

    /// A handle that answers the current run's tool calls from any thread.
    pub fn answerer(&self) -> io::Result<ToolAnswerer> {
        Ok(ToolAnswerer {
            stream: self.stream.try_clone()?,
            writing: Arc::clone(&self.writing),
        })
    }

    /// Run `request`, calling `on_output` for each chunk as it arrives.
    pub fn run(
        &mut self,
        request: RunRequest,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<RunResult, ClientError> {
        self.run_queued(request, on_output, |_| {})
    }

    /// [`DaemonClient::run`], also calling `on_stage` while the run waits
    /// for a slot, while its dependencies are installed, and when it starts.
    pub fn run_queued(
        &mut self,
        request: RunRequest,
        on_output: impl FnMut(Stream, &[u8]),
        on_stage: impl FnMut(Stage<'_>),
    ) -> Result<RunResult, ClientError> {
        self.run_attached(request, &[], on_output, on_stage, None)
    }

    /// [`DaemonClient::run_queued`] with what the request takes besides
    /// itself: `granted`, the descriptors of `request.grants` in order
    /// (sent with it as SCM_RIGHTS), and, for a server over stdio
    /// (`request.serve_stdio`), `on_stdio`, which gets the socket of its
    /// stdin and stdout once it is up (the result comes when it ends).
    pub fn run_attached(
        &mut self,
        request: RunRequest,
        granted: &[std::os::fd::OwnedFd],
        on_output: impl FnMut(Stream, &[u8]),
        on_stage: impl FnMut(Stage<'_>),
        on_stdio: Option<&mut dyn FnMut(std::os::fd::OwnedFd)>,
    ) -> Result<RunResult, ClientError> {
        let msg = ClientMessage::Run {
            id: "1".into(),
            request,
        };
        let sent = match granted.is_empty() {
            true => framing::write_sync(&mut self.stream, &msg),
            false => {
                let fds: Vec<_> = granted.iter().map(|f| f.as_fd()).collect();
                framing::encode(&msg).and_then(|frame| {
                    pycell_wire::fdpass::send_with_fds(self.stream.as_fd(), &frame, &fds)
                        .map_err(FrameError::from)
                })
            }
        };
        // On a connection for this run, the hello's answer comes first: a
        // refusal explains a request the daemon hung up on unread.
        self.answered()?;
        sent?;
        self.relay_run(on_output, on_stage, on_stdio)
    }

    /// A run's messages after its request, to its result.
    fn relay_run(
        &mut self,
        mut on_output: impl FnMut(Stream, &[u8]),
        mut on_stage: impl FnMut(Stage<'_>),
        mut on_stdio: Option<&mut dyn FnMut(std::os::fd::OwnedFd)>,
    ) -> Result<RunResult, ClientError> {
        let mut reader = pycell_wire::fdpass::FdReader::new(&self.stream);
        loop {
            let msg = match on_stdio.is_some() {
                true => framing::read_sync::<ServerMessage>(&mut reader)?,
                false => framing::read_sync::<ServerMessage>(&mut reader.stream)?,
            };
            match msg {
                ServerMessage::Stdio { .. } => match (reader.take().pop(), on_stdio.as_mut()) {
                    (Some(sock), Some(f)) => f(sock),
                    _ => {
                        return Err(ClientError::Unexpected(
                            "a stdio message without its socket".into(),
                        ))
                    }
                },
                ServerMessage::Started { run_id, .. } => on_stage(Stage::Started(&run_id)),
                ServerMessage::Queued { position, .. } => on_stage(Stage::Queued(position)),
                ServerMessage::Installing { message, .. } => on_stage(Stage::Installing(&message)),
                ServerMessage::ToolCall {
                    call,
                    server,
                    tool,
                    arguments,
                    timeout_ms,
                    max_result_bytes,
                    ..
                } => on_stage(Stage::ToolCall {
                    call,
                    server: &server,
                    tool: &tool,
                    arguments: &arguments,
                    timeout: timeout_ms.map(Duration::from_millis),
                    max_result: max_result_bytes,
                }),
                ServerMessage::Output {
                    stream,
                    data_base64,
                    ..
                } => on_output(stream, &output_bytes(&data_base64)?),
                ServerMessage::Result { result, .. } => return Ok(*result),
                ServerMessage::Error { code, message, .. } => {
                    // An error about a stray cancel does not end the run.
                    if code == ErrorCode::NoSuchRun {
                        continue;
                    }
                    return Err(ClientError::Refused { code, message });
                }
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    /// Start a session (its dependencies installed first, if need be:
    /// `on_stage` hears the install and the queue as for a run).
    pub fn session_start(
        &mut self,
        request: SessionStartRequest,
        on_stage: impl FnMut(Stage<'_>),
    ) -> Result<SessionInfo, ClientError> {
        let msg = ClientMessage::SessionStart {
            id: "1".into(),
            request,
        };
        let started = self.starting(&msg, on_stage, |m| match m {
            ServerMessage::SessionStarted { session, .. } => Ok(*session),
            other => Err(Box::new(other)),
        })?;
        Ok(started)
    }

    /// A new session whose state and workspace are a copy of session
    /// `session`'s (its start queued and admitted as any session's).
    pub fn session_fork(
        &mut self,
        session: &str,
        on_stage: impl FnMut(Stage<'_>),
    ) -> Result<SessionForkInfo, ClientError> {
        let msg = ClientMessage::SessionFork {
            id: "1".into(),
            session: session.to_string(),
        };
        self.starting(&msg, on_stage, |m| match m {
            ServerMessage::SessionForked { fork, .. } => Ok(*fork),
            other => Err(Box::new(other)),
        })
    }

    /// Keep session `session`'s state in the server's store.
    pub fn session_snapshot(&mut self, session: &str) -> Result<SnapshotInfo, ClientError> {
        let msg = ClientMessage::SessionSnapshot {
            id: "1".into(),
            session: session.to_string(),
        };
        self.answered()?;
        framing::write_sync(&mut self.stream, &msg)?;
        match self.next_reply()? {
            ServerMessage::SessionSnapshotted { snapshot, .. } => Ok(*snapshot),
            other => Err(unexpected(other)),
        }
    }

    /// Send `msg`, which starts a session, and wait for the answer `done`
    /// takes (it gives back any other message), telling `on_stage` of its
    /// queueing and installs.
    fn starting<T>(
        &mut self,
        msg: &ClientMessage,
        mut on_stage: impl FnMut(Stage<'_>),
        done: impl Fn(ServerMessage) -> Result<T, Box<ServerMessage>>,
    ) -> Result<T, ClientError> {
        self.answered()?;
        framing::write_sync(&mut self.stream, msg)?;
        loop {
            let other = match done(self.next_reply()?) {
                Ok(answer) => return Ok(answer),
                Err(other) => other,
            };
            match *other {
                ServerMessage::Queued { position, .. } => on_stage(Stage::Queued(position)),
                ServerMessage::Installing { message, .. } => on_stage(Stage::Installing(&message)),
                // A session that could not start, with a run's result.
                ServerMessage::Result { result, .. } => {
                    let e = result.error.unwrap_or_else(|| {
                        JailFailure::new(
                            FailureCode::Internal,
                            Layer::Daemon,
                            "the session did not start",
                        )
                    });
                    return Err(ClientError::Failed(e));
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// A call in session `session`: its answer once served.
    pub fn session_call(
        &mut self,
        session: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
    ) -> Result<SessionAnswer, ClientError> {
        self.session_call_offering(session, call, timeout_s, |_| {})
    }

    /// [`DaemonClient::session_call`] for a client that offered the session
    /// tools: `on_tool_call` hears the cell's tool calls
    /// ([`Stage::ToolCall`]), to answer with a [`ToolAnswerer`].
    pub fn session_call_offering(
        &mut self,
        session: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        on_tool_call: impl FnMut(Stage<'_>),
    ) -> Result<SessionAnswer, ClientError> {
        self.session_call_watching(session, call, timeout_s, on_tool_call, None)
    }

    /// [`DaemonClient::session_call_offering`], the call's output heard by
    /// `on_output` as it comes, if given.
    pub fn session_call_watching(
        &mut self,
        session: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        mut on_tool_call: impl FnMut(Stage<'_>),
        mut on_output: Option<&mut OnOutput<'_>>,
    ) -> Result<SessionAnswer, ClientError> {
        let msg = ClientMessage::Session {
            id: "1".into(),
            session: session.to_string(),
            call,
            timeout_s,
            watch: on_output.is_some(),
        };
        self.answered()?;
        framing::write_sync(&mut self.stream, &msg)?;
        loop {
            match self.next_reply()? {
                ServerMessage::SessionAnswer { answer, .. } => return Ok(*answer),
                ServerMessage::Output {
                    stream,
                    data_base64,
                    ..
                } => {
                    let bytes = output_bytes(&data_base64)?;
                    if let Some(f) = on_output.as_mut() {
                        f(stream, &bytes);
                    }
                }
                ServerMessage::ToolCall {
                    call,
                    server,
                    tool,
                    arguments,
                    timeout_ms,
                    max_result_bytes,
                    ..
                } => on_tool_call(Stage::ToolCall {
                    call,
                    server: &server,
                    tool: &tool,
                    arguments: &arguments,
                    timeout: timeout_ms.map(Duration::from_millis),
                    max_result: max_result_bytes,
                }),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// End session `session`, once its jail is gone.
    pub fn session_end(&mut self, session: &str) -> Result<SessionEndInfo, ClientError> {
        let msg = ClientMessage::SessionEnd {
            id: "1".into(),
            session: session.to_string(),
        };
        self.answered()?;
        framing::write_sync(&mut self.stream, &msg)?;
        match self.next_reply()? {
            ServerMessage::SessionEnded { ended, .. } => Ok(ended),
            other => Err(unexpected(other)),
        }
    }

    /// This uid's open sessions.
    pub fn session_list(&mut self) -> Result<Vec<SessionSummary>, ClientError> {
        let msg = ClientMessage::SessionList { id: "1".into() };
        self.answered()?;
        framing::write_sync(&mut self.stream, &msg)?;
        match self.next_reply()? {
            ServerMessage::Sessions { sessions, .. } => Ok(sessions),
            other => Err(unexpected(other)),
        }
    }

    /// The next message, an error (other than about a stray cancel) as
    /// `Err`.
    fn next_reply(&mut self) -> Result<ServerMessage, ClientError> {
        loop {
            match framing::read_sync::<ServerMessage>(&mut self.stream)? {
                ServerMessage::Error {
                    code: ErrorCode::NoSuchRun,
                    ..
                } => continue,
                ServerMessage::Error { code, message, .. } => {
                    return Err(ClientError::Refused { code, message })
                }
                other => return Ok(other),
            }
        }
    }

    pub fn info(&mut self) -> Result<DaemonInfo, ClientError> {
        self.answered()?;
        framing::write_sync(&mut self.stream, &ClientMessage::Info)?;
        match self.next_reply()? {
            ServerMessage::Info { info } => Ok(*info),
            other => Err(unexpected(other)),
        }
    }

    /// The daemon's load and limits (`status`).
    pub fn status(&mut self) -> Result<DaemonStatus, ClientError> {
        self.answered()?;
        framing::write_sync(&mut self.stream, &ClientMessage::Status)?;
        match self.next_reply()? {
            ServerMessage::Status { status } => Ok(*status),
            other => Err(unexpected(other)),
        }
    }
}

/// Where a daemon run is before its output: what `on_stage` hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage<'a> {
    /// Waiting for a slot; 1 goes next.
    Queued(usize),
    /// One step of installing the run's dependencies.
    Installing(&'a str),
    /// The sandbox is starting, as this run id.
    Started(&'a str),
    /// The run's code calls a tool the client offered: answer with a
    /// [`ToolAnswerer`] (from any thread; calls may overlap).
    ToolCall {
        call: u64,
        server: &'a str,
        tool: &'a str,
        arguments: &'a serde_json::Map<String, serde_json::Value>,
        /// The policy's `call_timeout`, counted once the server is up.
        timeout: Option<std::time::Duration>,
        /// The policy's `max_result`, in bytes.
        max_result: Option<u64>,
    },
}

/// Connect to `path` and run `request`, starting over on a new connection
/// while the daemon answers `shutting_down` before the run started (for at
/// most [`CONNECT_PATIENCE`]): nothing of the run has happened, and a
/// daemon restarting under socket activation is back within moments.
/// `on_connected` sees each connection before its run (to take a
/// [`Canceller`]); `granted` and `on_stdio` are as for
/// [`DaemonClient::run_attached`].
pub fn run_patiently(
    endpoint: &Endpoint,
    request: RunRequest,
    granted: &[std::os::fd::OwnedFd],
    mut on_output: impl FnMut(Stream, &[u8]),
    mut on_stage: impl FnMut(Stage<'_>),
    mut on_connected: impl FnMut(&DaemonClient),
    mut on_stdio: Option<&mut dyn FnMut(std::os::fd::OwnedFd)>,
) -> Result<RunResult, ClientError> {
    let give_up = Instant::now() + CONNECT_PATIENCE;
    loop {
        let mut client = endpoint.connect_for_run()?;
        on_connected(&client);
        // A new trait object each time, borrowing the caller's for this run.
        let stdio = on_stdio
            .as_mut()
            .map(|f| f as &mut dyn FnMut(std::os::fd::OwnedFd));
        let (output, stage) = (&mut on_output, &mut on_stage);
        match client.run_attached(request.clone(), granted, output, stage, stdio) {
            Err(ClientError::Refused {
                code: ErrorCode::ShuttingDown,
                ..
            }) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(100)),
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_that_appears_late_is_waited_for_and_a_missing_one_not_forever() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("late.sock");
        let p = path.clone();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
            l.accept().map(|_| ()).unwrap();
        });
        assert!(connect_patiently(&path, Duration::from_secs(5)).is_ok());
        server.join().unwrap();
        let started = Instant::now();
        let e = connect_patiently(&dir.path().join("never.sock"), Duration::from_millis(400))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// A daemon that answers nothing until both the hello and the run have
    /// arrived: a run costs the client one round trip, not two.
    fn daemon_that_reads_two_frames_first(path: &Path, answer: ServerMessage) {
        let l = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // A client that waits for an answer first hangs up here.
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let hello: ClientMessage = framing::read_sync(&mut s).unwrap();
            assert!(matches!(hello, ClientMessage::Hello { .. }), "{hello:?}");
            let run: ClientMessage = framing::read_sync(&mut s).unwrap();
            assert!(matches!(run, ClientMessage::Run { .. }), "{run:?}");
            framing::write_sync(&mut s, &answer).unwrap();
            let result = ServerMessage::Result {
                id: "1".into(),
                result: Box::new(RunResult::refused(
                    "r-1",
                    "default",
                    JailFailure::new(FailureCode::Internal, Layer::Jailer, "a stand-in"),
                )),
            };
            let _ = framing::write_sync(&mut s, &result);
        });
    }

    #[test]
    fn a_run_is_written_behind_the_hello_and_a_refused_hello_still_explains_itself() {
        let dir = tempfile::tempdir().unwrap();
        let welcome = ServerMessage::Welcome {
            version: PROTOCOL_VERSION,
            server: "test".into(),
        };
        let path = dir.path().join("d.sock");
        daemon_that_reads_two_frames_first(&path, welcome);
        let r = run_patiently(
            &Endpoint::local(path),
            RunRequest::default(),
            &[],
            |_, _| {},
            |_| {},
            |_| {},
            None,
        );
        assert_eq!(r.unwrap().run_id, "r-1");

        let refusal = ServerMessage::Error {
            id: None,
            code: ErrorCode::Unauthorized,
            message: "uid 4242 may not".into(),
        };
        let path = dir.path().join("refusing.sock");
        daemon_that_reads_two_frames_first(&path, refusal);
        let mut c = Endpoint::local(path).connect_for_run().unwrap();
        match c.run(RunRequest::default(), |_, _| {}) {
            Err(ClientError::Refused { code, message }) => {
                assert_eq!(code, ErrorCode::Unauthorized);
                assert!(message.contains("4242"), "{message}");
            }
            other => panic!("not refused: {other:?}"),
        }
    }
}

#[derive(Debug)]
pub struct Canceller {
    stream: UnixStream,
    writing: Arc<Mutex<()>>,
}

impl Canceller {
    pub fn cancel(&mut self) -> Result<(), ClientError> {
        self.send(&ClientMessage::Cancel { id: "1".into() })
    }

    /// SIGINT to the run's program (^C).
    pub fn interrupt(&mut self) -> Result<(), ClientError> {
        self.send(&ClientMessage::Interrupt { id: "1".into() })
    }

    fn send(&mut self, msg: &ClientMessage) -> Result<(), ClientError> {
        let _writing = self.writing.lock();
        framing::write_sync(&mut self.stream, msg)?;
        Ok(())
    }
}

/// Answers tool calls of the connection's run (see [`Stage::ToolCall`]).
#[derive(Debug)]
pub struct ToolAnswerer {
    stream: UnixStream,
    writing: Arc<Mutex<()>>,
}

impl ToolAnswerer {
    pub fn answer(
        &mut self,
        call: u64,
        outcome: pycell_tools::frames::Outcome,
    ) -> Result<(), ClientError> {
        let outcome = serde_json::value::to_raw_value(&outcome)
            .map(crate::messages::RawJson)
            .map_err(|e| ClientError::Unexpected(format!("encoding a tool answer: {e}")))?;
        let _writing = self.writing.lock();
        let msg = ClientMessage::ToolAnswer {
            id: "1".into(),
            call,
            outcome,
        };
        framing::write_sync(&mut self.stream, &msg)?;
        Ok(())
    }
}
