//! Which connections the HTTP front end keeps, and for how long.
//!
//! A connection is unauthenticated until one of its requests passes the
//! gate. Unauthenticated connections never take a slot an authenticated
//! caller needs: they have a pool of their own ([`MAX_UNAUTHENTICATED`]),
//! and when it is full the oldest of them is closed to make room, so idle
//! or half-sent connections from anyone cannot lock callers out; a
//! connection takes one of the [`MAX_AUTHENTICATED`] slots when its first
//! request passes the gate. Every connection must complete its first
//! request's head within [`FIRST_REQUEST_WITHIN`] and is closed once it
//! has had no request in flight and no bytes either way for
//! [`IDLE_WITHIN`] (hyper's header-read timeout bounds each later head).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Connections whose requests have passed the gate, at once.
pub const MAX_AUTHENTICATED: usize = 512;
/// Connections that have not (yet) proved a caller, at once.
pub const MAX_UNAUTHENTICATED: usize = 256;
/// How long a new connection has to send its first request's head.
pub const FIRST_REQUEST_WITHIN: Duration = Duration::from_secs(10);
/// How long a connection may sit with no request in flight and no bytes.
pub const IDLE_WITHIN: Duration = Duration::from_secs(60);
/// How often the watch looks.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// One connection's state, shared by its I/O, its requests and the pool.
#[derive(Debug)]
pub struct Activity {
    started: Instant,
    /// Milliseconds after `started` of the last byte read or written.
    last_io_ms: AtomicU64,
    requests: AtomicU64,
    in_flight: AtomicUsize,
    slot: Mutex<Option<OwnedSemaphorePermit>>,
    authenticated: AtomicBool,
    closed: AtomicBool,
    close: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            slot: Mutex::new(None),
            authenticated: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            close: Notify::new(),
        }
    }

    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_io_ms.store(ms, Ordering::Relaxed);
    }

    /// A request's head has arrived; the guard counts it in flight.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight(Arc::clone(self))
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// Close the connection (its serving task drops it).
    pub fn shut(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.close.notify_one();
    }

    /// Why the connection should close now, if it should.
    pub fn expired(&self, now: Instant) -> Option<&'static str> {
        let age = now.saturating_duration_since(self.started);
        if self.closed.load(Ordering::Relaxed) {
            return Some("closed");
        }
        if self.requests.load(Ordering::Relaxed) == 0 && age > FIRST_REQUEST_WITHIN {
            return Some("no request");
        }
        let last = Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed));
        let idle = age.saturating_sub(last);
        (self.in_flight.load(Ordering::Relaxed) == 0 && idle > IDLE_WITHIN).then_some("idle")
    }

    /// Resolves when the connection must close: told to, or expired.
    pub async fn until_expired(&self) {
        loop {
            if self.expired(Instant::now()).is_some() {
                return;
            }
            tokio::select! {
                _ = self.close.notified() => {}
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
        }
    }
}

/// A request in flight on its connection.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// The pools of connections.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    unauthenticated: Mutex<VecDeque<Weak<Activity>>>,
    max_unauthenticated: usize,
}

impl Admission {
    pub fn new(max_authenticated: usize, max_unauthenticated: usize) -> Arc<Admission> {
        Arc::new(Admission {
            slots: Arc::new(Semaphore::new(max_authenticated)),
            unauthenticated: Mutex::new(VecDeque::new()),
            max_unauthenticated,
        })
    }

    /// A new connection, unauthenticated; the oldest unauthenticated one
    /// is closed if the pool is full.
    pub fn admit(&self) -> Arc<Activity> {
        let new = Arc::new(Activity::new());
        let mut queue = self
            .unauthenticated
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        queue.retain(|w| w.upgrade().is_some_and(|a| !a.is_authenticated()));
        while queue.len() >= self.max_unauthenticated {
            if let Some(a) = queue.pop_front().and_then(|w| w.upgrade()) {
                a.shut();
            }
        }
        queue.push_back(Arc::downgrade(&new));
        new
    }

    /// A request of `conn` passed the gate: it takes an authenticated
    /// slot (once), or is refused when all are taken.
    pub fn authenticated(&self, conn: &Activity) -> bool {
        let mut slot = conn.slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return true;
        }
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                *slot = Some(permit);
                conn.authenticated.store(true, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }
}

/// A connection's stream, noting each byte's passing in its [`Activity`].
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_unauthenticated_pool_closes_its_oldest_never_an_authenticated_one() {
        let admission = Admission::new(1, 2);
        let a = admission.admit();
        assert!(admission.authenticated(&a));
        let b = admission.admit();
        let c = admission.admit();
        assert_eq!(a.expired(Instant::now()), None);
        let d = admission.admit();
        assert_eq!(b.expired(Instant::now()), Some("closed"));
        for kept in [&a, &c, &d] {
            assert_eq!(kept.expired(Instant::now()), None);
        }
        // The one authenticated slot is a's: c's first good request is
        // refused, and a's later ones need no other.
        assert!(!admission.authenticated(&c));
        assert!(admission.authenticated(&a));
        drop(a);
        assert!(admission.authenticated(&c));
    }

    #[test]
    fn a_connection_expires_without_a_first_request_or_when_idle() {
        let admission = Admission::new(4, 4);
        let conn = admission.admit();
        let start = conn.started;
        assert_eq!(conn.expired(start + FIRST_REQUEST_WITHIN / 2), None);
        let later = start + FIRST_REQUEST_WITHIN + Duration::from_secs(1);
        assert_eq!(conn.expired(later), Some("no request"));
        let req = conn.request();
        assert_eq!(conn.expired(start + IDLE_WITHIN * 3), None, "in flight");
        drop(req);
        let after = conn.started + Duration::from_millis(conn.last_io_ms.load(Ordering::Relaxed));
        assert_eq!(conn.expired(after + IDLE_WITHIN / 2), None);
        assert_eq!(conn.expired(after + IDLE_WITHIN * 2), Some("idle"));
    }
}
