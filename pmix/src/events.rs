//! The host's events (`PMIx_Register_event_handler`): what the host says about the job's
//! processes (a process aborted, was killed, ended) and about the connection to it. One
//! default handler per process records every event it is given; [`Pmix::events_since`]
//! reads them. The library calls the handler on its own progress thread.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::client::{error_string, status, SUCCESS};
use crate::{sys, Event, EventKind, Pmix, PmixError};

/// The statuses that mean the processes an event names have ended.
const END_STATUSES: [i32; 10] = [
    sys::PMIX_EVENT_PROC_TERMINATED,
    sys::PMIX_ERR_PROC_ABORTED,
    sys::PMIX_ERR_PROC_ABORTING,
    sys::PMIX_ERR_PROC_ABORTED_BY_SIG,
    sys::PMIX_ERR_PROC_KILLED_BY_CMD,
    sys::PMIX_ERR_PROC_TERM_WO_SYNC,
    sys::PMIX_ERR_EXIT_NONZERO_TERM,
    sys::PMIX_ERR_PROC_FAILED_TO_START,
    sys::PMIX_ERR_JOB_TERMINATED,
    sys::PMIX_ERR_PROC_REQUESTED_ABORT,
];

fn kind_of(st: sys::pmix_status_t) -> EventKind {
    if END_STATUSES.contains(&st) {
        EventKind::ProcEnded
    } else if st == sys::PMIX_ERR_LOST_CONNECTION || st == sys::PMIX_ERR_UNREACH {
        EventKind::ConnectionLost
    } else {
        EventKind::Other
    }
}

/// Every event the handler was given, in order.
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());
/// `EVENTS.len()`, readable without the lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// The handler's registration id, once registered.
static REGISTERED: Mutex<Option<usize>> = Mutex::new(None);

/// A process name as the library gave it.
///
/// # Safety
/// `p` points at a valid `pmix_proc_t`.
unsafe fn name_of(p: *const sys::pmix_proc_t) -> (String, u32) {
    // SAFETY: the caller's contract.
    unsafe { crate::owned::proc_name(&*p) }
}

/// The `pmix_notification_fn_t` of the default handler: records the event and tells the
/// library this handler is done with it.
unsafe extern "C" fn on_event(
    _id: usize,
    st: sys::pmix_status_t,
    source: *const sys::pmix_proc_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    _results: *mut sys::pmix_info_t,
    _nresults: usize,
    cbfunc: sys::pmix_event_notification_cbfunc_fn_t,
    cbdata: *mut std::ffi::c_void,
) {
    let mut ev = Event {
        kind: kind_of(st),
        status: st,
        message: error_string(st),
        source: None,
        affected: Vec::new(),
        exit_code: None,
    };
    if !source.is_null() {
        // SAFETY: a non-null source is a valid process name for the call's duration.
        ev.source = Some(unsafe { name_of(source) });
    }
    let infos: &[sys::pmix_info_t] = if info.is_null() || ninfo == 0 {
        &[]
    } else {
        // SAFETY: the library passes `ninfo` valid entries at `info` for the call.
        unsafe { std::slice::from_raw_parts(info, ninfo) }
    };
    for i in infos {
        // SAFETY: `key` is a NUL-terminated char array within the info.
        let k = unsafe { CStr::from_ptr(i.key.as_ptr()) }.to_bytes_with_nul();
        let ty = u32::from(i.value.type_);
        if k == sys::PMIX_EVENT_AFFECTED_PROC && ty == sys::PMIX_PROC {
            // SAFETY: a PMIX_PROC value holds a pointer to one process name (or null).
            let p = unsafe { i.value.data.proc_ };
            if !p.is_null() {
                // SAFETY: non-null, valid for the call.
                ev.affected.push(unsafe { name_of(p) });
            }
        } else if k == sys::PMIX_EVENT_AFFECTED_PROCS && ty == sys::PMIX_DATA_ARRAY {
            // SAFETY: a PMIX_DATA_ARRAY value holds a pointer to a data array (or null).
            let d = unsafe { i.value.data.darray };
            if !d.is_null() {
                // SAFETY: non-null, valid for the call.
                let d = unsafe { &*d };
                if u32::from(d.type_) == sys::PMIX_PROC && !d.array.is_null() {
                    let procs = d.array.cast::<sys::pmix_proc_t>();
                    for n in 0..d.size {
                        // SAFETY: the array holds `size` process names.
                        ev.affected.push(unsafe { name_of(procs.add(n)) });
                    }
                }
            }
        } else if k == sys::PMIX_EXIT_CODE && (ty == sys::PMIX_INT || ty == sys::PMIX_INT32) {
            // SAFETY: a PMIX_INT or PMIX_INT32 value is a 32-bit int.
            ev.exit_code = Some(unsafe { i.value.data.integer });
        }
    }
    tracing::debug!("PMIx event: {ev:?}");
    {
        let mut all = EVENTS.lock().unwrap_or_else(|p| p.into_inner());
        all.push(ev);
        // SYNC: pairs with the Acquire in `event_count`: a reader that sees the new count
        // finds the event under the lock.
        COUNT.store(all.len(), Ordering::Release);
    }
    if let Some(cb) = cbfunc {
        // SAFETY: the library's completion callback for this event, called once with its
        // own cbdata; no results are passed.
        unsafe {
            cb(
                sys::PMIX_EVENT_ACTION_COMPLETE,
                std::ptr::null_mut(),
                0,
                None,
                std::ptr::null_mut(),
                cbdata,
            )
        };
    }
}

impl Pmix {
    /// Registers the process's default event handler (once; later calls do nothing), so
    /// that [`events_since`](Pmix::events_since) sees what the host reports from now on.
    pub fn watch_events(&self) -> Result<(), PmixError> {
        let mut reg = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        if reg.is_some() {
            return Ok(());
        }
        // SAFETY: no codes (the default handler: every event) and no info; `on_event`
        // matches pmix_notification_fn_t; no registration callback makes the call
        // blocking, returning the handler's id (>= 0) or an error (< 0).
        let rc = unsafe {
            sys::PMIx_Register_event_handler(
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                0,
                Some(on_event),
                None,
                std::ptr::null_mut(),
            )
        };
        if rc < SUCCESS {
            return Err(status("PMIx_Register_event_handler", rc, ""));
        }
        *reg = Some(rc as usize);
        // The same handler once more for the codes that matter, named: a server of
        // OpenPMIx 4.2 records a client's default handler only where another default
        // registration already exists (none does), so its own notifications (`weft
        // run`'s, for one) reach no default handler. The handler completes the chain:
        // an event that reaches this registration does not reach the default one too.
        let mut codes: Vec<sys::pmix_status_t> = END_STATUSES.to_vec();
        codes.extend([sys::PMIX_ERR_LOST_CONNECTION, sys::PMIX_ERR_UNREACH]);
        // SAFETY: `codes` is valid for the call (the library copies it); as above.
        let rc = unsafe {
            sys::PMIx_Register_event_handler(
                codes.as_mut_ptr(),
                codes.len(),
                std::ptr::null_mut(),
                0,
                Some(on_event),
                None,
                std::ptr::null_mut(),
            )
        };
        if rc < SUCCESS {
            tracing::debug!(
                "PMIx_Register_event_handler for named codes: {}",
                status("PMIx_Register_event_handler", rc, "")
            );
        }
        Ok(())
    }

    /// How many events the host has reported so far (cheap: one atomic load).
    pub fn event_count(&self) -> usize {
        // SYNC: pairs with the Release in `on_event`.
        COUNT.load(Ordering::Acquire)
    }

    /// The events reported since the first `from` ones.
    pub fn events_since(&self, from: usize) -> Vec<Event> {
        let all = EVENTS.lock().unwrap_or_else(|p| p.into_inner());
        all.get(from..).map(<[Event]>::to_vec).unwrap_or_default()
    }
}
