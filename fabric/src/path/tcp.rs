//! The TCP adapter: frames over one connection per peer pair (`weft-tcp`), every eager
//! message with a short header; large messages by a bulk transfer written straight from
//! the sender's buffer into the receiver's (RTS_TCP, CTS).

use weft_tcp::{ConnId, Endpoint};

use super::{Adapter, Caps, Deliver, Link, OfferVia, RndvKind};
use crate::engine::RemoteRegion;
use crate::engine::SHORT_HDR;

/// A TCP connection: the endpoint and the connection's id.
#[derive(Debug)]
pub(crate) struct TcpLink<'a> {
    pub(crate) ep: &'a mut Endpoint,
    pub(crate) conn: ConnId,
}

impl Link for TcpLink<'_> {
    type Error = weft_tcp::Error;
    const RNDV: RndvKind = RndvKind::Bulk;

    #[inline(always)]
    fn caps(&self) -> Caps {
        Caps {
            inline_max: self.inline_max(),
            // Every eager frame: the endpoint names the sender, a frame's length is the
            // message's.
            short_max: Some(usize::MAX),
            max_frame: self.ep.config().max_frame,
            rndv: Self::RNDV,
            reads_remote: false,
            congests: true,
        }
    }

    #[inline(always)]
    fn inline_max(&self) -> usize {
        self.ep.config().max_frame.saturating_sub(SHORT_HDR)
    }

    #[inline(always)]
    fn is_ready(&self) -> bool {
        self.ep.is_ready(self.conn)
    }

    #[inline(always)]
    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, Self::Error> {
        self.ep.try_send(self.conn, header, payload)
    }

    /// Nothing to expose: the payload follows the receiver's CTS as a bulk transfer,
    /// written straight from `buf`.
    fn expose(
        &mut self,
        _buf: *const u8,
        _len: usize,
        _pid: i32,
    ) -> Result<(OfferVia, Option<RemoteRegion>), String> {
        Ok((OfferVia::Bulk, None))
    }
}

/// The endpoint's own delivery, forwarded.
struct Forward<'a, D>(&'a mut D);

impl<D: Deliver> weft_tcp::Deliver for Forward<'_, D> {
    #[inline(always)]
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        self.0.frame(peer, frame)
    }

    fn bulk_received(&mut self, peer: u32, token: u64, len: usize) {
        self.0.bulk_received(peer, token, len)
    }

    fn bulk_sent(&mut self, peer: u32, token: u64) {
        self.0.bulk_sent(peer, token)
    }

    fn failed(&mut self, peer: u32, reason: &str) {
        self.0.failed(peer, reason)
    }
}

impl Adapter for Endpoint {
    #[inline(always)]
    fn poll<D: Deliver>(&mut self, d: &mut D) -> usize {
        Endpoint::poll(self, &mut Forward(d))
    }
}
