//! PMIx, the server's third front end: what Open MPI programs and PMIx tools speak to
//! their launcher. OpenPMIx's server library (`weft_pmix::server`) serves the clients'
//! socket, their puts, commits and local gets; what needs the host comes here as
//! events, and is done with the core's machinery:
//!
//! - a fence is a fence of the core (`CollId` name `"pmix"`, one sequence number per
//!   set of participants): with data collected (`PMIX_COLLECT_DATA`), each node's packed
//!   contribution is committed as key `pmix/fence` of its lowest participating rank and
//!   the fence is Full, so every node ends with every node's contribution, handed to the
//!   library in node order; without, it is SyncOnly;
//! - a direct modex (a client's get of another node's process's data) asks that node's
//!   server (`PmixDmodexReq`), whose library answers once the process committed; it
//!   fails when the process dies, its node is lost or the request's `PMIX_TIMEOUT` passes;
//! - a log (`PMIx_Log`) to stdout or stderr joins the process's forwarded output
//!   (`pmix_log`);
//! - an event a client notifies beyond its node goes to the other nodes' servers, whose
//!   libraries deliver it; OpenPMIx's group invites are such events, and the group an
//!   invite formed becomes a Weft group on its members' nodes (`pmix_events`);
//! - connected, finalized and abort: a finalized process's exit status decides how it
//!   ended, as for the other front ends; an abort ends the process with its status
//!   (`proc_aborted`).
//!
//! A job is registered with the information Open MPI's runtime reads at init (sizes,
//! node and process maps, local peers, each rank's local and node rank, node and app).

use crate::wire::proto::DmodexFailure;
use weft_pmix::server::{
    DirectModex, Failure, Fence, Group, GroupReply, Host, Log, ModexReply, Notification, Nspace,
    ProcName, Query,
};

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use weft_wireup::{NsId, Rank, Scope, Value};

use super::output::Chunk;
use super::pmix_book::{query_answers, Ask, Ended, PmixBook};
use super::{after, ompi_shm_dir, wire_to_text, Event, State};
use crate::modex::{ConnId, Modex};
use crate::wire::proto::{
    ExitKind, FenceMode, GroupDirectives, JobMsg, JobPlan, Procs, ServerMsg, WireError,
};

/// Connection id under which the core answers the PMIx front end (PMI-1 uses bit 62,
/// native clients count up from 0).
pub(super) const PMIX_CONN: ConnId = 1 << 61;
/// The key a node's fence contribution is committed under.
const FENCE_KEY: &str = "pmix/fence";

/// What the library asked, as events of the actor.
pub(super) enum PmixEv {
    Connected(Rank),
    Finalized(Rank),
    Abort {
        rank: Rank,
        status: i32,
        message: String,
    },
    Fence(Fence),
    Dmodex(DirectModex),
    Group(Group),
    Query(Query),
    Log(Log),
    Notify(Notification),
    /// The library answered another node's direct modex `qid`.
    Served {
        qid: u64,
        to: u32,
        result: Result<Vec<u8>, Failure>,
    },
    /// Direct modex `qid` reached its timeout.
    DmodexTimeout {
        qid: u64,
    },
    /// A client's `PMIx_Spawn`.
    Spawn(weft_pmix::server::Spawn),
    /// A client's `PMIx_Publish`, `PMIx_Lookup` or `PMIx_Unpublish` (`published`).
    Publish(weft_pmix::server::Publish),
    Lookup(weft_pmix::server::Lookup),
    Unpublish(weft_pmix::server::Unpublish),
    /// This node's participants of a `PMIx_Connect`/`PMIx_Disconnect` (`connect`).
    Connect(weft_pmix::server::Connect),
    /// A client's `PMIx_Job_control`.
    JobControl(weft_pmix::server::JobControl),
    /// A client's `PMIx_Allocation_request` (`allocs`).
    Allocate(weft_pmix::server::Allocate),
}

impl PmixEv {
    /// Fails the request's reply, if it has one (an event about a namespace this server
    /// does not serve, or no longer).
    pub(super) fn refuse(self) {
        match self {
            PmixEv::Fence(f) => f.reply.fail(Failure::NotFound),
            PmixEv::Dmodex(d) => d.reply.fail(Failure::NotFound),
            PmixEv::Group(g) => g.reply.fail(Failure::NotFound),
            PmixEv::Query(q) => q.reply.fail(Failure::NotFound),
            PmixEv::Notify(n) => n.reply.fail(Failure::NotFound),
            PmixEv::Log(l) => l.reply.fail(Failure::NotFound),
            PmixEv::Spawn(s) => s.reply.fail(Failure::NotFound),
            PmixEv::Publish(p) => p.reply.fail(Failure::NotFound),
            PmixEv::Lookup(l) => l.reply.fail(Failure::NotFound),
            PmixEv::Unpublish(u) => u.reply.fail(Failure::NotFound),
            PmixEv::Connect(c) => c.reply.fail(Failure::NotFound),
            PmixEv::JobControl(j) => j.reply.fail(Failure::NotFound),
            PmixEv::Allocate(a) => a.reply.fail(Failure::NotFound),
            PmixEv::Connected(_)
            | PmixEv::Finalized(_)
            | PmixEv::Abort { .. }
            | PmixEv::Served { .. }
            | PmixEv::DmodexTimeout { .. } => {}
        }
    }
}

/// Hands the library's requests to the actor, each with the namespace it is about (the
/// actor finds its job by it).
struct Bridge {
    ev: UnboundedSender<Event>,
}

impl Bridge {
    fn send(&self, nspace: &str, e: PmixEv) {
        let _ = self.ev.send(Event::Pmix {
            nspace: nspace.to_owned(),
            ev: e,
        });
    }
}

impl Host for Bridge {
    fn connected(&self, p: ProcName) {
        if let Some(r) = p.rank {
            self.send(&p.nspace, PmixEv::Connected(r));
        }
    }
    fn finalized(&self, p: ProcName) {
        if let Some(r) = p.rank {
            self.send(&p.nspace, PmixEv::Finalized(r));
        }
    }
    fn abort(&self, p: ProcName, status: i32, message: String, _targets: Vec<ProcName>) {
        if let Some(rank) = p.rank {
            self.send(
                &p.nspace,
                PmixEv::Abort {
                    rank,
                    status,
                    message,
                },
            );
        }
    }
    fn fence(&self, f: Fence) {
        // A fence's participants are of one job so far (their first names it).
        let ns = f
            .procs
            .first()
            .map(|p| p.nspace.clone())
            .unwrap_or_default();
        self.send(&ns, PmixEv::Fence(f));
    }
    fn direct_modex(&self, d: DirectModex) {
        let ns = d.proc.nspace.clone();
        self.send(&ns, PmixEv::Dmodex(d));
    }
    fn group(&self, g: Group) {
        let ns = g
            .procs
            .first()
            .map(|p| p.nspace.clone())
            .unwrap_or_default();
        self.send(&ns, PmixEv::Group(g));
    }
    fn query(&self, q: Query) {
        let ns = q.requester.nspace.clone();
        self.send(&ns, PmixEv::Query(q));
    }
    fn tool_connected(&self, t: weft_pmix::server::ToolConnect) {
        // Any tool of this user (the library checked the uid): its own name, or one
        // given here. Its queries are answered as the node's (`pmix_tools`).
        let name = t.name.unwrap_or_else(|| ProcName {
            nspace: super::pmix_tools::tool_name(),
            rank: Some(0),
        });
        tracing::debug!(
            "PMIx tool {}.{} connected (pid {:?}, {:?})",
            name.nspace,
            name.rank.unwrap_or(0),
            t.pid,
            t.cmdline
        );
        t.reply.ok(name);
    }
    fn log(&self, l: Log) {
        let ns = l.source.nspace.clone();
        self.send(&ns, PmixEv::Log(l));
    }
    fn notify_event(&self, n: Notification) {
        tracing::debug!(
            "PMIx event {} of {:?} (range {:?})",
            n.code,
            n.source,
            n.range
        );
        let ns = n.source.nspace.clone();
        self.send(&ns, PmixEv::Notify(n));
    }
    fn spawn(&self, s: weft_pmix::server::Spawn) {
        let ns = s.requester.nspace.clone();
        self.send(&ns, PmixEv::Spawn(s));
    }
    fn publish(&self, p: weft_pmix::server::Publish) {
        let ns = p.requester.nspace.clone();
        self.send(&ns, PmixEv::Publish(p));
    }
    fn lookup(&self, l: weft_pmix::server::Lookup) {
        let ns = l.requester.nspace.clone();
        self.send(&ns, PmixEv::Lookup(l));
    }
    fn unpublish(&self, u: weft_pmix::server::Unpublish) {
        let ns = u.requester.nspace.clone();
        self.send(&ns, PmixEv::Unpublish(u));
    }
    fn connect(&self, c: weft_pmix::server::Connect) {
        // Any participant's job will do: a connect is the node's, not one job's.
        let ns = c
            .procs
            .first()
            .map(|p| p.nspace.clone())
            .unwrap_or_default();
        self.send(&ns, PmixEv::Connect(c));
    }
    fn allocate(&self, a: weft_pmix::server::Allocate) {
        let ns = a.requester.nspace.clone();
        self.send(&ns, PmixEv::Allocate(a));
    }
    fn job_control(&self, j: weft_pmix::server::JobControl) {
        let ns = j.requestor.nspace.clone();
        self.send(&ns, PmixEv::JobControl(j));
    }
}

/// The key a node's contribution to group construct `id` is committed under.
fn group_key(id: &str) -> String {
    format!("pmix/grp/{id}")
}

/// The node's PMIx server: one OpenPMIx server library for every job this server serves
/// PMIx to (each job's part is its [`PmixJob`]).
pub(super) struct PmixFront {
    pub(super) server: weft_pmix::server::Server,
    /// Where the node's output goes (`PMIx_Log` to stdout and stderr joins it).
    pub(super) output: std::sync::mpsc::Sender<Chunk>,
    /// The library's directory (removed at the end).
    dir: PathBuf,
    /// The namespaces it serves, by name.
    names: HashMap<String, NsId>,
}

/// What the PMIx server keeps of one job (in the job's state, so a job's PMIx
/// bookkeeping is the job's at hand).
pub(super) struct PmixJob {
    pub(super) nspace: String,
    /// Its directory (`PMIX_NSDIR`; removed at its end).
    nsdir: PathBuf,
    /// Open MPI's shared-memory directory on this node (removed at the job's end).
    vader_dir: PathBuf,
    /// The environment of each local child (from `PMIx_server_setup_fork`).
    env: HashMap<Rank, Vec<(String, String)>>,
    /// The operations under way and the direct modex requests (`pmix_book`), in a
    /// cell: the core's replies arrive through `send_client`, which borrows the state
    /// shared.
    pub(super) book: RefCell<PmixBook<ModexReply, GroupReply>>,
}

impl PmixFront {
    /// Starts the node's PMIx server in `dir` (created).
    /// `tools`: which tool connections it accepts.
    pub(super) fn start(
        dir: PathBuf,
        ev: UnboundedSender<Event>,
        output: std::sync::mpsc::Sender<Chunk>,
        tools: weft_pmix::server::ToolSupport,
    ) -> Result<PmixFront, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let server = weft_pmix::server::Server::init(&dir, Arc::new(Bridge { ev }), tools)
            .map_err(|e| e.to_string())?;
        if crate::tunable_or_default("WEFT_PMIX_QUICKACK", |get| {
            weft_tunables::find(crate::TUNABLES, "WEFT_PMIX_QUICKACK").switch_in(get)
        }) {
            server.ack_promptly();
        }
        Ok(PmixFront {
            server,
            output,
            dir,
            names: HashMap::new(),
        })
    }

    /// The job of namespace `nspace`, if this server serves it PMIx.
    pub(super) fn ns_of(&self, nspace: &str) -> Option<NsId> {
        self.names.get(nspace).copied()
    }

    /// Lets tools find the server beyond the library's own files: by the launcher's pid
    /// (a copy of the library's `pmix.<host>.tool.<pid>` file under that pid, in the
    /// same directory, removed with it) and through a URI file. Failures are logged:
    /// the job runs without.
    pub(super) fn publish_attach(&self, how: &super::ToolAttach) {
        let me = format!(".tool.{}", std::process::id());
        let found = std::fs::read_dir(&self.dir).ok().and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("pmix.") && n.ends_with(&me))
            })
        });
        let Some(file) = found else {
            tracing::warn!(
                "no PMIx tool rendezvous file in {}: tools cannot attach",
                self.dir.display()
            );
            return;
        };
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("{}: {e}: tools cannot attach", file.display());
                return;
            }
        };
        if let Some(pid) = how.launcher_pid {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let alias = self.dir.join(format!(
                "{}.tool.{pid}",
                name.strip_suffix(&me).unwrap_or(name)
            ));
            if let Err(e) = crate::jobdir::write_private(&alias, &text) {
                tracing::warn!("{}: {e}: tools cannot attach by pid {pid}", alias.display());
            }
        }
        match how.report_uri.as_deref() {
            None => {}
            Some("-") => println!("{}", text.lines().next().unwrap_or("")),
            Some(path) => {
                if let Err(e) = crate::jobdir::write_private(Path::new(path), &text) {
                    eprintln!("weft: --report-pmix-uri {path}: {e}");
                }
            }
        }
    }

    /// The namespaces it serves, with their ids.
    pub(super) fn names(&self) -> impl Iterator<Item = (&str, NsId)> {
        self.names.iter().map(|(n, &ns)| (n.as_str(), ns))
    }

    /// The first job it serves (the one the runtime was started for, while it runs).
    pub(super) fn first_ns(&self) -> Option<NsId> {
        self.names.values().min().copied()
    }

    /// Registers job `plan` and this node's processes of it with the library (every
    /// server registers every job it serves PMIx, with or without processes of it).
    pub(super) fn add_job(&mut self, plan: &JobPlan, node: u32) -> Result<PmixJob, String> {
        let job = &plan.job;
        // The job's own directory (PMIX_NSDIR, PMIX_TMPDIR), not the library's: Open MPI
        // registers its job directory for removal (PMIX_REGISTER_CLEANUP_DIR through
        // PMIx_Job_control), which the library carries out recursively when the job ends;
        // the library's shared-memory store lives in the server's directory and must stay.
        let nsdir = self.dir.join(format!("job-{}", plan.ns.0));
        std::fs::create_dir_all(&nsdir).map_err(|e| format!("{}: {e}", nsdir.display()))?;
        let ns = Nspace {
            nspace: job.nspace.clone(),
            node,
            hostnames: job.nodes.iter().map(|n| n.hostname.clone()).collect(),
            node_of: job.procs.iter().map(|p| p.node).collect(),
            app_of: job.procs.iter().map(|p| p.app).collect(),
            local_rank_of: job.procs.iter().map(|p| p.local_rank).collect(),
            locality_of: job.procs.iter().map(|p| p.locality.clone()).collect(),
            tmpdir: nsdir.to_string_lossy().into_owned(),
            oversubscribed: oversubscribed(plan, node),
            stop_in_init: plan.stop_in_init,
            debug_job: plan.debug_job.clone(),
            parent: plan
                .parent
                .as_ref()
                .map(|(p, nspace)| (nspace.clone(), p.rank)),
        };
        self.server
            .register_nspace(&ns)
            .map_err(|e| e.to_string())?;
        self.names.insert(job.nspace.clone(), plan.ns);
        // Open MPI 4.1's own settings, unless the user gave them.
        let vader_dir = ompi_shm_dir(&plan.job_id, node);
        let ompi = ompi_env(plan, &vader_dir, ns.oversubscribed);
        if ompi.iter().any(|(k, _)| k == VADER_DIR_VAR) {
            std::fs::create_dir_all(&vader_dir)
                .map_err(|e| format!("{}: {e}", vader_dir.display()))?;
        }
        let mut env = HashMap::new();
        for r in job.ranks_on(node) {
            self.server
                .register_client(&job.nspace, r)
                .map_err(|e| e.to_string())?;
            let mut vars = self
                .server
                .setup_fork(&job.nspace, r)
                .map_err(|e| e.to_string())?;
            vars.extend(ompi.iter().cloned());
            env.insert(r, vars);
        }
        Ok(PmixJob {
            nspace: job.nspace.clone(),
            nsdir,
            vader_dir,
            env,
            book: RefCell::new(PmixBook::new(
                job.nspace.clone(),
                node,
                job.procs.iter().map(|p| p.node).collect(),
            )),
        })
    }

    /// Job `job` ended (a spawned one; the first ends with the server): the library
    /// forgets it, its directory goes.
    pub(super) fn remove_job(&mut self, job: PmixJob) {
        self.names.remove(&job.nspace);
        self.server.deregister_nspace(&job.nspace);
        let _ = std::fs::remove_dir_all(&job.vader_dir);
        let _ = std::fs::remove_dir_all(&job.nsdir);
    }

    /// Finalizes the library (which forgets the jobs: no deregistration first, it cost
    /// 2-4 ms at every job's end) and removes its directory and the jobs' (`jobs`).
    pub(super) fn stop(self, jobs: Vec<PmixJob>) {
        let dir = self.dir.clone();
        drop(self);
        let _ = std::fs::remove_dir_all(dir);
        for j in jobs {
            let _ = std::fs::remove_dir_all(j.vader_dir);
        }
    }
}

impl PmixJob {
    /// The environment rank `rank` needs to reach the server.
    pub(super) fn env_of(&self, rank: Rank) -> &[(String, String)] {
        self.env.get(&rank).map_or(&[], |v| v.as_slice())
    }
}

/// Open MPI's variable naming the directory of its shared-memory segments.
const VADER_DIR_VAR: &str = "OMPI_MCA_btl_vader_backing_directory";

/// What Open MPI 4.1 needs to start under a PMIx server it does not know, each unless
/// the user set it (in `weft run`'s environment or with `-x`):
/// - `OMPI_MCA_schizo=ompi`, `OMPI_MCA_ess=pmi`: its launch-environment detection knows
///   only Slurm, Flux, JSM and its own daemons, and without them it would start as a
///   singleton (every rank "0 of 1"); this takes the PMIx path directly;
/// - `OMPI_MCA_btl_vader_backing_directory`: a directory of this node's own in
///   `/dev/shm`, removed at the job's end. Open MPI names its shared-memory segments by
///   host name and local rank, which logical nodes on one machine share (their segments
///   would collide), and it leaves them behind when a rank is killed.
fn ompi_env(plan: &JobPlan, vader_dir: &Path, oversubscribed: bool) -> Vec<(String, String)> {
    let user_set = |k: &str| std::env::var_os(k).is_some() || plan.env.iter().any(|(x, _)| x == k);
    // Oversubscribed, Open MPI 4.1 waits by yielding the CPU (`mpi_yield_when_idle`
    // defaults to on) only when told so by this variable, as its own mpirun does; it does
    // not read PMIX_NODE_OVERSUBSCRIBED. Busy-waiting ranks that share CPUs take turns
    // at scheduler time slices: mpi4py's suite at 4 processes on 2 CPUs took over 20
    // minutes under weft run without it, 77 s with it (115 s under mpirun).
    let oversub = oversubscribed.then(|| (OVERSUBSCRIBE_VAR, "1".to_string()));
    [
        ("OMPI_MCA_schizo", "ompi".to_string()),
        ("OMPI_MCA_ess", "pmi".to_string()),
        (VADER_DIR_VAR, vader_dir.display().to_string()),
    ]
    .into_iter()
    .chain(oversub)
    .filter(|(k, _)| !user_set(k))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Open MPI 4.1's MCA variable saying the node is oversubscribed.
const OVERSUBSCRIBE_VAR: &str = "OMPI_MCA_mpi_oversubscribe";

/// Whether the job has more processes on `node`'s host (every logical node of the same
/// name) than this server may run on CPUs (its affinity mask), as mpirun decides it with
/// one slot per CPU.
fn oversubscribed(plan: &JobPlan, node: u32) -> bool {
    let job = &plan.job;
    let Some(host) = job.nodes.get(node as usize).map(|n| &n.hostname) else {
        return false;
    };
    let on_host = job
        .procs
        .iter()
        .filter(|p| job.nodes.get(p.node as usize).map(|n| &n.hostname) == Some(host))
        .count();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    on_host > cpus
}

/// How child `pid` ended, if it has or is ending: its exit status while it is a zombie
/// (left to be reaped as usual), else what `/proc` says: gone (reaped, its status on its
/// way to the actor), or exiting (`PF_EXITING`: its sockets close before it becomes a
/// zombie, and the PMIx library reacts to those).
fn ended_now(pid: u32) -> Option<String> {
    if let Some(how) = exited_now(pid) {
        return Some(how.describe());
    }
    const PF_EXITING: u64 = 0x4;
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(_) => return Some("ended: its process exited".into()),
    };
    // pid (comm) state ppid pgrp session tty_nr tpgid flags ...
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = fields.first()?;
    let flags: u64 = fields.get(6)?.parse().ok()?;
    (matches!(*state, "Z" | "X" | "x") || flags & PF_EXITING != 0)
        .then(|| "ended: its process is exiting".to_string())
}

/// How child `pid` ended, if it has (it is left to be reaped as usual: `WNOWAIT`).
fn exited_now(pid: u32) -> Option<ExitKind> {
    use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    let st = waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
    )
    .ok()??;
    if let Some(sig) = st.terminating_signal() {
        Some(ExitKind::Signal(sig))
    } else {
        st.exit_status().map(ExitKind::Code)
    }
}

/// The client-facing status of a core error.
fn failure_of(e: &WireError) -> Failure {
    match e {
        WireError::ProcGone { .. } => Failure::ProcGone,
        WireError::Timeout { .. } => Failure::Timeout,
        WireError::Invalid { .. } => Failure::Invalid,
        _ => Failure::Other,
    }
}

impl State {
    /// An event of the PMIx front end.
    pub(super) fn on_pmix(&mut self, e: PmixEv) {
        match e {
            PmixEv::Connected(rank) => tracing::debug!("rank {rank}: PMIx client connected"),
            PmixEv::Finalized(rank) => {
                // As a native client's finalize at exit: its exit status decides.
                self.job.procs.on_finalize_at_exit(rank);
            }
            PmixEv::Abort {
                rank,
                status,
                message,
            } => self.proc_aborted(
                rank,
                status,
                &format!("called PMIx_Abort (status {status}): {message}"),
            ),
            PmixEv::Fence(f) => self.pmix_fence(f),
            PmixEv::Group(g) => self.pmix_group(g),
            PmixEv::Query(q) => self.pmix_query(q),
            PmixEv::Log(l) => self.pmix_log(l),
            PmixEv::Notify(n) => self.pmix_notify(n),
            PmixEv::Dmodex(d) => self.pmix_dmodex(d),
            PmixEv::Spawn(s) => self.pmix_spawn(s),
            PmixEv::Publish(p) => self.pmix_publish(p),
            PmixEv::Lookup(l) => self.pmix_lookup(l),
            PmixEv::Unpublish(u) => self.pmix_unpublish(u),
            PmixEv::Connect(c) => self.pmix_connect(c),
            PmixEv::JobControl(j) => self.pmix_job_control(j),
            PmixEv::Allocate(a) => self.pmix_allocate(a),
            PmixEv::Served { qid, to, result } => {
                let still = self
                    .job
                    .pmix
                    .as_ref()
                    .is_some_and(|px| px.book.borrow_mut().on_served(qid));
                if !still {
                    return; // answered already (its rank ended)
                }
                let result = result.map_err(|f| match f {
                    Failure::NotFound => DmodexFailure::NotFound,
                    Failure::Timeout => DmodexFailure::Timeout,
                    Failure::ProcGone => DmodexFailure::ProcGone("ended".into()),
                    other => DmodexFailure::Other(format!(
                        "the PMIx server library failed it ({other:?})"
                    )),
                });
                self.send_peer(to, &JobMsg::PmixDmodexResp { qid, result });
            }
            PmixEv::DmodexTimeout { qid } => {
                let reply = self
                    .job
                    .pmix
                    .as_ref()
                    .and_then(|px| px.book.borrow_mut().on_dmodex_timeout(qid));
                if let Some(reply) = reply {
                    reply.fail(Failure::Timeout);
                }
            }
        }
    }

    /// The participants a PMIx collective names (`op`), as the core's
    /// (`PmixBook::procs`).
    pub(super) fn pmix_procs(&self, op: &str, procs: &[ProcName]) -> Result<Procs, Failure> {
        match self.job.pmix.as_ref() {
            Some(px) => px.book.borrow().procs(op, procs),
            None => Err(Failure::Other),
        }
    }

    fn pmix_fence(&mut self, f: Fence) {
        let ns = &self.job.plan.job.nspace;
        if f.procs.iter().any(|p| &p.nspace != ns) {
            return self.pmix_cross_fence(f);
        }
        let procs = match self.pmix_procs("fence", &f.procs) {
            Ok(p) => p,
            Err(why) => return f.reply.fail(why),
        };
        let Some(px) = self.job.pmix.as_mut() else {
            return f.reply.fail(Failure::Other);
        };
        let id = px.book.get_mut().fence_id(procs);
        let mut locals = self.job.procs.local_ranks();
        locals.retain(|&r| id.procs.contains(r));
        self.pmix_check_alive(&locals);
        let Some(&first) = locals.first() else {
            tracing::warn!("PMIx fence {id:?} has no participant on node {}", self.node);
            return f.reply.fail(Failure::Other);
        };
        let collect = f.collect || !f.data.is_empty();
        let mode = if collect {
            FenceMode::Full
        } else {
            FenceMode::SyncOnly
        };
        let Some(px) = self.job.pmix.as_mut() else {
            return f.reply.fail(Failure::Other);
        };
        let now = std::time::Instant::now();
        let req = px
            .book
            .get_mut()
            .on_fence(id.clone(), collect, f.reply, now);
        if collect {
            let entry = (Scope::Global, FENCE_KEY.to_string(), Value::Bytes(f.data));
            self.commit(first, vec![entry]);
        }
        tracing::debug!(
            "PMIx fence {:?} #{}: this node's clients arrived",
            id.procs,
            id.seq
        );
        let timeout_ms = f.timeout.map(|t| t.as_millis() as u64);
        for r in locals {
            self.coll_arrive(r, PMIX_CONN, req, id.clone(), mode, timeout_ms, None);
        }
    }

    /// The library also hands a collective over when a local participant's connection
    /// broke (it died without contributing): such a rank must fail it, even if its exit
    /// status has not reached this server yet.
    fn pmix_check_alive(&mut self, locals: &[Rank]) {
        for &r in locals {
            if self.job.procs.is_gone(r) {
                continue;
            }
            if let Some(how) = self.job.procs.pid(r).and_then(ended_now) {
                self.proc_gone_local(r, how, false);
            }
        }
    }

    /// A group construct or destruct: the core's group operation (`groups`), each
    /// node's packed contribution carried as for a fence; the result is the group's
    /// PGCID as its context id, and every node's contribution.
    fn pmix_group(&mut self, g: Group) {
        let procs = match self.pmix_procs("group", &g.procs) {
            Ok(p) => p,
            Err(why) => return g.reply.fail(why),
        };
        let Some(px) = self.job.pmix.as_mut() else {
            return g.reply.fail(Failure::Other);
        };
        let id = px.book.get_mut().group_id(g.construct, procs, g.id.clone());
        let directives = GroupDirectives {
            leader: None,
            optional: g.optional,
            local_only: false,
            notify_termination: g.notify_termination,
            ft_collective: false,
            assign_context_id: g.assign_context_id,
            no_data: false,
        };
        let mut locals = self.job.procs.local_ranks();
        locals.retain(|&r| id.procs.contains(r));
        let Some(&first) = locals.first() else {
            tracing::warn!("PMIx group {:?} has no member on node {}", g.id, self.node);
            return g.reply.fail(Failure::Other);
        };
        self.pmix_check_alive(&locals);
        if g.construct && !g.endpt.is_empty() {
            let entry = (Scope::Global, group_key(&g.id), Value::Bytes(g.endpt));
            self.commit(first, vec![entry]);
        }
        let Some(px) = self.job.pmix.as_mut() else {
            return g.reply.fail(Failure::Other);
        };
        let req = px.book.get_mut().on_group(id.clone(), g.reply);
        let timeout_ms = g.timeout.map(|t| t.as_millis() as u64);
        for r in locals {
            self.group_arrive(
                r,
                PMIX_CONN,
                req,
                id.clone(),
                directives.clone(),
                timeout_ms,
            );
        }
    }

    /// A client's query: the process sets (the job's, and those defined while it runs)
    /// by name, their number, one's members. Keys this host does not know are left out;
    /// none known: not supported; an unknown set: not found.
    fn pmix_query(&mut self, mut q: Query) {
        // A tool's keys first (`pmix_tools`), then the job's own.
        let (tool_answers, keys) =
            self.tool_query(std::mem::take(&mut q.keys), &q.requester.nspace);
        q.keys = keys;
        let Some(px) = self.job.pmix.as_ref() else {
            return q.reply.fail(Failure::Other);
        };
        let mut sets: Vec<(String, Vec<Rank>)> = self
            .job
            .plan
            .job
            .psets
            .iter()
            .map(|p| (p.name.clone(), p.members.clone()))
            .collect();
        for (name, members) in self.job.psets.defined() {
            if !sets.iter().any(|(n, _)| n == name) {
                sets.push((name.clone(), members.clone()));
            }
        }
        // The state of an allocation (`allocs`), then the job's own keys.
        let mut answers = tool_answers;
        let (alloc, keys): (Vec<_>, Vec<_>) = q
            .keys
            .into_iter()
            .partition(|k| k.key == "pmix.query.alloc");
        for k in &alloc {
            if let Some(st) = k.alloc_id.as_deref().and_then(|a| self.allocs.status(a)) {
                answers.push(weft_pmix::server::QueryAnswer::AllocStatus(st));
            }
        }
        if keys.is_empty() {
            return if answers.is_empty() {
                q.reply.fail(Failure::NotFound)
            } else {
                q.reply.answers(answers)
            };
        }
        match query_answers(&keys, &sets, &px.nspace) {
            Ok(more) => {
                answers.extend(more);
                q.reply.answers(answers)
            }
            Err(why) if answers.is_empty() => q.reply.fail(why),
            Err(_) => q.reply.answers(answers),
        }
    }

    /// The core's reply `msg` to the PMIx front end: a fence's or a group operation's
    /// end.
    pub(super) fn pmix_reply(&self, msg: &ServerMsg) {
        let ended = self
            .job
            .pmix
            .as_ref()
            .and_then(|px| px.book.borrow_mut().on_core_reply(msg));
        match ended {
            // The other local participants' copies of the same answer.
            None => {}
            Some(Ended::Group { pending, result }) => {
                let group = match result {
                    Err(e) => {
                        tracing::warn!(
                            "PMIx group {:?} failed: {}",
                            pending.id.name,
                            wire_to_text(&e)
                        );
                        return pending.reply.fail(failure_of(&e));
                    }
                    Ok(None) => return pending.reply.ok(None, Vec::new()), // a destruct
                    Ok(Some(group)) => group,
                };
                // Every node's contribution, in node order: the key of its lowest member.
                let mut firsts: BTreeMap<u32, Rank> = BTreeMap::new();
                for &r in &group.members {
                    firsts
                        .entry(self.job.plan.job.procs[r as usize].node)
                        .or_insert(r);
                }
                let mut all = Vec::new();
                for (_, r) in firsts {
                    if let Some(Value::Bytes(b)) = self.job.modex.value(r, &group_key(&group.id)) {
                        all.extend_from_slice(b);
                    }
                }
                pending.reply.ok(group.pgcid, all);
            }
            Some(Ended::Fence { pending: f, error }) => {
                if let Some(e) = error {
                    tracing::warn!("PMIx fence failed: {}", wire_to_text(&e));
                    return f.reply.fail(failure_of(&e));
                }
                tracing::debug!(
                    "PMIx fence {:?} #{}: the servers' part took {:?}",
                    f.id.procs,
                    f.id.seq,
                    f.since.elapsed()
                );
                if !f.collect {
                    return f.reply.ok(Vec::new());
                }
                // Every node's contribution, in node order: the key of its lowest
                // participant.
                let mut firsts: BTreeMap<u32, Rank> = BTreeMap::new();
                for r in f.id.procs.ranks(self.job.plan.job.size()) {
                    let node = self.job.plan.job.procs[r as usize].node;
                    firsts.entry(node).or_insert(r);
                }
                let mut all = Vec::new();
                for (node, r) in firsts {
                    match self.job.modex.value(r, FENCE_KEY) {
                        Some(Value::Bytes(b)) => all.extend_from_slice(b),
                        _ => {
                            tracing::warn!("PMIx fence: no contribution of node {node} (rank {r})");
                            return f.reply.fail(Failure::Other);
                        }
                    }
                }
                f.reply.ok(all);
            }
        }
    }

    fn pmix_dmodex(&mut self, d: DirectModex) {
        let px_nspace = d.proc.nspace.clone();
        let Some(px) = self.job.pmix.as_mut() else {
            return d.reply.fail(Failure::Other);
        };
        let ended = &self.job.procs;
        let asked = px
            .book
            .get_mut()
            .on_dmodex(&d.proc, d.reply, |r| ended.why_gone(r));
        match asked {
            Err((reply, why)) => reply.fail(why),
            Ok(Ask { qid, node, rank }) => {
                if let Some(t) = d.timeout {
                    let e = Event::Pmix {
                        nspace: px_nspace.clone(),
                        ev: PmixEv::DmodexTimeout { qid },
                    };
                    after(&self.io.ev, t, e);
                }
                self.send_peer(node, &JobMsg::PmixDmodexReq { qid, rank });
            }
        }
    }

    /// Another node's direct modex for local rank `rank`.
    pub(super) fn pmix_serve(&mut self, qid: u64, rank: Rank) {
        let from = Modex::asker_of(qid);
        let refuse = |why: String| JobMsg::PmixDmodexResp {
            qid,
            result: Err(DmodexFailure::Other(why)),
        };
        let (Some(px), Some(front)) = (self.job.pmix.as_mut(), self.pmix.as_ref()) else {
            let m = refuse(format!("node {} does not serve PMIx", self.node));
            return self.send_peer(from, &m);
        };
        if !self.job.procs.is_local(rank) {
            let m = refuse(format!("rank {rank} does not run on node {}", self.node));
            return self.send_peer(from, &m);
        }
        if let Some(why) = self.job.procs.why_gone(rank) {
            let m = JobMsg::PmixDmodexResp {
                qid,
                result: Err(DmodexFailure::ProcGone(why.to_owned())),
            };
            return self.send_peer(from, &m);
        }
        px.book.get_mut().on_serving(qid, from, rank);
        let ev = self.io.ev.clone();
        let nspace = px.nspace.clone();
        let of = nspace.clone();
        let asked = front.server.dmodex_request(&nspace, rank, move |result| {
            let _ = ev.send(Event::Pmix {
                nspace: of,
                ev: PmixEv::Served {
                    qid,
                    to: from,
                    result,
                },
            });
        });
        if let Err(e) = asked {
            px.book.get_mut().on_served(qid);
            let m = refuse(e.to_string());
            self.send_peer(from, &m);
        }
    }

    /// The answer of another node to direct modex `qid`.
    pub(super) fn pmix_served(&mut self, qid: u64, result: Result<Vec<u8>, DmodexFailure>) {
        let answered = self
            .job
            .pmix
            .as_mut()
            .and_then(|px| px.book.get_mut().on_answered(qid));
        let Some((rank, reply)) = answered else {
            return; // timed out, or its rank ended
        };
        match result {
            Ok(data) => reply.ok(data),
            Err(e) => {
                tracing::debug!("PMIx direct modex of rank {rank}: {e:?}");
                reply.fail(match e {
                    DmodexFailure::NotFound => Failure::NotFound,
                    DmodexFailure::Timeout => Failure::Timeout,
                    DmodexFailure::ProcGone(_) => Failure::ProcGone,
                    DmodexFailure::Other(_) => Failure::Other,
                });
            }
        }
    }

    /// Rank `rank` ended: direct modex requests about it that can no longer be
    /// answered fail (a finalized rank's data stays with its node's library).
    pub(super) fn pmix_rank_ended(&mut self, rank: Rank, reason: &str, finalized: bool) {
        if finalized {
            return;
        }
        let (Some(px), Some(front)) = (self.job.pmix.as_mut(), self.pmix.as_ref()) else {
            return;
        };
        // The node's clients hear of it (Open MPI's default handler ends the process;
        // a Weft program names the rank).
        front.server.notify_ended(&px.nspace, rank, None);
        let (failed, served) = px.book.get_mut().on_rank_ended(rank);
        for reply in failed {
            reply.fail(Failure::ProcGone);
        }
        for (qid, from) in served {
            let m = JobMsg::PmixDmodexResp {
                qid,
                result: Err(DmodexFailure::ProcGone(reason.to_string())),
            };
            self.send_peer(from, &m);
        }
    }
}
