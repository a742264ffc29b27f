//! The jailer's marks ([`pycell_wire::timings`]), kept only when the spec
//! asks for them. The jailer is single-threaded; its jail, a forked copy,
//! drops the copy of the jailer's marks it was born with, marks its own
//! steps and sends them with its `Ready` message.

use pycell_wire::timings::{Mark, Recorder};

static MARKS: Recorder = Recorder::new();

/// Start keeping marks, the first being `step` at `at_us`.
pub(crate) fn keep(step: &str, at_us: u64) {
    MARKS.keep(step, at_us)
}

/// Mark `step` as ended now, if marks are kept.
pub(crate) fn mark(step: &str) {
    MARKS.mark(step)
}

/// The marks so far (none if none are kept); later ones start afresh.
pub(crate) fn take() -> Vec<Mark> {
    MARKS.take()
}
