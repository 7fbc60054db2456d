//! What PMIx tools ask a server (`pps`, `pquery`, debuggers, through
//! `PMIx_Query_info`): the namespaces it serves and their command lines, a job's
//! process table (job-wide or this node's) and size, the spawn and debugger support, a
//! job's state. A tool connects under a name of its own or one given here
//! ([`tool_name`]); which servers take tools and how tools find them
//! ([`tool_support`], [`ToolAttach`]); PMIx calls from outside the jobs (a tool's query
//! or event, the library's own query) routed ([`State::pmix_call`]).

use std::sync::atomic::{AtomicU32, Ordering};

use weft_pmix::server::{Notification, ProcInfo, ProcName, ProcState, QueryAnswer, QueryKey};
use weft_wireup::{NsId, Rank};

use crate::wire::proto::JobMsg;

use super::State;

/// The spawn attributes a `PMIx_Spawn` here honours (`PMIX_QUERY_SPAWN_SUPPORT`): session,
/// allocation, a child that outlives its parent, `ppr:N:node` mapping, debugger daemons
/// and a notice of the job's end. Not `PMIX_COSPAWN_APP`: a debugger spawns its
/// application and its daemons separately.
const SPAWN_SUPPORT: &[&str] = &[
    "pmix.ssn.id",
    "pmix.alloc.id",
    "pmix.spchildsep",
    "pmix.mapby",
    "pmix.debugger",
    "pmix.notecomp",
];

/// The debugger attributes served (`PMIX_QUERY_DEBUG_SUPPORT`): stop in init (`weft run
/// --stop-in-init`, or a spawn that asks), daemons told the job they debug (not stop on
/// exec).
const DEBUG_SUPPORT: &[&str] = &["pmix.dbg.init", "pmix.dbg.job", "pmix.dbg.tgt"];

/// How PMIx tools find a server beyond its own rendezvous files (`--tool-pid`,
/// `--report-pmix-uri`, `--pmix-system-server` of `weft server`).
#[derive(Debug, Clone, Default)]
pub struct ToolAttach {
    /// Also answer to tools looking for this pid (the launcher's: `pps --pid`).
    pub launcher_pid: Option<u32>,
    /// Write the PMIx URI there (`-`: stdout).
    pub report_uri: Option<String>,
    /// Be the host's system server.
    pub system: bool,
}

/// Which tools the PMIx server of `node` accepts: the first node of each host takes
/// tools (several logical nodes of a host would leave a tool searching for "the" server
/// with a choice), and is the host's system server if `system` asks it.
pub(super) fn tool_support(
    plan: &crate::wire::proto::JobPlan,
    node: u32,
    system: bool,
) -> weft_pmix::server::ToolSupport {
    let here = crate::jobdir::hostname();
    let host_of = |label: &str| crate::jobdir::physical_host(label, &here);
    let nodes = &plan.job.nodes;
    let host = nodes.get(node as usize).map(|n| host_of(&n.hostname));
    let first_on_host = nodes
        .iter()
        .find(|n| Some(host_of(&n.hostname)) == host)
        .is_none_or(|n| n.id == node);
    weft_pmix::server::ToolSupport {
        tools: first_on_host,
        system: first_on_host && system,
    }
}

/// The name for a tool that did not bring one: `weft-tool.<server pid>.<n>`, rank 0.
pub(super) fn tool_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("weft-tool.{}.{n}", std::process::id())
}

impl State {
    /// Answers the tool keys of `keys` (asked by a process of namespace `requester`, a
    /// tool's or a job's); returns the answers and the keys left for the job's own
    /// query. Leaves the focus on the job it found.
    pub(super) fn tool_query(
        &mut self,
        keys: Vec<QueryKey>,
        requester: &str,
    ) -> (Vec<QueryAnswer>, Vec<QueryKey>) {
        let mut answers = Vec::new();
        let mut rest = Vec::new();
        let home = self.job.ns;
        for k in keys {
            match k.key.as_str() {
                "pmix.qry.ns" => {
                    let names = self.served().into_iter().map(|(_, n)| n).collect();
                    answers.push(QueryAnswer::Namespaces(names));
                }
                "pmix.qry.nsinfo" => {
                    let mut info = Vec::new();
                    for (ns, name) in self.served() {
                        if self.focus(ns) {
                            info.push((name, self.command_line()));
                        }
                    }
                    answers.push(QueryAnswer::NamespaceInfo(info));
                }
                "pmix.qry.ptable" | "pmix.qry.lptable" => {
                    let local = k.key == "pmix.qry.lptable";
                    if let Some(ns) = self.asked_job(k.nspace.as_deref(), requester, home) {
                        if self.focus(ns) {
                            let procs = self.proc_table(local);
                            answers.push(QueryAnswer::ProcTable { local, procs });
                        }
                    }
                }
                "pmix.qry.jst" => {
                    if let Some(ns) = self.asked_job(k.nspace.as_deref(), requester, home) {
                        if self.focus(ns) {
                            // Running while any process is; then how the job ended.
                            let st = if self.job.procs.all_gone() {
                                weft_pmix::server::codes::JOB_TERMINATED
                            } else {
                                0
                            };
                            answers.push(QueryAnswer::JobStatus(st));
                        }
                    }
                }
                "pmix.job.size" => {
                    if let Some(ns) = self.asked_job(k.nspace.as_deref(), requester, home) {
                        if self.focus(ns) {
                            answers.push(QueryAnswer::JobSize(self.job.plan.job.size()));
                        }
                    }
                }
                "pmix.qry.spawn" => answers.push(QueryAnswer::SpawnSupport(
                    SPAWN_SUPPORT.iter().map(|s| (*s).to_owned()).collect(),
                )),
                "pmix.qry.debug" => answers.push(QueryAnswer::DebugSupport(
                    DEBUG_SUPPORT.iter().map(|s| (*s).to_owned()).collect(),
                )),
                _ => rest.push(k),
            }
        }
        self.focus(home);
        (answers, rest)
    }

    /// The namespaces this node's PMIx server serves, in the runtime's order.
    fn served(&self) -> Vec<(NsId, String)> {
        let mut v: Vec<(NsId, String)> = self
            .pmix
            .as_ref()
            .map(|px| px.names().map(|(n, ns)| (ns, n.to_owned())).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The job a query is about: the one its `PMIX_NSPACE` qualifier names, else the
    /// asker's own, else (a tool asking) the node's first.
    fn asked_job(&self, named: Option<&str>, requester: &str, first: NsId) -> Option<NsId> {
        let px = self.pmix.as_ref()?;
        match named {
            Some(n) => px.ns_of(n),
            None => px.ns_of(requester).or(Some(first)),
        }
    }

    /// The focused job's command line: its apps, `:`-separated as `weft run` takes them.
    fn command_line(&self) -> String {
        let apps = self.job.plan.apps.iter().map(|a| {
            std::iter::once(a.program.as_str())
                .chain(a.args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        });
        apps.collect::<Vec<_>>().join(" : ")
    }

    /// The focused job's process table: every rank's, or this node's (`local`); hosts
    /// as tools reach them (this machine for a logical node).
    fn proc_table(&self, local: bool) -> Vec<ProcInfo> {
        let job = &self.job.plan.job;
        let nspace = job.nspace.clone();
        let here = crate::jobdir::hostname();
        let ranks: Vec<_> = if local {
            job.ranks_on(self.node)
        } else {
            (0..job.size()).collect()
        };
        ranks
            .into_iter()
            .filter_map(|r| {
                job.procs.get(r as usize)?;
                let pid = self.job.pids.pid(r);
                let state = if self.job.procs.is_gone(r) {
                    ProcState::Terminated
                } else if pid == 0 {
                    ProcState::Starting
                } else {
                    ProcState::Running
                };
                let (hostname, executable) =
                    crate::jobdir::host_and_program(&self.job.plan, r as usize, &here);
                Some(ProcInfo {
                    nspace: nspace.clone(),
                    rank: r,
                    hostname,
                    executable,
                    pid,
                    exit_code: 0,
                    state,
                })
            })
            .collect()
    }

    /// A tool's event (`n`): the library already gave it to this node's clients in its
    /// range; the other nodes' servers give it to theirs (a debugger's
    /// `PMIX_DEBUGGER_RELEASE` reaches every held process of the job).
    pub(super) fn tool_event(&mut self, n: Notification) {
        let source = (n.source.nspace.clone(), n.source.rank.unwrap_or(0));
        tracing::debug!("PMIx tool {source:?}: event {}", n.code);
        let me = self.node;
        let nodes = self.job.plan.job.nodes.len() as u32;
        for node in (0..nodes).filter(|&x| x != me) {
            let m = JobMsg::PmixToolEvent {
                code: n.code,
                source: source.clone(),
                range: n.range.raw(),
                info: n.info.clone(),
            };
            self.send_peer(node, &m);
        }
        // A debugger's release reaches the job's Weft processes through the launcher
        // (`hold`): the job it names, or every job served here.
        if n.code == weft_pmix::server::codes::DEBUGGER_RELEASE {
            let named: Option<Vec<&str>> =
                (n.targets.as_ref()).map(|t| t.iter().map(|p| p.nspace.as_str()).collect());
            for (ns, name) in self.served() {
                if named.as_ref().is_none_or(|v| v.contains(&name.as_str())) {
                    self.to_launcher(&crate::wire::proto::ToLauncher::Release { ns });
                }
            }
        }
        n.reply.ok();
    }

    /// Another node's tool event, for this node's clients.
    pub(super) fn tool_event_arrived(
        &mut self,
        code: i32,
        source: &(String, Rank),
        range: u8,
        info: &[u8],
    ) {
        let Some(front) = self.pmix.as_ref() else {
            return;
        };
        let src = ProcName {
            nspace: source.0.clone(),
            rank: Some(source.1),
        };
        let range = weft_pmix::server::Range::from_raw(range);
        if let Err(e) = front.server.notify_packed(code, &src, range, info) {
            tracing::warn!("PMIx event {code} of tool {src:?} from another node: {e}");
        }
    }

    /// A call of the PMIx library about namespace `nspace`: a job's process's, taken
    /// by its job; or from outside the jobs (the library's own query, for a key it could
    /// not resolve locally; a tool's query or event).
    pub(super) fn pmix_call(&mut self, nspace: &str, ev: super::pmix::PmixEv) {
        use super::pmix;
        // From outside, a query is answered as the node's first job would answer it,
        // and an event goes to every node (`tool_event`).
        let (ns, outside) = match self.pmix.as_ref() {
            None => (None, false),
            Some(px) => match px.ns_of(nspace) {
                Some(ns) => (Some(ns), false),
                None => (px.first_ns(), true),
            },
        };
        match (ns, ev) {
            (Some(ns), pmix::PmixEv::Notify(n)) if outside && self.focus(ns) => self.tool_event(n),
            (Some(ns), pmix::PmixEv::Spawn(s)) if outside && self.focus(ns) => self.tool_spawn(s),
            (Some(ns), ev)
                if (!outside || matches!(ev, pmix::PmixEv::Query(_)))
                    && self.focus(ns)
                    && self.job.pmix.is_some() =>
            {
                self.on_pmix(ev)
            }
            (_, ev) => {
                tracing::warn!("a PMIx call about {nspace:?}, which this server does not serve");
                ev.refuse();
            }
        }
    }
}
