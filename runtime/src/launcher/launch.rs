//! A launch, decided without IO: the runtime's servers ([`Nodes`]) and the job they run
//! ([`Job`]). Each `on_*` method takes what happened and returns the [`Action`]s for the
//! launcher's loop to execute; that loop owns the sockets, timers and processes.

use std::net::SocketAddr;
use std::time::Duration;

use weft_wireup::{NsId, ProcId};

use super::children::Children;
use super::job::{Action, Job, Timer};
use super::nodes::{Loss, Nodes};
use super::plan::EndPolicy;
use crate::wire::proto::{ExitKind, JobPlan, SpawnReq, ToServer};

/// How long the launcher waits for every node's server to start and report ready.
pub(super) const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// The servers of a launch, the job they run and the jobs its processes spawn.
#[derive(Debug)]
pub(super) struct Launch {
    /// The runtime's part: the servers.
    nodes: Nodes,
    /// The job's plan (spawned jobs take its nodes, environment and sizes).
    plan: JobPlan,
    /// The job's part.
    job: Job,
    /// The jobs its processes spawned.
    children: Children,
    /// Every process of the job ended while spawned ones still ran: the servers are
    /// told to shut down once those have ended too.
    first_over: bool,
    /// The time limit ended the launch after its first job had ended.
    timed_out: bool,
}

impl Launch {
    pub(super) fn new(plan: JobPlan, policy: EndPolicy) -> Launch {
        Launch {
            nodes: Nodes::new(plan.job.num_nodes()),
            job: Job::new(plan.job.clone(), policy),
            plan,
            children: Children::new(),
            first_over: false,
            timed_out: false,
        }
    }

    /// The first job's actions: its end shuts the servers down only once every spawned
    /// job has ended, and its termination is theirs too.
    fn first(&mut self, acts: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::with_capacity(acts.len());
        for a in acts {
            match a {
                Action::SendAll(ToServer::Shutdown) => {
                    self.first_over = true;
                    if self.children.all_over() {
                        out.push(a);
                    }
                }
                Action::SendAll(ToServer::Terminate { .. }) => {
                    self.children.mark_terminating();
                    out.push(a);
                }
                other => out.push(other),
            }
        }
        out
    }

    /// A spawned job's actions: once it and every other job have ended, the servers are
    /// told to shut down.
    fn child(&mut self, mut acts: Vec<Action>) -> Vec<Action> {
        if self.first_over
            && acts
                .iter()
                .any(|a| matches!(a, Action::SendAll(ToServer::EndJob { .. })))
            && self.children.all_over()
        {
            acts.push(Action::SendAll(ToServer::Shutdown));
        }
        acts
    }

    /// Process `from`, on the server of `node`, asks for a new job of `apps` (request
    /// `qid` of that server).
    pub(super) fn on_spawn(
        &mut self,
        node: u32,
        qid: u64,
        from: ProcId,
        req: &SpawnReq,
    ) -> Vec<Action> {
        if self.first_over || self.job.is_terminating() || !self.nodes.started() {
            return vec![Action::SpawnDone {
                node,
                qid,
                result: Err("the runtime is ending; it starts no new job".into()),
            }];
        }
        let n = self.nodes.num_nodes();
        self.children.on_spawn(&self.plan, n, node, qid, from, req)
    }

    /// The server of `node` set spawned job `ns` up (or failed to; `set_up`: the job
    /// exists there all the same).
    pub(super) fn on_launched(
        &mut self,
        node: u32,
        ns: NsId,
        error: Option<String>,
        set_up: bool,
    ) -> Vec<Action> {
        let acts = self.children.on_launched(node, ns, error, set_up);
        self.child(acts)
    }

    /// A timer of spawned job `ns` fired.
    pub(super) fn on_job_timer(&mut self, ns: NsId, timer: Timer) -> Vec<Action> {
        let acts = self.children.on_timer(ns, timer);
        self.child(acts)
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
                let mut out = vec![Action::SendAll(ToServer::Start { peers })];
                let acts = self.job.on_started();
                out.extend(self.first(acts));
                out
            }
            None => Vec::new(),
        }
    }

    /// A server reported how process `proc` ended; a process of a namespace this launch
    /// does not run is logged and ignored.
    pub(super) fn on_proc_exit(&mut self, proc: ProcId, how: ExitKind) -> Vec<Action> {
        if proc.ns == self.plan.ns {
            let acts = self.job.on_proc_exit(proc.rank, how);
            return self.first(acts);
        }
        if !self.children.has(proc.ns) {
            tracing::error!(
                "a server reported the end of {proc}, of a namespace this launch does not \
                 run; ignored"
            );
            return Vec::new();
        }
        let acts = self.children.on_proc_exit(proc.ns, proc.rank, how);
        self.child(acts)
    }

    /// The server of `node` reported that it failed.
    pub(super) fn on_server_failed(&mut self, node: u32, reason: &str) -> Vec<Action> {
        let acts = self.job.on_server_failed(node, reason);
        self.first(acts)
    }

    /// The server of `node` ended: its connection was lost or its process exited (both
    /// are reported; the second report changes nothing).
    pub(super) fn on_server_lost(&mut self, node: u32, reason: &str) -> Vec<Action> {
        match self.nodes.on_lost(node) {
            Loss::First => {
                let mut acts = self.job.on_server_lost(node, reason);
                acts.extend(self.children.on_server_lost(node, reason));
                let acts = self.first(acts);
                self.child(acts)
            }
            Loss::Again => Vec::new(),
        }
    }

    /// A timer fired.
    pub(super) fn on_timer(&mut self, timer: Timer) -> Vec<Action> {
        if timer == Timer::Timeout && self.first_over {
            // The job ended; what it spawned runs on past the time limit.
            let live = self.children.live();
            if live == 0 || self.timed_out {
                return Vec::new();
            }
            self.timed_out = true;
            self.children.mark_terminating();
            return vec![
                Action::Report(format!(
                    "weft run: job timed out after {:.1} s; terminating the processes its \
                     processes spawned",
                    self.job.timeout().unwrap_or_default().as_secs_f64()
                )),
                Action::SendAll(ToServer::Terminate {
                    grace_ms: super::job::KILL_AFTER.as_millis() as u64,
                }),
                Action::Arm(Timer::ForceKill, super::job::FORCE_KILL_AFTER),
            ];
        }
        if timer != Timer::StartupTimeout {
            let acts = self.job.on_timer(timer);
            return self.first(acts);
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
        let acts = self.job.on_signal(sig);
        self.children.mark_terminating();
        self.first(acts)
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
        if self.timed_out {
            return super::EXIT_TIMEOUT;
        }
        self.job.exit_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::job::tests::info;
    use weft_wireup::SpawnApp;

    /// The plan of a job of `n` processes on `nodes` nodes.
    pub(crate) fn plan(nodes: u32, n: u32) -> JobPlan {
        JobPlan {
            job: info(nodes, n),
            ns: NsId::FIRST,
            apps: Vec::new(),
            tag_output: false,
            bind: vec![None; n as usize],
            datastore_bytes: 1 << 20,
            job_id: "t".into(),
            env: Vec::new(),
            pmix: false,
            pmi_preput: None,
            parent: None,
        }
    }

    fn launch(nodes: u32, n: u32) -> Launch {
        Launch::new(
            plan(nodes, n),
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
            vec![Action::SendAll(ToServer::Start {
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
            vec![Action::SendAll(ToServer::Shutdown)]
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
        assert!(matches!(&a[0], Action::SendAll(ToServer::Start { peers }) if peers.len() == 2));
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
        assert!(a.contains(&Action::SendAll(ToServer::Shutdown)), "{a:?}");
        assert_eq!(l.exit_code(), crate::launcher::EXIT_LAUNCH_FAILED);
    }

    /// Spawn `np` processes of `prog` from rank 0 of the launch's job on `node`.
    fn spawn(l: &mut Launch, node: u32, qid: u64, prog: &str, np: u32) -> Vec<Action> {
        let app = SpawnApp {
            program: prog.into(),
            args: vec!["x".into()],
            np,
            env: vec![("K".into(), "V".into())],
            cwd: None,
        };
        let req = SpawnReq {
            apps: vec![app],
            pmi_preput: None,
        };
        l.on_spawn(node, qid, own(0), &req)
    }

    /// The plan the actions send to every server.
    fn launched_plan(acts: &[Action]) -> JobPlan {
        match acts {
            [Action::SendAll(ToServer::Launch(p))] => (**p).clone(),
            other => panic!("expected one launch order, got {other:?}"),
        }
    }

    #[test]
    fn a_spawn_is_planned_sent_to_every_server_and_answered_once_all_set_it_up() {
        let mut l = launch(2, 2);
        start(&mut l, 2);
        let p = launched_plan(&spawn(&mut l, 1, 7, "/bin/child", 3));
        assert_eq!(p.ns, NsId(2));
        assert_eq!(p.job.nspace, format!("{}.2", l.plan.job.nspace));
        assert_eq!(p.job_id, "t.2");
        assert_eq!(
            p.job.nspace,
            format!("weft-{}", p.job_id),
            "segments named alike"
        );
        assert_eq!(p.job.size(), 3);
        assert_eq!(p.job.nodes, l.plan.job.nodes, "every node of the runtime");
        assert!(
            p.job.procs.iter().all(|pr| pr.node == 1),
            "on the asker's node"
        );
        assert_eq!(
            p.job
                .procs
                .iter()
                .map(|pr| pr.local_rank)
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(p.apps[0].env, vec![("K".to_owned(), "V".to_owned())]);
        assert_ne!(p.job.world_pgcid, l.plan.job.world_pgcid);
        // A second spawn gets the next namespace and its own world.
        let q = launched_plan(&spawn(&mut l, 0, 8, "/bin/other", 1));
        assert_eq!(q.ns, NsId(3));
        assert_ne!(q.job.world_pgcid, p.job.world_pgcid);
        // Answered once both servers said so, to the asker's server only.
        assert_eq!(l.on_launched(0, NsId(2), None, true), vec![]);
        assert_eq!(
            l.on_launched(1, NsId(2), None, true),
            vec![Action::SpawnDone {
                node: 1,
                qid: 7,
                result: Ok((NsId(2), p.job.nspace.clone())),
            }]
        );
        assert_eq!(
            l.on_launched(1, NsId(2), None, true),
            vec![],
            "answered once"
        );
    }

    #[test]
    fn a_spawn_a_server_could_not_set_up_fails_naming_it_and_its_job_is_terminated() {
        let mut l = launch(2, 2);
        start(&mut l, 2);
        spawn(&mut l, 0, 4, "/nope", 2);
        assert_eq!(
            l.on_launched(1, NsId(2), Some("rank 0: cannot start /nope".into()), true),
            vec![]
        );
        assert_eq!(
            l.on_launched(0, NsId(2), None, true),
            vec![
                Action::SendAll(ToServer::TerminateJob {
                    ns: NsId(2),
                    grace_ms: 0
                }),
                Action::SpawnDone {
                    node: 0,
                    qid: 4,
                    result: Err("node 1: rank 0: cannot start /nope".into()),
                },
            ]
        );
    }

    #[test]
    fn bad_spawns_are_refused_at_once() {
        let mut l = launch(1, 1);
        let refused = |a: &[Action]| matches!(a, [Action::SpawnDone { result: Err(_), .. }]);
        // Before the job started, no spawn.
        assert!(refused(&spawn(&mut l, 0, 1, "/bin/true", 1)));
        start(&mut l, 1);
        assert!(refused(&spawn(&mut l, 0, 2, "/bin/true", 0)));
        assert!(refused(&spawn(&mut l, 0, 3, "", 1)));
        let none = SpawnReq {
            apps: Vec::new(),
            pmi_preput: None,
        };
        assert!(refused(&l.on_spawn(0, 4, own(0), &none)));
        assert!(refused(&spawn(&mut l, 0, 5, "/bin/true", u32::MAX)));
        // Nothing was planned: the next good spawn is namespace 2.
        assert_eq!(
            launched_plan(&spawn(&mut l, 0, 6, "/bin/true", 1)).ns,
            NsId(2)
        );
    }

    #[test]
    fn the_servers_shut_down_once_the_job_and_what_it_spawned_have_ended() {
        let mut l = launch(1, 2);
        start(&mut l, 1);
        spawn(&mut l, 0, 1, "/bin/child", 2);
        l.on_launched(0, NsId(2), None, true);
        assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
        // The job ends first: the servers stay for its children.
        assert_eq!(l.on_proc_exit(own(1), ExitKind::Code(0)), vec![]);
        let child = |r| ProcId::new(NsId(2), r);
        assert_eq!(l.on_proc_exit(child(0), ExitKind::Code(0)), vec![]);
        assert_eq!(
            l.on_proc_exit(child(1), ExitKind::Code(0)),
            vec![
                Action::SendAll(ToServer::EndJob { ns: NsId(2) }),
                Action::SendAll(ToServer::Shutdown)
            ]
        );
        assert_eq!(l.exit_code(), 0);
        // No spawn once the job has ended.
        assert!(matches!(
            &spawn(&mut l, 0, 2, "/bin/true", 1)[..],
            [Action::SpawnDone { result: Err(_), .. }]
        ));
    }

    #[test]
    fn a_spawned_job_that_fails_is_terminated_alone_and_the_exit_status_stays_the_jobs() {
        let mut l = launch(1, 1);
        start(&mut l, 1);
        spawn(&mut l, 0, 1, "/bin/child", 2);
        l.on_launched(0, NsId(2), None, true);
        let a = l.on_proc_exit(ProcId::new(NsId(2), 1), ExitKind::Code(3));
        assert!(
            matches!(&a[0], Action::Report(s) if s.starts_with("weft run: spawned job ")
                && s.contains(".2: rank 1 (node 0") && s.contains("exited with code 3")),
            "{a:?}"
        );
        assert!(a.contains(&Action::ArmJob(
            NsId(2),
            Timer::GraceOver,
            Duration::from_secs(1)
        )));
        // Its grace ends: only it is terminated.
        assert_eq!(
            l.on_job_timer(NsId(2), Timer::GraceOver),
            vec![
                Action::SendAll(ToServer::TerminateJob {
                    ns: NsId(2),
                    grace_ms: 500
                }),
                Action::ArmJob(
                    NsId(2),
                    Timer::ForceKill,
                    super::super::job::FORCE_KILL_AFTER
                )
            ]
        );
        // Its force-kill backstop kills no server.
        assert_eq!(l.on_job_timer(NsId(2), Timer::ForceKill), vec![]);
        l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Signal(15));
        assert_eq!(
            l.on_proc_exit(own(0), ExitKind::Code(0)),
            vec![Action::SendAll(ToServer::Shutdown)]
        );
        assert_eq!(l.exit_code(), 0, "the first job's status");
    }

    #[test]
    fn the_time_limit_ends_what_the_job_spawned_after_the_job_ended() {
        let mut l = Launch::new(
            plan(1, 1),
            EndPolicy {
                timeout: Some(Duration::from_secs(5)),
                keep_going: false,
                grace: Duration::from_millis(100),
            },
        );
        start(&mut l, 1);
        spawn(&mut l, 0, 1, "/bin/sleeper", 1);
        l.on_launched(0, NsId(2), None, true);
        assert_eq!(l.on_proc_exit(own(0), ExitKind::Code(0)), vec![]);
        let a = l.on_timer(Timer::Timeout);
        assert!(
            matches!(&a[0], Action::Report(s) if s.contains("timed out")),
            "{a:?}"
        );
        assert!(a.contains(&Action::SendAll(ToServer::Terminate { grace_ms: 500 })));
        // Its end after the terminate is no failure of its own.
        assert_eq!(
            l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Signal(15)),
            vec![
                Action::SendAll(ToServer::EndJob { ns: NsId(2) }),
                Action::SendAll(ToServer::Shutdown)
            ]
        );
        assert_eq!(l.exit_code(), crate::launcher::EXIT_TIMEOUT);
    }

    #[test]
    fn a_spawn_waiting_for_a_lost_server_fails_naming_it() {
        let mut l = launch(2, 2);
        start(&mut l, 2);
        spawn(&mut l, 0, 9, "/bin/child", 1);
        assert_eq!(l.on_launched(0, NsId(2), None, true), vec![]);
        let a = l.on_server_lost(1, "eof");
        let done = a.iter().find_map(|a| match a {
            Action::SpawnDone {
                node: 0,
                qid: 9,
                result,
            } => Some(result.clone()),
            _ => None,
        });
        assert_eq!(
            done,
            Some(Err("node 1: the server of node 1 was lost: eof".into())),
            "{a:?}"
        );
    }

    #[test]
    fn a_spawned_job_no_server_could_set_up_ends_and_lets_the_runtime_end() {
        let mut l = launch(1, 1);
        start(&mut l, 1);
        spawn(&mut l, 0, 3, "/bin/child", 2);
        // The datastore could not be made: no process of the job started.
        let a = l.on_launched(0, NsId(2), Some("datastore full".into()), false);
        assert!(
            a.contains(&Action::SpawnDone {
                node: 0,
                qid: 3,
                result: Err("node 0: datastore full".into()),
            }),
            "{a:?}"
        );
        assert!(
            a.contains(&Action::SendAll(ToServer::EndJob { ns: NsId(2) })),
            "{a:?}"
        );
        // The job's end is not held back by it.
        assert_eq!(
            l.on_proc_exit(own(0), ExitKind::Code(0)),
            vec![Action::SendAll(ToServer::Shutdown)]
        );
        // Nor does a late report of it count.
        assert_eq!(
            l.on_proc_exit(ProcId::new(NsId(2), 0), ExitKind::Code(0)),
            vec![]
        );
    }
}
