//! The loopback adapter: a send to oneself. No frames: the message is handed to this
//! process's own matching as an eager message (one copy into the posted receive, or
//! buffered as unexpected), so a send to oneself never waits for its own receive, at any
//! size.

use super::{Caps, Link, OfferVia, RndvKind};
use crate::engine::RemoteRegion;

/// What the loopback path can do: any message eagerly, no rendezvous.
pub(crate) const CAPS: Caps = Caps {
    inline_max: 0,
    short_max: None,
    max_frame: usize::MAX,
    rndv: RndvKind::None,
    reads_remote: false,
    congests: false,
};

/// The path to ourselves, as a [`Link`]: it takes no frame (the engine hands a message
/// to itself whole, as its capabilities say: no rendezvous).
#[derive(Debug)]
pub(crate) struct Loopback;

impl Link for Loopback {
    type Error = std::convert::Infallible;
    const RNDV: RndvKind = RndvKind::None;

    #[inline(always)]
    fn caps(&self) -> Caps {
        CAPS
    }

    #[inline(always)]
    fn inline_max(&self) -> usize {
        CAPS.inline_max
    }

    #[inline(always)]
    fn is_ready(&self) -> bool {
        true
    }

    #[inline(always)]
    fn try_send(&mut self, _: &[u8], _: &[u8]) -> Result<bool, Self::Error> {
        Ok(false)
    }

    /// Never asked: a message to oneself is handed over whole (the capabilities say no
    /// rendezvous), so there is nothing to expose.
    fn expose(
        &mut self,
        _buf: *const u8,
        len: usize,
        _pid: i32,
    ) -> Result<(OfferVia, Option<RemoteRegion>), String> {
        Err(format!(
            "a {len}-byte message to oneself is delivered whole, never offered by rendezvous"
        ))
    }
}
