//! Every probe program, started outside a job (no `weft run`, no PMIx host), ends at once
//! with a non-zero status and a message naming why, instead of hanging or panicking.
//! (Being the package's integration test, this also makes `cargo test --workspace` build
//! the probes that the `weft-cli` tests and the ci/ scripts drive.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROBES: &[(&str, &str)] = &[
    ("chaos_probe", env!("CARGO_BIN_EXE_chaos_probe")),
    ("coll_check", env!("CARGO_BIN_EXE_coll_check")),
    ("coll_probe", env!("CARGO_BIN_EXE_coll_probe")),
    ("fabric_probe", env!("CARGO_BIN_EXE_fabric_probe")),
    ("group_probe", env!("CARGO_BIN_EXE_group_probe")),
    ("session_probe", env!("CARGO_BIN_EXE_session_probe")),
    ("wireup_probe", env!("CARGO_BIN_EXE_wireup_probe")),
];

#[test]
fn every_probe_outside_a_job_fails_fast_and_says_why() {
    for (name, path) in PROBES {
        let mut cmd = Command::new(path);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("WEFT_") || k.starts_with("PMIX_") || k.starts_with("PMI_") {
                cmd.env_remove(&k);
            }
        }
        let started = Instant::now();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {path}: {e}"));
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{name} outside a job still runs after 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success() && out.status.code().is_some(),
            "{name} outside a job: {:?} (a clean exit or a signal), output: {text}",
            out.status
        );
        assert!(
            !text.contains("panicked"),
            "{name} outside a job panicked: {text}"
        );
        assert!(
            text.contains("WEFT_RANK is not set") || text.contains("unknown scenario"),
            "{name} outside a job does not say why it stopped: {text}"
        );
    }
}
