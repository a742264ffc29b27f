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

mod run;
mod setup;
mod supervisor;
mod timings;
pub mod zygote;

use std::io::{self, Write};
use std::os::fd::AsFd;

use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events;
use pycell_wire::outcome::{Outcome, OUTCOME_FD, OUTCOME_FD_ENV};
use pycell_wire::report::{JailFailure, JailReport};
use pycell_wire::spec::JailSpec;

/// The spec: one frame on stdin (see [`pycell_runner`]),
/// read unbuffered, so that a warm jail's work, which follows it on the
/// same stream, is still there for the supervisor.
fn read_spec() -> Result<JailSpec, SpecUnread> {
    let mut stdin = io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)?;
    let max = pycell_wire::spec::MAX_SPEC_FRAME;
    Ok(pycell_wire::framing::read_sync_within(&mut stdin, max)?)
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
    let outcome_pipe = outcome_pipe();
    let mut out = io::BufWriter::with_capacity(128 * 1024, io::stdout().lock());
    let (outcome, code) = match read_spec() {
        Ok(spec) => {
            if spec.timings {
                timings::keep("jailer: started", started_us);
                timings::mark("jailer: spec read");
            }
            (supervisor::run(&spec, &mut out), 0)
        }
        Err(unread) => {
            let message = unread.to_string();
            let f = JailFailure::new(FailureCode::InvalidSpec, Layer::Jailer, message);
            let report = JailReport::refused(f);
            let _ = events::write_result(&mut out, &report);
            let _ = out.flush();
            (Outcome::of(&report), 2)
        }
    };
    if let Some(mut pipe) = outcome_pipe {
        let _ = pipe.write_all(outcome.to_line().as_bytes());
    }
    code
}

/// The pipe our starter reads our outcome line from, if it gave us one
/// (pycelld's monitor does, for its audit log).
fn outcome_pipe() -> Option<std::fs::File> {
    std::env::var_os(OUTCOME_FD_ENV)?;
    pycell_syscall::adopt_inherited_fd(OUTCOME_FD)
        .ok()
        .map(std::fs::File::from)
}
