//! `libpycell_zygote.so`: the three C functions a zygote's python (the
//! runner, through `ctypes.PyDLL`, which keeps the GIL) calls. They take
//! and return integers only; the request they pass between them stays in
//! Rust (`pycell_jailer::zygote`).
//!
//! Exporting an unmangled symbol is what the workspace's `unsafe_code`
//! lint flags here (a name clash would be undefined behaviour at link
//! time): each is allowed on its own, and the names are pycell's.

/// Wait for the next fork request on the zygote's channel `fd`: 1 one is
/// pending, 0 the channel ended, -1 a request was refused.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn pycell_zygote_receive(fd: i32) -> i32 {
    pycell_jailer::zygote::receive(fd)
}

/// In the zygote, after a request: clone the run's jail; 0 in the
/// zygote, 1 only in the run's program (every layer applied), -1 if it
/// failed (said on the run's status pipe).
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn pycell_zygote_fork() -> i32 {
    pycell_jailer::zygote::fork_run()
}
