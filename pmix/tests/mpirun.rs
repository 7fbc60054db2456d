//! The PMIx client under a real host engine: Debian's Open MPI 4.1 `mpirun` (its runtime
//! hosts a PMIx server) runs `examples/pmix_probe.rs` on 4 processes (2 cores:
//! oversubscribed). Skips with a printed reason when this build has no libpmix or
//! `mpirun.openmpi` is not installed (CI installs both: `ci/deps.sh`).
#![allow(missing_docs)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("examples").join(name)
}

fn mpirun() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mpirun.openmpi"))
        .find(|p| p.exists())
}

#[test]
fn put_commit_fence_and_get_under_open_mpi_mpirun() {
    if weft_pmix::built_with().is_none() {
        eprintln!("skipped: weft-pmix was built without libpmix (apt-get install libpmix-dev)");
        return;
    }
    let Some(mpirun) = mpirun() else {
        eprintln!("skipped: mpirun.openmpi not found (apt-get install openmpi-bin)");
        return;
    };
    let probe = example("pmix_probe");
    assert!(
        probe.exists(),
        "{} is not built (cargo test builds examples)",
        probe.display()
    );
    let start = Instant::now();
    let mut child = Command::new(mpirun)
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            "4",
        ])
        .arg(&probe)
        .env("OMPI_MCA_plm_rsh_agent", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun.openmpi");
    // Never hang the suite: kill it after two minutes.
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("mpirun.openmpi with pmix_probe did not end within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dump = format!(
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(out.status.success(), "{dump}");
    let ok: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" pmix ok: "))
        .collect();
    assert_eq!(ok.len(), 4, "{dump}");
    for r in 0..4 {
        let line = ok
            .iter()
            .find(|l| l.starts_with(&format!("rank {r} pmix ok")))
            .unwrap_or_else(|| panic!("no line of rank {r}\n{dump}"));
        assert!(line.contains(" size 4 "), "{line}");
        assert!(line.contains(&format!(" local {r}/4 ")), "{line}");
        assert!(line.contains(" peers 0,1,2,3 "), "{line}");
    }
}
