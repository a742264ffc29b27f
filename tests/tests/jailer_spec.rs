//! What comes with a jailer's spec (issue 50): the descriptors it names
//! (`JailSpec::descriptors`) travel attached to the spec's frame on the
//! jailer's stdin socket, so that its starter spawns it without a step
//! of its own in the child. The jailer takes exactly what the spec names:
//! a named descriptor that did not come, or one that came unnamed,
//! refuses the spec.

#![forbid(unsafe_code)]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};

use pycell_tests::{pycell_bin, require_root};
use pycell_wire::events::{read_event, Event};
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
    let frame = pycell_wire::framing::encode_within(spec, pycell_wire::spec::MAX_SPEC_FRAME)
        .expect("a frame");
    let fds: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    pycell_wire::fdpass::send_with_fds(ours.as_fd(), &frame, &fds).expect("sent");
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    child
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
