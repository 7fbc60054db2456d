//! The endpoint: a listener, one epoll instance, and per peer one connection with an
//! ordered output queue (frames and bulk transfers) and a bounded receive buffer.
//! Connections in handshake are in [`handshake`], the receive path in [`rx`]; the send
//! path, polling, timeouts and failures are here.

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

mod handshake;
mod rx;

use handshake::{Phase, Shake};
use rx::{read_link, Landing, Rx};

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
                let mut cut = false;
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
                                let n = (len - done).min(self.cfg.write_chunk);
                                cut = n < len - done;
                                // SAFETY: `send_bulk`'s contract keeps ptr..ptr+len valid
                                // and unchanged until reported sent; n <= len - done.
                                let data = unsafe { std::slice::from_raw_parts(ptr.add(done), n) };
                                iov[k] = IoSlice::new(data);
                                k += 1;
                            }
                        }
                    }
                    if cut {
                        // The rest of this bulk goes in the next sendmsg.
                        break;
                    }
                }
                let want = iov[..k].iter().map(|s| s.len()).sum::<usize>();
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

/// How long a connection whose writes failed is still read before its failure is
/// reported (its end of stream or reset normally comes at once).
const WRITE_DEAD_WAIT: Duration = Duration::from_secs(1);

/// How long the loser of a crossed connect waits for the winner's connection, at most.
const LOST_WAIT: Duration = Duration::from_secs(30);
