//! A run's outcome as its jailer tells its starter, apart from the event
//! stream: one short line on a pipe of the starter's own (which comes
//! with the spec, [`crate::spec::SpecFd::Outcome`]), written when the run
//! ends. pycelld's monitor,
//! which starts jailers but never reads their event streams (the broker
//! does), reads it for the audit log's `run_end` line. Pure.

use crate::report::{JailReport, RunStatus};

/// The longest outcome line (a reader reads at most this much).
pub const MAX_OUTCOME_LINE: usize = 128;

/// How a run ended, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why a refused run was refused (its failure code).
    pub failure: Option<String>,
}

impl Outcome {
    pub fn of(report: &JailReport) -> Outcome {
        Outcome {
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            failure: report.error.as_ref().map(|e| e.code.as_str().to_string()),
        }
    }

    /// `STATUS EXIT_CODE SIGNAL FAILURE\n`, `-` for what is absent.
    pub fn to_line(&self) -> String {
        let num = |n: Option<i32>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
        format!(
            "{} {} {} {}\n",
            self.status.as_str(),
            num(self.exit_code),
            num(self.signal),
            self.failure.as_deref().unwrap_or("-")
        )
    }

    /// The outcome a line says, if it is one [`Outcome::to_line`] wrote.
    pub fn parse(line: &[u8]) -> Option<Outcome> {
        if line.len() > MAX_OUTCOME_LINE {
            return None;
        }
        let text = std::str::from_utf8(line).ok()?.strip_suffix('\n')?;
        let fields: Vec<&str> = text.split(' ').collect();
        let [status, exit_code, signal, failure] = fields[..] else {
            return None;
        };
        let num = |s: &str| match s {
            "-" => Some(None),
            s => s.parse::<i32>().ok().map(Some),
        };
        let failure_ok = failure
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'-');
        Some(Outcome {
            status: RunStatus::from_wire(status)?,
            exit_code: num(exit_code)?,
            signal: num(signal)?,
            failure: match failure {
                "-" => None,
                f if failure_ok && !f.is_empty() => Some(f.to_string()),
                _ => return None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::{FailureCode, Layer};
    use crate::report::JailFailure;

    #[test]
    fn outcome_lines_round_trip() {
        let mut report = JailReport::refused(JailFailure::new(
            FailureCode::DepsInvalid,
            Layer::Dependencies,
            "x",
        ));
        let refused = Outcome::of(&report);
        assert_eq!(refused.to_line(), "refused - - deps_invalid\n");
        assert_eq!(Outcome::parse(refused.to_line().as_bytes()), Some(refused));
        report.status = RunStatus::Error;
        report.error = None;
        report.exit_code = Some(-1);
        report.signal = Some(9);
        let error = Outcome::of(&report);
        assert_eq!(error.to_line(), "error -1 9 -\n");
        assert_eq!(Outcome::parse(error.to_line().as_bytes()), Some(error));
    }

    #[test]
    fn anything_else_is_no_outcome() {
        for bad in [
            &b""[..],
            b"ok 0 - -",
            b"ok 0 -\n",
            b"ok 0 - - x\n",
            b"fine 0 - -\n",
            b"ok zero - -\n",
            b"ok 0 - BAD\n",
            b"ok 99999999999 - -\n",
            b"ok 0 - -\nok 0 - -\n",
            &[b'x'; 200],
        ] {
            assert_eq!(
                Outcome::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
