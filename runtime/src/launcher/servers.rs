//! The launcher's server processes (`weft server`, or the launch agent that runs one on
//! another host): started, killed on demand, and always reaped.
//!
//! Every started process is owned by one task that waits for it, so it is reaped the
//! moment it exits and its end reported to the launcher's loop. A kill is a request to
//! those tasks (they kill their own child, never a pid that may have been reused), and
//! [`Servers::reap`] ends the launcher's part: it waits for every process, killing the
//! ones that outstay their time, so that no server is left behind as a zombie whatever
//! way the job ended (issue 31).

use std::time::Duration;

use tokio::process::Command;
use tokio::sync::{mpsc::UnboundedSender, watch};
use tokio::task::JoinHandle;

use super::Ev;

/// How long a server that was sent SIGKILL gets to be reaped before the launcher gives
/// up on it (a process stuck in the kernel; logged).
const KILLED_EXIT_WAIT: Duration = Duration::from_secs(5);

/// The server processes of one job.
#[derive(Debug)]
pub(super) struct Servers {
    /// Each started process: its node and the task that waits for it.
    waiters: Vec<(u32, JoinHandle<()>)>,
    /// Set to `true` to have every process killed (SIGKILL).
    kill: watch::Sender<bool>,
}

impl Servers {
    pub(super) fn new() -> Servers {
        Servers {
            waiters: Vec::new(),
            kill: watch::Sender::new(false),
        }
    }

    /// Starts `cmd` as the server of `node`; its end is reported as `Ev::ServerExit`.
    pub(super) fn start(
        &mut self,
        node: u32,
        mut cmd: Command,
        ev: UnboundedSender<Ev>,
    ) -> std::io::Result<()> {
        // Only a launcher whose tasks are dropped (a panic) relies on this.
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let mut kill = self.kill.subscribe();
        let waiter = tokio::spawn(async move {
            let status = tokio::select! {
                s = child.wait() => s,
                // A kill request (or the launcher dropping its `Servers`).
                () = async {
                    let _ = kill.wait_for(|k| *k).await;
                } => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            let status = match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            };
            let _ = ev.send(Ev::ServerExit { node, status });
        });
        self.waiters.push((node, waiter));
        Ok(())
    }

    /// Kills every server that is still running (SIGKILL).
    pub(super) fn kill_all(&self) {
        self.kill.send_replace(true);
    }

    /// Waits for every server to exit (and be reaped): for up to `patience`, then kills
    /// the rest and waits for them too (up to `KILLED_EXIT_WAIT`).
    pub(super) async fn reap(mut self, patience: Duration) {
        let deadline = tokio::time::Instant::now() + patience;
        let mut late = Vec::new();
        for (node, w) in &mut self.waiters {
            if tokio::time::timeout_at(deadline, &mut *w).await.is_err() {
                late.push(*node);
            }
        }
        if late.is_empty() {
            return;
        }
        tracing::warn!(
            "the servers of nodes {late:?} did not exit within {:.1} s of the job's end; killing them",
            patience.as_secs_f64()
        );
        self.kill_all();
        let deadline = tokio::time::Instant::now() + KILLED_EXIT_WAIT;
        for (node, w) in &mut self.waiters {
            if late.contains(node) && tokio::time::timeout_at(deadline, &mut *w).await.is_err() {
                tracing::error!(
                    "the server of node {node} did not exit within {} s of SIGKILL (KILLED_EXIT_WAIT); \
                     it is left behind",
                    KILLED_EXIT_WAIT.as_secs()
                );
            }
        }
    }
}
