//! Frames and reports polled from the verbs and TCP endpoints. Their polls run while the
//! engine holds the endpoint, so what no direct receive takes on the spot is copied here
//! ([`Kept`]) and handled once the poll is over ([`State::after_poll`]); the shared-memory
//! inbox is apart from the engine's state, so its frames are handled during its poll
//! ([`Handle`]). Both are the one [`Deliver`] shape every adapter's `poll` is generic over.

use super::matching::TakeFrame;
use super::{ReadToken, State};
use crate::path::{Adapter, Deliver};

/// A bulk transfer or RDMA read done, or a connection failed, reported by a poll.
#[derive(Debug)]
pub(super) enum Event {
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    Received {
        peer: u32,
        token: u64,
        len: usize,
    },
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    Sent {
        peer: u32,
        token: u64,
    },
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    ReadDone {
        token: ReadToken,
        res: Result<(), String>,
    },
    Failed {
        peer: u32,
        reason: String,
    },
}

/// What a verbs or TCP poll kept for after it (buffers reused: no allocation in the
/// steady state).
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// The frames, end to end.
    scratch: Vec<u8>,
    /// (peer, end offset in `scratch`) of each frame.
    spans: Vec<(u32, usize)>,
    events: Vec<Event>,
}

impl Kept {
    /// Whether the last poll kept nothing.
    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        self.spans.is_empty() && self.events.is_empty()
    }

    /// Frames kept.
    #[inline]
    pub(super) fn frames(&self) -> usize {
        self.spans.len()
    }

    /// Keeps a frame that no receive took (off the path of a frame a receive takes).
    #[cold]
    #[inline(never)]
    fn keep(&mut self, peer: u32, frame: &[u8]) {
        self.scratch.extend_from_slice(frame);
        self.spans.push((peer, self.scratch.len()));
    }
}

/// The [`Deliver`] of a verbs or TCP poll: frames go to `take` first, the rest are kept.
struct Sink<'a, T> {
    take: &'a mut T,
    taken: usize,
    kept: &'a mut Kept,
}

impl<T: TakeFrame> Deliver for Sink<'_, T> {
    #[inline(always)]
    fn frame(&mut self, peer: u32, frame: &[u8]) {
        if self.take.offer(peer, frame) {
            self.taken += 1;
        } else {
            self.kept.keep(peer, frame);
        }
    }

    fn bulk_received(&mut self, peer: u32, token: u64, len: usize) {
        self.kept.events.push(Event::Received { peer, token, len });
    }

    fn bulk_sent(&mut self, peer: u32, token: u64) {
        self.kept.events.push(Event::Sent { peer, token });
    }

    fn read_done(&mut self, token: ReadToken, res: Result<(), String>) {
        self.kept.events.push(Event::ReadDone { token, res });
    }

    fn failed(&mut self, peer: u32, reason: &str) {
        let reason = reason.to_string();
        self.kept.events.push(Event::Failed { peer, reason });
    }
}

/// Polls endpoint `ep`, offering each frame to `take` first and keeping the others in
/// `kept`; returns the frames taken.
#[inline(always)]
pub(super) fn poll_kept<A: Adapter, T: TakeFrame>(
    ep: &mut A,
    take: &mut T,
    kept: &mut Kept,
) -> usize {
    let mut sink = Sink {
        take,
        taken: 0,
        kept,
    };
    ep.poll(&mut sink);
    sink.taken
}

/// The [`Deliver`] of the inbox's poll: frames go to `take` first, the others are
/// handled at once.
pub(super) struct Handle<'a, T> {
    pub(super) st: &'a mut State,
    pub(super) take: &'a mut T,
}

impl<T: TakeFrame> Deliver for Handle<'_, T> {
    #[inline(always)]
    fn frame(&mut self, from: u32, frame: &[u8]) {
        if !self.take.offer(from, frame) {
            self.st.on_frame_from(from, frame)
        }
    }

    fn bulk_received(&mut self, peer: u32, token: u64, len: usize) {
        self.st.on_bulk_received(peer, token, len)
    }

    fn bulk_sent(&mut self, peer: u32, token: u64) {
        self.st.on_bulk_sent(peer, token)
    }

    fn read_done(&mut self, token: ReadToken, res: Result<(), String>) {
        self.st.on_read_done(token, res)
    }

    fn failed(&mut self, peer: u32, reason: &str) {
        tracing::error!("shared memory reported rank {peer} failed: {reason}");
    }
}

/// Which endpoint a poll is of (what a failure report means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Polled {
    Verbs,
    Tcp,
}

impl State {
    /// Polls the verbs or TCP endpoint (`of`), offering each frame to `take` first (a
    /// direct receive: true when it consumed the frame); then handles what the poll kept:
    /// frames, bulk transfers and RDMA reads done, failures. Returns the frames. One
    /// function for both (and for a build without one: its endpoint has no values).
    #[inline(always)]
    pub(super) fn progress_net<T: TakeFrame>(&mut self, of: Polled, take: &mut T) -> usize {
        // `kept` is empty between calls.
        let taken = match of {
            Polled::Verbs => match &mut self.verbs {
                Some(ep) => poll_kept(ep, take, &mut self.kept),
                None => return 0,
            },
            Polled::Tcp => match &mut self.tcp {
                Some(ep) => poll_kept(ep, take, &mut self.kept),
                None => return 0,
            },
        };
        // The idle poll (and a frame taken straight into a receive) ends here: this runs
        // in every spin of a wait.
        if self.kept.is_empty() && !(of == Polled::Verbs && self.reads_waiting()) {
            return taken;
        }
        let frames = self.kept.frames() + taken;
        self.after_poll(of);
        frames
    }

    /// Handles what the poll of endpoint `of` kept: its frames, in order, then its
    /// reports; keeps the buffers for the next poll.
    pub(super) fn after_poll(&mut self, of: Polled) {
        let mut kept = std::mem::take(&mut self.kept);
        let mut start = 0;
        for &(peer, end) in &kept.spans {
            self.on_frame_from(peer, &kept.scratch[start..end]);
            start = end;
        }
        kept.scratch.clear();
        kept.spans.clear();
        for ev in kept.events.drain(..) {
            match ev {
                Event::Received { peer, token, len } => self.on_bulk_received(peer, token, len),
                Event::Sent { peer, token } => self.on_bulk_sent(peer, token),
                Event::ReadDone { token, res } => self.on_read_done(token, res),
                Event::Failed { peer, reason } => match of {
                    Polled::Tcp => self.tcp_failed(peer, &reason),
                    Polled::Verbs => self.verbs_failed(peer, &reason),
                },
            }
        }
        self.kept = kept;
        if of == Polled::Verbs && self.reads_waiting() {
            // Reads that waited for room on their connection (the poll made some).
            self.start_reads();
        }
    }
}
