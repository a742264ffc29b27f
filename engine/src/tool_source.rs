//! Code mode's tools as the run service offers them: the client's own MCP
//! servers (`--tool-servers`), behind [`ToolSource`], so that the service
//! needs no MCP client of its own. The front end that started them
//! implements it; every backend offers their catalog to a run and answers
//! its calls: an embedded run's through the jail's channel (checked by
//! `pycell_tools::service`), a daemon run's as pycelld forwards them
//! (checked there) through [`DaemonToolCalls`].

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use pycell_protocol::client::{DaemonClient, Stage, ToolAnswerer};
use pycell_tools::catalog::Catalog;
use pycell_tools::service::{CallFuture, Upstream};

/// What bounds one call pycelld forwards: the policy's `call_timeout`
/// (counted once the server is up) and `max_result`, as pycelld sent them.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallLimits {
    pub timeout: Option<Duration>,
    pub max_result: Option<u64>,
}

/// The client's tool servers.
pub trait ToolSource: Upstream + std::fmt::Debug {
    /// Every server's tools (each started if it is not running); a server
    /// that cannot start is listed as unavailable, with why.
    fn catalog(&self) -> BoxFuture<'_, Catalog>;

    /// A call pycelld has checked, within the limits it sent.
    fn call_checked(
        &self,
        server: String,
        tool: String,
        arguments: Map<String, Value>,
        limits: CallLimits,
    ) -> CallFuture;

    /// Stop every server.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

/// Answers a daemon run's tool calls (pycelld checked them): each call
/// runs on `handle`, so that calls overlap, and its answer goes back on
/// the run's connection.
#[derive(Debug, Clone)]
pub struct DaemonToolCalls {
    servers: Arc<dyn ToolSource>,
    handle: tokio::runtime::Handle,
    answerer: Arc<std::sync::Mutex<Option<ToolAnswerer>>>,
}

impl DaemonToolCalls {
    pub fn new(servers: Arc<dyn ToolSource>, handle: tokio::runtime::Handle) -> DaemonToolCalls {
        DaemonToolCalls {
            servers,
            handle,
            answerer: Arc::default(),
        }
    }

    /// The run's (new) connection: answers go there.
    pub fn connected(&self, client: &DaemonClient) {
        if let Ok(mut a) = self.answerer.lock() {
            *a = client.answerer().ok();
        }
    }

    /// Take `stage` if it is a tool call (answered when the server is
    /// done; with no servers, never: pycelld sends none to a client that
    /// offered no tools).
    pub fn take(calls: Option<&DaemonToolCalls>, stage: Stage<'_>) {
        if let (
            Some(calls),
            Stage::ToolCall {
                call,
                server,
                tool,
                arguments,
                timeout,
                max_result,
            },
        ) = (calls, stage)
        {
            let limits = CallLimits {
                timeout,
                max_result,
            };
            calls.on_call(call, (server, tool), arguments, limits);
        }
    }

    /// A call from the run's code: answered when the server is done.
    fn on_call(
        &self,
        call: u64,
        (server, tool): (&str, &str),
        arguments: &Map<String, Value>,
        limits: CallLimits,
    ) {
        let this = self.clone();
        let (server, tool, arguments) = (server.to_string(), tool.to_string(), arguments.clone());
        self.handle.spawn(async move {
            let asked = this.servers.call_checked(server, tool, arguments, limits);
            let outcome = asked.await.into();
            if let Ok(mut a) = this.answerer.lock() {
                if let Some(a) = a.as_mut() {
                    let _ = a.answer(call, outcome);
                }
            }
        });
    }
}
