//! The verbs adapter: frames over RC connections (polled through [`VerbsSink`] so that a
//! direct receive takes its frame on the spot), the RDMA-read rendezvous, connection
//! waits and failures.

use super::rendezvous::{Matched, RndvRecv};
use super::{Path, State};
use crate::path::verbs::VerbsLink;
use crate::P2pError;
use std::collections::{HashMap, VecDeque};
use weft_verbs::{ConnId, ReadToken, RemoteRegion};

/// The RDMA reads of verbs rendezvous.
#[derive(Debug, Default)]
pub(super) struct Reads {
    /// In flight.
    pub(super) inflight: HashMap<ReadToken, RndvRecv>,
    /// Waiting for room.
    pub(super) pending: VecDeque<PendingRead>,
}

/// An RDMA read waiting for room on its connection: the receive it fills and the
/// sender's region.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingRead {
    pub(super) read: RndvRecv,
    pub(super) addr: u64,
    pub(super) rkey: u32,
}

impl State {
    /// Ends one send's exposure of its registered region.
    pub(super) fn release_region(&mut self, region: RemoteRegion) {
        if let Some(ep) = &mut self.verbs {
            ep.release(region);
        }
    }

    /// Whether request `id` has an RDMA read in flight or waiting (the NIC may still
    /// write into its buffer).
    pub(super) fn reading(&self, id: u32) -> bool {
        self.reads.inflight.values().any(|r| r.m.id == id)
            || self.reads.pending.iter().any(|p| p.read.m.id == id)
    }

    /// Whether request `id` has an RDMA read in flight (posted to the NIC).
    pub(super) fn read_in_flight(&self, id: u32) -> bool {
        self.reads.inflight.values().any(|r| r.m.id == id)
    }

    /// A receive matched an RTS_RDMA of region (`addr`, `rkey`): read the data straight
    /// into its buffer.
    pub(super) fn rdma_matched(&mut self, m: Matched, addr: u64, rkey: u32) {
        let Some(read) = self.rndv_recv(m) else {
            return;
        };
        self.reads
            .pending
            .push_back(PendingRead { read, addr, rkey });
        self.start_reads();
    }

    /// Starts the RDMA reads waiting for room, in order.
    pub(super) fn start_reads(&mut self) {
        while let Some(p) = self.reads.pending.front().copied() {
            let r = p.read;
            let (id, src, n) = (r.m.id, r.m.src, r.n());
            if n == 0 {
                self.reads.pending.pop_front();
                self.read_done(r, Ok(()));
                continue;
            }
            if let Err(e) = self.path(src) {
                self.reads.pending.pop_front();
                self.complete(id, Err(e));
                continue;
            }
            let Path::Verbs(conn) = self.peers[src as usize].path else {
                self.reads.pending.pop_front();
                let reason = "a verbs rendezvous from a peer not reached over verbs".into();
                self.complete(id, Err(P2pError::Transport { rank: src, reason }));
                continue;
            };
            let Some(ep) = &mut self.verbs else { return };
            // SAFETY: `r.buf` is the buffer of a live receive request, valid for `cap` >= n
            // bytes; the request cannot complete (and so release the buffer) before this
            // read is reported by `poll_reads`: `fail_if_gone` skips requests with reads
            // in flight, and only `read_done` completes it.
            match unsafe { ep.rdma_read(conn, r.buf, n, p.addr, p.rkey) } {
                Ok(Some(token)) => {
                    self.reads.pending.pop_front();
                    self.reads.inflight.insert(token, r);
                }
                Ok(None) => return,
                Err(e) => {
                    self.reads.pending.pop_front();
                    self.read_done(r, Err(e.to_string()));
                }
            }
        }
    }

    /// An RDMA read finished: complete the receive, tell the sender.
    pub(super) fn read_done(&mut self, r: RndvRecv, res: Result<(), String>) {
        let Matched {
            id, src, tag, sreq, ..
        } = r.m;
        if !self.cfg.keep_registrations && r.n() > 0 {
            if let Some(ep) = &mut self.verbs {
                ep.invalidate(r.buf, r.n());
            }
        }
        match res {
            Ok(()) => {
                self.fin(src, tag, sreq);
                self.complete(id, r.outcome());
            }
            Err(reason) => {
                self.ends
                    .failed
                    .entry(src)
                    .or_insert_with(|| reason.clone());
                self.complete(
                    id,
                    Err(P2pError::PeerGone {
                        rank: src,
                        reason: format!("RDMA read failed: {reason}"),
                    }),
                );
            }
        }
    }

    /// Whether RDMA reads wait for room on their connections.
    #[inline(always)]
    pub(super) fn reads_waiting(&self) -> bool {
        !self.reads.pending.is_empty()
    }

    /// The endpoint reported RDMA read `token` finished (or failed).
    pub(super) fn on_read_done(&mut self, token: ReadToken, res: Result<(), String>) {
        if let Some(r) = self.reads.inflight.remove(&token) {
            self.read_done(r, res);
        }
    }

    /// The verbs connection to `peer` failed: everything waiting on it fails, naming the
    /// completion status.
    pub(super) fn verbs_failed(&mut self, peer: u32, reason: &str) {
        let reason = reason.to_string();
        tracing::error!("verbs connection to rank {peer} failed: {reason}");
        self.ends
            .failed
            .entry(peer)
            .or_insert_with(|| reason.clone());
        self.fail_waiting_on(peer, &reason);
    }

    /// Pushes `dest`'s backlog onto its connection as far as credits and room allow;
    /// true when some of it must wait.
    pub(super) fn flush_verbs(&mut self, dest: u32, conn: ConnId) -> bool {
        let Some(ep) = &mut self.verbs else {
            return false;
        };
        let peer = &mut self.peers[dest as usize];
        // Whole frames: a short header is shorter than HDR.
        if let Err(e) = peer.drain(VerbsLink { ep, conn }) {
            self.verbs_failed(dest, &e.to_string());
            return false;
        }
        !self.peers[dest as usize].backlog.is_empty()
    }
}
