//! `pycell-jailer`: reads one jail spec (a frame: length, then JSON) on stdin, runs it, and writes
//! event frames (output chunks, then the result) on stdout. Started by every
//! pycell mode (`pycell run`, `pycell mcp`, pycelld) through the launcher in
//! `pycell_launch::launcher`. Single-threaded on purpose: it clones the jail.
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(pycell_jailer::jailer_main());
}
