//! `PMIx_Allocation_request` through the host: the library's `allocate` upcall, its
//! directive and infos read into an [`Allocate`], answered through the info callback.

use std::ffi::{c_void, CStr};

use super::imp::{host, name_of};
use super::{AllocDirective, Allocate, GroupReply};
use crate::client::SUCCESS;
use crate::sys;

/// The directive's meaning.
pub(super) fn directive(d: u8) -> AllocDirective {
    match u32::from(d) {
        sys::PMIX_ALLOC_NEW => AllocDirective::New,
        sys::PMIX_ALLOC_EXTEND => AllocDirective::Extend,
        sys::PMIX_ALLOC_RELEASE => AllocDirective::Release,
        _ => AllocDirective::Other(d),
    }
}

pub(super) unsafe extern "C" fn allocate(
    client: *const sys::pmix_proc_t,
    dir: sys::pmix_alloc_directive_t,
    data: *const sys::pmix_info_t,
    ndata: usize,
    cb: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    if client.is_null() {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    let mut req = Allocate {
        // SAFETY: the library passes the client's valid name (checked non-null).
        requester: unsafe { name_of(client) },
        directive: directive(dir),
        nodes: None,
        alloc_id: None,
        req_id: None,
        session: None,
        separate: false,
        ignored: Vec::new(),
        reply: GroupReply::new(cb, cbdata),
    };
    for i in 0..if data.is_null() { 0 } else { ndata } {
        // SAFETY: the library passes `ndata` valid infos.
        let inf = unsafe { &*data.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        if k == b"\0" {
            // An info left empty (OpenPMIx's alloc.c passes one).
            continue;
        }
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_ALLOC_NUM_NODES {
            req.nodes = v.as_u32().map(u64::from);
        } else if k == sys::PMIX_ALLOC_ID {
            if let crate::PmixValue::Str(s) = v {
                req.alloc_id = Some(s);
            }
        } else if k == sys::PMIX_ALLOC_REQ_ID {
            if let crate::PmixValue::Str(s) = v {
                req.req_id = Some(s);
            }
        } else if k == sys::PMIX_SESSION_ID {
            req.session = v.as_u32();
        } else if k == super::ALLOC_CHILD_SEP {
            req.separate = !matches!(v, crate::PmixValue::Bool(false));
        } else {
            let name = String::from_utf8_lossy(k.strip_suffix(b"\0").unwrap_or(k));
            req.ignored.push(name.into_owned());
        }
    }
    h.allocate(req);
    SUCCESS
}
