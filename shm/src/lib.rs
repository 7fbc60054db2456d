//! Weft's node-local shared-memory segments.
//!
//! - [`segment`]: generic POSIX shm segments with a validated header
//!   (magic, layout version, kind, state), for every shared-memory user.
//! - [`store`]: the wire-up server's node-local datastore: one writer
//!   ([`StoreWriter`]), many lock-free, syscall-free readers ([`StoreReader`]).
//! - [`layout`]: every `#[repr(C)]` type that lives in shared memory.

pub mod layout;
pub mod segment;
pub mod store;

pub use segment::{unlink, SegmentError};
pub use store::{StoreFull, StoreReader, StoreWriter};
