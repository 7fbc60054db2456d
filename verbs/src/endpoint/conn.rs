//! Connection management: the per-peer connection table, the UD queue pair the
//! handshake travels on, the connection state machine and its timers, and liveness probes.
//!
//! A connection starts when either side calls [`Endpoint::connect`] (a request over UD) or
//! a request arrives (accepted inside `poll`). The requester moves its RC queue pair to
//! ready on the reply and sends "ready to use" (RTU); the responder sends only after the
//! RTU shows the requester's queue pair is ready. When both sides connect at once the
//! request of the lower id wins. Requests are repeated with backoff until
//! `WEFT_VERBS_HANDSHAKE_TIMEOUT`.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::card::{Card, Handshake, HsKind, HS_LEN};
use crate::sys::{
    self, AddrVec, Ah, Cq, Init, Mr, Qp, QpCaps, QpType, RtrAttr, Rts, RtsAttr, SendOp, Wc,
    POLL_BATCH,
};
use crate::Error;

use super::sendq::Wr;
use super::{ConnId, Endpoint, RawBuf, U32Map, CTRL_SLOTS, KIND_RTU};

pub(super) const QKEY: u32 = 0x5746_0001;
/// UD receives carry a 40-byte global route header before the payload.
const GRH: usize = 40;
pub(super) const UD_SLOT: usize = 128;
pub(super) const UD_RECVS: u32 = 64;
pub(super) const UD_SENDS: u32 = 64;
/// A peer that leaves us without credits this long gets a probe: an 8-byte RDMA read of its
/// probe word, answered by its NIC without consuming a receive, so a dead peer is noticed.
const STARVED_PROBE_AFTER: Duration = Duration::from_millis(100);
/// A connection request unanswered this long is sent again; the wait doubles with each
/// retry up to 8 times this.
const HANDSHAKE_RETRY: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(super) enum State {
    /// Request sent, waiting for the reply.
    Connecting {
        since: Instant,
        last_req: Instant,
        tries: u32,
    },
    /// We answered a request: our QP is ready, but we send only once the requester's first
    /// message shows its QP is ready too.
    Accepted,
    Ready,
    Failed(Error),
}

impl State {
    /// Whether a connection in this state can send now: `Ok(false)` while it connects
    /// (or waits for the requester's RTU), its error once it failed.
    #[inline]
    pub(super) fn can_send(&self) -> Result<bool, Error> {
        match self {
            State::Ready => Ok(true),
            State::Failed(e) => Err(e.duplicate()),
            _ => Ok(false),
        }
    }
}

pub(super) struct Conn {
    pub(super) peer: u32,
    pub(super) card: Card,
    pub(super) state: State,
    pub(super) init_qp: Option<Qp<Init>>,
    pub(super) qp: Option<Qp<Rts>>,
    pub(super) ah: Ah,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) remote_qpn: u32,
    /// A probe (RDMA read of the peer's probe word) is outstanding.
    pub(super) probe_out: bool,
    /// The peer's probe word: (address, rkey).
    pub(super) remote_probe: (u64, u32),
    /// Largest frame the peer can receive.
    pub(super) max_frame: usize,
    /// The send queue's bookkeeping (see `sendq`).
    pub(super) sq: SendQueue,
    /// Eager flow control (see `eager`).
    pub(super) credits: Credits,
}

/// One connection's send queue: the work requests posted and not yet retired.
pub(super) struct SendQueue {
    /// Work requests the queue pair holds.
    pub(super) depth: usize,
    pub(super) inflight: VecDeque<Wr>,
    /// Sequence number of the next work request (the low half of its id).
    pub(super) seq: u32,
    /// Sends posted since the last one that asked for a completion.
    pub(super) unsignaled: u32,
}

impl SendQueue {
    /// Whether the next send asks for a completion (selective signaling): every
    /// `signal_every`-th one, and whenever the send queue is half full.
    #[inline]
    pub(super) fn wants_signal(&self, signal_every: u32) -> bool {
        self.unsignaled + 1 >= signal_every || self.inflight.len() + 1 >= self.depth / 2
    }

    /// Books a work request just posted: the sequence number it used, the count of
    /// unsignaled sends, and the in-flight entry that retires it.
    #[inline]
    pub(super) fn book(&mut self, wr: Wr) {
        self.seq = self.seq.wrapping_add(1);
        self.unsignaled = if wr.signaled { 0 } else { self.unsignaled + 1 };
        self.inflight.push_back(wr);
    }
}

/// One connection's eager flow control.
pub(super) struct Credits {
    /// Eager frames we may still send.
    pub(super) send: u32,
    /// Eager receives of the peer's we consumed and have not yet reported.
    pub(super) to_return: u32,
    /// An explicit credit message is owed (queued in `Eager::credit_queue`).
    pub(super) due: bool,
    /// Since when we have had no credit to send (a probe follows, see `check_timers`).
    pub(super) starved_since: Option<Instant>,
}

impl Credits {
    /// Accounts for a data frame just posted: it used one of our credits, and the
    /// credits it carried back leave no explicit credit message due.
    #[inline]
    pub(super) fn spent(&mut self) {
        self.send -= 1;
        if self.to_return == 0 {
            self.due = false;
        }
    }
}

/// The UD queue pair the handshakes travel on, with its buffers: `UD_RECVS` receive
/// slots, then `UD_SENDS` send slots used round robin.
pub(super) struct Ud {
    // Field order is drop order: the queue pair before its queue, registration, memory.
    pub(super) qp: Qp<Rts>,
    pub(super) cq: Arc<Cq>,
    pub(super) mr: Mr,
    pub(super) mem: RawBuf,
    /// Send slots used so far (the next one is `next % UD_SENDS`).
    pub(super) next: u32,
    /// Handshake sends not yet completed.
    pub(super) outstanding: u32,
}

/// Connection management's state: the connections, their indexes, the handshake channel
/// and the probe word peers read.
pub(super) struct Links {
    // Field order is drop order: the RC queue pairs (in `conns`) go first of all the
    // endpoint's objects, then the UD queue pair, then the probe word.
    pub(super) conns: Vec<Conn>,
    pub(super) ud: Ud,
    pub(super) probe_mr: Mr,
    pub(super) probe_mem: RawBuf,
    pub(super) by_peer: U32Map<u32>,
    pub(super) by_qpn: U32Map<u32>,
    /// Connections connecting or starved of credits (timers to check in `poll`).
    pub(super) timed: usize,
}

pub(super) fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() as u32
}

impl Endpoint {
    /// Starts (or returns) the connection to `peer`, whose card is `card`. The RC queue pair
    /// is connected by a handshake over the UD queue pairs that `poll` drives; `try_send`
    /// returns `Ok(false)` until it is ready.
    pub fn connect(&mut self, peer: u32, card: &[u8]) -> Result<ConnId, Error> {
        if let Some(&i) = self.links.by_peer.get(&peer) {
            return Ok(ConnId(i));
        }
        let card = Card::decode(card)?;
        if card == self.card {
            return Err(Error::BadCard {
                reason: format!("peer {peer}'s card is this endpoint's own"),
            });
        }
        let idx = self.new_conn(peer, card)?;
        let now = Instant::now();
        self.links.conns[idx as usize].state = State::Connecting {
            since: now,
            last_req: now,
            tries: 0,
        };
        self.links.timed += 1;
        self.send_hs(idx, HsKind::Req, 0);
        Ok(ConnId(idx))
    }

    pub(super) fn new_conn(&mut self, peer: u32, card: Card) -> Result<u32, Error> {
        let av = AddrVec {
            port: self.cfg.port,
            dlid: card.lid,
            dgid: card.gid,
            sgid_index: self.info.gid_index as u8,
            global: self.info.is_roce(),
        };
        let ah = Ah::new(&self.pd, av)?;
        let caps = QpCaps {
            max_send_wr: self.cfg.sq_depth.min(self.info.max_qp_wr),
            max_recv_wr: 0,
            max_send_sge: 2,
            max_inline: self.info.max_inline,
        };
        let qp = Qp::create(
            &self.pd,
            QpType::Rc,
            &self.eager.send_cq,
            &self.eager.recv_cq,
            Some(&self.eager.srq),
            caps,
        )?
        .init_rc(self.cfg.port)?;
        self.grow_recvs(self.cfg.credits + CTRL_SLOTS)?;
        let idx = self.links.conns.len() as u32;
        self.links.by_peer.insert(peer, idx);
        self.links.by_qpn.insert(qp.qpn(), idx);
        self.links.conns.push(Conn {
            peer,
            card,
            state: State::Accepted,
            qpn: qp.qpn(),
            sq: SendQueue {
                depth: qp.max_send_wr().max(8) as usize,
                inflight: VecDeque::new(),
                seq: 0,
                unsignaled: 0,
            },
            init_qp: Some(qp),
            qp: None,
            ah,
            psn: random_u32() & 0x00ff_ffff,
            remote_qpn: 0,
            probe_out: false,
            remote_probe: (0, 0),
            max_frame: self.cfg.eager_size,
            credits: Credits {
                send: 0,
                to_return: 0,
                due: false,
                starved_since: None,
            },
        });
        Ok(idx)
    }

    pub(super) fn send_hs(&mut self, idx: u32, kind: HsKind, echo_qpn: u32) {
        if self.links.ud.outstanding >= UD_SENDS {
            self.poll_ud();
            if self.links.ud.outstanding >= UD_SENDS {
                return; // retransmitted later (requests) or on the duplicate request (replies)
            }
        }
        let c = &self.links.conns[idx as usize];
        let msg = Handshake {
            kind,
            from: self.cfg.id,
            qpn: c.qpn,
            psn: c.psn,
            credits: self.cfg.credits,
            echo_qpn,
            eager_size: self.cfg.eager_size as u32,
            mtu: self.info.active_mtu_enum as u8,
            card: self.card,
            probe_addr: self.links.probe_mem.addr(),
            probe_rkey: self.links.probe_mr.rkey(),
        }
        .encode();
        let slot = UD_RECVS + self.links.ud.next % UD_SENDS;
        self.links.ud.next = self.links.ud.next.wrapping_add(1);
        let addr = self.links.ud.mem.addr() + (slot as usize * UD_SLOT) as u64;
        // SAFETY: the slot lies in `ud_mem`, which no work request uses now (at most
        // UD_SENDS sends are outstanding and slots are used round robin).
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), addr as *mut u8, HS_LEN) };
        let op = SendOp::UdSend {
            ah: &c.ah,
            remote_qpn: c.card.ud_qpn,
            qkey: QKEY,
        };
        // SAFETY: the SGE lies in `ud_mr`; the slot is not rewritten before this send
        // completes (see above); the AH lives as long as the connection (the endpoint).
        let r = unsafe {
            self.links.ud.qp.post_send(
                u64::from(slot),
                &[(addr, HS_LEN as u32, self.links.ud.mr.lkey())],
                op,
                true,
                false,
            )
        };
        match r {
            Ok(()) => self.links.ud.outstanding += 1,
            Err(e) => tracing::warn!(peer = c.peer, "verbs: handshake send failed: {e}"),
        }
    }

    /// Moves the connection's QP to RTR and RTS towards the peer's QP.
    pub(super) fn connect_qp(&mut self, idx: u32, hs: &Handshake) -> Result<(), Error> {
        let av = AddrVec {
            port: self.cfg.port,
            dlid: hs.card.lid,
            dgid: hs.card.gid,
            sgid_index: self.info.gid_index as u8,
            global: self.info.is_roce(),
        };
        let c = &mut self.links.conns[idx as usize];
        let Some(qp) = c.init_qp.take() else {
            return Ok(());
        };
        let rtr = RtrAttr {
            dest_qpn: hs.qpn,
            rq_psn: hs.psn,
            mtu: self.info.active_mtu_enum.min(u32::from(hs.mtu)),
            av,
            max_dest_rd_atomic: self.info.max_dest_rd_atomic.clamp(1, 16) as u8,
        };
        let rts = RtsAttr {
            sq_psn: c.psn,
            timeout: self.cfg.ack_timeout,
            retry_cnt: self.cfg.retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: self.info.max_rd_atomic.clamp(1, 16) as u8,
        };
        c.qp = Some(qp.rtr(rtr)?.rts(rts)?);
        c.remote_qpn = hs.qpn;
        c.remote_probe = (hs.probe_addr, hs.probe_rkey);
        c.credits.send = hs.credits;
        c.max_frame = self.cfg.eager_size.min(hs.eager_size as usize);
        Ok(())
    }

    pub(super) fn handle_hs(&mut self, hs: Handshake) {
        let known = self.links.by_peer.get(&hs.from).copied();
        match hs.kind {
            HsKind::Req => {
                let idx = match known {
                    Some(idx) => {
                        let c = &self.links.conns[idx as usize];
                        match c.state {
                            // Both sides connect at once: the request of the lower id wins.
                            State::Connecting { .. } if self.cfg.id < hs.from => return,
                            State::Connecting { .. } => {
                                self.links.timed = self.links.timed.saturating_sub(1);
                                idx
                            }
                            State::Accepted | State::Ready if c.remote_qpn == hs.qpn => {
                                self.send_hs(idx, HsKind::Rep, hs.qpn); // our reply was lost
                                return;
                            }
                            _ => {
                                tracing::warn!(
                                    peer = hs.from,
                                    "verbs: ignoring a second connection request"
                                );
                                return;
                            }
                        }
                    }
                    None => match self.new_conn(hs.from, hs.card) {
                        Ok(idx) => {
                            self.stats.accepted += 1;
                            idx
                        }
                        Err(e) => {
                            tracing::warn!(
                                peer = hs.from,
                                "verbs: cannot accept a connection: {e}"
                            );
                            self.errors.push_back(e);
                            return;
                        }
                    },
                };
                match self.connect_qp(idx, &hs) {
                    Ok(()) => {
                        self.links.conns[idx as usize].state = State::Accepted;
                        self.send_hs(idx, HsKind::Rep, hs.qpn);
                    }
                    Err(e) => self.fail(idx, e),
                }
            }
            HsKind::Rep => {
                let Some(idx) = known else { return };
                let c = &self.links.conns[idx as usize];
                if !matches!(c.state, State::Connecting { .. }) || hs.echo_qpn != c.qpn {
                    return;
                }
                self.links.timed = self.links.timed.saturating_sub(1);
                match self.connect_qp(idx, &hs) {
                    Ok(()) => {
                        self.links.conns[idx as usize].state = State::Ready;
                        // Tell the responder our QP is ready (it sends only after this).
                        if let Err(e) = self.post(idx, &[], KIND_RTU, None, None, false) {
                            self.fail(idx, e);
                        }
                    }
                    Err(e) => self.fail(idx, e),
                }
            }
        }
    }

    pub(super) fn poll_ud(&mut self) {
        let mut wcs = std::mem::take(&mut self.wc_buf);
        self.poll_ud_into(&mut wcs);
        self.wc_buf = wcs;
    }

    pub(super) fn poll_ud_into(&mut self, wcs: &mut [Wc]) {
        loop {
            let n = match self.links.ud.cq.poll(wcs) {
                Ok(n) => n,
                Err(source) => {
                    self.errors.push_back(Error::PollCq { source });
                    return;
                }
            };
            for wc in &wcs[..n] {
                let slot = wc.wr_id as u32;
                if slot >= UD_RECVS {
                    self.links.ud.outstanding = self.links.ud.outstanding.saturating_sub(1);
                    if wc.status != sys::WC_SUCCESS {
                        tracing::warn!("verbs: handshake send: {}", sys::wc_status_str(wc.status));
                    }
                    continue;
                }
                let addr = self.links.ud.mem.addr() + (slot as usize * UD_SLOT) as u64;
                if wc.status == sys::WC_SUCCESS && wc.byte_len as usize >= GRH + HS_LEN {
                    // SAFETY: the receive completed, so the NIC is done with the slot; it
                    // is reposted only below.
                    let bytes = unsafe {
                        std::slice::from_raw_parts((addr as usize + GRH) as *const u8, HS_LEN)
                    };
                    if let Some(hs) = Handshake::decode(bytes) {
                        self.handle_hs(hs);
                    }
                }
                // SAFETY: as in `open`.
                if let Err(source) = unsafe {
                    self.links.ud.qp.post_recv(
                        u64::from(slot),
                        addr,
                        UD_SLOT as u32,
                        self.links.ud.mr.lkey(),
                    )
                } {
                    self.errors.push_back(Error::PostRecv { source });
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }

    /// Posts a signaled 8-byte RDMA read of the peer's probe word: it needs no receive
    /// buffer and no attention from the peer process, completes when the peer's queue pair
    /// answers, and fails (transport retries exhausted) when the peer is gone. It also
    /// retires the unsignaled sends before it.
    pub(super) fn probe(&mut self, idx: u32) {
        let local = self.links.probe_mem.addr() + 8;
        let lkey = self.links.probe_mr.lkey();
        let c = &mut self.links.conns[idx as usize];
        let Some(qp) = &c.qp else { return };
        let seq = c.sq.seq;
        let wr_id = (u64::from(idx) << 32) | u64::from(seq);
        let (remote_addr, rkey) = c.remote_probe;
        // SAFETY: the destination lies in `probe_mr` (its bytes 8..16 are only ever written
        // by probes and never read); the registration lives as long as the endpoint.
        let r = unsafe {
            qp.post_send(
                wr_id,
                &[(local, 8, lkey)],
                SendOp::Read { remote_addr, rkey },
                true,
                false,
            )
        };
        match r {
            Ok(()) => {
                c.probe_out = true;
                self.signaled_out += 1;
                c.sq.book(Wr {
                    seq,
                    buf: None,
                    probe: true,
                    signaled: true,
                    read: None,
                });
                self.stats.probes += 1;
            }
            Err(source) => {
                let peer = c.peer;
                self.fail(idx, Error::PostSend { peer, source });
            }
        }
    }

    pub(super) fn check_timers(&mut self) {
        enum Act {
            Wait,
            Timeout(u32, u64),
            Resend,
            Probe,
        }
        let now = Instant::now();
        for idx in 0..self.links.conns.len() as u32 {
            let c = &mut self.links.conns[idx as usize];
            let act = match &mut c.state {
                State::Connecting {
                    since,
                    last_req,
                    tries,
                } => {
                    if now - *since > self.cfg.handshake_timeout && self.cfg.patient_handshakes {
                        tracing::warn!(
                            "verbs: peer {} has not answered the connection handshake for {} ms; still asking (a peer busy outside any Weft call answers when it next enters one)",
                            c.peer,
                            self.cfg.handshake_timeout.as_millis()
                        );
                        *since = now;
                        Act::Wait
                    } else if now - *since > self.cfg.handshake_timeout {
                        Act::Timeout(c.peer, (now - *since).as_millis() as u64)
                    } else if now - *last_req > HANDSHAKE_RETRY * (1 << (*tries).min(3)) {
                        *last_req = now;
                        *tries += 1;
                        Act::Resend
                    } else {
                        Act::Wait
                    }
                }
                State::Ready => match c.credits.starved_since {
                    Some(t)
                        if now - t > STARVED_PROBE_AFTER
                            && !c.probe_out
                            && c.sq.inflight.len() < c.sq.depth =>
                    {
                        Act::Probe
                    }
                    _ => Act::Wait,
                },
                _ => Act::Wait,
            };
            match act {
                Act::Wait => {}
                Act::Timeout(peer, waited_ms) => {
                    self.fail(idx, Error::HandshakeTimeout { peer, waited_ms })
                }
                Act::Resend => self.send_hs(idx, HsKind::Req, 0),
                Act::Probe => self.probe(idx),
            }
        }
    }
}
