//! Where a run's start and end spend their time: marks, each a step's name
//! and when it ended on the host's monotonic clock, which every pycell
//! process on a host shares (a jail's own time namespace applies to its
//! program, never to its init or jailer). A launcher asks for them
//! (`JailSpec::timings`); the jailer and its jail mark their steps, the
//! launcher adds its own, and `pycell run --timings` prints them in order.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A step and when it ended, in microseconds of `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Mark {
    pub step: String,
    pub at_us: u64,
}

impl Mark {
    /// `step`, ended now.
    pub fn now(step: impl Into<String>) -> Mark {
        Mark {
            step: step.into(),
            at_us: now_us(),
        }
    }
}

/// A process's marks, kept only once asked for ([`Recorder::keep`]); a
/// `static` of the process (pycell's, the jailer's), whose steps mark
/// themselves as they end without passing it around.
#[derive(Debug)]
pub struct Recorder(std::sync::Mutex<Option<Vec<Mark>>>);

impl Recorder {
    pub const fn new() -> Recorder {
        Recorder(std::sync::Mutex::new(None))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Option<Vec<Mark>>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Start keeping marks, the first being `step` at `at_us`.
    pub fn keep(&self, step: &str, at_us: u64) {
        let first = Mark {
            step: step.to_string(),
            at_us,
        };
        self.with(|m| *m = Some(vec![first]))
    }

    /// Mark `step` as ended now, if marks are kept.
    pub fn mark(&self, step: &str) {
        self.with(|m| {
            if let Some(marks) = m {
                marks.push(Mark::now(step))
            }
        })
    }

    /// The marks so far (none if none are kept); later ones start afresh.
    pub fn take(&self) -> Vec<Mark> {
        self.with(|m| m.as_mut().map(std::mem::take).unwrap_or_default())
    }
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

/// Now, in microseconds of `CLOCK_MONOTONIC`.
pub fn now_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
}

/// The marks as a table, in time order: milliseconds since the first, and
/// since the one before (the step's own cost).
pub fn table(marks: &[Mark]) -> String {
    let mut sorted: Vec<&Mark> = marks.iter().collect();
    sorted.sort_by_key(|m| m.at_us);
    let Some(first) = sorted.first().map(|m| m.at_us) else {
        return String::new();
    };
    let mut out = format!("{:>9} {:>8}  step\n", "at ms", "+ms");
    let mut prev = first;
    for m in sorted {
        let at = (m.at_us - first) as f64 / 1000.0;
        let step = (m.at_us - prev) as f64 / 1000.0;
        out += &format!("{at:>9.2} {step:>8.2}  {}\n", m.step);
        prev = m.at_us;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(step: &str, at_us: u64) -> Mark {
        Mark {
            step: step.into(),
            at_us,
        }
    }

    #[test]
    fn the_table_orders_marks_by_time_and_gives_each_steps_cost() {
        let marks = [mark("b", 3_500), mark("a", 1_000), mark("c", 3_750)];
        let table = table(&marks);
        let rows: Vec<&str> = table.lines().skip(1).collect();
        assert_eq!(rows.len(), 3);
        assert!(
            rows[0].ends_with("  a") && rows[0].contains("0.00"),
            "{table}"
        );
        assert!(
            rows[1].contains("2.50") && rows[1].ends_with("  b"),
            "{table}"
        );
        assert!(
            rows[2].contains("2.75") && rows[2].contains("0.25"),
            "{table}"
        );
        assert_eq!(super::table(&[]), "");
    }

    #[test]
    fn marks_are_kept_only_once_asked_for_and_taken_afresh() {
        let r = Recorder::new();
        r.mark("before");
        assert!(r.take().is_empty());
        r.keep("start", 5);
        r.mark("step");
        let marks = r.take();
        assert_eq!(marks.len(), 2);
        assert_eq!(marks[0].at_us, 5);
        assert_eq!(marks[1].step, "step");
        assert!(marks[1].at_us > 5);
        r.mark("next");
        assert_eq!(r.take().len(), 1);
    }

    #[test]
    fn the_clock_is_monotonic() {
        let a = now_us();
        let b = now_us();
        assert!(a > 0 && b >= a);
    }
}
