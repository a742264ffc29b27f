//! A session's two channels in the relay: requests from the launcher (the
//! jailer's stdin) and the runner's socket (its stdin), both non-blocking.
//! What they amount to is queued as [`SessionStep`]s for the relay's loop,
//! which holds the jail's pid and cgroup.

use pycell_host::cgroup::CgroupUsage;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use pycell_runner::session::{new_token, reply_body, SessionOp, Token};
use pycell_wire::report::SessionEnd;
use pycell_wire::spec::SessionSpec;

use super::{decode_op, reply_frames, request_frames, BadRequest, Clocks, Frames};
use crate::run::warm::WarmState;

const CHUNK: usize = 64 * 1024;

/// What the session's channels brought, for the relay to act on.
#[derive(Debug)]
pub(crate) enum SessionStep {
    /// The runner is warm: the launcher is told, and the clocks start.
    Ready,
    /// A request to pass to the runner.
    Begin(Box<SessionOp>),
    /// The runner's reply to the request in flight (its bytes, unparsed).
    Reply(Vec<u8>),
    /// The session is over.
    End(SessionEnd),
}

/// A session's part of the relay.
#[derive(Debug)]
pub(crate) struct SessionRelay {
    /// Warm-up output and the ready marker, as for a warm jail.
    pub warm: WarmState,
    pub clocks: Clocks,
    /// The launcher's requests (the jailer's stdin), until it closes.
    requests: Option<File>,
    incoming: Frames,
    /// The runner's channel.
    runner: Option<File>,
    to_runner: Vec<u8>,
    /// The token of the request in flight, which its reply must bring.
    token: Token,
    replies: Frames,
    pub steps: VecDeque<SessionStep>,
    /// Why the session ended, once it has.
    pub end: Option<SessionEnd>,
    /// What the jail's cgroup had counted when the request in flight began.
    pub before: CgroupUsage,
    /// What the protocol broke on, for the jailer's stderr.
    pub broken: Option<String>,
}

fn nonblocking(fd: OwnedFd) -> File {
    let _ = fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    File::from(fd)
}

/// One non-blocking read: `None` if nothing is there yet, `Some(0)` at EOF
/// (or on an error, which ends the channel too).
fn read_some(f: &mut File, buf: &mut [u8]) -> Option<usize> {
    match f.read(buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
        Err(_) => Some(0),
        Ok(n) => Some(n),
    }
}

impl SessionRelay {
    /// `requests`: the jailer's stdin; `runner`: our end of the runner's
    /// stdin socket.
    pub fn new(spec: SessionSpec, requests: OwnedFd, runner: OwnedFd) -> SessionRelay {
        SessionRelay {
            warm: WarmState::new(),
            clocks: Clocks::new(spec),
            requests: Some(nonblocking(requests)),
            incoming: request_frames(),
            runner: Some(nonblocking(runner)),
            to_runner: Vec::new(),
            token: new_token(),
            replies: reply_frames(),
            steps: VecDeque::new(),
            end: None,
            before: CgroupUsage::default(),
            broken: None,
        }
    }

    /// Output before ready: kept aside; the marker makes the jail ready.
    pub fn warm_up_output(&mut self, stdout: bool, bytes: &[u8], now: Instant) {
        if self.warm.warm_up_output(stdout, bytes, now) {
            self.clocks.ready();
            self.steps.push_back(SessionStep::Ready);
        }
    }

    pub fn ended(&mut self, why: SessionEnd, detail: Option<String>) {
        if self.end.is_none() {
            self.end = Some(why);
            self.broken = detail;
            self.steps.push_back(SessionStep::End(why));
        }
        self.requests = None;
    }

    /// The launcher's channel, when a request may be read from it: the
    /// session is ready and nothing is in flight.
    pub fn requests_fd(&self) -> Option<BorrowedFd<'_>> {
        let accepting = self.clocks.is_ready() && !self.clocks.busy() && self.end.is_none();
        self.requests
            .as_ref()
            .filter(|_| accepting)
            .map(AsFd::as_fd)
    }

    /// The runner's channel, and whether a request waits to be written.
    pub fn runner_fd(&self) -> Option<(BorrowedFd<'_>, bool)> {
        let f = self.runner.as_ref().filter(|_| self.clocks.is_ready())?;
        Some((f.as_fd(), !self.to_runner.is_empty()))
    }

    /// Read the launcher's channel: at most one request is taken (the
    /// next waits in the socket until this one is answered).
    pub fn read_requests(&mut self) {
        let mut buf = vec![0u8; CHUNK];
        let Some(f) = self.requests.as_mut() else {
            return;
        };
        match read_some(f, &mut buf) {
            None => return,
            Some(0) => {
                let detail = self
                    .incoming
                    .partial()
                    .then(|| "the launcher closed the session inside a request".to_string());
                return self.ended(SessionEnd::Closed, detail);
            }
            Some(n) => self.incoming.push(&buf[..n]),
        }
        match self
            .incoming
            .next()
            .map_err(BadRequest::from)
            .and_then(|f| f.map(|b| decode_op(&b)).transpose())
        {
            Ok(None) => {}
            Ok(Some(op)) => {
                self.token = new_token();
                self.to_runner = op.runner_frame(&self.token);
                self.steps.push_back(SessionStep::Begin(Box::new(op)));
            }
            Err(e) => self.ended(SessionEnd::Protocol, Some(e.to_string())),
        }
    }

    /// Write what the runner will take of the request.
    pub fn write_runner(&mut self) {
        let Some(f) = self.runner.as_mut() else {
            return;
        };
        match f.write(&self.to_runner) {
            Ok(n) => {
                self.to_runner.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // The runner is gone: its jail ends, and the relay sees it.
            Err(_) => self.to_runner.clear(),
        }
    }

    /// Read the runner's channel: a whole reply is a step. A reply nobody
    /// asked for (a second one, one without the token of the request in
    /// flight), or one over the maximum, breaks the session.
    pub fn read_runner(&mut self) {
        let mut buf = vec![0u8; CHUNK];
        let Some(f) = self.runner.as_mut() else {
            return;
        };
        match read_some(f, &mut buf) {
            None => return,
            // The runner is gone (it exited or was killed): the jail ends.
            Some(0) => {
                self.runner = None;
                return;
            }
            Some(n) => self.replies.push(&buf[..n]),
        }
        // Every whole frame now: one left in the buffer would answer the
        // next request (and shift every later answer by one).
        let mut answered = false;
        loop {
            match self.replies.next() {
                Ok(None) => return,
                Ok(Some(body)) => {
                    let reply = reply_body(&body, &self.token);
                    let Some(reply) = reply.filter(|_| !answered && self.clocks.busy()) else {
                        let why = "the runner replied to no request (the code wrote a reply frame of its own)";
                        return self.ended(SessionEnd::Protocol, Some(why.into()));
                    };
                    answered = true;
                    self.steps.push_back(SessionStep::Reply(reply.to_vec()));
                }
                Err(e) => {
                    let why = format!("the runner's reply: {e}");
                    return self.ended(SessionEnd::Protocol, Some(why));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn frame(body: &str) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body.as_bytes());
        f
    }

    fn busy_relay() -> (SessionRelay, UnixStream, UnixStream) {
        let (requests, launcher) = UnixStream::pair().unwrap();
        let (runner, code) = UnixStream::pair().unwrap();
        let spec = SessionSpec {
            idle_timeout_ms: 10_000,
            lifetime_ms: 60_000,
            cell_grace_ms: 2_000,
        };
        let mut relay = SessionRelay::new(spec, requests.into(), runner.into());
        relay.clocks.ready();
        relay
            .clocks
            .begin(Instant::now(), std::time::Duration::from_secs(30));
        (relay, launcher, code)
    }

    fn replies(relay: &SessionRelay) -> usize {
        let reply = |s: &&SessionStep| matches!(s, SessionStep::Reply(_));
        relay.steps.iter().filter(reply).count()
    }

    fn reply(relay: &SessionRelay, body: &str) -> Vec<u8> {
        frame(&format!(
            "{}{body}",
            std::str::from_utf8(&relay.token).unwrap()
        ))
    }

    #[test]
    fn one_request_gets_one_reply_and_a_second_in_the_same_read_ends_the_session() {
        // A cell wrote a frame of its own with the token it found, and the
        // runner's real reply came right behind it, in one read: the second
        // must not wait in the buffer to answer the next request.
        let (mut relay, _launcher, mut code) = busy_relay();
        let mut both = reply(&relay, r#"{"value":"666"}"#);
        both.extend(reply(&relay, r#"{"value":"41"}"#));
        code.write_all(&both).unwrap();
        relay.read_runner();
        assert_eq!(replies(&relay), 1);
        assert_eq!(relay.end, Some(SessionEnd::Protocol), "{:?}", relay.broken);

        let (mut relay, _launcher, mut code) = busy_relay();
        code.write_all(&reply(&relay, r#"{"value":"41"}"#)).unwrap();
        relay.read_runner();
        assert_eq!((replies(&relay), relay.end), (1, None));
        match relay.steps.back() {
            Some(SessionStep::Reply(body)) => assert_eq!(body, br#"{"value":"41"}"#),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_without_the_requests_token_answers_nothing_and_ends_the_session() {
        // What the code wrote without the token, or the runner's late
        // reply to an earlier request, once the next one is in flight.
        let (mut relay, _launcher, mut code) = busy_relay();
        code.write_all(&frame(r#"{"value":"666"}"#)).unwrap();
        relay.read_runner();
        assert_eq!(replies(&relay), 0);
        assert_eq!(relay.end, Some(SessionEnd::Protocol), "{:?}", relay.broken);

        let (mut relay, _launcher, mut code) = busy_relay();
        let late = reply(&relay, r#"{"value":"20"}"#);
        relay.token = new_token();
        code.write_all(&late).unwrap();
        relay.read_runner();
        assert_eq!(
            (replies(&relay), relay.end),
            (0, Some(SessionEnd::Protocol))
        );
    }
}
