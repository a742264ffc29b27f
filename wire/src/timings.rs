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
    fn the_clock_is_monotonic() {
        let a = now_us();
        let b = now_us();
        assert!(a > 0 && b >= a);
    }
}
