//! The frame format: the 32-byte header every frame carries, the 13-byte short header of
//! small eager messages, the frame kinds, and what a receive of a message comes to.

use crate::{P2pError, Status};

/// Bytes of the frame header.
pub(crate) const HDR: usize = 32;
pub(crate) const EAGER: u8 = 1;
pub(crate) const RTS: u8 = 2;
pub(crate) const FIN: u8 = 3;
pub(crate) const CTS: u8 = 4;
pub(crate) const DATA: u8 = 5;
/// Rendezvous over verbs: the payload is the sender's registered region (addr, rkey);
/// the receiver RDMA-reads it and answers FIN.
pub(crate) const RTS_RDMA: u8 = 6;
/// Single-copy rendezvous split in two (receiver -> sender): the sender writes the tail
/// of the message straight into the receiver's buffer (`process_vm_writev`) while the
/// receiver reads the head (`process_vm_readv`). aux: the sender's request; payload:
/// the receiver's request (u32), the destination address (u64), the receiver's pid
/// (i32), the source offset (u64) and the byte count (u64).
pub(crate) const CMA_WRITE: u8 = 7;
/// The sender's part of a split rendezvous is done (sender -> receiver). aux: the
/// receiver's request; len: bytes written, or 0 when the kernel refused the write (the
/// receiver then reads them itself); payload: an error message, if the write failed.
pub(crate) const CMA_DONE: u8 = 8;
/// Rendezvous over TCP (sender -> receiver): aux the sender's request, len the message's;
/// no payload. The receiver answers CTS once its buffer is ready for the bulk transfer.
pub(crate) const RTS_TCP: u8 = 10;

/// A collective operation failed at the sender (sender -> every other member of its
/// communicator): ctx and tag name the operation (its schedule's), aux is the job rank plus
/// one of the member whose end failed it (0: another failure), the payload is why (UTF-8:
/// how that member ended, or the sender's error). A receiver fails its schedule of that
/// operation, now or when it starts (`sched::Abort`).
pub(crate) const COLL_ABORT: u8 = 11;

/// A short eager message: `[SHORT, tag u32, ctx u64, payload]`, no source (the transport
/// knows the sender) and no length (the frame's). Small enough (13 bytes of header) that an
/// 8-byte message fits the 24 bytes of a pair line. Shared memory sends it for payloads up
/// to [`SHORT_MAX`], verbs for any frame it sends inline from the send fast path.
pub(crate) const SHORT: u8 = 9;
/// Bytes of the short header.
pub(crate) const SHORT_HDR: usize = 13;
/// Largest payload sent as a short message.
pub(crate) const SHORT_MAX: usize = weft_shm::layout::PAIR_FRAME_MAX - SHORT_HDR;

/// The short header of an eager message.
#[inline]
pub(crate) fn short_header(ctx: u64, tag: u32) -> [u8; SHORT_HDR] {
    let mut b = [0u8; SHORT_HDR];
    b[0] = SHORT;
    b[1..5].copy_from_slice(&tag.to_le_bytes());
    b[5..13].copy_from_slice(&ctx.to_le_bytes());
    b
}

/// The header and payload of a frame from rank `from`: a full header, or a short one
/// (an eager message) completed with `from`. `None` if too short for either.
#[inline]
pub(crate) fn decode_frame(from: u32, frame: &[u8]) -> Option<(Hdr, &[u8])> {
    if frame.first() == Some(&SHORT) {
        let b: &[u8; SHORT_HDR] = frame.get(..SHORT_HDR)?.try_into().ok()?;
        let payload = &frame[SHORT_HDR..];
        return Some((
            Hdr {
                kind: EAGER,
                src: from,
                tag: u32::from_le_bytes([b[1], b[2], b[3], b[4]]),
                ctx: u64::from_le_bytes([b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12]]),
                aux: 0,
                len: payload.len() as u64,
            },
            payload,
        ));
    }
    Some((Hdr::decode(frame)?, frame.get(HDR..)?))
}

/// The frame header: what every message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hdr {
    pub(crate) kind: u8,
    /// The sender's rank in the job.
    pub(crate) src: u32,
    /// The communicator's context id (a PGCID).
    pub(crate) ctx: u64,
    pub(crate) tag: u32,
    /// A request id: the sender's (RTS, RTS_TCP, RTS_RDMA, FIN, CTS, CMA_WRITE) or the
    /// receiver's (DATA, CMA_DONE); for COLL_ABORT the gone member (see there).
    pub(crate) aux: u32,
    /// Message length (EAGER, RTS) or chunk offset (DATA).
    pub(crate) len: u64,
}

impl Hdr {
    #[inline]
    pub(crate) fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..16].copy_from_slice(&self.ctx.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.aux.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    #[inline]
    pub(crate) fn decode(b: &[u8]) -> Option<Hdr> {
        let b: &[u8; HDR] = b.get(..HDR)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Hdr {
            kind: b[0],
            src: u32_at(4),
            ctx: u64_at(8),
            tag: u32_at(16),
            aux: u32_at(20),
            len: u64_at(24),
        })
    }
}

/// The result of a receive of a `size`-byte message into `cap` bytes.
#[inline]
pub(crate) fn outcome(sender: u32, tag: u32, size: usize, cap: usize) -> Result<Status, P2pError> {
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
