//! The transports, each behind one small adapter: [`shm`] (a local peer's inbox rings),
//! [`verbs`] (RC connections), [`tcp`] (one connection per peer pair) and [`loopback`]
//! (ourselves). The engine holds one [`Path`] per peer, a closed enum, and decides
//! everything that differs between transports from a path's [`Caps`] (as UCX chooses a
//! protocol from a transport's capabilities) with one dispatch `match`, never `dyn`:
//!
//! - sending: a path's connection is a [`Link`] (`try_send`, readiness, capabilities,
//!   and the start of a rendezvous: `expose` says how the receiver fetches a large
//!   message, registering it where the transport needs that); the send fast path is one
//!   generic function over it (`engine/send.rs`);
//! - receiving: a transport's receive side is an [`Adapter`] whose `poll<D: Deliver>` is
//!   monomorphised for each [`Deliver`] the engine hands it (a direct receive's taker, the
//!   queues, or the kept-frame sink), so no receive path calls through `dyn` per frame;
//!   what finishes a rendezvous on the receiving side (an RDMA read done, a bulk transfer
//!   in) comes through the same `Deliver`.

pub(crate) mod loopback;
pub(crate) mod shm;
#[cfg(feature = "tcp")]
pub(crate) mod tcp;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;

#[cfg(test)]
mod tests;

use weft_shm::Outbox;

use crate::engine::{ReadToken, RemoteRegion};

/// The way to one peer (a closed set: no `dyn` on the hot path).
#[derive(Debug)]
pub(crate) enum Path {
    /// Not connected yet (connections are made on first send).
    Unresolved,
    /// Ourselves.
    Loopback,
    /// A peer on this node: its inbox.
    Shm(Box<Outbox>),
    /// A peer reached over verbs: its RC connection.
    #[cfg(feature = "verbs")]
    Verbs(weft_verbs::ConnId),
    /// A peer reached over TCP: its connection.
    #[cfg(feature = "tcp")]
    Tcp(weft_tcp::ConnId),
    /// No way to reach it, and why.
    Unreachable(String),
}

impl Path {
    /// Whether the peer is reached over TCP (whose connection's end says that nothing
    /// more comes from it).
    #[inline]
    pub(crate) fn is_tcp(&self) -> bool {
        #[cfg(feature = "tcp")]
        if let Path::Tcp(_) = self {
            return true;
        }
        false
    }
}

/// What the resolver finds for a peer on first contact.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// Its shared-memory inbox, connected.
    Shm(Box<Outbox>),
    /// Its verbs card: the engine connects to it.
    #[cfg(feature = "verbs")]
    VerbsCard(Vec<u8>),
    /// Its TCP card: the engine connects to it.
    #[cfg(feature = "tcp")]
    TcpCard(Vec<u8>),
    /// No way to reach it, and why.
    Unreachable(String),
}

/// How a path carries a message too large to send eagerly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RndvKind {
    /// RTS with the sender's address and pid: the receiver reads it (CMA, single copy),
    /// or asks for a pipelined stream of DATA frames (CTS).
    Cma,
    /// RTS_RDMA with the sender's registered region: the receiver RDMA-reads it.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    RdmaRead,
    /// RTS_TCP, CTS, then a bulk transfer straight between the two buffers.
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    Bulk,
    /// None needed: every message is delivered whole (loopback).
    None,
}

/// How a rendezvous send offers its buffer: what the receiver needs to fetch it (what
/// [`Link::expose`] returns, carried by the offer's frame).
#[derive(Debug, Clone, Copy)]
pub(crate) enum OfferVia {
    /// Shared memory (RTS): the receiver reads `addr` in process `pid` (single copy), or
    /// asks for a stream through the rings (CTS).
    Cma { addr: u64, pid: i32 },
    /// Verbs (RTS_RDMA): the receiver RDMA-reads the registered region.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    RdmaRead { addr: u64, rkey: u32 },
    /// TCP (RTS_TCP): the receiver answers CTS, the payload follows as a bulk transfer.
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    Bulk,
}

/// What a path can do: what the engine chooses its protocol by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Largest payload the send fast path sends straight out with a short header
    /// (inline, for verbs).
    pub(crate) inline_max: usize,
    /// Largest payload of an eager frame with a short header on any path (the
    /// transport names the sender and delimits frames); `None`: only the fast path sends
    /// short headers.
    pub(crate) short_max: Option<usize>,
    /// Largest frame, header and payload.
    pub(crate) max_frame: usize,
    /// How a large message goes.
    pub(crate) rndv: RndvKind,
    /// The receiver can read the sender's memory (single-copy rendezvous).
    pub(crate) reads_remote: bool,
    /// Sends queue behind a socket without bound: past a backlog, offer by rendezvous.
    pub(crate) congests: bool,
}

/// One peer's connection on a transport, as the send path sees it.
pub(crate) trait Link {
    /// Why a send failed for good (the connection is gone).
    type Error: std::fmt::Display;
    /// How the transport carries large messages.
    const RNDV: RndvKind;
    /// What this connection can do.
    fn caps(&self) -> Caps;
    /// [`Caps::inline_max`], alone (the fast path's question).
    fn inline_max(&self) -> usize;
    /// Whether the connection is through its handshake.
    fn is_ready(&self) -> bool;
    /// Sends `header ++ payload` as one frame if there is room now (`Ok(false)`: queue
    /// it and try again later).
    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, Self::Error>;
    /// Starts a rendezvous: exposes the `len` bytes at `buf` (of process `pid`, this one)
    /// for the receiver to fetch. Returns what the offer carries, and the registration the
    /// send holds until the receiver's FIN (verbs), or why the buffer cannot be exposed.
    fn expose(
        &mut self,
        buf: *const u8,
        len: usize,
        pid: i32,
    ) -> Result<(OfferVia, Option<RemoteRegion>), String>;
}

/// What a transport's receive side hands what it polled to.
pub(crate) trait Deliver {
    /// Frame `frame` arrived from job rank `from` (valid for the call only).
    fn frame(&mut self, from: u32, frame: &[u8]);
    /// The bulk transfer `token` from `peer` is in (`len`: its full length).
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    fn bulk_received(&mut self, peer: u32, token: u64, len: usize);
    /// The bulk transfer `token` to `peer` is written.
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    fn bulk_sent(&mut self, peer: u32, token: u64);
    /// The RDMA read `token` (a rendezvous receive's fetch) finished, or failed and why.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    fn read_done(&mut self, token: ReadToken, res: Result<(), String>);
    /// The connection to `peer` failed, and why.
    fn failed(&mut self, peer: u32, reason: &str);
}

/// A transport's receive side.
pub(crate) trait Adapter {
    /// Delivers what arrived (frames in per-sender order, bulk transfers and RDMA reads
    /// done, failed connections) to `d`; returns the number of frames.
    fn poll<D: Deliver>(&mut self, d: &mut D) -> usize;
}

/// The endpoint of a transport this build leaves out (a type with no values): the engine
/// polls it like any other, and there is never one to poll.
impl Adapter for std::convert::Infallible {
    fn poll<D: Deliver>(&mut self, _: &mut D) -> usize {
        match *self {}
    }
}
