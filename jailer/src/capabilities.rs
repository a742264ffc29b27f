//! Drop every capability: bounding, ambient, inheritable, effective and
//! permitted, then check that nothing is left.

use caps::CapSet;

/// Bounding first: dropping it needs CAP_SETPCAP, which goes with the rest.
const SETS: [CapSet; 5] = [
    CapSet::Bounding,
    CapSet::Ambient,
    CapSet::Inheritable,
    CapSet::Effective,
    CapSet::Permitted,
];

pub fn drop_all() -> Result<(), String> {
    for set in SETS {
        caps::clear(None, set).map_err(|e| format!("clearing the {set:?} set: {e}"))?;
    }
    for set in SETS {
        let left = caps::read(None, set).map_err(|e| format!("reading the {set:?} set: {e}"))?;
        if !left.is_empty() {
            return Err(format!(
                "{set:?} set still holds {left:?} after clearing it"
            ));
        }
    }
    Ok(())
}

/// A zygote's: CAP_SETUID and CAP_SETGID, effective and permitted, in
/// its own user namespace (to give each child its slot's ids); every
/// other capability and the rest of the bounding set gone.
pub fn keep_only_setid() -> Result<(), String> {
    use caps::Capability::{CAP_SETGID, CAP_SETUID};
    let kept: caps::CapsHashSet = [CAP_SETUID, CAP_SETGID].into_iter().collect();
    for cap in caps::runtime::thread_all_supported() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| format!("dropping {cap} from the bounding set: {e}"))?;
        }
    }
    for set in [CapSet::Ambient, CapSet::Inheritable] {
        caps::clear(None, set).map_err(|e| format!("clearing the {set:?} set: {e}"))?;
    }
    for set in [CapSet::Effective, CapSet::Permitted] {
        caps::set(None, set, &kept).map_err(|e| format!("setting the {set:?} set: {e}"))?;
    }
    for set in [CapSet::Bounding, CapSet::Effective, CapSet::Permitted] {
        let left = caps::read(None, set).map_err(|e| format!("reading the {set:?} set: {e}"))?;
        if left != kept {
            return Err(format!(
                "{set:?} set holds {left:?}, not just CAP_SETUID/CAP_SETGID"
            ));
        }
    }
    Ok(())
}
