//! `pycell policy check`.

use std::path::PathBuf;

use crate::say::say;
use pycell_policy::Policy;

pub fn check(files: &[PathBuf]) -> i32 {
    let mut failed = false;
    for f in files {
        match Policy::load(f) {
            Ok(p) => match pycell_seccomp::compile(&p.seccomp_profile) {
                Ok(_) => say!("{}: ok (policy {})", f.display(), p.name),
                Err(e) => {
                    failed = true;
                    eprintln!("{}: seccomp.profile: {e}", f.display());
                }
            },
            Err(e) => {
                failed = true;
                eprintln!("{e}");
            }
        }
    }
    i32::from(failed)
}
