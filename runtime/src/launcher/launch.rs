//! A launch, decided without IO: the runtime's servers ([`Nodes`]) and the job they run
//! ([`Job`]). Each `on_*` method takes what happened and returns the [`Action`]s for the
//! launcher's loop to execute; that loop owns the sockets, timers and processes.

use std::net::SocketAddr;
use std::time::Duration;

use weft_wireup::job::JobInfo;
use weft_wireup::{NsId, ProcId};

use super::job::{Action, Job, Order, Timer};
use super::nodes::{Loss, Nodes};
use super::plan::EndPolicy;
use crate::wire::proto::ExitKind;

/// How long the launcher waits for every node's server to start and report ready.
pub(super) const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// The servers of a launch and the job they run.
#[derive(Debug)]
pub(super) struct Launch {
    /// The runtime's part: the servers.
    nodes: Nodes,
    /// The job's namespace (its servers' reports name it).
    ns: NsId,
    /// The job's part.
    job: Job,
}

impl Launch {
    pub(super) fn new(ns: NsId, info: JobInfo, policy: EndPolicy) -> Launch {
        Launch {
            nodes: Nodes::new(info.num_nodes()),
            ns,
            job: Job::new(info, policy),
        }
    }

    /// The timers to arm as the servers are started.
    pub(super) fn timers(&self) -> Vec<Action> {
        let mut out = vec![Action::Arm(Timer::StartupTimeout, SERVER_START_TIMEOUT)];
        out.extend(self.job.timers());
        out
    }

    /// The server of `node` said hello: it gets the plan.
    pub(super) fn on_hello(&mut self, node: u32) -> Vec<Action> {
        self.nodes.on_hello(node);
        vec![Action::SendPlan(node)]
    }

    /// The server of `node` is ready; the last one to be starts the job.
    pub(super) fn on_ready(&mut self, node: u32, peer_addr: SocketAddr) -> Vec<Action> {
        match self.nodes.on_ready(node, peer_addr) {
            Some(peers) => {
                let mut out = vec![Action::SendAll(Order::Start { peers })];
                out.extend(self.job.on_started());
                out
            }
            None => Vec::new(),
        }
    }

    /// Process `rank` ended as `how`.
    /// A server reported how process `proc` ended; a process of another namespace than
    /// the job's is no process of this launch (logged and ignored).
    pub(super) fn on_proc_exit(&mut self, proc: ProcId, how: ExitKind) -> Vec<Action> {
        if proc.ns != self.ns {
            tracing::error!(
                "a server reported the end of {proc}, of a namespace this launch does not \
                 run (it runs {}); ignored",
                self.ns
            );
            return Vec::new();
        }
        self.job.on_proc_exit(proc.rank, how)
    }

    /// The server of `node` reported that it failed.
    pub(super) fn on_server_failed(&mut self, node: u32, reason: &str) -> Vec<Action> {
        self.job.on_server_failed(node, reason)
    }

    /// The server of `node` ended: its connection was lost or its process exited (both
    /// are reported; the second report changes nothing).
    pub(super) fn on_server_lost(&mut self, node: u32, reason: &str) -> Vec<Action> {
        match self.nodes.on_lost(node) {
            Loss::First => self.job.on_server_lost(node, reason),
            Loss::Again => Vec::new(),
        }
    }

    /// A timer fired.
    pub(super) fn on_timer(&mut self, timer: Timer) -> Vec<Action> {
        if timer != Timer::StartupTimeout {
            return self.job.on_timer(timer);
        }
        let Some(ready) = self.nodes.on_startup_timeout() else {
            return Vec::new();
        };
        self.job.on_launch_failed();
        vec![
            Action::Report(format!(
                "weft run: only {ready} of {} servers started within {} s \
                 (SERVER_START_TIMEOUT); giving up",
                self.nodes.num_nodes(),
                SERVER_START_TIMEOUT.as_secs()
            )),
            Action::KillServers,
        ]
    }

    /// The launcher received signal `sig`.
    pub(super) fn on_signal(&mut self, sig: i32) -> Vec<Action> {
        self.job.on_signal(sig)
    }

    /// Whether the job was started on every server.
    pub(super) fn started(&self) -> bool {
        self.nodes.started()
    }

    /// Whether the launch is over: every server has ended.
    pub(super) fn is_over(&self) -> bool {
        self.nodes.all_gone()
    }

    /// The status `weft run` exits with (see [`Job::exit_code`]).
    pub(super) fn exit_code(&self) -> i32 {
        self.job.exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::job::tests::info;

    fn launch(nodes: u32, n: u32) -> Launch {
        Launch::new(
            NsId::FIRST,
            info(nodes, n),
            EndPolicy {
                timeout: None,
                keep_going: false,
                grace: Duration::from_millis(100),
            },
        )
    }

    /// Rank `r` of the launch's job.
    fn own(r: u32) -> ProcId {
        ProcId::new(NsId::FIRST, r)
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn start(l: &mut Launch, nodes: u32) -> Vec<Action> {
        let mut out = Vec::new();
        for node in 0..nodes {
            assert_eq!(l.on_hello(node), vec![Action::SendPlan(node)]);
        }
        for node in 0..nodes {
            out.extend(l.on_ready(node, addr(10 + node as u16)));
        }
        out
    }

    #[test]
    fn a_job_that_ends_well_starts_once_shuts_down_and_is_over_when_every_server_is_gone() {
        let mut l = launch(2, 2);
        assert_eq!(
            l.timers(),
            vec![Action::Arm(Timer::StartupTimeout, SERVER_START_TIMEOUT)]
        );
        assert_eq!(
            start(&mut l, 2),
            vec![Action::SendAll(Order::Start {
                peers: vec![addr(10), addr(11)]
            })]
        );
        assert!(l.started());
        assert_eq!(l.on_timer(Timer::StartupTimeout), vec![]);
        assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
        // Rank 1 of another namespace is not the job's rank 1: the job goes on.
        let other = ProcId::new(NsId(2), 1);
        assert_eq!(l.on_proc_exit(other, ExitKind::Code(0)), vec![]);
        assert_eq!(
            l.on_proc_exit(own(1), ExitKind::Code(0)),
            vec![Action::SendAll(Order::Shutdown)]
        );
        // The servers then end: each reports twice (connection, process), silently.
        for node in 0..2 {
            assert!(!l.is_over());
            assert_eq!(l.on_server_lost(node, "eof"), vec![]);
            assert_eq!(l.on_server_lost(node, "exit status: 0"), vec![]);
        }
        assert!(l.is_over());
        assert_eq!(l.exit_code(), 0);
    }

    #[test]
    fn a_server_lost_before_hello_fails_the_launch_once_and_the_others_are_terminated() {
        let mut l = launch(2, 2);
        let a = l.on_server_lost(1, "exit status: 127");
        assert_eq!(a.len(), 3, "{a:?}");
        assert!(matches!(&a[0], Action::Report(s) if s.contains("node 1") && s.contains("127")));
        assert_eq!(l.on_server_lost(1, "exit status: 127"), vec![]);
        // Node 0 still comes up: it is started, and told to terminate at once.
        assert_eq!(l.on_hello(0), vec![Action::SendPlan(0)]);
        let a = l.on_ready(0, addr(10));
        assert!(matches!(&a[0], Action::SendAll(Order::Start { peers }) if peers.len() == 2));
        assert!(a.contains(&Action::Arm(
            Timer::ForceKill,
            super::super::job::FORCE_KILL_AFTER
        )));
        assert!(!l.is_over());
        l.on_server_lost(0, "eof");
        assert!(l.is_over());
        assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
    }

    #[test]
    fn the_startup_timeout_kills_the_servers_and_exits_1_only_before_the_start() {
        let mut l = launch(3, 3);
        l.on_hello(0);
        l.on_ready(0, addr(10));
        let a = l.on_timer(Timer::StartupTimeout);
        assert_eq!(
            a,
            vec![
                Action::Report(
                    "weft run: only 1 of 3 servers started within 60 s (SERVER_START_TIMEOUT); giving up"
                        .into()
                ),
                Action::KillServers,
            ]
        );
        assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
        let mut ok = launch(1, 1);
        start(&mut ok, 1);
        assert_eq!(ok.on_timer(Timer::StartupTimeout), vec![]);
        assert_eq!(ok.exit_code(), 0);
    }

    #[test]
    fn a_server_lost_after_the_start_ends_its_ranks_and_the_job_ends_when_the_rest_have() {
        let mut l = launch(2, 4);
        start(&mut l, 2);
        l.on_proc_exit(own(0), ExitKind::Code(0));
        l.on_proc_exit(own(1), ExitKind::Code(0));
        let a = l.on_server_lost(1, "connection reset");
        // Node 1's ranks (2, 3) count as ended: every process has, so shut down now.
        assert!(a.contains(&Action::SendAll(Order::Shutdown)), "{a:?}");
        assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
    }
}
