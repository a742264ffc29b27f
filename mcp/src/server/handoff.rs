//! Calls that outlive their wait. To a client that declares MCP's tasks
//! extension (SEP-2663, `io.modelcontextprotocol/tasks`, the revision rmcp
//! implements), a `run_python` call still going after `--hand-off-after`
//! is answered with a task: the run goes on, `tasks/get` shows how it is
//! doing (its status message: time, output so far, the newest output) and
//! at the end its result, `tasks/cancel` stops it. Other clients wait for
//! the result as before (with progress notifications, and a session cell
//! detached past the wait: see `session_tools`).
//!
//! A task belongs to the caller that started it: over authenticated HTTP
//! another caller's `tasks/get` or `tasks/cancel` is told there is no such
//! task. A task holds the caller's place in its quotas until it ends, and
//! is kept (with its result) for its time-to-live: the run's own time
//! ceiling plus [`TASK_SLACK`], counted from its start, and as long again
//! after it ends.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData as McpError, RoleServer};
use tokio_util::sync::CancellationToken;

/// How long a call waits for its run before it becomes a task, unless
/// `--hand-off-after` says otherwise: well under the 60 s most clients
/// wait for a tool call.
pub const DEFAULT_HAND_OFF_AFTER: Duration = Duration::from_secs(20);

/// The wait of a cell's call that is never detached (one that may become
/// a task instead).
pub const NO_DETACH: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// What a task's time-to-live adds to its run's time ceiling: a wait in
/// pycelld's queue and an install of its dependencies.
pub const TASK_SLACK: Duration = Duration::from_secs(30 * 60);

/// How often a task's status message is brought up to date, and the poll
/// interval it suggests.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// The future of a call's result.
pub type Answer = Pin<Box<dyn Future<Output = CallToolResult> + Send>>;

/// A call's work, as the hand-off needs it.
pub struct Work {
    /// The call's result.
    pub answer: Answer,
    /// Stops the run (its result then says it was cancelled).
    pub stop: CancellationToken,
    /// Cancelled when the call becomes a task: progress notifications for
    /// the request stop (the request is over).
    pub handed_off: CancellationToken,
    /// The status message after the given time.
    pub status: Arc<dyn Fn(Duration) -> String + Send + Sync>,
    /// The run's time ceiling, asked only if the call becomes a task.
    pub ceiling: Pin<Box<dyn Future<Output = Duration> + Send>>,
    /// The caller's place in its quotas, held until the run ends.
    pub held: Option<Box<dyn Send>>,
}

/// The tasks of one server, and when a call becomes one.
#[derive(Clone)]
pub struct Handoff {
    tasks: TaskManager,
    /// Each task's caller (None: stdio, or HTTP without authentication).
    owners: Arc<Mutex<HashMap<String, Option<Arc<str>>>>>,
    after: Duration,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("after", &self.after)
            .finish()
    }
}

impl Default for Handoff {
    fn default() -> Self {
        Handoff::after(DEFAULT_HAND_OFF_AFTER)
    }
}

impl Handoff {
    /// Calls become tasks after `after`.
    pub fn after(after: Duration) -> Handoff {
        Handoff {
            tasks: TaskManager::new(),
            owners: Arc::default(),
            after,
        }
    }

    /// The wait before a call becomes a task (or a session cell detaches).
    pub fn wait(&self) -> Duration {
        self.after
    }

    /// The call's result if it comes within the wait, or always when the
    /// client takes no tasks; otherwise a task that carries it, owned by
    /// `owner`. The client's cancellation of the request stops the run.
    pub async fn answer(
        &self,
        work: Work,
        context: &RequestContext<RoleServer>,
        owner: Option<Arc<str>>,
    ) -> CallToolResponse {
        let takes_tasks = client_takes_tasks(context);
        let Work {
            mut answer,
            stop,
            handed_off,
            status,
            ceiling,
            held,
        } = work;
        let wait = async {
            match takes_tasks {
                true => tokio::time::sleep(self.after).await,
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut answer => return r.into(),
            () = context.ct.cancelled() => {
                stop.cancel();
                return answer.await.into();
            }
            () = wait => {}
        }
        handed_off.cancel();
        let started = Instant::now() - self.after;
        let ttl = ceiling.await.saturating_add(TASK_SLACK);
        let options = TaskOptions::new()
            .with_ttl_ms(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .with_poll_interval_ms(STATUS_EVERY.as_millis() as u64)
            .with_status_message(status(started.elapsed()));
        let follow = Followed {
            answer,
            stop,
            status,
            started,
            _held: held,
        };
        let task = self
            .tasks
            .spawn(options, move |ctx| Box::pin(follow.run(ctx)));
        self.own(&task.task_id, owner);
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// Record `id` as `owner`'s, forgetting tasks the manager has dropped.
    fn own(&self, id: &str, owner: Option<Arc<str>>) {
        let Ok(mut owners) = self.owners.lock() else {
            return;
        };
        owners.retain(|id, _| self.tasks.get_task(id).is_ok());
        owners.insert(id.to_string(), owner);
    }

    /// `tasks/get` for `caller`.
    pub fn get(&self, id: &str, caller: Option<Arc<str>>) -> Result<DetailedTask, McpError> {
        self.check_owner(id, caller)?;
        self.tasks.get_task(id)
    }

    /// `tasks/cancel` for `caller`.
    pub fn cancel(&self, id: &str, caller: Option<Arc<str>>) -> Result<(), McpError> {
        self.check_owner(id, caller)?;
        self.tasks.cancel_task(id)
    }

    fn check_owner(&self, id: &str, caller: Option<Arc<str>>) -> Result<(), McpError> {
        let owners = self
            .owners
            .lock()
            .map_err(|_| McpError::internal_error("the task table is unusable", None))?;
        match owners.get(id) {
            Some(owner) if *owner == caller => Ok(()),
            _ => Err(no_such_task(id)),
        }
    }
}

/// Whether the client declared the tasks extension (in its
/// initialization, or in this request's `_meta`).
pub fn client_takes_tasks(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|c| c.supports_tasks())
}

/// The answer to a task id that is not this caller's (or not at all).
pub fn no_such_task(id: &str) -> McpError {
    McpError::invalid_params(
        format!("no task {id:?}: it never was, it was another caller's, or it ended more than its ttlMs ago"),
        None,
    )
}

/// A call that became a task, followed to its end.
struct Followed {
    answer: Answer,
    stop: CancellationToken,
    status: Arc<dyn Fn(Duration) -> String + Send + Sync>,
    started: Instant,
    _held: Option<Box<dyn Send>>,
}

impl Followed {
    /// The result, the status message brought up to date meanwhile; a
    /// `tasks/cancel` stops the run and, once its sandbox is gone, settles
    /// the task as cancelled.
    async fn run(mut self, ctx: TaskContext) -> Result<CallToolResult, TaskExit> {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = &mut self.answer => return Ok(r),
                () = ctx.cancelled() => {
                    self.stop.cancel();
                    let _ = (&mut self.answer).await;
                    return Err(TaskExit::Cancelled);
                }
                _ = tick.tick() => ctx.set_status_message((self.status)(self.started.elapsed())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending_task(h: &Handoff, owner: Option<Arc<str>>) -> String {
        let task = h.tasks.spawn(TaskOptions::new(), |ctx| {
            Box::pin(async move {
                ctx.cancelled().await;
                Err(TaskExit::Cancelled)
            })
        });
        h.own(&task.task_id, owner);
        task.task_id
    }

    #[tokio::test]
    async fn a_task_is_seen_and_cancelled_only_by_its_caller() {
        let h = Handoff::default();
        let alice: Option<Arc<str>> = Some(Arc::from("alice"));
        let id = pending_task(&h, alice.clone());
        for stranger in [Some(Arc::from("bob")), None] {
            let e = h.get(&id, stranger.clone()).unwrap_err();
            assert!(e.message.contains("no task"), "{e:?}");
            assert!(h.cancel(&id, stranger).is_err());
        }
        assert!(h.get(&id, alice.clone()).is_ok());
        h.cancel(&id, alice.clone()).unwrap();
        for _ in 0..100 {
            if h.get(&id, alice.clone()).unwrap().task.status.is_terminal() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the cancelled task did not settle");
    }

    #[test]
    fn an_unknown_task_is_refused_as_invalid_params() {
        let e = Handoff::default().get("nope", None).unwrap_err();
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    }
}
