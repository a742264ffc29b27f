//! The pycell jail: everything between a resolved
//! [`JailSpec`](pycell_wire::spec::JailSpec) and the sandboxed program's
//! `exec`, run by the single-threaded `pycell-jailer` executable
//! ([`jailer_main`]).
//!
//! Threat model: the code that runs in the jail is hostile. It gets a new
//! user, pid, mount, network, IPC, UTS and cgroup namespace; runs as a host
//! uid that is neither root nor any account; sees a minimal read-only root;
//! has no capabilities, `no_new_privs`, Landlock and a seccomp allowlist; and
//! is held by cgroup limits. The jailer itself runs as root and trusts only
//! its spec (which it re-validates) and the host's kernel. It is
//! single-threaded so that `clone` without a new stack is sound (the clone
//! functions check it); its raw system calls are `pycell_syscall`'s, the
//! only crate with `unsafe`. Any
//! layer that cannot be applied refuses the run.
//!
//! Two halves, joined by [`supervisor`] (and by [`zygote`], for runs
//! forked from a warm one): [`setup`] makes the jail, [`run`] carries it
//! through its life and reports how it ended.
#![forbid(unsafe_code)]

pub mod fork_server;
mod run;
mod setup;
mod supervisor;
mod timings;
pub mod zygote;

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};

use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events;
use pycell_wire::named_fds::{Named, NamedFdsError};
use pycell_wire::outcome::Outcome;
use pycell_wire::report::{JailFailure, JailReport};
use pycell_wire::spec::{JailSpec, SpecFd};

/// The spec: one frame on stdin (see [`pycell_runner`]),
/// read unbuffered, so that a warm jail's work, which follows it on the
/// same stream, is still there for the supervisor; with the descriptors
/// that came with it, when stdin is a unix socket (a launcher's).
fn read_spec() -> Result<(JailSpec, Vec<OwnedFd>), SpecUnread> {
    let stdin = io::stdin().as_fd().try_clone_to_owned()?;
    let max = pycell_wire::spec::MAX_SPEC_FRAME;
    let is_socket =
        nix::sys::stat::fstat(&stdin).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK);
    if !is_socket {
        let mut file = std::fs::File::from(stdin);
        return Ok((
            pycell_wire::framing::read_sync_within(&mut file, max)?,
            Vec::new(),
        ));
    }
    let mut reader = pycell_wire::fdpass::FdReader::new(&stdin);
    let spec = pycell_wire::framing::read_sync_within(&mut reader, max)?;
    Ok((spec, reader.take()))
}

/// The descriptors that came with the spec, each where its name says
/// (`JailSpec::descriptors`).
#[derive(Debug, Default)]
pub(crate) struct Handed {
    pub outcome: Option<std::fs::File>,
    pub zygote: Option<OwnedFd>,
    pub grants: Vec<OwnedFd>,
}

impl Handed {
    fn take(spec: &JailSpec, fds: Vec<OwnedFd>) -> Result<Handed, NamedFdsError> {
        let mut named = Named::pair(spec.descriptors.clone(), fds)?;
        let handed = Handed {
            outcome: named.take(&SpecFd::Outcome).map(std::fs::File::from),
            zygote: named.take(&SpecFd::Zygote),
            grants: named.all(&SpecFd::Grant),
        };
        named.done()?;
        Ok(handed)
    }
}

/// Why there is no spec to run.
#[derive(Debug, thiserror::Error)]
enum SpecUnread {
    #[error("reading the spec from stdin: {0}")]
    Stdin(#[from] io::Error),
    #[error("reading the spec from stdin: {0}")]
    Frame(#[from] pycell_wire::framing::FrameError),
}

/// `pycell-jailer`: read one spec frame on stdin, run it, write event frames
/// (output chunks, then the result) on stdout. Returns the exit code: 0
/// whenever a result frame was written for a spec that parsed, 2 for a
/// spec that did not.
pub fn jailer_main() -> i32 {
    let started_us = pycell_wire::timings::now_us();
    // Whatever mask our starter had (pycell run blocks SIGINT so that ^C
    // reaches the program only through us), ours is exactly the signals the
    // supervisor takes through its signalfd, from the start: none of them
    // may end the jailer before it can clean up.
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&supervisor::jailer_signals()),
        None,
    );
    // If whoever started us goes away, stop the sandbox and clean up: SIGTERM
    // is handled by the supervisor as "kill the sandbox".
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    let mut out = io::BufWriter::with_capacity(128 * 1024, io::stdout().lock());
    let (handed, outcome, code) = match read_handed() {
        Ok((spec, mut handed)) => {
            if spec.timings {
                timings::keep("jailer: started", started_us);
                timings::mark("jailer: spec read");
            }
            let outcome = supervisor::run(&spec, &mut handed, &mut out);
            (handed, outcome, 0)
        }
        Err(message) => {
            let f = JailFailure::new(FailureCode::InvalidSpec, Layer::Jailer, message);
            let report = JailReport::refused(f);
            let _ = events::write_result(&mut out, &report);
            let _ = out.flush();
            (Handed::default(), Outcome::of(&report), 2)
        }
    };
    if let Some(mut pipe) = handed.outcome {
        let _ = pipe.write_all(outcome.to_line().as_bytes());
    }
    code
}

/// The spec and the descriptors that came with it, or why not.
fn read_handed() -> Result<(JailSpec, Handed), String> {
    let (spec, fds) = read_spec().map_err(|e| e.to_string())?;
    let handed = Handed::take(&spec, fds)
        .map_err(|e| format!("the descriptors that came with the spec: {e}"))?;
    Ok((spec, handed))
}
