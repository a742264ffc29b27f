//! How the broker takes the monitor link it was started with: the monitor
//! starts the broker with its end of the monitor link as the broker's
//! stdin, and then sends the listening socket over that link, so no
//! descriptor is ever adopted by number. Descriptor passing itself is
//! [`pycell_wire::fdpass`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};

pub use pycell_wire::fdpass::{recv_with_fds, send_with_fds};

/// The broker's end of the monitor link: a copy of its stdin (close-on-
/// exec), after which stdin itself is pointed at /dev/null.
pub fn take_stdin_link() -> io::Result<OwnedFd> {
    let link = io::stdin().as_fd().try_clone_to_owned()?;
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    Ok(link)
}
