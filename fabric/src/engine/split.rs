//! The split single-copy rendezvous: the receiver reads the head of a large message from
//! the sender's memory while the sender writes the tail into the receiver's
//! (`process_vm_readv` / `process_vm_writev`), each half of the copy on its own core.
//!
//! Who copies the tail is settled by a claim word in the receiver's inbox segment
//! (`weft_shm::ClaimTable`): the sender takes it when it gets to the request, or the
//! receiver does when the sender is late ([`SPLIT_TAKEOVER`]) or reported gone, and then
//! reads the tail itself. So a split receive never waits on a sender that does not
//! progress, and a late sender never writes into a buffer already handed back.

use std::time::{Duration, Instant};

use weft_shm::Claim;

use super::copy::CopyWhat;
use super::matching::outcome;
use super::rendezvous::Offer;
use super::wire::{CmaWrite, Frame};
use super::{Engine, Kind, Path, Req, State};
use crate::P2pError;

/// The single-copy rendezvous' own state: the claim words of this process's inbox, the
/// split receives in progress (their tails may need taking over), and whether CMA's
/// refusal was told.
pub(super) struct Cma {
    pub(super) claims: Option<weft_shm::ClaimTable>,
    pub(super) splits: Vec<u32>,
    pub(super) warned: bool,
}

impl Cma {
    pub(super) fn new(claims: Option<weft_shm::ClaimTable>) -> Cma {
        Cma {
            claims,
            splits: Vec::new(),
            warned: false,
        }
    }
}

/// A single-copy rendezvous split between the receiver (head) and the sender (tail).
#[derive(Debug)]
pub(super) struct Split {
    /// What the sender offered (its request, buffer and pid: to read the tail if the
    /// sender may not write it).
    pub(super) offer: Offer,
    pub(super) head: usize,
    pub(super) tail: usize,
    /// The first failure; the receive completes with it once both parts are over.
    pub(super) err: Option<String>,
    /// Who copies the tail: the claim word in this process's inbox.
    pub(super) claim: Claim,
    /// When the sender was asked (the receiver takes the tail over after
    /// [`SPLIT_TAKEOVER`]).
    pub(super) started: Instant,
    /// The receiver took the tail over (an answer from the sender is then ignored).
    pub(super) taken: bool,
}

/// How long a split receive waits for its sender to take its part before the receiver
/// copies it itself.
pub(super) const SPLIT_TAKEOVER: Duration = Duration::from_millis(1);

impl Engine {
    /// Whether split receive `id` (if it is one) may fail now that its sender is
    /// reported gone. The receiver first takes the tail over (it then completes, or fails
    /// on its own read); if the sender took it first, it is writing now, and the receive
    /// may fail only once the sender's process is dead.
    pub(super) fn split_may_fail(&mut self, id: u32) -> bool {
        let Some(Some(Req {
            kind: Kind::Recv {
                split: Some(sp), ..
            },
            result: None,
            ..
        })) = self.st.reqs.slots.get(id as usize)
        else {
            return true;
        };
        let pid = sp.offer.pid;
        if !sp.taken && self.st.split_takeover(id) {
            // Completed (or failed) by the receiver's own copy.
            return false;
        }
        match rustix::process::Pid::from_raw(pid) {
            Some(pid) => rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH),
            None => true,
        }
    }

    pub(super) fn is_recv(&self, id: u32) -> bool {
        matches!(
            self.st.reqs.slots.get(id as usize),
            Some(Some(Req {
                kind: Kind::Recv { .. },
                ..
            }))
        )
    }
}

impl State {
    /// A split single-copy rendezvous (receiver side): asks the sender to write the
    /// tail of the `n` bytes into `buf` while this process reads the head. The receive
    /// completes, and FIN releases the sender's buffer, when both parts are in
    /// (`split_progress`).
    pub(super) fn cma_split(&mut self, id: u32, o: Offer, buf: *mut u8, n: usize, claim: Claim) {
        let (src, tag, sreq, len) = (o.src, o.tag, o.sreq, o.len);
        let head = (n / 2) & !4095;
        let tail = n - head;
        let serial = self
            .reqs
            .slots
            .get(id as usize)
            .and_then(|r| r.as_ref())
            .map_or(0, |r| r.serial);
        let req = CmaWrite {
            rreq: self.wire_id(id),
            dst: buf as u64 + head as u64,
            pid: self.pid,
            off: head as u64,
            count: tail as u64,
            serial,
            slot: claim.slot,
            generation: claim.generation,
        };
        let me = self.me;
        self.send_frame(
            src,
            &Frame::CmaWrite {
                src: me,
                tag,
                sreq,
                req,
            },
        );
        if let Some(Some(Req {
            kind: Kind::Recv { pipe, split, .. },
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        {
            // Counted in message bytes: what truncation drops is done already.
            *pipe = Some((src, tag, len, len - n));
            *split = Some(Box::new(Split {
                offer: o,
                head,
                tail,
                err: None,
                claim,
                started: Instant::now(),
                taken: false,
            }));
            self.cma.splits.push(id);
        }
        // The head: bytes 0..head of this receive's buffer (cap >= n >= head), which the
        // sender does not write; copied without the engine lock.
        let what = CopyWhat::Read { from: src };
        self.queue_copy(id, what, o.pid, o.addr as usize, buf, head);
    }

    /// Records the first error of a split receive (it completes with it).
    pub(super) fn split_error(&mut self, id: u32, reason: String) {
        if let Some(Some(Req {
            kind: Kind::Recv {
                split: Some(sp), ..
            },
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        {
            sp.err.get_or_insert(reason);
        }
    }

    /// Adds `bytes` (done, or failed for good) to split receive `id`; when every byte is
    /// accounted for, tells the sender (FIN) and completes the receive.
    pub(super) fn split_progress(&mut self, id: u32, from: u32, bytes: usize) {
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    cap,
                    pipe: Some((src, tag, total, got)),
                    split,
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        if *src != from || split.is_none() {
            return;
        }
        *got += bytes;
        if *got < *total {
            return;
        }
        let (src, tag, total, cap) = (*src, *tag, *total, *cap);
        let Some(sp) = split.take() else { return };
        self.split_over(id, sp.claim);
        self.fin(src, tag, sp.offer.sreq);
        let r = match sp.err {
            Some(reason) => Err(P2pError::Transport { rank: src, reason }),
            None => outcome(src, tag, total, cap),
        };
        self.complete(id, r);
    }

    /// Split receive `id` is over (its claim word goes back).
    pub(super) fn split_over(&mut self, id: u32, claim: Claim) {
        if let Some(c) = &mut self.cma.claims {
            c.close(claim);
        }
        self.cma.splits.retain(|&s| s != id);
    }

    /// The receiver copies the tail of split receive `id` itself if the sender has not
    /// taken it: true when it did (the receive then completes, or fails with the read's
    /// error), false when the sender took it first (its answer completes the receive).
    pub(super) fn split_takeover(&mut self, id: u32) -> bool {
        let Some(Some(Req {
            kind: Kind::Recv {
                split: Some(sp), ..
            },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return false;
        };
        if sp.taken || !self.cma.claims.as_ref().is_some_and(|c| c.take(sp.claim)) {
            return false;
        }
        self.read_tail(id);
        true
    }

    /// The receiver reads the tail of split receive `id` from the sender's buffer and
    /// accounts for it (the sender will not write it: the claim is the receiver's, or the
    /// sender said it did not write).
    fn read_tail(&mut self, id: u32) {
        let Some(Some(Req {
            kind:
                Kind::Recv {
                    buf,
                    pipe: Some((src, ..)),
                    split: Some(sp),
                    ..
                },
            result: None,
            ..
        })) = self.reqs.slots.get_mut(id as usize)
        else {
            return;
        };
        sp.taken = true;
        let (buf, src, head, tail, pid, addr) =
            (*buf, *src, sp.head, sp.tail, sp.offer.pid, sp.offer.addr);
        // Bytes head..head+tail of this receive's buffer (cap >= n = head + tail), which
        // the sender does not write (see above); its buffer is still offered (no FIN yet).
        // SAFETY: head < n <= cap, inside the receive's buffer.
        let local = unsafe { buf.add(head) };
        let what = CopyWhat::Read { from: src };
        self.queue_copy(id, what, pid, addr as usize + head, local, tail);
    }

    /// Takes over the tails of split receives whose senders have not taken them within
    /// [`SPLIT_TAKEOVER`] (busy outside any call, stopped, gone).
    #[cold]
    pub(super) fn check_splits(&mut self) {
        let late: Vec<u32> = self
            .cma
            .splits
            .iter()
            .copied()
            .filter(|&id| match self.reqs.slots.get(id as usize) {
                Some(Some(Req {
                    kind:
                        Kind::Recv {
                            split: Some(sp), ..
                        },
                    ..
                })) => !sp.taken && sp.started.elapsed() >= SPLIT_TAKEOVER,
                _ => false,
            })
            .collect();
        for id in late {
            self.split_takeover(id);
        }
    }

    /// The sender side of a split rendezvous (CMA_WRITE from `from` for send `sreq`):
    /// writes its part into the receiver, then says so (CMA_DONE: the byte count, 0 if
    /// the kernel refused, or an error).
    pub(super) fn on_cma_write(&mut self, from: u32, tag: u32, sreq: u32, w: CmaWrite) {
        let serial = w.serial.to_le_bytes();
        let (rreq, dst, pid, off, count) = (w.rreq, w.dst, w.pid, w.off as usize, w.count as usize);
        let send = match self
            .own(sreq)
            .and_then(|id| self.reqs.slots.get(id as usize))
        {
            Some(Some(Req {
                kind: Kind::Send { buf, len, dest, .. },
                result: None,
                ..
            })) if *dest == from => Some((*buf, *len)),
            _ => None,
        };
        let Some((buf, _)) =
            send.filter(|&(_, len)| off.checked_add(count).is_some_and(|e| e <= len))
        else {
            let why = format!(
                "rank {from} asked rank {} to write bytes {off}..{} of send {sreq}, which it does not have",
                self.me,
                off.saturating_add(count),
            );
            tracing::error!("{why}");
            return self.cma_done(from, tag, rreq, serial, 0, &why);
        };
        // Write only into the process that owns the inbox we reach this rank through:
        // a wrong pid (a bug, or a pid reused after the receiver died) is refused.
        let owner = match &self.peers.get(from as usize).map(|p| &p.path) {
            Some(Path::Shm(o)) => Some(o.receiver_pid()),
            _ => None,
        };
        if owner != Some(pid as u32) {
            let why = format!(
                "rank {from} asked for a single-copy write into pid {pid}, but its inbox belongs to {}",
                owner.map_or_else(|| "no known process".to_string(), |p| format!("pid {p}"))
            );
            tracing::error!("{why}");
            return self.cma_done(from, tag, rreq, serial, 0, &why);
        }
        // Write only with the claim: if the receiver took the tail over, it copies it.
        let (slot, generation) = (w.slot, w.generation);
        let claimed = match &self.peers.get(from as usize).map(|p| &p.path) {
            Some(Path::Shm(o)) => o.claim_for_sender(slot, generation),
            _ => false,
        };
        if !claimed {
            return self.cma_done(from, tag, rreq, serial, 0, "");
        }
        // The send request is live (its FIN, which the receiver sends only after this
        // part, has not come), so its buffer is borrowed; off + count <= len. Written
        // without the engine lock; CMA_DONE follows.
        let Some(sid) = self.own(sreq) else { return };
        // SAFETY: off + count <= len: inside the send's buffer.
        let local = unsafe { buf.add(off) }.cast_mut();
        let what = CopyWhat::Write {
            to: from,
            tag,
            rreq,
            rserial: serial,
        };
        self.queue_copy(sid, what, pid, dst as usize, local, count);
    }

    /// CMA_DONE to `to`: the receive `rreq` (with its serial), bytes written, and an
    /// error message if the write failed.
    pub(super) fn cma_done(
        &mut self,
        to: u32,
        tag: u32,
        rreq: u32,
        serial: [u8; 8],
        written: u64,
        why: &str,
    ) {
        let f = Frame::CmaDone {
            src: self.me,
            tag,
            rreq,
            written,
            serial: u64::from_le_bytes(serial),
            why: why.as_bytes(),
        };
        self.send_frame(to, &f);
    }

    /// The sender's part of a split rendezvous is done (`written` bytes, 0: not
    /// written), refused or failed (`why`): CMA_DONE from `from` for receive `rreq`.
    pub(super) fn on_cma_done(
        &mut self,
        from: u32,
        rreq: u32,
        written: u64,
        serial: u64,
        why: &[u8],
    ) {
        let Some(id) = self.own(rreq) else {
            return;
        };
        // Only the live split receive this answer is for: ids are reused, serials not.
        let tail = match self.reqs.slots.get(id as usize) {
            Some(Some(Req {
                kind:
                    Kind::Recv {
                        pipe: Some((src, ..)),
                        split: Some(sp),
                        ..
                    },
                result: None,
                serial: live,
            })) if *src == from && *live == serial => {
                if sp.taken {
                    // The receiver copied the tail itself: this answer says the sender
                    // found the claim taken.
                    return;
                }
                sp.tail
            }
            _ => return,
        };
        if !why.is_empty() {
            self.split_error(id, String::from_utf8_lossy(why).into_owned());
        } else if written == 0 {
            // Not written (the claim was not the sender's, or the kernel refused the
            // write): the sender will not write, and its buffer is still ours to read
            // (no FIN yet).
            if !self.split_takeover(id) {
                self.read_tail(id);
            }
            return;
        }
        self.split_progress(id, from, tail);
    }
}
