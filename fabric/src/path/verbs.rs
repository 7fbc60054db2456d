//! The verbs adapter: frames over RC connections (`weft-verbs`), small ones inline;
//! large messages by RDMA read of the sender's registered buffer (RTS_RDMA, FIN).

use weft_verbs::{ConnId, Endpoint};

use super::{Adapter, Caps, Deliver, Link, OfferVia, RndvKind};
use crate::engine::RemoteRegion;
use crate::engine::SHORT_HDR;

/// A verbs connection: the endpoint and the connection's id.
#[derive(Debug)]
pub(crate) struct VerbsLink<'a> {
    pub(crate) ep: &'a mut Endpoint,
    pub(crate) conn: ConnId,
}

impl Link for VerbsLink<'_> {
    type Error = weft_verbs::Error;
    const RNDV: RndvKind = RndvKind::RdmaRead;

    #[inline(always)]
    fn caps(&self) -> Caps {
        Caps {
            inline_max: self.inline_max(),
            // Queued frames carry the full header.
            short_max: None,
            max_frame: self.ep.max_frame(self.conn),
            rndv: Self::RNDV,
            reads_remote: true,
            congests: false,
        }
    }

    #[inline(always)]
    fn inline_max(&self) -> usize {
        self.ep.max_inline().saturating_sub(SHORT_HDR)
    }

    #[inline(always)]
    fn is_ready(&self) -> bool {
        self.ep.is_ready(self.conn)
    }

    #[inline(always)]
    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, Self::Error> {
        self.ep.try_send(self.conn, header, payload)
    }

    /// Registers the buffer (an empty one has nothing to read, nor to register): the
    /// receiver RDMA-reads the region, the send holds it until FIN.
    fn expose(
        &mut self,
        buf: *const u8,
        len: usize,
        _pid: i32,
    ) -> Result<(OfferVia, Option<RemoteRegion>), String> {
        if len == 0 {
            return Ok((OfferVia::RdmaRead { addr: 0, rkey: 0 }, None));
        }
        let r = self
            .ep
            .register(buf, len)
            .map_err(|e| format!("registering the {len}-byte send buffer: {e}"))?;
        Ok((
            OfferVia::RdmaRead {
                addr: r.addr,
                rkey: r.rkey,
            },
            Some(r),
        ))
    }
}

/// The endpoint's own delivery, forwarded (frames only: reads are polled apart).
struct Frames<'a, D>(&'a mut D);

impl<D: Deliver> weft_verbs::Deliver for Frames<'_, D> {
    #[inline(always)]
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        self.0.frame(peer, frame)
    }
}

impl Adapter for Endpoint {
    /// A completion error names its connection's peer, which `d` is told has failed.
    /// RDMA reads the poll found finished are reported after the frames.
    #[inline(always)]
    fn poll<D: Deliver>(&mut self, d: &mut D) -> usize {
        let n = match self.poll_with(&mut Frames(d)) {
            Ok(n) => n,
            Err(e) => {
                polled_error(d, &e);
                0
            }
        };
        if self.rdma_done_pending() {
            reads_done(self, d);
        }
        n
    }
}

#[inline(never)]
fn reads_done<D: Deliver>(ep: &mut Endpoint, d: &mut D) {
    ep.take_rdma_done(&mut |token, res: Result<(), weft_verbs::Error>| {
        d.read_done(token, res.map_err(|e| e.to_string()))
    });
}

#[cold]
#[inline(never)]
fn polled_error<D: Deliver>(d: &mut D, e: &weft_verbs::Error) {
    match e.peer() {
        Some(peer) => d.failed(peer, &e.to_string()),
        None => tracing::error!("verbs: {e}"),
    }
}
