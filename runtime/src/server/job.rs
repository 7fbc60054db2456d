//! What a server keeps of one job: its plan, its node's datastore segment, its
//! processes, and the concerns whose state belongs to the job (its collectives, its
//! committed data, its groups and their leaders, its process sets, its invitations and
//! its PMI front end). The node's own state (the actor's links, the PGCID allocator, the
//! embedded PMIx server) stays in `State`, so a server can keep several jobs.

use std::sync::Arc;

use weft_shm::StoreWriter;
use weft_wireup::NsId;

use super::fence::Fences;
use super::groups::Groups;
use super::invitations::Invitations;
use super::leaders::Leaders;
use super::pmi;
use super::procs::Processes;
use super::psets::Psets;
use crate::modex::Modex;
use crate::wire::proto::JobPlan;

/// One job on this server's node.
pub(super) struct Job {
    /// The job's namespace in its runtime.
    pub(super) ns: NsId,
    pub(super) plan: Arc<JobPlan>,
    /// The job's datastore segment on this node.
    pub(super) store: StoreWriter,
    /// The node's processes and the job's ended ranks (`procs`).
    pub(super) procs: Processes,
    /// Collectives between servers (`fence`).
    pub(super) fences: Fences,
    /// Committed data, the cache of other nodes' data, and the gets waiting on them.
    pub(super) modex: Modex,
    /// Groups with members on this node (`groups`).
    pub(super) groups: Groups,
    /// Leader selection of groups whose leader failed (`leaders`).
    pub(super) leaders: Leaders,
    /// Process sets defined while the job runs (`psets`).
    pub(super) psets: Psets,
    /// Groups being formed by invitation (`invitations`).
    pub(super) invitations: Invitations,
    /// The PMI-1 and PMI-2 front end: its connections and its keys (`pmi`).
    pub(super) pmi: pmi::PmiFront,
    /// What the node's PMIx server keeps of the job, when it serves it PMIx (`pmix`).
    pub(super) pmix: Option<super::pmix::PmixJob>,
    /// Every rank's pid, as far as known here (`pids`).
    pub(super) pids: super::pids::Pids,
    /// Its processes held in init for a debugger (`hold`).
    pub(super) hold: super::hold::Hold,
}

impl Job {
    /// The app context of rank `rank` (0 for a rank not in the job).
    pub(super) fn app_of(&self, rank: weft_wireup::Rank) -> u32 {
        self.plan.job.procs.get(rank as usize).map_or(0, |p| p.app)
    }

    /// The job of `plan` as the server of `node` starts it, before any event.
    pub(super) fn new(node: u32, plan: Arc<JobPlan>, store: StoreWriter) -> Job {
        let nodes = || plan.job.procs.iter().map(|p| p.node).collect();
        let local = plan.job.ranks_on(node).into_iter();
        Job {
            ns: plan.ns,
            procs: Processes::new(
                node,
                plan.job.size() as usize,
                local.map(|r| (r, super::random_u64())),
            ),
            fences: Fences::new(node, nodes()),
            modex: Modex::new(node, nodes()),
            groups: Groups::new(node, nodes()),
            leaders: Leaders::new(node),
            psets: Psets::new(
                node,
                plan.job.num_nodes(),
                plan.job.size(),
                plan.job.psets.iter().map(|p| p.name.clone()).collect(),
            ),
            invitations: Invitations::new(node, nodes()),
            pmi: pmi::PmiFront::default(),
            pmix: None,
            pids: super::pids::Pids::new(plan.job.size() as usize, plan.job.ranks_on(node)),
            hold: super::hold::Hold::new(plan.stop_in_init),
            store,
            plan,
        }
    }
}
