//! Process sets across servers.

use super::*;

impl State {
    pub(super) fn pset_request(
        &mut self,
        conn: ConnId,
        req: u64,
        name: String,
        members: Option<Vec<Rank>>,
    ) {
        let qid = self.next_qid;
        self.next_qid += 1;
        self.pset_waiters.insert(qid, (conn, req));
        let from = self.node;
        if self.node == 0 {
            self.decide_pset(name, members, from, qid);
        } else {
            self.send_peer(
                0,
                &PeerMsg::PsetChange {
                    name,
                    members,
                    from,
                    qid,
                },
            );
        }
    }

    /// Root server: checks a process-set change and applies it on every server.
    pub(super) fn decide_pset(
        &mut self,
        name: String,
        members: Option<Vec<Rank>>,
        from: u32,
        qid: u64,
    ) {
        let size = self.plan.job.size();
        let launch = self.plan.job.psets.iter().any(|p| p.name == name)
            || name == weft_wireup::PSET_SELF
            || name.starts_with("mpi://");
        let error = match &members {
            _ if name.is_empty() => Some("the name is empty".to_owned()),
            _ if launch => Some(format!("{name:?} is a built-in or launch process set")),
            Some(_) if self.runtime_psets.contains_key(&name) => {
                Some(format!("process set {name:?} already exists"))
            }
            Some(m) if m.is_empty() => Some("no members".to_owned()),
            Some(m) if m.iter().any(|&r| r >= size) => Some(format!(
                "members {m:?} name ranks outside the job (size {size})"
            )),
            None if !self.runtime_psets.contains_key(&name) => Some(format!(
                "no process set {name:?} was defined while the job runs"
            )),
            _ => None,
        };
        let members = members.map(|mut m| {
            m.sort_unstable();
            m.dedup();
            m
        });
        let msg = PeerMsg::PsetChanged {
            name,
            members,
            qid,
            error: error.clone(),
        };
        if error.is_some() {
            // Only the asker needs to know.
            if from == self.node {
                self.on_peer(msg);
            } else {
                self.send_peer(from, &msg);
            }
            return;
        }
        for n in 0..self.plan.job.num_nodes() {
            if n == self.node {
                self.on_peer(msg.clone());
            } else {
                self.send_peer(n, &msg);
            }
        }
    }

    /// Applies a process-set change decided by the root server (and answers the asker).
    pub(super) fn pset_changed(
        &mut self,
        name: String,
        members: Option<Vec<Rank>>,
        qid: u64,
        error: Option<String>,
    ) {
        if let Some((conn, req)) = self.pset_waiters.remove(&qid) {
            let msg = match &error {
                None => ServerMsg::Done { req },
                Some(reason) => ServerMsg::Failed {
                    req,
                    error: WireError::Invalid {
                        op: format!("pset change of {name:?}"),
                        reason: reason.clone(),
                    },
                },
            };
            self.send_client(conn, &msg);
        }
        if error.is_some() {
            return;
        }
        let code = match &members {
            Some(m) => {
                self.runtime_psets.insert(name.clone(), m.clone());
                EventCode::PsetDefined
            }
            None => {
                self.runtime_psets.remove(&name);
                EventCode::PsetDeleted
            }
        };
        let names: Vec<String> = self.runtime_psets.keys().cloned().collect();
        let enc = postcard::to_stdvec(&members).expect("encode");
        self.store_put(&keys::pset(&name), &enc);
        let enc = postcard::to_stdvec(&names).expect("encode");
        self.store_put(keys::RUNTIME_PSETS, &enc);
        let e = WireEvent {
            code,
            group: None,
            rank: None,
            pset: Some(name),
            members: members.unwrap_or_default(),
            reason: String::new(),
        };
        let local: Vec<Rank> = self.procs.keys().copied().collect();
        for r in local {
            self.emit(r, &e);
        }
    }
}
