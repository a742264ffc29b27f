//! Test helper: applies a seccomp profile to itself, then either runs a fixed
//! set of probes (printing the results as JSON) or execs a command under the
//! filter. It is not a sandbox (no namespaces, no Landlock); it only shows what
//! the filter allows and denies.
//!
//! ```text
//! pycell-seccomp-try [--profile NAME] [--skip-no-new-privs] probe
//! pycell-seccomp-try [--profile NAME] [--skip-no-new-privs] -- CMD [ARGS...]
//! ```
//!
//! Exit codes: 0 probes ran, 2 usage error, 3 the filter could not be
//! compiled or applied (message on stderr), 127 exec failed.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::personality::{self, Persona};
use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType};
use serde_json::{json, Map, Value};

/// A path that does not exist, so a mount or chroot that the filter failed to
/// stop errors out with ENOENT instead of changing the host.
const MISSING: &str = "/nonexistent-pycell-seccomp-probe";

const USAGE: &str =
    "usage: pycell-seccomp-try [--profile NAME] [--skip-no-new-privs] probe\n       \
                     pycell-seccomp-try [--profile NAME] [--skip-no-new-privs] -- CMD [ARGS...]";

enum Mode {
    Probe,
    Exec(Vec<String>),
}

struct Options {
    profile: String,
    skip_no_new_privs: bool,
    mode: Mode,
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut profile = pycell_seccomp::DEFAULT_PROFILE.to_owned();
    let mut skip_no_new_privs = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--profile" => profile = args.next().ok_or("--profile needs a value")?,
            "--skip-no-new-privs" => skip_no_new_privs = true,
            "probe" => {
                return Ok(Options {
                    profile,
                    skip_no_new_privs,
                    mode: Mode::Probe,
                })
            }
            "--" => {
                let command: Vec<String> = args.collect();
                if command.is_empty() {
                    return Err("-- must be followed by a command".into());
                }
                return Ok(Options {
                    profile,
                    skip_no_new_privs,
                    mode: Mode::Exec(command),
                });
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Err("missing mode: probe or -- CMD".into())
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("pycell-seccomp-try: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    let filter = match pycell_seccomp::compile(&options.profile) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("pycell-seccomp-try: {error}");
            return ExitCode::from(3);
        }
    };
    if !options.skip_no_new_privs {
        if let Err(error) = nix::sys::prctl::set_no_new_privs() {
            eprintln!("pycell-seccomp-try: prctl(PR_SET_NO_NEW_PRIVS): {error}");
            return ExitCode::from(3);
        }
    }
    if let Err(error) = pycell_seccomp::apply(&filter) {
        eprintln!("pycell-seccomp-try: {error}");
        return ExitCode::from(3);
    }

    match options.mode {
        Mode::Probe => {
            let report = json!({
                "profile": filter.profile(),
                "arch": filter.arch(),
                "instructions": filter.instruction_count(),
                "probes": probes(),
            });
            println!("{report}");
            ExitCode::SUCCESS
        }
        Mode::Exec(command) => {
            let error = Command::new(&command[0]).args(&command[1..]).exec();
            eprintln!("pycell-seccomp-try: exec {}: {error}", command[0]);
            ExitCode::from(127)
        }
    }
}

/// Runs every probe; each reports `{"ok": true}` or the errno it failed with.
fn probes() -> Map<String, Value> {
    let mut results = Map::new();
    let mut record = |name: &str, outcome: Result<(), Errno>| {
        let value = match outcome {
            Ok(()) => json!({ "ok": true }),
            Err(errno) => json!({ "ok": false, "errno": errno as i32, "error": errno.desc() }),
        };
        results.insert(name.to_owned(), value);
    };
    denied_probes(&mut record);
    allowed_probes(&mut record);
    results
}

type Record<'a> = dyn FnMut(&str, Result<(), Errno>) + 'a;

/// Calls the profiles must refuse.
fn denied_probes(record: &mut Record<'_>) {
    record(
        "unshare_newuser",
        nix::sched::unshare(CloneFlags::CLONE_NEWUSER),
    );
    record("unshare_fs", nix::sched::unshare(CloneFlags::CLONE_FS));
    record(
        "mount",
        nix::mount::mount(
            Some("none"),
            MISSING,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        ),
    );
    record(
        "umount2",
        nix::mount::umount2(MISSING, MntFlags::MNT_DETACH),
    );
    record("chroot", nix::unistd::chroot(MISSING));
    record("ptrace_traceme", nix::sys::ptrace::traceme());
    record(
        "personality_addr_no_randomize",
        personality::set(Persona::ADDR_NO_RANDOMIZE).map(drop),
    );
    record(
        "setns_net",
        File::open("/proc/self/ns/net")
            .map_err(io_errno)
            .and_then(|ns| nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)),
    );
    record(
        "socket_packet",
        socket(AddressFamily::Packet, SockType::Raw, None),
    );
    record(
        "socket_alg",
        socket(AddressFamily::Alg, SockType::SeqPacket, None),
    );
    record(
        "socket_vsock",
        socket(AddressFamily::Vsock, SockType::Stream, None),
    );
    record(
        "socket_netlink_audit",
        socket(
            AddressFamily::Netlink,
            SockType::Raw,
            Some(SockProtocol::NetlinkAudit),
        ),
    );
}

/// Calls real Python needs, which must keep working.
fn allowed_probes(record: &mut Record<'_>) {
    record("personality_query", personality::get().map(drop));
    record(
        "no_new_privs_set",
        nix::sys::prctl::get_no_new_privs()
            .and_then(|set| if set { Ok(()) } else { Err(Errno::EINVAL) }),
    );
    record("getpid", check(nix::unistd::getpid().as_raw() > 0));
    record("pipe", pipe_round_trip());
    record(
        "thread",
        std::thread::Builder::new()
            .spawn(|| 6 * 7)
            .map_err(io_errno)
            .and_then(|handle| check(handle.join().ok() == Some(42))),
    );
    record(
        "fork_exec_true",
        Command::new("/bin/true")
            .status()
            .map_err(io_errno)
            .and_then(|status| check(status.success())),
    );
    record("tcp_loopback", tcp_round_trip());
    record(
        "unix_socketpair",
        UnixStream::pair().map_err(io_errno).map(drop),
    );
    record(
        "socket_netlink_route",
        socket(
            AddressFamily::Netlink,
            SockType::Raw,
            Some(SockProtocol::NetlinkRoute),
        ),
    );
    record("tempfile", tempfile_round_trip());
}

fn io_errno(error: std::io::Error) -> Errno {
    error.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// Turns a failed sanity check into an error that cannot be mistaken for a
/// seccomp errno.
fn check(condition: bool) -> Result<(), Errno> {
    if condition {
        Ok(())
    } else {
        Err(Errno::EBADMSG)
    }
}

fn socket(
    family: AddressFamily,
    ty: SockType,
    protocol: Option<SockProtocol>,
) -> Result<(), Errno> {
    nix::sys::socket::socket(family, ty, SockFlag::SOCK_CLOEXEC, protocol).map(drop)
}

fn pipe_round_trip() -> Result<(), Errno> {
    let (reader, writer) = nix::unistd::pipe()?;
    let mut writer = File::from(writer);
    let mut reader = File::from(reader);
    writer.write_all(b"x").map_err(io_errno)?;
    let mut byte = [0u8; 1];
    reader.read_exact(&mut byte).map_err(io_errno)?;
    check(&byte == b"x")
}

fn tcp_round_trip() -> Result<(), Errno> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_errno)?;
    let address = listener.local_addr().map_err(io_errno)?;
    let mut client = TcpStream::connect(address).map_err(io_errno)?;
    let (mut server, _) = listener.accept().map_err(io_errno)?;
    client.write_all(b"ping").map_err(io_errno)?;
    let mut buffer = [0u8; 4];
    server.read_exact(&mut buffer).map_err(io_errno)?;
    check(&buffer == b"ping")
}

fn tempfile_round_trip() -> Result<(), Errno> {
    let path = std::env::temp_dir().join(format!("pycell-seccomp-try-{}", std::process::id()));
    std::fs::write(&path, b"data").map_err(io_errno)?;
    let read = std::fs::read(&path).map_err(io_errno);
    std::fs::remove_file(&path).map_err(io_errno)?;
    check(read? == b"data")
}
