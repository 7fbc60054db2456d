//! The jobs that processes of a launch spawn (`Client::spawn`), decided without IO: the
//! plan of a new job, its start on every server (the spawn is answered once each said it
//! is set up), and its processes' ends, each child being a [`Job`] of its own whose
//! actions are turned into actions about that job only.

use std::collections::{BTreeMap, BTreeSet};

use weft_wireup::job::{AppInfo, JobInfo, ProcInfo, Pset, PSET_WORLD};
use weft_wireup::{NsId, ProcId};

use super::job::{Action, Job, Timer};
use super::plan::EndPolicy;
use crate::wire::proto::{AppSpec, ExitKind, FromController, JobPlan, SpawnReq, ToServer};

/// World PGCIDs of spawned jobs: this plus the namespace id, above the PGCIDs the root
/// server hands out (counted from 2; below 2^22 they start derived id families), so no
/// two jobs' worlds share one. A spawned world's dup and split take PGCIDs from the root
/// server (ids this high start no local family).
pub(super) const CHILD_WORLD_PGCID: u64 = 1 << 22;

/// The most processes one spawn may ask for.
pub(super) const MAX_SPAWN_PROCS: u32 = 1 << 16;

/// A spawned job, or one submitted to a persistent runtime.
#[derive(Debug)]
struct Child {
    /// Its processes' ends and its end.
    job: Job,
    /// Its namespace's name.
    nspace: String,
    /// While it is being set up: who asked, and the servers that did not answer yet.
    starting: Option<Starting>,
    /// Its plan (the jobs it spawns take its environment, output and PMIx choices).
    plan: std::sync::Arc<JobPlan>,
    /// The submitter whose job this is, or whose job spawned it (its output and reports
    /// go there).
    owner: Option<u64>,
    /// Submitted (`weft run --dvm`), not spawned: its end is told to its owner.
    submitted: bool,
    /// What runs, for `weft ps`: the first app's program and arguments.
    command: String,
    /// The session it runs in (it ends with it), if not the runtime's.
    session: Option<u32>,
    /// Spawned with `PMIX_SPAWN_CHILD_SEP`: not terminated with its parent's job.
    separate: bool,
    /// What its asker asked to be told of it (its end, its output), and the tool that
    /// asked, if a tool did.
    told: Told,
}

/// What a spawn's asker asked to be told of the job, beyond the spawn's answer.
#[derive(Debug, Default)]
struct Told {
    /// The PMIx tool that spawned it, if a tool did.
    tool: Option<String>,
    /// Who hears of its end (`PMIX_NOTIFY_COMPLETION`): the server of that node, for
    /// this process or tool.
    end: Option<(u32, (String, u32))>,
    /// The server of the tool that asked for the job's stdout and stderr (`PMIX_FWD_*`),
    /// and which of the two.
    output: Option<(u32, bool, bool)>,
}

/// Who asks for a spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Requester {
    /// A process of a job of the runtime.
    Process(ProcId),
    /// A PMIx tool (namespace, rank), not of any job.
    Tool(String, u32),
}

/// Who asked for a job that is being set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asker {
    /// A process, through the server of `node` (that server's request `qid`).
    Process { node: u32, qid: u64 },
    /// Submitter `sub` of a persistent runtime.
    Submitter(u64),
}

/// A spawn waiting for the servers.
#[derive(Debug)]
struct Starting {
    asker: Asker,
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
    /// Submitters whose job ended (with this status) while jobs it spawned still run: they
    /// are told once those have ended too, as `weft run` waits for them.
    ended: BTreeMap<u64, i32>,
}

impl Children {
    pub(super) fn new() -> Children {
        Children {
            jobs: BTreeMap::new(),
            next: NsId::FIRST.0 + 1,
            ended: BTreeMap::new(),
        }
    }

    /// Process `from` (on the server of `node`, request `qid`) asks for a job of `apps`
    /// (in `session`: its id and nodes; else continuing after the parent's last node)
    /// in a launch of `num_nodes` servers whose first job is `base`: its plan goes to every
    /// server. A request that cannot be served is answered at once.
    pub(super) fn on_spawn(
        &mut self,
        base: &JobPlan,
        num_nodes: u32,
        (node, qid): (u32, u64),
        from: Requester,
        req: &SpawnReq,
        session: Option<(u32, Vec<u32>)>,
    ) -> Vec<Action> {
        let refuse = |why: String| {
            vec![Action::SpawnDone {
                node,
                qid,
                result: Err(why),
            }]
        };
        let mut req = req.clone();
        let on = match self.per_node(base, num_nodes, &mut req, &session) {
            Ok(on) => on,
            Err(why) => return refuse(why),
        };
        let apps = &req.apps;
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
        let total = apps.iter().map(|a| a.np).sum();
        let (parent, asker_name) = match &from {
            Requester::Process(from) => {
                let parent = if from.ns == base.ns {
                    base.job.nspace.clone()
                } else {
                    match self.jobs.get(&from.ns) {
                        Some(c) => c.nspace.clone(),
                        None => return refuse(format!("{from} is of no job of this runtime")),
                    }
                };
                let name = (parent.clone(), from.rank);
                (Some((*from, parent)), name)
            }
            Requester::Tool(nspace, rank) => (None, (nspace.clone(), *rank)),
        };
        let on = match (on, &session, &parent) {
            (Some(on), _, _) => on,
            (None, Some((_, nodes)), _) => blocks(nodes, total),
            (None, None, Some((from, _))) => {
                let parent_job = match self.jobs.get(&from.ns) {
                    Some(c) => &c.plan.job,
                    None => &base.job,
                };
                continuing(parent_job, node, total)
            }
            // A tool's job spreads over the runtime's nodes.
            (None, None, None) => blocks(&(0..num_nodes).collect::<Vec<_>>(), total),
        };
        let ns = self.next_ns();
        let mut plan = child_plan(base, ns, &on, &req);
        let parent_ns = parent.as_ref().map(|(p, _)| p.ns);
        plan.parent = parent;
        let owner = parent_ns
            .and_then(|p| self.jobs.get(&p))
            .and_then(|c| c.owner);
        if let Some(p) = parent_ns
            .and_then(|p| self.jobs.get(&p))
            .map(|c| c.plan.clone())
        {
            // What the parent's processes got, its children get.
            plan.env = p.env.clone();
            plan.tag_output = p.tag_output;
            plan.pmix = p.pmix;
            plan.forward_output = p.forward_output;
            plan.datastore_bytes = p.datastore_bytes;
        }
        // A tool gets the output it asked for through the launcher.
        if matches!(from, Requester::Tool(..))
            && (req.debug.forward_stdout || req.debug.forward_stderr)
        {
            plan.forward_output = true;
        }
        tracing::debug!(
            "{from:?} spawns {} ({} processes)",
            plan.job.nspace,
            plan.job.size()
        );
        let asker = Asker::Process { node, qid };
        let out = self.insert(plan, child_policy(), asker, owner, num_nodes);
        if let Some(c) = self.jobs.get_mut(&ns) {
            c.session = session.map(|(id, _)| id);
            c.separate = req.separate;
            c.told.end = req.debug.notify_completion.then_some((node, asker_name));
            if let Requester::Tool(t, _) = from {
                c.told.tool = Some(t);
                let d = &req.debug;
                if d.forward_stdout || d.forward_stderr {
                    c.told.output = Some((node, d.forward_stdout, d.forward_stderr));
                }
            }
        }
        out
    }

    /// The running jobs that processes of job `ns` spawned without separating them.
    pub(super) fn children_of(&self, ns: NsId) -> Vec<NsId> {
        (self.jobs.iter())
            .filter(|(_, c)| {
                !c.separate
                    && !c.job.is_over()
                    && !c.job.is_terminating()
                    && c.plan.parent.as_ref().is_some_and(|(p, _)| p.ns == ns)
            })
            .map(|(&ns, _)| ns)
            .collect()
    }

    /// The session job `ns` runs in, if not the runtime's.
    pub(super) fn session_of(&self, ns: NsId) -> Option<u32> {
        self.jobs.get(&ns).and_then(|c| c.session)
    }

    /// The jobs that run in session `id`.
    pub(super) fn in_session(&self, id: u32) -> Vec<NsId> {
        (self.jobs.iter())
            .filter(|(_, c)| c.session == Some(id) && !c.job.is_over())
            .map(|(&ns, _)| ns)
            .collect()
    }

    /// The placement of a spawn of processes per node (debugger daemons, `ppr:N:node`):
    /// that many on every node of the debugged job, else of the session or the runtime,
    /// whatever its one app asked (its count is set here); `None` for any other spawn.
    fn per_node(
        &self,
        base: &JobPlan,
        num_nodes: u32,
        req: &mut SpawnReq,
        session: &Option<(u32, Vec<u32>)>,
    ) -> Result<Option<Vec<u32>>, String> {
        let d = &req.debug;
        let nodes = match (&d.daemons_for, d.per_node) {
            (Some(target), _) => (self.nodes_of(base, target))
                .ok_or_else(|| format!("no job {target} runs here to debug"))?,
            (None, Some(_)) => match session {
                Some((_, nodes)) => nodes.clone(),
                None => (0..num_nodes).collect(),
            },
            (None, None) => return Ok(None),
        };
        if req.apps.len() != 1 {
            return Err(
                "processes per node (debugger daemons, PMIX_MAPBY ppr:N:node) need \
                        exactly one app"
                    .into(),
            );
        }
        let k = d.per_node.unwrap_or(1).min(MAX_SPAWN_PROCS);
        let placed: Vec<u32> = (nodes.iter())
            .flat_map(|&n| std::iter::repeat_n(n, k as usize))
            .collect();
        req.apps[0].np = u32::try_from(placed.len()).unwrap_or(u32::MAX);
        Ok(Some(placed))
    }

    /// The nodes job `nspace` (this launch's first, `base`, or a later one) has
    /// processes on, ascending.
    fn nodes_of(&self, base: &JobPlan, nspace: &str) -> Option<Vec<u32>> {
        let job = if base.job.nspace == nspace {
            &base.job
        } else {
            &(self.jobs.values().find(|c| c.nspace == nspace))?.plan.job
        };
        let nodes: BTreeSet<u32> = job.procs.iter().map(|p| p.node).collect();
        Some(nodes.into_iter().collect())
    }

    /// The next namespace id.
    pub(super) fn next_ns(&mut self) -> NsId {
        let ns = NsId(self.next);
        self.next += 1;
        ns
    }

    /// Submitter `sub` asks for job `plan` (planned with [`next_ns`](Self::next_ns)):
    /// it goes to every server, and the submitter hears of it once each set it up.
    pub(super) fn on_submit(
        &mut self,
        sub: u64,
        plan: JobPlan,
        (policy, session): (EndPolicy, Option<u32>),
        num_nodes: u32,
    ) -> Vec<Action> {
        let ns = plan.ns;
        let out = self.insert(plan, policy, Asker::Submitter(sub), Some(sub), num_nodes);
        if let Some(c) = self.jobs.get_mut(&ns) {
            c.session = session;
        }
        out
    }

    /// Records job `plan` as being set up and sends it to every server.
    fn insert(
        &mut self,
        plan: JobPlan,
        policy: EndPolicy,
        asker: Asker,
        owner: Option<u64>,
        num_nodes: u32,
    ) -> Vec<Action> {
        let command = plan
            .apps
            .first()
            .map(|a| {
                let mut c = a.program.clone();
                for arg in &a.args {
                    c.push(' ');
                    c.push_str(arg);
                }
                c
            })
            .unwrap_or_default();
        let plan = std::sync::Arc::new(plan);
        self.jobs.insert(
            plan.ns,
            Child {
                job: Job::new(plan.job.clone(), policy),
                nspace: plan.job.nspace.clone(),
                starting: Some(Starting {
                    asker,
                    waiting: (0..num_nodes).collect(),
                    error: None,
                }),
                plan: plan.clone(),
                owner,
                submitted: matches!(asker, Asker::Submitter(_)),
                command,
                session: None,
                separate: false,
                told: Told::default(),
            },
        );
        vec![Action::SendAll(ToServer::Launch(Box::new((*plan).clone())))]
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
                child.job.on_launch_failed();
                out.push(Action::SendAll(ToServer::TerminateJob { ns, grace_ms: 0 }));
                Err(e)
            }
        };
        match st.asker {
            Asker::Process { node, qid } => out.push(Action::SpawnDone { node, qid, result }),
            Asker::Submitter(sub) => match result {
                Ok((ns, nspace)) => {
                    out.push(Action::Tell(sub, FromController::Accepted { ns, nspace }));
                    // Its time limit counts from now.
                    let timers = child.job.timers();
                    out.extend(timers.into_iter().map(|a| match a {
                        Action::Arm(t, d) => Action::ArmJob(ns, t, d),
                        other => other,
                    }));
                }
                Err(e) => out.push(Action::Tell(
                    sub,
                    FromController::Report(format!("weft run: the job could not start: {e}")),
                )),
            },
        }
        // A job that ended before every server answered (none of its processes started)
        // is told now.
        if child.job.is_over() {
            if let (true, Some(sub)) = (child.submitted, child.owner) {
                self.ended.insert(sub, child.job.exit_code());
            }
        }
        self.prune(ns);
        out.extend(self.tell_ends());
        out
    }

    /// Tells the submitters whose job ended, once every job they own has.
    fn tell_ends(&mut self) -> Vec<Action> {
        let jobs = &self.jobs;
        let done: Vec<u64> = (self.ended.keys())
            .filter(|&&sub| {
                !jobs
                    .values()
                    .any(|c| c.owner == Some(sub) && !c.job.is_over())
            })
            .copied()
            .collect();
        done.into_iter()
            .filter_map(|sub| self.ended.remove(&sub).map(|code| (sub, code)))
            .map(|(sub, code)| Action::Tell(sub, FromController::JobEnd { code }))
            .collect()
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

    /// The namespace name of job `ns`, if it runs.
    pub(super) fn nspace_of(&self, ns: NsId) -> Option<String> {
        self.jobs.get(&ns).map(|c| c.nspace.clone())
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
            // Only the jobs with processes there fail (a job running elsewhere goes on).
            let here = self
                .jobs
                .get(&ns)
                .is_some_and(|c| !c.job.info().ranks_on(node).is_empty());
            if !here {
                continue;
            }
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
        let (owner, submitted) = (child.owner, child.submitted);
        let notify = child.told.end.clone();
        let told_end = submitted && child.starting.is_none();
        let code = child.job.exit_code();
        self.prune(ns);
        let mut out = Vec::with_capacity(acts.len());
        for a in acts {
            match a {
                Action::Report(line) => {
                    let line = match (submitted, line.strip_prefix("weft run: ")) {
                        (false, Some(rest)) => format!("weft run: spawned job {nspace}: {rest}"),
                        _ => line,
                    };
                    out.push(match owner {
                        Some(sub) => Action::Tell(sub, FromController::Report(line)),
                        None => Action::Report(line),
                    });
                }
                Action::SendAll(ToServer::Terminate { grace_ms }) => {
                    out.push(Action::SendAll(ToServer::TerminateJob { ns, grace_ms }))
                }
                Action::SendAll(ToServer::Shutdown) => {
                    out.push(Action::SendAll(ToServer::EndJob { ns }));
                    if let Some((node, to)) = notify.clone() {
                        let nspace = nspace.clone();
                        out.push(Action::Send(
                            node,
                            ToServer::JobTerminated { to, nspace, code },
                        ));
                    }
                    if let (true, Some(sub)) = (told_end, owner) {
                        self.ended.insert(sub, code);
                    }
                }
                Action::Arm(t, d) => out.push(Action::ArmJob(ns, t, d)),
                // The servers kill what a job's terminate did not: the runtime's own
                // backstop is its first job's.
                Action::KillServers => {}
                other => out.push(other),
            }
        }
        if owner.is_some() {
            out.extend(self.tell_ends());
        }
        out
    }

    /// The server of the tool that gets job `ns`'s stderr (or stdout), and the job's
    /// namespace, if a tool asked for it.
    pub(super) fn output_tool(&self, ns: NsId, stderr: bool) -> Option<(u32, String)> {
        let c = self.jobs.get(&ns)?;
        let (node, out, err) = c.told.output?;
        (if stderr { err } else { out }).then(|| (node, c.nspace.clone()))
    }

    /// Where output of job `ns` goes: its owner, if it has one still there.
    pub(super) fn owner_of(&self, ns: NsId) -> Option<u64> {
        self.jobs.get(&ns).and_then(|c| c.owner)
    }

    /// Submitter `sub` left: the jobs it owns (its job and what that spawned) are
    /// terminated, and their output and reports go to the launcher's own.
    pub(super) fn on_owner_gone(&mut self, sub: u64) -> Vec<Action> {
        let ids: Vec<NsId> = (self.jobs.iter())
            .filter(|(_, c)| c.owner == Some(sub))
            .map(|(&ns, _)| ns)
            .collect();
        self.ended.remove(&sub);
        let mut out = Vec::new();
        for ns in ids {
            if let Some(c) = self.jobs.get_mut(&ns) {
                c.owner = None;
            }
            out.extend(self.on_job(ns, |j| {
                if j.is_over() {
                    Vec::new()
                } else {
                    j.on_kill("its submitter is gone", 128 + 1)
                }
            }));
        }
        out
    }

    /// The job submitter `sub` submitted (not the ones it spawned), if it runs.
    pub(super) fn submitted_by(&self, sub: u64) -> Option<NsId> {
        (self.jobs.iter())
            .find(|(_, c)| c.submitted && c.owner == Some(sub))
            .map(|(&ns, _)| ns)
    }

    /// Ends job `ns` (`why`, exit status `status`) unless it is over.
    pub(super) fn kill(&mut self, ns: NsId, why: &str, status: i32) -> Vec<Action> {
        self.on_job(ns, |j| {
            if j.is_over() {
                Vec::new()
            } else {
                j.on_kill(why, status)
            }
        })
    }

    /// The jobs that run, by namespace.
    pub(super) fn ids(&self) -> Vec<NsId> {
        self.jobs.keys().copied().collect()
    }

    /// Finds a job by its number (`3`) or namespace name.
    pub(super) fn find(&self, name: &str) -> Option<NsId> {
        if let Ok(n) = name.parse::<u32>() {
            return self.jobs.contains_key(&NsId(n)).then_some(NsId(n));
        }
        (self.jobs.iter())
            .find(|(_, c)| c.nspace == name)
            .map(|(&ns, _)| ns)
    }

    /// `weft ps`'s lines about the jobs: one per job, one per process.
    pub(super) fn table(&self, out: &mut String) {
        use std::fmt::Write;
        for (ns, c) in &self.jobs {
            let info = c.job.info();
            let state = if c.starting.is_some() {
                "starting"
            } else if c.job.is_terminating() {
                "ending"
            } else {
                "running"
            };
            let origin = match (&c.plan.parent, c.submitted, &c.told.tool) {
                (Some((p, _)), _, _) => format!("spawned by {p}"),
                (None, true, _) => "submitted".to_owned(),
                (None, false, Some(t)) => format!("spawned by tool {t}"),
                (None, false, None) => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "job {}  {}  {state}  {}/{} processes running  {origin}  {}",
                ns.0,
                c.nspace,
                info.size() - c.job.num_exited(),
                info.size(),
                c.command
            );
            for (rank, p) in info.procs.iter().enumerate() {
                let st = if c.job.has_exited(rank as u32) {
                    "ended"
                } else {
                    "running"
                };
                let _ = writeln!(out, "  rank {rank}  node {}  {st}", p.node);
            }
        }
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

/// A session's placement of `total` processes: contiguous blocks of ranks over `nodes`,
/// sizes differing by at most one.
fn blocks(nodes: &[u32], total: u32) -> Vec<u32> {
    (0..total)
        .map(|r| nodes[(u64::from(r) * nodes.len() as u64 / u64::from(total.max(1))) as usize])
        .collect()
}

/// The placement of `total` processes spawned by a job `parent` outside any session:
/// continuing from the parent's last node (the node of its highest rank), as PRRTE maps a
/// spawn from its bookmark. Logical nodes have no slot count to fill, so the children stay
/// together there (programs such as OpenPMIx's `dynamic.c` expect a spawned job's
/// processes to share a node); a session spreads a job over its nodes. A parent with no
/// process (none to continue from) places them on `asker`'s node.
fn continuing(parent: &JobInfo, asker: u32, total: u32) -> Vec<u32> {
    let node = parent.procs.last().map_or(asker, |p| p.node);
    vec![node; total as usize]
}

/// The plan of spawned job `ns`: its processes on `on` (a node per rank; every server
/// knows the job, the others run none of its processes), the first job's environment,
/// datastore size, output tagging and PMIx choice.
pub(super) fn child_plan(base: &JobPlan, ns: NsId, on: &[u32], req: &SpawnReq) -> JobPlan {
    let apps = &req.apps;
    let node_of = |r: u32| on[r as usize];
    let mut local = std::collections::HashMap::<u32, u32>::new();
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
            let node = node_of(procs.len() as u32);
            let l = local.entry(node).or_insert(0);
            let local_rank = *l;
            *l += 1;
            procs.push(ProcInfo {
                node,
                local_rank,
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
        forward_output: base.forward_output,
        // Held where a debugger asked for it.
        stop_in_init: req.debug.stop_in_init,
        debug_job: req.debug.daemons_for.clone(),
    }
}
