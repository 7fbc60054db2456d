//! The jobs that processes of a launch spawn (`Client::spawn`), decided without IO: the
//! plan of a new job, its start on every server (the spawn is answered once each said it
//! is set up), and its processes' ends, each child being a [`Job`] of its own whose
//! actions are turned into actions about that job only.

use std::collections::{BTreeMap, BTreeSet};

use weft_wireup::job::{AppInfo, JobInfo, ProcInfo, Pset, PSET_WORLD};
use weft_wireup::{NsId, ProcId};

use super::job::{Action, Job, Timer};
use super::plan::EndPolicy;
use crate::wire::proto::{AppSpec, ExitKind, JobPlan, SpawnReq, ToServer};

/// World PGCIDs of spawned jobs: this plus the namespace id, above the PGCIDs the root
/// server hands out (counted from 2; below 2^22 they start derived id families), so no
/// two jobs' worlds share one. A spawned world's dup and split take PGCIDs from the root
/// server (ids this high start no local family).
pub(super) const CHILD_WORLD_PGCID: u64 = 1 << 22;

/// The most processes one spawn may ask for.
pub(super) const MAX_SPAWN_PROCS: u32 = 1 << 16;

/// A spawned job.
#[derive(Debug)]
struct Child {
    /// Its processes' ends and its end.
    job: Job,
    /// Its namespace's name.
    nspace: String,
    /// While it is being set up: who asked, and the servers that did not answer yet.
    starting: Option<Starting>,
}

/// A spawn waiting for the servers.
#[derive(Debug)]
struct Starting {
    /// The server of the process that asked.
    node: u32,
    /// That server's request id.
    qid: u64,
    /// The servers that have not said the job is set up.
    waiting: BTreeSet<u32>,
    /// The first failure a server reported.
    error: Option<String>,
}

/// The spawned jobs of a launch.
#[derive(Debug, Default)]
pub(super) struct Children {
    jobs: BTreeMap<NsId, Child>,
    /// The next namespace id (the launch's own job is `NsId::FIRST`).
    next: u32,
}

impl Children {
    pub(super) fn new() -> Children {
        Children {
            jobs: BTreeMap::new(),
            next: NsId::FIRST.0 + 1,
        }
    }

    /// Process `from` (on the server of `node`, request `qid`) asks for a job of `apps`
    /// in a launch of `num_nodes` servers whose first job is `base`: its plan goes to every
    /// server. A request that cannot be served is answered at once.
    pub(super) fn on_spawn(
        &mut self,
        base: &JobPlan,
        num_nodes: u32,
        node: u32,
        qid: u64,
        from: ProcId,
        req: &SpawnReq,
    ) -> Vec<Action> {
        let apps = &req.apps;
        let refuse = |why: String| {
            vec![Action::SpawnDone {
                node,
                qid,
                result: Err(why),
            }]
        };
        let total = apps.iter().try_fold(0u32, |t, a| t.checked_add(a.np));
        match total {
            _ if apps.is_empty() => return refuse("no app to start".into()),
            _ if apps.iter().any(|a| a.np == 0 || a.program.is_empty()) => {
                return refuse("every app needs a program and at least one process".into())
            }
            Some(t) if t <= MAX_SPAWN_PROCS => {}
            _ => {
                return refuse(format!(
                    "more than {MAX_SPAWN_PROCS} processes in one spawn (MAX_SPAWN_PROCS)"
                ))
            }
        }
        if node >= num_nodes {
            return refuse(format!("no server of node {node}"));
        }
        let parent = if from.ns == base.ns {
            base.job.nspace.clone()
        } else {
            match self.jobs.get(&from.ns) {
                Some(c) => c.nspace.clone(),
                None => return refuse(format!("{from} is of no job of this runtime")),
            }
        };
        let ns = NsId(self.next);
        self.next += 1;
        let mut plan = child_plan(base, ns, node, req);
        plan.parent = Some((from, parent));
        tracing::debug!(
            "{from} spawns {} ({} processes)",
            plan.job.nspace,
            plan.job.size()
        );
        self.jobs.insert(
            ns,
            Child {
                job: Job::new(plan.job.clone(), child_policy()),
                nspace: plan.job.nspace.clone(),
                starting: Some(Starting {
                    node,
                    qid,
                    waiting: (0..num_nodes).collect(),
                    error: None,
                }),
            },
        );
        vec![Action::SendAll(ToServer::Launch(Box::new(plan)))]
    }

    /// The server of `node` set job `ns` up (or failed to: `error`); once every server
    /// answered, the spawn is answered, and a failed job is terminated. A server that did
    /// not set the job up (`!set_up`) starts none of its processes there: they count as
    /// ended.
    pub(super) fn on_launched(
        &mut self,
        node: u32,
        ns: NsId,
        error: Option<String>,
        set_up: bool,
    ) -> Vec<Action> {
        let mut out = if set_up {
            Vec::new()
        } else {
            self.on_job(ns, |j| j.on_node_not_started(node))
        };
        let Some(child) = self.jobs.get_mut(&ns) else {
            tracing::warn!("the server of node {node} launched {ns}, which is no spawned job");
            return out;
        };
        let Some(st) = child.starting.as_mut() else {
            return out;
        };
        st.waiting.remove(&node);
        if let Some(e) = error {
            st.error.get_or_insert(format!("node {node}: {e}"));
        }
        if !st.waiting.is_empty() {
            return out;
        }
        let st = child.starting.take().expect("checked above");
        let result = match st.error {
            None => Ok((ns, child.nspace.clone())),
            Some(e) => {
                child.job.mark_terminating();
                out.push(Action::SendAll(ToServer::TerminateJob { ns, grace_ms: 0 }));
                Err(e)
            }
        };
        out.push(Action::SpawnDone {
            node: st.node,
            qid: st.qid,
            result,
        });
        self.prune(ns);
        out
    }

    /// Forgets job `ns` once it has ended and its spawn was answered.
    fn prune(&mut self, ns: NsId) {
        if self
            .jobs
            .get(&ns)
            .is_some_and(|c| c.job.is_over() && c.starting.is_none())
        {
            self.jobs.remove(&ns);
        }
    }

    /// Whether `ns` is a spawned job that has not ended.
    pub(super) fn has(&self, ns: NsId) -> bool {
        self.jobs.contains_key(&ns)
    }

    /// Process `rank` of spawned job `ns` ended as `how`.
    pub(super) fn on_proc_exit(&mut self, ns: NsId, rank: u32, how: ExitKind) -> Vec<Action> {
        self.on_job(ns, |j| j.on_proc_exit(rank, how))
    }

    /// A timer of spawned job `ns` fired.
    pub(super) fn on_timer(&mut self, ns: NsId, timer: Timer) -> Vec<Action> {
        self.on_job(ns, |j| j.on_timer(timer))
    }

    /// The server of `node` is gone: the spawned jobs' processes there count as ended
    /// (the launch's own job reports the loss; theirs would say the same), and a spawn
    /// waiting for that server's answer fails.
    pub(super) fn on_server_lost(&mut self, node: u32, reason: &str) -> Vec<Action> {
        let ids: Vec<NsId> = self.jobs.keys().copied().collect();
        let mut out = Vec::new();
        for &ns in &ids {
            let waits = self.jobs[&ns]
                .starting
                .as_ref()
                .is_some_and(|st| st.waiting.contains(&node));
            if waits {
                let why = format!("the server of node {node} was lost: {reason}");
                out.extend(self.on_launched(node, ns, Some(why), true));
            }
        }
        for ns in ids {
            let acts = self.on_job(ns, |j| j.on_server_lost(node, reason));
            out.extend(acts.into_iter().filter(|a| !matches!(a, Action::Report(_))));
        }
        out
    }

    /// Every spawned job is being terminated with the launch (its end, a signal, the
    /// time limit): their processes' ends are no failures of theirs.
    pub(super) fn mark_terminating(&mut self) {
        for c in self.jobs.values_mut() {
            c.job.mark_terminating();
        }
    }

    /// Whether every spawned job has ended.
    pub(super) fn all_over(&self) -> bool {
        self.jobs.values().all(|c| c.job.is_over())
    }

    /// How many processes of spawned jobs still run.
    pub(super) fn live(&self) -> usize {
        self.jobs
            .values()
            .filter(|c| !c.job.is_over())
            .map(|c| c.job.info().size() as usize)
            .sum()
    }

    /// Runs `f` on job `ns` and turns its actions into actions about that job.
    fn on_job(&mut self, ns: NsId, f: impl FnOnce(&mut Job) -> Vec<Action>) -> Vec<Action> {
        let Some(child) = self.jobs.get_mut(&ns) else {
            return Vec::new();
        };
        let acts = f(&mut child.job);
        let nspace = child.nspace.clone();
        self.prune(ns);
        acts.into_iter()
            .filter_map(|a| match a {
                Action::Report(line) => {
                    Some(Action::Report(match line.strip_prefix("weft run: ") {
                        Some(rest) => format!("weft run: spawned job {nspace}: {rest}"),
                        None => line,
                    }))
                }
                Action::SendAll(ToServer::Terminate { grace_ms }) => {
                    Some(Action::SendAll(ToServer::TerminateJob { ns, grace_ms }))
                }
                Action::SendAll(ToServer::Shutdown) => {
                    Some(Action::SendAll(ToServer::EndJob { ns }))
                }
                Action::Arm(t, d) => Some(Action::ArmJob(ns, t, d)),
                // The servers kill what a job's terminate did not: the runtime's own
                // backstop is its first job's.
                Action::KillServers => None,
                other => Some(other),
            })
            .collect()
    }
}

/// The policy of a spawned job: a failing process terminates its job after a second.
fn child_policy() -> EndPolicy {
    EndPolicy {
        timeout: None,
        keep_going: false,
        grace: std::time::Duration::from_secs(1),
    }
}

/// The plan of spawned job `ns`: `apps` on the node of the process that asked (every
/// server knows the job; the others run none of its processes), the first job's
/// environment, datastore size, output tagging and PMIx choice.
pub(super) fn child_plan(base: &JobPlan, ns: NsId, node: u32, req: &SpawnReq) -> JobPlan {
    let apps = &req.apps;
    let mut procs = Vec::new();
    let mut infos = Vec::new();
    let mut specs = Vec::new();
    for (a, app) in apps.iter().enumerate() {
        let first_rank = procs.len() as u32;
        infos.push(AppInfo {
            size: app.np,
            first_rank,
            program: app.program.clone(),
            pset: None,
        });
        specs.push(AppSpec {
            program: app.program.clone(),
            args: app.args.clone(),
            cwd: app.cwd.clone(),
            env: app.env.clone(),
        });
        for _ in 0..app.np {
            procs.push(ProcInfo {
                node,
                local_rank: procs.len() as u32,
                app: a as u32,
                cpuset: None,
                locality: None,
            });
        }
    }
    let total = procs.len() as u32;
    let job = JobInfo {
        nspace: format!("{}.{}", base.job.nspace, ns.0),
        nodes: base.job.nodes.clone(),
        procs,
        apps: infos,
        psets: vec![Pset {
            name: PSET_WORLD.into(),
            members: (0..total).collect(),
        }],
        world_pgcid: CHILD_WORLD_PGCID + u64::from(ns.0),
    };
    JobPlan {
        job,
        ns,
        apps: specs,
        tag_output: base.tag_output,
        bind: vec![None; total as usize],
        datastore_bytes: base.datastore_bytes,
        // The processes name their segments from the nspace (`weft-<job_id>...`), the
        // servers from the job id: both `<job_id>.<id>` (a `.` no job id of `weft run`
        // has, so no job's names are another's).
        job_id: format!("{}.{}", base.job_id, ns.0),
        env: base.env.clone(),
        pmix: base.pmix,
        pmi_preput: req.pmi_preput.clone(),
        parent: None,
    }
}
