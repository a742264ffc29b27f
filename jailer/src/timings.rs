//! The jailer's marks ([`pycell_wire::timings`]), kept only when the spec
//! asks for them. The jailer is single-threaded; its jail, a forked copy,
//! drops the copy of the jailer's marks it was born with, marks its own
//! steps and sends them with its `Ready` message.

use std::sync::Mutex;

use pycell_wire::timings::{now_us, Mark};

/// `None` until the spec asks for timings.
static MARKS: Mutex<Option<Vec<Mark>>> = Mutex::new(None);

fn with(f: impl FnOnce(&mut Option<Vec<Mark>>)) {
    f(&mut MARKS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Start keeping marks, the first being `step` at `at_us`.
pub(crate) fn keep(step: &str, at_us: u64) {
    with(|m| {
        *m = Some(vec![Mark {
            step: step.to_string(),
            at_us,
        }])
    })
}

/// Mark `step` as ended now, if marks are kept.
pub(crate) fn mark(step: &str) {
    with(|m| {
        if let Some(marks) = m {
            marks.push(Mark {
                step: step.to_string(),
                at_us: now_us(),
            })
        }
    })
}

/// The marks so far (none if none are kept); later ones start afresh.
pub(crate) fn take() -> Vec<Mark> {
    let mut taken = Vec::new();
    with(|m| {
        if let Some(marks) = m {
            taken = std::mem::take(marks)
        }
    });
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_kept_only_once_asked_for_and_taken_afresh() {
        mark("before");
        assert!(take().is_empty());
        keep("start", 5);
        mark("step");
        let marks = take();
        assert_eq!(marks.len(), 2);
        assert_eq!(marks[0].at_us, 5);
        assert_eq!(marks[1].step, "step");
        assert!(marks[1].at_us > 5);
        mark("next");
        assert_eq!(take().len(), 1);
    }
}
