//! [`Pmix`]: the client connection, through OpenPMIx's client library.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::owned::{key, proc_of, Infos, OwnedValue};
use crate::{secs, sys, GetOpts, GroupOpts, PmixError, PmixValue, Scope};

/// `PMIx_Get_version()`.
pub(crate) fn version() -> String {
    // SAFETY: returns a static NUL-terminated string; callable before init.
    unsafe { CStr::from_ptr(sys::PMIx_Get_version()) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn error_string(status: i32) -> String {
    // SAFETY: PMIx_Error_string returns a static NUL-terminated string for any status.
    unsafe { CStr::from_ptr(sys::PMIx_Error_string(status)) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn status(op: &'static str, rc: sys::pmix_status_t, hint: &str) -> PmixError {
    PmixError::Status {
        op,
        status: rc,
        message: error_string(rc),
        hint: if hint.is_empty() {
            String::new()
        } else {
            format!(": {hint}")
        },
    }
}

pub(crate) const SUCCESS: sys::pmix_status_t = sys::PMIX_SUCCESS as sys::pmix_status_t;

/// The completion of a non-blocking PMIx operation: its status, set once by the
/// library's callback (on its progress thread).
#[derive(Debug, Default)]
pub(crate) struct Done {
    status: Mutex<Option<sys::pmix_status_t>>,
    cv: Condvar,
}

impl Done {
    /// Waits for the status, running `f` about every millisecond meanwhile; stops
    /// waiting when `f` says why.
    pub(crate) fn wait(
        &self,
        f: &mut impl FnMut() -> Result<(), String>,
    ) -> Result<sys::pmix_status_t, String> {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(rc) = *st {
                return Ok(rc);
            }
            drop(st);
            f()?;
            st = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if st.is_none() {
                st = self
                    .cv
                    .wait_timeout(st, Duration::from_millis(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
    }
}

impl Done {
    /// Records the status and wakes the waiter.
    fn set(&self, status: sys::pmix_status_t) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
        self.cv.notify_all();
    }
}

/// `pmix_op_cbfunc_t` of the non-blocking calls: records the status in the [`Done`]
/// whose counted reference `cbdata` is.
pub(crate) unsafe extern "C" fn op_done(status: sys::pmix_status_t, cbdata: *mut std::ffi::c_void) {
    // SAFETY: `cbdata` is the `Arc<Done>` reference handed to the library with the call,
    // which runs this callback exactly once: it takes the reference over here.
    let done = unsafe { Arc::from_raw(cbdata.cast::<Done>().cast_const()) };
    done.set(status);
}

/// The `ninfo` results at `info` a callback received (none when null).
///
/// # Safety
///
/// `info` must point at `ninfo` valid entries that outlive the returned slice.
unsafe fn info_slice<'a>(info: *const sys::pmix_info_t, ninfo: usize) -> &'a [sys::pmix_info_t] {
    if info.is_null() || ninfo == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(info, ninfo) }
    }
}

/// The completion of a group construct: its status and the context id the host gave.
#[derive(Debug, Default)]
struct GroupDone {
    done: Done,
    ctxid: Mutex<Option<u64>>,
}

/// `pmix_info_cbfunc_t` of `PMIx_Group_construct_nb`: records the context id among the
/// results (`PMIX_GROUP_CONTEXT_ID`) and the status in the [`GroupDone`] whose counted
/// reference `cbdata` is, then lets the library free the results.
unsafe extern "C" fn group_done(
    st: sys::pmix_status_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    cbdata: *mut std::ffi::c_void,
    release: sys::pmix_release_cbfunc_t,
    release_data: *mut std::ffi::c_void,
) {
    // SAFETY: `cbdata` is the `Arc<GroupDone>` reference handed over with the call,
    // which runs this callback exactly once: it takes the reference over here.
    let done = unsafe { Arc::from_raw(cbdata.cast::<GroupDone>().cast_const()) };
    // SAFETY: the library passes `ninfo` valid entries at `info` until released.
    let infos = unsafe { info_slice(info, ninfo) };
    let want = CStr::from_bytes_with_nul(sys::PMIX_GROUP_CONTEXT_ID).ok();
    for i in infos {
        // SAFETY: the key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
        if Some(k) == want {
            // SAFETY: the value of a valid info entry.
            let v = unsafe { crate::owned::value_of(&i.value) };
            let id = match v {
                PmixValue::Size(n) => Some(n as u64),
                PmixValue::U64(n) => Some(n),
                PmixValue::U32(n) => Some(n.into()),
                _ => None,
            };
            *done.ctxid.lock().unwrap_or_else(|p| p.into_inner()) = id;
        }
    }
    if let Some(r) = release {
        // SAFETY: the library's release function for these results, called once.
        unsafe { r(release_data) };
    }
    done.done.set(st);
}

/// A get's outcome from the library's status and value (`t`: its timeout, whole seconds).
fn get_result(
    rc: sys::pmix_status_t,
    value: Option<PmixValue>,
    rank: Option<u32>,
    k: &str,
    t: Option<u32>,
) -> Result<PmixValue, PmixError> {
    const OP: &str = "PMIx_Get";
    match (rc, value) {
        (SUCCESS, Some(v)) => Ok(v),
        (SUCCESS, None) => Err(status(OP, rc, "the library returned no value")),
        (sys::PMIX_ERR_NOT_FOUND, _) => Err(PmixError::NotFound {
            op: OP,
            key: k.to_string(),
            who: rank.map_or("the job".to_string(), |r| format!("rank {r}")),
        }),
        (sys::PMIX_ERR_TIMEOUT, _) => Err(PmixError::Timeout {
            op: OP,
            secs: t.unwrap_or(0),
        }),
        (rc, _) => Err(status(OP, rc, "")),
    }
}

/// The answer to a non-blocking get: its status and a copy of the value, set once by
/// the library's callback.
#[derive(Debug, Default)]
struct GetDone {
    out: Mutex<Option<(sys::pmix_status_t, Option<PmixValue>)>>,
    cv: Condvar,
}

/// `pmix_value_cbfunc_t` of `PMIx_Get_nb`: copies the value (which the library frees
/// after the callback returns) into the [`GetDone`] whose counted reference `cbdata` is.
unsafe extern "C" fn get_done(
    st: sys::pmix_status_t,
    kv: *mut sys::pmix_value_t,
    cbdata: *mut std::ffi::c_void,
) {
    // SAFETY: `cbdata` is the `Arc<GetDone>` reference handed over with the call, which
    // runs this callback exactly once: it takes the reference over here.
    let done = unsafe { Arc::from_raw(cbdata.cast::<GetDone>().cast_const()) };
    let value = if st == SUCCESS && !kv.is_null() {
        // SAFETY: a non-null value the library passes is valid for the callback.
        Some(unsafe { crate::owned::value_of(&*kv) })
    } else {
        None
    };
    *done.out.lock().unwrap_or_else(|p| p.into_inner()) = Some((st, value));
    done.cv.notify_all();
}

/// A connection to the host's PMIx server (`PMIx_Init`), finalized by
/// [`finalize`](Pmix::finalize) or on drop. The library is thread-safe (it runs its own
/// progress thread): a `Pmix` may be shared between threads.
#[derive(Debug)]
pub struct Pmix {
    nspace: String,
    rank: u32,
    finalized: AtomicBool,
}

impl Pmix {
    /// Connects to the PMIx server whose contact the host engine put in this process's
    /// environment (see [`server_contact`](crate::server_contact)); fails at once, naming
    /// what is missing, when there is none.
    pub fn init() -> Result<Pmix, PmixError> {
        const OP: &str = "PMIx_Init";
        let mut me = proc_of(b"", 0);
        // SAFETY: `me` is a valid pmix_proc_t for the library to fill; no info array.
        let rc = unsafe { sys::PMIx_Init(&mut me, std::ptr::null_mut(), 0) };
        if rc != SUCCESS {
            let hint = if crate::server_contact().is_none() {
                "no PMIx server in this process's environment (PMIX_NAMESPACE and \
                 PMIX_SERVER_URI* unset): run under mpirun, prterun or srun --mpi=pmix"
            } else {
                "the server named by PMIX_SERVER_URI* did not accept this process"
            };
            return Err(status(OP, rc, hint));
        }
        // SAFETY: the library filled `nspace` with a NUL-terminated name within the array.
        let nspace = unsafe { CStr::from_ptr(me.nspace.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Pmix {
            nspace,
            rank: me.rank,
            finalized: AtomicBool::new(false),
        })
    }

    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The job's namespace.
    pub fn nspace(&self) -> &str {
        &self.nspace
    }

    fn me(&self, rank: u32) -> sys::pmix_proc_t {
        proc_of(self.nspace.as_bytes(), rank)
    }

    /// Stages `value` under `key` for the processes `scope` names (`PMIx_Put`, as a byte
    /// object); they see it after [`commit`](Pmix::commit) and a fence, or by a direct
    /// get that asks this process's server.
    pub fn put(&self, scope: Scope, k: &str, value: &[u8]) -> Result<(), PmixError> {
        const OP: &str = "PMIx_Put";
        let k = key(OP, k)?;
        let scope = match scope {
            Scope::Local => sys::PMIX_LOCAL,
            Scope::Remote => sys::PMIX_REMOTE,
            Scope::Global => sys::PMIX_GLOBAL,
        } as sys::pmix_scope_t;
        // SAFETY: all zeroes is an empty value; it points at `value` only for the call,
        // which copies the bytes (PMIx_Put stores a copy of the value).
        let rc = unsafe {
            let mut v: sys::pmix_value_t = std::mem::zeroed();
            v.type_ = sys::PMIX_BYTE_OBJECT as u16;
            v.data.bo = sys::pmix_byte_object_t {
                bytes: value.as_ptr().cast_mut().cast(),
                size: value.len(),
            };
            sys::PMIx_Put(scope, k.as_ptr(), &mut v)
        };
        if rc != SUCCESS {
            return Err(status(OP, rc, ""));
        }
        Ok(())
    }

    /// Pushes what was put to the local server (`PMIx_Commit`).
    pub fn commit(&self) -> Result<(), PmixError> {
        // SAFETY: no arguments.
        let rc = unsafe { sys::PMIx_Commit() };
        if rc != SUCCESS {
            return Err(status("PMIx_Commit", rc, ""));
        }
        Ok(())
    }

    /// A fence among `ranks` of the job (`None`: all of it), with the committed data
    /// collected to every participant (`collect`) or left to be fetched on demand; gives
    /// up after `timeout` (whole seconds) when given.
    pub fn fence(
        &self,
        ranks: Option<&[u32]>,
        collect: bool,
        timeout: Option<Duration>,
    ) -> Result<(), PmixError> {
        self.fence_with(ranks, collect, timeout, || Ok(()))
    }

    /// [`fence`](Pmix::fence), running `while_waiting` about every millisecond until it
    /// completes (`PMIx_Fence_nb`): a caller that must keep answering its peers (a
    /// transport's handshakes) does so while the host's servers gather the others. When
    /// `while_waiting` returns an error (a participant is known dead), the fence stops
    /// waiting and fails with [`PmixError::Abandoned`]; the library's completion of the
    /// fence, when it comes, is then dropped.
    pub fn fence_with(
        &self,
        ranks: Option<&[u32]>,
        collect: bool,
        timeout: Option<Duration>,
        mut while_waiting: impl FnMut() -> Result<(), String>,
    ) -> Result<(), PmixError> {
        const OP: &str = "PMIx_Fence";
        let procs: Vec<sys::pmix_proc_t> = match ranks {
            None => vec![self.me(sys::PMIX_RANK_WILDCARD)],
            Some(r) => r.iter().map(|&r| self.me(r)).collect(),
        };
        let mut info = Infos::new();
        if collect {
            info.push_bool(sys::PMIX_COLLECT_DATA, true);
        }
        let t = timeout.map(secs);
        if let Some(t) = t {
            info.push_int(sys::PMIX_TIMEOUT, t.min(i32::MAX as u32) as i32);
        }
        let done = Arc::new(Done::default());
        let cb = Arc::into_raw(done.clone())
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: `procs` and `info` are valid arrays of their lengths and outlive the
        // operation (this function returns only after the callback ran, below, or when
        // the library refused to start it, or it leaks them when it stops waiting); `cb`
        // is a counted reference the callback takes over (or that is released below when
        // the call fails at once).
        let rc = unsafe {
            sys::PMIx_Fence_nb(
                procs.as_ptr(),
                procs.len(),
                info.as_ptr(),
                info.len(),
                Some(op_done),
                cb,
            )
        };
        let rc = if rc == SUCCESS {
            match done.wait(&mut while_waiting) {
                Ok(rc) => rc,
                Err(reason) => {
                    // The library may still read the arrays until it completes the
                    // fence (it packs them at once, but that is not promised): keep them.
                    std::mem::forget(procs);
                    std::mem::forget(info);
                    return Err(PmixError::Abandoned { op: OP, reason });
                }
            }
        } else {
            // SAFETY: the library did not take `cb` (no callback will run): release it.
            drop(unsafe { Arc::from_raw(cb.cast::<Done>()) });
            rc
        };
        match rc {
            SUCCESS => Ok(()),
            sys::PMIX_ERR_TIMEOUT => Err(PmixError::Timeout {
                op: OP,
                secs: t.unwrap_or(0),
            }),
            _ => Err(status(OP, rc, "")),
        }
    }

    /// The value of `key` of process `rank` (`None`: job-level information, asked of the
    /// wildcard rank), copied out of the library (`PMIx_Get`).
    pub fn get(&self, rank: Option<u32>, k: &str, opts: GetOpts) -> Result<PmixValue, PmixError> {
        let (ck, who, info, t) = self.get_args(rank, k, opts)?;
        let mut out: *mut sys::pmix_value_t = std::ptr::null_mut();
        // SAFETY: `who`, the key and `info` are valid for the call; on success the
        // library stores a value it allocated in `out`, which OwnedValue frees.
        let rc = unsafe { sys::PMIx_Get(&who, ck.as_ptr(), info.as_ptr(), info.len(), &mut out) };
        let owned = OwnedValue(out);
        let value = (!owned.0.is_null()).then(|| owned.to_value());
        get_result(rc, value, rank, k, t)
    }

    /// A get's key, process name and directives (and its timeout in whole seconds).
    fn get_args(
        &self,
        rank: Option<u32>,
        k: &str,
        opts: GetOpts,
    ) -> Result<(std::ffi::CString, sys::pmix_proc_t, Infos, Option<u32>), PmixError> {
        let ck = key("PMIx_Get", k)?;
        let who = self.me(rank.unwrap_or(sys::PMIX_RANK_WILDCARD));
        let mut info = Infos::new();
        let t = opts.timeout.map(secs);
        if let Some(t) = t {
            info.push_int(sys::PMIX_TIMEOUT, t.min(i32::MAX as u32) as i32);
        }
        if opts.local_only {
            info.push_bool(sys::PMIX_OPTIONAL, true);
        }
        if opts.refresh {
            info.push_bool(sys::PMIX_GET_REFRESH_CACHE, true);
        }
        Ok((ck, who, info, t))
    }

    /// [`get`](Pmix::get), running `while_waiting` about every millisecond until the
    /// host answers (`PMIx_Get_nb`): a caller that must keep answering its peers (a
    /// transport's handshakes) does so while the host's servers fetch the value.
    pub fn get_with(
        &self,
        rank: Option<u32>,
        k: &str,
        opts: GetOpts,
        mut while_waiting: impl FnMut(),
    ) -> Result<PmixValue, PmixError> {
        let (ck, who, info, t) = self.get_args(rank, k, opts)?;
        let done = Arc::new(GetDone::default());
        let cb = Arc::into_raw(done.clone())
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: `who`, the key and `info` are valid and outlive the operation (this
        // function waits for the callback, which runs exactly once once the call was
        // accepted); `cb` is a counted reference the callback takes over (released
        // below when the call fails at once).
        let rc = unsafe {
            sys::PMIx_Get_nb(
                &who,
                ck.as_ptr(),
                info.as_ptr(),
                info.len(),
                Some(get_done),
                cb,
            )
        };
        if rc != SUCCESS {
            // SAFETY: the library did not take `cb` (no callback will run).
            drop(unsafe { Arc::from_raw(cb.cast::<GetDone>()) });
            return Err(status("PMIx_Get", rc, ""));
        }
        let mut out = done.out.lock().unwrap_or_else(|p| p.into_inner());
        while out.is_none() {
            drop(out);
            while_waiting();
            out = done.out.lock().unwrap_or_else(|p| p.into_inner());
            if out.is_none() {
                out = done
                    .cv
                    .wait_timeout(out, Duration::from_millis(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        let (rc, value) = out.take().unwrap_or((sys::PMIX_ERR_NOT_FOUND, None));
        get_result(rc, value, rank, k, t)
    }

    /// The names of the nodes the job runs on (`PMIx_Resolve_nodes`), in the host's
    /// order.
    pub fn nodes(&self) -> Result<Vec<String>, PmixError> {
        const OP: &str = "PMIx_Resolve_nodes";
        let ns = key(OP, &self.nspace)?;
        let mut list: *mut std::os::raw::c_char = std::ptr::null_mut();
        // SAFETY: `ns` is a NUL-terminated namespace; the library stores a malloc'ed
        // NUL-terminated list in `list` (or leaves it null), freed below.
        let rc = unsafe { sys::PMIx_Resolve_nodes(ns.as_ptr(), &mut list) };
        let text = if list.is_null() {
            String::new()
        } else {
            // SAFETY: non-null: a NUL-terminated string the library allocated, read once
            // and freed once.
            unsafe {
                let t = CStr::from_ptr(list).to_string_lossy().into_owned();
                libc::free(list.cast());
                t
            }
        };
        if rc != SUCCESS {
            return Err(status(OP, rc, ""));
        }
        Ok(text
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// The job's ranks on node `node` (`PMIx_Resolve_peers`), ascending.
    pub fn peers_on(&self, node: &str) -> Result<Vec<u32>, PmixError> {
        const OP: &str = "PMIx_Resolve_peers";
        let ns = key(OP, &self.nspace)?;
        let host = key(OP, node)?;
        let mut procs: *mut sys::pmix_proc_t = std::ptr::null_mut();
        let mut n = 0usize;
        // SAFETY: both names are NUL-terminated; the library stores a malloc'ed array of
        // `n` process names in `procs` (or null), freed below (PMIX_PROC_FREE).
        let rc = unsafe { sys::PMIx_Resolve_peers(host.as_ptr(), ns.as_ptr(), &mut procs, &mut n) };
        let mut ranks = Vec::new();
        if !procs.is_null() {
            // SAFETY: `procs` holds `n` initialized entries until freed here, once.
            unsafe {
                ranks.extend(std::slice::from_raw_parts(procs, n).iter().map(|p| p.rank));
                libc::free(procs.cast());
            }
        }
        if rc != SUCCESS {
            return Err(status(OP, rc, ""));
        }
        ranks.sort_unstable();
        Ok(ranks)
    }

    /// Ends this connection (`PMIx_Finalize`).
    pub fn finalize(self) -> Result<(), PmixError> {
        self.finalize_shared()
    }

    /// Ends this connection through a shared reference (for owners that share the
    /// handle); later calls, and the drop, do nothing.
    pub fn finalize_shared(&self) -> Result<(), PmixError> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // SAFETY: no info array; called once per successful PMIx_Init (the flag above).
        let rc = unsafe { sys::PMIx_Finalize(std::ptr::null(), 0) };
        if rc != SUCCESS {
            return Err(status("PMIx_Finalize", rc, ""));
        }
        Ok(())
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        if let Err(e) = self.finalize_shared() {
            tracing::warn!("finalizing PMIx on drop: {e}");
        }
    }
}

/// A query's status and results (key, value).
type QueryAnswer = (sys::pmix_status_t, Vec<(String, PmixValue)>);

/// The answer to a non-blocking query: its status and a copy of the results, set once
/// by the library's callback.
#[derive(Debug, Default)]
struct QueryDone {
    out: Mutex<Option<QueryAnswer>>,
    cv: Condvar,
}

/// `pmix_info_cbfunc_t` of `PMIx_Query_info_nb`: copies the results into the
/// [`QueryDone`] whose counted reference `cbdata` is, then lets the library free them.
unsafe extern "C" fn query_done(
    st: sys::pmix_status_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    cbdata: *mut std::ffi::c_void,
    release: sys::pmix_release_cbfunc_t,
    release_data: *mut std::ffi::c_void,
) {
    // SAFETY: `cbdata` is the `Arc<QueryDone>` reference handed over with the call,
    // which runs this callback exactly once: it takes the reference over here.
    let done = unsafe { Arc::from_raw(cbdata.cast::<QueryDone>().cast_const()) };
    // SAFETY: the library passes `ninfo` valid entries at `info` until released.
    let infos = unsafe { info_slice(info, ninfo) };
    let results = infos
        .iter()
        .map(|i| {
            // SAFETY: the key is NUL-terminated within its array; the value is valid.
            unsafe {
                (
                    CStr::from_ptr(i.key.as_ptr())
                        .to_string_lossy()
                        .into_owned(),
                    crate::owned::value_of(&i.value),
                )
            }
        })
        .collect();
    *done.out.lock().unwrap_or_else(|p| p.into_inner()) = Some((st, results));
    done.cv.notify_all();
    if let Some(r) = release {
        // SAFETY: the library's release function for these results, called once.
        unsafe { r(release_data) };
    }
}

impl Pmix {
    /// Asks the host one query (`PMIx_Query_info_nb`): `key` is one of [`query`]'s
    /// keys, `pset` the process set it concerns (the `pmix.pset.nm` qualifier), if any.
    /// Waits up to `wait` for the answer: a host that never answers is a timeout, not a
    /// hang. A host that does not support the query answers "not supported" (a
    /// [`PmixError::Status`]).
    ///
    /// [`query`]: crate::query
    pub fn query(
        &self,
        k: &str,
        pset: Option<&str>,
        wait: Duration,
    ) -> Result<PmixValue, PmixError> {
        const OP: &str = "PMIx_Query_info";
        let ck = key(OP, k)?;
        let mut qual = Infos::new();
        if let Some(name) = pset {
            let n = std::ffi::CString::new(name).map_err(|_| PmixError::InvalidArgs {
                op: OP,
                what: format!("process set name {name:?} holds a NUL byte"),
            })?;
            qual.push_str(sys::PMIX_PSET_NAME, &n);
        }
        let mut keys: Vec<*mut std::os::raw::c_char> =
            vec![ck.as_ptr().cast_mut(), std::ptr::null_mut()];
        let mut q = sys::pmix_query_t {
            keys: keys.as_mut_ptr(),
            qualifiers: qual.as_mut_ptr(),
            nqual: qual.len(),
        };
        let done = Arc::new(QueryDone::default());
        let cb = Arc::into_raw(done.clone())
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: `q` points at a NULL-terminated key list and `nqual` qualifiers, all of
        // which outlive the operation (dropped only after the callback ran, or leaked
        // when the wait gives up); `cb` is a counted reference the callback takes over
        // (released below when the call fails at once).
        let rc = unsafe { sys::PMIx_Query_info_nb(&mut q, 1, Some(query_done), cb) };
        if rc != SUCCESS {
            // SAFETY: the library did not take `cb` (no callback will run).
            drop(unsafe { Arc::from_raw(cb.cast::<QueryDone>()) });
            return Err(status(OP, rc, ""));
        }
        let deadline = std::time::Instant::now() + wait;
        let mut out = done.out.lock().unwrap_or_else(|p| p.into_inner());
        while out.is_none() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                drop(out);
                // The library may still read the query when it answers: keep it.
                std::mem::forget(keys);
                std::mem::forget(qual);
                std::mem::forget(ck);
                return Err(PmixError::Timeout {
                    op: OP,
                    secs: secs(wait),
                });
            }
            out = done
                .cv
                .wait_timeout(out, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let (rc, results) = out.take().unwrap_or_default();
        drop(out);
        if rc != SUCCESS && rc != sys::PMIX_ERR_PARTIAL_SUCCESS {
            return Err(status(OP, rc, ""));
        }
        results
            .into_iter()
            .find(|(rk, _)| rk == k)
            .map(|(_, v)| v)
            .ok_or_else(|| PmixError::NotFound {
                op: OP,
                key: k.to_owned(),
                who: "the host".into(),
            })
    }
}

/// The timeout of a group construct or destruct, in whole seconds (`uint32`), under a key
/// of Weft's own rather than `PMIX_TIMEOUT`: OpenPMIx 4.2.2's server arms its group
/// timer once per local member on one event (and hands the timer's callback the wrong
/// object), which corrupts its event loop (`PMIx_server_finalize` then spins for ever).
/// Weft's server reads this key as the timeout; under another host the caller's own
/// wait ends at the timeout (see [`bounded`]).
pub const GROUP_TIMEOUT_KEY: &[u8] = b"weft.grp.timeout\0";

/// How much longer than its timeout a caller waits for a group operation's end, so that
/// a host that enforces the timeout reports it first.
const GROUP_GRACE: Duration = Duration::from_secs(5);

/// `while_waiting`, which also gives up once `timeout` and [`GROUP_GRACE`] passed.
fn bounded(
    timeout: Option<Duration>,
    mut while_waiting: impl FnMut() -> Result<(), String>,
) -> impl FnMut() -> Result<(), String> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t + GROUP_GRACE);
    move || {
        while_waiting()?;
        match deadline {
            Some(d) if std::time::Instant::now() >= d => Err(TIMED_OUT.to_owned()),
            _ => Ok(()),
        }
    }
}

/// What [`bounded`] says when the timeout passed.
const TIMED_OUT: &str = "the timeout passed without an answer from the host";

/// A group call the caller stopped waiting for: a timeout when [`bounded`] ended it.
fn abandoned(op: &'static str, reason: String, t: Option<u32>) -> PmixError {
    if reason == TIMED_OUT {
        PmixError::Timeout {
            op,
            secs: t.unwrap_or(0),
        }
    } else {
        PmixError::Abandoned { op, reason }
    }
}

/// The outcome of a group call from the library's status (`t`: its timeout, whole
/// seconds).
fn group_result(op: &'static str, rc: sys::pmix_status_t, t: Option<u32>) -> Result<(), PmixError> {
    match rc {
        SUCCESS => Ok(()),
        sys::PMIX_ERR_NOT_SUPPORTED => Err(PmixError::NotSupported { op }),
        sys::PMIX_ERR_BAD_PARAM => Err(PmixError::Invalid { op }),
        sys::PMIX_ERR_TIMEOUT => Err(PmixError::Timeout {
            op,
            secs: t.unwrap_or(0),
        }),
        _ => Err(status(op, rc, "")),
    }
}

impl Pmix {
    /// Constructs group `id` over `ranks` of the job at the host
    /// (`PMIx_Group_construct_nb`): a collective of the members that also brings every
    /// member's committed data to this process, as a collecting fence does. Returns the
    /// context id the host assigned, when `opts` asked for one. A host without PMIx
    /// groups fails it with [`PmixError::NotSupported`]. Runs `while_waiting` about every
    /// millisecond meanwhile, and stops waiting ([`PmixError::Abandoned`]) when it says
    /// why, as [`fence_with`](Pmix::fence_with) does.
    pub fn group_construct_with(
        &self,
        id: &str,
        ranks: &[u32],
        opts: GroupOpts,
        while_waiting: impl FnMut() -> Result<(), String>,
    ) -> Result<Option<u64>, PmixError> {
        const OP: &str = "PMIx_Group_construct";
        let gid = key(OP, id)?;
        let procs: Vec<sys::pmix_proc_t> = ranks.iter().map(|&r| self.me(r)).collect();
        let mut info = Infos::new();
        if opts.assign_context_id {
            info.push_bool(sys::PMIX_GROUP_ASSIGN_CONTEXT_ID, true);
        }
        if opts.notify_termination {
            info.push_bool(sys::PMIX_GROUP_NOTIFY_TERMINATION, true);
        }
        let t = opts.timeout.map(secs);
        if let Some(t) = t {
            info.push_u32(GROUP_TIMEOUT_KEY, t);
        }
        let mut while_waiting = bounded(opts.timeout, while_waiting);
        let done = Arc::new(GroupDone::default());
        let cb = Arc::into_raw(done.clone())
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: the id, `procs` and `info` are valid for their lengths and outlive the
        // operation (this function returns only after the callback ran, or when the
        // library refused to start it, or it leaks them when it stops waiting); `cb` is a
        // counted reference the callback takes over (released below when the call fails
        // at once).
        let rc = unsafe {
            sys::PMIx_Group_construct_nb(
                gid.as_ptr(),
                procs.as_ptr(),
                procs.len(),
                info.as_ptr(),
                info.len(),
                Some(group_done),
                cb,
            )
        };
        let rc = if rc == SUCCESS {
            match done.done.wait(&mut while_waiting) {
                Ok(rc) => rc,
                Err(reason) => {
                    // The library may still read them until it completes: keep them.
                    std::mem::forget(procs);
                    std::mem::forget(info);
                    std::mem::forget(gid);
                    return Err(abandoned(OP, reason, t));
                }
            }
        } else {
            // SAFETY: the library did not take `cb` (no callback will run): release it.
            drop(unsafe { Arc::from_raw(cb.cast::<GroupDone>()) });
            rc
        };
        group_result(OP, rc, t)?;
        if !opts.assign_context_id {
            return Ok(None);
        }
        let ctxid = *done.ctxid.lock().unwrap_or_else(|p| p.into_inner());
        match ctxid {
            // The library's "none" (SIZE_MAX) is no id either.
            Some(c) if c != u64::MAX && c != usize::MAX as u64 => Ok(Some(c)),
            _ => Err(status(
                OP,
                sys::PMIX_ERR_BAD_PARAM,
                "the host assigned no context id although one was asked for",
            )),
        }
    }

    /// Destructs group `id` at the host (`PMIx_Group_destruct_nb`): a collective of its
    /// members (ended members are not waited for when it was made with
    /// `notify_termination`). Runs `while_waiting` meanwhile, as
    /// [`group_construct_with`](Pmix::group_construct_with) does.
    pub fn group_destruct_with(
        &self,
        id: &str,
        timeout: Option<Duration>,
        while_waiting: impl FnMut() -> Result<(), String>,
    ) -> Result<(), PmixError> {
        const OP: &str = "PMIx_Group_destruct";
        let gid = key(OP, id)?;
        let mut info = Infos::new();
        let t = timeout.map(secs);
        if let Some(t) = t {
            info.push_u32(GROUP_TIMEOUT_KEY, t);
        }
        let mut while_waiting = bounded(timeout, while_waiting);
        let done = Arc::new(Done::default());
        let cb = Arc::into_raw(done.clone())
            .cast_mut()
            .cast::<std::ffi::c_void>();
        // SAFETY: as in `group_construct_with`: the id and `info` outlive the operation
        // (or are leaked when the wait stops), `cb` is a counted reference the callback
        // takes over (released below when the call fails at once).
        let rc = unsafe {
            sys::PMIx_Group_destruct_nb(gid.as_ptr(), info.as_ptr(), info.len(), Some(op_done), cb)
        };
        let rc = if rc == SUCCESS {
            match done.wait(&mut while_waiting) {
                Ok(rc) => rc,
                Err(reason) => {
                    std::mem::forget(info);
                    std::mem::forget(gid);
                    return Err(abandoned(OP, reason, t));
                }
            }
        } else {
            // SAFETY: the library did not take `cb` (no callback will run): release it.
            drop(unsafe { Arc::from_raw(cb.cast::<Done>()) });
            rc
        };
        group_result(OP, rc, t)
    }
}
