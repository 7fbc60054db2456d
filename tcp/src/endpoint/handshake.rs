//! Connections in handshake: accepting, the HELLO and its reply, the crossed-connect
//! tie-break, and attaching a connection once it is through.

use super::rx::recv;
use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Ours: the non-blocking connect is under way.
    Connecting,
    /// Ours: writing the HELLO (`off` bytes written), then reading the reply.
    Hello { off: usize },
    /// Theirs: reading their HELLO.
    Accepted,
}

#[derive(Debug)]
pub(super) struct Shake {
    pub(super) stream: TcpStream,
    pub(super) addr: SocketAddr,
    pub(super) gen: u32,
    pub(super) since: Instant,
    pub(super) phase: Phase,
    /// Peer index (ours only).
    pub(super) peer: Option<usize>,
    pub(super) buf: [u8; wire::REPLY_LEN + wire::MAX_REASON],
    pub(super) got: usize,
}

pub(super) fn shake_data(si: usize, gen: u32) -> epoll::EventData {
    epoll::EventData::new_u64(SHAKE_BIT | ((gen as u64) << 32) | si as u64)
}

impl Endpoint {
    pub(super) fn add_shake(
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

    pub(super) fn take_shake(&mut self, si: usize) -> Option<Shake> {
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

    pub(super) fn accept_all(&mut self) {
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

    pub(super) fn on_shake(&mut self, si: usize) {
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
    pub(super) fn shake_read(s: &mut Shake, want: usize) -> Result<bool, String> {
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

    pub(super) fn read_reply(&mut self, si: usize) {
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

    pub(super) fn read_hello(&mut self, si: usize) {
        let me = self.cfg.me;
        let s = self.shakes[si].as_mut().expect("checked by the caller");
        let addr = s.addr;
        match Self::shake_read(s, wire::HELLO_LEN) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                if s.got == 0 {
                    // Usually the other side of a simultaneous connect dropping its
                    // attempt (it kept ours): nothing to warn about.
                    tracing::debug!(rank = me, %addr, "refused a TCP connection from {addr}: {e}");
                } else {
                    tracing::warn!(rank = me, %addr, "refused a TCP connection from {addr}: {e}");
                }
                self.stats.refused += 1;
                self.take_shake(si);
                return;
            }
        }
        let h = Hello::decode(s.buf[..wire::HELLO_LEN].try_into().expect("48"));
        // A second connection from a peer already connected is the other half of a
        // simultaneous connect: refused quietly.
        let quiet = std::cell::Cell::new(false);
        let refuse = |me: &mut Self, why: String, answer: bool| {
            if quiet.get() {
                tracing::debug!(rank = me.cfg.me, %addr, "refused a TCP connection from {addr}: {why}");
            } else {
                tracing::warn!(rank = me.cfg.me, %addr, "refused a TCP connection from {addr}: {why}");
            }
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
            quiet.set(true);
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
    pub(super) fn attach(&mut self, pi: usize, stream: TcpStream, addr: SocketAddr) {
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
}
