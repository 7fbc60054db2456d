//! The processes, without IO: the node's own processes (their token, connection, pid,
//! whether they finalize as they exit or called abort, events waiting for their hello),
//! every rank of the job known to be gone (local or not) and why, and the decisions at
//! a process's end: its exit status, its lost connection, an abort's grace period, the
//! job's termination. Every `on_*` method returns the [`Action`]s the server carries
//! out (see `procs/tests.rs`).
//!
//! A process ends once: the first of its exit status, its connection's loss, its
//! finalize (when it does not finalize as it exits) or a checked end says how, as
//! [`Action::Ended`]; the server tells the other servers, and every server records it
//! with [`Processes::on_ended`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rustix::process::Signal;

use crate::modex::ConnId;
use crate::wire::proto::{Event as WireEvent, ExitKind};
use weft_wireup::Rank;

/// How long a process that called abort has to exit before it is killed.
pub(crate) const ABORT_GRACE: Duration = Duration::from_millis(500);

/// How long a child's closed connection waits for its exit status before the server
/// reports a lost connection instead.
pub(crate) const EXIT_STATUS_WAIT: Duration = Duration::from_millis(300);

/// What the server must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Local rank `rank` ended (`finalized`, or otherwise as `reason` says): tell the
    /// other servers and everything here that waits on it.
    Ended {
        rank: Rank,
        reason: String,
        finalized: bool,
    },
    /// Send signal `sig` to process `pid`.
    Kill { pid: u32, sig: Signal },
    /// Hand `timer` back after `after`.
    Timer { after: Duration, timer: Timer },
    /// Tell the launcher how local rank `rank` exited.
    Report { rank: Rank, how: ExitKind },
}

/// A timer of the processes concern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Timer {
    /// A child's connection closed before finalize: `on_conn_lost_check`.
    ConnLost(Rank),
    /// An aborting process's grace period: `on_abort_grace_over`.
    AbortGrace(Rank),
    /// A termination's grace period: `on_kill_now`.
    KillNow,
}

/// One of this node's processes.
#[derive(Debug, Default)]
struct LocalProc {
    token: u64,
    conn: Option<ConnId>,
    /// It finalized as it exits: its end is reported by its exit status.
    finalizing_at_exit: bool,
    pid: Option<u32>,
    exited: bool,
    /// Events for the process that arrived before it connected (delivered at hello).
    early_events: Vec<WireEvent>,
    /// It called abort with this exit code (`on_abort`).
    aborted: Option<i32>,
}

/// The processes of one server.
#[derive(Debug)]
pub(crate) struct Processes {
    node: u32,
    /// The job's size.
    size: usize,
    /// This node's processes.
    local: BTreeMap<Rank, LocalProc>,
    /// The ranks of the job that are gone, and why.
    gone: HashMap<Rank, String>,
    /// Local processes whose exit status has not arrived.
    live: usize,
    /// The launcher terminates the job.
    terminating: bool,
}

impl Processes {
    /// The processes of the server of `node` in a job of `size` ranks: its own ranks,
    /// each with the token its connection must present.
    pub(crate) fn new(
        node: u32,
        size: usize,
        local: impl IntoIterator<Item = (Rank, u64)>,
    ) -> Processes {
        let local: BTreeMap<Rank, LocalProc> = local
            .into_iter()
            .map(|(r, token)| {
                let p = LocalProc {
                    token,
                    ..LocalProc::default()
                };
                (r, p)
            })
            .collect();
        Processes {
            node,
            size,
            live: local.len(),
            local,
            gone: HashMap::new(),
            terminating: false,
        }
    }

    /// Whether rank `rank` runs on this node.
    pub(crate) fn is_local(&self, rank: Rank) -> bool {
        self.local.contains_key(&rank)
    }

    /// This node's ranks, in order.
    pub(crate) fn local_ranks(&self) -> Vec<Rank> {
        self.local.keys().copied().collect()
    }

    /// How many processes run on this node.
    pub(crate) fn local_count(&self) -> usize {
        self.local.len()
    }

    /// The token local rank `rank`'s connection must present.
    pub(crate) fn token(&self, rank: Rank) -> Option<u64> {
        self.local.get(&rank).map(|p| p.token)
    }

    /// Local rank `rank`'s process, while it runs.
    pub(crate) fn pid(&self, rank: Rank) -> Option<u32> {
        self.local.get(&rank).and_then(|p| p.pid)
    }

    /// Why rank `rank` is gone (`None`: it is not).
    pub(crate) fn why_gone(&self, rank: Rank) -> Option<&str> {
        self.gone.get(&rank).map(String::as_str)
    }

    /// Whether rank `rank` is gone.
    pub(crate) fn is_gone(&self, rank: Rank) -> bool {
        self.gone.contains_key(&rank)
    }

    /// Whether every rank of the job is gone.
    pub(crate) fn all_gone(&self) -> bool {
        self.gone.len() == self.size
    }

    /// How many local processes have not exited (their exit status not arrived).
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Whether the launcher terminates the job.
    pub(crate) fn terminating(&self) -> bool {
        self.terminating
    }

    /// Local processes that have not been reaped.
    pub(crate) fn unreaped(&self) -> Vec<Rank> {
        let left = self.local.iter().filter(|(_, p)| !p.exited);
        left.map(|(r, _)| *r).collect()
    }

    /// Local rank `rank`'s process started as `pid` (`None`: it failed to start; its
    /// exit follows).
    pub(crate) fn on_spawned(&mut self, rank: Rank, pid: Option<u32>) {
        if let Some(p) = self.local.get_mut(&rank) {
            p.pid = pid;
        }
    }

    /// Connection `conn` says hello as rank `rank` with `token`: the events that
    /// waited for it, or why it is refused.
    pub(crate) fn on_hello(
        &mut self,
        rank: Rank,
        token: u64,
        conn: ConnId,
    ) -> Result<Vec<WireEvent>, String> {
        let gone = self.gone.contains_key(&rank);
        let Some(p) = self.local.get_mut(&rank) else {
            return Err(format!("rank {rank} does not run on node {}", self.node));
        };
        if p.token != token {
            return Err(format!("wrong token for rank {rank}"));
        }
        if p.conn.is_some() {
            return Err(format!("rank {rank} is already connected"));
        }
        if gone {
            return Err(format!("rank {rank} has already finalized or died"));
        }
        p.conn = Some(conn);
        Ok(std::mem::take(&mut p.early_events))
    }

    /// An event for local process `rank`: the connection to send it on now; one that
    /// has not connected yet gets it at its hello (one that is gone, never).
    pub(crate) fn on_event(&mut self, rank: Rank, event: &WireEvent) -> Option<ConnId> {
        let gone = self.gone.contains_key(&rank);
        let p = self.local.get_mut(&rank)?;
        match p.conn {
            Some(conn) => return Some(conn),
            None if !gone && !p.exited => p.early_events.push(event.clone()),
            None => {}
        }
        None
    }

    /// Local rank `rank` finalized (a native client; `at_exit`: as it exits): a child
    /// that finalizes as it exits ends by its exit status, any other has finalized now.
    pub(crate) fn on_finalize(&mut self, rank: Rank, at_exit: bool) -> Vec<Action> {
        let Some(p) = self.local.get_mut(&rank) else {
            return Vec::new();
        };
        if at_exit && p.pid.is_some() && !p.exited {
            // Its exit status decides: "has finalized" for 0, else the code or signal.
            // The connection closing triggers a check in case it lingers.
            p.finalizing_at_exit = true;
            return Vec::new();
        }
        self.end(rank, weft_wireup::FINALIZED.into(), true)
    }

    /// Local rank `rank` finalized as it exits (PMI-1, PMI-2, PMIx): its exit status
    /// decides how it ended.
    pub(crate) fn on_finalize_at_exit(&mut self, rank: Rank) {
        if let Some(p) = self.local.get_mut(&rank) {
            p.finalizing_at_exit = true;
        }
    }

    /// Local rank `rank` called abort with exit code `code`: unless it exits within
    /// `ABORT_GRACE` (Open MPI does, MPICH waits to be killed, as Hydra does) it is
    /// killed, and either way its end is reported with that code.
    pub(crate) fn on_abort(&mut self, rank: Rank, code: i32) -> Vec<Action> {
        if let Some(p) = self.local.get_mut(&rank) {
            p.aborted = Some(code);
            p.finalizing_at_exit = false;
        }
        let timer = Timer::AbortGrace(rank);
        vec![Action::Timer {
            after: ABORT_GRACE,
            timer,
        }]
    }

    /// An aborting process's grace period ended: it is killed if it still runs.
    pub(crate) fn on_abort_grace_over(&mut self, rank: Rank) -> Vec<Action> {
        match self.local.get(&rank) {
            Some(&LocalProc {
                pid: Some(pid),
                exited: false,
                ..
            }) => vec![Action::Kill {
                pid,
                sig: Signal::KILL,
            }],
            _ => Vec::new(),
        }
    }

    /// Local rank `rank`'s connection closed; `reason` is why this server dropped it
    /// (empty: the process closed it).
    pub(crate) fn on_conn_closed(&mut self, rank: Rank, reason: &str) -> Vec<Action> {
        let Some(p) = self.local.get_mut(&rank) else {
            return Vec::new();
        };
        p.conn = None;
        if self.gone.contains_key(&rank) {
            return Vec::new();
        }
        if !reason.is_empty() {
            let why = format!("was dropped by its server: {reason}");
            return self.end(rank, why, false);
        }
        if p.pid.is_some() && !p.exited {
            // Our child: its exit status, due any moment when it is exiting, says how
            // it ended better than the closed connection does.
            let timer = Timer::ConnLost(rank);
            return vec![Action::Timer {
                after: EXIT_STATUS_WAIT,
                timer,
            }];
        }
        let why = "lost its connection to the server before finalize";
        self.end(rank, why.into(), false)
    }

    /// Local rank `rank`'s connection closed `EXIT_STATUS_WAIT` ago: unless its exit
    /// status told how it ended since, it lost the connection while running (or, when
    /// it finalized as it exits, it has finalized).
    pub(crate) fn on_conn_lost_check(&mut self, rank: Rank) -> Vec<Action> {
        let finalizing = self.local.get(&rank).is_some_and(|p| p.finalizing_at_exit);
        if finalizing {
            return self.end(rank, weft_wireup::FINALIZED.into(), true);
        }
        let why = "lost its connection to the server (the process is still running)";
        self.end(rank, why.into(), false)
    }

    /// Local rank `rank`'s process exited as `how` says (reaped, its output forwarded):
    /// its end unless it ended before, and the launcher's report, once.
    pub(crate) fn on_child_exit(&mut self, rank: Rank, mut how: ExitKind) -> Vec<Action> {
        let mut finalizing = false;
        if let Some(p) = self.local.get_mut(&rank) {
            if p.exited {
                return Vec::new();
            }
            p.exited = true;
            p.pid = None;
            // An abort's code, whether the process exited with it or was killed after
            // it (`on_abort`).
            if let (Some(code), ExitKind::Code(0) | ExitKind::Signal(_)) = (p.aborted, &how) {
                how = ExitKind::Code(code);
            }
            finalizing = p.finalizing_at_exit;
        }
        self.live = self.live.saturating_sub(1);
        let (why, fin) = match &how {
            ExitKind::Code(0) if finalizing => (weft_wireup::FINALIZED.to_owned(), true),
            ExitKind::Code(c) if !finalizing => {
                (format!("exited with code {c} before finalize"), false)
            }
            other => (other.describe(), false),
        };
        let mut acts = self.end(rank, why, fin);
        acts.push(Action::Report { rank, how });
        acts
    }

    /// The processes a server at its end killed: `rank` started as `pid` only now
    /// (to be killed).
    pub(crate) fn on_reap_spawned(&mut self, rank: Rank, pid: Option<u32>) -> Vec<Action> {
        match (self.local.get_mut(&rank), pid) {
            (Some(p), Some(pid)) => {
                p.pid = Some(pid);
                vec![Action::Kill {
                    pid,
                    sig: Signal::KILL,
                }]
            }
            _ => Vec::new(),
        }
    }

    /// The processes a server at its end killed: `rank` was reaped.
    pub(crate) fn on_reaped(&mut self, rank: Rank) {
        if let Some(p) = self.local.get_mut(&rank) {
            p.exited = true;
            p.pid = None;
        }
    }

    /// The launcher terminates the job: its processes get SIGTERM now and SIGKILL
    /// after `grace`.
    pub(crate) fn on_terminate(&mut self, grace: Duration) -> Vec<Action> {
        self.terminating = true;
        let mut acts = self.kill_all(Signal::TERM);
        acts.push(Action::Timer {
            after: grace,
            timer: Timer::KillNow,
        });
        acts
    }

    /// A termination's grace period ended.
    pub(crate) fn on_kill_now(&mut self) -> Vec<Action> {
        self.kill_all(Signal::KILL)
    }

    /// Signal `sig` to every local process still running.
    /// Sends `sig` to local process `rank` (`None`: every local process) if it runs.
    pub(crate) fn signal(&self, rank: Option<Rank>, sig: Signal) -> Vec<Action> {
        (self.local.iter())
            .filter(|(&r, p)| rank.is_none_or(|want| want == r) && !p.exited)
            .filter_map(|(_, p)| p.pid)
            .map(|pid| Action::Kill { pid, sig })
            .collect()
    }

    pub(crate) fn kill_all(&self, sig: Signal) -> Vec<Action> {
        let running = self.local.values().filter(|p| !p.exited);
        running
            .filter_map(|p| p.pid)
            .map(|pid| Action::Kill { pid, sig })
            .collect()
    }

    /// Rank `rank` (of any node) ended as `reason` says: recorded once (`false`: it
    /// had ended before).
    pub(crate) fn on_ended(&mut self, rank: Rank, reason: &str) -> bool {
        if self.gone.contains_key(&rank) {
            return false;
        }
        self.gone.insert(rank, reason.to_owned());
        true
    }

    /// Local rank `rank` ends, unless it has ended before.
    fn end(&self, rank: Rank, reason: String, finalized: bool) -> Vec<Action> {
        if self.gone.contains_key(&rank) {
            return Vec::new();
        }
        vec![Action::Ended {
            rank,
            reason,
            finalized,
        }]
    }
}

#[cfg(test)]
mod tests;
