//! The first job's process table, as the launcher learns it (every node's servers
//! report their processes' pids once all have started): what a legacy debugger reads
//! through MPIR (`weft`'s `MPIR_proctable`), handed to the hook the program set with
//! [`on_proc_table`].

use std::collections::BTreeSet;
use std::sync::OnceLock;

use weft_wireup::Rank;

use crate::wire::proto::JobPlan;

/// One process of the table, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRow {
    /// The host it runs on (this machine's name for a logical node).
    pub host: String,
    /// The program it runs (as given on the command line).
    pub executable: String,
    /// Its pid (0: it could not start).
    pub pid: u32,
}

/// What is called, once, when the first job's table is complete; it returns whether a
/// debugger that stopped the launcher there has let it go on, so that the job, held in
/// init for it, is released.
pub type ProcTableHook = fn(&[ProcRow]) -> bool;

static HOOK: OnceLock<ProcTableHook> = OnceLock::new();

/// Has `hook` called with the first job's process table once every process of it has
/// started (or failed to), before the launcher goes on (the `weft` binary fills its
/// MPIR table there). Only the first call sets it.
pub fn on_proc_table(hook: ProcTableHook) {
    let _ = HOOK.set(hook);
}

/// Calls the hook, if one is set: whether to release the job.
pub(super) fn publish(rows: &[ProcRow]) -> bool {
    HOOK.get().is_some_and(|h| h(rows))
}

/// Writes the process lines of job `plan` for `weft ps`: rank, node, pid (as far as the
/// nodes reported them: `pids`), and whether it still runs (`exited`).
pub(super) fn write_procs(
    out: &mut String,
    plan: &JobPlan,
    pids: &[u32],
    exited: impl Fn(Rank) -> bool,
) {
    use std::fmt::Write;
    let n = plan.job.procs.len();
    let _ = writeln!(
        out,
        "job {}  {n} process{}",
        plan.job.nspace,
        if n == 1 { "" } else { "es" }
    );
    for (r, p) in plan.job.procs.iter().enumerate() {
        let host = plan
            .job
            .nodes
            .get(p.node as usize)
            .map_or("?", |n| n.hostname.as_str());
        let pid = match pids.get(r).copied().unwrap_or(0) {
            0 => "-".to_owned(),
            pid => pid.to_string(),
        };
        let state = if exited(r as Rank) {
            "exited"
        } else if pid == "-" {
            "starting"
        } else {
            "running"
        };
        let _ = writeln!(
            out,
            "rank {r}  node {} ({host})  pid {pid}  {state}",
            p.node
        );
    }
}

/// The first job's pids as the nodes report them.
#[derive(Debug)]
pub(super) struct FirstPids {
    pids: Vec<u32>,
    /// The nodes holding processes of the job that have not reported.
    left: BTreeSet<u32>,
}

impl FirstPids {
    /// The pids reported so far, by rank (0: not yet).
    pub(super) fn pids(&self) -> &[u32] {
        &self.pids
    }

    pub(super) fn new(plan: &JobPlan) -> FirstPids {
        FirstPids {
            pids: vec![0; plan.job.procs.len()],
            left: plan.job.procs.iter().map(|p| p.node).collect(),
        }
    }

    /// Node `node` reported `pids`: the table, once every node has.
    pub(super) fn on_report(
        &mut self,
        plan: &JobPlan,
        node: u32,
        pids: &[(Rank, u32)],
    ) -> Option<Vec<ProcRow>> {
        for &(r, pid) in pids {
            if let Some(p) = self.pids.get_mut(r as usize) {
                *p = pid;
            }
        }
        if !self.left.remove(&node) {
            return None;
        }
        if !self.left.is_empty() {
            return None;
        }
        let here = crate::jobdir::hostname();
        let rows = self.pids.iter().enumerate().map(|(r, &pid)| {
            let (host, executable) = crate::jobdir::host_and_program(plan, r, &here);
            ProcRow {
                host,
                executable,
                pid,
            }
        });
        Some(rows.collect())
    }
}
