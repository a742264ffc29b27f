//! The build half: making the jail, from the checks before anything
//! exists to the sandboxed program's `exec`. What the host must have
//! ([`preflight`], [`xattr_check`]); who owns the jail's user namespace
//! ([`ns_owner`]); the rlimits the supervisor pins on the jail's first
//! process ([`rlimits`]); what that process does, in a fixed order
//! ([`pipeline`], [`child`]): namespace settings, the root file system
//! ([`mounts`], [`sources`], [`grants`]), capabilities, Landlock; and what
//! it and the jailer say to each other meanwhile ([`status`]). Nothing
//! here depends on the run half ([`crate::run`]).

pub(crate) mod capabilities;
pub(crate) mod child;
pub(crate) mod grants;
pub(crate) mod landlock_rules;
pub(crate) mod mounts;
pub(crate) mod ns_owner;
pub(crate) mod ns_settings;
pub(crate) mod pipeline;
pub(crate) mod preflight;
pub(crate) mod rlimits;
pub(crate) mod sources;
pub(crate) mod status;
pub(crate) mod xattr_check;
