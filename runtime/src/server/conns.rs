//! The connections with the other nodes' servers (TCP): tasks that parse their frames
//! and forward them to the server's actor, and write what it sends them; and the
//! dispatch of their messages in the actor (`on_peer`).

use std::collections::HashMap;
use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::wire::frame::{self, MAX_PEER_FRAME};
use crate::wire::proto::{JobMsg, PeerMsg, Procs, MAGIC, RUNTIME_PROTOCOL_VERSION};

use super::{Event, State};

pub(super) async fn peer_reader(s: TcpStream, secret: [u64; 2], ev: UnboundedSender<Event>) {
    s.set_nodelay(true).ok();
    let (mut r, _w) = s.into_split();
    let node = match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
        Ok(PeerMsg::Hello {
            magic,
            version,
            secret: s2,
            node,
        }) if magic == MAGIC && version == RUNTIME_PROTOCOL_VERSION && s2 == secret => node,
        Ok(PeerMsg::Hello { version, .. }) if version != RUNTIME_PROTOCOL_VERSION => {
            tracing::warn!("dropping peer connection: it speaks protocol version {version}, this server {RUNTIME_PROTOCOL_VERSION}");
            return;
        }
        Ok(_) => {
            tracing::warn!("dropping peer connection: bad hello (wrong magic or job secret)");
            return;
        }
        Err(e) => {
            tracing::warn!("dropping peer connection: {e}");
            return;
        }
    };
    loop {
        match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Peer { msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = ev.send(Event::PeerLost {
                    node,
                    reason: e.to_string(),
                });
                return;
            }
        }
    }
}

pub(super) async fn peer_writer(
    addr: SocketAddr,
    hello: Vec<u8>,
    node: u32,
    mut rx: UnboundedReceiver<Vec<u8>>,
    ev: UnboundedSender<Event>,
) {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: format!("cannot connect to {addr}: {e}"),
            });
            return;
        }
    };
    s.set_nodelay(true).ok();
    if let Err(e) = frame::write_async(&mut s, &hello).await {
        let _ = ev.send(Event::PeerLost {
            node,
            reason: e.to_string(),
        });
        return;
    }
    while let Some(f) = rx.recv().await {
        if let Err(e) = frame::write_async(&mut s, &f).await {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: e.to_string(),
            });
            return;
        }
    }
}

/// The other servers' connections: their addresses, the job's secret their hello
/// carries, and the writers of those connected.
pub(super) struct PeerLinks {
    addrs: Vec<SocketAddr>,
    secret: [u64; 2],
    tx: HashMap<u32, UnboundedSender<Vec<u8>>>,
}

impl PeerLinks {
    /// The servers at `addrs` (by node) of a job with `secret`, none connected yet.
    pub(super) fn new(addrs: Vec<SocketAddr>, secret: [u64; 2]) -> PeerLinks {
        PeerLinks {
            addrs,
            secret,
            tx: HashMap::new(),
        }
    }

    /// Sends frame `f` to the server of `node` from the server of `me`, connecting
    /// first when there is no connection (its losses are reported on `ev`).
    pub(super) fn send(&mut self, me: u32, node: u32, f: Vec<u8>, ev: &UnboundedSender<Event>) {
        if let Some(tx) = self.tx.get(&node) {
            if tx.send(f.clone()).is_ok() {
                return;
            }
        }
        let Some(&addr) = self.addrs.get(node as usize) else {
            tracing::error!("no address for node {node}");
            return;
        };
        let (tx, rx) = unbounded_channel();
        let hello = frame::encode(&PeerMsg::Hello {
            magic: MAGIC,
            version: RUNTIME_PROTOCOL_VERSION,
            secret: self.secret,
            node: me,
        });
        tokio::spawn(peer_writer(addr, hello, node, rx, ev.clone()));
        let _ = tx.send(f);
        self.tx.insert(node, tx);
    }

    /// The connection to the server of `node` closed: the next send connects anew.
    pub(super) fn lost(&mut self, node: u32) {
        self.tx.remove(&node);
    }

    /// Frames for the server of `node` go to `tx` (a test's stand-in connection).
    #[cfg(test)]
    pub(super) fn connected(&mut self, node: u32, tx: UnboundedSender<Vec<u8>>) {
        self.tx.insert(node, tx);
    }
}

impl State {
    /// A message of another server: about one job, which is made the one at hand.
    pub(super) fn on_peer(&mut self, msg: PeerMsg) {
        match msg {
            PeerMsg::Hello { .. } => {}
            PeerMsg::Names(m) => self.on_names_msg(m),
            PeerMsg::Connect(m) => self.on_connect_msg(m),
            PeerMsg::Job { ns, msg } if self.focus(ns) => self.on_job_msg(msg),
            PeerMsg::Job { ns, msg } if self.ended.contains(&ns) => {
                tracing::debug!(
                    "a message from another server about {ns}, which ended here: {msg:?}"
                );
            }
            PeerMsg::Job { ns, msg } => tracing::error!(
                "ignoring a message from another server about namespace {ns}, which this \
                 server does not serve (it serves {:?}): {msg:?}",
                self.namespaces()
            ),
        }
    }

    /// A message between the servers of this server's job.
    fn on_job_msg(&mut self, msg: JobMsg) {
        let size = self.job.plan.job.size();
        let bad_id = match &msg {
            JobMsg::Gather { id, .. }
            | JobMsg::Abort { id, .. }
            | JobMsg::ArrivalQuery { id, .. } => match &id.procs {
                Procs::List(v) => {
                    v.iter().any(|&r| r >= size) || v.windows(2).any(|w| w[0] >= w[1])
                }
                Procs::All => false,
            },
            JobMsg::ModexReq { rank, .. }
            | JobMsg::ModexResp { rank, .. }
            | JobMsg::ProcGone { rank, .. } => *rank >= size,
            _ => false,
        };
        if bad_id {
            tracing::error!("ignoring a malformed message from another server (ranks outside the job or unsorted): {msg:?}");
            return;
        }
        match msg {
            msg @ (JobMsg::Gather { .. }
            | JobMsg::Abort { .. }
            | JobMsg::ArrivalQuery { .. }
            | JobMsg::ArrivalReply { .. }) => self.fence_peer(msg),
            // The owner answers when the rank commits (or dies); each waiter's own
            // timeout is enforced here, so a late answer still serves the waiters left.
            JobMsg::ModexReq {
                qid,
                rank,
                key,
                wait,
            } => {
                let acts = self.job.modex.serve(qid, rank, key, wait);
                self.apply(acts);
            }
            JobMsg::ModexCancel { qid } => self.job.modex.cancel(qid),
            JobMsg::PmixDmodexReq { qid, rank } => self.pmix_serve(qid, rank),
            JobMsg::PmixDmodexResp { qid, result } => self.pmix_served(qid, result),
            JobMsg::PmixEvent {
                code,
                source,
                range,
                group,
                members,
                info,
            } => self.pmix_event_arrived(code, source, range, group, members, info),
            JobMsg::PmixToolEvent {
                code,
                source,
                range,
                info,
            } => self.tool_event_arrived(code, &source, range, &info),
            JobMsg::ModexResp { qid, rank, result } => {
                let acts = self.job.modex.answer(qid, rank, result);
                self.apply(acts);
            }
            JobMsg::ProcGone {
                rank,
                reason,
                joined,
                finalized,
            } => self.proc_gone(rank, reason, joined.into_iter().collect(), finalized),
            JobMsg::GroupLeft { id, rank } => {
                let acts = self.job.groups.on_member_left(&id, rank);
                self.apply_groups(acts);
            }
            JobMsg::LeaderClaim {
                id,
                rank,
                from,
                nodes,
            } => {
                let ended = &self.job.procs;
                let acts = self
                    .job
                    .leaders
                    .on_decide(id, rank, from, nodes, |r| ended.is_gone(r));
                self.apply_leaders(acts);
            }
            JobMsg::LeaderDecision {
                id,
                claimant,
                winner,
            } => {
                let acts = self.job.leaders.on_decision(id, claimant, winner);
                self.apply_leaders(acts);
            }
            JobMsg::LeaderSelected { id, rank } => {
                let gone = self.job.procs.is_gone(rank);
                let acts = self.job.groups.on_leader_selected(&id, rank, gone);
                self.apply_groups(acts);
            }
            JobMsg::PsetChange {
                name,
                members,
                from,
                qid,
            } => {
                let acts = self.job.psets.on_change(name, members, from, qid);
                self.apply_psets(acts);
            }
            msg @ (JobMsg::Invite { .. }
            | JobMsg::InviteReply { .. }
            | JobMsg::PgcidResp { .. }
            | JobMsg::GroupFormed { .. }) => self.invitations_peer(msg),
            JobMsg::PgcidReq { qid, from } => {
                let pgcid = self.pgcids.take();
                self.send_peer(from, &JobMsg::PgcidResp { qid, pgcid });
            }
            JobMsg::PsetChanged {
                name,
                members,
                qid,
                error,
            } => {
                let acts = self.job.psets.on_changed(name, members, qid, error);
                self.apply_psets(acts);
            }
        }
    }
}
