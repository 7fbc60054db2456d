//! The receive path: reading a connection into its bounded buffer or straight into a
//! bulk transfer's memory, parsing records, and telling a peer's end from a pause.

use super::*;

/// Memory given by `send_bulk` or `expect_bulk`, only touched under their contracts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Landing {
    pub(super) ptr: *mut u8,
    pub(super) cap: usize,
}

/// A bulk transfer being received.
#[derive(Debug)]
pub(super) struct InBulk {
    pub(super) token: u64,
    pub(super) total: u64,
    /// Bytes consumed (landed or discarded).
    pub(super) got: u64,
    pub(super) dest: Option<Landing>,
    /// When its header was parsed (for `bulk_wait` while `dest` is `None`).
    pub(super) since: Instant,
}

/// The receive side of an established connection.
#[derive(Debug, Default)]
pub(super) struct Rx {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) bulk: Option<InBulk>,
}

/// `recv` into raw memory.
///
/// # Safety
/// `ptr..ptr+len` is valid for writes and not otherwise accessed during the call.
pub(super) unsafe fn recv_raw(fd: impl AsFd, ptr: *mut u8, len: usize) -> Result<usize, Errno> {
    // SAFETY: guaranteed by the caller.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    loop {
        match rnet::recv(&fd, &mut *buf, RecvFlags::DONTWAIT) {
            Err(Errno::INTR) => continue,
            r => return r.map(|(n, _)| n),
        }
    }
}

pub(super) fn recv(fd: impl AsFd, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: a live, exclusively borrowed slice.
    unsafe { recv_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// Whether the peer shut down its side (`POLLRDHUP`) though unread data remains: then
/// how many bytes remain unread.
pub(super) fn peer_gone(s: &TcpStream) -> Option<u64> {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = [PollFd::new(s, PollFlags::RDHUP)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(1)
            if fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR) =>
        {
            Some(rustix::io::ioctl_fionread(s).unwrap_or(0))
        }
        _ => None,
    }
}

/// What was being received when the connection ended: "" between records, else
/// " in the middle of ...".
pub(super) fn midway(rx: &Rx) -> String {
    let avail = rx.end - rx.start;
    if let Some(b) = &rx.bulk {
        let got = (b.got + avail as u64).min(b.total);
        return format!(
            " in the middle of a {}-byte bulk transfer ({got} bytes received)",
            b.total
        );
    }
    if avail == 0 {
        return String::new();
    }
    if avail < wire::REC_LEN {
        return format!(
            " in the middle of a record header ({avail} of {} bytes received)",
            wire::REC_LEN
        );
    }
    let w0 = u64::from_le_bytes(rx.buf[rx.start..rx.start + 8].try_into().expect("8"));
    format!(
        " in the middle of a {}-byte frame ({} bytes received)",
        w0 >> 8,
        avail - wire::REC_LEN
    )
}

/// Delivers every whole record buffered in `rx`.
pub(super) fn parse<D: Deliver + ?Sized>(
    rank: u32,
    rx: &mut Rx,
    expects: &mut HashMap<u64, Landing>,
    max_frame: usize,
    d: &mut D,
    n: &mut usize,
) -> Result<(), String> {
    loop {
        if let Some(b) = &mut rx.bulk {
            if b.dest.is_none() {
                b.dest = expects.remove(&b.token);
            }
            let Some(dest) = b.dest else { break };
            let avail = rx.end - rx.start;
            let take = (avail as u64).min(b.total - b.got) as usize;
            if take > 0 {
                let cap = dest.cap as u64;
                if b.got < cap {
                    let c = (take as u64).min(cap - b.got) as usize;
                    // SAFETY: `expect_bulk`'s contract: dest.ptr..+cap is ours to write until
                    // reported; b.got + c <= cap. The source is our own buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            rx.buf.as_ptr().add(rx.start),
                            dest.ptr.add(b.got as usize),
                            c,
                        )
                    };
                }
                b.got += take as u64;
                rx.start += take;
            }
            if b.got < b.total {
                break;
            }
            d.bulk_received(rank, b.token, b.total as usize);
            *n += 1;
            rx.bulk = None;
            continue;
        }
        let avail = rx.end - rx.start;
        if avail < wire::REC_LEN {
            break;
        }
        let hdr: &[u8; wire::REC_LEN] = rx.buf[rx.start..rx.start + wire::REC_LEN]
            .try_into()
            .expect("16");
        match wire::parse_rec(hdr, max_frame) {
            Err(e) => return Err(format!("protocol error from rank {rank}: {e}")),
            Ok(Rec::Frame(len)) => {
                if avail < wire::REC_LEN + len {
                    break;
                }
                let a = rx.start + wire::REC_LEN;
                d.frame(rank, &rx.buf[a..a + len]);
                *n += 1;
                rx.start = a + len;
            }
            Ok(Rec::Bulk { token, len }) => {
                rx.start += wire::REC_LEN;
                rx.bulk = Some(InBulk {
                    token,
                    total: len,
                    got: 0,
                    dest: expects.remove(&token),
                    since: Instant::now(),
                });
            }
        }
    }
    if rx.start == rx.end {
        rx.start = 0;
        rx.end = 0;
    }
    Ok(())
}

/// Reads into the receive buffer per [`read_link`] call, at most.
const READ_BUDGET: u32 = 8;

/// Reads what the socket has and delivers whole records; `Err` is the failure reason.
/// After a short read it stops (the socket is drained: saves a `recv` per message) unless
/// a record is incomplete or `hup` (epoll saw a hang-up: read on to the end of stream).
pub(super) fn read_link<D: Deliver + ?Sized>(
    p: &mut Peer,
    max_frame: usize,
    d: &mut D,
    n: &mut usize,
    hup: bool,
) -> Result<(), String> {
    // Buffer-fulls read per call: a peer that keeps the socket full cannot hold one poll
    // (and what the caller keeps of its frames) for ever; level-triggered readiness, or
    // the next direct read, picks the rest up.
    let mut fills = 0u32;
    loop {
        parse(p.rank, &mut p.rx, &mut p.expects, max_frame, d, n)?;
        if fills >= READ_BUDGET {
            return Ok(());
        }
        let Some(link) = &p.link else { return Ok(()) };
        let rx = &mut p.rx;
        // Straight into the landing memory when nothing is buffered.
        let direct = match &rx.bulk {
            Some(InBulk {
                dest: Some(dest),
                got,
                total,
                ..
            }) if rx.start == rx.end && *got < (*total).min(dest.cap as u64) => {
                let want = ((*total).min(dest.cap as u64) - got) as usize;
                // SAFETY: dest.ptr + got is inside the landing memory (got < cap).
                Some((unsafe { dest.ptr.add(*got as usize) }, want))
            }
            _ => None,
        };
        let (res, want) = if let Some((ptr, want)) = direct {
            // SAFETY: `expect_bulk`'s contract: ptr..ptr+want lies inside the landing memory,
            // which only we access until the bulk is reported.
            (unsafe { recv_raw(&link.stream, ptr, want) }, want)
        } else {
            if rx.start > 0 && rx.end == rx.buf.len() {
                rx.buf.copy_within(rx.start..rx.end, 0);
                rx.end -= rx.start;
                rx.start = 0;
            }
            if rx.end == rx.buf.len() {
                // Full of a bulk transfer nobody expects yet: leave the rest in the socket,
                // but notice a peer that has gone (one poll(2) while stalled like this).
                return match peer_gone(&link.stream) {
                    Some(inq) => {
                        let b = rx.bulk.as_ref().expect("only a bulk stalls");
                        let got = (b.got + (rx.end - rx.start) as u64 + inq).min(b.total);
                        Err(format!(
                            "rank {} closed the connection in the middle of a {}-byte bulk transfer \
                             ({got} bytes received)",
                            p.rank, b.total
                        ))
                    }
                    None => Ok(()),
                };
            }
            let want = rx.buf.len() - rx.end;
            (recv(&link.stream, &mut rx.buf[rx.end..]), want)
        };
        match res {
            Ok(0) => {
                return Err(format!(
                    "rank {} closed the connection{}",
                    p.rank,
                    midway(&p.rx)
                ))
            }
            Ok(k) => {
                if direct.is_some() {
                    let b = rx.bulk.as_mut().expect("direct implies a bulk");
                    b.got += k as u64;
                } else {
                    rx.end += k;
                    fills += 1;
                }
                if k < want {
                    // Drained: deliver, and stop without another recv unless a record is
                    // incomplete (then the next recv shows at once whether the peer is gone).
                    parse(p.rank, &mut p.rx, &mut p.expects, max_frame, d, n)?;
                    if !hup && p.rx.start == p.rx.end && p.rx.bulk.is_none() {
                        return Ok(());
                    }
                }
            }
            Err(Errno::AGAIN) => return Ok(()),
            Err(Errno::CONNRESET) => {
                return Err(format!(
                    "the connection with rank {} was reset{}",
                    p.rank,
                    midway(&p.rx)
                ))
            }
            Err(e) => {
                return Err(format!(
                    "reading from rank {} failed: {}",
                    p.rank,
                    errno_io(e)
                ))
            }
        }
    }
}
