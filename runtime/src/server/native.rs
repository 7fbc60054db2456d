//! Weft's native protocol, the first of the server's front ends: a process's connection
//! over the node's Unix socket (framed `ClientMsg` requests, `ServerMsg` replies), its
//! hello, and the dispatch of its requests to the core's operations (commits, fences,
//! gets, groups, process sets, finalize), which reply through the connection's `Out`
//! channel. Other front ends (PMIx, PMI) are to translate their clients' requests into
//! the same operations.

use std::io;

use tokio::net::UnixStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use weft_wireup::{ProcId, Rank};

use super::{Event, Out, State};
use crate::modex::{ConnId, GetFlags};
use crate::wire::frame::{self, FrameError, MAX_CLIENT_FRAME};
use crate::wire::proto::{
    ClientMsg, CollKind, HelloHead, ServerMsg, WireError, MAGIC, PROTOCOL_VERSION,
};

pub(super) async fn client_conn(s: UnixStream, conn: ConnId, uid: u32, ev: UnboundedSender<Event>) {
    match s.peer_cred() {
        Ok(c) if c.uid() == uid => {}
        Ok(c) => {
            tracing::warn!(
                "dropping client connection: peer uid {} is not the job owner's uid {uid}",
                c.uid()
            );
            return;
        }
        Err(e) => {
            tracing::warn!("dropping client connection: cannot read peer credentials: {e}");
            return;
        }
    }
    let (mut r, mut w) = s.into_split();
    let hello = tokio::time::timeout(
        crate::wire::proto::HELLO_TIMEOUT,
        frame::read_async_bytes(&mut r, MAX_CLIENT_FRAME),
    )
    .await;

    let bytes = match hello {
        Err(_) => {
            let t = crate::wire::proto::HELLO_TIMEOUT.as_secs();
            return refuse(&mut w, format!("no hello within {t} s (HELLO_TIMEOUT)")).await;
        }
        Ok(Err(e)) => return refuse(&mut w, format!("bad hello: {e}")).await,
        Ok(Ok(bytes)) => bytes,
    };
    // The fields every version's hello starts with first: a hello of another version
    // need not decode whole, and is refused by its version.
    if let Ok(HelloHead::Hello { magic, version }) = frame::decode(&bytes) {
        if magic != MAGIC {
            return refuse(&mut w, format!("bad magic {magic:?} in hello")).await;
        }
        if version != PROTOCOL_VERSION {
            let why = format!(
                "client speaks protocol version {version}, this server speaks {PROTOCOL_VERSION}"
            );
            return refuse(&mut w, why).await;
        }
    }
    let (proc, token) = match frame::decode::<ClientMsg>(&bytes) {
        Ok(ClientMsg::Hello {
            rank, token, ns, ..
        }) => (ProcId::new(ns, rank), token),
        Ok(other) => {
            return refuse(
                &mut w,
                format!("first message is not a hello: {}", msg_name(&other)),
            )
            .await
        }
        Err(e) => return refuse(&mut w, format!("bad hello: {e}")).await,
    };
    let (tx, mut rx) = unbounded_channel::<Out>();
    tokio::spawn(async move {
        while let Some(o) = rx.recv().await {
            match o {
                Out::Frame(f) => {
                    if frame::write_async(&mut w, &f).await.is_err() {
                        break;
                    }
                }
                Out::Close => break,
            }
        }
    });
    if ev
        .send(Event::ClientHello {
            conn,
            proc,
            token,
            tx,
        })
        .is_err()
    {
        return;
    }
    loop {
        match frame::read_async::<ClientMsg>(&mut r, MAX_CLIENT_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Client { conn, msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let reason = match e {
                    FrameError::Closed => String::new(),
                    FrameError::Io(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        String::new()
                    }
                    e => {
                        tracing::warn!("dropping client connection of rank {}: {e}", proc.rank);
                        e.to_string()
                    }
                };
                let _ = ev.send(Event::ClientGone { conn, reason });
                return;
            }
        }
    }
}

pub(super) async fn refuse(w: &mut tokio::net::unix::OwnedWriteHalf, reason: String) {
    tracing::warn!("dropping client connection: {reason}");
    let _ = frame::write_async(w, &frame::encode(&ServerMsg::Refused { reason })).await;
}

pub(super) fn msg_name(m: &ClientMsg) -> &'static str {
    match m {
        ClientMsg::Hello { .. } => "hello",
        ClientMsg::Commit { .. } => "commit",
        ClientMsg::Fence { .. } => "fence",
        ClientMsg::Get { .. } => "get",
        ClientMsg::Finalize { .. } => "finalize",
        ClientMsg::Group { .. } => "group",
        ClientMsg::GroupQuery { .. } => "group query",
        ClientMsg::GroupLeave { .. } => "group leave",
        ClientMsg::LeaderClaim { .. } => "leader claim",
        ClientMsg::PsetDefine { .. } => "pset define",
        ClientMsg::PsetDelete { .. } => "pset delete",
        ClientMsg::GroupInvite { .. } => "group invite",
        ClientMsg::GroupJoin { .. } => "group join",
        ClientMsg::Spawn { .. } => "spawn",
        ClientMsg::Names { .. } => "names",
        ClientMsg::JobControl { .. } => "job control",
        ClientMsg::Allocate { .. } => "allocate",
        ClientMsg::Connect { .. } => "connect",
    }
}

impl State {
    pub(super) fn on_hello(
        &mut self,
        conn: ConnId,
        proc: ProcId,
        token: u64,
        tx: UnboundedSender<Out>,
    ) {
        let refuse = |reason: String| {
            tracing::warn!(
                "dropping client connection claiming rank {}: {reason}",
                proc.rank
            );
            let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Refused { reason })));
            let _ = tx.send(Out::Close);
        };
        let rank = match self.own_rank(proc) {
            Ok(rank) => rank,
            Err(reason) => return refuse(reason),
        };
        // Held for a debugger: answered at the release (`hold`).
        if self.job.hold.holds() {
            return self.hold_hello(conn, proc, token, tx);
        }
        let early = match self.job.procs.on_hello(rank, token, conn) {
            Ok(early) => early,
            Err(reason) => return refuse(reason),
        };
        let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Welcome {
            version: PROTOCOL_VERSION,
            datastore: self.job.store.name().to_owned(),
            nspace: self.job.plan.job.nspace.clone(),
            ns: self.job.ns,
            parent: self.job.plan.parent.as_ref().map(|(p, _)| *p),
        })));
        for e in early {
            let _ = tx.send(Out::Frame(frame::encode(&ServerMsg::Event(e))));
        }
        self.io.clients.insert(conn, (Some(proc), tx));
    }

    /// Request `msg` of local rank `rank` of the focused job, on connection `conn`.
    pub(super) fn on_client(&mut self, conn: ConnId, rank: Rank, msg: ClientMsg) {
        match msg {
            ClientMsg::Hello { .. } => {
                // A protocol violation like an undecodable frame: drop this client.
                tracing::warn!("dropping rank {rank}'s connection: it sent a second hello");
                if let Some((_, tx)) = self.io.clients.get(&conn) {
                    let _ = tx.send(Out::Close);
                }
                self.handle(Event::ClientGone {
                    conn,
                    reason: "it sent a second hello".into(),
                });
            }
            ClientMsg::Commit { entries } => self.commit(rank, entries),
            ClientMsg::Fence {
                req,
                id,
                mode,
                timeout_ms,
            } => {
                if id.kind != CollKind::Fence {
                    let error = WireError::Invalid {
                        op: "fence".into(),
                        reason: "a fence request carried a group collective id".into(),
                    };
                    return self.send_client(conn, &ServerMsg::Failed { req, error });
                }
                self.coll_arrive(rank, conn, req, id, mode, timeout_ms, None)
            }
            ClientMsg::Group {
                req,
                id,
                directives,
                timeout_ms,
            } => self.group_arrive(rank, conn, req, id, directives, timeout_ms),
            ClientMsg::GroupQuery { req } => {
                let acts = self.job.groups.on_query(conn, req);
                self.apply_groups(acts);
            }
            ClientMsg::GroupLeave { req, id } => {
                let acts = self.job.groups.on_leave(rank, conn, req, id);
                self.apply_groups(acts);
            }
            ClientMsg::LeaderClaim { req, id } => self.leader_claim(rank, conn, req, id),
            ClientMsg::PsetDefine { req, name, members } => {
                let Some(members) = self.own_ranks_or_fail(conn, req, "pset define", &members)
                else {
                    return;
                };
                let acts = self.job.psets.on_request(conn, req, name, Some(members));
                self.apply_psets(acts);
            }
            ClientMsg::PsetDelete { req, name } => {
                let acts = self.job.psets.on_request(conn, req, name, None);
                self.apply_psets(acts);
            }
            ClientMsg::GroupInvite {
                req,
                id,
                procs,
                directives,
                timeout_ms,
            } => {
                let Some(procs) = self.own_ranks_or_fail(conn, req, "group invite", &procs) else {
                    return;
                };
                self.group_invite(rank, conn, req, id, procs, directives, timeout_ms)
            }
            ClientMsg::GroupJoin {
                req,
                id,
                leader,
                accept,
            } => {
                let Some(leader) = self.own_rank_or_fail(conn, req, "group join", leader) else {
                    return;
                };
                self.group_join(rank, conn, req, id, leader, accept)
            }
            ClientMsg::Get {
                req,
                proc,
                key,
                refresh,
                local_only,
                immediate,
                timeout_ms,
            } => {
                let flags = GetFlags {
                    refresh,
                    local_only,
                    immediate,
                };
                if proc.ns != self.job.ns && self.job_of(proc.ns).is_some() {
                    return self.get_connected(conn, req, proc, key, flags, timeout_ms);
                }
                let Some(target) = self.own_rank_or_fail(conn, req, "get", proc) else {
                    return;
                };
                self.get(conn, req, target, key, flags, timeout_ms)
            }
            ClientMsg::Spawn { req, apps, opts } => self.spawn_request(rank, conn, req, apps, opts),
            ClientMsg::JobControl {
                req,
                targets,
                action,
            } => self.native_job_control(rank, conn, req, targets, action),
            ClientMsg::Allocate { req, request } => self.native_allocate(rank, conn, req, request),
            ClientMsg::Connect {
                req,
                procs,
                disconnect,
                timeout_ms,
            } => self.native_connect(rank, conn, req, procs, disconnect, timeout_ms),
            ClientMsg::Names { req, op } => {
                self.names_request(rank, super::published::NameReply::Native { conn, req }, op)
            }
            ClientMsg::Finalize { req, at_exit } => {
                let acts = self.job.procs.on_finalize(rank, at_exit);
                self.apply_procs(acts);
                self.send_client(conn, &ServerMsg::Done { req });
            }
        }
    }
}

impl State {
    /// A get of `proc`, of another job than the focused one: served as that job's own
    /// gets are (its book on this node, or its owner's server) if a native connect links
    /// the two jobs; refused otherwise, naming the namespace.
    fn get_connected(
        &mut self,
        conn: ConnId,
        req: u64,
        proc: ProcId,
        key: String,
        flags: GetFlags,
        timeout_ms: Option<u64>,
    ) {
        let own = self.job.ns;
        if !self.connects.linked(own, proc.ns) || !self.focus(proc.ns) {
            let error = WireError::Invalid {
                op: "get".into(),
                reason: format!(
                    "{proc} is of job {}, which is not connected with job {own} \
                     (Client::connect first)",
                    proc.ns
                ),
            };
            return self.send_client(conn, &ServerMsg::Failed { req, error });
        }
        self.get(conn, req, proc.rank, key, flags, timeout_ms)
    }

    /// The rank of `p` in this server's job; if it is of another namespace, request `req`
    /// fails (invalid, naming the namespace) and `None` is returned.
    fn own_rank_or_fail(&self, conn: ConnId, req: u64, op: &str, p: ProcId) -> Option<Rank> {
        self.own_ranks_or_fail(conn, req, op, &[p])?.pop()
    }

    /// [`own_rank_or_fail`](Self::own_rank_or_fail) for a list of processes.
    fn own_ranks_or_fail(
        &self,
        conn: ConnId,
        req: u64,
        op: &str,
        procs: &[ProcId],
    ) -> Option<Vec<Rank>> {
        match procs.iter().map(|&p| self.own_rank(p)).collect() {
            Ok(ranks) => Some(ranks),
            Err(reason) => {
                let error = WireError::Invalid {
                    op: op.to_owned(),
                    reason,
                };
                self.send_client(conn, &ServerMsg::Failed { req, error });
                None
            }
        }
    }
}
