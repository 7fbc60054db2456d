//! The shared-memory adapter: frames into a local peer's inbox rings, with the pipelined
//! rendezvous (DATA chunks streamed after CTS) when single copy is off or refused.

use super::wire::{Frame, HDR};
use super::{Kind, Path, Req, State};
use crate::Status;

impl State {
    /// Pushes `dest`'s backlog, then its pipelined streams, as far as its rings allow;
    /// true when some of it must wait for room.
    pub(super) fn flush_shm(&mut self, dest: u32) -> bool {
        let peer = &mut self.peers[dest as usize];
        let Path::Shm(out) = &mut peer.path else {
            return false;
        };
        while let Some(f) = peer.backlog.front() {
            // A whole frame (a short header is shorter than HDR).
            if out.try_send(f, &[]) {
                if let Some(f) = peer.backlog.pop_front() {
                    peer.queued -= f.len();
                }
            } else {
                break;
            }
        }
        if !peer.backlog.is_empty() {
            return true;
        }
        let mut more = false;
        let chunk = out.max_frame() - HDR;
        let me = self.me;
        for slot in self.reqs.slots.iter_mut() {
            let Some(Req {
                kind:
                    Kind::Send {
                        buf,
                        len,
                        dest: d,
                        stream,
                        ..
                    },
                result,
                ..
            }) = slot
            else {
                continue;
            };
            if *d != dest {
                continue;
            }
            let Some((rreq, off)) = stream else { continue };
            while *off < *len {
                let n = chunk.min(*len - *off);
                // SAFETY: the send request keeps its buffer of `len` bytes alive until it
                // completes, and off + n <= len.
                let chunk = unsafe { std::slice::from_raw_parts(buf.add(*off), n) };
                let f = Frame::Data {
                    src: me,
                    rreq: *rreq,
                    off: *off as u64,
                    chunk,
                };
                if !out.try_send(&f.head(), chunk) {
                    break;
                }
                *off += n;
            }
            if *off >= *len {
                *result = Some(Ok(Status {
                    source: dest,
                    tag: 0,
                    count: *len,
                }));
                *stream = None;
            } else {
                more = true;
            }
        }
        more
    }
}
