//! Test helper: re-executes this test binary as a child process that runs
//! one test in a "child role" selected by an environment variable.

use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variable that selects the child role.
const ROLE_VAR: &str = "WEFT_SHM_TEST_ROLE";

/// The role this process runs in, if it is a test child.
pub(crate) fn child_role() -> Option<&'static str> {
    static ROLE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ROLE.get_or_init(|| std::env::var(ROLE_VAR).ok()).as_deref()
}

/// A child process, killed and reaped on drop.
pub(crate) struct TestChild {
    child: Child,
}

impl TestChild {
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stdout(&mut self) -> ChildStdout {
        self.child.stdout.take().expect("child stdout not piped")
    }

    pub(crate) fn stdin(&mut self) -> &mut ChildStdin {
        self.child.stdin.as_mut().expect("child stdin not piped")
    }

    /// Waits for the child to exit; panics (killing it) after `timeout`.
    pub(crate) fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("test child did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs test `test_path` (e.g. `inbox::tests::pingpong`) of this binary in a
/// child process with role `role` and the extra environment `env`.
pub(crate) fn spawn_child(
    test_path: &str,
    role: &str,
    env: &[(&str, String)],
    piped: bool,
) -> TestChild {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test_path, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if piped {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    } else {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
    }
    TestChild {
        child: cmd.spawn().expect("spawn test child"),
    }
}
