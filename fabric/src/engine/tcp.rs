//! The TCP adapter: frames over one connection per peer pair (`weft-tcp`), and the
//! rendezvous of large messages without a staging copy: the sender offers the message
//! (RTS_TCP), the receiver, once matched, hands its buffer to the endpoint for the
//! transfer and answers CTS, and the sender's endpoint writes the payload straight from
//! the sender's buffer into the socket (`writev`), the receiver's reads it straight into
//! the posted buffer. A bulk transfer is named by a token: the sender's request in the
//! high 32 bits, the receiver's in the low ones (both wire ids, with their generations).

use weft_tcp::ConnId;

use crate::path::tcp::TcpLink;

use super::matching::{outcome, Body, Unexpected};
use super::rendezvous::{Matched, RndvRecv};
use super::wire::Envelope;
use super::{Kind, Path, Req, State};
use crate::{P2pError, Status};

/// The token of the bulk transfer of send `sreq` into receive `rreq` (wire ids).
fn token(sreq: u32, rreq: u32) -> u64 {
    (u64::from(sreq) << 32) | u64::from(rreq)
}

impl State {
    /// An offer over TCP arrived: match it, or queue it as unexpected.
    pub(super) fn on_rts_tcp(&mut self, h: Envelope, sreq: u32, len: u64) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.tcp_matched(Matched::of(id, h, sreq, len)),
            None => self.matching.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::RtsTcp { sreq, len },
            }),
        }
    }

    /// A receive matched a TCP offer: hands its buffer to the endpoint for the bulk
    /// transfer, then asks for it (CTS).
    pub(super) fn tcp_matched(&mut self, m: Matched) {
        let Some(RndvRecv { buf, cap, .. }) = self.rndv_recv(m) else {
            return;
        };
        let Matched {
            id,
            src,
            tag,
            sreq,
            len,
        } = m;
        let conn = match self.path(src).map(|()| &self.peers[src as usize].path) {
            Ok(Path::Tcp(c)) => *c,
            Ok(_) => {
                let reason = "a TCP rendezvous from a peer not reached over TCP".to_string();
                return self.complete(id, Err(P2pError::Transport { rank: src, reason }));
            }
            Err(e) => return self.complete(id, Err(e)),
        };
        if let Some(reason) = self.ends.failed.get(&src) {
            let reason = reason.clone();
            return self.complete(id, Err(P2pError::PeerGone { rank: src, reason }));
        }
        let rreq = self.wire_id(id);
        let t = token(sreq, rreq);
        let Some(ep) = &mut self.tcp else { return };
        // SAFETY: `buf` is the buffer of live receive request `id`, `cap` bytes, borrowed
        // by the request until it completes; it completes only on the endpoint's report
        // of this transfer (`on_bulk_received`) or after the connection is closed or
        // failed (`tcp_failed`), when the endpoint has abandoned the transfer.
        unsafe { ep.expect_bulk(conn, t, buf, cap) };
        if let Some(Some(Req {
            kind: Kind::Recv { pipe, bulk, .. },
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        {
            *pipe = Some((src, tag, len, 0));
            *bulk = Some(t);
        }
        self.cts(src, tag, sreq, id);
    }

    /// CTS for send `id` over TCP connection `conn`: the endpoint writes the payload.
    pub(super) fn tcp_send_bulk(&mut self, id: u32, conn: ConnId, dest: u32, rreq: u32) {
        let sreq = self.wire_id(id);
        let Some(Some(Req {
            kind: Kind::Send {
                buf, len, stream, ..
            },
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        let (buf, len) = (*buf, *len);
        // In flight until the endpoint reports it written (counted by `backlog`).
        *stream = Some((rreq, len));
        let Some(ep) = &mut self.tcp else { return };
        // SAFETY: `buf` is the send request's buffer of `len` bytes, borrowed (and not
        // written) until the request completes, which happens on the endpoint's report
        // that the transfer is written (`on_bulk_sent`) or after the connection is closed
        // or failed, when the endpoint has dropped it.
        if let Err(e) = unsafe { ep.send_bulk(conn, token(sreq, rreq), buf, len) } {
            self.tcp_failed(dest, &e.to_string());
        }
    }

    /// The endpoint read a whole bulk transfer into a receive's buffer.
    pub(super) fn on_bulk_received(&mut self, peer: u32, t: u64, len: usize) {
        let Some(id) = self.own(t as u32) else {
            return;
        };
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    cap,
                    pipe: Some((src, tag, total, _)),
                    bulk,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        if *src != peer || *bulk != Some(t) {
            return;
        }
        *bulk = None;
        let (src, tag, total, cap) = (*src, *tag, *total, *cap);
        let r = if len == total {
            outcome(src, tag, total, cap)
        } else {
            Err(P2pError::Transport {
                rank: src,
                reason: format!("offered {total} bytes but sent {len}"),
            })
        };
        self.complete(id, r);
    }

    /// The endpoint wrote a whole bulk transfer: the send is done.
    pub(super) fn on_bulk_sent(&mut self, peer: u32, t: u64) {
        let Some(id) = self.own((t >> 32) as u32) else {
            return;
        };
        if let Some(Some(Req {
            kind: Kind::Send {
                dest, len, stream, ..
            },
            result: result @ None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        {
            if *dest == peer && stream.is_some() {
                *stream = None;
                *result = Some(Ok(Status {
                    source: peer,
                    tag: 0,
                    count: *len,
                }));
            }
        }
    }

    /// Peers reached over TCP with frames queued in the endpoint.
    pub(super) fn tcp_queued(&self) -> usize {
        self.tcp.as_ref().map_or(0, |ep| {
            self.peers
                .iter()
                .filter(|p| matches!(p.path, Path::Tcp(c) if ep.queued(c) > 0))
                .count()
        })
    }

    /// Pushes `dest`'s backlog onto its connection as far as the endpoint takes it; true
    /// when some of it must wait.
    pub(super) fn flush_tcp(&mut self, dest: u32, conn: ConnId) -> bool {
        let Some(ep) = &mut self.tcp else {
            return false;
        };
        let peer = &mut self.peers[dest as usize];
        if let Err(e) = peer.drain(TcpLink { ep, conn }) {
            self.tcp_failed(dest, &e.to_string());
            return false;
        }
        !self.peers[dest as usize].backlog.is_empty()
    }

    /// The connection to `peer` is gone, or must go (its process is reported gone): the
    /// endpoint gives it up for good (closing it and abandoning its transfers, so their
    /// buffers may be given back), and everything waiting on it fails, naming why.
    pub(super) fn tcp_failed(&mut self, peer: u32, reason: &str) {
        if (peer as usize) >= self.peers.len() {
            return;
        }
        // A peer that finalized closes its connections: only waits on it fail, and they
        // are named by how it ended when wire-up knows.
        let reason = (self.wireup.gone)(peer).unwrap_or_else(|| reason.to_string());
        tracing::debug!("TCP connection to rank {peer} ended: {reason}");
        self.ends
            .failed
            .entry(peer)
            .or_insert_with(|| reason.clone());
        // For good, on both sides: the peer's later connections are refused with this
        // reason (what waited on it here has failed; it must not find a half-open way).
        if let Some(ep) = &mut self.tcp {
            ep.forbid(peer, &reason);
        }
        self.fail_waiting_on(peer, &reason);
    }
}
