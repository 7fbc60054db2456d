//! Tools (`PMIx_tool_init` against this server: `pps`, `pquery`, debuggers): the
//! library's `tool_connected` upcall, read into a [`ToolConnect`], answered with the
//! name the tool is to use.

use std::ffi::{c_void, CStr};

use super::imp::host;
use super::{Failure, ProcName, ToolConnect};
use crate::client::SUCCESS;
use crate::sys;

/// Where a connecting tool's name goes. Dropped unanswered, the tool is refused.
pub struct ToolReply {
    cb: sys::pmix_tool_connection_cbfunc_t,
    cbdata: *mut c_void,
}

// SAFETY: the callback and its data may be used from any thread (the library
// thread-shifts inside its callback), and once: `finish` takes the callback.
unsafe impl Send for ToolReply {}

impl std::fmt::Debug for ToolReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolReply")
    }
}

impl ToolReply {
    /// The tool is accepted under `name` (its rank must be a real one).
    pub fn ok(mut self, name: ProcName) {
        let mut p = crate::owned::proc_of(name.nspace.as_bytes(), name.rank.unwrap_or(0));
        self.finish(SUCCESS, &mut p);
    }

    /// The tool is refused.
    pub fn fail(mut self, why: Failure) {
        let mut p = crate::owned::proc_of(b"", 0);
        self.finish(why.status(), &mut p);
    }

    fn finish(&mut self, st: sys::pmix_status_t, p: &mut sys::pmix_proc_t) {
        let Some(cb) = self.cb.take() else { return };
        // SAFETY: `cb` and `cbdata` came together from the library, which expects this
        // call once; it copies the name before returning.
        unsafe { cb(st, p, self.cbdata) };
    }
}

impl Drop for ToolReply {
    fn drop(&mut self) {
        if self.cb.is_some() {
            let mut p = crate::owned::proc_of(b"", 0);
            self.finish(Failure::Other.status(), &mut p);
        }
    }
}

pub(super) unsafe extern "C" fn tool_connected(
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_tool_connection_cbfunc_t,
    cbdata: *mut c_void,
) {
    let reply = ToolReply { cb, cbdata };
    let Some(h) = host() else {
        return reply.fail(Failure::NotSupported);
    };
    let mut nspace = None;
    let mut rank = None;
    let mut req = ToolConnect {
        name: None,
        pid: None,
        cmdline: None,
        reply,
    };
    for i in 0..if info.is_null() { 0 } else { ninfo } {
        // SAFETY: the library passes `ninfo` valid infos.
        let inf = unsafe { &*info.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_NSPACE {
            if let crate::PmixValue::Str(s) = v {
                nspace = Some(s);
            }
        } else if k == sys::PMIX_RANK {
            rank = v.as_u32();
        } else if k == sys::PMIX_PROC_PID {
            req.pid = if u32::from(inf.value.type_) == sys::PMIX_PID {
                // SAFETY: the type tag says the union holds a pid.
                u32::try_from(unsafe { inf.value.data.pid }).ok()
            } else {
                v.as_u32()
            };
        } else if k == sys::PMIX_CMD_LINE {
            if let crate::PmixValue::Str(s) = v {
                req.cmdline = Some(s);
            }
        }
    }
    req.name = nspace.map(|nspace| ProcName {
        nspace,
        rank: Some(rank.unwrap_or(0)),
    });
    h.tool_connected(req);
}
