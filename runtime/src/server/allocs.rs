//! Allocation requests (`PMIx_Allocation_request`) of this node's processes: sent to the
//! launcher, which keeps the sessions; its answer goes back through the library, and the
//! news of every completed request (any node's) is kept for `PMIX_QUERY_ALLOC_STATUS` and
//! told to the asking job's processes here (`PMIX_NOTIFY_ALLOC_COMPLETE`).

use std::collections::{BTreeMap, HashMap};

use weft_pmix::server::{AllocDirective, Allocate, Failure, GroupReply, QueryAnswer};
use weft_wireup::{AllocRequest, Allocation, ProcId, Rank};

use super::State;
use crate::modex::ConnId;
use crate::wire::proto::{AllocOp, AllocReq, ServerMsg, SessionInfo, ToLauncher};

/// Who waits for an allocation's answer.
enum Asker {
    /// A PMIx client, through the library.
    Pmix(GroupReply),
    /// A native client's request `req` on connection `conn`.
    Native { conn: ConnId, req: u64 },
}

/// This node's allocation requests in flight, and what is known of every allocation.
#[derive(Default)]
pub(super) struct Allocs {
    waiting: HashMap<u64, Asker>,
    next: u64,
    /// Per allocation id, its state as `PMIX_QUERY_ALLOC_STATUS` answers it.
    known: BTreeMap<String, String>,
}

impl Allocs {
    /// A request for allocation `alloc_id` completed (`session`: its state; `None`: it
    /// was refused).
    fn on_event(&mut self, alloc_id: &str, session: Option<&SessionInfo>) {
        match session {
            Some(s) => self.record(s),
            // A failed request leaves an allocation that exists as it was (an extend
            // refused); only a name never granted is "failed".
            None if !alloc_id.is_empty() => {
                (self.known)
                    .entry(alloc_id.to_owned())
                    .or_insert_with(|| "failed".to_owned());
            }
            None => {}
        }
    }

    /// Records session `s`'s state under its allocation id.
    fn record(&mut self, s: &SessionInfo) {
        if !s.alloc_id.is_empty() {
            self.known.insert(s.alloc_id.clone(), describe(s));
        }
    }

    /// The state of allocation `alloc_id`, if one by that name was asked for.
    pub(super) fn status(&self, alloc_id: &str) -> Option<String> {
        self.known.get(alloc_id).cloned()
    }
}

/// How `PMIX_QUERY_ALLOC_STATUS` describes a session.
fn describe(s: &SessionInfo) -> String {
    if s.active {
        format!(
            "active: session {} on {} node{} ({})",
            s.id,
            s.nodes.len(),
            if s.nodes.len() == 1 { "" } else { "s" },
            s.hostnames.join(",")
        )
    } else {
        format!("ended: session {}", s.id)
    }
}

impl State {
    /// A client's `PMIx_Allocation_request`: to the launcher.
    pub(super) fn pmix_allocate(&mut self, a: Allocate) {
        let op = match a.directive {
            AllocDirective::New => AllocOp::New,
            AllocDirective::Extend => AllocOp::Extend,
            AllocDirective::Release => AllocOp::Release,
            AllocDirective::Other(d) => {
                tracing::warn!("PMIx_Allocation_request: directive {d} is not served");
                return a.reply.fail(Failure::NotSupported);
            }
        };
        let Some(rank) = a.requester.rank else {
            return a.reply.fail(Failure::Invalid);
        };
        if !a.ignored.is_empty() {
            tracing::info!(
                "PMIx_Allocation_request of rank {rank} of {}: {:?} not served (logical nodes \
                 are counted, nothing else)",
                self.job.ns,
                a.ignored
            );
        }
        let nodes = match a.nodes.map(u32::try_from) {
            None => None,
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => return a.reply.fail(Failure::OutOfResource),
        };
        let req = AllocReq {
            op,
            nodes,
            alloc_id: a.alloc_id,
            req_id: a.req_id,
            session: a.session,
            separate: a.separate,
        };
        self.ask_alloc(rank, Asker::Pmix(a.reply), req);
    }

    /// A native client's allocation request (`Client::allocate`).
    pub(super) fn native_allocate(&mut self, rank: Rank, conn: ConnId, req: u64, r: AllocRequest) {
        let a = AllocReq {
            op: r.op,
            nodes: r.nodes,
            alloc_id: r.alloc_id,
            req_id: None,
            session: r.session,
            separate: r.separate,
        };
        self.ask_alloc(rank, Asker::Native { conn, req }, a);
    }

    /// Sends local rank `rank`'s request to the launcher; `asker` gets the answer.
    fn ask_alloc(&mut self, rank: Rank, asker: Asker, req: AllocReq) {
        let qid = self.allocs.next;
        self.allocs.next += 1;
        self.allocs.waiting.insert(qid, asker);
        self.to_launcher(&ToLauncher::Alloc {
            qid,
            from: ProcId::new(self.job.ns, rank),
            req,
        });
    }

    /// The launcher answered allocation request `qid`.
    pub(super) fn alloc_done(&mut self, qid: u64, result: Result<SessionInfo, String>) {
        // The state is known here before the asker hears of it (the launcher's news of it,
        // `AllocEvent`, may come after the asker's next query).
        if let Ok(s) = &result {
            self.allocs.record(s);
        }
        let reply = match self.allocs.waiting.remove(&qid) {
            Some(Asker::Pmix(reply)) => reply,
            Some(Asker::Native { conn, req }) => {
                let result = result.map(|s| Allocation {
                    session: s.id,
                    alloc_id: s.alloc_id,
                    nodes: s.nodes,
                    hostnames: s.hostnames,
                    active: s.active,
                });
                return self.send_client(conn, &ServerMsg::Allocated { req, result });
            }
            None => {
                tracing::warn!(
                    "the launcher answered allocation {qid}, which nobody here asked for"
                );
                return;
            }
        };
        match result {
            Ok(s) => reply.answers(vec![QueryAnswer::Allocated {
                session: s.id,
                alloc_id: s.alloc_id,
                nodes: s.hostnames,
            }]),
            Err(why) => {
                tracing::warn!("PMIx_Allocation_request failed: {why}");
                let f = if why.contains("free") {
                    Failure::OutOfResource
                } else {
                    Failure::NotFound
                };
                reply.fail(f)
            }
        }
    }

    /// An allocation request of job `owner` completed (`None`: it failed).
    pub(super) fn alloc_event(
        &mut self,
        owner: ProcId,
        alloc_id: String,
        session: Option<SessionInfo>,
    ) {
        self.allocs.on_event(&alloc_id, session.as_ref());
        // A session the runtime itself made (`weft session new`) has no process to tell.
        if self.focus(owner.ns) && owner.rank < self.job.plan.job.size() {
            if let (Some(px), Some(pj)) = (self.pmix.as_ref(), self.job.pmix.as_ref()) {
                let id = session.map(|s| s.id);
                px.server
                    .notify_alloc_complete(&pj.nspace, owner.rank, &alloc_id, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_wireup::NsId;

    #[test]
    fn a_refused_request_fails_a_new_name_only() {
        let mut a = Allocs::default();
        let s = SessionInfo {
            id: 1,
            alloc_id: "A".into(),
            nodes: vec![0],
            hostnames: vec!["h".into()],
            owner: ProcId::new(NsId::FIRST, 0),
            active: true,
        };
        a.on_event("A", Some(&s));
        // An extend of A refused: A stays as it was.
        a.on_event("A", None);
        assert_eq!(
            a.status("A").as_deref(),
            Some("active: session 1 on 1 node (h)")
        );
        // A new name refused: failed.
        a.on_event("B", None);
        assert_eq!(a.status("B").as_deref(), Some("failed"));
    }
}
