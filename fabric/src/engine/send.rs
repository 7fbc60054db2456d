//! Paths and sending: resolving a peer's path on first contact (connecting over verbs or
//! TCP), waiting for a connection's handshake, the send fast paths, the choice between
//! eager and rendezvous, and the per-peer backlog of frames that wait for room.

use super::rendezvous::OfferVia;
use super::wire::{short_header, Envelope, Frame, SHORT_HDR, SHORT_MAX};
use super::{Kind, Path, Peer, Resolved, State, HDR, TCP_BACKLOG_LIMIT};
use crate::P2pError;
use weft_verbs::RemoteRegion;

impl State {
    pub(super) fn path(&mut self, dest: u32) -> Result<(), P2pError> {
        let size = self.peers.len() as u32;
        let Some(peer) = self.peers.get_mut(dest as usize) else {
            return Err(P2pError::InvalidRank { rank: dest, size });
        };
        if let (Path::Unresolved, Some(c)) = (
            &peer.path,
            self.verbs.as_ref().and_then(|ep| ep.conn_of(dest)),
        ) {
            // It connected to us first: answer on that connection.
            peer.path = Path::Verbs(c);
        }
        if let (Path::Unresolved, Some(c)) = (
            &peer.path,
            self.tcp.as_ref().and_then(|ep| ep.conn_of(dest)),
        ) {
            peer.path = Path::Tcp(c);
        }
        if let Path::Unresolved = peer.path {
            peer.path = match (self.resolve)(dest) {
                Resolved::Shm(o) => Path::Shm(o),
                Resolved::Unreachable(why) => Path::Unreachable(why),
                Resolved::VerbsCard(card) => match &mut self.verbs {
                    None => Path::Unreachable("the verbs transport is not open".into()),
                    Some(ep) => match ep.connect(dest, &card) {
                        Ok(c) => Path::Verbs(c),
                        Err(e) => Path::Unreachable(format!("verbs connection failed: {e}")),
                    },
                },
                Resolved::TcpCard(card) => match &mut self.tcp {
                    None => Path::Unreachable("the TCP transport is not open".into()),
                    Some(ep) => match ep.connect(dest, &card) {
                        Ok(c) => Path::Tcp(c),
                        Err(e) => Path::Unreachable(format!("TCP connection failed: {e}")),
                    },
                },
            };
        }
        match &self.peers[dest as usize].path {
            Path::Unreachable(why) => Err(P2pError::NoPath {
                rank: dest,
                reason: why.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether the path to `dest` (resolved) can take a frame at once: over verbs or TCP,
    /// once its connection is through its handshake; an error if that connection failed.
    pub(super) fn ready(&self, dest: u32) -> Result<bool, P2pError> {
        if let Some(reason) = self.failed.get(&dest) {
            return Err(P2pError::PeerGone {
                rank: dest,
                reason: reason.clone(),
            });
        }
        Ok(match self.peers[dest as usize].path {
            Path::Verbs(conn) => self.verbs.as_ref().is_none_or(|ep| ep.is_ready(conn)),
            Path::Tcp(conn) => self.tcp.as_ref().is_none_or(|ep| ep.is_ready(conn)),
            _ => true,
        })
    }

    /// Waits until the connection to `dest` is through its handshake, so that a send
    /// that returns has handed its frame to the NIC or the kernel rather than left it
    /// behind a handshake the caller might never progress. (The first send to a peer
    /// waits for this outside the engine lock first: `Engine::ready_for`.)
    pub(super) fn wait_connected(&mut self, dest: u32) -> Result<(), P2pError> {
        let mut spins = 0u32;
        while !self.ready(dest)? {
            self.progress_verbs();
            self.progress_tcp();
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if let Some(reason) = (self.gone)(dest) {
                    return Err(P2pError::PeerGone { rank: dest, reason });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Sends a frame to `dest` or queues it behind earlier ones.
    pub(super) fn push(&mut self, dest: u32, hdr: &[u8], payload: &[u8]) {
        if let Path::Unresolved = self.peers[dest as usize].path {
            // A control frame (FIN, CTS) to a peer we never sent to: connect now. A peer
            // that sent us a frame is reachable; if not, the frame is dropped with a log.
            if let Err(e) = self.path(dest) {
                tracing::error!("cannot answer rank {dest}: {e}");
                return;
            }
        }
        let peer = &mut self.peers[dest as usize];
        if peer.backlog.is_empty() {
            match &mut peer.path {
                Path::Shm(out) => {
                    let sent = out.try_send(hdr, payload);
                    if sent {
                        return;
                    }
                }
                Path::Verbs(conn) => match self
                    .verbs
                    .as_mut()
                    .map(|ep| ep.try_send(*conn, hdr, payload))
                {
                    Some(Ok(true)) => return,
                    Some(Err(e)) => return self.verbs_failed(dest, &e),
                    _ => {}
                },
                Path::Tcp(conn) => {
                    if self.failed.contains_key(&dest) {
                        // The connection is gone for good: what waits on it has failed.
                        tracing::debug!("dropping a frame to rank {dest}: its connection failed");
                        return;
                    }
                    match self.tcp.as_mut().map(|ep| ep.try_send(*conn, hdr, payload)) {
                        Some(Ok(true)) => return,
                        Some(Err(e)) => return self.tcp_failed(dest, &e.to_string()),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        let mut f = Vec::with_capacity(hdr.len() + payload.len());
        f.extend_from_slice(hdr);
        f.extend_from_slice(payload);
        peer.queued += f.len();
        peer.backlog.push_back(f);
        if !self.busy.contains(&dest) {
            self.busy.push(dest);
        }
    }

    pub(super) fn max_payload(&self, dest: u32) -> usize {
        match &self.peers[dest as usize].path {
            Path::Shm(o) => o.max_frame().saturating_sub(HDR),
            Path::Verbs(c) => self
                .verbs
                .as_ref()
                .map_or(0, |ep| ep.max_frame(*c).saturating_sub(HDR)),
            Path::Tcp(_) => self
                .tcp
                .as_ref()
                .map_or(0, |ep| ep.config().max_frame.saturating_sub(HDR)),
            _ => usize::MAX,
        }
    }

    pub(super) fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        // The fast path: a short message to a connected local peer with nothing queued.
        if len <= SHORT_MAX && len <= self.cfg.eager_limit {
            if let Some(Peer {
                path: Path::Shm(out),
                backlog,
                ..
            }) = self.peers.get_mut(dest as usize)
            {
                // SAFETY: the caller guarantees `buf` points to `len` readable bytes for
                // the duration of this call.
                let data = unsafe { std::slice::from_raw_parts(buf, len) };
                if backlog.is_empty() && out.try_send(&short_header(ctx, tag), data) {
                    return Ok(None);
                }
            }
        }
        // The same for a peer reached by verbs: small frames go inline, the endpoint
        // checks the rest (readiness, credits, room) and says no when it must queue.
        if len <= self.cfg.eager_limit {
            if let (
                Some(Peer {
                    path: Path::Verbs(conn),
                    backlog,
                    ..
                }),
                Some(ep),
            ) = (self.peers.get_mut(dest as usize), self.verbs.as_mut())
            {
                if backlog.is_empty() && len + SHORT_HDR <= ep.max_inline() {
                    // A short header: the endpoint names the sender and the frame's length
                    // is the message's.
                    let hdr = short_header(ctx, tag);
                    // SAFETY: as above, `buf` holds `len` readable bytes during this call.
                    let data = unsafe { std::slice::from_raw_parts(buf, len) };
                    // Not sent (Ok(false), or an error the slow path reports): go on.
                    if let Ok(true) = ep.try_send(*conn, &hdr, data) {
                        return Ok(None);
                    }
                }
            }
        }
        // And for a peer reached over TCP: a short header, written at once when nothing
        // is queued for the connection (the endpoint copies what the socket does not take).
        if len <= self.cfg.tcp_eager_limit {
            if let (
                Some(Peer {
                    path: Path::Tcp(conn),
                    backlog,
                    ..
                }),
                Some(ep),
            ) = (self.peers.get_mut(dest as usize), self.tcp.as_mut())
            {
                if backlog.is_empty() && len + SHORT_HDR <= ep.config().max_frame {
                    let hdr = short_header(ctx, tag);
                    // SAFETY: as above, `buf` holds `len` readable bytes during this call.
                    let data = unsafe { std::slice::from_raw_parts(buf, len) };
                    // A failed connection errs here: the slow path reports it.
                    if let Ok(true) = ep.try_send(*conn, &hdr, data) {
                        return Ok(None);
                    }
                }
            }
        }
        self.send_general(buf, len, dest, ctx, tag)
    }

    /// [`State::send`] beyond its fast paths: unconnected peers, loopback, queued
    /// frames, larger eager messages, rendezvous.
    #[inline(never)]
    pub(super) fn send_general(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        self.path(dest)?;
        let me = self.me;
        if dest == me {
            // Loopback is always buffered (one copy when the receive is already posted),
            // so a send to oneself never waits for its own receive.
            // SAFETY: the caller guarantees `buf` points to `len` readable bytes for the
            // duration of this call (it is borrowed by the send request).
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            self.on_eager(Envelope { src: me, ctx, tag }, data);
            return Ok(None);
        }
        // A peer that finalized or died receives nothing more: say so rather than
        // queue or drop the message (a fast path's write to a closing connection, or to
        // a finalized process's ring, fell through to here or fills up to here).
        if let Some(reason) = (self.gone)(dest) {
            return Err(P2pError::PeerGone { rank: dest, reason });
        }
        let tcp = matches!(self.peers[dest as usize].path, Path::Tcp(_));
        self.wait_connected(dest)?;
        let limit = if tcp {
            self.cfg.tcp_eager_limit
        } else {
            self.cfg.eager_limit
        };
        // A peer that does not keep up (its socket, the endpoint's queue and then this
        // backlog full) gets rendezvous offers instead: a send then waits for the
        // receiver, and nothing queues without bound.
        let congested = tcp && self.peers[dest as usize].queued >= TCP_BACKLOG_LIMIT;
        let eager = len <= limit.min(self.max_payload(dest)) && !congested;
        let short = match self.peers[dest as usize].path {
            Path::Shm(_) => len <= SHORT_MAX,
            // The endpoint names the sender, the frame's length is the message's.
            Path::Tcp(_) => true,
            _ => false,
        };
        if eager && short {
            // SAFETY: as above, `buf` holds `len` readable bytes during this call.
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            self.push(dest, &short_header(ctx, tag), data);
            return Ok(None);
        }
        if eager {
            // SAFETY: as above, `buf` holds `len` readable bytes during this call.
            let data = unsafe { std::slice::from_raw_parts(buf, len) };
            let env = Envelope { src: me, ctx, tag };
            self.send_frame(dest, &Frame::Eager { env, data });
            return Ok(None);
        }
        if let Path::Verbs(_) = self.peers[dest as usize].path {
            return self.send_rdma(buf, len, dest, ctx, tag).map(Some);
        }
        if tcp {
            return Ok(Some(self.send_tcp_rts(buf, len, dest, ctx, tag)));
        }
        // Shared memory: the receiver copies from our memory (address and pid).
        let via = OfferVia::Cma {
            addr: buf as u64,
            pid: self.pid,
        };
        Ok(Some(self.offer((buf, len, dest, ctx, tag), None, via)))
    }

    /// Starts a rendezvous send: a request for the `len` bytes at `buf` to `dest` (with
    /// its buffer's verbs registration, if any), offered (RTS, RTS_RDMA or RTS_TCP, which
    /// name the request) as `via` says.
    pub(super) fn offer(
        &mut self,
        (buf, len, dest, ctx, tag): (*const u8, usize, u32, u64, u32),
        registered: Option<RemoteRegion>,
        via: OfferVia,
    ) -> u32 {
        let id = self.alloc(Kind::Send {
            buf,
            len,
            dest,
            stream: None,
            registered,
        });
        let env = Envelope {
            src: self.me,
            ctx,
            tag,
        };
        let (sreq, len) = (self.wire_id(id), len as u64);
        let f = match via {
            OfferVia::Cma { addr, pid } => Frame::Rts {
                env,
                sreq,
                len,
                addr,
                pid,
            },
            OfferVia::RdmaRead { addr, rkey } => Frame::RtsRdma {
                env,
                sreq,
                len,
                addr,
                rkey,
            },
            OfferVia::Bulk => Frame::RtsTcp { env, sreq, len },
        };
        self.send_frame(dest, &f);
        id
    }
}
