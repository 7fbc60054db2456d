//! # weft-tcp: Weft's TCP transport
//!
//! Reaches a peer process on another node over TCP when neither shared memory nor verbs
//! can. One non-blocking socket per peer pair, one epoll instance, no threads: the fabric
//! drives everything from its progress loop through [`Endpoint::poll`]. The crate knows
//! nothing of wire-up or of the fabric's frame format.
//!
//! ## Card
//!
//! [`Endpoint::card`] (see [`Card`]), little-endian:
//!
//! | bytes  | field                                   |
//! |--------|-----------------------------------------|
//! | 0..2   | magic `b"WT"`                           |
//! | 2      | card version (1)                        |
//! | 3      | address family: 4 or 6                  |
//! | 4..6   | port                                    |
//! | 6..8   | reserved (0)                            |
//! | 8..12  | rank                                    |
//! | 12..   | IP address (4 or 16 bytes)              |
//!
//! ## Handshake
//!
//! Every new connection starts with one HELLO from the initiator and one reply from the
//! acceptor, before any record:
//!
//! - HELLO (48 bytes): magic `b"WTCP"`, version u16 (1), kind u16 (1), job u64, secret
//!   2 x u64, from rank u32, to rank u32, max_frame u32, 4 reserved bytes.
//! - Reply (16 bytes, then a reason): magic, version, kind u16 (2 ACK, 3 NACK, 4 LOSE),
//!   the acceptor's rank u32, reason length u16 (at most 255, NACK only), 2 reserved
//!   bytes, then the reason (UTF-8).
//!
//! The acceptor checks magic, version, job, secret, `to == me` and that `max_frame` equals
//! its own. Bad magic: the connection is closed without an answer; anything else wrong:
//! NACK with the reason; both are logged (`tracing::warn`, naming the remote address and
//! what was wrong, never the secret). An accepted connection that sends no whole HELLO
//! within `hello_timeout` (3 s) is closed and logged. The initiator reports a NACK through
//! [`Deliver::failed`] with the acceptor's reason, and any handshake that is not done
//! within `handshake_timeout` (10 s) likewise.
//!
//! **One connection per peer pair.** When both ranks connect to each other at once, the
//! connection initiated by the lower rank wins: the lower rank answers the higher rank's
//! HELLO with LOSE while its own connection is in handshake, and the higher rank, on the
//! lower rank's HELLO, drops its own connection and accepts. Queued data belongs to the
//! peer, not to a socket, and nothing is written before a handshake completes, so what the
//! loser queued simply flows, in order, over the winner. A [`ConnId`] names the peer, so it
//! stays valid across all this.
//!
//! ## Records
//!
//! After the handshake, the stream is a sequence of records, each behind a 16-byte header
//! (little-endian): word 0 = `kind | length << 8` (kind 1 FRAME, 2 BULK; length 56 bits),
//! word 1 = the bulk's token (0 for a frame). A FRAME's length is at most `max_frame`; its
//! bytes follow and are handed to [`Deliver::frame`] whole, from the receive buffer. A
//! BULK's bytes follow and land in the memory given by [`Endpoint::expect_bulk`]. Unknown
//! kinds, non-zero reserved bytes or too long frames are protocol errors: the connection
//! is dropped and the reason reported. The receive buffer is bounded (`16 + max_frame +
//! 64 KiB`); nothing is allocated from a length read off the wire.
//!
//! A bulk whose token is not (yet) expected stalls the connection: its bytes stay in the
//! receive buffer and then in the socket, until `expect_bulk` names the token (then they
//! are copied and the rest is read straight into the landing memory), or until
//! `bulk_wait` (60 s) has passed, which makes it a protocol error.
//!
//! ## Sending
//!
//! [`Endpoint::try_send`] writes at once with one `sendmsg` of the record header, the
//! caller's header and payload when nothing is queued (no epoll round trip); only what
//! the socket did not take is copied into the connection's queue, and EPOLLOUT is
//! registered only while something is queued. [`Endpoint::send_bulk`] queues a reference
//! to the caller's memory and writes straight from it.
//!
//! ## Polling
//!
//! With at most `direct_reads` (4) established connections and nothing to write or to
//! handshake, [`Endpoint::poll`] reads each socket directly (one `recv` per connection, no
//! `epoll_wait`) and asks epoll only every 64 polls (for new connections). Otherwise it
//! asks epoll (timeout 0) and serves what it reports.
//!
//! Measured (`examples/tcp_pingpong.rs`, 8-byte one-way latency on 127.0.0.1, 2-core VM, two
//! busy-polling threads): bare blocking TCP ping-pong 24-31 us (wake-ups are slow here),
//! bare busy-polling non-blocking sockets 2.9-3.0 us, weft-tcp with direct reads 3.0-3.2 us
//! (1.04-1.06x the bare busy-poll), weft-tcp through `epoll_wait(0)` 3.3-3.5 us (1.13-1.15x).

mod config;
mod endpoint;
mod error;
mod wire;

pub use config::{Config, Tunable, TUNABLES};
pub use endpoint::{ConnId, Deliver, Endpoint, Stats};
pub use error::Error;
pub use wire::Card;
