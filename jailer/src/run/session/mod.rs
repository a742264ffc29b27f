//! A session's life in the relay: warming up, as a warm jail does, until
//! the runner's ready marker; then requests from the launcher, one at a
//! time, each passed to the runner on its own channel (a socket that is the
//! runner's stdin, never its stdout) and answered by a reply that goes out
//! as an event with what the jailer measured.
//!
//! The jailer keeps the session's clocks ([`Clocks`]), so that a session
//! never outlives its limits whatever its launcher does: a request over its
//! wall timeout gets SIGINT, and the session ends if it has not answered a
//! grace later; an idle session ends after its idle timeout; every session
//! ends at its lifetime. The runner's replies are untrusted bytes: they are
//! framed and bounded here ([`MAX_REPLY`]), never parsed.
//!
//! The pure parts (frames, clocks) are here; the relay does the I/O.

mod channel;

use std::time::{Duration, Instant};

use pycell_runner::session::{SessionOp, SessionOpError, MAX_REQUEST_FRAME};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::MAX_REPLY;
use pycell_wire::framing::{frame_len, FrameError};
use pycell_wire::report::{JailFailure, SessionEnd};
use pycell_wire::spec::SessionSpec;

pub(crate) use channel::{SessionRelay, SessionStep};

/// Whole frames (a 4-byte big-endian length, then the body) out of a byte
/// stream that may split them anywhere.
#[derive(Debug)]
pub(crate) struct Frames {
    buf: Vec<u8>,
    max: u64,
}

impl Frames {
    pub fn new(max: u64) -> Frames {
        Frames {
            buf: Vec::new(),
            max,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame's body, if one is in; `Err` if its length is
    /// over the maximum (checked before anything grows with it).
    pub fn next(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(head) = self.buf.get(..4) else {
            return Ok(None);
        };
        let head: [u8; 4] = head.try_into().expect("four bytes");
        let len = frame_len(head, self.max)?;
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(4 + len);
        let frame = std::mem::replace(&mut self.buf, rest);
        Ok(Some(frame[4..].to_vec()))
    }

    /// Bytes of a frame not yet whole.
    pub fn partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// A request from the launcher that cannot be taken: the session ends
/// (a protocol error, which our own launcher never makes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadRequest {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("a session request: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("a session request: {0}")]
    Invalid(#[from] SessionOpError),
}

/// A request from the launcher, decoded and checked.
pub(crate) fn decode_op(body: &[u8]) -> Result<SessionOp, BadRequest> {
    let op: SessionOp = serde_json::from_slice(body)?;
    op.validate()?;
    Ok(op)
}

/// Frames of requests from the launcher.
pub(crate) fn request_frames() -> Frames {
    Frames::new(MAX_REQUEST_FRAME)
}

/// Frames of replies from the runner.
pub(crate) fn reply_frames() -> Frames {
    Frames::new(u64::from(MAX_REPLY))
}

/// Why the jailer ended a session, as the report's error; `None` when its
/// launcher did.
pub(crate) fn end_failure(why: SessionEnd, clocks: &SessionSpec) -> Option<JailFailure> {
    let secs = |ms: u64| ms as f64 / 1000.0;
    let (message, hint) = match why {
        SessionEnd::Closed => return None,
        SessionEnd::Idle => (
            format!(
                "the session was idle for its idle timeout of {:.1}s and was ended",
                secs(clocks.idle_timeout_ms)
            ),
            "start a new session",
        ),
        SessionEnd::Lifetime => (
            format!(
                "the session reached its maximum lifetime of {:.1}s and was ended",
                secs(clocks.lifetime_ms)
            ),
            "start a new session",
        ),
        SessionEnd::CellTimeout => (
            format!(
                "a cell overran its timeout and had not stopped {:.1}s after KeyboardInterrupt; the session was killed",
                secs(clocks.cell_grace_ms)
            ),
            "start a new session; do not catch KeyboardInterrupt in long loops, or give the cell a longer timeout",
        ),
        SessionEnd::Protocol => {
            let m = "the session's channel broke (the jailer's log says how); the session was killed";
            return Some(
                JailFailure::new(FailureCode::JailerIo, Layer::Jailer, m)
                    .with_hint("start a new session"),
            );
        }
    };
    Some(JailFailure::new(FailureCode::Timeout, Layer::Limits, message).with_hint(hint))
}

/// What a session's clocks call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClockAction {
    /// The request in flight is over its wall timeout: SIGINT.
    Interrupt,
    /// The session is over.
    End(SessionEnd),
}

/// A request between its arrival at the runner and its reply.
#[derive(Debug, Clone, Copy, PartialEq)]
struct InFlight {
    since: Instant,
    wall: Duration,
    interrupted_at: Option<Instant>,
}

/// A session's clocks: none run while it warms up and waits for its first
/// request (a pooled session jail waits for its session; the spec's wall
/// timeout bounds that); from its first request on, its lifetime, and its
/// idle timeout between requests or a request's wall timeout and grace.
#[derive(Debug, Clone)]
pub(crate) struct Clocks {
    spec: SessionSpec,
    ready: bool,
    started_at: Option<Instant>,
    idle_since: Option<Instant>,
    request: Option<InFlight>,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Clocks {
    pub fn new(spec: SessionSpec) -> Clocks {
        Clocks {
            spec,
            ready: false,
            started_at: None,
            idle_since: None,
            request: None,
        }
    }

    pub fn ready(&mut self) {
        self.ready = true;
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// When the session's first request came (its clocks started).
    pub fn started_at(&self) -> Option<Instant> {
        self.started_at
    }

    pub fn busy(&self) -> bool {
        self.request.is_some()
    }

    /// A request reached the runner, with `wall` to answer.
    pub fn begin(&mut self, now: Instant, wall: Duration) {
        self.started_at.get_or_insert(now);
        self.request = Some(InFlight {
            since: now,
            wall,
            interrupted_at: None,
        });
        self.idle_since = None;
    }

    /// Its reply came: how long it took, and whether it was interrupted.
    pub fn end_request(&mut self, now: Instant) -> (Duration, bool) {
        self.idle_since = Some(now);
        match self.request.take() {
            Some(r) => (now - r.since, r.interrupted_at.is_some()),
            None => (Duration::ZERO, false),
        }
    }

    /// When the next action is due (`None`: no clock runs).
    pub fn next_due(&self) -> Option<Instant> {
        let end = self.started_at? + ms(self.spec.lifetime_ms);
        let next = match (self.request, self.idle_since) {
            (Some(r), _) => match r.interrupted_at {
                None => r.since + r.wall,
                Some(t) => t + ms(self.spec.cell_grace_ms),
            },
            (None, Some(idle)) => idle + ms(self.spec.idle_timeout_ms),
            (None, None) => end,
        };
        Some(next.min(end))
    }

    /// What is due at `now`, marking an interruption as done.
    pub fn due(&mut self, now: Instant) -> Option<ClockAction> {
        let started_at = self.started_at?;
        if now >= started_at + ms(self.spec.lifetime_ms) {
            return Some(ClockAction::End(SessionEnd::Lifetime));
        }
        let grace = ms(self.spec.cell_grace_ms);
        match (&mut self.request, self.idle_since) {
            (Some(r), _) => match r.interrupted_at {
                None if now >= r.since + r.wall => {
                    r.interrupted_at = Some(now);
                    Some(ClockAction::Interrupt)
                }
                Some(t) if now >= t + grace => Some(ClockAction::End(SessionEnd::CellTimeout)),
                _ => None,
            },
            (None, Some(idle)) if now >= idle + ms(self.spec.idle_timeout_ms) => {
                Some(ClockAction::End(SessionEnd::Idle))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_runner::session::{SessionRequest, MAX_FILE_BYTES};
    use pycell_wire::framing::encode_within;

    fn spec() -> SessionSpec {
        SessionSpec {
            idle_timeout_ms: 10_000,
            lifetime_ms: 60_000,
            cell_grace_ms: 2_000,
        }
    }

    #[test]
    fn frames_come_whole_however_the_bytes_are_split() {
        let mut f = Frames::new(100);
        let mut bytes = encode_within(&"first", 100).unwrap();
        bytes.extend(encode_within(&"second", 100).unwrap());
        f.push(&bytes[..3]);
        assert!(matches!(f.next(), Ok(None)));
        // "first" with its quotes is 7 bytes: 11 with the length.
        f.push(&bytes[3..13]);
        assert_eq!(f.next().unwrap().unwrap(), b"\"first\"");
        assert!(matches!(f.next(), Ok(None)));
        assert!(f.partial());
        f.push(&bytes[13..]);
        assert_eq!(f.next().unwrap().unwrap(), b"\"second\"");
        assert!(!f.partial());
        let mut f = Frames::new(8);
        f.push(&1000u32.to_be_bytes());
        assert!(f.next().is_err());
    }

    #[test]
    fn requests_are_checked_as_they_come() {
        let op = SessionOp {
            wall_timeout: Duration::from_secs(1),
            cpu_time: Duration::from_secs(1),
            max_output: pycell_wire::limits::Bytes(10),
            request: SessionRequest::Read {
                path: "x".into(),
                max_bytes: MAX_FILE_BYTES + 1,
            },
        };
        let body = serde_json::to_vec(&op).unwrap();
        assert!(decode_op(&body)
            .unwrap_err()
            .to_string()
            .contains("more than"));
        assert!(decode_op(b"{\"op\":\"cell\"}").is_err());
    }

    #[test]
    fn no_clock_runs_before_the_first_request() {
        let mut c = Clocks::new(spec());
        assert_eq!(c.next_due(), None);
        c.ready();
        assert_eq!(c.due(Instant::now() + ms(1_000_000)), None);
        assert_eq!(c.started_at(), None);
    }

    /// Ready, and its first (empty) request answered at `t0`: the clocks run.
    fn started(t0: Instant) -> Clocks {
        let mut c = Clocks::new(spec());
        c.ready();
        c.begin(t0, ms(1_000));
        c.end_request(t0);
        c
    }

    #[test]
    fn an_idle_session_ends_after_its_idle_timeout_and_every_one_at_its_lifetime() {
        let t0 = Instant::now();
        let mut c = started(t0);
        assert_eq!(c.next_due(), Some(t0 + ms(10_000)));
        assert_eq!(c.due(t0 + ms(9_999)), None);
        assert_eq!(
            c.due(t0 + ms(10_000)),
            Some(ClockAction::End(SessionEnd::Idle))
        );
        // Requests keep it alive, but not past its lifetime.
        let mut c = started(t0);
        for k in 0..10 {
            let at = t0 + ms(k * 6_000);
            assert_eq!(c.due(at), None, "{k}");
            c.begin(at, ms(1_000));
            c.end_request(at + ms(10));
        }
        assert_eq!(
            c.due(t0 + ms(60_000)),
            Some(ClockAction::End(SessionEnd::Lifetime))
        );
    }

    #[test]
    fn a_request_over_its_timeout_is_interrupted_then_ends_the_session_after_the_grace() {
        let t0 = Instant::now();
        let mut c = started(t0);
        c.begin(t0, ms(3_000));
        assert!(c.busy());
        // Idle time does not count while a request runs.
        assert_eq!(c.due(t0 + ms(2_999)), None);
        assert_eq!(c.next_due(), Some(t0 + ms(3_000)));
        assert_eq!(c.due(t0 + ms(3_000)), Some(ClockAction::Interrupt));
        assert_eq!(c.due(t0 + ms(3_001)), None, "interrupted once");
        assert_eq!(c.next_due(), Some(t0 + ms(5_000)));
        assert_eq!(
            c.due(t0 + ms(5_000)),
            Some(ClockAction::End(SessionEnd::CellTimeout))
        );
        // One that answers within the grace goes on, and says it was
        // interrupted.
        let mut c = started(t0);
        c.begin(t0, ms(3_000));
        c.due(t0 + ms(3_000));
        assert_eq!(c.end_request(t0 + ms(3_500)), (ms(3_500), true));
        assert!(!c.busy());
        assert_eq!(c.next_due(), Some(t0 + ms(13_500)));
    }
}
