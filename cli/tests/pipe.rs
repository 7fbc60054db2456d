//! A `weft` command whose output is read by a program that goes away early (`weft info |
//! head -1`) ends quietly: exit 0 or the usual death by SIGPIPE, never a panic on the
//! broken pipe.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// Runs `weft ARGS` with its stdout connected to a reader that has already gone away (a
/// socket whose other end is closed: a write there fails with EPIPE and raises SIGPIPE,
/// exactly as on a pipe whose reader exited), and checks how it ended.
fn ends_quietly_on_closed_stdout(args: &[&str]) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    drop(ours);
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .output()
        .expect("start weft");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "weft {args:?} with a closed stdout wrote to stderr: {stderr}"
    );
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "weft {args:?} with a closed stdout ended with {:?}; stderr: {stderr}",
        out.status
    );
}

#[test]
fn bench_help_into_a_closed_pipe_ends_quietly() {
    ends_quietly_on_closed_stdout(&["bench", "latency", "--help"]);
}

#[test]
fn bench_list_into_a_closed_pipe_ends_quietly() {
    // `print!` of the benchmark list: panicked on the broken pipe before.
    ends_quietly_on_closed_stdout(&["bench", "--help"]);
}

#[test]
fn info_into_a_closed_pipe_ends_quietly() {
    // Many `println!`s: panicked on the broken pipe before.
    ends_quietly_on_closed_stdout(&["info"]);
}

#[test]
fn clap_help_into_a_closed_pipe_ends_quietly() {
    ends_quietly_on_closed_stdout(&["--help"]);
}
