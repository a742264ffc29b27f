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
