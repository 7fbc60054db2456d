//! The errors of [`Client`](super::Client)'s calls.

use std::io;
use std::path::PathBuf;

use weft_shm::SegmentError;

use crate::conn::ConnError;
use crate::Rank;

/// Errors of [`Client::init`](crate::Client::init).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// A variable the launcher sets is missing.
    #[error("{var} is not set: start this program with `weft run`")]
    MissingEnv {
        /// The variable.
        var: &'static str,
    },
    /// A variable the launcher sets has a bad value.
    #[error("{var}={value:?} is not valid: {reason}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server's socket could not be reached.
    #[error("cannot connect to the weft server at {path}: {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The server refused the handshake (wrong token, version, uid, duplicate rank).
    #[error("the weft server refused rank {rank}: {reason}")]
    Refused {
        /// Our rank.
        rank: Rank,
        /// The server's reason.
        reason: String,
    },
    /// The handshake failed in transit.
    #[error("handshake with the weft server at {path} failed: {reason}")]
    Handshake {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The node datastore could not be mapped or is malformed.
    #[error("cannot use the node datastore: {0}")]
    Datastore(#[from] SegmentError),
    /// The process is already connected to its server (one connection per process).
    #[error("this process is already connected to its weft server (one connection per process): share it with Client::shared(), or in a Session/Fabric program use session.fabric().wire()")]
    AlreadyConnected,
    /// The process finalized its connection; a process cannot connect again.
    #[error("this process already finalized its connection to the weft server; Weft cannot be initialized again in the same process")]
    Finalized,
    /// The host engine's PMIx server (the PMIx backend) could not be used.
    #[error(
        "wire-up through the host's PMIx server (WEFT_WIREUP=pmix or PMIX_NAMESPACE set): {reason}"
    )]
    Pmix {
        /// What went wrong.
        reason: String,
    },
}

/// Errors of [`Client::put`](crate::Client::put) and [`Client::commit`](crate::Client::commit).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The key is empty or too long.
    #[error("put: invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key (truncated to 64 characters).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value exceeds the size limit.
    #[error("put: value of {len} bytes for key {key:?} exceeds the limit of {max} bytes")]
    TooLarge {
        /// The key.
        key: String,
        /// The value's encoded size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The host's PMIx server refused the data (PMIx backend).
    #[error("commit through the host's PMIx server: {reason}")]
    Pmix {
        /// What went wrong.
        reason: String,
    },
}

/// Errors of [`Client::fence`](crate::Client::fence).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The fence timed out.
    #[error("fence timed out; processes that did not arrive: {missing:?}")]
    Timeout {
        /// Ranks that did not join in time.
        missing: Vec<Rank>,
    },
    /// A participant died or finalized before joining.
    #[error("fence failed: rank {rank} {reason}")]
    ProcGone {
        /// The rank.
        rank: Rank,
        /// What happened to it.
        reason: String,
    },
    /// The fence was aborted (another participant timed out or failed).
    #[error("fence aborted: {reason}")]
    Aborted {
        /// Why.
        reason: String,
    },
    /// The request was invalid (a rank outside the job, modes that differ, ...).
    #[error("fence invalid: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The host's PMIx server failed the fence (PMIx backend).
    #[error("fence through the host's PMIx server: {reason}")]
    Pmix {
        /// What went wrong.
        reason: String,
    },
}

/// Errors of [`Client::get`](crate::Client::get).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GetError {
    /// The process has no such key visible to the caller, and the get does not wait for
    /// it: the owner finalized without committing it, put it with a scope the caller
    /// cannot see, or the get was `immediate` or `local_only`.
    #[error("get: rank {rank} has no key {key:?} visible here: {reason}")]
    NotFound {
        /// The rank asked for.
        rank: Rank,
        /// The key asked for.
        key: String,
        /// Why it is not there.
        reason: String,
    },
    /// The rank is outside the job.
    #[error("get: rank {rank} is not in the job (size {size})")]
    InvalidRank {
        /// The rank asked for.
        rank: Rank,
        /// The job's size.
        size: u32,
    },
    /// The owner did not commit the key in time.
    #[error("get of {key:?} from rank {rank} timed out: the key was not committed by {missing:?}")]
    Timeout {
        /// The rank asked for.
        rank: Rank,
        /// The key asked for.
        key: String,
        /// Ranks that did not commit in time.
        missing: Vec<Rank>,
    },
    /// The owner died (or its node was lost) before committing the key.
    #[error("get of {key:?} failed: rank {rank} {reason}")]
    ProcGone {
        /// The rank asked for.
        rank: Rank,
        /// The key asked for.
        key: String,
        /// What happened.
        reason: String,
    },
    /// A stored value could not be decoded.
    #[error("get: value of {key:?} from rank {rank} is corrupt: {reason}")]
    Corrupt {
        /// The rank asked for.
        rank: Rank,
        /// The key asked for.
        key: String,
        /// Decoder message.
        reason: String,
    },
    /// The server reported another failure.
    #[error("get of {key:?} from rank {rank} failed: {reason}")]
    Failed {
        /// The rank asked for.
        rank: Rank,
        /// The key asked for.
        key: String,
        /// The server's reason.
        reason: String,
    },
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
}

/// Errors of [`Client::finalize`](crate::Client::finalize).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FinalizeError {
    /// The connection failed.
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// The host's PMIx server failed the finalize (PMIx backend).
    #[error("finalize through the host's PMIx server: {reason}")]
    Pmix {
        /// What went wrong.
        reason: String,
    },
}
