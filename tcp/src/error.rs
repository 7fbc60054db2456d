//! The one error type of the crate.

use std::io;

use crate::ConnId;

/// Errors of the TCP transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tunable has a bad value.
    #[error("{name}={value:?} is not usable: {reason}")]
    Config {
        /// Environment variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A system call of the control path failed.
    #[error("{what} failed: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// errno.
        source: io::Error,
    },
    /// A card could not be read.
    #[error("malformed TCP card: {reason}")]
    Card {
        /// What is wrong with it.
        reason: String,
    },
    /// `connect(peer, card)` was given another rank's card.
    #[error("the TCP card given for rank {expected} is rank {found}'s")]
    CardRank {
        /// Rank asked for.
        expected: u32,
        /// Rank in the card.
        found: u32,
    },
    /// A process tried to connect to itself.
    #[error("rank {me} cannot open a TCP connection to itself")]
    SelfConnect {
        /// This process's rank.
        me: u32,
    },
    /// A `ConnId` this endpoint never returned.
    #[error("{0:?} is not a connection of this endpoint")]
    UnknownConn(ConnId),
    /// `try_send` of a frame longer than `max_frame`.
    #[error("a {len}-byte frame exceeds the largest TCP frame ({max} bytes, WEFT_TCP_MAX_FRAME)")]
    FrameTooLarge {
        /// Header plus payload.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `send_bulk` of more bytes than a record can describe.
    #[error("a {len}-byte bulk transfer exceeds the largest one ({max} bytes)")]
    BulkTooLarge {
        /// Requested length.
        len: usize,
        /// The limit.
        max: u64,
    },
    /// The connection failed (already reported through `Deliver::failed`) or was closed.
    #[error("the TCP connection to rank {peer} is down: {reason}")]
    ConnectionFailed {
        /// The peer.
        peer: u32,
        /// What happened.
        reason: String,
    },
}

impl From<weft_tunables::BadTunable> for Error {
    fn from(e: weft_tunables::BadTunable) -> Error {
        Error::Config {
            name: e.name,
            reason: e.reason(),
            value: e.value,
        }
    }
}
