//! Control-path errors of the shared-memory transport.

use std::io;

use crate::segment::SegmentError;

/// Errors of creating an [`Inbox`](crate::Inbox), connecting an
/// [`Outbox`](crate::Outbox) or reading the transport's configuration.
///
/// The hot path ([`Outbox::try_send`](crate::Outbox::try_send),
/// [`Inbox::poll`](crate::Inbox::poll)) never returns one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// Creating, opening or validating the segment failed (this includes a
    /// segment of another kind, a bad magic number and a layout version
    /// written by another build).
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The inbox to connect to does not exist (its owner has not created it
    /// yet, or has exited and its segment was removed).
    #[error("no shared-memory inbox named {name} (not created yet, or its process has exited)")]
    NoSuchInbox {
        /// Segment name of the inbox.
        name: String,
    },
    /// An [`InboxConfig`](crate::InboxConfig) value is out of range.
    #[error("invalid shared-memory inbox configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A `WEFT_SHM_*` environment variable holds a value that cannot be used.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The inbox header's geometry does not fit the segment: written by an
    /// incompatible or broken process.
    #[error("shared-memory inbox {name} has an inconsistent layout: {what}")]
    LayoutMismatch {
        /// Segment name of the inbox.
        name: String,
        /// What is inconsistent.
        what: String,
    },
    /// A sender id does not fit in 24 bits.
    #[error("sender id {sender_id} is out of range (must be below 2^24)")]
    BadSenderId {
        /// The rejected id.
        sender_id: u32,
    },
    /// Taking or testing the sender's record lock on the inbox failed.
    #[error("cannot lock sender slot {sender_id} of shared-memory inbox {name}")]
    Lock {
        /// Segment name of the inbox.
        name: String,
        /// The sender id whose lock byte was involved.
        sender_id: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}
