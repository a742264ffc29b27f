//! Compiles every profile in `profiles/` to its final BPF program, for
//! x86_64 and aarch64, and writes them to OUT_DIR with a table the library
//! includes (`src/compile.rs`). A profile that breaks pycell's rules or that
//! seccompiler rejects fails the build here, with the same message the
//! library would give.
//!
//! The code is the library's own, included with `#[path]`, so the tests
//! exercise exactly what runs here.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

// Each module is shared with the library; build.rs uses only part of each.
#[allow(dead_code)]
#[path = "src/bpf.rs"]
mod bpf;
#[allow(dead_code)]
#[path = "src/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "src/generate.rs"]
mod generate;
#[allow(dead_code)]
#[path = "src/profile.rs"]
mod profile;
#[allow(dead_code)]
#[path = "src/tree.rs"]
mod tree;

use bpf::Arch;
use error::SeccompError;

fn main() -> ExitCode {
    for path in [
        "profiles",
        "src/bpf.rs",
        "src/error.rs",
        "src/generate.rs",
        "src/profile.rs",
        "src/tree.rs",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    let out_dir = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    match write_programs(Path::new(&out_dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn write_programs(out_dir: &Path) -> Result<(), String> {
    let mut table = String::from("const PROGRAMS: &[Programs] = &[\n");
    for (name, text) in profile::PROFILES {
        let _ = write!(table, "    Programs {{ profile: {name:?}");
        for arch in Arch::ALL {
            let program = generate::generate(name, text, arch)
                .map_err(|error: SeccompError| format!("profiles/{name}.json: {error}"))?;
            let file = format!("{name}.{}.bpf", arch.name());
            let path = out_dir.join(&file);
            std::fs::write(&path, bpf::encode(&program))
                .map_err(|error| format!("writing {}: {error}", path.display()))?;
            let _ = write!(
                table,
                ", {}: include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{file}\"))",
                arch.name()
            );
        }
        for arch in Arch::ALL {
            let names = generate::syscall_table(name, text, arch)
                .map_err(|error: SeccompError| format!("profiles/{name}.json: {error}"))?;
            let _ = write!(table, ", {}_names: &[", arch.name());
            for (nr, syscall) in names {
                let _ = write!(table, "({nr}, {syscall:?}), ");
            }
            table.push(']');
        }
        table.push_str(" },\n");
    }
    table.push_str("];\n");
    let path = out_dir.join("programs.rs");
    std::fs::write(&path, table).map_err(|error| format!("writing {}: {error}", path.display()))
}
