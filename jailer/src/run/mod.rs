//! The run half: the jail once it is built, until nothing of it is
//! left. The relay's loop ([`relay`]) moves its output out as events
//! ([`outbox`]) and carries a warm jail's work ([`warm`]), a session's
//! requests ([`session`]), a run's images ([`run_images`]) and the end of
//! a stream past its cap ([`tail`]); once the
//! jail is gone, what it changed is listed ([`changed`]), what it left in
//! writable grants is swept ([`grant_sweep`]), and how it ended is decided
//! ([`outcome`]). It reads what the build half ([`crate::setup`]) made,
//! never the other way round.

pub(crate) mod changed;
pub(crate) mod grant_sweep;
pub(crate) mod outbox;
pub(crate) mod outcome;
pub(crate) mod relay;
pub(crate) mod rest_file;
pub(crate) mod run_images;
pub(crate) mod seccomp_watch;
pub(crate) mod session;
pub(crate) mod tail;
pub(crate) mod warm;
