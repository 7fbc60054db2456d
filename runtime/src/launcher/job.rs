//! What happens to one job, decided without IO: a process's exit, a server's failure or
//! loss, the time limit, a signal, the end of the grace period; the job's exit status,
//! and when it is over. The launcher's loop feeds it and executes the [`Action`]s it
//! returns (it owns the sockets, timers and processes).
//!
//! Per job, apart from the runtime's [`Nodes`](super::nodes::Nodes): a persistent runtime
//! (issue 33) runs many of these over the same servers.

use std::time::Duration;

use weft_wireup::job::JobInfo;
use weft_wireup::{NsId, Rank};

use super::plan::EndPolicy;
use super::{EXIT_LAUNCH_FAILED, EXIT_TIMEOUT};
use crate::wire::proto::{signal_name, ExitKind, FromController, ToServer};

/// How long terminated processes get between SIGTERM and SIGKILL.
pub(super) const KILL_AFTER: Duration = Duration::from_millis(500);
/// How long after a terminate the servers are killed if they are still there.
pub(super) const FORCE_KILL_AFTER: Duration = Duration::from_millis(500 + 5000);

/// What the launcher's loop is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// Tell the user (a line on stderr).
    Report(String),
    /// Send the job's plan to the server of this node (it just said hello).
    SendPlan(u32),
    /// Send a message to every connected server.
    SendAll(ToServer),
    /// Send a message to the server of this node.
    Send(u32, ToServer),
    /// Have `Timer` fire after this long.
    Arm(Timer, Duration),
    /// Kill every server process (SIGKILL).
    KillServers,
    /// Have a timer of spawned job `NsId` fire after this long.
    ArmJob(NsId, Timer, Duration),
    /// Answer the spawn request `qid` of the server of `node`.
    SpawnDone {
        node: u32,
        qid: u64,
        result: Result<(NsId, String), String>,
    },
    /// Answer the allocation request `qid` of the server of `node`.
    AllocDone {
        node: u32,
        qid: u64,
        result: Result<crate::wire::proto::SessionInfo, String>,
    },
    /// Send a message to submitter `u64` of a persistent runtime (`weft run --dvm`, `ps`).
    Tell(u64, FromController),
    /// The first job's process table is complete (`proctable`).
    ProcTable(Vec<super::proctable::ProcRow>),
    /// Write output of a job nobody submitted (or whose submitter left) to the
    /// launcher's own stdout or stderr.
    Output { stderr: bool, bytes: Vec<u8> },
}

/// The launcher's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// `--timeout` expired.
    Timeout,
    /// The servers had their time to start.
    StartupTimeout,
    /// The grace period after a process failed is over.
    GraceOver,
    /// Terminated servers had their time to end.
    ForceKill,
}

/// One job's state, as far as its end is concerned.
#[derive(Debug)]
pub(super) struct Job {
    /// The job's processes and nodes (for the reports and a lost node's ranks).
    info: JobInfo,
    /// `--timeout`, `--keep-going` and the grace period.
    policy: EndPolicy,
    /// Per rank, whether its end was seen.
    exited: Vec<bool>,
    /// How many are `true` in `exited`.
    n_exited: u32,
    /// The first process that failed, and how.
    first_failure: Option<(Rank, ExitKind)>,
    /// The exit status, when something other than a process decided it (a launch
    /// failure, the time limit, a signal).
    status_override: Option<i32>,
    /// Whether the job is being terminated.
    terminating: bool,
    /// Whether the servers were told to shut down (every process ended).
    shut_down: bool,
}

impl Job {
    pub(super) fn new(info: JobInfo, policy: EndPolicy) -> Job {
        let size = info.size() as usize;
        Job {
            info,
            policy,
            exited: vec![false; size],
            n_exited: 0,
            first_failure: None,
            status_override: None,
            terminating: false,
            shut_down: false,
        }
    }

    /// The terminate request and the timer that kills the servers if it is not enough.
    fn terminate() -> [Action; 2] {
        [
            Action::SendAll(ToServer::Terminate {
                grace_ms: KILL_AFTER.as_millis() as u64,
            }),
            Action::Arm(Timer::ForceKill, FORCE_KILL_AFTER),
        ]
    }

    /// Starts terminating the job, unless it is already.
    fn terminate_once(&mut self, out: &mut Vec<Action>) {
        if !self.terminating {
            self.terminating = true;
            out.extend(Job::terminate());
        }
    }

    /// Marks `rank` as ended (once).
    fn mark_exited(&mut self, rank: Rank) {
        if let Some(e) = self.exited.get_mut(rank as usize) {
            if !*e {
                *e = true;
                self.n_exited += 1;
            }
        }
    }

    /// Once every process has ended, the servers are told to shut down (once).
    fn shut_down_if_all_ended(&mut self, out: &mut Vec<Action>) {
        if self.n_exited == self.info.size() && !self.shut_down {
            self.shut_down = true;
            out.push(Action::SendAll(ToServer::Shutdown));
        }
    }

    /// Marks the job as being terminated by someone else (its parent's end, a signal, the
    /// time limit): its processes' ends are no failures to report.
    pub(super) fn mark_terminating(&mut self) {
        self.terminating = true;
    }

    /// Whether the job is being terminated.
    pub(super) fn is_terminating(&self) -> bool {
        self.terminating
    }

    /// The job's time limit (`--timeout`), if any.
    pub(super) fn timeout(&self) -> Option<Duration> {
        self.policy.timeout
    }

    /// Whether every process of the job has ended.
    pub(super) fn is_over(&self) -> bool {
        self.shut_down
    }

    /// The job's information.
    pub(super) fn info(&self) -> &JobInfo {
        &self.info
    }

    /// Whether process `rank`'s end was seen.
    pub(super) fn has_exited(&self, rank: Rank) -> bool {
        self.exited.get(rank as usize).copied().unwrap_or(true)
    }

    /// How many of its processes have ended.
    pub(super) fn num_exited(&self) -> u32 {
        self.n_exited
    }

    /// The job was started on every server: a termination asked for before the start (a
    /// signal) is sent now that every server knows the job.
    pub(super) fn on_started(&mut self) -> Vec<Action> {
        if self.terminating {
            Job::terminate().into()
        } else {
            Vec::new()
        }
    }

    /// Process `rank` ended as `how`.
    pub(super) fn on_proc_exit(&mut self, rank: Rank, how: ExitKind) -> Vec<Action> {
        let mut out = Vec::new();
        self.mark_exited(rank);
        let failed = how != ExitKind::Code(0);
        if failed && self.first_failure.is_none() && !self.terminating {
            let node = self.info.procs.get(rank as usize).map_or(0, |p| p.node);
            let host = self
                .info
                .nodes
                .get(node as usize)
                .map_or("?", |n| n.hostname.as_str());
            let then = if self.policy.keep_going {
                String::new()
            } else {
                format!(
                    "; terminating the job in {:.1} s",
                    self.policy.grace.as_secs_f64()
                )
            };
            out.push(Action::Report(format!(
                "weft run: rank {rank} (node {node}, {host}) {}{then}",
                how.describe()
            )));
            self.first_failure = Some((rank, how));
            if !self.policy.keep_going {
                // The others learn of the failure through the wire-up service within
                // milliseconds; give them the grace period to report it and exit.
                self.terminating = true;
                out.push(Action::Arm(Timer::GraceOver, self.policy.grace));
            }
        }
        self.shut_down_if_all_ended(&mut out);
        out
    }

    /// The server of `node` reported that it failed.
    pub(super) fn on_server_failed(&mut self, node: u32, reason: &str) -> Vec<Action> {
        let mut out = vec![Action::Report(format!(
            "weft run: the server of node {node} failed: {reason}"
        ))];
        self.status_override.get_or_insert(EXIT_LAUNCH_FAILED);
        self.terminate_once(&mut out);
        out
    }

    /// The server of `node` ended (first report of it): unless the job was over, its
    /// processes count as ended and the job is terminated.
    pub(super) fn on_server_lost(&mut self, node: u32, reason: &str) -> Vec<Action> {
        let mut out = Vec::new();
        if self.shut_down {
            return out;
        }
        let host = self
            .info
            .nodes
            .get(node as usize)
            .map_or("?", |n| n.hostname.as_str());
        out.push(Action::Report(format!(
            "weft run: the server of node {node} ({host}) ended unexpectedly: {reason}"
        )));
        self.status_override.get_or_insert(EXIT_LAUNCH_FAILED);
        for r in self.info.ranks_on(node) {
            self.mark_exited(r);
        }
        self.terminate_once(&mut out);
        self.shut_down_if_all_ended(&mut out);
        out
    }

    /// The server of `node` could not set the job up: none of its processes there
    /// started, so they count as ended (the failure itself is reported by whoever asked).
    pub(super) fn on_node_not_started(&mut self, node: u32) -> Vec<Action> {
        let mut out = Vec::new();
        for r in self.info.ranks_on(node) {
            self.mark_exited(r);
        }
        self.shut_down_if_all_ended(&mut out);
        out
    }

    /// The launch failed before the job started (the servers did not all start).
    pub(super) fn on_launch_failed(&mut self) {
        self.status_override.get_or_insert(EXIT_LAUNCH_FAILED);
    }

    /// A timer of the job fired.
    pub(super) fn on_timer(&mut self, timer: Timer) -> Vec<Action> {
        match timer {
            Timer::Timeout => self.on_timeout(),
            Timer::GraceOver if !self.shut_down => Job::terminate().into(),
            Timer::ForceKill => vec![Action::KillServers],
            Timer::GraceOver | Timer::StartupTimeout => Vec::new(),
        }
    }

    /// `--timeout` expired.
    fn on_timeout(&mut self) -> Vec<Action> {
        if self.shut_down {
            return Vec::new();
        }
        let size = self.info.size();
        let mut out = vec![Action::Report(format!(
            "weft run: job timed out after {:.1} s; terminating {} of {size} processes",
            self.policy.timeout.unwrap_or_default().as_secs_f64(),
            size - self.n_exited
        ))];
        self.status_override = Some(EXIT_TIMEOUT);
        self.terminating = true;
        out.extend(Job::terminate());
        out
    }

    /// The launcher received signal `sig`: the job is terminated, at once if it was
    /// already being terminated (a second signal).
    pub(super) fn on_signal(&mut self, sig: i32) -> Vec<Action> {
        self.on_kill(&format!("received {}", signal_name(sig)), 128 + sig)
    }

    /// Someone asked to end the job (`why`): it is terminated, at once if it was already
    /// being terminated, and exits with `status` (unless something decided it before).
    pub(super) fn on_kill(&mut self, why: &str, status: i32) -> Vec<Action> {
        let mut out = vec![Action::Report(format!(
            "weft run: {why}; terminating the job"
        ))];
        self.status_override.get_or_insert(status);
        if self.terminating {
            out.push(Action::SendAll(ToServer::Terminate { grace_ms: 0 }));
        } else {
            self.terminate_once(&mut out);
        }
        out
    }

    /// The timers to arm when the job is launched.
    pub(super) fn timers(&self) -> Vec<Action> {
        self.policy
            .timeout
            .map(|t| Action::Arm(Timer::Timeout, t))
            .into_iter()
            .collect()
    }

    /// The status `weft run` exits with: a launch failure's, the time limit's or a
    /// signal's if one decided it, else the first failing process's (its code, 128+N for
    /// signal N, 127 if it could not be started), else 0.
    pub(super) fn exit_code(&self) -> i32 {
        match (self.status_override, &self.first_failure) {
            (Some(c), _) => c,
            (None, None) => 0,
            (None, Some((_, ExitKind::Code(c)))) => *c,
            (None, Some((_, ExitKind::Signal(s)))) => 128 + s,
            (None, Some((_, ExitKind::SpawnFailed(_)))) => 127,
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
