//! Events between nodes: the library's `notify_event` upcall (a local client notified an
//! event whose range reaches beyond this node) and [`Server::notify_packed`], which
//! delivers such an event, carried by the host, to another node's clients.
//!
//! The event's infos travel packed by the library itself (`PMIx_Data_pack`), so every
//! attribute a client attached (`PMIX_EVENT_CUSTOM_RANGE`, `PMIX_GROUP_ID`,
//! `PMIX_EVENT_NON_DEFAULT`, ...) arrives as it was given. OpenPMIx 4.2's group invites
//! are made of such events only (`PMIX_GROUP_INVITED` from the leader to the invitees,
//! `PMIX_GROUP_INVITE_ACCEPTED` back, `PMIX_GROUP_CONSTRUCT_COMPLETE` to the members,
//! which every member's server library records as the group that a fence or destruct
//! may then name).

use std::ffi::{c_void, CStr};

use super::imp::{host, name_of, nspace_c, Server};
use super::{Failure, Notification, OpReply, ProcName, Range};
use crate::client::{status, SUCCESS};
use crate::owned::Infos;
use crate::sys;
use crate::PmixError;

/// `n` infos at `info` packed by the library: their count, then the infos.
///
/// # Safety
/// `info` is null or points to `n` valid infos.
pub(super) unsafe fn pack(
    info: *mut sys::pmix_info_t,
    n: usize,
) -> Result<Vec<u8>, sys::pmix_status_t> {
    // SAFETY: all zeroes is an empty buffer (PMIX_DATA_BUFFER_CONSTRUCT).
    let mut buf: sys::pmix_data_buffer_t = unsafe { std::mem::zeroed() };
    let mut count = if info.is_null() { 0 } else { n };
    // SAFETY: `buf` is a valid buffer; `count` is one PMIX_SIZE; the infos are the
    // caller's `n` valid ones (not packed when there are none).
    let mut rc = unsafe {
        sys::PMIx_Data_pack(
            std::ptr::null(),
            &mut buf,
            (&mut count as *mut usize).cast(),
            1,
            sys::PMIX_SIZE as u16,
        )
    };
    if rc == SUCCESS && count > 0 {
        // SAFETY: as above.
        rc = unsafe {
            sys::PMIx_Data_pack(
                std::ptr::null(),
                &mut buf,
                info.cast(),
                count as i32,
                sys::PMIX_INFO as u16,
            )
        };
    }
    // SAFETY: all zeroes is an empty byte object.
    let mut bo: sys::pmix_byte_object_t = unsafe { std::mem::zeroed() };
    if rc == SUCCESS {
        // SAFETY: `buf` is valid; its payload moves into `bo` (malloc'd).
        rc = unsafe { sys::PMIx_Data_unload(&mut buf, &mut bo) };
    }
    let out = if bo.bytes.is_null() {
        Vec::new()
    } else {
        // SAFETY: `bo.size` bytes at `bo.bytes`, malloc'd by the library.
        let v = unsafe { std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size) }.to_vec();
        // SAFETY: freed once, as PMIX_BYTE_OBJECT_DESTRUCT does.
        unsafe { libc::free(bo.bytes.cast()) };
        v
    };
    if !buf.base_ptr.is_null() {
        // SAFETY: what is left of the buffer (after an error), freed once as
        // PMIX_DATA_BUFFER_DESTRUCT does.
        unsafe { libc::free(buf.base_ptr.cast()) };
    }
    if rc == SUCCESS {
        Ok(out)
    } else {
        Err(rc)
    }
}

/// The infos [`pack`] packed.
pub(super) fn unpack(bytes: &[u8]) -> Result<Infos, sys::pmix_status_t> {
    if bytes.is_empty() {
        return Ok(Infos::new());
    }
    // SAFETY: the buffer takes over a malloc'd copy of the bytes (it frees it).
    let copy = unsafe { libc::malloc(bytes.len()) }.cast::<u8>();
    if copy.is_null() {
        return Err(sys::PMIX_ERR_NOMEM);
    }
    // SAFETY: `copy` has room for `bytes.len()` bytes; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), copy, bytes.len()) };
    // SAFETY: all zeroes is an empty buffer and an empty byte object.
    let (mut buf, mut bo): (sys::pmix_data_buffer_t, sys::pmix_byte_object_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    bo.bytes = copy.cast();
    bo.size = bytes.len();
    // SAFETY: `buf` is empty; it takes `bo`'s payload over.
    let mut rc = unsafe { sys::PMIx_Data_load(&mut buf, &mut bo) };
    let mut infos = Infos::new();
    if rc == SUCCESS {
        let mut count: usize = 0;
        let mut one: i32 = 1;
        // SAFETY: unpacks one PMIX_SIZE into `count`.
        rc = unsafe {
            sys::PMIx_Data_unpack(
                std::ptr::null(),
                &mut buf,
                (&mut count as *mut usize).cast(),
                &mut one,
                sys::PMIX_SIZE as u16,
            )
        };
        // A count that cannot be in the bytes is refused before anything is allocated.
        if rc == SUCCESS && count > bytes.len() {
            rc = sys::PMIX_ERR_BAD_PARAM;
        }
        if rc == SUCCESS && count > 0 {
            infos = Infos::empty(count);
            let mut n = count as i32;
            // SAFETY: `infos` holds `count` empty infos to unpack into.
            rc = unsafe {
                sys::PMIx_Data_unpack(
                    std::ptr::null(),
                    &mut buf,
                    infos.as_mut_ptr().cast(),
                    &mut n,
                    sys::PMIX_INFO as u16,
                )
            };
        }
    } else {
        // SAFETY: the load failed: the copy is still ours.
        unsafe { libc::free(copy.cast()) };
    }
    if !buf.base_ptr.is_null() {
        // SAFETY: the buffer's payload (our copy), freed once.
        unsafe { libc::free(buf.base_ptr.cast()) };
    }
    if rc == SUCCESS {
        Ok(infos)
    } else {
        Err(rc)
    }
}

/// The library's `notify_event` upcall. Answers `PMIX_OPERATION_IN_PROGRESS` (the
/// library waits for the callback only then), the status going through the reply.
pub(super) unsafe extern "C" fn notify_event(
    code: sys::pmix_status_t,
    source: *const sys::pmix_proc_t,
    range: sys::pmix_data_range_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let reply = OpReply { cb, cbdata };
    let Some(h) = host() else {
        reply.fail(Failure::NotSupported);
        return sys::PMIX_OPERATION_IN_PROGRESS;
    };
    // SAFETY: the library passes `ninfo` valid infos.
    let packed = match unsafe { pack(info, ninfo) } {
        Ok(p) => p,
        Err(rc) => {
            tracing::warn!("PMIx event {code}: its infos could not be packed (status {rc})");
            reply.fail(Failure::Other);
            return sys::PMIX_OPERATION_IN_PROGRESS;
        }
    };
    let (mut targets, mut group) = (None, None);
    for i in 0..if info.is_null() { 0 } else { ninfo } {
        // SAFETY: `ninfo` valid infos.
        let inf = unsafe { &*info.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_EVENT_CUSTOM_RANGE {
            if let crate::PmixValue::Procs(p) = v {
                targets = Some(
                    p.into_iter()
                        .map(|(nspace, rank)| ProcName {
                            nspace,
                            rank: (rank != sys::PMIX_RANK_WILDCARD).then_some(rank),
                        })
                        .collect(),
                );
            }
        } else if k == sys::PMIX_GROUP_ID {
            if let crate::PmixValue::Str(g) = v {
                group = Some(g);
            }
        }
    }
    h.notify_event(Notification {
        code,
        // SAFETY: the library passes a valid source.
        source: unsafe { name_of(source) },
        range: Range::from_raw(range),
        targets,
        group,
        info: packed,
        reply,
    });
    sys::PMIX_OPERATION_IN_PROGRESS
}

impl Server {
    /// Delivers event `code` of `source`, its infos as [`Notification::info`] packed
    /// them on another node, to this node's clients within `range` (the library
    /// checks a custom range, and records a group a `PMIX_GROUP_CONSTRUCT_COMPLETE`
    /// names). Does not wait.
    pub fn notify_packed(
        &self,
        code: i32,
        source: &ProcName,
        range: Range,
        info: &[u8],
    ) -> Result<(), PmixError> {
        const OP: &str = "PMIx_Notify_event";
        let mut p = super::imp::nspace_c(OP, &source.nspace)?;
        p.rank = source.rank.unwrap_or(sys::PMIX_RANK_WILDCARD);
        let mut infos = Box::new(
            unpack(info).map_err(|rc| crate::client::status(OP, rc, "unpacking its infos"))?,
        );
        unsafe extern "C" fn notified(_st: sys::pmix_status_t, cbdata: *mut c_void) {
            // SAFETY: `cbdata` is the `Box<Infos>` leaked below; called once.
            drop(unsafe { Box::from_raw(cbdata.cast::<Infos>()) });
        }
        let (ptr, n) = (infos.as_mut_ptr(), infos.len());
        let cbdata = Box::into_raw(infos) as *mut c_void;
        // SAFETY: the infos stay valid until `notified` frees them; `p` for the call.
        let rc = unsafe {
            sys::PMIx_Notify_event(code, &p, range.raw(), ptr, n, Some(notified), cbdata)
        };
        if rc != SUCCESS {
            // SAFETY: the callback will not run (done at once, or refused): the box is
            // ours again.
            drop(unsafe { Box::from_raw(cbdata.cast::<Infos>()) });
        }
        if rc != SUCCESS && rc != sys::PMIX_OPERATION_SUCCEEDED {
            return Err(crate::client::status(OP, rc, ""));
        }
        Ok(())
    }
}

/// Events this server raises itself.
impl Server {
    /// Tells the node's clients that rank `rank` of `nspace` ended without
    /// finalizing (`PMIX_ERR_PROC_ABORTED`, the process named as
    /// `PMIX_EVENT_AFFECTED_PROC`, with `PMIX_EXIT_CODE` when known). Does not wait.
    pub fn notify_ended(&self, nspace: &str, rank: u32, exit_code: Option<i32>) {
        let Ok(mut p) = nspace_c("PMIx_Notify_event", nspace) else {
            return;
        };
        p.rank = rank;
        let mut info = Infos::new();
        info.push_proc(sys::PMIX_EVENT_AFFECTED_PROC, &p);
        if let Some(c) = exit_code {
            info.push_int(sys::PMIX_EXIT_CODE, c);
        }
        // The source is the process that ended (a null source, this server, reaches no
        // client); the range every local client.
        notify(sys::PMIX_ERR_PROC_ABORTED, &p, sys::PMIX_RANGE_LOCAL, info);
    }

    /// Tells the local clients of `nspace` that allocation request `alloc_id` of its rank
    /// `rank` completed (`PMIX_NOTIFY_ALLOC_COMPLETE`, with `PMIX_ALLOC_ID` and, when it
    /// was granted, `PMIX_SESSION_ID`), as handlers waiting for it expect.
    pub fn notify_alloc_complete(
        &self,
        nspace: &str,
        rank: u32,
        alloc_id: &str,
        session: Option<u32>,
    ) {
        let Ok(mut p) = nspace_c("PMIx_Notify_event", nspace) else {
            return;
        };
        // The asking process as the source: OpenPMIx caches the event for a handler
        // registered later (a wildcard source is not delivered to it).
        p.rank = rank;
        let mut info = Infos::new();
        info.push_string(sys::PMIX_ALLOC_ID, alloc_id);
        if let Some(s) = session {
            info.push_u32(sys::PMIX_SESSION_ID, s);
        }
        notify(
            sys::PMIX_NOTIFY_ALLOC_COMPLETE,
            &p,
            sys::PMIX_RANGE_NAMESPACE,
            info,
        );
    }
}

impl Server {
    /// Tells `to` (a tool or a process that spawned job `nspace` asking to hear of its
    /// completion, `PMIX_NOTIFY_COMPLETION`) that the job ended with status `code`:
    /// `PMIX_ERR_JOB_TERMINATED` with the job as affected process and
    /// `PMIX_JOB_TERM_STATUS`, for `to` only (`PMIX_RANGE_CUSTOM`).
    pub fn notify_job_terminated(&self, to: &ProcName, nspace: &str, code: i32) {
        const OP: &str = "PMIx_Notify_event";
        let (Ok(mut src), Ok(mut target)) = (nspace_c(OP, nspace), nspace_c(OP, &to.nspace)) else {
            return;
        };
        src.rank = sys::PMIX_RANK_WILDCARD;
        target.rank = to.rank.unwrap_or(sys::PMIX_RANK_WILDCARD);
        let mut info = Infos::new();
        info.push_proc(sys::PMIX_EVENT_AFFECTED_PROC, &src);
        info.push_int(sys::PMIX_JOB_TERM_STATUS, code);
        info.push_proc(sys::PMIX_EVENT_CUSTOM_RANGE, &target);
        notify(
            sys::PMIX_ERR_JOB_TERMINATED,
            &src,
            sys::PMIX_RANGE_CUSTOM,
            info,
        );
    }

    /// Releases processes `ranks` of job `nspace` waiting in `PMIx_Init` for a debugger:
    /// `PMIX_DEBUGGER_RELEASE` to them only (`PMIX_RANGE_CUSTOM`), as a debugger sends it.
    pub fn notify_release(&self, nspace: &str, ranks: &[u32]) {
        const OP: &str = "PMIx_Notify_event";
        let Ok(src) = nspace_c(OP, nspace) else {
            return;
        };
        let targets: Vec<sys::pmix_proc_t> = ranks
            .iter()
            .map(|&r| {
                let mut p = src;
                p.rank = r;
                p
            })
            .collect();
        // The source: a debugger of Weft's, not a process of the job (the library gives
        // no event to its source, and a wildcard source of the job would be all of it).
        let Ok(source) = nspace_c(OP, "weft-debugger") else {
            return;
        };
        let mut info = Infos::new();
        info.push_procs(sys::PMIX_EVENT_CUSTOM_RANGE, &targets);
        info.push_bool(sys::PMIX_EVENT_NON_DEFAULT, true);
        notify(
            sys::PMIX_DEBUGGER_RELEASE,
            &source,
            sys::PMIX_RANGE_CUSTOM,
            info,
        );
    }

    /// Output `bytes` of process `rank` of job `nspace` (its stderr or stdout), for the
    /// tools that asked for it (a spawn with `PMIX_FWD_STDOUT`/`PMIX_FWD_STDERR`, which
    /// the library recorded): `PMIx_server_IOF_deliver`, not waited for.
    pub fn iof_deliver(&self, nspace: &str, rank: u32, stderr: bool, bytes: Vec<u8>) {
        const OP: &str = "PMIx_server_IOF_deliver";
        let Ok(mut src) = nspace_c(OP, nspace) else {
            return;
        };
        src.rank = rank;
        struct Held {
            src: sys::pmix_proc_t,
            bytes: Vec<u8>,
            bo: sys::pmix_byte_object_t,
        }
        unsafe extern "C" fn delivered(_st: sys::pmix_status_t, cbdata: *mut c_void) {
            // SAFETY: `cbdata` is the `Box<Held>` leaked below; called once.
            drop(unsafe { Box::from_raw(cbdata.cast::<Held>()) });
        }
        let mut held = Box::new(Held {
            src,
            bytes,
            // SAFETY: all zeroes is an empty byte object; it points into `bytes` below.
            bo: unsafe { std::mem::zeroed() },
        });
        held.bo.bytes = held.bytes.as_mut_ptr().cast();
        held.bo.size = held.bytes.len();
        let channel = if stderr {
            sys::PMIX_FWD_STDERR_CHANNEL
        } else {
            sys::PMIX_FWD_STDOUT_CHANNEL
        };
        let (src, bo) = (&held.src as *const _, &held.bo as *const _);
        let cbdata = Box::into_raw(held) as *mut c_void;
        // SAFETY: the source, the byte object and the bytes it points at live in the box,
        // which stays until `delivered` frees it (the library reads them until then).
        let rc = unsafe {
            sys::PMIx_server_IOF_deliver(
                src,
                channel as sys::pmix_iof_channel_t,
                bo,
                std::ptr::null(),
                0,
                Some(delivered),
                cbdata,
            )
        };
        if rc != SUCCESS {
            // SAFETY: the callback will not run: the box is ours again.
            drop(unsafe { Box::from_raw(cbdata.cast::<Held>()) });
            tracing::warn!("{OP}: {}", status(OP, rc, ""));
        }
    }
}

/// Notifies event `code` from `source` to the clients `range` reaches, with `info`;
/// does not wait (the infos are freed by the library's callback, or here when it will
/// not call it).
fn notify(code: sys::pmix_status_t, source: &sys::pmix_proc_t, range: u32, info: Infos) {
    const OP: &str = "PMIx_Notify_event";
    unsafe extern "C" fn notified(_st: sys::pmix_status_t, cbdata: *mut c_void) {
        // SAFETY: `cbdata` is the `Box<Infos>` leaked below; called once.
        drop(unsafe { Box::from_raw(cbdata.cast::<Infos>()) });
    }
    let mut info = Box::new(info);
    let (ptr, n) = (info.as_mut_ptr(), info.len());
    let cbdata = Box::into_raw(info) as *mut c_void;
    // SAFETY: the infos stay valid until `notified` frees them; `source` for the call
    // (copied by the library).
    let rc = unsafe {
        sys::PMIx_Notify_event(
            code,
            source,
            range as sys::pmix_data_range_t,
            ptr,
            n,
            Some(notified),
            cbdata,
        )
    };
    if rc != SUCCESS {
        // SAFETY: the callback will not run (done at once, or failed): the box is ours
        // again.
        drop(unsafe { Box::from_raw(cbdata.cast::<Infos>()) });
        if rc != sys::PMIX_OPERATION_SUCCEEDED {
            tracing::warn!("{OP}: {}", status(OP, rc, ""));
        }
    }
}
