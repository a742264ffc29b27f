//! Our own reports on stdout (`pycell info`, `pycell env list`, results as
//! JSON). `println!` panics when the reader has gone (`pycell info | head`);
//! [`say!`] ends the process quietly instead, with the status a shell shows
//! for a process that SIGPIPE ended. The program's own output, relayed while
//! it runs, goes through `run::show`, which ignores a closed pipe so that
//! the run goes on.

use std::io::{self, Write};

/// Exit status for "the reader of stdout went away": 128 + SIGPIPE.
const READER_GONE: i32 = 141;

/// `println!` for our reports: see the module's comment.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}
pub(crate) use say;

pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(READER_GONE),
        Err(e) => {
            eprintln!("pycell: cannot write to stdout: {e}");
            std::process::exit(1);
        }
    }
}
