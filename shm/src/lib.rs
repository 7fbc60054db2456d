//! Weft's node-local shared memory: segments, the wire-up datastore, and the
//! shared-memory transport.
//!
//! - [`segment`]: generic POSIX shm segments with a validated header
//!   (magic, layout version, kind, state), for every shared-memory user.
//! - [`store`]: the wire-up server's node-local datastore: one writer
//!   ([`StoreWriter`]), many lock-free, syscall-free readers ([`StoreReader`]).
//! - [`layout`]: every `#[repr(C)]` type that lives in shared memory.
//! - The transport: every process creates an [`Inbox`]; a local sender
//!   connects an [`Outbox`] to it and sends frames with
//!   [`Outbox::try_send`]; the receiver gets them with [`Inbox::poll`].
//!   Large payloads go with one copy through [`cma_read`] / [`cma_write`].
//!
//! # The transport
//!
//! An inbox holds `fastbox_peers` fastboxes, single-producer rings of
//! 64-byte slots that the first senders to connect claim, one each, and one
//! bounded multi-producer queue shared by every other sender. A frame in a
//! fastbox takes `ceil((8 + len) / 64)` slots and is published by one
//! Release store of its 8-byte header word, written last; the receiver polls
//! the next header with one Acquire load per claimed fastbox. The sender
//! reads the receiver's consumer index (on its own cache line) only when its
//! ring looks full. Frames from one sender arrive in the order sent.
//!
//! Two local processes that both send to each other also share one cache
//! line, a *pair line* (see [`PairHost`]): frames of at most 24 bytes go
//! through it when the previous one was consumed, so a reply lands in the
//! line its request came in and costs one cache-line transfer instead of two
//! (the rings stay for everything else, and the order across both paths is
//! kept). The lines need owner ids ([`Inbox::create_for`]), both sides
//! pairing their outbox, and `pair_lines` in the geometry
//! (`WEFT_SHM_PAIR_LINES`). They are off by default: the gain needs the
//! replier to write within a few tens of nanoseconds of reading, before the
//! waiting side's polling shares the line again; behind the fabric's
//! matching (about 100 ns) it vanished, and the rings measured as fast.
//!
//! A sender that dies leaves only whole frames behind; a sender that dies
//! inside a queue slot it reserved is detected (its record lock on the
//! inbox is gone) and the slot recycled, so the queue does not stall.
//! Senders are trusted: an inbox is writable by every process of its user.
//!
//! # Memory
//!
//! With the defaults (32 fastboxes of 64 KiB, 1024 queue slots of 1 KiB,
//! no pair lines), one inbox segment is 12 KiB of headers + 2 MiB of
//! fastboxes + 1 MiB of queue = 3.01 MiB (256 pair lines add 16 KiB), whatever the number of local processes `P`, so the
//! node's total grows with `P`, not `P^2`:
//!
//! | local processes | segment size per process | per node (all inboxes) |
//! |---|---|---|
//! | 64  | 3.01 MiB | 193 MiB |
//! | 256 | 3.01 MiB | 771 MiB |
//!
//! (A fastbox for every pair would cost `P * (P - 1) * 64 KiB`: 252 MiB at
//! 64 processes and 4 GiB at 256.) These are segment sizes, i.e. address
//! space and the most memory they can take.
//!
//! The segment is sparse on tmpfs: only touched pages cost memory (measured
//! with `fastbox_pingpong`, which prints them). A new inbox touches 4 KiB
//! (headers and the first 15 fastbox control blocks); its first poll touches
//! the queue's first page (4 KiB); a claimed fastbox costs the pages its ring
//! has cycled through: all 64 KiB once it wrapped (about 1000 small frames or
//! 4 of the largest); the queue costs the pages of the slots used so far, all
//! 1 MiB after 1024 frames; pair lines cost a 4 KiB page per 64 local ranks
//! that talk to the inbox's owner. So the touched cost per inbox is about
//! `8 KiB + 64 KiB * (senders that used it, at most 32) + (up to 1 MiB if
//! more than 32 did)`, plus up to 16 KiB of pair lines when they are on:
//!
//! | traffic pattern | per inbox | 64 processes | 256 processes |
//! |---|---|---|---|
//! | all-to-all (everyone talks to everyone) | 3.01 MiB | 193 MiB | 771 MiB |
//! | halo exchange, 6 neighbours | 392 KiB | 25 MiB | 98 MiB |
//! | nobody sends | 8 KiB | 0.5 MiB | 2 MiB |
//!
//! Every [`Outbox`] also keeps one file descriptor open (its liveness lock),
//! so a process connected to `P - 1` peers holds `P - 1` descriptors.
//!
//! # Checking the ring with loom
//!
//! The fastbox protocol is model-checked with loom (the real producer and
//! consumer code over loom atomics and cells):
//! `RUSTFLAGS="--cfg loom" cargo test -p weft-shm --lib --release loom`
//! (use a separate `CARGO_TARGET_DIR` to keep the normal build cached).

#[doc(hidden)]
mod claim;
mod cleanup;
mod cma;
mod coll;
mod config;
mod error;
mod fastbox;
mod inbox;
pub mod layout;
mod liveness;
mod pair;
mod queue;
pub mod segment;
pub mod store;
#[cfg(test)]
mod test_child;

pub use claim::{Claim, ClaimTable};
pub use cleanup::unlink_on_sigterm;
pub use cma::{cma_read, cma_write};
pub use coll::CollSegment;
pub use config::{InboxConfig, PathConfig, TUNABLES};
pub use error::ShmError;
pub use inbox::{Inbox, Outbox};
pub use pair::{copy_short, PairHost};
pub use segment::{unlink, SegmentError};
pub use store::{StoreFull, StoreReader, StoreWriter};
