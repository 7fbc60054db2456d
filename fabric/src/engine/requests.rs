//! The requests: one slot per send or receive in progress (reused once taken), named on
//! the wire by slot and generation ([`Requests::wire_id`]).

use super::RemoteRegion;

use super::split::Split;
use crate::{P2pError, Status};

/// The request slot in a wire id ([`Requests::wire_id`]): 16 M requests at once at most.
const WIRE_SLOT_MASK: u32 = 0x00ff_ffff;

#[derive(Debug)]
pub(super) enum Kind {
    Recv {
        buf: *mut u8,
        cap: usize,
        /// The sender it waits for (the match itself is in `State::posted`).
        src: Option<u32>,
        /// Pipelined rendezvous in progress: (sender, tag, total, received so far).
        pipe: Option<(u32, u32, usize, usize)>,
        /// A split single-copy rendezvous in progress.
        split: Option<Box<Split>>,
        /// The token of the TCP bulk transfer this receive's buffer is lent to.
        bulk: Option<u64>,
    },
    Send {
        buf: *const u8,
        len: usize,
        dest: u32,
        /// Pipelined rendezvous: the receiver's request and the next offset to stream.
        stream: Option<(u32, usize)>,
        /// The buffer's registration with the verbs endpoint (released on FIN).
        registered: Option<RemoteRegion>,
    },
}

#[derive(Debug)]
pub(super) struct Req {
    pub(super) kind: Kind,
    pub(super) result: Option<Result<Status, P2pError>>,
    /// Which request this is, for ever: ids are reused once taken, serials never.
    pub(super) serial: u64,
}

// SAFETY: the raw pointers of `Kind` and `RndvRecv` are user buffers that the call or the
// `Request` that posted them borrows (`&mut [T]` / `&[T]` of `Pod` data, themselves
// `Send`) until the request completes or is cancelled; the engine that holds them is
// only touched under its mutex, so moving it (or handing the mutex) to another thread
// moves nothing that another thread could use at the same time.
unsafe impl Send for Kind {}

/// The requests in progress (and done but not taken).
#[derive(Debug)]
pub(super) struct Requests {
    pub(super) slots: Vec<Option<Req>>,
    /// Free slots.
    pub(super) free: Vec<u32>,
    /// The serial of the next request.
    pub(super) next_serial: u64,
}

impl Requests {
    pub(super) fn new() -> Requests {
        Requests {
            slots: Vec::new(),
            free: Vec::new(),
            next_serial: 1,
        }
    }

    pub(super) fn alloc(&mut self, kind: Kind) -> u32 {
        let req = Req {
            kind,
            result: None,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(req);
                id
            }
            None => {
                // Wire ids name 2^24 slots (16 M requests at once, far past any memory).
                debug_assert!(self.slots.len() < WIRE_SLOT_MASK as usize);
                self.slots.push(Some(req));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// How request `id` is named on the wire: its slot (24 bits) and the low 8 bits of
    /// its serial, so that a late frame for an earlier request of the same slot (a FIN,
    /// CTS, DATA or split-copy answer) is recognised as stale 255 times in 256.
    pub(super) fn wire_id(&self, id: u32) -> u32 {
        let gen = self
            .slots
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .map_or(0, |r| r.serial as u32 & 0xff);
        (id & WIRE_SLOT_MASK) | (gen << 24)
    }

    /// The live request a wire id from a peer names, if it still is the one it was.
    pub(super) fn own(&self, wire: u32) -> Option<u32> {
        let id = wire & WIRE_SLOT_MASK;
        let r = self.slots.get(id as usize)?.as_ref()?;
        (r.serial as u32 & 0xff == wire >> 24).then_some(id)
    }

    pub(super) fn complete(&mut self, id: u32, r: Result<Status, P2pError>) {
        if let Some(Some(req)) = self.slots.get_mut(id as usize) {
            req.result = Some(r);
        }
    }
}
