//! # weft-verbs: Weft's InfiniBand / RoCE transport
//!
//! Moves Weft's frames between processes on different nodes over reliable-connected (RC)
//! queue pairs, through `libibverbs` loaded at run time (`rdma-mummy-sys`: the crate builds
//! without rdma-core and fails cleanly with [`Error::NoDevice`] where there is none).
//!
//! ## Layers
//!
//! - `sys` (private module): the only code naming `rdma_mummy_sys`. RAII [`Context`],
//!   [`Pd`], [`Cq`], [`Srq`], [`Qp`], [`Mr`] (and an address handle); each child holds an
//!   `Arc` of its parent, so drop order is enforced by ownership. Queue-pair states are
//!   types: `Qp<Reset>` -> `Qp<Init>` -> `Qp<Rtr>` -> `Qp<Rts>`, and only `Qp<Rts>` posts
//!   sends. Posting work requests is crate-internal.
//! - Discovery ([`query_device`], [`describe`]): device, port state, link layer, LID, GID
//!   table, the GID in use, active MTU, max inline data (probed by creating a queue pair),
//!   max message size.
//! - [`Endpoint`]: one per process, what the fabric's engine drives.
//!
//! ## The endpoint
//!
//! [`Endpoint::open`] creates one protection domain, three completion queues (RC sends and
//! reads, RC receives, handshakes), one shared receive queue (SRQ) of registered eager
//! buffers of `WEFT_VERBS_EAGER_SIZE` bytes, registered send buffers, and one unreliable
//! datagram (UD) queue pair for connection handshakes. No RC queue pair exists at start-up.
//!
//! ### Card
//!
//! [`Endpoint::card`] is 32 bytes, independent of the number of processes
//! (little-endian):
//!
//! | bytes  | field                                                 |
//! |--------|-------------------------------------------------------|
//! | 0      | magic `b'W'`                                          |
//! | 1      | card version (1)                                      |
//! | 2      | port number                                           |
//! | 3      | active MTU as `ibv_mtu` (1 = 256 ... 5 = 4096)        |
//! | 4..6   | LID (0 on RoCE)                                       |
//! | 6..8   | reserved                                              |
//! | 8..12  | QP number of the UD queue pair                        |
//! | 12..16 | random nonce of this endpoint                         |
//! | 16..32 | GID (RoCE v2: `::ffff:a.b.c.d` of the interface)      |
//!
//! ### Handshake (lazy RC connections)
//!
//! [`Endpoint::connect`]`(peer, card)` creates an RC queue pair in INIT, picks a random
//! 24-bit PSN and sends a REQ datagram to the peer's UD queue pair: its peer id, RC QP
//! number, PSN, the credits it grants, its eager buffer size, its MTU and its own card. The
//! peer's [`Endpoint::poll`] answers it, creating the connection if it had none (accepting a
//! peer it never heard of): it moves its own RC queue pair to RTR (towards the requester's
//! QPN and PSN, path MTU = the smaller active MTU, `ah_attr.is_global = 1` with the
//! requester's GID and our `sgid_index` on RoCE) and RTS, and replies REP with the same
//! fields plus the requester's QPN. The requester then moves to RTR/RTS and sends an RTU
//! ("ready to use") message over the new connection; the responder starts sending only once
//! something arrives on it, so it never sends to a queue pair that is not yet ready.
//! Requests are retransmitted (100, 200, 400, 800 ms ...) until `WEFT_VERBS_HANDSHAKE_TIMEOUT_MS`,
//! then the connection fails with [`Error::HandshakeTimeout`]. When two processes connect to
//! each other at once, the request of the lower peer id wins: the higher one answers it with
//! the queue pair it had created for its own request.
//!
//! ### Eager frames and flow control
//!
//! A frame (`header ++ payload`, at most [`Endpoint::max_frame`]) is one SEND_WITH_IMM.
//! Frames up to the device's max inline data are sent inline (no copy into registered
//! memory, no send buffer); larger ones are copied into a registered send buffer. Only every
//! `WEFT_VERBS_SIGNAL_EVERY`-th send asks for a completion (more when the send queue or the
//! send buffers run low); one completion retires all earlier sends of the queue pair.
//!
//! The immediate data carries the frame kind (top 8 bits: data, credit, probe, RTU) and
//! returned credits (low 24 bits). Each connection grants the peer `WEFT_VERBS_CREDITS`
//! eager sends, and posts that many receive buffers (plus 4 for control messages) to the
//! shared receive queue. A sender spends one credit per data frame and gets `Ok(false)` from
//! [`Endpoint::try_send`] at zero, so a fast sender cannot overrun a slow receiver. The
//! receiver returns credits for the frames it has delivered and re-posted, piggy-backed on
//! any frame it sends that way, or in an explicit credit message once half of the grant is
//! consumed. Control messages need no credits: the 4 reserved buffers cover them (at most
//! one RTU and two credit messages are unconsumed at a time). A sender left without
//! credits for 100 ms sends a probe (an 8-byte RDMA read of the peer's probe word, answered
//! by the peer's NIC without consuming a receive buffer), so a dead peer becomes an error
//! (transport retries exhausted after about 7 x 4.096 us x 2^`WEFT_VERBS_ACK_TIMEOUT`,
//! 0.5 s by default)
//! instead of a hang. RC queue pairs retry RNR indefinitely as a last resort. (The
//! transport retry count defaults to 6, not 7: rxe treats 7 as "retry forever", which would
//! turn a dead peer into a hang.)
//!
//! Received frames are delivered by [`Endpoint::poll`] in each peer's order (one RC queue
//! pair per peer, one receive CQ), in batches of up to 32 completions.
//!
//! ### Rendezvous: RDMA read or write, and the registration cache
//!
//! The side that owns the target of a transfer exposes it with [`Endpoint::register`]
//! (address and rkey for the peer) and calls [`Endpoint::release`] once the peer reported
//! the transfer done; the other side moves the data with [`Endpoint::rdma_read`] (sender
//! exposes, receiver pulls) or [`Endpoint::rdma_write`] (receiver exposes, sender pushes),
//! zero copy on both sides, and learns of completion from [`Endpoint::poll_rdma`]
//! (`poll_reads` is the same). Those two are `unsafe`: the caller promises not to touch
//! the local memory until the completion (the fabric moves the application's buffers of
//! nonblocking requests, a promise no Rust type can carry). Without `unsafe`, an
//! [`RdmaBuf`] from [`Endpoint::alloc_rdma_buf`] (registered once) is lent by value to
//! [`Endpoint::read_into`] or [`Endpoint::write_from`] and handed back by
//! [`Endpoint::take_buf`] once `poll_rdma` reported the transfer; a buffer longer than the
//! peer's region is refused and handed back. Measured on rxe0 in the VM at 1 MiB: writes reach
//! `ib_write_bw`, reads about 0.85x of it (`ib_read_bw` is slower than `ib_write_bw` there
//! too), so a receiver-driven write protocol is the faster rendezvous on that device.
//! Both sides register through the registration cache: regions are registered page-aligned
//! and kept, keyed by their virtual address range, so a buffer used again costs nothing.
//!
//! **Correctness rule:** a cached registration pins the physical pages that backed the range
//! when it was made. If that memory is freed (or unmapped) and the address range reused, the
//! cached registration would still point at the old pages, so whoever frees or reuses memory
//! that went through `register`/`rdma_read`/`rdma_write` must first call
//! [`Endpoint::invalidate`] on it
//! (the cache does not intercept `free`/`munmap`; the fabric calls it from the paths that
//! free such memory). Within that rule the cache keeps registrations alive exactly as long
//! as they are needed: an RDMA read in flight holds its local registration; an exposure is
//! pinned from `register` to `release`, so neither the size limit (`WEFT_VERBS_RCACHE_MAX`,
//! least recently used first) nor a new overlapping registration can pull it from under a
//! reading peer; unpinned entries that a new registration overlaps are replaced by it.
//! `WEFT_VERBS_RCACHE=0` registers on every use and deregisters exposures on `release`.
//!
//! ### Errors
//!
//! One [`Error`] enum: one variant per verb with its errno, [`Error::WorkCompletion`] naming
//! the peer and the completion status (`ibv_wc_status_str`) when a connection breaks, and
//! clear errors for a message beyond the maximum size, an invalid buffer, a malformed card,
//! and a missing device.
//!
//! ## Tunables
//!
//! Every `WEFT_VERBS_*` variable, its default and meaning is in [`TUNABLES`].

mod card;
mod device;
mod endpoint;
mod error;
mod rcache;
mod sys;

pub use card::CARD_LEN;
pub use device::{describe, query_device, Config, DeviceInfo, GidEntry, TUNABLES};
pub use endpoint::{
    ConnId, Deliver, Endpoint, RdmaBuf, RdmaToken, ReadToken, Refused, RemoteRegion, Stats,
};
pub use error::Error;
pub use rcache::RcacheStats;
pub use sys::{
    live_objects, Context, Cq, Init, LiveObjects, Mr, Pd, Qp, QpType, Reset, Rtr, Rts, Srq,
};

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
