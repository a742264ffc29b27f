//! `pycell-jailer`: reads one JSON [`JailSpec`] on stdin, runs it, and writes
//! event frames (output chunks, then the result) on stdout. Single-threaded
//! on purpose: it forks. Exits 0 whenever a result frame was written.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};

use pycell_jailer::events;
use pycell_jailer::report::{JailFailure, JailReport};
use pycell_jailer::spec::JailSpec;
use pycell_jailer::supervisor;

/// Specs carry the code; 64 MiB is far beyond any real one.
const MAX_SPEC: u64 = 64 << 20;

fn main() {
    // If whoever started us goes away, so do we (and, through the jail's own
    // parent-death signal, the whole sandbox).
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(128 * 1024, stdout.lock());
    let mut raw = Vec::new();
    let spec: Result<JailSpec, String> = io::stdin()
        .take(MAX_SPEC + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("reading the spec from stdin: {e}"))
        .and_then(|n| {
            if n as u64 > MAX_SPEC {
                Err(format!("the spec is larger than {MAX_SPEC} bytes"))
            } else {
                serde_json::from_slice(&raw).map_err(|e| format!("parsing the spec: {e}"))
            }
        });
    let code = match spec {
        Ok(spec) => {
            supervisor::run(&spec, &mut out);
            0
        }
        Err(message) => {
            let report = JailReport::refused(JailFailure {
                code: "invalid_spec".into(),
                layer: "jailer".into(),
                message,
                hint: None,
            });
            let _ = events::write_result(&mut out, &report);
            2
        }
    };
    let _ = out.flush();
    std::process::exit(code);
}
