//! Drop every capability: bounding, ambient, inheritable, effective and
//! permitted, then check that nothing is left.

use caps::errors::CapsError;
use caps::{CapSet, Capability, CapsHashSet};

/// A capability set that could not be brought to what the jail needs.
#[derive(Debug, thiserror::Error)]
pub enum CapabilitiesError {
    #[error("{doing} the {set:?} set: {error}")]
    Call {
        doing: &'static str,
        set: CapSet,
        error: CapsError,
    },
    #[error("dropping {cap} from the bounding set: {error}")]
    Bounding { cap: Capability, error: CapsError },
    #[error("{set:?} set still holds {left:?} after clearing it")]
    Left { set: CapSet, left: CapsHashSet },
    #[error("{set:?} set holds {left:?}, not just CAP_SETUID/CAP_SETGID")]
    NotJustSetid { set: CapSet, left: CapsHashSet },
}

/// `doing` on `set` failed with `error`.
fn call(doing: &'static str, set: CapSet) -> impl FnOnce(CapsError) -> CapabilitiesError {
    move |error| CapabilitiesError::Call { doing, set, error }
}

/// Bounding first: dropping it needs CAP_SETPCAP, which goes with the rest.
const SETS: [CapSet; 5] = [
    CapSet::Bounding,
    CapSet::Ambient,
    CapSet::Inheritable,
    CapSet::Effective,
    CapSet::Permitted,
];

pub fn drop_all() -> Result<(), CapabilitiesError> {
    for set in SETS {
        caps::clear(None, set).map_err(call("clearing", set))?;
    }
    for set in SETS {
        let left = caps::read(None, set).map_err(call("reading", set))?;
        if !left.is_empty() {
            return Err(CapabilitiesError::Left { set, left });
        }
    }
    Ok(())
}

/// A zygote's: CAP_SETUID and CAP_SETGID, effective and permitted, in
/// its own user namespace (to give each child its slot's ids); every
/// other capability and the rest of the bounding set gone.
pub fn keep_only_setid() -> Result<(), CapabilitiesError> {
    use caps::Capability::{CAP_SETGID, CAP_SETUID};
    let kept: CapsHashSet = [CAP_SETUID, CAP_SETGID].into_iter().collect();
    for cap in caps::runtime::thread_all_supported() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|error| CapabilitiesError::Bounding { cap, error })?;
        }
    }
    for set in [CapSet::Ambient, CapSet::Inheritable] {
        caps::clear(None, set).map_err(call("clearing", set))?;
    }
    for set in [CapSet::Effective, CapSet::Permitted] {
        caps::set(None, set, &kept).map_err(call("setting", set))?;
    }
    for set in [CapSet::Bounding, CapSet::Effective, CapSet::Permitted] {
        let left = caps::read(None, set).map_err(call("reading", set))?;
        if left != kept {
            return Err(CapabilitiesError::NotJustSetid { set, left });
        }
    }
    Ok(())
}
