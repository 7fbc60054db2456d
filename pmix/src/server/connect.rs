//! `PMIx_Connect` and `PMIx_Disconnect` through the host: the library gathers this node's
//! participants and calls the upcall once; the host completes the collective across the
//! participants' nodes and answers the status.

use std::ffi::c_void;

use super::imp::{directives, host, names_of};
use super::log::OpReply;
use super::*;
use crate::client::SUCCESS;
use crate::sys;

/// The upcall of either call.
///
/// # Safety
/// The library's arguments: `procs` points to `nprocs` valid names, `info` is null or
/// points to `ninfo` valid infos.
unsafe fn call(
    disconnect: bool,
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    if procs.is_null() || nprocs == 0 {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    // SAFETY: the caller's contract.
    let (_, timeout) = unsafe { directives(info, ninfo) };
    h.connect(Connect {
        // SAFETY: the caller's contract.
        procs: unsafe { names_of(procs, nprocs) },
        disconnect,
        timeout,
        reply: OpReply { cb, cbdata },
    });
    SUCCESS
}

pub(super) unsafe extern "C" fn connect(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // SAFETY: the library's arguments, passed on.
    unsafe { call(false, procs, nprocs, info, ninfo, cb, cbdata) }
}

pub(super) unsafe extern "C" fn disconnect(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // SAFETY: the library's arguments, passed on.
    unsafe { call(true, procs, nprocs, info, ninfo, cb, cbdata) }
}
