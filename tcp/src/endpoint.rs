//! The endpoint: a listener, one epoll instance, and per peer one connection with an
//! ordered output queue (frames and bulk transfers) and a bounded receive buffer.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::{self as rnet, RecvFlags, SendAncillaryBuffer, SendFlags};

use crate::wire::{self, Card, Hello, HelloError, Rec, Reply};
use crate::{Config, Error};

/// Epoll data of the listener.
const LISTENER: u64 = u64::MAX;
/// Bit of the epoll data marking a socket in handshake (else an established connection).
const SHAKE_BIT: u64 = 1 << 63;
/// Epoll events fetched per `epoll_wait`.
const EVENTS: usize = 64;
/// Slices per `sendmsg`.
const MAX_IOV: usize = 64;
/// In direct-read mode, ask epoll (for accepts and hang-ups) every this many polls.
const EPOLL_EVERY: u64 = 64;
/// Look at the clock for timeouts every this many polls...
const CLOCK_EVERY: u64 = 64;
/// ...and check timeouts when this much time passed since the last check.
const TIMEOUT_TICK: Duration = Duration::from_millis(50);
/// Receive buffer bytes beyond one largest record (lets small records batch in one read).
const RX_SLACK: usize = 64 << 10;
/// Queued frames are appended to the last queued buffer while it is smaller than this.
const COALESCE: usize = 64 << 10;
/// Accepted connections still in handshake beyond this many are closed at once.
const MAX_SHAKES: usize = 4096;
/// Connections accepted per poll at most.
const ACCEPTS_PER_POLL: usize = 64;

/// A connection to one peer (the same id whichever side made the connection, and across
/// the simultaneous-connect tie-break).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(u32);

/// What [`Endpoint::poll`] hands over.
pub trait Deliver {
    /// Frame `frame` (header and payload as given to `try_send`) arrived from `peer`
    /// (valid for the call only).
    fn frame(&mut self, peer: u32, frame: &[u8]);
    /// The bulk transfer `token` from `peer` is complete: `len` is its full length (bytes
    /// past the `cap` given to `expect_bulk` were discarded).
    fn bulk_received(&mut self, peer: u32, token: u64, len: usize);
    /// The bulk transfer `token` to `peer` is written to the socket: its memory is free.
    fn bulk_sent(&mut self, peer: u32, token: u64);
    /// The connection to `peer` failed (reset, EOF, connect refused, handshake refused,
    /// protocol error): reported once; its queued frames and bulks are dropped, expected
    /// bulks abandoned. `reason` says what happened in words.
    fn failed(&mut self, peer: u32, reason: &str);
}

/// Counters of an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Established connections.
    pub connections: usize,
    /// Connections accepted (handshake answered with ACK).
    pub accepted: u64,
    /// Incoming connections refused (strangers, bad handshakes, timeouts).
    pub refused: u64,
    /// Our connections given up in a simultaneous connect (the peer's won).
    pub superseded: u64,
    /// Connection failures reported.
    pub failures: u64,
}

/// Memory given by `send_bulk` or `expect_bulk`, only touched under their contracts.
#[derive(Debug, Clone, Copy)]
struct Landing {
    ptr: *mut u8,
    cap: usize,
}

#[derive(Debug)]
enum Out {
    /// Copied bytes (record headers and frames); `off` bytes already written.
    Bytes { buf: Vec<u8>, off: usize },
    /// A bulk transfer: its record header, then `len` bytes at `ptr`; `off` counts both.
    Bulk {
        hdr: [u8; wire::REC_LEN],
        token: u64,
        ptr: *const u8,
        len: usize,
        off: usize,
    },
}

impl Out {
    fn unsent(&self) -> usize {
        match self {
            Out::Bytes { buf, off } => buf.len() - off,
            Out::Bulk { len, off, .. } => wire::REC_LEN + len - off,
        }
    }
}

/// A bulk transfer being received.
#[derive(Debug)]
struct InBulk {
    token: u64,
    total: u64,
    /// Bytes consumed (landed or discarded).
    got: u64,
    dest: Option<Landing>,
    /// When its header was parsed (for `bulk_wait` while `dest` is `None`).
    since: Instant,
}

/// The receive side of an established connection.
#[derive(Debug, Default)]
struct Rx {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    bulk: Option<InBulk>,
}

#[derive(Debug)]
struct Link {
    stream: TcpStream,
    addr: SocketAddr,
    epoch: u32,
    /// EPOLLOUT registered.
    pollout: bool,
    /// Writing failed (why, and when): what the peer sent before it closed is still read
    /// and delivered, then the failure is reported (after [`WRITE_DEAD_WAIT`] at most).
    write_dead: Option<(String, Instant)>,
}

#[derive(Debug)]
struct Peer {
    rank: u32,
    link: Option<Link>,
    /// Our connection to the peer while in handshake (index into `shakes`).
    outgoing: Option<usize>,
    /// Our connection lost the tie-break at this time: the peer's is coming.
    lost_since: Option<Instant>,
    /// Why the last connection ended (for errors of later calls).
    down: Option<String>,
    /// Given up on for good ([`Endpoint::forbid`]): no new connection either way.
    forbidden: Option<String>,
    out: VecDeque<Out>,
    /// Unsent bytes of `Out::Bytes` entries (what `queue_bytes` bounds).
    out_copied: usize,
    /// Unsent bytes of all entries.
    out_total: usize,
    rx: Rx,
    expects: HashMap<u64, Landing>,
    epoch: u32,
}

impl Peer {
    fn alive(&self) -> bool {
        self.link.is_some() || self.outgoing.is_some() || self.lost_since.is_some()
    }

    fn down_error(&self) -> Error {
        Error::ConnectionFailed {
            peer: self.rank,
            reason: self
                .down
                .clone()
                .unwrap_or_else(|| "never connected".into()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ours: the non-blocking connect is under way.
    Connecting,
    /// Ours: writing the HELLO (`off` bytes written), then reading the reply.
    Hello { off: usize },
    /// Theirs: reading their HELLO.
    Accepted,
}

#[derive(Debug)]
struct Shake {
    stream: TcpStream,
    addr: SocketAddr,
    gen: u32,
    since: Instant,
    phase: Phase,
    /// Peer index (ours only).
    peer: Option<usize>,
    buf: [u8; wire::REPLY_LEN + wire::MAX_REASON],
    got: usize,
}

/// One process's TCP endpoint (see the crate docs for the protocol).
pub struct Endpoint {
    cfg: Config,
    listener: TcpListener,
    local: SocketAddr,
    epoll: OwnedFd,
    events: Vec<epoll::Event>,
    peers: Vec<Peer>,
    by_rank: HashMap<u32, usize>,
    shakes: Vec<Option<Shake>>,
    free_shakes: Vec<usize>,
    n_shakes: usize,
    shake_gen: u32,
    /// Peers with an established connection.
    live: Vec<usize>,
    /// Peers with EPOLLOUT registered.
    writers: usize,
    /// Failures to report at the next poll.
    failures: Vec<(u32, String)>,
    /// Bulk sends written, to report at the next poll.
    sent: Vec<(u32, u64)>,
    polls: u64,
    last_tick: Instant,
    stats: Stats,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("cfg", &self.cfg)
            .field("local", &self.local)
            .field("peers", &self.peers.len())
            .field("established", &self.live.len())
            .field("in_handshake", &self.n_shakes)
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers inside (bulk memory) are only dereferenced under the contracts
// of `send_bulk` and `expect_bulk`, which the caller upholds from whichever thread owns the
// endpoint; nothing has thread affinity.
unsafe impl Send for Endpoint {}

fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn link_data(pi: usize, epoch: u32) -> epoll::EventData {
    epoll::EventData::new_u64((epoch as u64) << 32 | pi as u64)
}

fn shake_data(si: usize, gen: u32) -> epoll::EventData {
    epoll::EventData::new_u64(SHAKE_BIT | ((gen as u64) << 32) | si as u64)
}

fn send(fd: impl AsFd, iov: &[IoSlice<'_>]) -> Result<usize, Errno> {
    loop {
        match rnet::sendmsg(
            &fd,
            iov,
            &mut SendAncillaryBuffer::default(),
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// `recv` into raw memory.
///
/// # Safety
/// `ptr..ptr+len` is valid for writes and not otherwise accessed during the call.
unsafe fn recv_raw(fd: impl AsFd, ptr: *mut u8, len: usize) -> Result<usize, Errno> {
    // SAFETY: guaranteed by the caller.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    loop {
        match rnet::recv(&fd, &mut *buf, RecvFlags::DONTWAIT) {
            Err(Errno::INTR) => continue,
            r => return r.map(|(n, _)| n),
        }
    }
}

fn recv(fd: impl AsFd, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: a live, exclusively borrowed slice.
    unsafe { recv_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

impl Endpoint {
    /// Binds a non-blocking listener on `cfg.addr` (kernel-chosen port) and creates the
    /// epoll instance.
    pub fn open(cfg: Config) -> Result<Endpoint, Error> {
        if cfg.addr.is_unspecified() {
            return Err(Error::Config {
                name: "WEFT_TCP_ADDR",
                value: cfg.addr.to_string(),
                reason: "an unspecified address cannot be published in a card".into(),
            });
        }
        if cfg.max_frame > u32::MAX as usize {
            return Err(Error::Config {
                name: "WEFT_TCP_MAX_FRAME",
                value: cfg.max_frame.to_string(),
                reason: "must fit in 32 bits".into(),
            });
        }
        let io = |what: String| move |source| Error::Io { what, source };
        let listener = TcpListener::bind(SocketAddr::new(cfg.addr, 0))
            .map_err(io(format!("binding a TCP listener to {}", cfg.addr)))?;
        listener
            .set_nonblocking(true)
            .map_err(io("making the TCP listener non-blocking".into()))?;
        let local = listener
            .local_addr()
            .map_err(io("getsockname of the TCP listener".into()))?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| io("epoll_create".into())(errno_io(e)))?;
        epoll::add(
            &ep,
            &listener,
            epoll::EventData::new_u64(LISTENER),
            epoll::EventFlags::IN,
        )
        .map_err(|e| io("adding the TCP listener to epoll".into())(errno_io(e)))?;
        tracing::debug!(rank = cfg.me, %local, "TCP endpoint listening");
        Ok(Endpoint {
            cfg,
            listener,
            local,
            epoll: ep,
            events: Vec::with_capacity(EVENTS),
            peers: Vec::new(),
            by_rank: HashMap::new(),
            shakes: Vec::new(),
            free_shakes: Vec::new(),
            n_shakes: 0,
            shake_gen: 0,
            live: Vec::new(),
            writers: 0,
            failures: Vec::new(),
            sent: Vec::new(),
            polls: 0,
            last_tick: Instant::now(),
            stats: Stats::default(),
        })
    }

    /// How to reach this endpoint: versioned bytes carrying its address, port and rank
    /// (see [`Card`]).
    pub fn card(&self) -> Vec<u8> {
        Card {
            rank: self.cfg.me,
            addr: self.local,
        }
        .encode()
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        Stats {
            connections: self.live.len(),
            ..self.stats
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The connection to `peer`, made by either side (established or not).
    pub fn conn_of(&self, peer: u32) -> Option<ConnId> {
        self.by_rank.get(&peer).map(|&i| ConnId(i as u32))
    }

    /// The peer of `conn`.
    pub fn peer_of(&self, conn: ConnId) -> Option<u32> {
        self.peers.get(conn.0 as usize).map(|p| p.rank)
    }

    /// The handshake of `conn` is done (records flow).
    pub fn is_ready(&self, conn: ConnId) -> bool {
        self.peers
            .get(conn.0 as usize)
            .is_some_and(|p| p.link.is_some())
    }

    /// Bytes of `conn` waiting to be written (frames and bulk transfers).
    pub fn queued(&self, conn: ConnId) -> usize {
        self.peers.get(conn.0 as usize).map_or(0, |p| p.out_total)
    }

    /// Nothing queued to write and no bulk transfer expected or in flight (a scan of the
    /// peers: no system call).
    pub fn idle(&self) -> bool {
        self.peers
            .iter()
            .all(|p| p.out.is_empty() && p.expects.is_empty() && p.rx.bulk.is_none())
    }

    fn peer_index(&mut self, rank: u32) -> usize {
        if let Some(&i) = self.by_rank.get(&rank) {
            return i;
        }
        let i = self.peers.len();
        self.peers.push(Peer {
            rank,
            link: None,
            outgoing: None,
            lost_since: None,
            forbidden: None,
            down: None,
            out: VecDeque::new(),
            out_copied: 0,
            out_total: 0,
            rx: Rx::default(),
            expects: HashMap::new(),
            epoch: 0,
        });
        self.by_rank.insert(rank, i);
        i
    }

    fn conn(&self, conn: ConnId) -> Result<usize, Error> {
        let i = conn.0 as usize;
        if i < self.peers.len() {
            Ok(i)
        } else {
            Err(Error::UnknownConn(conn))
        }
    }

    /// Starts a non-blocking connection to `peer` described by `card` and returns at once
    /// (the handshake runs in [`Endpoint::poll`]). Returns the existing connection if
    /// there is one. A malformed card, another rank's card or a local socket error is an
    /// error; a refused connection is reported through [`Deliver::failed`].
    pub fn connect(&mut self, peer: u32, card: &[u8]) -> Result<ConnId, Error> {
        let c = Card::decode(card)?;
        if c.rank != peer {
            return Err(Error::CardRank {
                expected: peer,
                found: c.rank,
            });
        }
        if peer == self.cfg.me {
            return Err(Error::SelfConnect { me: peer });
        }
        let pi = self.peer_index(peer);
        if let Some(why) = &self.peers[pi].forbidden {
            return Err(Error::ConnectionFailed {
                peer,
                reason: format!("given up on: {why}"),
            });
        }
        if self.peers[pi].alive() {
            return Ok(ConnId(pi as u32));
        }
        let io = |what: &str| {
            let what = format!("{what} (connecting to rank {peer} at {})", c.addr);
            move |e: Errno| Error::Io {
                what,
                source: errno_io(e),
            }
        };
        let family = if c.addr.is_ipv4() {
            rnet::AddressFamily::INET
        } else {
            rnet::AddressFamily::INET6
        };
        let fd = rnet::socket_with(
            family,
            rnet::SocketType::STREAM,
            rnet::SocketFlags::NONBLOCK | rnet::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(io("socket"))?;
        self.tune(&fd).map_err(io("setsockopt"))?;
        let stream = TcpStream::from(fd);
        self.peers[pi].down = None;
        match rnet::connect(&stream, &c.addr) {
            Ok(()) | Err(Errno::INPROGRESS) => {}
            Err(e) => {
                let reason = format!(
                    "could not connect to rank {peer} at {}: {}",
                    c.addr,
                    errno_io(e)
                );
                self.report(pi, reason);
                return Ok(ConnId(pi as u32));
            }
        }
        let si = self
            .add_shake(stream, c.addr, Phase::Connecting, Some(pi))
            .map_err(|e| Error::Io {
                what: "adding a TCP connection to epoll".into(),
                source: errno_io(e),
            })?;
        self.peers[pi].outgoing = Some(si);
        Ok(ConnId(pi as u32))
    }

    fn tune(&self, fd: impl AsFd) -> Result<(), Errno> {
        rnet::sockopt::set_tcp_nodelay(&fd, true)?;
        if let Some(n) = self.cfg.sndbuf {
            rnet::sockopt::set_socket_send_buffer_size(&fd, n)?;
        }
        if let Some(n) = self.cfg.rcvbuf {
            rnet::sockopt::set_socket_recv_buffer_size(&fd, n)?;
        }
        Ok(())
    }

    fn add_shake(
        &mut self,
        stream: TcpStream,
        addr: SocketAddr,
        phase: Phase,
        peer: Option<usize>,
    ) -> Result<usize, Errno> {
        let si = self.free_shakes.pop().unwrap_or_else(|| {
            self.shakes.push(None);
            self.shakes.len() - 1
        });
        self.shake_gen = self.shake_gen.wrapping_add(1) & 0x7fff_ffff;
        let gen = self.shake_gen;
        let mut flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if phase == Phase::Connecting {
            flags |= epoll::EventFlags::OUT;
        }
        if let Err(e) = epoll::add(&self.epoll, &stream, shake_data(si, gen), flags) {
            self.free_shakes.push(si);
            return Err(e);
        }
        self.shakes[si] = Some(Shake {
            stream,
            addr,
            gen,
            since: Instant::now(),
            phase,
            peer,
            buf: [0; wire::REPLY_LEN + wire::MAX_REASON],
            got: 0,
        });
        self.n_shakes += 1;
        Ok(si)
    }

    fn take_shake(&mut self, si: usize) -> Option<Shake> {
        let s = self.shakes.get_mut(si)?.take()?;
        self.free_shakes.push(si);
        self.n_shakes -= 1;
        if let Some(pi) = s.peer {
            if self.peers[pi].outgoing == Some(si) {
                self.peers[pi].outgoing = None;
            }
        }
        Some(s)
    }

    /// Queues the frame `header ++ payload` after everything queued before on `conn` and
    /// writes what the socket takes now (one `sendmsg` of the record header, `header` and
    /// `payload` straight from the caller's slices when nothing is queued; only the unsent
    /// remainder is copied). `Ok(false)`: not queued because the connection already holds
    /// `queue_bytes` or more (retry after polls). Frames queued before the handshake
    /// completes are sent after it.
    #[inline]
    pub fn try_send(&mut self, conn: ConnId, header: &[u8], payload: &[u8]) -> Result<bool, Error> {
        let pi = self.conn(conn)?;
        let len = header.len() + payload.len();
        if len > self.cfg.max_frame {
            return Err(Error::FrameTooLarge {
                len,
                max: self.cfg.max_frame,
            });
        }
        let p = &mut self.peers[pi];
        if !p.alive() {
            return Err(p.down_error());
        }
        if p.link.as_ref().is_some_and(|l| l.write_dead.is_some()) {
            // Going down: dropped; the failure is reported once the peer's last frames
            // are read.
            return Ok(true);
        }
        if p.out_copied >= self.cfg.queue_bytes {
            return Ok(false);
        }
        let rec = wire::rec_frame(len);
        let parts = [&rec[..], header, payload];
        let mut skip = 0;
        if let (true, Some(link)) = (p.out.is_empty(), &p.link) {
            let iov = [
                IoSlice::new(&rec),
                IoSlice::new(header),
                IoSlice::new(payload),
            ];
            match send(&link.stream, &iov) {
                Ok(n) if n == wire::REC_LEN + len => return Ok(true),
                Ok(n) => skip = n,
                Err(Errno::AGAIN) => {}
                Err(e) => {
                    self.write_failed(pi, e);
                    return Ok(true);
                }
            }
            append(p, &parts, skip);
            self.set_pollout(pi, true);
        } else {
            append(p, &parts, skip);
        }
        Ok(true)
    }

    /// Queues a bulk transfer of `len` bytes at `ptr` (in order with frames), written
    /// straight from that memory. [`Deliver::bulk_sent`]`(peer, token)` reports it written.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid and unchanged until `bulk_sent` reports it, or until the
    /// connection fails ([`Deliver::failed`]) or is closed.
    pub unsafe fn send_bulk(
        &mut self,
        conn: ConnId,
        token: u64,
        ptr: *const u8,
        len: usize,
    ) -> Result<(), Error> {
        let pi = self.conn(conn)?;
        if len as u64 > wire::MAX_BULK {
            return Err(Error::BulkTooLarge {
                len,
                max: wire::MAX_BULK,
            });
        }
        let p = &mut self.peers[pi];
        if !p.alive() {
            return Err(p.down_error());
        }
        p.out.push_back(Out::Bulk {
            hdr: wire::rec_bulk(token, len as u64),
            token,
            ptr,
            len,
            off: 0,
        });
        p.out_total += wire::REC_LEN + len;
        if p.out.len() == 1 && p.link.is_some() {
            self.flush(pi);
        }
        Ok(())
    }

    /// Announces where the peer's next bulk transfer `token` lands: up to `cap` bytes at
    /// `ptr`, read straight from the socket into that memory (bytes already buffered are
    /// copied); bytes past `cap` are read and discarded. [`Deliver::bulk_received`]
    /// reports it complete. Ignored on a connection that is down.
    ///
    /// # Safety
    /// `ptr..ptr+cap` is valid for writes and not otherwise accessed until reported, or
    /// until the connection fails ([`Deliver::failed`]) or is closed.
    pub unsafe fn expect_bulk(&mut self, conn: ConnId, token: u64, ptr: *mut u8, cap: usize) {
        let Some(p) = self.peers.get_mut(conn.0 as usize) else {
            return;
        };
        if !p.alive() {
            return;
        }
        let l = Landing { ptr, cap };
        match &mut p.rx.bulk {
            Some(b) if b.token == token && b.dest.is_none() => b.dest = Some(l),
            _ => {
                p.expects.insert(token, l);
            }
        }
    }

    /// Drops the connection to `peer` (e.g. at finalize) without reporting it; its queued
    /// frames and bulks are dropped and expected bulks abandoned. The peer sees it closed.
    pub fn close(&mut self, peer: u32) {
        if let Some(&pi) = self.by_rank.get(&peer) {
            if self.peers[pi].alive() {
                let reason = format!("rank {} closed it", self.cfg.me);
                self.teardown(pi, reason);
            }
        }
    }

    /// Gives up on `peer` for good (its process is gone, or its connection failed and the
    /// caller failed everything that waited on it): drops the connection as
    /// [`Endpoint::close`] does, refuses its later connections with `reason` (so that
    /// both sides know), and fails later [`Endpoint::connect`]s to it.
    pub fn forbid(&mut self, peer: u32, reason: &str) {
        self.close(peer);
        let pi = self.peer_index(peer);
        let p = &mut self.peers[pi];
        p.forbidden.get_or_insert_with(|| reason.to_string());
        p.down.get_or_insert_with(|| reason.to_string());
    }

    /// One non-blocking pass: accepts, handshakes, reads (frames delivered in order per
    /// peer), writes queued data, reports failures and completed bulk sends. Returns the
    /// number of frames, received bulks and sent bulks delivered.
    pub fn poll<D: Deliver + ?Sized>(&mut self, d: &mut D) -> usize {
        self.polls = self.polls.wrapping_add(1);
        let mut n = 0;
        if self.n_shakes > 0
            || self.writers > 0
            || self.live.len() > self.cfg.direct_reads
            || self.polls % EPOLL_EVERY == 0
        {
            self.poll_epoll(d, &mut n);
        } else {
            let mut i = 0;
            while i < self.live.len() {
                let pi = self.live[i];
                self.read_peer(pi, d, &mut n, false);
                if self.live.get(i) == Some(&pi) {
                    i += 1;
                }
            }
        }
        if self.polls % CLOCK_EVERY == 0 || self.n_shakes > 0 {
            let now = Instant::now();
            if now.duration_since(self.last_tick) >= TIMEOUT_TICK {
                self.last_tick = now;
                self.check_timeouts(now);
            }
        }
        for (rank, token) in self.sent.drain(..) {
            d.bulk_sent(rank, token);
            n += 1;
        }
        for (rank, reason) in self.failures.drain(..) {
            d.failed(rank, &reason);
        }
        n
    }

    fn poll_epoll<D: Deliver + ?Sized>(&mut self, d: &mut D, n: &mut usize) {
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match epoll::wait(
            &self.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&zero),
        ) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => tracing::warn!(rank = self.cfg.me, "epoll_wait failed: {e}"),
        }
        for ev in &events {
            let data = ev.data.u64();
            let flags = ev.flags;
            if data == LISTENER {
                self.accept_all();
            } else if data & SHAKE_BIT != 0 {
                let si = (data & 0xffff_ffff) as usize;
                let gen = ((data & !SHAKE_BIT) >> 32) as u32;
                if self
                    .shakes
                    .get(si)
                    .is_some_and(|s| s.as_ref().is_some_and(|s| s.gen == gen))
                {
                    self.on_shake(si);
                }
            } else {
                let pi = (data & 0xffff_ffff) as usize;
                let epoch = (data >> 32) as u32;
                let current = |me: &Self| {
                    me.peers
                        .get(pi)
                        .and_then(|p| p.link.as_ref())
                        .is_some_and(|l| l.epoch == epoch)
                };
                if !current(self) {
                    continue;
                }
                if flags.contains(epoll::EventFlags::OUT) {
                    self.flush(pi);
                }
                let hup =
                    epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ERR;
                if current(self) && flags.intersects(epoll::EventFlags::IN | hup) {
                    self.read_peer(pi, d, n, flags.intersects(hup));
                }
            }
        }
        self.events = events;
    }

    fn accept_all(&mut self) {
        for _ in 0..ACCEPTS_PER_POLL {
            match self.listener.accept() {
                Ok((s, addr)) => {
                    if self.n_shakes >= MAX_SHAKES {
                        tracing::warn!(
                            rank = self.cfg.me,
                            %addr,
                            "refused a TCP connection: {MAX_SHAKES} connections already in handshake"
                        );
                        continue;
                    }
                    let setup = s
                        .set_nonblocking(true)
                        .map_err(|e| e.to_string())
                        .and_then(|()| self.tune(&s).map_err(|e| e.to_string()))
                        .and_then(|()| {
                            self.add_shake(s, addr, Phase::Accepted, None)
                                .map_err(|e| e.to_string())
                        });
                    if let Err(e) = setup {
                        tracing::warn!(rank = self.cfg.me, %addr, "dropped an accepted TCP connection: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(rank = self.cfg.me, "accept on the TCP listener failed: {e}");
                    return;
                }
            }
        }
    }

    fn on_shake(&mut self, si: usize) {
        let me = self.cfg.me;
        let s = self.shakes[si].as_mut().expect("checked by the caller");
        match s.phase {
            Phase::Connecting => {
                let pi = s.peer.expect("ours");
                let addr = s.addr;
                let err = match rnet::sockopt::socket_error(&s.stream) {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) | Err(e) => Some(e),
                };
                if let Some(e) = err {
                    if e == Errno::INPROGRESS || e == Errno::ALREADY {
                        return;
                    }
                    let rank = self.peers[pi].rank;
                    self.fail(
                        pi,
                        format!(
                            "could not connect to rank {rank} at {addr}: {}",
                            errno_io(e)
                        ),
                    );
                    return;
                }
                s.phase = Phase::Hello { off: 0 };
                self.on_shake(si);
            }
            Phase::Hello { off } if off < wire::HELLO_LEN => {
                let pi = s.peer.expect("ours");
                let hello = Hello {
                    job: self.cfg.job,
                    secret: self.cfg.secret,
                    from: me,
                    to: self.peers[pi].rank,
                    max_frame: self.cfg.max_frame as u32,
                }
                .encode();
                match send(&s.stream, &[IoSlice::new(&hello[off..])]) {
                    Ok(k) => {
                        s.phase = Phase::Hello { off: off + k };
                        if off + k == wire::HELLO_LEN {
                            let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
                            let _ =
                                epoll::modify(&self.epoll, &s.stream, shake_data(si, s.gen), flags);
                            // The reply may be there already.
                            self.on_shake(si);
                        }
                    }
                    Err(Errno::AGAIN) => {}
                    Err(e) => {
                        let rank = self.peers[pi].rank;
                        let addr = s.addr;
                        self.fail(
                            pi,
                            format!(
                                "sending the handshake to rank {rank} at {addr} failed: {}",
                                errno_io(e)
                            ),
                        );
                    }
                }
            }
            Phase::Hello { .. } => self.read_reply(si),
            Phase::Accepted => self.read_hello(si),
        }
    }

    /// Reads into the shake's buffer up to `want` bytes: `Ok(true)` when there.
    fn shake_read(s: &mut Shake, want: usize) -> Result<bool, String> {
        while s.got < want {
            match recv(&s.stream, &mut s.buf[s.got..want]) {
                Ok(0) => {
                    return Err(format!(
                        "it closed the connection during the handshake ({} bytes received)",
                        s.got
                    ))
                }
                Ok(k) => s.got += k,
                Err(Errno::AGAIN) => return Ok(false),
                Err(e) => return Err(format!("reading the handshake failed: {}", errno_io(e))),
            }
        }
        Ok(true)
    }

    fn read_reply(&mut self, si: usize) {
        let s = self.shakes[si].as_mut().expect("checked by the caller");
        let pi = s.peer.expect("ours");
        let rank = self.peers[pi].rank;
        let addr = s.addr;
        let who = format!("rank {rank} at {addr}");
        let mut want = wire::REPLY_LEN;
        let parsed;
        loop {
            match Self::shake_read(s, want) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return self.fail(pi, format!("handshake with {who} failed: {e}")),
            }
            let head: &[u8; wire::REPLY_LEN] = s.buf[..wire::REPLY_LEN].try_into().expect("16");
            match wire::decode_reply(head) {
                Ok((kind, from, len)) => {
                    if want == wire::REPLY_LEN + len {
                        parsed = (kind, from);
                        break;
                    }
                    want = wire::REPLY_LEN + len;
                }
                Err(e) => return self.fail(pi, format!("handshake with {who} failed: {e}")),
            }
        }
        let (kind, from) = parsed;
        let reason = String::from_utf8_lossy(&s.buf[wire::REPLY_LEN..want]).into_owned();
        match kind {
            Reply::Nack => self.fail(pi, format!("{who} refused the connection: {reason}")),
            _ if from != rank => self.fail(
                pi,
                format!(
                    "the process at {addr} answered as rank {from}, not rank {rank} (stale card?)"
                ),
            ),
            Reply::Lose => {
                tracing::debug!(
                    rank = self.cfg.me,
                    peer = rank,
                    "simultaneous connect: ours lost"
                );
                self.stats.superseded += 1;
                self.take_shake(si);
                let p = &mut self.peers[pi];
                if p.link.is_none() {
                    p.lost_since = Some(Instant::now());
                }
            }
            Reply::Ack => {
                let s = self.take_shake(si).expect("present");
                if self.peers[pi].link.is_some() {
                    tracing::warn!(
                        rank = self.cfg.me,
                        peer = rank,
                        "dropped a second connection to rank {rank}"
                    );
                    return;
                }
                self.attach(pi, s.stream, s.addr);
            }
        }
    }

    fn read_hello(&mut self, si: usize) {
        let me = self.cfg.me;
        let s = self.shakes[si].as_mut().expect("checked by the caller");
        let addr = s.addr;
        match Self::shake_read(s, wire::HELLO_LEN) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(rank = me, %addr, "refused a TCP connection from {addr}: {e}");
                self.stats.refused += 1;
                self.take_shake(si);
                return;
            }
        }
        let h = Hello::decode(s.buf[..wire::HELLO_LEN].try_into().expect("48"));
        let refuse = |me: &mut Self, why: String, answer: bool| {
            tracing::warn!(rank = me.cfg.me, %addr, "refused a TCP connection from {addr}: {why}");
            me.stats.refused += 1;
            let s = me.take_shake(si).expect("present");
            if answer {
                let b = wire::encode_reply(Reply::Nack, me.cfg.me, &why);
                let _ = send(&s.stream, &[IoSlice::new(&b)]);
            }
            let _ = s.stream.shutdown(Shutdown::Both);
        };
        let h = match h {
            Ok(h) => h,
            Err(HelloError::Magic) => {
                return refuse(self, "not a Weft TCP peer (bad magic)".into(), false)
            }
            Err(HelloError::Version(v)) => {
                return refuse(
                    self,
                    format!(
                        "protocol version {v} is not supported (rank {me} speaks version {})",
                        wire::VERSION
                    ),
                    true,
                )
            }
            Err(HelloError::Kind(k)) => {
                return refuse(
                    self,
                    format!("handshake message of kind {k} instead of HELLO"),
                    false,
                )
            }
        };
        let who = format!("rank {}", h.from);
        if h.job != self.cfg.job {
            return refuse(
                self,
                format!(
                    "{who} belongs to another job ({:#x}, this is {:#x})",
                    h.job, self.cfg.job
                ),
                true,
            );
        }
        // Compare without an early exit; never log the secret.
        let diff = (h.secret[0] ^ self.cfg.secret[0]) | (h.secret[1] ^ self.cfg.secret[1]);
        if diff != 0 {
            return refuse(self, format!("{who} presented a wrong job secret"), true);
        }
        if h.to != me {
            return refuse(
                self,
                format!("{who} meant to reach rank {}, this is rank {me}", h.to),
                true,
            );
        }
        if h.from == me {
            return refuse(
                self,
                format!("a connection claims to come from this rank ({me})"),
                true,
            );
        }
        if h.max_frame as usize != self.cfg.max_frame {
            return refuse(
                self,
                format!(
                    "{who} uses WEFT_TCP_MAX_FRAME={}, rank {me} uses {}: set it (and WEFT_TCP_EAGER_LIMIT, which raises it) the same everywhere",
                    h.max_frame, self.cfg.max_frame
                ),
                true,
            );
        }
        let pi = self.peer_index(h.from);
        if let Some(why) = &self.peers[pi].forbidden {
            let why = why.clone();
            return refuse(
                self,
                format!("rank {me} has given up on {who} ({why})"),
                true,
            );
        }
        if self.peers[pi].link.is_some() {
            return refuse(
                self,
                format!("rank {me} already has a connection with {who}"),
                true,
            );
        }
        if let Some(o) = self.peers[pi].outgoing {
            // Ours wins only once it is connected (its HELLO on the way): one still
            // connecting may never get through (one-way reachability), theirs did.
            let ours_connected = self.shakes[o]
                .as_ref()
                .is_some_and(|s| s.phase != Phase::Connecting);
            if h.from > me && ours_connected {
                // Ours (initiated by the lower rank) wins: tell theirs to wait for it.
                tracing::debug!(rank = me, peer = h.from, "simultaneous connect: ours wins");
                let s = self.take_shake(si).expect("present");
                let b = wire::encode_reply(Reply::Lose, me, "");
                let _ = send(&s.stream, &[IoSlice::new(&b)]);
                let _ = s.stream.shutdown(Shutdown::Both);
                return;
            }
            tracing::debug!(
                rank = me,
                peer = h.from,
                "simultaneous connect: theirs wins"
            );
            self.stats.superseded += 1;
            self.take_shake(o);
        }
        let s = self.take_shake(si).expect("present");
        self.stats.accepted += 1;
        let p = &mut self.peers[pi];
        p.lost_since = None;
        p.down = None;
        // The ACK goes out first, then whatever was queued.
        let ack = wire::encode_reply(Reply::Ack, me, "");
        p.out_copied += ack.len();
        p.out_total += ack.len();
        p.out.push_front(Out::Bytes { buf: ack, off: 0 });
        self.attach(pi, s.stream, s.addr);
    }

    /// The handshake of peer `pi` is done on `stream`: records flow.
    fn attach(&mut self, pi: usize, stream: TcpStream, addr: SocketAddr) {
        let p = &mut self.peers[pi];
        p.epoch = p.epoch.wrapping_add(1) & 0x7fff_ffff;
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if let Err(e) = epoll::modify(&self.epoll, &stream, link_data(pi, p.epoch), flags) {
            let reason = format!(
                "epoll_ctl for the connection with rank {} failed: {e}",
                p.rank
            );
            return self.report(pi, reason);
        }
        p.rx = Rx {
            buf: vec![0; wire::REC_LEN + self.cfg.max_frame + RX_SLACK],
            start: 0,
            end: 0,
            bulk: None,
        };
        p.lost_since = None;
        p.link = Some(Link {
            stream,
            addr,
            epoch: p.epoch,
            pollout: false,
            write_dead: None,
        });
        tracing::debug!(rank = self.cfg.me, peer = p.rank, %addr, "TCP connection established");
        self.live.push(pi);
        if !self.peers[pi].out.is_empty() {
            self.flush(pi);
        }
    }

    fn set_pollout(&mut self, pi: usize, on: bool) {
        let p = &mut self.peers[pi];
        let Some(link) = &mut p.link else { return };
        if link.pollout == on {
            return;
        }
        let mut flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if on {
            flags |= epoll::EventFlags::OUT;
        }
        if let Err(e) = epoll::modify(&self.epoll, &link.stream, link_data(pi, link.epoch), flags) {
            let reason = format!(
                "epoll_ctl for the connection with rank {} failed: {e}",
                p.rank
            );
            return self.fail(pi, reason);
        }
        link.pollout = on;
        if on {
            self.writers += 1;
        } else {
            self.writers -= 1;
        }
    }

    fn write_error(&self, pi: usize, e: Errno) -> String {
        let p = &self.peers[pi];
        match e {
            Errno::PIPE | Errno::CONNRESET => format!("rank {} closed the connection", p.rank),
            e => format!("writing to rank {} failed: {}", p.rank, errno_io(e)),
        }
    }

    /// Writing to peer `pi` failed with `e`: nothing more is written, what it sent is
    /// still read, then the failure is reported (`read_peer`, `check_timeouts`).
    fn write_failed(&mut self, pi: usize, e: Errno) {
        let reason = self.write_error(pi, e);
        if let Some(link) = &mut self.peers[pi].link {
            link.write_dead.get_or_insert((reason, Instant::now()));
        }
        self.set_pollout(pi, false);
    }

    /// Writes queued data until the socket is full or the queue empty.
    fn flush(&mut self, pi: usize) {
        loop {
            let p = &mut self.peers[pi];
            let Some(link) = &p.link else { return };
            if p.out.is_empty() || link.write_dead.is_some() {
                return self.set_pollout(pi, false);
            }
            let (res, want) = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                let mut want = 0;
                for item in &p.out {
                    if k + 2 > MAX_IOV {
                        break;
                    }
                    match item {
                        Out::Bytes { buf, off } => {
                            iov[k] = IoSlice::new(&buf[*off..]);
                            k += 1;
                        }
                        Out::Bulk {
                            hdr, ptr, len, off, ..
                        } => {
                            if *off < wire::REC_LEN {
                                iov[k] = IoSlice::new(&hdr[*off..]);
                                k += 1;
                            }
                            let done = off.saturating_sub(wire::REC_LEN);
                            if done < *len {
                                // SAFETY: `send_bulk`'s contract keeps ptr..ptr+len valid
                                // and unchanged until reported sent.
                                let data = unsafe {
                                    std::slice::from_raw_parts(ptr.add(done), len - done)
                                };
                                iov[k] = IoSlice::new(data);
                                k += 1;
                            }
                        }
                    }
                    want += item.unsent();
                }
                (send(&link.stream, &iov[..k]), want)
            };
            match res {
                Ok(w) => {
                    advance(p, w, &mut self.sent);
                    if w < want {
                        // The socket is full (or nearly): wait for EPOLLOUT.
                        return self.set_pollout(pi, true);
                    }
                }
                Err(Errno::AGAIN) => return self.set_pollout(pi, true),
                Err(e) => return self.write_failed(pi, e),
            }
        }
    }

    fn read_peer<D: Deliver + ?Sized>(&mut self, pi: usize, d: &mut D, n: &mut usize, hup: bool) {
        if let Err(reason) = read_link(&mut self.peers[pi], self.cfg.max_frame, d, n, hup) {
            // A failed write came first: it says more about what went wrong.
            let first = self.peers[pi]
                .link
                .as_mut()
                .and_then(|l| l.write_dead.take())
                .map(|(why, _)| why);
            self.fail(pi, first.unwrap_or(reason));
        }
    }

    fn check_timeouts(&mut self, now: Instant) {
        for si in 0..self.shakes.len() {
            let Some(s) = &self.shakes[si] else { continue };
            let age = now.duration_since(s.since);
            match s.peer {
                None if age >= self.cfg.hello_timeout => {
                    tracing::warn!(
                        rank = self.cfg.me,
                        addr = %s.addr,
                        "closed a TCP connection from {}: no HELLO within {:?}",
                        s.addr,
                        self.cfg.hello_timeout
                    );
                    self.stats.refused += 1;
                    self.take_shake(si);
                }
                Some(pi) if age >= self.cfg.handshake_timeout => {
                    let reason = format!(
                        "no connection to rank {} at {} within {:?}",
                        self.peers[pi].rank, s.addr, self.cfg.handshake_timeout
                    );
                    self.fail(pi, reason);
                }
                _ => {}
            }
        }
        for pi in 0..self.peers.len() {
            let p = &self.peers[pi];
            if let Some((why, t)) = p.link.as_ref().and_then(|l| l.write_dead.as_ref()) {
                if now.duration_since(*t) >= WRITE_DEAD_WAIT {
                    let reason = why.clone();
                    self.fail(pi, reason);
                    continue;
                }
            }
            if let Some(t) = p.lost_since {
                // Its connection was already through its TCP connect when it told us so:
                // it arrives at once, or something broke (bounded even for a patient
                // caller, who would otherwise wait for ever on a live peer).
                let limit = self.cfg.handshake_timeout.min(LOST_WAIT);
                if now.duration_since(t) >= limit {
                    let reason = format!(
                        "rank {} answered our connection that its own would be used instead, \
                         and that did not arrive within {limit:?}",
                        p.rank
                    );
                    self.fail(pi, reason);
                    continue;
                }
            }
            if let (Some(b), Some(wait)) = (&p.rx.bulk, self.cfg.bulk_wait) {
                if b.dest.is_none() && now.duration_since(b.since) >= wait {
                    let reason = format!(
                        "protocol error: rank {} sent a {}-byte bulk transfer (token {:#x}) that was \
                         never expected (waited {wait:?})",
                        p.rank, b.total, b.token
                    );
                    self.fail(pi, reason);
                }
            }
        }
    }

    /// Drops everything of peer `pi`'s connection.
    fn teardown(&mut self, pi: usize, reason: String) {
        if let Some(o) = self.peers[pi].outgoing {
            self.take_shake(o);
        }
        let p = &mut self.peers[pi];
        if let Some(link) = p.link.take() {
            if link.pollout {
                self.writers -= 1;
            }
            // Closing the socket also removes it from the epoll set.
            let _ = link.stream.shutdown(Shutdown::Both);
            if let Some(i) = self.live.iter().position(|&x| x == pi) {
                self.live.swap_remove(i);
            }
        }
        p.lost_since = None;
        p.out.clear();
        p.out_copied = 0;
        p.out_total = 0;
        p.expects.clear();
        p.rx = Rx::default();
        p.down = Some(reason);
    }

    /// Peer `pi`'s connection failed: tear it down and report it at the next poll (once:
    /// nothing happens if it is already down).
    fn fail(&mut self, pi: usize, reason: String) {
        if self.peers[pi].alive() {
            self.report(pi, reason);
        }
    }

    /// Tears down peer `pi`'s connection and reports `reason` at the next poll.
    fn report(&mut self, pi: usize, reason: String) {
        let rank = self.peers[pi].rank;
        let addr = self.peers[pi].link.as_ref().map(|l| l.addr);
        tracing::warn!(
            rank = self.cfg.me,
            peer = rank,
            ?addr,
            "TCP connection failed: {reason}"
        );
        self.teardown(pi, reason.clone());
        self.stats.failures += 1;
        self.failures.push((rank, reason));
    }
}

/// Appends `parts` (minus their first `skip` bytes) to the queue, into the last copied
/// buffer when it is small.
fn append(p: &mut Peer, parts: &[&[u8]], mut skip: usize) {
    let total: usize = parts.iter().map(|s| s.len()).sum::<usize>() - skip;
    let buf = match p.out.back_mut() {
        Some(Out::Bytes { buf, .. }) if buf.len() < COALESCE => buf,
        _ => {
            p.out.push_back(Out::Bytes {
                buf: Vec::with_capacity(total),
                off: 0,
            });
            match p.out.back_mut() {
                Some(Out::Bytes { buf, .. }) => buf,
                _ => unreachable!("just pushed"),
            }
        }
    };
    for s in parts {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        buf.extend_from_slice(&s[skip..]);
        skip = 0;
    }
    p.out_copied += total;
    p.out_total += total;
}

/// Accounts `w` written bytes to the front of the queue.
fn advance(p: &mut Peer, mut w: usize, sent: &mut Vec<(u32, u64)>) {
    p.out_total -= w;
    while let Some(front) = p.out.front_mut() {
        let left = front.unsent();
        let take = left.min(w);
        match front {
            Out::Bytes { off, .. } => {
                *off += take;
                p.out_copied -= take;
            }
            Out::Bulk { off, .. } => *off += take,
        }
        w -= take;
        if take < left {
            break;
        }
        if let Some(Out::Bulk { token, .. }) = p.out.pop_front() {
            sent.push((p.rank, token));
        }
        if w == 0 {
            break;
        }
    }
}

/// Whether the peer shut down its side (`POLLRDHUP`) though unread data remains: then
/// how many bytes remain unread.
fn peer_gone(s: &TcpStream) -> Option<u64> {
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
fn midway(rx: &Rx) -> String {
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
fn parse<D: Deliver + ?Sized>(
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

/// How long a connection whose writes failed is still read before its failure is
/// reported (its end of stream or reset normally comes at once).
const WRITE_DEAD_WAIT: Duration = Duration::from_secs(1);

/// How long the loser of a crossed connect waits for the winner's connection, at most.
const LOST_WAIT: Duration = Duration::from_secs(30);

/// Reads into the receive buffer per [`read_link`] call, at most.
const READ_BUDGET: u32 = 8;

/// Reads what the socket has and delivers whole records; `Err` is the failure reason.
/// After a short read it stops (the socket is drained: saves a `recv` per message) unless
/// a record is incomplete or `hup` (epoll saw a hang-up: read on to the end of stream).
fn read_link<D: Deliver + ?Sized>(
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
