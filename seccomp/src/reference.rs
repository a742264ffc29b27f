//! The reference program the tests hold the generated tree to: seccompiler's
//! compilation of each filter, chained into one linear program.
//!
//! The deny layers are laid out first, in name order, and each of their
//! `RET ALLOW` ("this layer does not deny the call") is rewritten into a
//! forward jump to the next layer; `main`, the allowlist, comes last and
//! decides everything the deny layers let through. This is how pycell ran
//! profiles before the decision tree, and it defines what a profile means.

use seccompiler::{sock_filter, BpfProgram};

use crate::bpf::{Arch, JA, RET_K};
use crate::generate::text_for_arch;
use crate::profile::Profile;
use crate::SeccompError;

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// seccompiler's programs for `text` on `arch`, chained. Not limited to
/// 4096 instructions: it is only ever interpreted, never installed.
pub(crate) fn reference(name: &str, text: &str, arch: Arch) -> Result<BpfProgram, SeccompError> {
    let profile = Profile::parse(name, text)?;
    let text = text_for_arch(name, text, arch)?;
    let mut programs =
        seccompiler::compile_from_json(text.as_bytes(), arch.target()).map_err(|source| {
            SeccompError::Compile {
                profile: name.to_owned(),
                arch: arch.name(),
                source,
            }
        })?;

    let mut program = BpfProgram::new();
    let layers = profile.layer_names();
    let last = layers.len() - 1;
    for (position, layer) in layers.into_iter().enumerate() {
        let code = programs
            .remove(layer)
            .expect("seccompiler compiles every filter of the profile");
        let start = program.len();
        let end = start + code.len();
        for (offset, instruction) in code.into_iter().enumerate() {
            let falls_through =
                position != last && instruction.code == RET_K && instruction.k == SECCOMP_RET_ALLOW;
            if falls_through {
                // Jump offsets count from the next instruction.
                let distance = end - (start + offset) - 1;
                program.push(sock_filter {
                    code: JA,
                    jt: 0,
                    jf: 0,
                    k: u32::try_from(distance).expect("a layer is short"),
                });
            } else {
                program.push(instruction);
            }
        }
    }
    Ok(program)
}
