//! What a message is: its tag, where a receive takes it from, and what completed.

use crate::Pod;

/// A message tag. [`Tag::ANY`] matches any tag in a receive and is not a valid send tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(pub u32);

impl Tag {
    /// Matches any tag (receive side only).
    pub const ANY: Tag = Tag(u32::MAX);
}

/// Where a receive accepts a message from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Any rank of the communicator.
    Any,
    /// This rank of the communicator.
    Rank(u32),
}

/// What a completed operation tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank in the communicator (receives), or the destination (sends).
    pub source: u32,
    /// The message's tag.
    pub tag: u32,
    /// The message's size in bytes.
    pub count: usize,
}

impl Status {
    /// The sender's rank.
    pub fn source(&self) -> u32 {
        self.source
    }
    /// Number of `T` elements the message holds.
    pub fn count_of<T: Pod>(&self) -> usize {
        self.count / std::mem::size_of::<T>().max(1)
    }
}
