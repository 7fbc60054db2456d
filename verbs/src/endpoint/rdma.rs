//! Rendezvous: exposures through the registration cache, RDMA reads and writes and their
//! completions, and [`RdmaBuf`], registered memory RDMA needs no `unsafe` for.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::rcache::{page_range, Key, RegCache};
use crate::sys::{Mr, Pd};
use crate::Error;

use super::{ConnId, Endpoint, RawBuf, RdmaToken, RemoteRegion, U32Map};

/// An RDMA read or write to post.
pub(super) struct RdmaOp {
    pub(super) token: u64,
    pub(super) mr: Arc<Mr>,
    pub(super) local: u64,
    pub(super) len: u32,
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) write: bool,
}

/// Exposures of one registration (one rkey): its cache entry and the `(addr, len)` of each
/// `register` not yet released (one pin each).
pub(super) struct Exposure {
    key: Key,
    spans: Vec<(u64, usize)>,
}

/// The rendezvous part's state.
pub(super) struct Rdma {
    // Field order is drop order: cached registrations before the protection domain.
    pub(super) rcache: RegCache<Mr>,
    /// Exposed registrations not yet released, by rkey.
    pub(super) exposed: U32Map<Exposure>,
    /// [`RdmaBuf`]s lent for a transfer, by token, with whether `poll_rdma` reported it.
    pub(super) lent: HashMap<u64, (RdmaBuf, bool)>,
    pub(super) done: VecDeque<(RdmaToken, Result<(), Error>)>,
    pub(super) next_token: u64,
    pub(super) pd: Arc<Pd>,
    /// Largest registration the device takes.
    pub(super) max_mr_size: u64,
    /// Keep registrations cached after their last use (`WEFT_VERBS_RCACHE`).
    pub(super) keep: bool,
}

impl Rdma {
    pub(super) fn register(&mut self, ptr: *const u8, len: usize) -> Result<RemoteRegion, Error> {
        let (key, mr) = self.mr_for(ptr as u64, len)?;
        self.rcache.pin(key);
        let x = self.exposed.entry(mr.rkey()).or_insert(Exposure {
            key,
            spans: Vec::new(),
        });
        x.spans.push((ptr as u64, len));
        Ok(RemoteRegion {
            addr: ptr as u64,
            len,
            rkey: mr.rkey(),
        })
    }

    pub(super) fn release(&mut self, region: RemoteRegion) {
        let Some(x) = self.exposed.get_mut(&region.rkey) else {
            return;
        };
        let Some(i) = x.spans.iter().position(|&s| s == (region.addr, region.len)) else {
            return;
        };
        x.spans.swap_remove(i);
        let key = x.key;
        if x.spans.is_empty() {
            self.exposed.remove(&region.rkey);
        }
        self.rcache.unpin(key);
        if !self.keep && !self.rcache.is_pinned(key) {
            self.rcache.remove(key);
        }
    }

    /// The registration covering `[addr, addr + len)`: from the cache, or made and cached.
    pub(super) fn mr_for(&mut self, addr: u64, len: usize) -> Result<(Key, Arc<Mr>), Error> {
        if len as u64 > self.max_mr_size {
            return Err(Error::MessageTooLarge {
                what: "registration",
                len,
                max: self.max_mr_size as usize,
            });
        }
        let (start, end) = page_range(addr, len);
        if self.keep {
            if let Some(hit) = self.rcache.lookup(start, end) {
                return Ok(hit);
            }
        }
        let pages = (end - start) as usize;
        let mr = match Mr::register(&self.pd, start as *const u8, pages) {
            Ok(mr) => mr,
            // A range the page rounding made invalid: register the exact bytes. Memory
            // that cannot be written (a send buffer in read-only data) is registered for
            // remote reads only, which is all a rendezvous exposure needs.
            Err(first) => Mr::register(&self.pd, addr as *const u8, len)
                .or_else(|_| Mr::register_read_only(&self.pd, start as *const u8, pages))
                .or_else(|_| Mr::register_read_only(&self.pd, addr as *const u8, len))
                .map_err(|_| first)?,
        };
        let mr = Arc::new(mr);
        let key = self
            .rcache
            .insert(mr.addr(), mr.addr() + mr.len() as u64, mr.clone());
        Ok((key, mr))
    }

    pub(super) fn invalidate(&mut self, ptr: *const u8, len: usize) -> usize {
        let span = (ptr as u64, len);
        let mine: Vec<u32> = self
            .exposed
            .iter()
            .filter(|(_, x)| x.spans.contains(&span))
            .map(|(&rkey, _)| rkey)
            .collect();
        for rkey in mine {
            while self
                .exposed
                .get(&rkey)
                .is_some_and(|x| x.spans.contains(&span))
            {
                self.release(RemoteRegion {
                    addr: span.0,
                    len,
                    rkey,
                });
            }
        }
        let (start, end) = page_range(ptr as u64, len);
        self.rcache.invalidate(start, end)
    }
}

/// Registered memory that RDMA needs no `unsafe` for: made by
/// [`Endpoint::alloc_rdma_buf`] (registered once, for as long as it lives), read and
/// written as a slice while held, and lent to the endpoint for one transfer by
/// [`Endpoint::read_into`] or [`Endpoint::write_from`], which take it by value; the
/// endpoint hands it back through [`Endpoint::take_buf`] once [`Endpoint::poll_rdma`]
/// reported the transfer. Holding it is proof that no transfer uses it, which is what
/// the safety contracts of [`Endpoint::rdma_read`] and [`Endpoint::rdma_write`] ask of
/// their callers.
///
/// Those two stay `unsafe` for the fabric: it moves the application's own buffers (those
/// of a nonblocking receive or send), whose lifetime is the application's promise to
/// complete the request before it reuses them, as in MPI. No Rust type can carry that
/// promise across the application's calls; a borrow would end when its guard is leaked.
pub struct RdmaBuf {
    // Field order is drop order: deregistered before the memory is freed.
    mr: Arc<Mr>,
    mem: RawBuf,
    len: usize,
}

impl std::fmt::Debug for RdmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaBuf")
            .field("addr", &self.mem.addr())
            .field("len", &self.len)
            .field("lkey", &self.mr.lkey())
            .finish()
    }
}

impl RdmaBuf {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes (zero when made).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `mem` holds at least `len` initialised (zeroed) bytes owned by this
        // buffer, and no transfer uses them: the endpoint holds the buffer while one does.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to fill before a write or read after a read.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), self.len) }
    }
}

/// A transfer [`Endpoint::read_into`] or [`Endpoint::write_from`] did not start: the
/// buffer comes back untouched, with the reason.
#[derive(Debug)]
pub struct Refused {
    /// The buffer, handed back.
    pub buf: RdmaBuf,
    /// `None`: no room now (connection not ready yet, send queue full): `poll` and retry.
    /// Otherwise why it cannot be done (the connection failed, the peer's region is
    /// shorter than the buffer, an unknown connection).
    pub error: Option<Error>,
}

/// One RDMA transfer's parameters.
#[derive(Clone, Copy)]
pub(super) struct Transfer {
    pub(super) local: u64,
    pub(super) len: usize,
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) write: bool,
}

impl Endpoint {
    /// Registers `[ptr, ptr + len)` so a peer can RDMA-read it (rendezvous send), through
    /// the registration cache; returns what the peer needs. The memory is only pinned, never
    /// accessed here; an unmapped range is an error (`Error::RegMr`, EFAULT).
    ///
    /// The registration stays in place (its cache entry pinned) until
    /// [`Endpoint::release`] of the returned region, which the sender calls once the peer
    /// reported its read done; after that it stays cached for reuse until evicted. Memory
    /// that is freed or reused must be [`Endpoint::invalidate`]d first.
    pub fn register(&mut self, ptr: *const u8, len: usize) -> Result<RemoteRegion, Error> {
        self.rdma.register(ptr, len)
    }

    /// Ends one exposure made by [`Endpoint::register`] (the peer finished its transfer).
    /// With `WEFT_VERBS_RCACHE=0` the registration goes with its last exposure.
    pub fn release(&mut self, region: RemoteRegion) {
        self.rdma.release(region)
    }

    /// Call before `[ptr, ptr + len)` is freed or reused (or when done with it, to
    /// register afresh next time). Exposures of exactly this buffer end (as by `release`);
    /// cached registrations overlapping its pages are dropped, except those still exposed
    /// for other buffers sharing a page: those are never looked up again and go when their
    /// own exposure ends. An RDMA operation in flight keeps its registration until it
    /// completes. Returns how many cached registrations were affected.
    pub fn invalidate(&mut self, ptr: *const u8, len: usize) -> usize {
        self.rdma.invalidate(ptr, len)
    }

    /// Starts an RDMA read of `len` bytes from the peer's `(remote_addr, rkey)` into
    /// `[local, local + len)`; `Ok(None)`: no room now (connection not ready, send queue
    /// full), retry after `poll`. Its completion is reported by [`Endpoint::poll_rdma`].
    ///
    /// # Safety
    /// `[local, local + len)` must be valid for writes and must not be read or written by
    /// anyone until `poll_rdma` reports this token (success or error), or the endpoint is
    /// dropped.
    pub unsafe fn rdma_read(
        &mut self,
        conn: ConnId,
        local: *mut u8,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<Option<RdmaToken>, Error> {
        let t = Transfer {
            local: local as u64,
            len,
            remote_addr,
            rkey,
            write: false,
        };
        self.start_rdma(conn, t, None)
    }

    /// Starts an RDMA write of `[local, local + len)` to the peer's `(remote_addr, rkey)`
    /// (a region the peer exposed with [`Endpoint::register`]); `Ok(None)`: no room now.
    /// Its completion (the data is placed in the peer's memory) is reported by
    /// [`Endpoint::poll_rdma`]. On rxe under emulation writes measured faster than reads
    /// (`ib_write_bw` vs `ib_read_bw`), so a receiver-driven rendezvous (the receiver
    /// exposes its buffer, the sender writes, then says so) may prefer it.
    ///
    /// # Safety
    /// `[local, local + len)` must be valid for reads and must not be modified by anyone
    /// until `poll_rdma` reports this token, or the endpoint is dropped.
    pub unsafe fn rdma_write(
        &mut self,
        conn: ConnId,
        local: *const u8,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<Option<RdmaToken>, Error> {
        let t = Transfer {
            local: local as u64,
            len,
            remote_addr,
            rkey,
            write: true,
        };
        self.start_rdma(conn, t, None)
    }

    /// Starts transfer `t` on `conn`, through the registration `own` (an [`RdmaBuf`]'s)
    /// or else the cache's.
    pub(super) fn start_rdma(
        &mut self,
        conn: ConnId,
        t: Transfer,
        own: Option<Arc<Mr>>,
    ) -> Result<Option<RdmaToken>, Error> {
        let idx = conn.0;
        let c = self
            .links
            .conns
            .get(idx as usize)
            .ok_or(Error::UnknownConn(idx))?;
        if !c.state.can_send()? {
            return Ok(None);
        }
        let Transfer {
            local,
            len,
            remote_addr,
            rkey,
            write,
        } = t;
        if len as u64 > self.info.max_msg_size {
            return Err(Error::MessageTooLarge {
                what: if write { "RDMA write" } else { "RDMA read" },
                len,
                max: self.info.max_msg_size as usize,
            });
        }
        let token = self.rdma.next_token;
        if len == 0 {
            self.rdma.next_token += 1;
            self.rdma.done.push_back((RdmaToken(token), Ok(())));
            return Ok(Some(RdmaToken(token)));
        }
        if c.sq.inflight.len() + 2 >= c.sq.depth {
            self.poll_send();
            let c = &self.links.conns[idx as usize];
            if c.sq.inflight.len() + 2 >= c.sq.depth {
                return Ok(None);
            }
        }
        let mr = match own {
            Some(mr) => mr,
            None => self.rdma.mr_for(local, len)?.1,
        };
        self.rdma.next_token += 1;
        let op = RdmaOp {
            token,
            mr,
            local,
            len: len as u32,
            remote_addr,
            rkey,
            write,
        };
        self.post(idx, &[], 0, None, Some(op), true)
            .inspect_err(|e| self.fail(idx, e.duplicate()))?;
        Ok(Some(RdmaToken(token)))
    }

    /// Same as [`Endpoint::poll_rdma`] (the name the fabric engine uses).
    pub fn poll_reads<F>(&mut self, done: &mut F) -> usize
    where
        F: FnMut(RdmaToken, Result<(), Error>) + ?Sized,
    {
        self.poll_rdma(done)
    }

    /// Reports finished RDMA reads and writes: `done(token, Ok(()))`, or an error naming the peer.
    /// Returns how many were reported. Generic over the callback, so the completion
    /// path is monomorphised (no indirect call per completion); a `&mut dyn FnMut` works too.
    pub fn poll_rdma<F>(&mut self, done: &mut F) -> usize
    where
        F: FnMut(RdmaToken, Result<(), Error>) + ?Sized,
    {
        // RDMA operations are always signaled: with none outstanding there is nothing to
        // find on the send queue (an ibv_poll_cq less on every idle poll).
        if self.signaled_out > 0 {
            self.poll_send();
        }
        self.take_rdma_done(done)
    }

    /// Whether finished RDMA operations wait to be reported (found by an earlier poll of
    /// the completion queues, [`Endpoint::poll_with`]'s included): one load.
    #[inline(always)]
    pub fn rdma_done_pending(&self) -> bool {
        !self.rdma.done.is_empty()
    }

    /// Reports the RDMA operations earlier polls found finished, as
    /// [`Endpoint::poll_rdma`] does, without polling the completion queues again (for a
    /// caller that has just run [`Endpoint::poll_with`]). Returns how many were reported.
    pub fn take_rdma_done<F>(&mut self, done: &mut F) -> usize
    where
        F: FnMut(RdmaToken, Result<(), Error>) + ?Sized,
    {
        let n = self.rdma.done.len();
        while let Some((t, r)) = self.rdma.done.pop_front() {
            if !self.rdma.lent.is_empty() {
                if let Some(lent) = self.rdma.lent.get_mut(&t.0) {
                    lent.1 = true;
                }
            }
            done(t, r);
        }
        n
    }

    /// Allocates `len` bytes of page-aligned memory, zeroed, registered for RDMA for as
    /// long as the buffer lives (no registration per transfer, no cache). See [`RdmaBuf`].
    pub fn alloc_rdma_buf(&mut self, len: usize) -> Result<RdmaBuf, Error> {
        if len as u64 > self.info.max_mr_size {
            return Err(Error::MessageTooLarge {
                what: "registration",
                len,
                max: self.info.max_mr_size as usize,
            });
        }
        let mem = RawBuf::new(len);
        let mr = Arc::new(Mr::register(&self.pd, mem.ptr.as_ptr(), mem.len())?);
        Ok(RdmaBuf { mr, mem, len })
    }

    /// Starts an RDMA read of `buf.len()` bytes from the start of the peer's exposed
    /// region `from` into `buf`, which the endpoint keeps until [`Endpoint::poll_rdma`]
    /// reported the returned token; then [`Endpoint::take_buf`] gives it back. `Err`: not
    /// started, the buffer handed back with the reason (`error: None`: no room now, poll
    /// and retry). A buffer longer than `from` is refused: it would read past what the
    /// peer exposed.
    pub fn read_into(
        &mut self,
        conn: ConnId,
        buf: RdmaBuf,
        from: RemoteRegion,
    ) -> Result<RdmaToken, Refused> {
        self.lend(conn, buf, from, false)
    }

    /// Starts an RDMA write of `buf` to the start of the peer's exposed region `to`; the
    /// buffer comes back as with [`Endpoint::read_into`]. A buffer longer than `to` is
    /// refused.
    pub fn write_from(
        &mut self,
        conn: ConnId,
        buf: RdmaBuf,
        to: RemoteRegion,
    ) -> Result<RdmaToken, Refused> {
        self.lend(conn, buf, to, true)
    }

    /// The buffer lent to transfer `token`, once [`Endpoint::poll_rdma`] reported that
    /// transfer (whatever its result); `None` before that, or for a token that lent no
    /// buffer or whose buffer was already taken.
    pub fn take_buf(&mut self, token: RdmaToken) -> Option<RdmaBuf> {
        match self.rdma.lent.get(&token.0) {
            Some((_, true)) => self.rdma.lent.remove(&token.0).map(|(buf, _)| buf),
            _ => None,
        }
    }

    fn lend(
        &mut self,
        conn: ConnId,
        buf: RdmaBuf,
        remote: RemoteRegion,
        write: bool,
    ) -> Result<RdmaToken, Refused> {
        if buf.len > remote.len {
            let what = if write {
                "RDMA write (the buffer is longer than the peer's region)"
            } else {
                "RDMA read (the buffer is longer than the peer's region)"
            };
            let error = Error::MessageTooLarge {
                what,
                len: buf.len,
                max: remote.len,
            };
            return Err(Refused {
                buf,
                error: Some(error),
            });
        }
        let t = Transfer {
            local: buf.mem.addr(),
            len: buf.len,
            remote_addr: remote.addr,
            rkey: remote.rkey,
            write,
        };
        match self.start_rdma(conn, t, Some(buf.mr.clone())) {
            Ok(Some(token)) => {
                self.rdma.lent.insert(token.0, (buf, false));
                Ok(token)
            }
            Ok(None) => Err(Refused { buf, error: None }),
            Err(e) => Err(Refused {
                buf,
                error: Some(e),
            }),
        }
    }
}
