//! What the jail's first process and the jailer say to each other before
//! and while the program runs: the jailer's go bytes, and the jail's
//! messages on its status pipe.

use serde::{Deserialize, Serialize};

use pycell_wire::report::LandlockReport;

use crate::setup::pipeline::StepError;

/// Go-pipe bytes from the jailer: uid/gid maps written; cgroup attached.
pub(crate) const GO_MAPS: u8 = b'M';
pub(crate) const GO_CGROUP: u8 = b'C';

/// Messages from the jail to the jailer, one JSON object per line on the
/// status pipe (each well under PIPE_BUF, so lines never interleave).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ChildMessage {
    /// A jail forked from a zygote has moved itself into its cgroup: the
    /// jailer, which did not start it, learns its pid from there.
    Joined,
    Ready {
        /// None for a zygote, which applies no Landlock (its children
        /// could not mount otherwise) and never runs a program.
        landlock: Option<LandlockReport>,
        /// The kernel let the jail set `security.*` or `trusted.*`
        /// attributes, so the filter refuses every xattr write.
        #[serde(default)]
        xattr_writes_refused: bool,
        /// The jail's steps, when the spec asked for timings.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        timings: Vec<pycell_wire::timings::Mark>,
    },
    SetupFailed(StepError),
    ExecFailed {
        message: String,
    },
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
}
