//! `pycell-jailer`: reads one jail spec (a frame: length, then JSON) on stdin, runs it, and writes
//! event frames (output chunks, then the result) on stdout. Started by every
//! pycell mode (`pycell run`, `pycell mcp`, pycelld) through the launcher in
//! `pycell_launch::launcher`; with `--fork-server`, forks such jailers on
//! request instead, for pycelld's monitor (`pycell_jailer::fork_server`). Single-threaded on purpose: it clones the jail.
#![forbid(unsafe_code)]

fn main() {
    let code = match std::env::args_os().nth(1) {
        Some(arg) if arg == pycell_wire::fork_server::ARG => pycell_jailer::fork_server::serve(),
        _ => pycell_jailer::jailer_main(),
    };
    std::process::exit(code);
}
