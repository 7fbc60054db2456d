//! The one error type of the crate: one variant per verb (with its errno) and one per
//! condition the endpoint detects.

use std::io;

use crate::sys::QpType;

/// Errors of the verbs transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libibverbs could not be loaded or lists no (matching) device.
    #[error("no RDMA device: {reason}")]
    NoDevice {
        /// Why (no library, no device, the named device missing, no usable port or GID).
        reason: String,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({device}) failed: {source}")]
    OpenDevice {
        /// Device name.
        device: String,
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_device` failed.
    #[error("ibv_query_device({device}) failed: {source}")]
    QueryDevice {
        /// Device name.
        device: String,
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({device}, port {port}) failed: {source}")]
    QueryPort {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid({device}, port {port}, index {index}) failed: {source}")]
    QueryGid {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// GID index.
        index: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd failed: {source}")]
    AllocPd {
        /// errno.
        source: io::Error,
    },
    /// `ibv_reg_mr` failed (e.g. `EFAULT` for memory that is not mapped).
    #[error("ibv_reg_mr of {len} bytes at {addr:#x} failed: {source}")]
    RegMr {
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: usize,
        /// errno.
        source: io::Error,
    },
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq({cqe} entries) failed: {source}")]
    CreateCq {
        /// Requested entries.
        cqe: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_poll_cq` failed.
    #[error("ibv_poll_cq failed: {source}")]
    PollCq {
        /// What the provider reported.
        source: io::Error,
    },
    /// `ibv_create_srq` failed.
    #[error("ibv_create_srq({max_wr} receives) failed: {source}")]
    CreateSrq {
        /// Requested receives.
        max_wr: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_post_srq_recv` or `ibv_post_recv` failed.
    #[error("ibv_post_recv failed: {source}")]
    PostRecv {
        /// errno.
        source: io::Error,
    },
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp({qp_type:?}) failed: {source}")]
    CreateQp {
        /// RC or UD.
        qp_type: QpType,
        /// errno.
        source: io::Error,
    },
    /// `ibv_modify_qp` failed.
    #[error("ibv_modify_qp(qpn {qpn} -> {to}) failed: {source}")]
    ModifyQp {
        /// QP number.
        qpn: u32,
        /// Target state.
        to: &'static str,
        /// errno.
        source: io::Error,
    },
    /// `ibv_create_ah` failed.
    #[error("ibv_create_ah failed: {source}")]
    CreateAh {
        /// errno.
        source: io::Error,
    },
    /// `ibv_post_send` failed.
    #[error("ibv_post_send to peer {peer} failed: {source}")]
    PostSend {
        /// Peer id of the connection.
        peer: u32,
        /// errno.
        source: io::Error,
    },
    /// A work completion with an error status: the connection to `peer` is broken.
    #[error("peer {peer}: {opcode} completed with status {status}")]
    WorkCompletion {
        /// Peer id of the connection.
        peer: u32,
        /// The work request's kind (send, rdma-read, recv).
        opcode: &'static str,
        /// `ibv_wc_status_str` of the status, with its number.
        status: String,
    },
    /// The handshake with `peer` got no answer in time.
    #[error("peer {peer}: no answer to the connection handshake within {waited_ms} ms")]
    HandshakeTimeout {
        /// Peer id.
        peer: u32,
        /// How long we waited.
        waited_ms: u64,
    },
    /// A message is larger than what the path can carry.
    #[error("{what} of {len} bytes exceeds the maximum of {max} bytes")]
    MessageTooLarge {
        /// What was too large (eager frame, RDMA read, registration).
        what: &'static str,
        /// Requested length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A peer's card could not be decoded.
    #[error("malformed verbs card: {reason}")]
    BadCard {
        /// What is wrong with it.
        reason: String,
    },
    /// A connection id this endpoint never returned.
    #[error("unknown connection id {0}")]
    UnknownConn(u32),
    /// A `WEFT_VERBS_*` setting is invalid.
    #[error("{name}={value:?}: {reason}")]
    Config {
        /// Variable name.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
}

impl Error {
    /// The peer id this error is about, if it is about one connection.
    pub fn peer(&self) -> Option<u32> {
        match self {
            Error::PostSend { peer, .. }
            | Error::WorkCompletion { peer, .. }
            | Error::HandshakeTimeout { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// A copy of a per-connection error (errors are not `Clone` because of `io::Error`).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::PostSend { peer, source } => Error::PostSend {
                peer: *peer,
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::WorkCompletion {
                peer,
                opcode,
                status,
            } => Error::WorkCompletion {
                peer: *peer,
                opcode,
                status: status.clone(),
            },
            Error::HandshakeTimeout { peer, waited_ms } => Error::HandshakeTimeout {
                peer: *peer,
                waited_ms: *waited_ms,
            },
            other => Error::BadCard {
                reason: other.to_string(),
            },
        }
    }
}
