//! The send queues: every work request (eager frame, control message, probe, RDMA read or
//! write) is posted by [`Endpoint::post`] (or the inline fast path of `try_send`) and
//! retired by [`Endpoint::poll_send`] from the one send completion queue. Only some sends
//! ask for a completion; one completion retires every earlier request of its queue pair.

use std::sync::Arc;

use crate::sys::{self, Mr, SendOp, Wc, POLL_BATCH};
use crate::Error;

use super::conn::State;
use super::rdma::RdmaOp;
use super::{Endpoint, RdmaToken, CREDIT_MASK};

/// One outstanding send-queue work request.
pub(super) struct Wr {
    pub(super) seq: u32,
    /// Send buffer it uses.
    pub(super) buf: Option<u32>,
    /// A probe (clears `probe_out` when retired).
    pub(super) probe: bool,
    /// Asked for a completion.
    pub(super) signaled: bool,
    /// RDMA read or write: its token, the local registration it uses, whether a write.
    pub(super) read: Option<(u64, Arc<Mr>, bool)>,
}

impl Endpoint {
    /// Posts a frame (or control message) of `kind` on connection `idx`.
    pub(super) fn post(
        &mut self,
        idx: u32,
        parts: &[&[u8]],
        kind: u32,
        buf: Option<u32>,
        read: Option<RdmaOp>,
        force_signal: bool,
    ) -> Result<(), Error> {
        let low_bufs = self.eager.send_free.len() < self.cfg.signal_every as usize;
        let c = &mut self.links.conns[idx as usize];
        let Some(qp) = &c.qp else { return Ok(()) };
        let seq = c.sq.seq;
        let signaled = force_signal
            || read.is_some()
            || c.sq.wants_signal(self.cfg.signal_every)
            || (buf.is_some() && low_bufs);
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let r = if let Some(o) = &read {
            let (remote_addr, rkey) = (o.remote_addr, o.rkey);
            let op = if o.write {
                SendOp::Write { remote_addr, rkey }
            } else {
                SendOp::Read { remote_addr, rkey }
            };
            // SAFETY: the local range lies in `mr` (registered by the cache), which the
            // work-request entry keeps alive until completion; the caller of `rdma_read`
            // (`rdma_write`) guarantees nobody accesses (modifies) it meanwhile.
            unsafe { qp.post_send(wr_id, &[(o.local, o.len, o.mr.lkey())], op, true, false) }
        } else {
            let imm = (kind << 24) | c.credits.to_return.min(CREDIT_MASK);
            let op = SendOp::SendImm { imm };
            if let Some(b) = buf {
                let addr = self.eager.send_mem.addr() + b as u64 * self.cfg.eager_size as u64;
                let mut off = 0;
                for p in parts {
                    // SAFETY: the send buffer `b` is ours (taken from the free list) and
                    // `len` <= eager_size was checked by the caller.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p.as_ptr(),
                            (addr as usize + off) as *mut u8,
                            p.len(),
                        )
                    };
                    off += p.len();
                }
                // SAFETY: the SGE lies in `send_mr`; buffer `b` returns to the free list
                // only when this request is retired.
                unsafe {
                    qp.post_send(
                        wr_id,
                        &[(addr, len as u32, self.eager.send_mr.lkey())],
                        op,
                        signaled,
                        false,
                    )
                }
            } else {
                let mut sges: [sys::Sge; 2] = [(0, 0, 0); 2];
                for (s, p) in sges.iter_mut().zip(parts) {
                    *s = (p.as_ptr() as u64, p.len() as u32, 0);
                }
                let n = parts.len().min(2);
                // SAFETY: inline: the bytes are copied during the call (total length <=
                // max inline, checked by the caller); no memory is referenced after it.
                unsafe { qp.post_send(wr_id, &sges[..n], op, signaled, true) }
            }
        };
        match r {
            Ok(()) => {
                if read.is_none() {
                    c.credits.to_return = c.credits.to_return.saturating_sub(CREDIT_MASK);
                }
                self.signaled_out += usize::from(signaled);
                c.sq.book(Wr {
                    seq,
                    buf,
                    probe: false,
                    signaled,
                    read: read.map(|o| (o.token, o.mr, o.write)),
                });
                Ok(())
            }
            Err(source) => {
                if let Some(b) = buf {
                    self.eager.send_free.push(b);
                }
                Err(Error::PostSend {
                    peer: c.peer,
                    source,
                })
            }
        }
    }

    /// Retires completed send-queue work requests; reports failures.
    pub(super) fn poll_send(&mut self) {
        let mut wcs = std::mem::take(&mut self.wc_buf);
        self.poll_send_into(&mut wcs);
        self.wc_buf = wcs;
    }

    pub(super) fn poll_send_into(&mut self, wcs: &mut [Wc]) {
        loop {
            let n = match self.eager.send_cq.poll(wcs) {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    return;
                }
            };
            for wc in &wcs[..n] {
                let idx = (wc.wr_id >> 32) as u32;
                let seq = wc.wr_id as u32;
                let Some(c) = self.links.conns.get_mut(idx as usize) else {
                    continue;
                };
                let mut what = "send";
                while let Some(wr) = c.sq.inflight.pop_front() {
                    if let Some(b) = wr.buf {
                        self.eager.send_free.push(b);
                    }
                    if wr.probe {
                        c.probe_out = false;
                    }
                    let done = wr.seq == seq;
                    if done && wr.signaled {
                        self.signaled_out = self.signaled_out.saturating_sub(1);
                    }
                    if let Some((token, _mr, write)) = wr.read {
                        what = if write { "rdma-write" } else { "rdma-read" };
                        let result = if done && wc.status == sys::WC_SUCCESS {
                            if write {
                                self.stats.writes += 1;
                            } else {
                                self.stats.reads += 1;
                            }
                            Ok(())
                        } else if let State::Failed(e) = &c.state {
                            Err(e.duplicate())
                        } else {
                            Err(Error::WorkCompletion {
                                peer: c.peer,
                                opcode: what,
                                status: sys::wc_status_str(wc.status),
                            })
                        };
                        self.rdma.done.push_back((RdmaToken(token), result));
                    }
                    if done {
                        break;
                    }
                }
                if wc.status != sys::WC_SUCCESS && !matches!(c.state, State::Failed(_)) {
                    let err = Error::WorkCompletion {
                        peer: c.peer,
                        opcode: what,
                        status: sys::wc_status_str(wc.status),
                    };
                    self.fail(idx, err);
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }
}
