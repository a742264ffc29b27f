//! What comes with a jailer's spec (issue 50): the descriptors it names
//! (`JailSpec::descriptors`) travel attached to the spec's frame on the
//! jailer's stdin socket, so that its starter spawns it without a step
//! of its own in the child. The jailer takes exactly what the spec names:
//! a named descriptor that did not come, or one that came unnamed,
//! refuses the spec. pycelld's monitor has its jailers forked by
//! `pycell-jailer --fork-server`: a forked jailer is its starter's
//! child and runs its spec as an executed one does; a malformed request
//! is answered with an errno.

#![forbid(unsafe_code)]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};

use pycell_tests::{pycell_bin, require_root};
use pycell_wire::events::{read_event, Event};
use pycell_wire::fork_server::{ForkJailer, Forked};
use pycell_wire::report::JailReport;
use pycell_wire::spec::{JailSpec, SpecFd};

fn print_one_spec() -> JailSpec {
    pycell_tests::debug_spec("print(1)\n")
}

fn jailer(stdin: Stdio) -> Child {
    Command::new(pycell_bin().with_file_name("pycell-jailer"))
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the jailer")
}

/// The jailer's output and report, once it has exited, and its exit code.
fn finish(mut jailer: Child) -> (Vec<u8>, JailReport, i32) {
    let mut events = jailer.stdout.take().unwrap();
    let (mut output, mut report) = (Vec::new(), None);
    while let Some(ev) = read_event(&mut events).expect("events") {
        match ev {
            Event::Output(_, bytes) => output.extend(bytes),
            Event::Result(r) => report = Some(*r),
            _ => {}
        }
    }
    let status = jailer.wait().unwrap();
    (
        output,
        report.expect("a result"),
        status.code().unwrap_or(-1),
    )
}

/// Start the jailer on a socket and send it `spec` with `fds` attached.
fn send(spec: &JailSpec, fds: &[OwnedFd]) -> Child {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let child = jailer(Stdio::from(OwnedFd::from(theirs)));
    hand_spec(&ours, spec, fds);
    child
}

/// Send `spec` on a jailer's stdin, `fds` attached, and end it there.
fn hand_spec(stdin: &UnixStream, spec: &JailSpec, fds: &[OwnedFd]) {
    let frame = pycell_wire::framing::encode_within(spec, pycell_wire::spec::MAX_SPEC_FRAME)
        .expect("a frame");
    let fds: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    pycell_wire::fdpass::send_with_fds(stdin.as_fd(), &frame, &fds).expect("sent");
    stdin.shutdown(std::net::Shutdown::Write).unwrap();
}

#[test]
fn the_outcome_pipe_comes_with_the_spec_and_the_outcome_line_goes_on_it() {
    require_root();
    let mut spec = print_one_spec();
    spec.descriptors = vec![SpecFd::Outcome];
    let (mut outcome, outcome_w) = std::io::pipe().unwrap();
    let child = send(&spec, &[OwnedFd::from(outcome_w)]);
    let (output, report, code) = finish(child);
    assert_eq!((code, report.error.as_ref()), (0, None), "{report:?}");
    assert!(String::from_utf8_lossy(&output).contains('1'), "{output:?}");
    let mut line = String::new();
    outcome.read_to_string(&mut line).unwrap();
    assert!(line.starts_with("ok"), "the outcome line: {line:?}");
}

#[test]
fn a_descriptor_named_but_not_come_or_come_but_unnamed_refuses_the_spec() {
    require_root();
    let mut spec = print_one_spec();
    // Named, on a pipe: nothing can come with it.
    spec.descriptors = vec![SpecFd::Outcome];
    let mut piped = jailer(Stdio::piped());
    let frame = pycell_wire::framing::encode_within(&spec, pycell_wire::spec::MAX_SPEC_FRAME)
        .expect("a frame");
    std::io::Write::write_all(&mut piped.stdin.take().unwrap(), &frame).unwrap();
    let (_, report, code) = finish(piped);
    let e = report.error.expect("refused");
    assert_eq!((code, e.code.as_str()), (2, "invalid_spec"), "{e:?}");
    assert!(e.message.contains("descriptors"), "{e:?}");
    // Come, unnamed: refused, and closed (our read end sees its end).
    spec.descriptors.clear();
    let (mut stray, stray_w) = std::io::pipe().unwrap();
    let (_, report, code) = finish(send(&spec, &[OwnedFd::from(stray_w)]));
    let e = report.error.expect("refused");
    assert_eq!((code, e.code.as_str()), (2, "invalid_spec"), "{e:?}");
    assert!(
        e.message.contains("names 0 descriptors but 1 came"),
        "{e:?}"
    );
    let mut nothing = Vec::new();
    stray.read_to_end(&mut nothing).unwrap();
    assert!(nothing.is_empty());
}

/// `pycell-jailer --fork-server`, as pycelld's monitor starts it: the
/// socket pair's other end and the server.
fn fork_server() -> (OwnedFd, Child) {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let server = Command::new(pycell_bin().with_file_name("pycell-jailer"))
        .arg(pycell_wire::fork_server::ARG)
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .spawn()
        .expect("the fork server");
    (ours, server)
}

/// Ask the server `request` with `fds` attached; its answer.
fn ask(sock: &OwnedFd, request: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> Forked {
    pycell_wire::fdpass::send_with_fds(sock.as_fd(), request, fds).unwrap();
    let mut buf = [0u8; 8];
    let (n, _) = pycell_wire::fdpass::recv_with_fds(sock.as_fd(), &mut buf).unwrap();
    Forked::decode(&buf[..n]).unwrap()
}

#[test]
fn a_forked_jailer_is_its_servers_starters_child_and_runs_its_spec() {
    require_root();
    let (sock, mut server) = fork_server();
    let (spec_in, theirs) = UnixStream::pair().unwrap();
    let (mut events, events_w) = std::io::pipe().unwrap();
    let request = ForkJailer::default().encode();
    let Forked::Pid(pid) = ask(&sock, &request, &[theirs.as_fd(), events_w.as_fd()]) else {
        panic!("no jailer forked");
    };
    drop((theirs, events_w));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains(&format!("\nPPid:\t{}\n", std::process::id())),
        "the forked jailer is our child, not the server's: {status}"
    );
    let mut spec = print_one_spec();
    spec.descriptors = vec![SpecFd::Outcome];
    let (mut outcome, outcome_w) = std::io::pipe().unwrap();
    hand_spec(&spec_in, &spec, &[OwnedFd::from(outcome_w)]);
    let mut output = Vec::new();
    while let Some(ev) = read_event(&mut events).expect("events") {
        if let Event::Output(_, bytes) = ev {
            output.extend(bytes);
        }
    }
    assert!(String::from_utf8_lossy(&output).contains('1'), "{output:?}");
    let mut line = String::new();
    outcome.read_to_string(&mut line).unwrap();
    assert!(line.starts_with("ok"), "the outcome line: {line:?}");
    let waited = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert!(
        matches!(waited, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "{waited:?}"
    );
    drop(sock);
    assert!(
        server.wait().unwrap().success(),
        "the server ends with its socket"
    );
}

#[test]
fn a_fork_server_answers_a_malformed_request_with_an_errno_and_serves_on() {
    require_root();
    let (sock, mut server) = fork_server();
    let (_spec_in, theirs) = UnixStream::pair().unwrap();
    let request = ForkJailer::default().encode();
    assert_eq!(
        ask(&sock, &[0, 0], &[]),
        Forked::Failed(nix::libc::EINVAL),
        "two bytes"
    );
    assert_eq!(
        ask(&sock, &[0x80], &[theirs.as_fd(), theirs.as_fd()]),
        Forked::Failed(nix::libc::EINVAL),
        "an unknown bit"
    );
    assert_eq!(
        ask(&sock, &request, &[theirs.as_fd()]),
        Forked::Failed(nix::libc::EBADMSG),
        "one descriptor of two"
    );
    assert!(server.try_wait().unwrap().is_none(), "the server serves on");
    drop(sock);
    assert!(server.wait().unwrap().success());
}
