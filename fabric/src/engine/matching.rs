//! Matching: posted receives and unexpected messages, in arrival and posting order
//! (messages between two ranks never overtake each other), and the direct receive that
//! takes a matching eager frame straight from a transport's poll into the caller's buffer.

use super::rendezvous::Matched;
use std::collections::VecDeque;

use super::wire::{Envelope, Frame};
use super::{Kind, Req, State};
use crate::{P2pError, Status};

/// What [`Engine::recv_direct`] offers each frame to: takes the first matching eager frame
/// straight into the caller's buffer. A method rather than a closure so that it is inlined
/// into the transports' polls (the path from a frame's arrival to the receive's return).
pub(super) struct Taker {
    pub(super) buf: *mut u8,
    pub(super) cap: usize,
    pub(super) ctx: u64,
    pub(super) src: Option<u32>,
    pub(super) tag: Option<u32>,
    pub(super) got: Option<Result<Status, P2pError>>,
    /// Once a matching message had to be queued (a rendezvous), later matching frames
    /// must queue behind it: messages never overtake each other.
    pub(super) blocked: bool,
}

/// Something a poll offers each arrived frame to before queueing it.
pub(super) trait TakeFrame {
    /// Takes `frame` from rank `from`, or returns false: not taken (it goes to the
    /// queues).
    fn offer(&mut self, from: u32, frame: &[u8]) -> bool;
}

/// Takes nothing: every frame goes to the queues.
pub(super) struct TakeNone;

impl TakeFrame for TakeNone {
    #[inline(always)]
    fn offer(&mut self, _: u32, _: &[u8]) -> bool {
        false
    }
}

impl TakeFrame for Taker {
    /// Takes `frame` from rank `from` if it is the first matching eager frame.
    #[inline(always)]
    fn offer(&mut self, from: u32, frame: &[u8]) -> bool {
        if self.got.is_some() || self.blocked {
            return false;
        }
        let env = match Frame::decode(from, frame) {
            Ok(Frame::Eager { env, data }) => (env, Some(data)),
            Ok(Frame::Rts { env, .. } | Frame::RtsRdma { env, .. } | Frame::RtsTcp { env, .. }) => {
                (env, None)
            }
            // Not a message (or not a frame: the queues report it).
            _ => return false,
        };
        let (h, data) = env;
        if !(matches(self.ctx, self.src, self.tag, h.ctx, h.src, h.tag) && h.src == from) {
            return false;
        }
        let Some(data) = data else {
            // A matching rendezvous offer: later matching frames queue behind it.
            self.blocked = true;
            return false;
        };
        let n = data.len().min(self.cap);
        // SAFETY: `buf` is the receive buffer of `cap` >= n bytes that the caller of
        // `recv_direct` lends for the whole call; `data` is in the transport's receive
        // memory.
        unsafe { weft_shm::copy_short(data.as_ptr(), self.buf, n) };
        self.got = Some(outcome(h.src, h.tag, data.len(), self.cap));
        true
    }
}

/// Posted receives and unexpected messages, each in order.
#[derive(Default)]
pub(super) struct Matching {
    /// Posted receives in posting order, with what they match (so that matching reads
    /// no request).
    pub(super) posted: VecDeque<Posted>,
    pub(super) unexpected: VecDeque<Unexpected>,
}

pub(super) enum Body {
    Eager(Vec<u8>),
    Rts {
        sreq: u32,
        addr: u64,
        pid: i32,
        len: u64,
    },
    RtsRdma {
        sreq: u32,
        addr: u64,
        rkey: u32,
        len: u64,
    },
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    RtsTcp {
        sreq: u32,
        len: u64,
    },
}

pub(super) struct Unexpected {
    pub(super) ctx: u64,
    pub(super) src: u32,
    pub(super) tag: u32,
    pub(super) body: Body,
}

/// A posted receive: its request and what it matches.
#[derive(Debug, Clone, Copy)]
pub(super) struct Posted {
    pub(super) id: u32,
    pub(super) ctx: u64,
    pub(super) src: Option<u32>,
    pub(super) tag: Option<u32>,
}

pub(super) fn matches(
    ctx: u64,
    src: Option<u32>,
    tag: Option<u32>,
    m_ctx: u64,
    m_src: u32,
    m_tag: u32,
) -> bool {
    ctx == m_ctx && src.is_none_or(|s| s == m_src) && tag.is_none_or(|t| t == m_tag)
}

impl State {
    pub(super) fn recv(
        &mut self,
        buf: *mut u8,
        cap: usize,
        ctx: u64,
        src: Option<u32>,
        tag: Option<u32>,
    ) -> u32 {
        let id = self.alloc(Kind::Recv {
            buf,
            cap,
            src,
            pipe: None,
            split: None,
            bulk: None,
        });
        if let Some(i) = self
            .matching
            .unexpected
            .iter()
            .position(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
        {
            let u = self
                .matching
                .unexpected
                .remove(i)
                .expect("index from position");
            let (src, tag) = (u.src, u.tag);
            let m = |sreq, len: u64| Matched {
                id,
                src,
                tag,
                sreq,
                len: len as usize,
            };
            match u.body {
                Body::Eager(data) => self.fill(id, src, tag, &data),
                Body::Rts {
                    sreq,
                    addr,
                    pid,
                    len,
                } => self.rts_matched(m(sreq, len), addr, pid),
                Body::RtsRdma {
                    sreq,
                    addr,
                    rkey,
                    len,
                } => self.rdma_matched(m(sreq, len), addr, rkey),
                Body::RtsTcp { sreq, len } => self.tcp_matched(m(sreq, len)),
            }
        } else {
            self.matching.posted.push_back(Posted { id, ctx, src, tag });
        }
        id
    }

    /// The buffer and capacity of live receive request `id`.
    pub(super) fn recv_buffer(&self, id: u32) -> Option<(*mut u8, usize)> {
        match self.reqs.slots.get(id as usize) {
            Some(Some(Req {
                kind: Kind::Recv { buf, cap, .. },
                ..
            })) => Some((*buf, *cap)),
            _ => None,
        }
    }

    /// Removes and returns the first posted receive matching a message.
    #[inline]
    pub(super) fn match_posted(&mut self, ctx: u64, src: u32, tag: u32) -> Option<u32> {
        let i = self
            .matching
            .posted
            .iter()
            .position(|p| matches(p.ctx, p.src, p.tag, ctx, src, tag))?;
        // Usually the oldest posted receive: a pop, not a general removal.
        let p = if i == 0 {
            self.matching.posted.pop_front()
        } else {
            self.matching.posted.remove(i)
        };
        p.map(|p| p.id)
    }

    /// Copies an eager message into a receive and completes it.
    #[inline]
    pub(super) fn fill(&mut self, id: u32, src: u32, tag: u32, data: &[u8]) {
        let Some((buf, cap)) = self.recv_buffer(id) else {
            return;
        };
        let n = data.len().min(cap);
        // SAFETY: `buf` is the receive buffer of a live request (borrowed mutably by it for
        // its whole life) with room for `cap` >= n bytes; `data` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
        let r = outcome(src, tag, data.len(), cap);
        self.complete(id, r);
    }

    pub(super) fn on_eager(&mut self, h: Envelope, data: &[u8]) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.fill(id, h.src, h.tag, data),
            None => self.matching.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::Eager(data.to_vec()),
            }),
        }
    }

    pub(super) fn on_rts(&mut self, h: Envelope, sreq: u32, len: u64, addr: u64, pid: i32) {
        match self.match_posted(h.ctx, h.src, h.tag) {
            Some(id) => self.rts_matched(Matched::of(id, h, sreq, len), addr, pid),
            None => self.matching.unexpected.push_back(Unexpected {
                ctx: h.ctx,
                src: h.src,
                tag: h.tag,
                body: Body::Rts {
                    sreq,
                    addr,
                    pid,
                    len,
                },
            }),
        }
    }
}

/// The result of a receive of a `size`-byte message into `cap` bytes.
#[inline]
pub(super) fn outcome(sender: u32, tag: u32, size: usize, cap: usize) -> Result<Status, P2pError> {
    if size > cap {
        Err(P2pError::Truncated {
            sender,
            tag,
            size,
            capacity: cap,
        })
    } else {
        Ok(Status {
            source: sender,
            tag,
            count: size,
        })
    }
}
