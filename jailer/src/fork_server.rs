//! `pycell-jailer --fork-server`: a jailer that stays, for pycelld's
//! monitor, and forks each run's jailer on request instead of the monitor
//! executing `pycell-jailer` anew (`pycell_wire::fork_server`). The
//! child becomes exactly the jailer an exec would have started: its stdin
//! and stdout are the request's, it reads its spec (and the descriptors
//! that come with it) there, and runs [`crate::jailer_main`]. It is the
//! monitor's child (`CLONE_PARENT`), so the monitor reaps it and its
//! parent-death signal follows the monitor.
//!
//! The server holds nothing of any run: no spec, no descriptor past the
//! fork, no state between requests. It reads requests only on its stdin,
//! one end of a socket pair the monitor made (nobody else can reach it),
//! dies with the monitor (parent-death signal, or end of file), and is
//! single-threaded (the fork checks it). Nothing here may seed or keep
//! process-wide state before a fork (a `HashMap`'s random keys, a
//! generator): every jailer would start with a copy of it (session
//! tokens come from the kernel for this reason, `pycell_runner::session`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use pycell_syscall::{self as syscall, CloneResult};
use pycell_wire::fork_server::{ForkJailer, Forked, DESCRIPTORS, JAILER_NAME, NAME};

/// Serve requests on stdin until the monitor closes it. Returns the exit
/// code: 0 on end of file, 1 if the socket failed.
pub fn serve() -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    set_name(NAME);
    // Every jailer we fork is our parent's child: it checks it still is.
    let monitor = nix::unistd::getppid();
    let requests = io::stdin();
    let sock = requests.as_fd();
    let mut buf = [0u8; 16];
    loop {
        let (n, fds) = match pycell_wire::fdpass::recv_with_fds(sock, &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        if n == 0 && fds.is_empty() {
            return 0;
        }
        let answer = fork_one(&buf[..n], fds, monitor);
        loop {
            match pycell_wire::fdpass::send_with_fds(sock, &answer.encode(), &[]) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return 1,
            }
        }
    }
}

/// Fork the jailer `request` asks for (in the child: never returns).
fn fork_one(request: &[u8], fds: Vec<OwnedFd>, monitor: Pid) -> Forked {
    let Ok(request) = ForkJailer::decode(request) else {
        return Forked::Failed(libc::EINVAL);
    };
    let Ok::<[OwnedFd; DESCRIPTORS], _>([stdin, stdout]) = fds.try_into() else {
        return Forked::Failed(libc::EBADMSG);
    };
    match syscall::fork_as_sibling() {
        Ok(CloneResult::Child) => {
            std::process::exit(become_jailer(request, stdin, stdout, monitor))
        }
        Ok(CloneResult::Parent(pid)) => Forked::Pid(pid.as_raw()),
        Err(e) => Forked::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// In the forked child: the request's descriptors become stdin and
/// stdout (the server's socket, stdin until now, goes with it), then the
/// jailer runs as if executed, its parent-death signal set first and
/// checked: a monitor gone before it was set would never send it.
fn become_jailer(request: ForkJailer, stdin: OwnedFd, stdout: OwnedFd, monitor: Pid) -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    if nix::unistd::getppid() != monitor {
        return 127;
    }
    if nix::unistd::dup2_stdin(&stdin).is_err() || nix::unistd::dup2_stdout(&stdout).is_err() {
        return 127;
    }
    drop((stdin, stdout));
    set_name(JAILER_NAME);
    if request.new_process_group
        && nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))
            .is_err()
    {
        return 127;
    }
    crate::jailer_main()
}

/// Our process name (`comm`, what `ps` and `top` show).
fn set_name(name: &str) {
    if let Ok(name) = std::ffi::CString::new(name) {
        let _ = nix::sys::prctl::set_name(&name);
    }
}
