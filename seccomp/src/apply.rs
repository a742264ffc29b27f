//! Installing a compiled filter on the calling thread.

use crate::{CompiledFilter, SeccompError};

pub(crate) fn apply(filter: &CompiledFilter) -> Result<(), SeccompError> {
    // seccompiler sets no_new_privs itself before installing. pycell wants the
    // jailer's own no_new_privs step to have run already, so a pipeline that
    // skipped it fails here instead of being silently repaired.
    match nix::sys::prctl::get_no_new_privs() {
        Ok(true) => {}
        Ok(false) => return Err(SeccompError::NoNewPrivs),
        Err(source) => return Err(SeccompError::CheckNoNewPrivs { source }),
    }
    seccompiler::apply_filter(filter.program()).map_err(|source| match &source {
        // The kernel answers EACCES when neither no_new_privs nor
        // CAP_SYS_ADMIN is present; report it as the missing step.
        seccompiler::Error::Seccomp(error) if error.raw_os_error() == Some(libc::EACCES) => {
            SeccompError::NoNewPrivs
        }
        _ => SeccompError::Apply { source },
    })
}
