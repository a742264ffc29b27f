//! Session cells that outlive their call's wait. A front end whose caller
//! gives up on a call after a while (an MCP client's request timeout)
//! runs a cell with a wait: a cell not answered by then goes on, detached,
//! within its session's limits, and the session's next call gets its
//! answer instead of running code of its own. Nothing is killed and re-run
//! because a client stopped waiting.
//!
//! At most one cell per session is detached (a session runs one cell at a
//! time); it is its caller's: the key is the caller's identity and the
//! handle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use pycell_protocol::session::SessionAnswer;

use super::SessionFailure;

/// A cell's answer, or why there is none.
pub type CellAnswer = Result<SessionAnswer, SessionFailure>;

/// What a call with a wait got.
#[derive(Debug)]
pub enum CellTurn {
    /// The call's own cell answered.
    Answered(CellAnswer),
    /// The call's own cell is still running after the wait; detached.
    Detached { running_for: Duration },
    /// A cell detached earlier answered; the call's code was not run.
    Collected {
        answer: CellAnswer,
        ran_for: Duration,
    },
    /// A cell detached earlier is still running; the call's code was not run.
    StillRunning { running_for: Duration },
}

/// A detached cell.
#[derive(Debug)]
struct Detached {
    answer: JoinHandle<CellAnswer>,
    started: Instant,
    /// Interrupts it (the session's end does too).
    stop: CancellationToken,
}

/// The detached cells of one service.
#[derive(Debug, Default)]
pub struct DetachedCells {
    cells: Mutex<HashMap<Key, Detached>>,
}

/// A detached cell's caller (None: this process's own user) and session.
pub type Key = (Option<Arc<str>>, String);

impl DetachedCells {
    fn take(&self, key: &Key) -> Option<Detached> {
        self.cells.lock().ok()?.remove(key)
    }

    fn put(&self, key: Key, cell: Detached) {
        if let Ok(mut cells) = self.cells.lock() {
            cells.insert(key, cell);
        }
    }

    /// Interrupt and forget the detached cell of `key` (its session ends).
    pub fn drop_cell(&self, key: &Key) {
        if let Some(cell) = self.take(key) {
            cell.stop.cancel();
        }
    }

    /// Interrupt every detached cell (the service shuts down).
    pub fn stop_all(&self) {
        if let Ok(cells) = self.cells.lock() {
            cells.values().for_each(|c| c.stop.cancel());
        }
    }

    /// The earlier detached cell of `key`, waited for at most `wait` (or
    /// until `cancel`): `None` if there is none.
    pub async fn collect(
        &self,
        key: &Key,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> Option<CellTurn> {
        let mut cell = self.take(key)?;
        let waited = tokio::select! {
            r = tokio::time::timeout(wait, &mut cell.answer) => r.ok(),
            () = cancel.cancelled() => None,
        };
        match waited {
            Some(joined) => Some(CellTurn::Collected {
                answer: joined.unwrap_or_else(|e| Err(lost(&e))),
                ran_for: cell.started.elapsed(),
            }),
            None => {
                let running_for = cell.started.elapsed();
                self.put(key.clone(), cell);
                Some(CellTurn::StillRunning { running_for })
            }
        }
    }

    /// Run `cell` (given its own stop token), waiting at most `wait` for
    /// its answer; the call's `cancel` interrupts it while the call waits.
    pub async fn run(
        &self,
        key: Key,
        cell: impl FnOnce(CancellationToken) -> JoinHandle<CellAnswer>,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> CellTurn {
        let stop = CancellationToken::new();
        let started = Instant::now();
        let mut answer = cell(stop.clone());
        let waited = tokio::select! {
            r = tokio::time::timeout(wait, &mut answer) => r.ok(),
            () = cancel.cancelled() => {
                stop.cancel();
                Some((&mut answer).await)
            }
        };
        match waited {
            Some(joined) => CellTurn::Answered(joined.unwrap_or_else(|e| Err(lost(&e)))),
            None => {
                let running_for = started.elapsed();
                let detached = Detached {
                    answer,
                    started,
                    stop,
                };
                self.put(key, detached);
                CellTurn::Detached { running_for }
            }
        }
    }
}

/// A cell whose task ended without an answer (it panicked).
fn lost(e: &tokio::task::JoinError) -> SessionFailure {
    SessionFailure::new(
        pycell_wire::codes::FailureCode::Internal,
        format!("the detached cell's call ended without an answer: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> CellAnswer {
        Err(SessionFailure::new(
            pycell_wire::codes::FailureCode::SessionGone,
            "test answer",
        ))
    }

    fn key() -> Key {
        (Some(Arc::from("alice")), "s-1".to_string())
    }

    #[tokio::test]
    async fn a_quick_cell_answers_and_leaves_nothing_detached() {
        let cells = DetachedCells::default();
        let never = CancellationToken::new();
        let turn = cells
            .run(
                key(),
                |_| tokio::spawn(async { answer() }),
                Duration::from_secs(30),
                &never,
            )
            .await;
        assert!(matches!(turn, CellTurn::Answered(Err(_))), "{turn:?}");
        assert!(cells
            .collect(&key(), Duration::ZERO, &never)
            .await
            .is_none());
    }

    #[tokio::test]
    async fn a_slow_cell_detaches_and_the_next_call_collects_it_once() {
        let cells = DetachedCells::default();
        let never = CancellationToken::new();
        let (go, wait_for_go) = tokio::sync::oneshot::channel::<()>();
        let turn = cells
            .run(
                key(),
                move |_| {
                    tokio::spawn(async move {
                        let _ = wait_for_go.await;
                        answer()
                    })
                },
                Duration::from_millis(10),
                &never,
            )
            .await;
        assert!(matches!(turn, CellTurn::Detached { .. }), "{turn:?}");
        // Another caller's key finds nothing.
        let other = (Some(Arc::from("bob")), "s-1".to_string());
        assert!(cells
            .collect(&other, Duration::ZERO, &never)
            .await
            .is_none());
        let turn = cells
            .collect(&key(), Duration::from_millis(10), &never)
            .await;
        assert!(
            matches!(turn, Some(CellTurn::StillRunning { .. })),
            "{turn:?}"
        );
        go.send(()).unwrap();
        let turn = cells.collect(&key(), Duration::from_secs(30), &never).await;
        assert!(
            matches!(turn, Some(CellTurn::Collected { answer: Err(_), .. })),
            "{turn:?}"
        );
        assert!(cells
            .collect(&key(), Duration::ZERO, &never)
            .await
            .is_none());
    }

    #[tokio::test]
    async fn cancelling_the_call_before_it_detaches_interrupts_the_cell() {
        let cells = DetachedCells::default();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let turn = cells
            .run(
                key(),
                |stop| {
                    tokio::spawn(async move {
                        stop.cancelled().await;
                        Err(SessionFailure::new(
                            pycell_wire::codes::FailureCode::Internal,
                            "interrupted",
                        ))
                    })
                },
                Duration::from_secs(30),
                &cancel,
            )
            .await;
        assert!(
            matches!(&turn, CellTurn::Answered(Err(f)) if f.message == "interrupted"),
            "{turn:?}"
        );
    }

    #[tokio::test]
    async fn ending_the_session_interrupts_its_detached_cell() {
        let cells = DetachedCells::default();
        let never = CancellationToken::new();
        let (seen, saw_stop) = tokio::sync::oneshot::channel::<()>();
        cells
            .run(
                key(),
                move |stop| {
                    tokio::spawn(async move {
                        stop.cancelled().await;
                        let _ = seen.send(());
                        answer()
                    })
                },
                Duration::from_millis(10),
                &never,
            )
            .await;
        cells.drop_cell(&key());
        saw_stop.await.unwrap();
        assert!(cells
            .collect(&key(), Duration::ZERO, &never)
            .await
            .is_none());
    }
}
