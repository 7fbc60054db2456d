//! The rendezvous protocols that are not a transport's own: the offer (RTS), the
//! receiver's answer (a single-copy read, or CTS asking the sender to stream DATA through
//! the rings), and FIN, which frees the sender's buffer.

use super::matching::{outcome, Body, Unexpected};
use super::wire::{Envelope, Frame};
use super::{Kind, Req, SingleCopy, State};
use crate::{P2pError, Status};

/// A rendezvous offer (RTS, RTS_RDMA or RTS_TCP) matched to a posted receive: the
/// receive, and what every offer's header carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Matched {
    /// The posted receive's request.
    pub(super) id: u32,
    pub(super) src: u32,
    pub(super) tag: u32,
    /// The sender's request (what CTS and FIN name).
    pub(super) sreq: u32,
    /// The message's length (the receive may be shorter: truncation).
    pub(super) len: usize,
}

impl Matched {
    /// The offer of `sreq` (`len` bytes) with envelope `h`, matched to receive `id`.
    #[inline]
    pub(super) fn of(id: u32, h: Envelope, sreq: u32, len: u64) -> Matched {
        Matched {
            id,
            src: h.src,
            tag: h.tag,
            sreq,
            len: len as usize,
        }
    }
}

/// A matched rendezvous with its receive's buffer: where the data lands.
#[derive(Debug, Clone, Copy)]
pub(super) struct RndvRecv {
    pub(super) m: Matched,
    pub(super) buf: *mut u8,
    pub(super) cap: usize,
}

// SAFETY: as for `Kind`: `buf` is a receive buffer borrowed by its request.
unsafe impl Send for RndvRecv {}

impl RndvRecv {
    /// Bytes that land: the message, cut to the receive's capacity.
    #[inline]
    pub(super) fn n(&self) -> usize {
        self.m.len.min(self.cap)
    }

    /// What the receive completes with once its data is in.
    #[inline]
    pub(super) fn outcome(&self) -> Result<Status, P2pError> {
        outcome(self.m.src, self.m.tag, self.m.len, self.cap)
    }
}

/// A rendezvous offer (RTS) from `src`: its send request, buffer, pid and length.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer {
    pub(super) src: u32,
    pub(super) tag: u32,
    pub(super) sreq: u32,
    pub(super) addr: u64,
    pub(super) pid: i32,
    pub(super) len: usize,
}

impl State {
    /// Tells `to` that its rendezvous send `sreq` is over (its buffer is free).
    pub(super) fn fin(&mut self, to: u32, tag: u32, sreq: u32) {
        let src = self.me;
        self.send_frame(to, &Frame::Fin { src, tag, sreq });
    }

    /// Sends frame `f` to `to` (or queues it).
    pub(super) fn send_frame(&mut self, to: u32, f: &Frame<'_>) {
        self.push(to, &f.head(), f.payload());
    }

    /// Answers offer `sreq` from `to` with CTS naming receive `id`.
    pub(super) fn cts(&mut self, to: u32, tag: u32, sreq: u32, id: u32) {
        let (src, rreq) = (self.me, self.wire_id(id));
        self.send_frame(
            to,
            &Frame::Cts {
                src,
                tag,
                sreq,
                rreq,
            },
        );
    }

    /// Offer `m` and its receive's buffer; `None` when the receive is gone.
    #[inline]
    pub(super) fn rndv_recv(&self, m: Matched) -> Option<RndvRecv> {
        let (buf, cap) = self.recv_buffer(m.id)?;
        Some(RndvRecv { m, buf, cap })
    }

    /// A receive matched an RTS (shared memory) of the buffer at `addr` in process `pid`:
    /// a single copy (split with the sender when large), or else CTS for a pipelined
    /// stream.
    pub(super) fn rts_matched(&mut self, m: Matched, addr: u64, pid: i32) {
        let Some(r) = self.rndv_recv(m) else {
            return;
        };
        let Matched {
            id,
            src,
            tag,
            sreq,
            len,
        } = m;
        let (buf, n) = (r.buf, r.n());
        let done = |st: &mut State| st.complete(id, r.outcome());
        if self.cfg.single_copy == SingleCopy::Cma
            && self.peers[src as usize].cma_ok
            && self.cfg.cma_split > 0
            && n >= self.cfg.cma_split
        {
            // A claim word settles who copies the tail (none free: no split).
            if let Some(claim) = self.cma.claims.as_mut().and_then(|c| c.open()) {
                let offer = Offer {
                    src,
                    tag,
                    sreq,
                    addr,
                    pid,
                    len,
                };
                return self.cma_split(id, offer, buf, n, claim);
            }
        }
        if self.cfg.single_copy == SingleCopy::Cma {
            // SAFETY: `buf` is this receive's buffer, valid for `cap` >= n bytes.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf, n) };
            match weft_shm::cma_read(pid, addr as usize, dst) {
                Ok(()) => {
                    self.peers[src as usize].cma_ok = true;
                    self.fin(src, tag, sreq);
                    return done(self);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
                    ) =>
                {
                    if !self.cma.warned {
                        tracing::info!("single-copy (CMA) refused ({e}); using pipelined copies through shared memory");
                        self.cma.warned = true;
                    }
                    self.cfg.single_copy = SingleCopy::None;
                }
                Err(e) => {
                    let reason = format!("single-copy read from rank {src} failed: {e}");
                    return self.complete(id, Err(P2pError::PeerGone { rank: src, reason }));
                }
            }
        }
        // Pipelined: ask the sender to stream the data.
        if let Some(Some(Req {
            kind: Kind::Recv { pipe, .. },
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        {
            *pipe = Some((src, tag, len, 0));
        }
        self.cts(src, tag, sreq, id);
        if len == 0 {
            done(self);
        }
    }

    /// DATA: chunk at `off` of the message of receive `rreq`, from `from`.
    pub(super) fn on_data(&mut self, from: u32, rreq: u32, off: u64, chunk: &[u8]) {
        let Some(id) = self.own(rreq) else {
            return;
        };
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    buf,
                    cap,
                    pipe: Some((src, tag, total, got)),
                    split: None,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        if *src != from {
            tracing::error!("dropping a data chunk from rank {from} for a receive from rank {src}");
            return;
        }
        let off = off as usize;
        if off < *cap {
            let n = chunk.len().min(*cap - off);
            // SAFETY: `buf` is the live receive buffer of `cap` bytes and off + n <= cap.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf.add(off), n) };
        }
        *got += chunk.len();
        if *got >= *total {
            let (src, tag, total, cap) = (*src, *tag, *total, *cap);
            let r = outcome(src, tag, total, cap);
            self.complete(id, r);
        }
    }

    /// FIN from `from`: the receiver is done with the buffer of send `sreq` (only the
    /// peer the send went to may complete it).
    pub(super) fn on_fin(&mut self, from: u32, tag: u32, sreq: u32) {
        let Some(id) = self.own(sreq) else {
            return;
        };
        let Some(Some(Req {
            kind:
                Kind::Send {
                    dest,
                    len,
                    registered,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get(id as usize)
        else {
            return;
        };
        if *dest != from {
            return;
        }
        let s = Status {
            source: *dest,
            tag,
            count: *len,
        };
        if let Some(region) = *registered {
            // Ends this send's exposure only (other sends of the same buffer may still be
            // read). Without kept registrations the endpoint never looks registrations up
            // again (WEFT_VERBS_RCACHE off), so a buffer freed and reused is registered
            // afresh.
            self.release_region(region);
        }
        self.complete(id, Ok(s));
    }

    /// A verbs rendezvous offer (RTS_RDMA): the sender's region, read once matched.
    pub(super) fn on_rts_rdma(&mut self, h: Envelope, sreq: u32, len: u64, addr: u64, rkey: u32) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.rdma_matched(Matched::of(id, h, sreq, len), addr, rkey),
            None => self.matching.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::RtsRdma {
                    sreq,
                    addr,
                    rkey,
                    len,
                },
            }),
        }
    }

    /// CTS from `from`: the receiver (its request `rreq`) of send `sreq` asks for the
    /// data; the stream is pushed by the path's flush.
    pub(super) fn on_cts(&mut self, from: u32, sreq: u32, rreq: u32) {
        let Some(id) = self.own(sreq) else {
            return;
        };
        let Some(Some(Req {
            kind:
                Kind::Send {
                    stream: stream @ None,
                    dest,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        if *dest != from {
            return;
        }
        let d = *dest;
        #[cfg(feature = "tcp")]
        if let super::Path::Tcp(conn) = self.peers[d as usize].path {
            return self.tcp_send_bulk(id, conn, d, rreq);
        }
        *stream = Some((rreq, 0));
        if !self.busy.contains(&d) {
            self.busy.push(d);
        }
    }
}
