//! The errors of point-to-point operations and of a fabric's start.

/// Errors of point-to-point operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum P2pError {
    /// The message is larger than the receive buffer (its first `capacity` bytes were received).
    #[error("message truncated: rank {sender} sent {size} bytes with tag {tag}, the receive buffer holds {capacity}")]
    Truncated {
        /// The sender.
        sender: u32,
        /// The tag.
        tag: u32,
        /// The message's real size.
        size: usize,
        /// The receive buffer's size.
        capacity: usize,
    },
    /// The peer died or finalized while the operation waited on it.
    #[error("rank {rank} is gone: {reason}")]
    PeerGone {
        /// The peer.
        rank: u32,
        /// What happened to it.
        reason: String,
    },
    /// The rank is outside the communicator.
    #[error("rank {rank} is not in the communicator (size {size})")]
    InvalidRank {
        /// The rank.
        rank: u32,
        /// The communicator's size.
        size: u32,
    },
    /// The tag is not valid for a send.
    #[error("tag {0} is reserved (Tag::ANY) and cannot be sent")]
    InvalidTag(u32),
    /// No transport reaches the peer.
    #[error("no path to rank {rank}: {reason}")]
    NoPath {
        /// The peer.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// A message of a collective operation had another size than this member expected:
    /// the members disagree on the operation's arguments (a count, a type or the root).
    #[error("rank {rank} sent {got} bytes (tag {tag}) where this member expected {expected}: the members of the collective disagree on its arguments")]
    SizeMismatch {
        /// The sender.
        rank: u32,
        /// The message's tag.
        tag: u32,
        /// Bytes expected.
        expected: usize,
        /// Bytes that came.
        got: usize,
    },
    /// Another member failed its part of the collective operation (and told the others,
    /// so that none waits for it).
    #[error("rank {rank} failed its part of the collective operation: {reason}")]
    Aborted {
        /// The member that failed.
        rank: u32,
        /// Its error.
        reason: String,
    },
    /// A schedule (`sched`) was refused before it started: a step outside its buffers or
    /// the communicator.
    #[error("schedule refused: {0}")]
    Schedule(String),
    /// The transport refused the operation (a buffer it cannot register, a message
    /// beyond the device's limits).
    #[error("transport error with rank {rank}: {reason}")]
    Transport {
        /// The peer.
        rank: u32,
        /// What failed.
        reason: String,
    },
}

/// Errors of [`Fabric::init`](crate::Fabric::init).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The wire-up client could not start.
    #[error("fabric init: {0}")]
    Wire(#[from] weft_wireup::InitError),
    /// The shared-memory inbox could not be created.
    #[error("fabric init: shared-memory inbox: {0}")]
    Shm(#[from] weft_shm::ShmError),
    /// The card could not be published.
    #[error("fabric init: publishing the shared-memory card: {0}")]
    Card(#[from] weft_wireup::CommitError),
    /// The verbs transport was asked for (`WEFT_TRANSPORTS=verbs`) but cannot open.
    #[error("fabric init: WEFT_TRANSPORTS asks for verbs only, but the verbs transport cannot open: {0}")]
    #[cfg(feature = "verbs")]
    Verbs(#[source] weft_verbs::Error),
    /// The verbs transport was asked for alone (`WEFT_TRANSPORTS=verbs`) but this build
    /// has none (weft-fabric's `verbs` feature is off).
    #[cfg(not(feature = "verbs"))]
    #[error("fabric init: WEFT_TRANSPORTS asks for verbs only, but this build has no verbs transport (the `verbs` feature of weft-fabric is off)")]
    VerbsNotBuilt,
    /// Shared memory was asked for alone (`WEFT_TRANSPORTS=shm`) but this build has no
    /// shared-memory path (weft-fabric's `shm` feature is off).
    #[cfg(not(feature = "shm"))]
    #[error("fabric init: WEFT_TRANSPORTS asks for shm only, but this build has no shared-memory path (the `shm` feature of weft-fabric is off)")]
    ShmNotBuilt,
    /// TCP is the only way left to other processes (`WEFT_TRANSPORTS=tcp`, or no other
    /// transport opened) but this build has none (weft-fabric's `tcp` feature is off).
    #[cfg(not(feature = "tcp"))]
    #[error("fabric init: TCP is the only way left to other processes, but this build has no TCP transport (the `tcp` feature of weft-fabric is off)")]
    TcpNotBuilt,
    /// TCP is the only way to the other processes (`WEFT_TRANSPORTS=tcp`, or verbs did
    /// not open either) but the TCP transport cannot open.
    #[error(
        "fabric init: the TCP transport is the only way to other processes but cannot open: {0}"
    )]
    Tcp(String),
    /// A tunable has a bad value.
    #[error("fabric init: {var}={value:?}: {reason}")]
    Tunable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}
