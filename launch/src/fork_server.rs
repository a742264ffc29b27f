//! The monitor's end of `pycell-jailer --fork-server`
//! (`pycell_wire::fork_server`): started on first use, asked for one
//! jailer per run ([`ForkServer::fork`]), started again if it died. The
//! jailers it forks are its starter's children ([`ForkedJailer`]), reaped
//! by the starter as any other: pycelld's monitor, which is
//! single-threaded, reaps every child with `waitpid` and tells the server
//! when it was the one reaped ([`ForkServer::exited`]).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{socketpair, sockopt, AddressFamily, SockFlag, SockType};
use nix::sys::time::TimeVal;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use pycell_host::uidalloc::UidLease;
use pycell_wire::fork_server::{ForkJailer, Forked, ARG};

use crate::supervisor::JailerChild;

/// How long a fork may take before the server is held to be stuck (and
/// killed, and started again for the next run).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A fork server, once started.
#[derive(Debug, Default)]
pub struct ForkServer {
    running: Option<Running>,
}

#[derive(Debug)]
struct Running {
    requests: OwnedFd,
    pid: i32,
}

impl ForkServer {
    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.running.as_ref().map(|r| r.pid)
    }

    /// A child of ours was reaped: true if it was the server (the next
    /// fork starts another).
    pub fn exited(&mut self, pid: i32) -> bool {
        let was = self.pid() == Some(pid);
        if was {
            self.running = None;
        }
        was
    }

    /// Stop the server (it exits at the end of its requests); it is
    /// reaped like any child.
    pub fn stop(&mut self) {
        self.running = None;
    }

    /// A jailer of `jailer` (the server's own executable), `stdin` and
    /// `stdout` its own, forked by the server (started first if need be,
    /// and once more if it was gone before it took the request). Its pid,
    /// a child of ours.
    pub fn fork(
        &mut self,
        jailer: &Path,
        stdin: BorrowedFd<'_>,
        stdout: BorrowedFd<'_>,
        request: ForkJailer,
    ) -> io::Result<ForkedJailer> {
        let mut retried = false;
        loop {
            let running = match self.running.take() {
                Some(r) => r,
                None => start(jailer)?,
            };
            let sock = running.requests.as_fd();
            let sent =
                pycell_wire::fdpass::send_with_fds(sock, &request.encode(), &[stdin, stdout]);
            let taken = sent.is_ok();
            match sent.and_then(|()| answer(sock)) {
                Ok(Forked::Pid(pid)) => {
                    self.running = Some(running);
                    return Ok(ForkedJailer { pid });
                }
                Ok(Forked::Failed(errno)) => {
                    self.running = Some(running);
                    return Err(io::Error::from_raw_os_error(errno));
                }
                Err(e) => {
                    let _ = kill(Pid::from_raw(running.pid), Signal::SIGKILL);
                    // Only a request the server never took is asked
                    // again: one it took may have forked a jailer on
                    // these descriptors already.
                    if retried || taken || !gone(&e) {
                        return Err(e);
                    }
                    retried = true;
                }
            }
        }
    }
}

/// The server, on a socket pair of ours: our end is returned.
fn start(jailer: &Path) -> io::Result<Running> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let timeout = TimeVal::new(ANSWER_WITHIN.as_secs() as _, 0);
    nix::sys::socket::setsockopt(&ours, sockopt::ReceiveTimeout, &timeout)?;
    let child = Command::new(jailer)
        .arg(ARG)
        .env_clear()
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    // Reaped by our caller's reaper, like the jailers it forks.
    let pid = child.id() as i32;
    drop(child);
    Ok(Running {
        requests: ours,
        pid,
    })
}

/// The server's answer to the request just sent (an error: the server
/// is no use any more).
fn answer(sock: BorrowedFd<'_>) -> io::Result<Forked> {
    let mut buf = [0u8; 8];
    let (n, _) = loop {
        match pycell_wire::fdpass::recv_with_fds(sock, &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            got => break got?,
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the jailer fork server exited",
        ));
    }
    Forked::decode(&buf[..n]).map_err(io::Error::other)
}

/// Sending failed because the server was gone (worth one new server).
fn gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// A jailer forked by the server: a child of ours, reaped by our reaper.
#[derive(Debug)]
pub struct ForkedJailer {
    pid: i32,
}

impl ForkedJailer {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// SIGKILL it (it never took its whole spec) and reap it, so that
    /// the uid it was given is free only once it is gone (our caller is
    /// single-threaded: nobody else reaps it meanwhile).
    pub fn kill_and_reap(self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        let _ = waitpid(Pid::from_raw(self.pid), None);
    }
}

impl JailerChild for ForkedJailer {
    fn pid(&self) -> Option<u32> {
        Some(self.id())
    }

    fn reap_later(self, lease: Option<UidLease>) {
        std::thread::spawn(move || {
            let _ = waitpid(Pid::from_raw(self.pid), None);
            drop(lease);
        });
    }

    fn reaped_elsewhere(self) {}
}
