//! `PMIx_Log` served by the host: the library's `log` upcall, the reply it takes, and the
//! time stamp the output carries.
//!
//! OpenPMIx 4.2's server runs a client's `PMIx_Log` through its `plog` framework first:
//! its `syslog` component writes `PMIX_LOG_SYSLOG` and `PMIX_LOG_LOCAL_SYSLOG` entries to
//! the node's syslog, its `stdfd` component serves only gateways and tools, and its
//! `default` component (active when the host has this upcall) hands every entry to the
//! host. Without the upcall a stderr message was dropped and the call still succeeded.

use std::ffi::{c_void, CStr};

use super::{Failure, Log, LogChannel, ProcName};
use crate::client::SUCCESS;
use crate::sys;

/// Where a log's or event notification's status goes: the library's callback, called
/// exactly once (by [`OpReply::ok`], [`OpReply::fail`] or, unanswered, on drop with
/// `PMIX_ERROR`).
pub struct OpReply {
    pub(super) cb: sys::pmix_op_cbfunc_t,
    pub(super) cbdata: *mut c_void,
}

impl std::fmt::Debug for OpReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpReply")
    }
}

// SAFETY: as for `ModexReply`: the library's op callbacks may be called from any
// thread; `cbdata` is only passed back to that callback.
unsafe impl Send for OpReply {}

impl OpReply {
    /// The operation succeeded.
    pub fn ok(self) {
        self.finish(SUCCESS);
    }

    /// The operation failed.
    pub fn fail(self, why: Failure) {
        self.finish(why.status());
    }

    fn finish(mut self, st: sys::pmix_status_t) {
        let Some(cb) = self.cb.take() else { return };
        // SAFETY: `cb` and `cbdata` came together from the library, which expects this
        // call once (`take` above makes it once).
        unsafe { cb(st, self.cbdata) };
    }
}

impl Drop for OpReply {
    fn drop(&mut self) {
        if let Some(cb) = self.cb.take() {
            // SAFETY: as in `finish`: the one call of the callback.
            unsafe { cb(sys::PMIX_ERROR, self.cbdata) };
        }
    }
}

/// OpenPMIx's internal flag on an info some `plog` component already served
/// (`PMIX_INFO_OP_COMPLETE`, src/include/pmix_globals.h in 4.2).
const INFO_OP_COMPLETE: u32 = 0x8000_0000;

/// The channel a data key names.
fn channel_of(key: &[u8]) -> LogChannel {
    let with_nul = |c: &[u8]| c.strip_suffix(b"\0").unwrap_or(c) == key;
    if with_nul(sys::PMIX_LOG_STDERR) {
        LogChannel::Stderr
    } else if with_nul(sys::PMIX_LOG_STDOUT) {
        LogChannel::Stdout
    } else if with_nul(sys::PMIX_LOG_SYSLOG) {
        LogChannel::Syslog
    } else if with_nul(sys::PMIX_LOG_LOCAL_SYSLOG) {
        LogChannel::LocalSyslog
    } else if with_nul(sys::PMIX_LOG_GLOBAL_SYSLOG) {
        LogChannel::GlobalSyslog
    } else {
        LogChannel::Other(String::from_utf8_lossy(key).into_owned())
    }
}

/// The library's `log` upcall: a local client's `PMIx_Log`, handed to the host.
pub(super) unsafe extern "C" fn log(
    client: *const sys::pmix_proc_t,
    data: *const sys::pmix_info_t,
    ndata: usize,
    dirs: *const sys::pmix_info_t,
    ndirs: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) {
    let reply = OpReply { cb, cbdata };
    let Some(h) = super::imp::host() else {
        return reply.fail(Failure::NotSupported);
    };
    let mut req = Log {
        // SAFETY: the library passes a valid name of the client.
        source: unsafe { super::imp::name_of(client) },
        entries: Vec::new(),
        timestamp: None,
        timestamp_output: false,
        syslog_priority: None,
        once: false,
        reply,
    };
    for i in 0..if data.is_null() { 0 } else { ndata } {
        // SAFETY: the library passes `ndata` valid infos.
        let inf = unsafe { &*data.add(i) };
        if inf.flags & INFO_OP_COMPLETE != 0 {
            continue;
        }
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes();
        // SAFETY: the union member read is the one the type tag names.
        let text = match unsafe { crate::owned::value_of(&inf.value) } {
            crate::PmixValue::Str(s) => s,
            _ => String::new(),
        };
        req.entries.push((channel_of(k), text));
    }
    for i in 0..if dirs.is_null() { 0 } else { ndirs } {
        // SAFETY: the library passes `ndirs` valid infos.
        let inf = unsafe { &*dirs.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        let on = || !matches!(v, crate::PmixValue::Bool(false));
        if k == sys::PMIX_LOG_TIMESTAMP && u32::from(inf.value.type_) == sys::PMIX_TIME {
            // SAFETY: a PMIX_TIME value holds `time`.
            let t = unsafe { inf.value.data.time };
            req.timestamp = (t > 0).then_some(t);
        } else if k == sys::PMIX_LOG_TIMESTAMP_OUTPUT {
            req.timestamp_output = on();
        } else if k == sys::PMIX_LOG_ONCE {
            req.once = on();
        } else if k == sys::PMIX_LOG_SYSLOG_PRI {
            if let crate::PmixValue::I32(p) = v {
                req.syslog_priority = Some(p);
            }
        } else if k == sys::PMIX_LOG_SOURCE {
            if let crate::PmixValue::Procs(p) = v {
                if let Some((nspace, rank)) = p.into_iter().next() {
                    req.source = ProcName {
                        nspace,
                        rank: (rank != sys::PMIX_RANK_WILDCARD).then_some(rank),
                    };
                }
            }
        }
    }
    h.log(req);
}

/// `secs` since the epoch as `ctime` writes it in the local time zone, without its
/// newline ("Fri Nov 27 16:14:45 2026"): the time stamp OpenPMIx and PRRTE put in
/// front of output.
pub fn log_time(secs: i64) -> String {
    let t: libc::time_t = secs;
    let mut buf = [0 as libc::c_char; 64];
    // SAFETY: `ctime_r` writes at most 26 bytes into `buf` (64), NUL-terminated, and
    // reads `t`; it returns null for a time it cannot represent.
    let p = unsafe { libc::ctime_r(&t, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("{secs}");
    }
    // SAFETY: `ctime_r` succeeded: `buf` holds a NUL-terminated string.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .trim_end()
        .to_string()
}
