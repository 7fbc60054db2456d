//! Non-blocking operations: request scopes and the requests started in them.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::{Backoff, Communicator, P2pError, Pod, Source, Status, Tag};

/// The region of [`Communicator::scope`]: non-blocking operations started here may borrow
/// buffers that outlive the scope, and are all complete when it ends.
pub struct RequestScope<'scope, 'env: 'scope> {
    pub(crate) comm: &'env Communicator,
    /// (id, serial) of every request started here.
    pub(crate) started: RefCell<Vec<(u32, u64)>>,
    pub(crate) _scope: PhantomData<&'scope mut &'scope ()>,
    pub(crate) _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for RequestScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestScope")
            .field("started", &self.started.borrow().len())
            .finish()
    }
}

impl<'scope, 'env> RequestScope<'scope, 'env> {
    /// Starts a send of `buf` to `dest`; `buf` stays borrowed until the scope ends.
    pub fn isend<T: Pod>(
        &'scope self,
        buf: &'scope [T],
        dest: u32,
        tag: Tag,
    ) -> Result<Request<'scope>, P2pError> {
        let r = self.comm.isend_in(buf, dest, tag)?;
        if !r.done {
            self.started.borrow_mut().push((r.id, r.serial));
        }
        Ok(r)
    }

    /// Starts a receive into `buf`; `buf` stays borrowed until the scope ends.
    pub fn irecv<T: Pod>(
        &'scope self,
        buf: &'scope mut [T],
        src: Source,
        tag: Tag,
    ) -> Result<Request<'scope>, P2pError> {
        let r = self.comm.irecv_in(buf, src, tag)?;
        self.started.borrow_mut().push((r.id, r.serial));
        Ok(r)
    }
}

impl RequestScope<'_, '_> {
    pub(crate) fn complete_all(&self) {
        // Requests that were waited on are gone from the engine; the rest (dropped
        // requests complete in their own Drop, leaked ones here) are cancelled if they are
        // unmatched receives, otherwise waited for.
        // Ids are reused (by other threads' requests, too): the serial tells whether
        // the id still names the request started here.
        let ids = std::mem::take(&mut *self.started.borrow_mut());
        // One lock for the lot; let go only to wait for a request.
        let mut e = self.comm.inner.engine();
        for (id, serial) in ids {
            if e.serial(id) == Some(serial) && !e.cancel_recv(id) {
                drop(e);
                let _ = self.comm.wait_id(id);
                e = self.comm.inner.engine();
            }
        }
    }
}

/// A pending non-blocking operation. Its buffer stays borrowed until it completes.
///
/// Dropping a receive that has not matched cancels it; dropping any other incomplete
/// request waits for it (a peer may still be reading the send buffer).
#[derive(Debug)]
pub struct Request<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) id: u32,
    /// The engine's serial of `id` (see [`RequestScope`]).
    pub(crate) serial: u64,
    pub(crate) recv: bool,
    pub(crate) done: bool,
    /// The result, once `test` has seen it (so that a later `wait` returns it).
    pub(crate) result: Option<Result<Status, P2pError>>,
    pub(crate) _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> Request<'a> {
    /// A request the engine holds as `id` (with `serial`), not complete yet.
    pub(crate) fn pending(comm: &'a Communicator, id: u32, serial: u64, recv: bool) -> Request<'a> {
        Request {
            comm,
            id,
            serial,
            recv,
            done: false,
            result: None,
            _buf: PhantomData,
        }
    }
}

impl Request<'_> {
    /// Progresses and returns the result if the operation has completed.
    pub fn test(&mut self) -> Option<Result<Status, P2pError>> {
        if let Some(r) = &self.result {
            return Some(r.clone());
        }
        let mut e = self.comm.inner.engine();
        e.progress();
        let mut r = e.take(self.id);
        if r.is_none() {
            e.fail_if_gone(self.id);
            r = e.take(self.id);
        }
        drop(e);
        let r = r.map(|r| self.comm.fix(r));
        self.done = r.is_some();
        self.result.clone_from(&r);
        r
    }

    /// Waits for the operation to complete.
    pub fn wait(mut self) -> Result<Status, P2pError> {
        if let Some(r) = self.result.take() {
            return r;
        }
        self.done = true;
        self.comm.fix(self.comm.wait_id(self.id))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.recv && self.comm.inner.engine().cancel_recv(self.id) {
            return;
        }
        let _ = self.comm.wait_id(self.id);
    }
}

/// Waits for every request; returns their statuses in order, or the first error.
pub fn wait_all(reqs: Vec<Request<'_>>) -> Result<Vec<Status>, P2pError> {
    let mut out = Vec::with_capacity(reqs.len());
    let mut first_err = None;
    for r in reqs {
        match r.wait() {
            Ok(s) => out.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

/// Waits until one of the requests completes; removes it and returns its index and result.
/// Panics if `reqs` is empty.
pub fn wait_any(reqs: &mut Vec<Request<'_>>) -> (usize, Result<Status, P2pError>) {
    assert!(!reqs.is_empty(), "wait_any on no requests");
    let mut backoff = Backoff::default();
    loop {
        for i in 0..reqs.len() {
            if let Some(r) = reqs[i].test() {
                let req = reqs.remove(i);
                drop(req);
                return (i, r);
            }
        }
        backoff.snooze();
    }
}
