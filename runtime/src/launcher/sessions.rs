//! Allocation sessions, decided without IO: the runtime's nodes are session 0 (the default
//! pool); an allocation request (`PMIx_Allocation_request`) carves a child session out of
//! the nodes no other child session holds, extends it or releases it. A session belongs to
//! the job whose process asked for it and ends with that job; a job spawned into a session
//! runs on its nodes and ends with it.

use std::collections::BTreeMap;

use weft_wireup::{NsId, ProcId};

use crate::wire::proto::{AllocOp, AllocReq, SessionInfo};

/// The most nodes one request may ask for.
const MAX_NODES: u32 = 1 << 16;

/// A child session.
#[derive(Debug, Clone)]
struct Session {
    alloc_id: String,
    req_id: Option<String>,
    nodes: Vec<u32>,
    /// The process that asked for it.
    from: ProcId,
    /// It does not end with that process's job (`PMIX_ALLOC_CHILD_SEP`).
    separate: bool,
}

/// The runtime's child sessions.
#[derive(Debug)]
pub(super) struct Sessions {
    /// The runtime's node names, by node id.
    hostnames: Vec<String>,
    /// The next session id (0 is the runtime's pool).
    next: u32,
    list: BTreeMap<u32, Session>,
}

impl Sessions {
    pub(super) fn new(hostnames: Vec<String>) -> Sessions {
        Sessions {
            hostnames,
            next: 1,
            list: BTreeMap::new(),
        }
    }

    /// The nodes no child session holds, in order.
    fn free(&self) -> Vec<u32> {
        (0..self.hostnames.len() as u32)
            .filter(|n| !self.list.values().any(|s| s.nodes.contains(n)))
            .collect()
    }

    fn info(&self, id: u32, s: &Session, active: bool) -> SessionInfo {
        SessionInfo {
            id,
            alloc_id: s.alloc_id.clone(),
            nodes: s.nodes.clone(),
            hostnames: (s.nodes.iter())
                .map(|&n| self.hostnames.get(n as usize).cloned().unwrap_or_default())
                .collect(),
            owner: s.from,
            active,
        }
    }

    /// The session `req` names: by id, else by allocation id.
    fn named(&self, req: &AllocReq) -> Result<u32, String> {
        match (req.session, &req.alloc_id) {
            (Some(id), _) if self.list.contains_key(&id) => Ok(id),
            (Some(id), _) => Err(format!("no session {id}")),
            (None, Some(a)) => self
                .by_alloc_id(a)
                .ok_or_else(|| format!("no allocation {a:?}")),
            (None, None) => {
                Err("the request names no session (PMIX_SESSION_ID or PMIX_ALLOC_ID)".into())
            }
        }
    }

    /// The session named `name`: its number, else its allocation id.
    pub(super) fn find(&self, name: &str) -> Option<u32> {
        match name.parse::<u32>() {
            Ok(id) if self.list.contains_key(&id) => Some(id),
            _ => self.by_alloc_id(name),
        }
    }

    /// The session of allocation `alloc_id`.
    pub(super) fn by_alloc_id(&self, alloc_id: &str) -> Option<u32> {
        (self.list.iter())
            .find(|(_, s)| s.alloc_id == alloc_id)
            .map(|(&id, _)| id)
    }

    /// The nodes of session `id` (0: every node of the runtime), if it exists.
    pub(super) fn nodes_of(&self, id: u32) -> Option<Vec<u32>> {
        if id == 0 {
            return Some((0..self.hostnames.len() as u32).collect());
        }
        self.list.get(&id).map(|s| s.nodes.clone())
    }

    /// Process `from` asks for `req`: the session's state after it, or why it cannot be
    /// done (nothing changes then).
    pub(super) fn on_request(
        &mut self,
        from: ProcId,
        req: &AllocReq,
    ) -> Result<SessionInfo, String> {
        let want = req.nodes.unwrap_or(1);
        if want == 0 || want > MAX_NODES {
            return Err(format!("{want} nodes: ask for 1 to {MAX_NODES}"));
        }
        match req.op {
            AllocOp::New => {
                if let Some(a) = &req.alloc_id {
                    if self.by_alloc_id(a).is_some() {
                        return Err(format!("allocation {a:?} exists already"));
                    }
                }
                let free = self.free();
                if (free.len() as u32) < want {
                    return Err(format!(
                        "{want} node{} asked for, {} free of the runtime's {}",
                        if want == 1 { "" } else { "s" },
                        free.len(),
                        self.hostnames.len()
                    ));
                }
                let id = self.next;
                self.next += 1;
                let s = Session {
                    alloc_id: req
                        .alloc_id
                        .clone()
                        .unwrap_or_else(|| format!("weft-alloc-{id}")),
                    req_id: req.req_id.clone(),
                    nodes: free[..want as usize].to_vec(),
                    from,
                    separate: req.separate,
                };
                let info = self.info(id, &s, true);
                self.list.insert(id, s);
                Ok(info)
            }
            AllocOp::Extend => {
                let id = self.named(req)?;
                let free = self.free();
                if (free.len() as u32) < want {
                    return Err(format!(
                        "{want} more node{} asked for session {id}, {} free",
                        if want == 1 { "" } else { "s" },
                        free.len()
                    ));
                }
                let s = self.list.get_mut(&id).expect("named");
                s.nodes.extend_from_slice(&free[..want as usize]);
                let s = s.clone();
                Ok(self.info(id, &s, true))
            }
            AllocOp::Release => {
                let id = self.named(req)?;
                let s = self.list.remove(&id).expect("named");
                Ok(self.info(id, &s, false))
            }
        }
    }

    /// Job `ns` ended: the sessions it asked for end with it.
    pub(super) fn on_job_end(&mut self, ns: NsId) -> Vec<SessionInfo> {
        let ids: Vec<u32> = (self.list.iter())
            .filter(|(_, s)| s.from.ns == ns && !s.separate)
            .map(|(&id, _)| id)
            .collect();
        let mut out = Vec::new();
        for id in ids {
            if let Some(s) = self.list.remove(&id) {
                out.push(self.info(id, &s, false));
            }
        }
        out
    }

    /// `weft ps`'s lines about the sessions (`runtime`: the owner of the sessions
    /// `weft session new` made, in a persistent runtime).
    pub(super) fn table(&self, out: &mut String, runtime: Option<ProcId>) {
        use std::fmt::Write;
        for (id, s) in &self.list {
            let by = if Some(s.from) == runtime {
                "made by weft session new".to_owned()
            } else {
                format!("asked by {}", s.from)
            };
            let _ = writeln!(
                out,
                "session {id}  {}{}  nodes {:?}  {by}",
                s.alloc_id,
                s.req_id
                    .as_ref()
                    .map(|r| format!(" (request {r})"))
                    .unwrap_or_default(),
                s.nodes,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: AllocOp, nodes: Option<u32>, alloc_id: Option<&str>) -> AllocReq {
        AllocReq {
            op,
            nodes,
            alloc_id: alloc_id.map(str::to_owned),
            req_id: None,
            session: None,
            separate: false,
        }
    }

    #[test]
    fn sessions_take_free_nodes_extend_release_and_end_with_their_job() {
        let mut s = Sessions::new(vec!["a".into(), "b".into(), "c".into()]);
        let p = ProcId::new(NsId(1), 0);
        let a = s
            .on_request(p, &req(AllocOp::New, Some(2), Some("A")))
            .unwrap();
        assert_eq!(
            (a.id, a.nodes.clone(), a.hostnames.clone()),
            (1, vec![0, 1], vec!["a".into(), "b".into()])
        );
        assert_eq!(a.alloc_id, "A");
        // One node is left: a second new one of 2 fails naming the numbers, changes nothing.
        let e = s
            .on_request(p, &req(AllocOp::New, Some(2), None))
            .unwrap_err();
        assert_eq!(e, "2 nodes asked for, 1 free of the runtime's 3");
        assert!(s
            .on_request(p, &req(AllocOp::New, None, Some("A")))
            .unwrap_err()
            .contains("exists already"));
        let b = s
            .on_request(ProcId::new(NsId(2), 1), &req(AllocOp::New, None, None))
            .unwrap();
        assert_eq!(
            (b.id, b.nodes.clone(), b.alloc_id.clone()),
            (2, vec![2], "weft-alloc-2".into())
        );
        assert!(s
            .on_request(p, &req(AllocOp::Extend, Some(1), Some("A")))
            .unwrap_err()
            .contains("0 free"));
        assert_eq!(s.nodes_of(0), Some(vec![0, 1, 2]));
        assert_eq!(s.nodes_of(2), Some(vec![2]));
        assert_eq!(s.by_alloc_id("A"), Some(1));
        // Released: its nodes are free again, and an extend takes one.
        let r = s
            .on_request(p, &req(AllocOp::Release, None, Some("weft-alloc-2")))
            .unwrap();
        assert!(!r.active);
        assert_eq!(s.nodes_of(2), None);
        let x = s
            .on_request(p, &req(AllocOp::Extend, None, Some("A")))
            .unwrap();
        assert_eq!(x.nodes, vec![0, 1, 2]);
        assert!(s
            .on_request(p, &req(AllocOp::Release, None, Some("nope")))
            .unwrap_err()
            .contains("no allocation \"nope\""));
        assert!(s.on_request(p, &req(AllocOp::New, Some(0), None)).is_err());
        // A separated session outlives its job.
        let mut sep = req(AllocOp::New, Some(1), Some("S"));
        sep.separate = true;
        s.on_request(p, &req(AllocOp::Release, None, Some("A")))
            .unwrap();
        let kept = s.on_request(ProcId::new(NsId(2), 0), &sep).unwrap();
        assert_eq!(s.on_job_end(NsId(2)), vec![]);
        assert_eq!(s.by_alloc_id("S"), Some(kept.id));
        s.on_request(p, &req(AllocOp::Release, None, Some("S")))
            .unwrap();
        let a = s
            .on_request(p, &req(AllocOp::New, Some(2), Some("A")))
            .unwrap();
        assert_eq!(a.nodes, vec![0, 1]);
        // Its job ends: the session goes.
        let ended = s.on_job_end(NsId(1));
        assert_eq!(ended.len(), 1);
        assert!(!ended[0].active);
        assert_eq!(s.nodes_of(1), None);
    }
}
