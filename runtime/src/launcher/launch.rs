//! A launch, decided without IO: the runtime's servers ([`Nodes`]) and the job they run
//! ([`Job`]). Each `on_*` method takes what happened and returns the [`Action`]s for the
//! launcher's loop to execute; that loop owns the sockets, timers and processes.

use std::net::SocketAddr;
use std::time::Duration;

use weft_wireup::{NsId, ProcId, Rank};

use super::children::{Children, Requester};
use super::job::{Action, Job, Timer};
use super::nodes::{Loss, Nodes};
use super::plan::EndPolicy;
use super::sessions::Sessions;
use crate::wire::proto::{
    AllocOp, AllocReq, ExitKind, FromController, JobAction, JobPlan, SessionCtl, SessionSel,
    SpawnReq, ToServer,
};

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
    /// A persistent runtime (`weft dvm start`): its first job has no process, and jobs
    /// are submitted to it until it is stopped.
    dvm: bool,
    /// The allocation sessions carved out of the runtime's nodes.
    sessions: Sessions,
    /// The first job's pids, until every node reported them.
    first_pids: super::proctable::FirstPids,
}

impl Launch {
    pub(super) fn new(plan: JobPlan, policy: EndPolicy) -> Launch {
        let hostnames = plan.job.nodes.iter().map(|n| n.hostname.clone()).collect();
        Launch {
            nodes: Nodes::new(plan.job.num_nodes()),
            job: Job::new(plan.job.clone(), policy),
            children: Children::new(),
            first_over: false,
            timed_out: false,
            dvm: false,
            sessions: Sessions::new(hostnames),
            first_pids: super::proctable::FirstPids::new(&plan),
            plan,
        }
    }

    /// Whether this is a persistent runtime (`weft dvm start`).
    pub(super) fn is_dvm(&self) -> bool {
        self.dvm
    }

    /// A persistent runtime over the nodes of `plan` (a job of no process).
    pub(super) fn new_dvm(plan: JobPlan) -> Launch {
        let mut l = Launch::new(plan, EndPolicy::default());
        l.dvm = true;
        l
    }

    /// Why the runtime starts no new job now, if it does not.
    fn refusal(&self) -> Option<String> {
        if self.first_over || self.job.is_terminating() || !self.nodes.started() {
            return Some("the runtime is ending; it starts no new job".into());
        }
        self.nodes.first_lost().map(|node| {
            format!("the server of node {node} was lost; the runtime starts no new job")
        })
    }

    /// Submitter `sub` asks for a job: `weft run`'s arguments, its directory and
    /// environment.
    pub(super) fn on_submit(
        &mut self,
        sub: u64,
        args: &[String],
        cwd: &str,
        env: Vec<(String, String)>,
    ) -> Vec<Action> {
        let error = |e: String| vec![Action::Tell(sub, FromController::Error(e))];
        if !self.dvm {
            return error("this runtime takes no submitted job".into());
        }
        if let Some(why) = self.refusal() {
            return error(format!("weft run: {why}"));
        }
        if self.children.submitted_by(sub).is_some() {
            return error("weft run: this connection has submitted a job already".into());
        }
        let ns = self.children.next_ns();
        let sessions = &self.sessions;
        let session = |name: &str| {
            let id = (sessions.find(name))
                .ok_or_else(|| "no such session (see weft session ls)".to_owned())?;
            Ok((id, sessions.nodes_of(id).unwrap_or_default()))
        };
        match super::plan::submit_plan(&self.plan, ns, args, cwd, env, &session) {
            Err(e) => error(e),
            Ok((plan, policy, session)) => {
                let n = self.nodes.num_nodes();
                self.children.on_submit(sub, plan, (policy, session), n)
            }
        }
    }

    /// `weft session new|end|pause|resume` of submitter `sub`.
    pub(super) fn on_session_ctl(&mut self, sub: u64, ctl: SessionCtl) -> Vec<Action> {
        let tell = |r: Result<String, String>| {
            Action::Tell(
                sub,
                match r {
                    Ok(t) => FromController::Text(t),
                    Err(e) => FromController::Error(e),
                },
            )
        };
        if let Some(why) = self.refusal() {
            return vec![tell(Err(format!("weft session: {why}")))];
        }
        // Sessions made here belong to the runtime's own (process-less) job: they last
        // until ended, or until the runtime stops.
        let owner = ProcId::new(self.plan.ns, 0);
        let name = match &ctl {
            SessionCtl::New { nodes, alloc_id } => {
                let req = AllocReq {
                    op: AllocOp::New,
                    nodes: Some(*nodes),
                    alloc_id: alloc_id.clone(),
                    req_id: None,
                    session: None,
                    separate: true,
                };
                return match self.sessions.on_request(owner, &req) {
                    Ok(s) => vec![tell(Ok(format!(
                        "session {}  {}  nodes {:?}\n",
                        s.id, s.alloc_id, s.nodes
                    )))],
                    Err(e) => vec![tell(Err(format!("weft session new: {e}")))],
                };
            }
            SessionCtl::End { session }
            | SessionCtl::Pause { session }
            | SessionCtl::Resume { session } => session,
        };
        let Some(id) = self.sessions.find(name) else {
            return vec![tell(Err(format!(
                "weft session: no session {name:?} (see weft session ls)"
            )))];
        };
        match ctl {
            SessionCtl::End { .. } => {
                let req = AllocReq {
                    op: AllocOp::Release,
                    nodes: None,
                    alloc_id: None,
                    req_id: None,
                    session: Some(id),
                    separate: false,
                };
                let jobs = self.children.in_session(id).len();
                match self.sessions.on_request(owner, &req) {
                    Ok(info) => {
                        let mut out = self.session_ended(info);
                        out.push(tell(Ok(format!(
                            "ended session {id} (terminating {jobs} job{})\n",
                            if jobs == 1 { "" } else { "s" }
                        ))));
                        out
                    }
                    Err(e) => vec![tell(Err(format!("weft session end: {e}")))],
                }
            }
            SessionCtl::Pause { .. } | SessionCtl::Resume { .. } => {
                let (sig, verb) = match ctl {
                    SessionCtl::Pause { .. } => (JobAction::Pause, "paused"),
                    _ => (JobAction::Resume, "resumed"),
                };
                let jobs = self.children.in_session(id);
                let mut out = Vec::new();
                if !jobs.is_empty() {
                    out.push(Action::SendAll(ToServer::Signal {
                        procs: jobs.iter().map(|&ns| (ns, None)).collect(),
                        sig: sig.signal(),
                    }));
                }
                out.push(tell(Ok(format!(
                    "{verb} session {id} ({} job{})\n",
                    jobs.len(),
                    if jobs.len() == 1 { "" } else { "s" }
                ))));
                out
            }
            SessionCtl::New { .. } => unreachable!("answered above"),
        }
    }

    /// Submitter `sub`'s connection closed: its job (and what that spawned) is
    /// terminated.
    pub(super) fn on_submitter_gone(&mut self, sub: u64) -> Vec<Action> {
        let acts = self.children.on_owner_gone(sub);
        self.child(acts)
    }

    /// Submitter `sub` received signal `sig`: its job is terminated.
    pub(super) fn on_submitter_signal(&mut self, sub: u64, sig: i32) -> Vec<Action> {
        let Some(ns) = self.children.submitted_by(sub) else {
            return Vec::new();
        };
        let why = format!("received {}", crate::wire::proto::signal_name(sig));
        let acts = self.children.kill(ns, &why, 128 + sig);
        self.child(acts)
    }

    /// `weft kill JOB`: job `job` (number or namespace name) is terminated, exiting with
    /// `128 + sig`.
    pub(super) fn on_kill(&mut self, sub: u64, job: &str, sig: i32) -> Vec<Action> {
        let Some(ns) = self.children.find(job) else {
            return vec![Action::Tell(
                sub,
                FromController::Error(format!("weft kill: no job {job:?} runs here (see weft ps)")),
            )];
        };
        let acts = self.children.kill(ns, "killed (weft kill)", 128 + sig);
        let mut out = self.child(acts);
        out.push(Action::Tell(
            sub,
            FromController::Text(format!("terminating job {}\n", ns.0)),
        ));
        out
    }

    /// Process `from` asks (`PMIx_Job_control`) for `action` on `targets`: a whole job to
    /// terminate ends as `weft kill` ends it; every other action is a signal the servers
    /// send to the processes named.
    pub(super) fn on_job_control(
        &mut self,
        from: ProcId,
        targets: &[(NsId, Option<u32>)],
        action: JobAction,
        via: &str,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let mut procs = Vec::new();
        let who = match self.children.nspace_of(from.ns) {
            Some(nspace) => format!("rank {} of {nspace}", from.rank),
            None => format!("rank {} of {}", from.rank, self.plan.job.nspace),
        };
        for &(ns, rank) in targets {
            let known = ns == self.plan.ns || self.children.has(ns);
            if !known {
                tracing::warn!("{from} asked for {action:?} of {ns}, which runs no more");
                continue;
            }
            match (action, rank) {
                (JobAction::Terminate, None) => {
                    let why = format!("terminated by {who} ({via})");
                    if ns == self.plan.ns {
                        let acts = self.job.on_kill(&why, 128 + 15);
                        out.extend(self.first(acts));
                    } else {
                        let acts = self.children.kill(ns, &why, 128 + 15);
                        out.extend(self.child(acts));
                    }
                }
                _ => procs.push((ns, rank)),
            }
        }
        if !procs.is_empty() {
            out.push(Action::SendAll(ToServer::Signal {
                procs,
                sig: action.signal(),
            }));
        }
        out
    }

    /// `weft dvm stop` (or a signal to the runtime): every job is terminated, then the
    /// servers are shut down.
    pub(super) fn on_stop(&mut self) -> Vec<Action> {
        if self.first_over {
            return Vec::new();
        }
        self.first_over = true;
        let mut out = Vec::new();
        for ns in self.children.ids() {
            out.extend(self.children.kill(ns, "the runtime is stopping", 128 + 15));
        }
        if self.children.all_over() {
            out.push(Action::SendAll(ToServer::Shutdown));
        } else {
            out.push(Action::Arm(Timer::ForceKill, super::job::FORCE_KILL_AFTER));
        }
        out
    }

    /// Output of rank `rank` of job `ns` (forwarded by a server): to its submitter, or this
    /// process's own; and to the PMIx tool that spawned the job asking for it.
    pub(super) fn on_output(
        &mut self,
        ns: NsId,
        rank: Rank,
        stderr: bool,
        bytes: Vec<u8>,
    ) -> Vec<Action> {
        // A tool that asked for it gets it; the runtime's own output keeps a copy (the
        // tool may be gone, and its library says nothing of what it could not deliver).
        let mut out = Vec::with_capacity(2);
        if let Some((node, nspace)) = self.children.output_tool(ns, stderr) {
            let msg = ToServer::ToolOutput {
                nspace,
                rank,
                stderr,
                bytes: bytes.clone(),
            };
            out.push(Action::Send(node, msg));
        }
        out.push(match self.children.owner_of(ns) {
            Some(sub) => Action::Tell(sub, FromController::Output { stderr, bytes }),
            None => Action::Output { stderr, bytes },
        });
        out
    }

    /// `weft ps`: the runtime's nodes, its jobs and their processes.
    pub(super) fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "runtime {}  {} node{}{}",
            self.plan.job.nspace,
            self.nodes.num_nodes(),
            if self.nodes.num_nodes() == 1 { "" } else { "s" },
            if self.first_over { "  stopping" } else { "" }
        );
        for n in &self.plan.job.nodes {
            let state = if self.nodes.is_lost(n.id) {
                "lost"
            } else {
                "up"
            };
            let _ = writeln!(out, "node {}  {}  {state}", n.id, n.hostname);
        }
        if !self.dvm {
            let job = &self.job;
            super::proctable::write_procs(&mut out, &self.plan, self.first_pids.pids(), |r| {
                job.has_exited(r)
            });
        }
        let runtime = self.dvm.then(|| ProcId::new(self.plan.ns, 0));
        self.sessions.table(&mut out, runtime);
        self.children.table(&mut out);
        out
    }

    /// The first job's actions: its end shuts the servers down only once every spawned
    /// job has ended, and its termination is theirs too.
    fn first(&mut self, acts: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::with_capacity(acts.len());
        for a in acts {
            match a {
                Action::SendAll(ToServer::Shutdown) => {
                    self.first_over = true;
                    // The sessions it asked for end with it, and the jobs in them.
                    let mut more = Vec::new();
                    for info in self.sessions.on_job_end(self.plan.ns) {
                        more.extend(self.session_ended(info));
                    }
                    if self.job.is_terminating() {
                        // It failed (or was terminated) after its processes had all
                        // ended, so no termination reached the servers: the jobs it
                        // spawned without separating them end with it all the same.
                        let why = format!("its parent job {} failed", self.plan.job.nspace);
                        for c in self.children.children_of(self.plan.ns) {
                            let acts = self.children.kill(c, &why, 128 + 15);
                            more.extend(self.child(acts));
                        }
                    }
                    if self.children.all_over() {
                        out.push(a);
                    }
                    out.extend(more);
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
        // A job terminated takes the jobs it spawned with it (unless separated), and
        // theirs in turn.
        let mut i = 0;
        while i < acts.len() {
            if let Action::SendAll(ToServer::TerminateJob { ns, .. }) = acts[i] {
                let nspace = self.children.nspace_of(ns).unwrap_or_default();
                for c in self.children.children_of(ns) {
                    let why = format!("its parent job {nspace} was terminated");
                    acts.extend(self.children.kill(c, &why, 128 + 15));
                }
            }
            i += 1;
        }
        // A job's end ends the sessions it asked for, and the jobs running in them.
        let ended: Vec<NsId> = (acts.iter())
            .filter_map(|a| match a {
                Action::SendAll(ToServer::EndJob { ns }) => Some(*ns),
                _ => None,
            })
            .collect();
        for ns in ended {
            for info in self.sessions.on_job_end(ns) {
                acts.extend(self.session_ended(info));
            }
        }
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
        self.spawn(node, qid, Requester::Process(from), req)
    }

    /// A PMIx tool released job `ns` held in init: every server releases its Weft
    /// processes (the PMIx ones got the tool's event already).
    pub(super) fn on_tool_release(&self, ns: NsId) -> Vec<Action> {
        vec![Action::SendAll(ToServer::Release {
            ns,
            pmix_done: true,
        })]
    }

    /// PMIx tool `tool`, connected to the server of `node`, asks for a job (that server's
    /// request `qid`): a job of its own, in the session it names or over the runtime's
    /// nodes.
    pub(super) fn on_tool_spawn(
        &mut self,
        node: u32,
        qid: u64,
        tool: (String, u32),
        req: &SpawnReq,
    ) -> Vec<Action> {
        self.spawn(node, qid, Requester::Tool(tool.0, tool.1), req)
    }

    fn spawn(&mut self, node: u32, qid: u64, from: Requester, req: &SpawnReq) -> Vec<Action> {
        if let Some(why) = self.refusal() {
            return vec![Action::SpawnDone {
                node,
                qid,
                result: Err(why),
            }];
        }
        let session = match &req.session {
            // A spawn that names no session runs in its parent's.
            None => match &from {
                Requester::Process(p) => (self.children.session_of(p.ns))
                    .and_then(|id| self.sessions.nodes_of(id).map(|n| (id, n))),
                Requester::Tool(..) => None,
            },
            Some(sel) => {
                let id = match sel {
                    SessionSel::Id(id) => Some(*id),
                    SessionSel::AllocId(a) => self.sessions.by_alloc_id(a),
                };
                match id.and_then(|id| self.sessions.nodes_of(id).map(|n| (id, n))) {
                    Some((0, _)) => None,
                    Some(s) => Some(s),
                    None => {
                        let what = match sel {
                            SessionSel::Id(id) => format!("session {id}"),
                            SessionSel::AllocId(a) => format!("allocation {a:?}"),
                        };
                        return vec![Action::SpawnDone {
                            node,
                            qid,
                            result: Err(format!("no {what} in this runtime")),
                        }];
                    }
                }
            }
        };
        let n = self.nodes.num_nodes();
        self.children
            .on_spawn(&self.plan, n, (node, qid), from, req, session)
    }

    /// Process `from`, on the server of `node`, asks for an allocation (its request
    /// `qid`): the session is carved, extended or released; the asker's server gets the
    /// answer, every server the news (for queries and the job's notification); a released
    /// session's jobs are terminated.
    pub(super) fn on_alloc(
        &mut self,
        node: u32,
        qid: u64,
        from: ProcId,
        req: &AllocReq,
    ) -> Vec<Action> {
        let known = from.ns == self.plan.ns || self.children.has(from.ns);
        let result = if !known {
            Err(format!("{from} is of no job of this runtime"))
        } else if let Some(why) = self.refusal() {
            Err(why)
        } else {
            self.sessions.on_request(from, req)
        };
        let alloc_id = match &result {
            Ok(info) => info.alloc_id.clone(),
            Err(_) => req.alloc_id.clone().unwrap_or_default(),
        };
        let mut out = vec![
            Action::AllocDone {
                node,
                qid,
                result: result.clone(),
            },
            Action::SendAll(ToServer::AllocEvent {
                owner: from,
                alloc_id,
                session: result.as_ref().ok().cloned(),
            }),
        ];
        if let (Ok(info), AllocOp::Release) = (&result, req.op) {
            out.extend(self.session_jobs_end(info.id));
        }
        out
    }

    /// Session `info` ended with its job: the servers are told, its jobs terminated.
    fn session_ended(&mut self, info: crate::wire::proto::SessionInfo) -> Vec<Action> {
        let id = info.id;
        let mut out = vec![Action::SendAll(ToServer::AllocEvent {
            owner: info.owner,
            alloc_id: info.alloc_id.clone(),
            session: Some(info),
        })];
        out.extend(self.session_jobs_end(id));
        out
    }

    /// The jobs of session `id` are terminated (it ended).
    fn session_jobs_end(&mut self, id: u32) -> Vec<Action> {
        let mut out = Vec::new();
        for ns in self.children.in_session(id) {
            let acts = self
                .children
                .kill(ns, &format!("its session {id} ended"), 128 + 15);
            out.extend(self.child(acts));
        }
        out
    }

    /// The server of `node` reports the pids of its processes of job `ns`: every server
    /// learns them (tools' process tables); the first job's complete table goes to the
    /// MPIR hook.
    pub(super) fn on_pids(&mut self, node: u32, ns: NsId, pids: Vec<(Rank, u32)>) -> Vec<Action> {
        let mut out = Vec::new();
        if ns == self.plan.ns && !self.dvm {
            if let Some(rows) = self.first_pids.on_report(&self.plan, node, &pids) {
                out.push(Action::ProcTable(rows));
            }
        }
        out.push(Action::SendAll(ToServer::Pids { ns, pids }));
        out
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
            Loss::First if self.dvm => {
                if self.first_over {
                    // Stopping: the servers end as asked (what still ran there ended).
                    let out = self.children.on_server_lost(node, reason);
                    return self.child(out);
                }
                let host =
                    (self.plan.job.nodes.get(node as usize)).map_or("?", |n| n.hostname.as_str());
                let mut out = vec![Action::Report(format!(
                    "weft dvm: the server of node {node} ({host}) ended: {reason}"
                ))];
                if node == 0 {
                    // The root server keeps the names, PGCIDs and connects of every job.
                    out.push(Action::Report(
                        "weft dvm: the root server is gone; stopping the runtime".into(),
                    ));
                    out.extend(self.children.on_server_lost(node, reason));
                    out.extend(self.on_stop());
                    return self.child(out);
                }
                out.extend(self.children.on_server_lost(node, reason));
                self.child(out)
            }
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
        if self.dvm {
            let mut out = vec![Action::Report(format!(
                "weft dvm: received {}; stopping the runtime",
                crate::wire::proto::signal_name(sig)
            ))];
            out.extend(self.on_stop());
            return out;
        }
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
mod tests;
#[cfg(test)]
mod tool_tests;
