//! Eager frames and credits: the shared receive queue and its buffers, the registered
//! send buffers, `try_send` (inline or copied into a send buffer), delivery of received
//! frames in `poll`, reposting receive buffers and returning their credits.

use std::sync::Arc;
use std::time::Instant;

use crate::sys::{self, Cq, Mr, Srq, Wc, POLL_BATCH};
use crate::Error;

use super::conn::State;
use super::sendq::Wr;
use super::{ConnId, Deliver, Endpoint, RawBuf, CREDIT_MASK, KIND_CREDIT, KIND_DATA, NO_CONN};

/// The eager path's state.
pub(super) struct Eager {
    // Field order is drop order: the queue and completion queues before the registrations,
    // the registrations before their memory.
    pub(super) srq: Arc<Srq>,
    pub(super) send_cq: Arc<Cq>,
    pub(super) recv_cq: Arc<Cq>,
    pub(super) recv_mrs: Vec<Mr>,
    pub(super) send_mr: Mr,
    pub(super) recv_mem: Vec<RawBuf>,
    pub(super) send_mem: RawBuf,
    /// (address, lkey) of each eager receive buffer; the SRQ work-request id is the index.
    pub(super) recv_slots: Vec<(u64, u32)>,
    /// Send buffers not in use (index into `send_mem`, `eager_size` bytes each).
    pub(super) send_free: Vec<u32>,
    /// Receive completions [`Endpoint::idle`] polled, not yet delivered: the first
    /// `stashed` entries of `stash`.
    pub(super) stash: Box<[Wc]>,
    pub(super) stashed: usize,
    /// Connections that owe the peer an explicit credit message.
    pub(super) credit_queue: Vec<u32>,
    /// Receive slots delivered and not yet posted again, with the connection whose
    /// credit each returns ([`NO_CONN`]: none); see [`Endpoint::repost_recvs`].
    pub(super) repost: Vec<(u32, u32)>,
}

impl Endpoint {
    /// Posts `n` more eager receive buffers to the SRQ (as far as it has room).
    pub(super) fn grow_recvs(&mut self, n: u32) -> Result<(), Error> {
        let room = self
            .eager
            .srq
            .max_wr()
            .saturating_sub(self.eager.recv_slots.len() as u32);
        if room < n {
            tracing::warn!(
                "verbs: shared receive queue full ({} buffers): new connections are not fully \
                 backed by receives (raise WEFT_VERBS_SRQ_SIZE); RNR retries cover the gap",
                self.eager.recv_slots.len()
            );
        }
        let n = n.min(room);
        if n == 0 {
            return Ok(());
        }
        let size = self.cfg.eager_size;
        let mem = RawBuf::new(size * n as usize);
        let mr = Mr::register(&self.pd, mem.ptr.as_ptr(), mem.len())?;
        let (base, lkey) = (mem.addr(), mr.lkey());
        // Kept before anything is posted: a failed post below must not free posted memory.
        self.eager.recv_mrs.push(mr);
        self.eager.recv_mem.push(mem);
        for i in 0..n as usize {
            let slot = self.eager.recv_slots.len() as u64;
            let addr = base + (i * size) as u64;
            self.eager.recv_slots.push((addr, lkey));
            // SAFETY: the slot lies in the registration just kept; it is read only after
            // its completion; the memory outlives the SRQ (field order).
            unsafe { self.eager.srq.post_recv(slot, addr, size as u32, lkey) }
                .map_err(|source| Error::PostRecv { source })?;
        }
        Ok(())
    }

    /// Sends the frame `header ++ payload` to `conn`. `Ok(false)`: no room now (connection
    /// not ready yet, no credits, send queue or buffers full): call `poll` and retry.
    /// Errors: the frame exceeds [`Endpoint::max_frame`], or the connection failed (an
    /// error naming the peer).
    #[inline(always)]
    pub fn try_send(&mut self, conn: ConnId, header: &[u8], payload: &[u8]) -> Result<bool, Error> {
        match self.try_send_inline(conn.0, header, payload) {
            Some(r) => r,
            None => self.try_send_general(conn.0, header, payload),
        }
    }

    /// [`Endpoint::try_send`] beyond the common case: a frame sent from a registered
    /// buffer, or no credit, no room, no ready connection, a frame too large.
    #[inline(never)]
    pub(super) fn try_send_general(
        &mut self,
        idx: u32,
        header: &[u8],
        payload: &[u8],
    ) -> Result<bool, Error> {
        let eager_limit_low = self.eager.send_free.is_empty();
        let max_inline = self.info.max_inline as usize;
        let c = self
            .links
            .conns
            .get_mut(idx as usize)
            .ok_or(Error::UnknownConn(idx))?;
        if !c.state.can_send()? {
            return Ok(false);
        }
        let len = header.len() + payload.len();
        if len > c.max_frame {
            return Err(Error::MessageTooLarge {
                what: "eager frame",
                len,
                max: c.max_frame,
            });
        }
        if c.credits.send == 0 {
            self.stats.no_credit += 1;
            if c.credits.starved_since.is_none() {
                c.credits.starved_since = Some(Instant::now());
                self.links.timed += 1;
            }
            return Ok(false);
        }
        if c.sq.inflight.len() + 2 >= c.sq.depth {
            self.poll_send();
            let c = &self.links.conns[idx as usize];
            if c.sq.inflight.len() + 2 >= c.sq.depth {
                return Ok(false);
            }
        }
        let buf = if len <= max_inline {
            None
        } else {
            if eager_limit_low {
                self.poll_send();
            }
            match self.eager.send_free.pop() {
                Some(b) => Some(b),
                None => {
                    self.fence_all();
                    return Ok(false);
                }
            }
        };
        self.post(idx, &[header, payload], KIND_DATA, buf, None, false)
            .inspect_err(|e| self.fail(idx, e.duplicate()))?;
        self.links.conns[idx as usize].credits.spent();
        if buf.is_some() {
            self.stats.sends_copied += 1;
        } else {
            self.stats.sends_inline += 1;
        }
        Ok(true)
    }

    /// The common case of [`Endpoint::try_send`], on the path of every small message: an
    /// inline frame on a ready connection with a credit and room in its send queue. `None`:
    /// not that case, take the general path.
    #[inline(always)]
    pub(super) fn try_send_inline(
        &mut self,
        idx: u32,
        header: &[u8],
        payload: &[u8],
    ) -> Option<Result<bool, Error>> {
        let len = header.len() + payload.len();
        if len > self.info.max_inline as usize {
            return None;
        }
        let c = self.links.conns.get_mut(idx as usize)?;
        let (State::Ready, Some(qp)) = (&c.state, &c.qp) else {
            return None;
        };
        if c.credits.send == 0 || len > c.max_frame || c.sq.inflight.len() + 2 >= c.sq.depth {
            return None;
        }
        let signaled = c.sq.wants_signal(self.cfg.signal_every);
        let seq = c.sq.seq;
        let returned = c.credits.to_return.min(CREDIT_MASK);
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        if let Err(source) = qp.post_send_inline_imm(
            wr_id,
            header,
            payload,
            (KIND_DATA << 24) | returned,
            signaled,
        ) {
            let err = Error::PostSend {
                peer: c.peer,
                source,
            };
            self.fail(idx, err.duplicate());
            return Some(Err(err));
        }
        c.credits.to_return -= returned;
        c.credits.spent();
        c.sq.book(Wr {
            seq,
            buf: None,
            probe: false,
            signaled,
            read: None,
        });
        self.signaled_out += usize::from(signaled);
        self.stats.sends_inline += 1;
        Some(Ok(true))
    }

    /// Sends a signaled probe on every connection holding unsignaled sends, so their send
    /// buffers are retired (all send buffers are taken).
    pub(super) fn fence_all(&mut self) {
        for idx in 0..self.links.conns.len() as u32 {
            let c = &self.links.conns[idx as usize];
            if matches!(c.state, State::Ready)
                && c.sq.unsignaled > 0
                && !c.probe_out
                && c.sq.inflight.len() < c.sq.depth
            {
                self.probe(idx);
            }
        }
    }

    /// Posts again the receive buffers delivered since the last call and grants their
    /// credits to the peers that used them. Done at the start of the next poll rather
    /// than right after delivery, so that it is off the path from a frame's arrival to the
    /// answer the application sends; a credit is returned only for a reposted buffer, so
    /// a peer never holds a credit without a posted buffer behind it.
    pub(super) fn repost_recvs(&mut self) {
        let half = (self.cfg.credits / 2).max(1);
        // Taken and put back (cleared) to keep its allocation.
        let mut list = std::mem::take(&mut self.eager.repost);
        for &(slot, idx) in &list {
            let (addr, lkey) = self.eager.recv_slots[slot as usize];
            // SAFETY: the slot lies in its registration (see `grow_recvs`), and its frame
            // was delivered: nothing reads it any more.
            if let Err(source) = unsafe {
                self.eager
                    .srq
                    .post_recv(u64::from(slot), addr, self.cfg.eager_size as u32, lkey)
            } {
                self.errors.push_back(Error::PostRecv { source });
                continue;
            }
            if let Some(c) = self.links.conns.get_mut(idx as usize) {
                c.credits.to_return += 1;
                if c.credits.to_return >= half && !c.credits.due {
                    c.credits.due = true;
                    self.eager.credit_queue.push(idx);
                }
            }
        }
        list.clear();
        self.eager.repost = list;
    }

    #[inline(always)]
    pub(super) fn poll_recv<D: Deliver + ?Sized>(&mut self, deliver: &mut D) -> usize {
        if self.eager.stashed > 0 {
            // `poll_recv_into` starts with the completions `idle` left in `stash`.
            let mut wcs = std::mem::take(&mut self.eager.stash);
            let n = self.poll_recv_into(&mut wcs, deliver);
            self.eager.stash = wcs;
            return n;
        }
        let mut wcs = std::mem::take(&mut self.wc_buf);
        let n = self.poll_recv_into(&mut wcs, deliver);
        self.wc_buf = wcs;
        n
    }

    #[inline(always)]
    pub(super) fn poll_recv_into<D: Deliver + ?Sized>(
        &mut self,
        wcs: &mut [Wc],
        deliver: &mut D,
    ) -> usize {
        let mut delivered = 0;
        loop {
            // Completions `idle` took from the queue (into `wcs`, see `poll_recv`) go
            // first.
            let stashed = std::mem::take(&mut self.eager.stashed);
            let n = if stashed > 0 {
                Ok(stashed)
            } else {
                self.eager.recv_cq.poll(wcs)
            };
            let n = match n {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    break;
                }
            };
            for wc in &wcs[..n] {
                let slot = wc.wr_id as usize;
                let addr = self.eager.recv_slots[slot].0;
                let idx = self.links.by_qpn.get(&wc.qp_num).copied();
                if let Some(idx) = idx {
                    if wc.status != sys::WC_SUCCESS {
                        let c = &self.links.conns[idx as usize];
                        let err = Error::WorkCompletion {
                            peer: c.peer,
                            opcode: "recv",
                            status: sys::wc_status_str(wc.status),
                        };
                        self.fail(idx, err);
                    } else {
                        let imm = wc.imm.unwrap_or(0);
                        let c = &mut self.links.conns[idx as usize];
                        let credits = imm & CREDIT_MASK;
                        if credits > 0 {
                            c.credits.send += credits;
                            if c.credits.starved_since.take().is_some() {
                                self.links.timed = self.links.timed.saturating_sub(1);
                            }
                        }
                        if matches!(c.state, State::Accepted) {
                            c.state = State::Ready;
                        }
                        if imm >> 24 == KIND_DATA {
                            // SAFETY: the receive completed, so the NIC is done with the
                            // slot; `byte_len` <= eager_size; it is reposted only by the
                            // next `repost_recvs`, after `deliver` returned.
                            let frame = unsafe {
                                std::slice::from_raw_parts(addr as *const u8, wc.byte_len as usize)
                            };
                            deliver.frame(c.peer, frame);
                            delivered += 1;
                            // Its credit goes back to the peer once the slot is reposted.
                            self.eager.repost.push((slot as u32, idx));
                            continue;
                        }
                    }
                }
                self.eager.repost.push((slot as u32, NO_CONN));
            }
            if n < POLL_BATCH {
                break;
            }
        }
        self.stats.frames_received += delivered as u64;
        // Explicit credit messages for the connections that owe some (kept when the send
        // queue is full: retried on the next poll).
        if !self.eager.credit_queue.is_empty() {
            let mut queue = std::mem::take(&mut self.eager.credit_queue);
            queue.retain(|&idx| !self.return_credits(idx));
            self.eager.credit_queue = queue;
        }
        delivered
    }

    /// Sends an explicit credit message if `idx` still owes one; false: no room now.
    pub(super) fn return_credits(&mut self, idx: u32) -> bool {
        let c = &self.links.conns[idx as usize];
        if !c.credits.due || !matches!(c.state, State::Ready) {
            return true; // a frame carried the credits, or the connection is gone
        }
        if c.sq.inflight.len() + 1 >= c.sq.depth {
            return false;
        }
        match self.post(idx, &[], KIND_CREDIT, None, None, false) {
            Ok(()) => {
                self.links.conns[idx as usize].credits.due = false;
                self.stats.credit_messages += 1;
            }
            Err(e) => self.fail(idx, e),
        }
        true
    }
}
