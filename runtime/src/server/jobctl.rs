//! Job control: a PMIx client's `PMIx_Job_control` (to the launcher, which decides what
//! it does to which jobs), and the launcher's signals to this node's processes.

use weft_pmix::server::Failure;
use weft_wireup::{JobAction, NsId, ProcId, ProcSel, Rank};

use super::State;
use crate::modex::ConnId;
use crate::wire::proto::{ServerMsg, ToLauncher, WireError};

impl State {
    /// A client's `PMIx_Job_control`: informational directives are answered at once; an
    /// action goes to the launcher, which applies it to the jobs or processes named (no
    /// target: the requestor's job).
    pub(super) fn pmix_job_control(&mut self, j: weft_pmix::server::JobControl) {
        use weft_pmix::server::JobCtrl;
        let action = match j.action {
            JobCtrl::Note(keys) => {
                tracing::debug!("PMIx_Job_control of {:?} notes {keys:?}", j.requestor);
                return j.reply.ok(None, Vec::new());
            }
            JobCtrl::Kill => JobAction::Kill,
            JobCtrl::Terminate => JobAction::Terminate,
            JobCtrl::Signal(s) => JobAction::Signal(s),
            JobCtrl::Pause => JobAction::Pause,
            JobCtrl::Resume => JobAction::Resume,
        };
        let Some(rank) = j.requestor.rank else {
            return j.reply.fail(Failure::Invalid);
        };
        let mut targets = Vec::new();
        for t in &j.targets {
            let ns = self.pmix.as_ref().and_then(|px| px.ns_of(&t.nspace));
            match ns {
                Some(ns) => targets.push((ns, t.rank)),
                None => {
                    tracing::warn!(
                        "PMIx_Job_control of rank {rank} of {}: no job {:?} here",
                        self.job.ns,
                        t.nspace
                    );
                    return j.reply.fail(Failure::NotFound);
                }
            }
        }
        if targets.is_empty() {
            targets.push((self.job.ns, None));
        }
        self.to_launcher(&ToLauncher::JobControl {
            from: ProcId::new(self.job.ns, rank),
            targets,
            action,
            via: "PMIx_Job_control".into(),
        });
        j.reply.ok(None, Vec::new());
    }

    /// A native client's job control (`Client::job_control`) of `targets`: a job this
    /// server does not serve (ended, or never was) or a rank beyond its job fails the
    /// request, naming it; otherwise the launcher is told and the request is done.
    pub(super) fn native_job_control(
        &mut self,
        rank: Rank,
        conn: ConnId,
        req: u64,
        targets: Vec<ProcSel>,
        action: JobAction,
    ) {
        let mut t = Vec::with_capacity(targets.len());
        for sel in targets {
            let size = self.job_size(sel.ns());
            let bad = match (sel, size) {
                (_, None) => Some(format!(
                    "no job {} in this runtime (it ended, or never was)",
                    sel.ns()
                )),
                (ProcSel::One(p), Some(n)) if p.rank >= n => {
                    Some(format!("{p}: job {} has {n} processes", p.ns))
                }
                _ => None,
            };
            if let Some(reason) = bad {
                let error = WireError::Invalid {
                    op: "job control".into(),
                    reason,
                };
                return self.send_client(conn, &ServerMsg::Failed { req, error });
            }
            t.push(match sel {
                ProcSel::One(p) => (p.ns, Some(p.rank)),
                ProcSel::All(ns) => (ns, None),
            });
        }
        self.to_launcher(&ToLauncher::JobControl {
            from: ProcId::new(self.job.ns, rank),
            targets: t,
            action,
            via: "job control".into(),
        });
        self.send_client(conn, &ServerMsg::Done { req });
    }

    /// The number of processes of job `ns`, if this server serves it.
    fn job_size(&self, ns: NsId) -> Option<u32> {
        let job = if self.job.ns == ns {
            &self.job
        } else {
            self.parked.get(&ns)?
        };
        Some(job.plan.job.size())
    }

    /// Sends signal `sig` to this node's processes among `procs` (a rank, or every
    /// process of a namespace).
    pub(super) fn signal_procs(&mut self, procs: &[(NsId, Option<Rank>)], sig: i32) {
        // A number that is no signal is refused here.
        let Some(sig) = rustix::process::Signal::from_named_raw(sig) else {
            tracing::warn!("signal {sig} asked for: no such signal");
            return;
        };
        for &(ns, rank) in procs {
            if self.focus(ns) {
                let acts = self.job.procs.signal(rank, sig);
                self.apply_procs(acts);
            }
        }
    }
}
