//! The shared-memory adapter: frames into a local peer's inbox rings (its [`Outbox`], one
//! per peer) and out of this process's own [`Inbox`]. Large messages: RTS with the
//! sender's address and pid, read by the receiver with CMA (or streamed as DATA through
//! the rings when CMA is refused).

use weft_shm::{Inbox, Outbox};

use super::{Adapter, Caps, Deliver, Link, OfferVia, RndvKind};
use crate::engine::RemoteRegion;
use crate::engine::SHORT_HDR;

impl Link for &mut Outbox {
    type Error = std::convert::Infallible;
    const RNDV: RndvKind = RndvKind::Cma;

    #[inline(always)]
    fn caps(&self) -> Caps {
        Caps {
            inline_max: self.inline_max(),
            short_max: Some(self.inline_max()),
            max_frame: self.max_frame(),
            rndv: Self::RNDV,
            reads_remote: true,
            congests: false,
        }
    }

    /// Every eager message that fits a frame goes with a short header, from the send fast
    /// path: a pair line takes up to 11 bytes, the fastbox ring or the queue the rest.
    #[inline(always)]
    fn inline_max(&self) -> usize {
        self.max_frame().saturating_sub(SHORT_HDR)
    }

    #[inline(always)]
    fn is_ready(&self) -> bool {
        true
    }

    #[inline(always)]
    fn try_send(&mut self, header: &[u8], payload: &[u8]) -> Result<bool, Self::Error> {
        Ok(Outbox::try_send(self, header, payload))
    }

    /// The receiver reads the buffer where it is (CMA), or asks for it through the rings.
    fn expose(
        &mut self,
        buf: *const u8,
        _len: usize,
        pid: i32,
    ) -> Result<(OfferVia, Option<RemoteRegion>), String> {
        let addr = buf as u64;
        Ok((OfferVia::Cma { addr, pid }, None))
    }
}

/// This process's inbox, and who its local senders are.
#[derive(Debug)]
pub(crate) struct ShmAdapter {
    inbox: Inbox,
    /// Inbox sender id (local rank) -> job rank.
    sender_rank: Vec<u32>,
}

impl ShmAdapter {
    pub(crate) fn new(inbox: Inbox, sender_rank: Vec<u32>) -> ShmAdapter {
        ShmAdapter { inbox, sender_rank }
    }

    /// The inbox's claim words (split single-copy rendezvous).
    pub(crate) fn claim_table(&self) -> weft_shm::ClaimTable {
        self.inbox.claim_table()
    }

    /// Whether nothing has arrived (cheap: loads only).
    #[inline(always)]
    pub(crate) fn quiet(&self) -> bool {
        self.inbox.quiet()
    }
}

impl Adapter for ShmAdapter {
    #[inline(always)]
    fn poll<D: Deliver>(&mut self, d: &mut D) -> usize {
        let ranks = &self.sender_rank;
        self.inbox
            .poll(&mut |sid, frame| match ranks.get(sid as usize) {
                Some(&rank) => d.frame(rank, frame),
                None => unknown_sender(sid),
            })
    }
}

#[cold]
fn unknown_sender(sid: u32) {
    tracing::error!("dropping a frame from unknown local sender {sid}");
}
