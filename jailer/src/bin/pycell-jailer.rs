//! `pycell-jailer`: reads one JSON [`JailSpec`] on stdin, runs it, and writes
//! event frames (output chunks, then the result) on stdout. Single-threaded
//! on purpose: it forks. Exits 0 whenever a result frame was written.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};

use pycell_jailer::events;
use pycell_jailer::report::{JailFailure, JailReport};
use pycell_jailer::spec::JailSpec;
use pycell_jailer::supervisor::{self, FrameSink};

/// Specs carry the code; 64 MiB is far beyond any real one.
const MAX_SPEC: u64 = 64 << 20;

fn read_spec() -> Result<JailSpec, String> {
    let mut raw = Vec::new();
    let n = io::stdin()
        .take(MAX_SPEC + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("reading the spec from stdin: {e}"))?;
    if n as u64 > MAX_SPEC {
        return Err(format!("the spec is larger than {MAX_SPEC} bytes"));
    }
    serde_json::from_slice(&raw).map_err(|e| format!("parsing the spec: {e}"))
}

fn main() {
    // If whoever started us goes away, stop the sandbox and clean up: SIGTERM
    // is handled by the supervisor as "kill the sandbox".
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    let mut sink = FrameSink(io::BufWriter::with_capacity(
        128 * 1024,
        io::stdout().lock(),
    ));
    let (report, code) = match read_spec() {
        Ok(spec) => (supervisor::run(&spec, &mut sink), 0),
        Err(message) => (
            JailReport::refused(JailFailure {
                code: "invalid_spec".into(),
                layer: "jailer".into(),
                message,
                hint: None,
            }),
            2,
        ),
    };
    let _ = events::write_result(&mut sink.0, &report);
    let _ = sink.0.flush();
    std::process::exit(code);
}
