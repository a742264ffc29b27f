//! `[session]`: how long a session of this policy may live and idle, how
//! many a uid may hold, and how large a file it moves in or out; and
//! `[images]`: how large the images a run or cell sends back may be; and
//! `[output]`: how large its displays (display(), a cell's value) may be.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Diagnostic, FieldPath};
use crate::limits::between;
use crate::raw::{duration, size, Quantity, RawImages, RawOutput, RawSession};

/// The largest file a session moves in one request (the protocol's bound).
pub const MAX_FILE_CEILING: u64 = 8 << 20;

/// A policy's session settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSettings {
    /// A session with no request for this long is ended.
    pub idle_timeout: Duration,
    /// Every session is ended this long after it started.
    pub lifetime: Duration,
    /// Sessions one uid (or one `pycell mcp`) may hold at once.
    pub per_uid: u32,
    /// The largest file written or read in one request.
    pub max_file: u64,
    /// A session idle for `idle_timeout` is paused to a snapshot (its
    /// jail ended, its memory and admission freed) instead of ended, and
    /// its next call resumes it.
    #[serde(default)]
    pub pause_when_idle: bool,
}

/// A policy's `[images]`: figures a run or cell leaves open, and PNG or
/// JPEG files it writes, come back scaled to at most `max_edge` pixels a
/// side, at most `max_bytes` of PNG per result together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSettings {
    pub max_edge: u32,
    pub max_bytes: u64,
}

impl Default for ImageSettings {
    fn default() -> ImageSettings {
        ImageSettings {
            max_edge: 1024,
            max_bytes: 1 << 20,
        }
    }
}

/// A policy's `[output]`: what a run or cell shows through `display()`,
/// and a cell's last value, come back as displays (MIME bundles: text,
/// markdown, HTML, JSON, SVG, PNG), each text part at most `part_chars`
/// characters (its head and tail kept), all of one result's at most
/// `display_bytes` together, at most `displays` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSettings {
    pub part_chars: u32,
    pub display_bytes: u64,
    pub displays: u32,
}

impl Default for OutputSettings {
    fn default() -> OutputSettings {
        OutputSettings {
            part_chars: 16 << 10,
            display_bytes: 256 << 10,
            displays: 16,
        }
    }
}

impl Default for SessionSettings {
    fn default() -> SessionSettings {
        SessionSettings {
            idle_timeout: Duration::from_secs(600),
            lifetime: Duration::from_secs(3600),
            per_uid: 4,
            max_file: MAX_FILE_CEILING,
            pause_when_idle: false,
        }
    }
}

const IDLE_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(86_400));
const LIFETIME_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(7 * 86_400));
const PER_UID_RANGE: (i64, i64) = (0, 1024);
const IMAGE_EDGE_RANGE: (i64, i64) = (16, 8192);
// Their base64 must fit a reply (16 MiB) with room to spare.
const IMAGE_BYTES_RANGE: (u64, u64) = (0, 8 << 20);
// Room for a head, a tail and the line between them; at most 256 Ki
// characters, which JSON-escaped stay within 1.5 MiB of a reply.
const PART_CHARS_RANGE: (i64, i64) = (256, 256 << 10);
// With the images (at most 8 MiB, 10.7 MiB as base64) and a cell's value,
// within a reply (16 MiB).
const DISPLAY_BYTES_RANGE: (u64, u64) = (0, 2 << 20);
const DISPLAYS_RANGE: (i64, i64) = (0, 256);

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

pub(crate) fn within_duration(
    q: Quantity,
    range: (Duration, Duration),
    at: &FieldPath,
) -> Result<Duration, Diagnostic> {
    let d = duration(q).map_err(|e| Diagnostic::at(at.clone(), e))?;
    if d < range.0 || d > range.1 {
        return Err(Diagnostic::at(
            at.clone(),
            between((secs(range.0), secs(range.1)), secs(d)),
        ));
    }
    Ok(d)
}

pub(crate) fn within_int(n: i64, range: (i64, i64), at: &FieldPath) -> Result<u32, Diagnostic> {
    if n < range.0 || n > range.1 {
        return Err(Diagnostic::at(at.clone(), between(range, n)));
    }
    Ok(n as u32)
}

pub(crate) fn within_size(
    q: Quantity,
    range: (u64, u64),
    at: &FieldPath,
) -> Result<u64, Diagnostic> {
    let n = size(q).map_err(|e| Diagnostic::at(at.clone(), e))?;
    if n < range.0 || n > range.1 {
        return Err(Diagnostic::at(at.clone(), between(range, n)));
    }
    Ok(n)
}

/// `[session]`, each field left out taking its default.
pub(crate) fn check_session(
    raw: Option<RawSession>,
    path: &FieldPath,
) -> Result<SessionSettings, Diagnostic> {
    let raw = raw.unwrap_or_default();
    let mut s = SessionSettings::default();
    if let Some(q) = raw.idle_timeout {
        s.idle_timeout = within_duration(q, IDLE_RANGE, &path.key("idle_timeout"))?;
    }
    if let Some(q) = raw.lifetime {
        s.lifetime = within_duration(q, LIFETIME_RANGE, &path.key("lifetime"))?;
    }
    if s.idle_timeout > s.lifetime {
        return Err(Diagnostic::at(
            path.key("idle_timeout"),
            format!(
                "{} is longer than the lifetime ({}): a session never idles longer than it lives",
                secs(s.idle_timeout),
                secs(s.lifetime)
            ),
        ));
    }
    if let Some(n) = raw.per_uid {
        s.per_uid = within_int(n, PER_UID_RANGE, &path.key("per_uid"))?;
    }
    if let Some(q) = raw.max_file {
        s.max_file = within_size(q, (1, MAX_FILE_CEILING), &path.key("max_file"))?;
    }
    s.pause_when_idle = raw.pause_when_idle.unwrap_or(false);
    Ok(s)
}

/// `[images]`, each field left out taking its default.
pub(crate) fn check_images(
    raw: Option<RawImages>,
    path: &FieldPath,
) -> Result<ImageSettings, Diagnostic> {
    let raw = raw.unwrap_or_default();
    let mut s = ImageSettings::default();
    if let Some(n) = raw.max_edge {
        s.max_edge = within_int(n, IMAGE_EDGE_RANGE, &path.key("max_edge"))?;
    }
    if let Some(q) = raw.max_bytes {
        s.max_bytes = within_size(q, IMAGE_BYTES_RANGE, &path.key("max_bytes"))?;
    }
    Ok(s)
}

/// `[output]`, each field left out taking its default.
pub(crate) fn check_output(
    raw: Option<RawOutput>,
    path: &FieldPath,
) -> Result<OutputSettings, Diagnostic> {
    let raw = raw.unwrap_or_default();
    let mut s = OutputSettings::default();
    if let Some(n) = raw.part_chars {
        s.part_chars = within_int(n, PART_CHARS_RANGE, &path.key("part_chars"))?;
    }
    if let Some(q) = raw.display_bytes {
        s.display_bytes = within_size(q, DISPLAY_BYTES_RANGE, &path.key("display_bytes"))?;
    }
    if let Some(n) = raw.displays {
        s.displays = within_int(n, DISPLAYS_RANGE, &path.key("displays"))?;
    }
    Ok(s)
}
