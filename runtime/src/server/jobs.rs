//! A server's jobs over their life: the datastore segment a job starts with, a spawn a
//! local process asks for (relayed to the launcher, answered when it answers), another
//! job the launcher sets up on this node (`ToServer::Launch`), and a job's end.

use std::path::PathBuf;
use std::sync::Arc;

use weft_shm::StoreWriter;
use weft_wireup::job::NodeNet;
use weft_wireup::{keys, NsId, ProcId, Rank, SpawnApp};

use super::output::Chunk;
use super::spawn::spawn_child;
use super::{Job, State};
use crate::jobdir::{datastore_name, segment_prefix, unlink_segments};
use crate::modex::ConnId;
use crate::wire::proto::{
    DebugSpawn, JobPlan, ServerMsg, SessionSel, SpawnReq, ToLauncher, WireError,
};

/// What a server needs to start a job's processes on its node, whichever job.
pub(super) struct Starter {
    /// The server's socket, which every job's processes connect to.
    pub(super) sock: PathBuf,
    /// The node's network record, written into every job's datastore.
    pub(super) net: NodeNet,
    /// Where the processes' output goes.
    pub(super) out: std::sync::mpsc::Sender<Chunk>,
}

#[cfg(test)]
impl Starter {
    /// A starter for a server under test: no socket, loopback, output dropped.
    pub(super) fn for_tests() -> Starter {
        Starter {
            sock: PathBuf::from("/nonexistent/weft-test.sock"),
            net: NodeNet {
                addr: std::net::Ipv4Addr::LOCALHOST.into(),
                transport_secret: [0; 2],
            },
            out: std::sync::mpsc::channel().0,
        }
    }
}

/// Who waits for a spawn's answer.
enum Asker {
    /// A native client: its connection and request.
    Native { conn: ConnId, req: u64 },
    /// A PMIx client (`PMIx_Spawn`): the library's callback.
    Pmix(weft_pmix::server::SpawnReply),
    /// A PMI-1 or PMI-2 client (MPICH's `PMI_Spawn_multiple`, `PMI2_Job_Spawn`): its
    /// rank, and how many processes it asked for (PMI-1 answers an error code for each).
    Pmi { rank: Rank, procs: u32 },
}

/// The spawns local processes asked for, waiting for the launcher.
#[derive(Default)]
pub(super) struct Spawns {
    /// Per request id: the asking job, and who waits.
    waiting: std::collections::HashMap<u64, (NsId, Asker)>,
    next: u64,
}

/// The request of a `PMIx_Spawn`, and where its answer goes.
fn pmix_spawn_req(s: weft_pmix::server::Spawn) -> (SpawnReq, weft_pmix::server::SpawnReply) {
    let apps = s
        .apps
        .into_iter()
        .map(|a| SpawnApp {
            program: a.cmd,
            args: a.args,
            np: a.maxprocs,
            env: a.env,
            cwd: a.cwd,
        })
        .collect();
    let session = match (s.session, s.alloc_id) {
        (Some(id), _) => Some(SessionSel::Id(id)),
        (None, Some(a)) => Some(SessionSel::AllocId(a)),
        (None, None) => None,
    };
    let d = s.debug;
    let debug = DebugSpawn {
        stop_in_init: d.stop_in_init,
        daemons_for: d.target.filter(|_| d.daemons),
        per_node: d.per_node,
        notify_completion: d.notify_completion,
        forward_stdout: d.fwd_stdout,
        forward_stderr: d.fwd_stderr,
    };
    let req = SpawnReq {
        apps,
        pmi_preput: None,
        session,
        separate: s.separate,
        debug,
    };
    (req, s.reply)
}

/// Creates the datastore segment of job `plan` on `node` with the job's information and
/// the node's network record.
pub(super) fn create_store(
    plan: &JobPlan,
    node: u32,
    net: &NodeNet,
) -> Result<StoreWriter, String> {
    let name = datastore_name(&plan.job_id, node);
    let _ = weft_shm::unlink(&name);
    let mut store = StoreWriter::create(&name, plan.datastore_bytes as usize, 1 << 16)
        .map_err(|e| format!("datastore {name}: {e}"))?;
    let job_bytes = postcard::to_stdvec(&plan.job).expect("postcard encoding into a Vec");
    // An eighth of the store is kept for processes' ends, which readers look up without
    // a fallback to the server: they stay recorded after other keys filled the store.
    store.set_reserve(store.key_capacity() / 8, store.data_capacity() / 8);
    store.insert(keys::JOB_INFO, &job_bytes).map_err(|_| {
        format!(
            "job info of {} bytes does not fit the datastore",
            job_bytes.len()
        )
    })?;
    let net_bytes = postcard::to_stdvec(net).expect("postcard encoding into a Vec");
    store
        .insert(keys::NODE_NET, &net_bytes)
        .map_err(|_| "the node's network record does not fit the datastore".to_owned())?;
    Ok(store)
}

impl State {
    /// Local rank `rank` of the focused job asks for a new job of `apps` (request `req` on
    /// connection `conn`): the launcher plans and starts it.
    pub(super) fn spawn_request(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        apps: Vec<SpawnApp>,
        opts: weft_wireup::SpawnOptions,
    ) {
        let session = opts.session.map(|s| match s {
            weft_wireup::SessionRef::Id(id) => SessionSel::Id(id),
            weft_wireup::SessionRef::AllocId(a) => SessionSel::AllocId(a),
        });
        let req_ = SpawnReq {
            apps,
            pmi_preput: None,
            session,
            separate: opts.separate,
            debug: Default::default(),
        };
        self.spawn_for(rank, Asker::Native { conn, req }, req_);
    }

    /// A PMI client's spawn of `apps`, whose processes read `preput` as their job's keys.
    pub(super) fn pmi_spawn(
        &mut self,
        rank: Rank,
        apps: Vec<SpawnApp>,
        preput: Vec<(String, String)>,
    ) {
        let procs = apps.iter().fold(0u32, |t, a| t.saturating_add(a.np));
        let req = SpawnReq {
            apps,
            pmi_preput: Some(preput),
            session: None,
            separate: false,
            debug: Default::default(),
        };
        self.spawn_for(rank, Asker::Pmi { rank, procs }, req);
    }

    /// A PMIx client's `PMIx_Spawn`: the same request, answered through the library.
    pub(super) fn pmix_spawn(&mut self, s: weft_pmix::server::Spawn) {
        let Some(rank) = s.requester.rank else {
            return s.reply.fail(weft_pmix::server::Failure::Invalid);
        };
        let (req, reply) = pmix_spawn_req(s);
        self.spawn_for(rank, Asker::Pmix(reply), req);
    }

    /// A PMIx tool's `PMIx_Spawn` (a debugger starting the job it debugs, or its
    /// daemons): the launcher places it as a job of its own, with no parent.
    pub(super) fn tool_spawn(&mut self, s: weft_pmix::server::Spawn) {
        let tool = (s.requester.nspace.clone(), s.requester.rank.unwrap_or(0));
        let (req, reply) = pmix_spawn_req(s);
        self.ask_launcher(Asker::Pmix(reply), |qid| ToLauncher::ToolSpawn {
            qid,
            tool,
            req,
        });
    }

    /// Output of process `rank` of job `nspace`, for the tool served here that asked.
    pub(super) fn tool_output(&self, nspace: &str, rank: Rank, stderr: bool, bytes: Vec<u8>) {
        if let Some(px) = self.pmix.as_ref() {
            px.server.iof_deliver(nspace, rank, stderr, bytes);
        }
    }

    /// Job `nspace`, which `to` spawned asking to hear of its end, ended with `code`.
    pub(super) fn job_terminated(&mut self, to: (String, u32), nspace: &str, code: i32) {
        let to = weft_pmix::server::ProcName {
            nspace: to.0,
            rank: Some(to.1),
        };
        match self.pmix.as_ref() {
            Some(px) => px.server.notify_job_terminated(&to, nspace, code),
            None => tracing::warn!("job {nspace} ended, but {to:?} has no PMIx server here"),
        }
    }

    /// Local rank `rank` of the focused job asks for job `req`; `asker` gets the answer.
    fn spawn_for(&mut self, rank: Rank, asker: Asker, req: SpawnReq) {
        let from = ProcId::new(self.job.ns, rank);
        self.ask_launcher(asker, |qid| ToLauncher::Spawn { qid, from, req });
    }

    /// Sends the launcher spawn request `msg(qid)`, a new `qid` whose answer goes to
    /// `asker`.
    fn ask_launcher(&mut self, asker: Asker, msg: impl FnOnce(u64) -> ToLauncher) {
        let qid = self.spawns.next;
        self.spawns.next += 1;
        self.spawns.waiting.insert(qid, (self.job.ns, asker));
        self.to_launcher(&msg(qid));
    }

    /// The launcher answered spawn `qid`.
    pub(super) fn spawn_done(&mut self, qid: u64, result: Result<(NsId, String), String>) {
        let Some((ns, asker)) = self.spawns.waiting.remove(&qid) else {
            tracing::warn!("the launcher answered spawn {qid}, which nobody here asked for");
            return;
        };
        let (conn, req) = match asker {
            Asker::Native { conn, req } => (conn, req),
            Asker::Pmi { rank, procs } => {
                if self.focus(ns) {
                    self.pmi_spawned(rank, procs, result.map(|(_, nspace)| nspace));
                }
                return;
            }
            Asker::Pmix(reply) => {
                return match result {
                    Ok((_, nspace)) => reply.ok(&nspace),
                    Err(why) => {
                        tracing::warn!("PMIx_Spawn of {ns}: {why}");
                        reply.fail(weft_pmix::server::Failure::Other)
                    }
                };
            }
        };
        if !self.focus(ns) {
            return;
        }
        let msg = match result {
            Ok((ns, nspace)) => ServerMsg::Spawned { req, ns, nspace },
            Err(reason) => ServerMsg::Failed {
                req,
                error: WireError::Invalid {
                    op: "spawn".into(),
                    reason,
                },
            },
        };
        self.send_client(conn, &msg);
    }

    /// The launcher sets job `plan` up on this node: its datastore, its state, its
    /// processes here. Answered with `Launched` (the first process that could not be
    /// started fails it).
    pub(super) fn launch_job(&mut self, plan: JobPlan) {
        let ns = plan.ns;
        let (error, set_up) = if self.namespaces().contains(&ns) {
            (Some(format!("{ns} runs here already")), false)
        } else {
            match create_store(&plan, self.node, &self.starter.net) {
                Err(e) => (Some(e), false),
                Ok(store) => {
                    let mut job = Job::new(self.node, Arc::new(plan), store);
                    if job.plan.pmix {
                        match self
                            .pmix
                            .as_mut()
                            .map(|px| px.add_job(&job.plan, self.node))
                        {
                            Some(Ok(pj)) => job.pmix = Some(pj),
                            Some(Err(e)) => tracing::warn!(
                                "node {}: no PMIx for {ns} ({e}); its Open MPI programs \
                                 cannot start",
                                self.node
                            ),
                            None => {}
                        }
                    }
                    let prev = std::mem::replace(&mut self.job, job);
                    self.parked.insert(prev.ns, prev);
                    let mut error = None;
                    for r in self.job.procs.local_ranks() {
                        if let Err(e) = spawn_child(self, r) {
                            error.get_or_insert(format!("rank {r}: {e}"));
                        }
                    }
                    (error, true)
                }
            }
        };
        self.to_launcher(&ToLauncher::Launched { ns, error, set_up });
    }

    /// Writes `key` into the focused job's node datastore; once the store is full it is
    /// marked overflowed, and gets go through the server.
    pub(super) fn store_put(&mut self, key: &[u8], value: &[u8]) {
        if self.job.store.overflowed() {
            return;
        }
        if self.job.store.insert(key, value).is_err() {
            tracing::warn!(
                "node datastore {} is full ({} bytes used); further gets go through the server",
                self.job.store.name(),
                self.job.store.bytes_used()
            );
            self.job.store.set_overflowed();
        }
    }

    /// [`store_put`](Self::store_put) of a key that readers look up without a fallback
    /// (a process's end): into the store's reserve, even once other keys overflowed it.
    pub(super) fn store_put_vital(&mut self, key: &[u8], value: &[u8]) {
        if self.job.store.insert_vital(key, value).is_err() {
            tracing::error!(
                "node datastore {} is full, its reserve too: key {key:?} is not recorded; \
                 processes waiting on it notice only by their own checks",
                self.job.store.name(),
            );
            self.job.store.set_overflowed();
        }
    }

    /// Job `ns` is over: its state goes, and its segments with it (the datastore unlinks
    /// when dropped). The server's last job stays until the server ends.
    pub(super) fn end_job(&mut self, ns: NsId) {
        if self.parked.is_empty() || !self.namespaces().contains(&ns) {
            return;
        }
        if self.job.ns == ns {
            let other = *self.parked.keys().next().expect("checked above");
            self.focus(other);
        }
        if let Some(mut job) = self.parked.remove(&ns) {
            self.ended.insert(ns);
            self.names.registry.job_ended(ns);
            self.connects.job_ended(ns);
            if let (Some(px), Some(pj)) = (self.pmix.as_mut(), job.pmix.take()) {
                px.remove_job(pj);
            }
            let prefix = segment_prefix(&job.plan.job_id, self.node);
            drop(job);
            unlink_segments(&prefix);
            say_leftovers(ns, &crate::process::kill_leftovers(ns));
        }
    }
}

/// Logs the processes [`crate::process::kill_leftovers`] killed for job `ns`, if any.
pub(super) fn say_leftovers(ns: NsId, pids: &[u32]) {
    if !pids.is_empty() {
        tracing::warn!(
            "job {ns} ended with {} process(es) its ranks started still running (pids \
             {pids:?}): killed",
            pids.len()
        );
    }
}
