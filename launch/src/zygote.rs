//! Zygotes, from the launcher's side: a warm jail whose python, once its
//! modules are imported, forks one jail per run instead of running work
//! itself (`pycell_jailer::zygote`). A run from a zygote pays for no
//! python start, no imports and no jail cloned from the jailer; it still
//! gets its own jailer, namespaces, uid, cgroup, mounts, Landlock and
//! seccomp, through the same pipeline.
//!
//! ```text
//! Launcher::start_zygote ─> Zygote (its jailer, its channel, its slots)
//! Launcher::prepare_from_zygote ─> Prepared (a warm run with a free slot's
//!                                  uid, the channel for its jailer) + Work
//! ```
//!
//! A zygote's user namespace maps one host uid per slot, held for the
//! zygote's life ([`SlotLease`]); a run borrows one and gives it back when
//! its lease is dropped, after its cgroups are gone. Only runs that are
//! exactly the zygote's warm jail take this path ([`pycell_runner::fits`]):
//! no dependencies' env, no egress, no tools, no session.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pycell_host::uidalloc::{self, SlotLease};
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunLimits;
use pycell_runner::Work;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Event;
use pycell_wire::handout::{self, Handout};
use pycell_wire::report::JailFailure;
use pycell_wire::spec::{new_run_id, FromZygote, JailSpec, SlotIds};

use crate::launcher::{JailerStderr, LaunchError, Launched, Launcher, Prepared};
use crate::resolve;
use crate::stopper::Stopper;
use crate::supervisor::PATIENCE;

/// The shared library a zygote's python calls, beside the jailer.
pub const ZYGOTE_LIB: &str = "libpycell_zygote.so";

/// What a zygote is made of, starting or ready.
#[derive(Debug)]
struct Parts {
    policy: String,
    /// The warm jail its runs are (ids, run id and slot set per run).
    runs: JailSpec,
    /// The limits of the policy's runs (a run's own are its request's).
    limits: RunLimits,
    /// Its env (the policy's dependencies'), which its runs have too.
    extras: resolve::Extras,
    slots: Vec<Arc<SlotLease>>,
    jailer: Launched,
    /// Its jailer's stop (when asked; killed after the grace). Told it
    /// was reaped (by the daemon's monitor, or here), it signals nothing:
    /// the pid may be another process's now.
    stopper: Stopper,
}

/// A zygote whose python is still starting: read its events
/// ([`StartingZygote::events`]) until [`StartingZygote::step`] says it
/// is ready.
#[derive(Debug)]
pub struct StartingZygote {
    parts: Parts,
}

/// What a starting zygote's event said.
#[derive(Debug)]
pub enum ZygoteStep {
    /// Not ready yet (its jail's progress).
    Starting(StartingZygote),
    Ready(Zygote),
}

/// A zygote that is ready: dropping it stops it (its jailer kills its
/// jail, and with it every run still in the zygote's pid namespace).
#[derive(Debug)]
pub struct Zygote {
    parts: Parts,
    channel: OwnedFd,
}

impl Launcher {
    /// Start a zygote for `policy`'s runs that bring no dependencies of
    /// their own (`env`: the env of the policy's, if it has any), importing
    /// its `[warm] imports`, with `slots` runs at once at most, and wait
    /// until it is ready. Blocks (the zygote's python start and imports).
    pub fn start_zygote(
        &self,
        policy: &Policy,
        env: Option<PathBuf>,
        slots: usize,
    ) -> Result<Zygote, LaunchError> {
        let mut starting = self.spawn_zygote(policy, env, slots)?;
        loop {
            match starting.step() {
                Ok(ZygoteStep::Starting(s)) => starting = s,
                Ok(ZygoteStep::Ready(zygote)) => return Ok(zygote),
                Err((mut failed, e)) => {
                    let _ = failed.parts.jailer.child.kill();
                    let _ = failed.parts.jailer.child.wait();
                    return Err(e);
                }
            }
        }
    }

    /// [`Launcher::start_zygote`] without waiting: the zygote's jailer is
    /// started, its python not ready yet.
    pub fn spawn_zygote(
        &self,
        policy: &Policy,
        env: Option<PathBuf>,
        slots: usize,
    ) -> Result<StartingZygote, LaunchError> {
        let extras = resolve::Extras {
            env,
            ..resolve::Extras::default()
        };
        let mut prepared = self.prepare_warm(policy, &extras, &policy.warm_imports)?;
        let runs = prepared.spec().clone();
        check_fits_a_zygote(&runs)?;
        let lib = zygote_lib(prepared.jailer_path())?;
        let slots = self.lease_slots(slots)?;
        let ids = slots
            .iter()
            .map(|s| SlotIds {
                uid: s.uid,
                gid: s.gid,
            })
            .collect();
        let spec = pycell_runner::zygote_spec(&runs, &lib, ids);
        prepared.set_spec(spec).map_err(LaunchError::Refused)?;
        let limits = prepared.limits.clone();
        let jailer = prepared
            .spawn(JailerStderr::Inherit)
            .map_err(|r| LaunchError::Refused(refusal(&r)))?;
        Ok(StartingZygote {
            parts: Parts {
                policy: policy.name.clone(),
                runs,
                limits,
                extras,
                slots,
                stopper: Stopper::new(jailer.child.id(), None, PATIENCE.grace),
                jailer,
            },
        })
    }

    fn lease_slots(&self, n: usize) -> Result<Vec<Arc<SlotLease>>, LaunchError> {
        let n = n.clamp(1, pycell_wire::spec::MAX_ZYGOTE_SLOTS);
        (0..n)
            .map(|_| {
                let lease =
                    uidalloc::allocate(&self.uid_range, &self.uid_lock_dir).map_err(|e| {
                        LaunchError::Refused(JailFailure::new(
                            FailureCode::UidUnavailable,
                            Layer::Uid,
                            e.to_string(),
                        ))
                    })?;
                Ok(SlotLease::hold(lease).expect("a fresh lease is its lock's"))
            })
            .collect()
    }

    /// `request` under `policy` as a run forked from `zygote`: `None` if
    /// it is not exactly the zygote's warm jail (another policy, input
    /// files, other limits, ...) or every slot is taken; else the prepared run
    /// (a free slot's uid; start it, then send it the work at once: its
    /// jailer takes it when the jail is ready).
    pub fn prepare_from_zygote(
        &self,
        zygote: &Zygote,
        policy: &Policy,
        request: &RunRequest,
    ) -> Result<Option<(Prepared, Work)>, LaunchError> {
        if policy.name != zygote.parts.policy {
            return Ok(None);
        }
        // The caller has checked that the request adds no dependencies:
        // its env is the zygote's.
        let resolved = resolve::resolve_with(policy, request, &zygote.parts.extras)?;
        let cold = &resolved.spec;
        let (true, Some(work)) = (
            pycell_runner::fits(&zygote.parts.runs, cold),
            pycell_runner::work_for(cold),
        ) else {
            return Ok(None);
        };
        let limits = resolved.limits.clone();
        let prepared = self.fork_prepared(zygote, limits)?;
        Ok(prepared.map(|p| (p, work)))
    }

    /// A warm jail forked from `zygote`, waiting for any run that fits
    /// the zygote (a pool's member; [`pycell_runner::fits`] it as a warm
    /// jail of the policy); `None` while every slot is taken.
    pub fn prepare_member_from_zygote(
        &self,
        zygote: &Zygote,
    ) -> Result<Option<Prepared>, LaunchError> {
        self.fork_prepared(zygote, zygote.parts.limits.clone())
    }

    /// The zygote's warm jail with a free slot's uid, its own run id and
    /// cgroup, for a jailer that forks it from the zygote.
    fn fork_prepared(
        &self,
        zygote: &Zygote,
        limits: RunLimits,
    ) -> Result<Option<Prepared>, LaunchError> {
        let Some((slot, mut lease)) = zygote.lend_slot() else {
            return Ok(None);
        };
        lease.release_after_cgroups(&self.cgroup_parent);
        let mut spec = pycell_runner::forked_spec(&zygote.parts.runs, slot);
        spec.run_id = new_run_id();
        spec.sandbox_uid = lease.uid;
        spec.sandbox_gid = lease.gid;
        spec.cgroup.parent = self.cgroup_parent.clone();
        spec.cgroup.keep = self.keep_cgroups;
        let channel = zygote.channel.try_clone().map_err(|e| {
            LaunchError::Refused(JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                format!("the zygote's channel: {e}"),
            ))
        })?;
        let jailer = self.jailer.clone().map_err(LaunchError::Refused)?;
        let prepared = Prepared::new(
            spec,
            &zygote.parts.policy,
            limits,
            lease,
            jailer,
            Some(channel),
        )
        .map_err(LaunchError::Refused)?;
        Ok(Some(prepared))
    }
}

impl StartingZygote {
    /// Its jailer's event stream: readable when [`StartingZygote::step`]
    /// has something to read.
    pub fn events(&self) -> BorrowedFd<'_> {
        self.parts.jailer.events.as_fd()
    }

    pub fn jailer_pid(&self) -> u32 {
        self.parts.jailer.child.id()
    }

    /// Read its next event (blocking until one comes): ready (its channel
    /// taken from its jailer), or not yet. On failure, the zygote is
    /// returned with the error, for its caller to stop and reap.
    pub fn step(mut self) -> Result<ZygoteStep, (Box<StartingZygote>, LaunchError)> {
        let jailer = &mut self.parts.jailer;
        let ready = match pycell_wire::events::read_event(&mut jailer.events) {
            Ok(Some(Event::Ready)) => take_channel(jailer),
            Ok(Some(Event::Result(r))) => {
                let why = r.error.map(|e| e.message).unwrap_or_default();
                Err(io::Error::other(format!(
                    "the zygote ended before it was ready: {why}"
                )))
            }
            Ok(Some(_)) => return Ok(ZygoteStep::Starting(self)),
            Ok(None) => Err(io::Error::other(
                "the zygote's jailer ended before it was ready",
            )),
            Err(e) => Err(io::Error::other(e.to_string())),
        };
        match ready {
            Ok(channel) => Ok(ZygoteStep::Ready(Zygote {
                parts: self.parts,
                channel,
            })),
            Err(e) => Err((Box::new(self), LaunchError::Refused(not_ready(e)))),
        }
    }

    /// Its jailer's stop: SIGTERM kills the jail; its owner escalates
    /// until it reaps it.
    pub fn stopper(&mut self) -> &mut Stopper {
        &mut self.parts.stopper
    }

    /// Its jailer was reaped by the caller: forget it without a signal.
    pub fn forget_reaped(mut self) {
        self.parts.stopper.reaped();
    }
}

impl Zygote {
    /// A free slot and its uid, lent to one run.
    fn lend_slot(&self) -> Option<(u32, uidalloc::UidLease)> {
        self.parts
            .slots
            .iter()
            .enumerate()
            .find_map(|(i, s)| s.lend().map(|l| (i as u32, l)))
    }

    /// The pid of the zygote's jailer.
    pub fn jailer_pid(&self) -> u32 {
        self.parts.jailer.child.id()
    }

    /// Whether the zygote is still there to fork runs: its python holds
    /// its end of the channel, and its jailer has not ended (reaped here
    /// if it has).
    pub fn is_alive(&mut self) -> bool {
        if self.parts.stopper.is_reaped() {
            return false;
        }
        let running = matches!(self.parts.jailer.child.try_wait(), Ok(None));
        if !running {
            self.parts.stopper.reaped();
        }
        self.channel_open() && running
    }

    /// Whether its python still holds its end of the channel (for a
    /// caller that reaps the jailer itself).
    pub fn channel_open(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.channel.as_fd(), PollFlags::POLLOUT)];
        let hung_up = poll(&mut fds, PollTimeout::ZERO).is_ok()
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        !hung_up
    }

    /// Its jailer's stop: SIGTERM kills the jail and every run forked
    /// from it; its owner escalates until it reaps it.
    pub fn stopper(&mut self) -> &mut Stopper {
        &mut self.parts.stopper
    }

    /// Its jailer was reaped by the caller: forget it without a signal.
    pub fn forget_reaped(mut self) {
        self.parts.stopper.reaped();
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        self.stop_and_reap();
    }
}

impl Zygote {
    /// SIGTERM: the jailer kills the zygote's jail and removes its cgroup;
    /// SIGKILL if it is still there after the grace; reaped here. Nothing
    /// for a jailer already reaped (here or by the caller). Blocks until
    /// it is reaped; a zygote stopped serves no run.
    pub fn stop_and_reap(&mut self) {
        let parts = &mut self.parts;
        if parts.stopper.is_reaped() {
            return;
        }
        parts.stopper.stop();
        while let Ok(None) = parts.jailer.child.try_wait() {
            parts.stopper.escalate();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        parts.stopper.reaped();
    }
}

/// What a zygote's runs cannot have.
fn check_fits_a_zygote(runs: &JailSpec) -> Result<(), LaunchError> {
    let mut probe = runs.clone();
    probe.from_zygote = Some(FromZygote {
        slot: 0,
        zygote_uid: runs.sandbox_uid,
    });
    probe.descriptors = vec![pycell_wire::spec::SpecFd::Zygote];
    probe.validate().map_err(|e| {
        LaunchError::Refused(
            JailFailure::new(
                FailureCode::InvalidPolicy,
                Layer::Policy,
                format!("this policy's runs cannot come from a zygote: {e}"),
            )
            .with_hint("zygotes serve policies without network egress or tools"),
        )
    })
}

/// `libpycell_zygote.so` beside `jailer`.
fn zygote_lib(jailer: &Path) -> Result<PathBuf, LaunchError> {
    let lib = jailer.with_file_name(ZYGOTE_LIB);
    match lib.is_file() {
        true => Ok(lib),
        false => Err(LaunchError::Refused(
            JailFailure::new(
                FailureCode::JailerUnavailable,
                Layer::Jailer,
                format!("{} is missing (it comes with pycell-jailer)", lib.display()),
            )
            .with_hint("reinstall pycell, or build the workspace (cargo build)"),
        )),
    }
}

/// The zygote's channel: its jailer handed it out during the jail's
/// setup, before the zygote's python said it is ready.
fn take_channel(jailer: &Launched) -> io::Result<OwnedFd> {
    let handouts = jailer
        .handouts
        .as_ref()
        .ok_or_else(|| io::Error::other("the zygote's jailer hands nothing out"))?;
    match handout::recv(handouts.as_fd())? {
        Some((Handout::ZygoteChannel, fd)) => Ok(fd),
        other => {
            let what = other.map(|(h, _)| format!("{h:?}"));
            Err(io::Error::other(format!(
                "the zygote handed out {what:?}, not its channel"
            )))
        }
    }
}

fn not_ready(e: io::Error) -> JailFailure {
    JailFailure::new(
        FailureCode::JailSetupFailed,
        Layer::Jailer,
        format!("starting a zygote: {e}"),
    )
}

fn refusal(r: &pycell_protocol::result::RunResult) -> JailFailure {
    r.error.clone().unwrap_or_else(|| {
        JailFailure::new(
            FailureCode::Internal,
            Layer::Jailer,
            "the zygote did not start",
        )
    })
}
