//! The monitor's loop: signals, the broker's messages and replies, warm
//! pools, reaping children, and the way out.

use super::*;

/// How long the monitor's one thread may spend on one message of the
/// broker's, reading it included: every other run waits meanwhile. Every
/// size is bounded before the broker sends anything, and each message's
/// work is linear in those bounds; a message over this is logged, and the
/// hostile-input tests look for that line.
pub(crate) const MESSAGE_BUDGET: Duration = Duration::from_millis(250);

/// Log a message whose handling took more than [`MESSAGE_BUDGET`].
fn over_budget(op: &str, took: Duration) {
    if took > MESSAGE_BUDGET {
        tracing::warn!(
            op,
            took_ms = took.as_millis() as u64,
            "over budget: a {op} message took {} ms (budget {} ms)",
            took.as_millis(),
            MESSAGE_BUDGET.as_millis()
        );
    }
}

impl Monitor {
    pub(super) fn serve(&mut self, sfd: &SignalFd) -> Result<(), MonitorError> {
        loop {
            if let Some(since) = self.stopping_since {
                // The zygotes go once the runs that may be forked from
                // them are done.
                if self.runs.is_empty() {
                    self.pools.stop_zygotes();
                }
                // The broker drains for the grace period; after that (and a
                // little slack) everything left is killed.
                let deadline = since + self.config.shutdown_grace + Duration::from_secs(2);
                let idle = self.runs.is_empty() && self.builds.is_empty() && self.pools.is_empty();
                if (!self.broker_alive && idle) || Instant::now() >= deadline {
                    // A stop for a broker that failed is a failure (so
                    // that systemd restarts the service).
                    return match self.failure.take() {
                        Some(why) => Err(MonitorError::Sys(why)),
                        None => Ok(()),
                    };
                }
            } else if !self.broker_alive {
                return Err(MonitorError::Sys("the broker exited; stopping".into()));
            }
            self.escalate_kills();
            self.ping_watchdog();
            self.tend_pools();
            let (sig_ready, link_ready) = self.wait(sfd)?;
            if sig_ready {
                while let Ok(Some(info)) = sfd.read_signal() {
                    let sig = info.ssi_signo as i32;
                    if sig == Signal::SIGCHLD as i32 {
                        self.reap();
                    } else if self.stopping_since.is_none() {
                        self.stopping_since = Some(Instant::now());
                        notify_systemd("STOPPING=1");
                        let _ = kill(self.broker_pid, Signal::SIGTERM);
                        // Idle members go now; a zygote once the runs
                        // are done (above): its death would kill those
                        // forked from it.
                        self.pools.stop_members();
                        for run in self.runs.values_mut() {
                            run.process.blame(StoppedBy::Shutdown);
                        }
                    }
                }
            }
            if link_ready {
                let began = Instant::now();
                let mut reader = pycell_wire::fdpass::FdReader::new(&self.link);
                let read = framing::read_sync::<ToMonitor>(&mut reader);
                let fds = reader.take();
                match read {
                    Ok(msg) => {
                        let op = msg.op();
                        self.handle(msg, fds);
                        over_budget(op, began.elapsed());
                    }
                    Err(e) if broker_went_away(&e) => {
                        self.broker_alive = false;
                        if self.stopping_since.is_none() {
                            self.stopping_since = Some(Instant::now());
                            self.failure = Some("the broker exited; stopping".into());
                        }
                        self.kill_all_runs();
                    }
                    Err(e) => self.broker_failed(&format!("bad message from the broker ({e})")),
                }
            }
        }
    }

    /// Wait (up to [`TICK`], or until a pool is due to refill) for a
    /// signal, the broker, or a warm jail's event; take the warm jails'
    /// events. Whether the signalfd and the link are readable.
    pub(super) fn wait(&mut self, sfd: &SignalFd) -> Result<(bool, bool), MonitorError> {
        let warming = self.pools.warming();
        let mut fds = vec![
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.link.as_fd(), PollFlags::POLLIN),
        ];
        fds.extend(
            warming
                .iter()
                .map(|(_, fd)| PollFd::new(*fd, PollFlags::POLLIN)),
        );
        let wait = self.pools.next_refill().map_or(TICK, |t| {
            t.saturating_duration_since(Instant::now()).min(TICK)
        });
        match poll(
            &mut fds,
            PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(MonitorError::Sys(format!("poll: {e}"))),
        }
        let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let (sig_ready, link_ready) = (ready(&fds[0]), ready(&fds[1]));
        let members: Vec<i32> = warming
            .iter()
            .zip(&fds[2..])
            .filter(|(_, f)| ready(f))
            .map(|((pid, _), _)| *pid)
            .collect();
        drop(fds);
        drop(warming);
        for pid in members {
            self.pools.event(pid);
        }
        Ok((sig_ready, link_ready))
    }

    /// Warm pools: retire idle members, start missing ones (not while
    /// stopping).
    pub(super) fn tend_pools(&mut self) {
        if self.stopping_since.is_some() {
            return;
        }
        self.pools.retire_idle();
        let store = self.envs.as_ref().ok().map(|(s, _)| s);
        let busy = !self.runs.is_empty();
        self.pools
            .refill(&self.launcher, &mut self.forks, store, busy);
        self.report_pools();
    }

    /// Tell the broker how the pools stand, if that changed.
    pub(super) fn report_pools(&mut self) {
        let now = self.pools.status();
        if now != self.pools_reported {
            self.send(&ToBroker::WarmPools { pools: now.clone() });
            self.pools_reported = now;
        }
    }

    /// A broker that sends what it must not, stalls inside a frame or
    /// stops taking ours is treated as compromised: stop everything.
    pub(super) fn broker_failed(&mut self, why: &str) {
        tracing::error!("{why}; stopping");
        self.failure.get_or_insert_with(|| why.to_string());
        let _ = kill(self.broker_pid, Signal::SIGKILL);
        self.broker_alive = false;
        self.stopping_since.get_or_insert_with(Instant::now);
        self.kill_all_runs();
    }

    pub(super) fn send(&mut self, msg: &ToBroker) {
        if let Err(e) = framing::write_sync(&mut self.link, msg) {
            // A broker that drains and exits as asked is not a failure.
            if self.broker_alive && self.stopping_since.is_none() {
                self.broker_failed(&format!("cannot write to the broker ({e})"));
            }
        }
    }

    /// Tell systemd we are well: our loop turns (we are here) and the
    /// broker's does (it said so lately).
    pub(super) fn ping_watchdog(&mut self) {
        let Some(w) = self.watchdog.as_mut() else {
            return;
        };
        let broker_ok = self.broker_seen.elapsed() < w.every * 2;
        if broker_ok && w.last.elapsed() >= w.every {
            w.last = Instant::now();
            notify_systemd("WATCHDOG=1");
        }
    }

    /// `fds` came with `msg`: a spawn's grants (any other's are closed).
    pub(super) fn handle(&mut self, msg: ToMonitor, fds: Vec<std::os::fd::OwnedFd>) {
        match msg {
            ToMonitor::Ready => {
                self.broker_seen = Instant::now();
                notify_systemd("READY=1");
            }
            ToMonitor::Alive => self.broker_seen = Instant::now(),
            ToMonitor::Kill { run_id } => {
                if let Some(run) = self.runs.values_mut().find(|r| r.run_id == run_id) {
                    run.process.stop(StoppedBy::Request);
                }
            }
            ToMonitor::Interrupt { run_id } => {
                if let Some(run) = self.runs.values().find(|r| r.run_id == run_id) {
                    // Not reaped (it is in `runs`): the pid is the jailer's,
                    // which passes SIGINT to its jail's program.
                    let pid = nix::unistd::Pid::from_raw(run.process.pid());
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
                }
            }
            ToMonitor::Abandon { req } => {
                if let Some(build) = self.builds.values_mut().find(|b| b.req == req) {
                    build.stop();
                }
            }
            ToMonitor::ToolCall { run_id, call } => {
                if run_id.len() <= 40 && run_id.starts_with("r-") {
                    self.audit.tool_call(&run_id, &call);
                }
            }
            ToMonitor::Egress { run_id, connection } => {
                // Any well-formed run id: the broker reports a connection
                // when it ends, which may be just after its run was reaped.
                if run_id.len() <= 40 && run_id.starts_with("r-") {
                    self.audit.egress(&run_id, &connection);
                }
            }
            ToMonitor::Spawn {
                req,
                peer,
                order,
                descriptors,
            } => {
                let fds = match super::runs::grant_sources(&order, descriptors, fds) {
                    Ok(fds) => fds,
                    Err(m) => {
                        let message = format!("the spawn request's descriptors: {m}");
                        self.send(&ToBroker::Refused {
                            req,
                            code: ErrorCode::InvalidRequest,
                            message,
                        });
                        return;
                    }
                };
                if self.stopping_since.is_some() {
                    self.send(&ToBroker::Refused {
                        req,
                        code: ErrorCode::ShuttingDown,
                        message: "pycelld is shutting down".into(),
                    });
                    return;
                }
                let reply = self.spawn(req, &peer, order, None, fds);
                self.reply(req, &peer, reply);
            }
        }
    }

    /// Send the answer to a spawn request, with its descriptors.
    pub(super) fn reply(&mut self, req: u64, peer: &PeerIds, reply: Reply) {
        let (msg, fds) = match reply {
            Ok(sent) => sent,
            Err(refusal) => (*refusal, Vec::new()),
        };
        let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let sent = framing::encode(&msg)
            .map_err(|e| e.to_string())
            .and_then(|frame| {
                crate::sockets::send_with_fds(self.link.as_fd(), &frame, &fds)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = sent {
            tracing::error!(
                peer_uid = peer.uid,
                "cannot answer request {req} to the broker: {e}"
            );
        }
    }

    pub(super) fn reap(&mut self) {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => {
                    let Some(pid) = status.pid() else { return };
                    if pid == self.broker_pid {
                        self.broker_alive = false;
                    } else if self.forks.exited(pid.as_raw()) {
                        tracing::debug!(
                            "the jailer fork server exited ({})",
                            describe_wait(&status)
                        );
                    } else if let Some(mut run) = self.runs.remove(&pid.as_raw()) {
                        run.process.reaped_elsewhere();
                        let outcome = read_outcome(&run.outcome);
                        tracing::debug!(
                            run_id = %run.run_id,
                            status = outcome.as_ref().map(|o| o.status.as_str()),
                            exit_code = outcome.as_ref().and_then(|o| o.exit_code),
                            "run ended"
                        );
                        self.audit.run_ended(&RunEnd {
                            run_id: &run.run_id,
                            wall: run.started.elapsed(),
                            outcome: outcome.as_ref(),
                            jailer: &describe_wait(&status),
                            stopped_by: run.process.stopped_by(),
                        });
                        // The lease goes (and the run's cgroups with it)
                        // before the broker hears the jailer is gone.
                        let run_id = std::mem::take(&mut run.run_id);
                        drop(run);
                        self.send(&ToBroker::Exited { run_id });
                    } else if let Some(build) = self.builds.remove(&pid.as_raw()) {
                        let how = describe_wait(&status);
                        self.built(build, &how);
                    } else {
                        self.pools.exited(pid.as_raw());
                    }
                }
            }
        }
    }

    pub(super) fn kill_all_runs(&mut self) {
        for run in self.runs.values_mut() {
            run.process.stop(StoppedBy::Shutdown);
        }
        for build in self.builds.values_mut() {
            build.stop();
        }
        self.pools.stop_all();
    }

    /// On the way out: every jailer gets SIGTERM (each kills its sandbox and
    /// removes its cgroup), then, after a bounded wait, SIGKILL.
    pub(super) fn kill_everything(&mut self) {
        if self.broker_alive {
            let _ = kill(self.broker_pid, Signal::SIGKILL);
        }
        self.forks.stop();
        self.kill_all_runs();
        let deadline = Instant::now() + Duration::from_secs(5);
        let idle = |m: &Self| m.runs.is_empty() && m.builds.is_empty() && m.pools.is_empty();
        while !idle(self) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            self.reap();
        }
        let members = self.pools.pids();
        let pids = self.runs.keys().chain(self.builds.keys()).chain(&members);
        for pid in pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let _ = waitpid(self.broker_pid, Some(WaitPidFlag::WNOHANG));
        self.layout
            .remove_stale(&self.launcher.cgroup_parent, "pycell-");
        self.layout.remove_created(&self.created_cgroups);
        // systemd's socket stays for the next instance (clients wait in
        // its backlog); our own goes with us.
        if let listen::Origin::Bound = self.origin {
            let _ = fs::remove_file(&self.config.socket);
        }
    }
}

/// The broker closed its end (exited, or was killed): a clean EOF, or a
/// reset when it left frames of ours unread.
pub(super) fn broker_went_away(e: &framing::FrameError) -> bool {
    match e {
        framing::FrameError::Closed => true,
        framing::FrameError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// A jailer's wait status for the audit log.
pub(super) fn describe_wait(status: &WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exited {code}"),
        WaitStatus::Signaled(_, sig, _) => format!("killed by {sig}"),
        other => format!("{other:?}"),
    }
}
