//! The fabric's wire format: every frame the engines exchange, as one typed enum
//! ([`Frame`]) with one codec ([`Frame::decode`], [`Frame::head`] + [`Frame::payload`]).
//!
//! A frame is `header ++ payload`. The header is either the full 32-byte little-endian
//! record ([`Hdr`]: kind, sender, context id, tag, an auxiliary word and a length) or, for
//! eager messages only, the 13-byte short header (`[SHORT, tag u32, ctx u64]`: the
//! transport names the sender and the frame's length is the message's). What the `aux`
//! and `len` words of a full header mean depends on the kind; [`Frame::decode`] reads
//! them once, checks every length the kind fixes and that the fields a kind does not
//! use are zero, and hands the handlers named fields. A frame that fails a check is an
//! error ([`WireError`]), never a panic: the codec accepts exactly the encodings it
//! produces (see the property tests below).
//!
//! The bytes, per kind (`aux`/`len`: the header's words; docs/protocol.md has the table):
//!
//! | kind | ctx | aux | len | payload |
//! |---|---|---|---|---|
//! | EAGER 1 | ctx | 0 | payload bytes | the message |
//! | SHORT 9 | (short header) | | | the message |
//! | RTS 2 | ctx | sender's request | message bytes | addr u64, pid i32 |
//! | FIN 3 | 0 | sender's request | 0 | none |
//! | CTS 4 | 0 | sender's request | 0 | receiver's request u32 |
//! | DATA 5 | 0 (tag 0) | receiver's request | chunk offset | the chunk |
//! | RTS_RDMA 6 | ctx | sender's request | message bytes | addr u64, rkey u32 |
//! | CMA_WRITE 7 | 0 | sender's request | 0 | [`CmaWrite`], 52 bytes |
//! | CMA_DONE 8 | 0 | receiver's request | bytes written | serial u64, why (UTF-8) |
//! | RTS_TCP 10 | ctx | sender's request | message bytes | none |
//! | COLL_ABORT 11 | ctx | gone member's rank + 1, or 0 | payload bytes | why (UTF-8) |

/// Bytes of the full frame header.
pub(crate) const HDR: usize = 32;
pub(crate) const EAGER: u8 = 1;
pub(crate) const RTS: u8 = 2;
pub(crate) const FIN: u8 = 3;
pub(crate) const CTS: u8 = 4;
pub(crate) const DATA: u8 = 5;
pub(crate) const RTS_RDMA: u8 = 6;
pub(crate) const CMA_WRITE: u8 = 7;
pub(crate) const CMA_DONE: u8 = 8;
/// A short eager message: `[SHORT, tag u32, ctx u64, payload]`, no source (the transport
/// knows the sender) and no length (the frame's). Small enough (13 bytes of header) that an
/// 8-byte message fits the 24 bytes of a pair line. Shared memory and TCP send it for every
/// eager message that fits a frame (over shared memory: up to 11 bytes in a pair line, larger
/// ones in the peer's fastbox ring or the shared queue, the inbox naming each frame's
/// sender), verbs for any frame it sends inline from the send fast path.
pub(crate) const SHORT: u8 = 9;
pub(crate) const RTS_TCP: u8 = 10;
pub(crate) const COLL_ABORT: u8 = 11;

/// Bytes of the short header.
pub(crate) const SHORT_HDR: usize = 13;
/// Bytes of a CMA_WRITE payload ([`CmaWrite`]).
pub(crate) const CMA_WRITE_LEN: usize = 52;
/// Bytes of the fixed payload of an offer (RTS, RTS_RDMA).
const OFFER_LEN: usize = 12;

/// The short header of an eager message.
#[inline]
pub(crate) fn short_header(ctx: u64, tag: u32) -> [u8; SHORT_HDR] {
    let mut b = [0u8; SHORT_HDR];
    b[0] = SHORT;
    b[1..5].copy_from_slice(&tag.to_le_bytes());
    b[5..13].copy_from_slice(&ctx.to_le_bytes());
    b
}

/// What was wrong with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// Shorter than its header (`need` bytes).
    #[error("{len} bytes: shorter than a {need}-byte header")]
    Short { len: usize, need: usize },
    /// A kind no engine sends.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The header's padding (bytes 1..4) is not zero.
    #[error("frame kind {0}: nonzero header padding")]
    Padding(u8),
    /// A payload of the wrong length for its kind.
    #[error("frame kind {kind}: a {got}-byte payload where {want} is required")]
    Payload { kind: u8, got: usize, want: usize },
    /// A header field the kind does not use (named) is not zero, or a length field
    /// disagrees with the payload.
    #[error("frame kind {kind}: bad header field {field}")]
    Field { kind: u8, field: &'static str },
}

/// The raw full header: the record every non-short frame starts with. Only the codec
/// (and tests that craft hostile bytes) handle it; the engine sees [`Frame`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hdr {
    pub(crate) kind: u8,
    /// The sender's rank in the job.
    pub(crate) src: u32,
    /// The communicator's context id (a PGCID).
    pub(crate) ctx: u64,
    pub(crate) tag: u32,
    /// Per kind (see the module's table).
    pub(crate) aux: u32,
    /// Per kind (see the module's table).
    pub(crate) len: u64,
}

impl Hdr {
    #[cfg(test)]
    pub(crate) fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        self.write(&mut b);
        b
    }

    #[inline]
    fn write(&self, b: &mut [u8; HDR]) {
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..16].copy_from_slice(&self.ctx.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.aux.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
    }

    /// The header at the start of `b` (its padding unchecked), or `None` if too short.
    #[inline]
    pub(crate) fn decode(b: &[u8]) -> Option<Hdr> {
        let b: &[u8; HDR] = b.get(..HDR)?.try_into().ok()?;
        Some(Hdr {
            kind: b[0],
            src: u32_at(b, 4),
            ctx: u64_at(b, 8),
            tag: u32_at(b, 16),
            aux: u32_at(b, 20),
            len: u64_at(b, 24),
        })
    }
}

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline(always)]
fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// Who sent a message and what it matches: what matching reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// The sender's job rank.
    pub(crate) src: u32,
    /// The communicator's context id.
    pub(crate) ctx: u64,
    pub(crate) tag: u32,
}

/// A split single-copy rendezvous request (receiver -> sender): the sender writes bytes
/// `off..off + count` of its message to `dst` in process `pid` (the receiver) if it wins
/// claim (`slot`, `generation`), then answers CMA_DONE naming receive `rreq` of `serial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmaWrite {
    pub(crate) rreq: u32,
    pub(crate) dst: u64,
    pub(crate) pid: i32,
    pub(crate) off: u64,
    pub(crate) count: u64,
    pub(crate) serial: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u64,
}

impl CmaWrite {
    fn encode(&self) -> [u8; CMA_WRITE_LEN] {
        let mut p = [0u8; CMA_WRITE_LEN];
        p[..4].copy_from_slice(&self.rreq.to_le_bytes());
        p[4..12].copy_from_slice(&self.dst.to_le_bytes());
        p[12..16].copy_from_slice(&self.pid.to_le_bytes());
        p[16..24].copy_from_slice(&self.off.to_le_bytes());
        p[24..32].copy_from_slice(&self.count.to_le_bytes());
        p[32..40].copy_from_slice(&self.serial.to_le_bytes());
        p[40..44].copy_from_slice(&self.slot.to_le_bytes());
        p[44..52].copy_from_slice(&self.generation.to_le_bytes());
        p
    }

    fn decode(p: &[u8]) -> CmaWrite {
        CmaWrite {
            rreq: u32_at(p, 0),
            dst: u64_at(p, 4),
            pid: u32_at(p, 12) as i32,
            off: u64_at(p, 16),
            count: u64_at(p, 24),
            serial: u64_at(p, 32),
            slot: u32_at(p, 40),
            generation: u64_at(p, 44),
        }
    }
}

/// One frame, decoded: every kind the engines exchange, with its fields named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// An eager message (full header or short).
    Eager { env: Envelope, data: &'a [u8] },
    /// A rendezvous offer over shared memory: the receiver reads `len` bytes at `addr` of
    /// process `pid` (single copy), or asks for a stream (CTS).
    Rts {
        env: Envelope,
        sreq: u32,
        len: u64,
        addr: u64,
        pid: i32,
    },
    /// A rendezvous offer over verbs: the sender's registered region, RDMA-read.
    RtsRdma {
        env: Envelope,
        sreq: u32,
        len: u64,
        addr: u64,
        rkey: u32,
    },
    /// A rendezvous offer over TCP: answered by CTS, then a bulk transfer.
    RtsTcp { env: Envelope, sreq: u32, len: u64 },
    /// The receiver is done with the buffer of send `sreq`.
    Fin { src: u32, tag: u32, sreq: u32 },
    /// The receiver (its request `rreq`) is ready for send `sreq`'s data.
    Cts {
        src: u32,
        tag: u32,
        sreq: u32,
        rreq: u32,
    },
    /// A chunk of a pipelined rendezvous, at offset `off` of receive `rreq`'s message.
    Data {
        src: u32,
        rreq: u32,
        off: u64,
        chunk: &'a [u8],
    },
    /// The receiver of send `sreq` asks the sender to write part of it (split rendezvous).
    CmaWrite {
        src: u32,
        tag: u32,
        sreq: u32,
        req: CmaWrite,
    },
    /// The sender's part of a split rendezvous is done: `written` bytes (0: not written;
    /// the receiver reads them itself), `why` an error message if the write failed.
    CmaDone {
        src: u32,
        tag: u32,
        rreq: u32,
        written: u64,
        serial: u64,
        why: &'a [u8],
    },
    /// A collective operation (ctx, tag) failed at the sender; `gone`: the member whose
    /// end failed it (job rank), `why`: how (UTF-8).
    CollAbort {
        env: Envelope,
        gone: Option<u32>,
        why: &'a [u8],
    },
}

/// The encoded full header of a frame and its fixed payload (on the stack).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    b: [u8; HDR + CMA_WRITE_LEN],
    n: u8,
}

impl std::ops::Deref for Head {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.b[..self.n as usize]
    }
}

impl<'a> Frame<'a> {
    /// Decodes a frame from rank `from` (the transport's word for the sender: what a short
    /// header's sender is). Full headers carry their own sender, which the caller checks.
    #[inline]
    pub(crate) fn decode(from: u32, b: &'a [u8]) -> Result<Frame<'a>, WireError> {
        if b.first() == Some(&SHORT) {
            let Some(h) = b.get(..SHORT_HDR) else {
                return Err(WireError::Short {
                    len: b.len(),
                    need: SHORT_HDR,
                });
            };
            return Ok(Frame::Eager {
                env: Envelope {
                    src: from,
                    tag: u32_at(h, 1),
                    ctx: u64_at(h, 5),
                },
                data: &b[SHORT_HDR..],
            });
        }
        Self::decode_full(b)
    }

    /// [`Frame::decode`] of a frame with a full header (off the short-message path).
    fn decode_full(b: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let Some(h) = Hdr::decode(b) else {
            return Err(WireError::Short {
                len: b.len(),
                need: HDR,
            });
        };
        let kind = h.kind;
        if b[1..4] != [0, 0, 0] {
            return Err(WireError::Padding(kind));
        }
        let p = &b[HDR..];
        let env = Envelope {
            src: h.src,
            ctx: h.ctx,
            tag: h.tag,
        };
        let payload = |want: usize| {
            if p.len() == want {
                Ok(())
            } else {
                Err(WireError::Payload {
                    kind,
                    got: p.len(),
                    want,
                })
            }
        };
        let zero = |v: u64, field: &'static str| {
            if v == 0 {
                Ok(())
            } else {
                Err(WireError::Field { kind, field })
            }
        };
        // Control frames name no communicator.
        let control = |len_free: bool| {
            zero(h.ctx, "ctx")?;
            if !len_free {
                zero(h.len, "len")?;
            }
            Ok::<(), WireError>(())
        };
        Ok(match kind {
            EAGER => {
                zero(u64::from(h.aux), "aux")?;
                if h.len != p.len() as u64 {
                    return Err(WireError::Field { kind, field: "len" });
                }
                Frame::Eager { env, data: p }
            }
            RTS => {
                payload(OFFER_LEN)?;
                Frame::Rts {
                    env,
                    sreq: h.aux,
                    len: h.len,
                    addr: u64_at(p, 0),
                    pid: u32_at(p, 8) as i32,
                }
            }
            RTS_RDMA => {
                payload(OFFER_LEN)?;
                Frame::RtsRdma {
                    env,
                    sreq: h.aux,
                    len: h.len,
                    addr: u64_at(p, 0),
                    rkey: u32_at(p, 8),
                }
            }
            RTS_TCP => {
                payload(0)?;
                Frame::RtsTcp {
                    env,
                    sreq: h.aux,
                    len: h.len,
                }
            }
            FIN => {
                control(false)?;
                payload(0)?;
                Frame::Fin {
                    src: h.src,
                    tag: h.tag,
                    sreq: h.aux,
                }
            }
            CTS => {
                control(false)?;
                payload(4)?;
                Frame::Cts {
                    src: h.src,
                    tag: h.tag,
                    sreq: h.aux,
                    rreq: u32_at(p, 0),
                }
            }
            DATA => {
                control(true)?;
                zero(u64::from(h.tag), "tag")?;
                Frame::Data {
                    src: h.src,
                    rreq: h.aux,
                    off: h.len,
                    chunk: p,
                }
            }
            CMA_WRITE => {
                control(false)?;
                payload(CMA_WRITE_LEN)?;
                Frame::CmaWrite {
                    src: h.src,
                    tag: h.tag,
                    sreq: h.aux,
                    req: CmaWrite::decode(p),
                }
            }
            CMA_DONE => {
                control(true)?;
                let Some((serial, why)) = p.split_first_chunk::<8>() else {
                    return Err(WireError::Payload {
                        kind,
                        got: p.len(),
                        want: 8,
                    });
                };
                Frame::CmaDone {
                    src: h.src,
                    tag: h.tag,
                    rreq: h.aux,
                    written: h.len,
                    serial: u64::from_le_bytes(*serial),
                    why,
                }
            }
            COLL_ABORT => {
                if h.len != p.len() as u64 {
                    return Err(WireError::Field { kind, field: "len" });
                }
                Frame::CollAbort {
                    env,
                    gone: h.aux.checked_sub(1),
                    why: p,
                }
            }
            k => return Err(WireError::Kind(k)),
        })
    }

    /// The frame's full header and fixed payload: send `head() ++ payload()`.
    #[inline]
    pub(crate) fn head(&self) -> Head {
        let mut out = Head {
            b: [0u8; HDR + CMA_WRITE_LEN],
            n: HDR as u8,
        };
        let ctl = |kind, src, tag, aux, len| Hdr {
            kind,
            src,
            ctx: 0,
            tag,
            aux,
            len,
        };
        let msg = |kind, env: &Envelope, aux, len| Hdr {
            kind,
            src: env.src,
            ctx: env.ctx,
            tag: env.tag,
            aux,
            len,
        };
        let mut fixed = |p: &[u8]| {
            out.b[HDR..HDR + p.len()].copy_from_slice(p);
            out.n = (HDR + p.len()) as u8;
        };
        let offer = |a: u64, b: u32| {
            let mut p = [0u8; OFFER_LEN];
            p[..8].copy_from_slice(&a.to_le_bytes());
            p[8..].copy_from_slice(&b.to_le_bytes());
            p
        };
        let h = match *self {
            Frame::Eager { env, data } => msg(EAGER, &env, 0, data.len() as u64),
            Frame::Rts {
                env,
                sreq,
                len,
                addr,
                pid,
            } => {
                fixed(&offer(addr, pid as u32));
                msg(RTS, &env, sreq, len)
            }
            Frame::RtsRdma {
                env,
                sreq,
                len,
                addr,
                rkey,
            } => {
                fixed(&offer(addr, rkey));
                msg(RTS_RDMA, &env, sreq, len)
            }
            Frame::RtsTcp { env, sreq, len } => msg(RTS_TCP, &env, sreq, len),
            Frame::Fin { src, tag, sreq } => ctl(FIN, src, tag, sreq, 0),
            Frame::Cts {
                src,
                tag,
                sreq,
                rreq,
            } => {
                fixed(&rreq.to_le_bytes());
                ctl(CTS, src, tag, sreq, 0)
            }
            Frame::Data { src, rreq, off, .. } => ctl(DATA, src, 0, rreq, off),
            Frame::CmaWrite {
                src,
                tag,
                sreq,
                req,
            } => {
                fixed(&req.encode());
                ctl(CMA_WRITE, src, tag, sreq, 0)
            }
            Frame::CmaDone {
                src,
                tag,
                rreq,
                written,
                serial,
                ..
            } => {
                fixed(&serial.to_le_bytes());
                ctl(CMA_DONE, src, tag, rreq, written)
            }
            Frame::CollAbort { env, gone, why } => msg(
                COLL_ABORT,
                &env,
                gone.map_or(0, |g| g.saturating_add(1)),
                why.len() as u64,
            ),
        };
        let mut b = [0u8; HDR];
        h.write(&mut b);
        out.b[..HDR].copy_from_slice(&b);
        out
    }

    /// The frame's variable payload (sent after [`Frame::head`]).
    #[inline]
    pub(crate) fn payload(&self) -> &'a [u8] {
        match *self {
            Frame::Eager { data, .. } => data,
            Frame::Data { chunk, .. } => chunk,
            Frame::CmaDone { why, .. } | Frame::CollAbort { why, .. } => why,
            _ => &[],
        }
    }

    /// The whole frame with a full header, in one buffer.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = self.head().to_vec();
        v.extend_from_slice(self.payload());
        v
    }

    /// The sender the frame names (for short eager messages, the transport's).
    #[inline]
    pub(crate) fn src(&self) -> u32 {
        match *self {
            Frame::Eager { env, .. }
            | Frame::Rts { env, .. }
            | Frame::RtsRdma { env, .. }
            | Frame::RtsTcp { env, .. }
            | Frame::CollAbort { env, .. } => env.src,
            Frame::Fin { src, .. }
            | Frame::Cts { src, .. }
            | Frame::Data { src, .. }
            | Frame::CmaWrite { src, .. }
            | Frame::CmaDone { src, .. } => src,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn env() -> impl Strategy<Value = Envelope> {
        (any::<u32>(), any::<u64>(), any::<u32>()).prop_map(|(src, ctx, tag)| Envelope {
            src,
            ctx,
            tag,
        })
    }

    /// A frame of any kind with any fields (its byte slices point into `bytes`).
    fn frame(kind: u8, e: Envelope, w: [u64; 8], bytes: &[u8]) -> Frame<'_> {
        let (a, b, c) = (w[0] as u32, w[1], w[2] as u32);
        match kind % 10 {
            0 => Frame::Eager {
                env: e,
                data: bytes,
            },
            1 => Frame::Rts {
                env: e,
                sreq: a,
                len: b,
                addr: w[3],
                pid: c as i32,
            },
            2 => Frame::RtsRdma {
                env: e,
                sreq: a,
                len: b,
                addr: w[3],
                rkey: c,
            },
            3 => Frame::RtsTcp {
                env: e,
                sreq: a,
                len: b,
            },
            4 => Frame::Fin {
                src: e.src,
                tag: e.tag,
                sreq: a,
            },
            5 => Frame::Cts {
                src: e.src,
                tag: e.tag,
                sreq: a,
                rreq: c,
            },
            6 => Frame::Data {
                src: e.src,
                rreq: a,
                off: b,
                chunk: bytes,
            },
            7 => Frame::CmaWrite {
                src: e.src,
                tag: e.tag,
                sreq: a,
                req: CmaWrite {
                    rreq: c,
                    dst: w[3],
                    pid: w[4] as i32,
                    off: w[5],
                    count: w[6],
                    serial: w[7],
                    slot: w[1] as u32,
                    generation: w[2],
                },
            },
            8 => Frame::CmaDone {
                src: e.src,
                tag: e.tag,
                rreq: a,
                written: b,
                serial: w[3],
                why: bytes,
            },
            _ => Frame::CollAbort {
                env: e,
                // The gone member's rank + 1 fits the word: a rank below u32::MAX.
                gone: (a != 0).then_some(a.min(u32::MAX - 1)),
                why: bytes,
            },
        }
    }

    /// Whether a frame has a length its bytes do not say (its payload ends where the
    /// transport's frame ends): a cut inside that payload is another valid frame.
    fn open_ended(f: &Frame<'_>) -> Option<usize> {
        match f {
            Frame::Data { .. } => Some(HDR),
            Frame::CmaDone { .. } => Some(HDR + 8),
            _ => None,
        }
    }

    proptest! {
        #[test]
        fn headers_round_trip(kind in any::<u8>(), src in any::<u32>(), ctx in any::<u64>(), tag in any::<u32>(), aux in any::<u32>(), len in any::<u64>()) {
            let h = Hdr { kind, src, ctx, tag, aux, len };
            prop_assert_eq!(Hdr::decode(&h.encode()), Some(h));
        }

        /// Every frame decodes to itself; short eager headers too (their sender is the
        /// transport's).
        #[test]
        fn frames_round_trip(kind in any::<u8>(), e in env(), w in any::<[u64; 8]>(), bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let f = frame(kind, e, w, &bytes);
            let b = f.encode();
            prop_assert_eq!(Frame::decode(f.src(), &b), Ok(f));
            if let Frame::Eager { env, data } = f {
                let mut s = short_header(env.ctx, env.tag).to_vec();
                s.extend_from_slice(data);
                prop_assert_eq!(Frame::decode(env.src, &s), Ok(f));
            }
        }

        /// Every cut of a frame is rejected with an error, except inside the payload of
        /// the two kinds whose payload the transport's frame length ends (DATA's chunk,
        /// CMA_DONE's reason), where the cut decodes to exactly the shorter frame.
        #[test]
        fn every_truncation_is_rejected(kind in any::<u8>(), e in env(), w in any::<[u64; 8]>(), bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let f = frame(kind, e, w, &bytes);
            let b = f.encode();
            for cut in 0..b.len() {
                let got = Frame::decode(f.src(), &b[..cut]);
                match open_ended(&f) {
                    Some(fixed) if cut >= fixed => {
                        let g = got.expect("a cut inside an open-ended payload");
                        prop_assert_eq!(g.encode(), b[..cut].to_vec());
                    }
                    _ => prop_assert!(got.is_err(), "a {cut}-byte cut of {f:?} decoded: {got:?}"),
                }
            }
        }

        /// Any corruption (a flipped bit, random bytes anywhere) decodes to an error or to
        /// a frame whose encoding is exactly the corrupted bytes: the codec accepts only
        /// what it writes, never panics, and never reads a field the bytes do not hold.
        #[test]
        fn corruption_is_rejected_or_canonical(kind in any::<u8>(), e in env(), w in any::<[u64; 8]>(), bytes in proptest::collection::vec(any::<u8>(), 0..64), at in any::<usize>(), bit in 0u8..8, junk in proptest::collection::vec(any::<u8>(), 0..120)) {
            let f = frame(kind, e, w, &bytes);
            let mut b = f.encode();
            let i = at % b.len();
            b[i] ^= 1 << bit;
            for case in [&b[..], &junk[..]] {
                if case.first() == Some(&SHORT) {
                    continue;
                }
                if let Ok(g) = Frame::decode(0, case) {
                    prop_assert_eq!(g.encode(), case.to_vec());
                }
            }
        }

        /// A corrupted kind byte, padding byte, or length word of a fixed-size frame is
        /// an error.
        #[test]
        fn corrupted_kind_padding_and_lengths_are_errors(kind in any::<u8>(), e in env(), w in any::<[u64; 8]>(), bytes in proptest::collection::vec(any::<u8>(), 0..64), pad in 1usize..4, v in 1u8..) {
            let f = frame(kind, e, w, &bytes);
            let mut b = f.encode();
            b[pad] = v;
            prop_assert_eq!(Frame::decode(0, &b), Err(WireError::Padding(b[0])));
            let mut b = f.encode();
            b[0] = [0, 12, 13, 200, 255][v as usize % 5];
            prop_assert_eq!(Frame::decode(0, &b), Err(WireError::Kind(b[0])));
            // One byte more than the kind's payload, where the header fixes it.
            let mut b = f.encode();
            b.push(v);
            if open_ended(&f).is_none() {
                prop_assert!(Frame::decode(0, &b).is_err(), "{f:?} with a byte more decoded");
            }
        }
    }

    #[test]
    fn short_headers_do_not_decode() {
        assert_eq!(Hdr::decode(&[0u8; HDR - 1]), None);
        assert_eq!(
            Frame::decode(0, &[SHORT; SHORT_HDR - 1]),
            Err(WireError::Short {
                len: SHORT_HDR - 1,
                need: SHORT_HDR
            })
        );
        assert_eq!(
            Frame::decode(0, &[EAGER; HDR - 1]),
            Err(WireError::Short {
                len: HDR - 1,
                need: HDR
            })
        );
    }

    /// The bytes of a frame are today's: a CTS is the 32-byte header (kind 4, zero
    /// padding, src, ctx 0, tag, aux = sender's request, len 0) and the receiver's request.
    #[test]
    fn the_bytes_are_pinned() {
        let f = Frame::Cts {
            src: 0x0102_0304,
            tag: 5,
            sreq: 6,
            rreq: 0x0a0b_0c0d,
        };
        let mut want = vec![4, 0, 0, 0, 4, 3, 2, 1];
        want.extend([0; 8]);
        want.extend([5, 0, 0, 0, 6, 0, 0, 0]);
        want.extend([0; 8]);
        want.extend([0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(f.encode(), want);
        assert_eq!(
            &short_header(0x1122, 7)[..],
            &[SHORT, 7, 0, 0, 0, 0x22, 0x11, 0, 0, 0, 0, 0, 0]
        );
    }
}
