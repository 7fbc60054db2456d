//! Paths and sending: resolving a peer's path on first contact (connecting over verbs or
//! TCP), waiting for a connection's handshake, the send fast paths, the choice between
//! eager and rendezvous, and the per-peer backlog of frames that wait for room.

use super::matching::TakeNone;
use super::polled::Polled;
use super::wire::{short_header, Envelope, Frame};
use super::RemoteRegion;
use super::{Kind, Path, Resolved, State, HDR, TCP_BACKLOG_LIMIT};
use crate::path::loopback::Loopback;
#[cfg(feature = "tcp")]
use crate::path::tcp::TcpLink;
#[cfg(feature = "verbs")]
use crate::path::verbs::VerbsLink;
use crate::path::{Caps, Link, OfferVia, RndvKind};
use crate::P2pError;

/// Something done on one connection, whatever its transport ([`State::on_link`]).
pub(super) trait OnLink {
    type Out;
    fn on<L: Link>(self, link: L) -> Self::Out;
}

/// The connection's capabilities.
struct GetCaps;

impl OnLink for GetCaps {
    type Out = Caps;
    #[inline(always)]
    fn on<L: Link>(self, link: L) -> Caps {
        link.caps()
    }
}

/// Whether the connection is through its handshake.
struct Ready;

impl OnLink for Ready {
    type Out = bool;
    #[inline(always)]
    fn on<L: Link>(self, link: L) -> bool {
        link.is_ready()
    }
}

/// One frame onto the connection if it has room now (an error: the connection failed,
/// with the path's rendezvous kind, which says whose failure handling applies).
struct TrySend<'a> {
    hdr: &'a [u8],
    payload: &'a [u8],
}

impl OnLink for TrySend<'_> {
    type Out = Result<bool, (RndvKind, String)>;
    #[inline(always)]
    fn on<L: Link>(self, mut link: L) -> Self::Out {
        link.try_send(self.hdr, self.payload)
            .map_err(|e| (L::RNDV, e.to_string()))
    }
}

/// The start of a rendezvous send: the buffer exposed for the receiver to fetch.
struct Expose {
    buf: *const u8,
    len: usize,
    pid: i32,
}

impl OnLink for Expose {
    type Out = Result<(OfferVia, Option<RemoteRegion>), String>;
    #[inline(always)]
    fn on<L: Link>(self, mut link: L) -> Self::Out {
        link.expose(self.buf, self.len, self.pid)
    }
}

/// The send fast path, the same for every transport: a message small enough for a
/// short header and inline (the path's `inline_max`) and within the path's eager limit
/// goes straight out (`true`), else the general path takes it (`false`).
#[derive(Clone, Copy)]
struct Fast {
    buf: *const u8,
    len: usize,
    ctx: u64,
    tag: u32,
    eager: usize,
    tcp_eager: usize,
}

impl OnLink for Fast {
    type Out = bool;
    #[inline(always)]
    fn on<L: Link>(self, mut link: L) -> bool {
        let limit = match L::RNDV {
            RndvKind::Bulk => self.tcp_eager,
            _ => self.eager,
        };
        if self.len > limit || self.len > link.inline_max() {
            return false;
        }
        // SAFETY: the caller of `State::send` guarantees `buf` points to `len` readable
        // bytes for the duration of the call.
        let data = unsafe { std::slice::from_raw_parts(self.buf, self.len) };
        // Not sent (Ok(false), or an error the general path reports): go on.
        matches!(
            link.try_send(&short_header(self.ctx, self.tag), data),
            Ok(true)
        )
    }
}

impl State {
    pub(super) fn path(&mut self, dest: u32) -> Result<(), P2pError> {
        let size = self.peers.len() as u32;
        let Some(peer) = self.peers.get_mut(dest as usize) else {
            return Err(P2pError::InvalidRank { rank: dest, size });
        };
        #[cfg(feature = "verbs")]
        if let (Path::Unresolved, Some(c)) = (
            &peer.path,
            self.verbs.as_ref().and_then(|ep| ep.conn_of(dest)),
        ) {
            // It connected to us first: answer on that connection.
            peer.path = Path::Verbs(c);
        }
        #[cfg(feature = "tcp")]
        if let (Path::Unresolved, Some(c)) = (
            &peer.path,
            self.tcp.as_ref().and_then(|ep| ep.conn_of(dest)),
        ) {
            peer.path = Path::Tcp(c);
        }
        if let Path::Unresolved = peer.path {
            peer.path = match (self.wireup.resolve)(dest) {
                Resolved::Shm(o) => Path::Shm(o),
                Resolved::Unreachable(why) => Path::Unreachable(why),
                #[cfg(feature = "verbs")]
                Resolved::VerbsCard(card) => match &mut self.verbs {
                    None => Path::Unreachable("the verbs transport is not open".into()),
                    Some(ep) => match ep.connect(dest, &card) {
                        Ok(c) => Path::Verbs(c),
                        Err(e) => Path::Unreachable(format!("verbs connection failed: {e}")),
                    },
                },
                #[cfg(feature = "tcp")]
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
    pub(super) fn ready(&mut self, dest: u32) -> Result<bool, P2pError> {
        if let Some(reason) = self.ends.failed.get(&dest) {
            return Err(P2pError::PeerGone {
                rank: dest,
                reason: reason.clone(),
            });
        }
        Ok(self.on_link(dest, Ready).unwrap_or(true))
    }

    /// Waits until the connection to `dest` is through its handshake, so that a send
    /// that returns has handed its frame to the NIC or the kernel rather than left it
    /// behind a handshake the caller might never progress. (The first send to a peer
    /// waits for this outside the engine lock first: `Engine::ready_for`.)
    pub(super) fn wait_connected(&mut self, dest: u32) -> Result<(), P2pError> {
        let mut spins = 0u32;
        while !self.ready(dest)? {
            self.progress_net(Polled::Verbs, &mut TakeNone);
            self.progress_net(Polled::Tcp, &mut TakeNone);
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if let Some(reason) = (self.wireup.gone)(dest) {
                    return Err(P2pError::PeerGone { rank: dest, reason });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// The one dispatch on the closed path enum: runs `op` on the connection to `dest`
    /// (`None`: no connection yet, or none possible).
    #[inline(always)]
    pub(super) fn on_link<O: OnLink>(&mut self, dest: u32, op: O) -> Option<O::Out> {
        match &mut self.peers.get_mut(dest as usize)?.path {
            Path::Shm(out) => Some(op.on(&mut **out)),
            #[cfg(feature = "verbs")]
            Path::Verbs(conn) => Some(op.on(VerbsLink {
                ep: self.verbs.as_mut()?,
                conn: *conn,
            })),
            #[cfg(feature = "tcp")]
            Path::Tcp(conn) => Some(op.on(TcpLink {
                ep: self.tcp.as_mut()?,
                conn: *conn,
            })),
            Path::Loopback => Some(op.on(Loopback)),
            Path::Unresolved | Path::Unreachable(_) => None,
        }
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
        if self.peers[dest as usize].backlog.is_empty() {
            if self.ends.failed.contains_key(&dest) && self.peers[dest as usize].path.is_tcp() {
                // The connection is gone for good: what waits on it has failed.
                tracing::debug!("dropping a frame to rank {dest}: its connection failed");
                return;
            }
            match self.on_link(dest, TrySend { hdr, payload }) {
                Some(Ok(true)) => return,
                Some(Err((rndv, e))) => return self.link_failed(dest, rndv, &e),
                _ => {}
            }
        }
        let peer = &mut self.peers[dest as usize];
        let mut f = Vec::with_capacity(hdr.len() + payload.len());
        f.extend_from_slice(hdr);
        f.extend_from_slice(payload);
        peer.queued += f.len();
        peer.backlog.push_back(f);
        if !self.busy.contains(&dest) {
            self.busy.push(dest);
        }
    }

    /// A send on the connection to `dest` (of a path whose rendezvous is `rndv`) failed.
    #[cold]
    fn link_failed(&mut self, dest: u32, rndv: RndvKind, reason: &str) {
        match rndv {
            RndvKind::Bulk => self.tcp_failed(dest, reason),
            RndvKind::RdmaRead => self.verbs_failed(dest, reason),
            RndvKind::Cma | RndvKind::None => {
                tracing::error!("sending to rank {dest} failed: {reason}")
            }
        }
    }

    /// The eager limit of a path whose rendezvous is `rndv`.
    #[inline(always)]
    fn eager_limit(&self, rndv: RndvKind) -> usize {
        match rndv {
            RndvKind::Bulk => self.cfg.tcp_eager_limit,
            _ => self.cfg.eager_limit,
        }
    }

    /// Sends `len` bytes at `buf` to `dest`: the fast path (a short frame straight onto a
    /// connected path with nothing queued, whatever the transport), else
    /// [`State::send_general`].
    #[inline]
    pub(super) fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: u32,
        ctx: u64,
        tag: u32,
    ) -> Result<Option<u32>, P2pError> {
        let fast = Fast {
            buf,
            len,
            ctx,
            tag,
            eager: self.cfg.eager_limit,
            tcp_eager: self.cfg.tcp_eager_limit,
        };
        if self
            .peers
            .get(dest as usize)
            .is_some_and(|p| p.backlog.is_empty())
            && self.on_link(dest, fast) == Some(true)
        {
            return Ok(None);
        }
        self.send_general(buf, len, dest, ctx, tag)
    }

    /// [`State::send`] beyond its fast path: unconnected peers, loopback, queued
    /// frames, larger eager messages, rendezvous; the protocol chosen by the path's
    /// capabilities.
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
        let Some(caps) = self.on_link(dest, GetCaps) else {
            return Err(P2pError::NoPath {
                rank: dest,
                reason: "its transport is not open".into(),
            });
        };
        if caps.rndv == RndvKind::None {
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
        if let Some(reason) = (self.wireup.gone)(dest) {
            return Err(P2pError::PeerGone { rank: dest, reason });
        }
        self.wait_connected(dest)?;
        // Again: a connection knows its frame size once through its handshake.
        let caps = self.on_link(dest, GetCaps).unwrap_or(caps);
        // A peer that does not keep up (its socket, the endpoint's queue and then this
        // backlog full) gets rendezvous offers instead: a send then waits for the
        // receiver, and nothing queues without bound.
        let congested = caps.congests && self.peers[dest as usize].queued >= TCP_BACKLOG_LIMIT;
        let limit = self.eager_limit(caps.rndv);
        let eager = len <= limit.min(caps.max_frame.saturating_sub(HDR)) && !congested;
        // SAFETY: as above, `buf` holds `len` readable bytes during this call.
        let data = unsafe { std::slice::from_raw_parts(buf, len) };
        if eager && caps.short_max.is_some_and(|m| len <= m) {
            self.push(dest, &short_header(ctx, tag), data);
            return Ok(None);
        }
        if eager {
            let env = Envelope { src: me, ctx, tag };
            self.send_frame(dest, &Frame::Eager { env, data });
            return Ok(None);
        }
        // Rendezvous: the path exposes the buffer (registering it where it must), the
        // offer says how the receiver fetches it.
        let pid = self.pid;
        match self.on_link(dest, Expose { buf, len, pid }) {
            Some(Ok((via, region))) => {
                Ok(Some(self.offer((buf, len, dest, ctx, tag), region, via)))
            }
            Some(Err(reason)) => Err(P2pError::Transport { rank: dest, reason }),
            None => Err(P2pError::NoPath {
                rank: dest,
                reason: "its transport is not open".into(),
            }),
        }
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
