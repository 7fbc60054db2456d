//! `PMIx_Publish`, `PMIx_Lookup` and `PMIx_Unpublish` through the host: the library's
//! upcalls and [`LookupReply`]. A string or byte object is handed to the host as it is
//! (the native API reads it too); a value of any other type travels packed by the library
//! (`PMIx_Data_pack`), so it comes back exactly as published.

use std::ffi::{c_char, c_void, CStr, CString};
use std::time::Duration;

use super::events::{pack, unpack};
use super::imp::{host, name_of};
use super::log::OpReply;
use super::spawn::strings_of;
use super::*;
use crate::client::SUCCESS;
use crate::owned::{proc_of, value_of, Infos};
use crate::sys;
use crate::PmixValue;

/// The directives among a publish's or lookup's infos (the library adds the client's
/// user and group ids).
struct Directives {
    range: Option<Range>,
    persist: Persist,
    wait: bool,
    timeout: Option<Duration>,
}

/// Whether `k` (with its NUL) is a directive, and what it sets.
fn directive(d: &mut Directives, k: &[u8], inf: &sys::pmix_info_t) -> bool {
    // SAFETY: the union member read is the one the type tag names.
    let v = unsafe { value_of(&inf.value) };
    if k == sys::PMIX_RANGE {
        if let PmixValue::U8(r) = v {
            d.range = Some(Range::from_raw(r));
        } else if let Some(r) = v.as_u32() {
            d.range = Some(Range::from_raw(r as u8));
        }
    } else if k == sys::PMIX_PERSISTENCE {
        let raw = match v {
            PmixValue::U8(p) => u32::from(p),
            other => other.as_u32().unwrap_or(sys::PMIX_PERSIST_SESSION),
        };
        d.persist = match raw {
            sys::PMIX_PERSIST_INDEF => Persist::Indef,
            sys::PMIX_PERSIST_FIRST_READ => Persist::FirstRead,
            sys::PMIX_PERSIST_PROC => Persist::Proc,
            sys::PMIX_PERSIST_APP => Persist::App,
            _ => Persist::Session,
        };
    } else if k == sys::PMIX_WAIT {
        // A flag (true unless false), or how many keys to wait for (0: all): all.
        d.wait = !matches!(v, PmixValue::Bool(false));
    } else if k == sys::PMIX_TIMEOUT {
        d.timeout = v
            .as_u32()
            .filter(|&s| s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
    } else {
        return k == sys::PMIX_USERID || k == sys::PMIX_GRPID;
    }
    true
}

/// The key of an info, without its NUL.
fn key_of(inf: &sys::pmix_info_t) -> &[u8] {
    // SAFETY: a valid info's key is NUL-terminated within its array.
    unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes()
}

/// The directives of `n` infos at `info`, and (with `data`) the others as names.
///
/// # Safety
/// `info` is null or points to `n` valid infos.
unsafe fn split(
    info: *const sys::pmix_info_t,
    n: usize,
    mut data: Option<&mut Vec<(String, PubValue)>>,
) -> Result<Directives, sys::pmix_status_t> {
    let mut d = Directives {
        range: None,
        persist: Persist::Session,
        wait: false,
        timeout: None,
    };
    for i in 0..if info.is_null() { 0 } else { n } {
        // SAFETY: the caller's contract: `n` valid infos.
        let inf = unsafe { &*info.add(i) };
        let k = key_of(inf);
        let mut with_nul = k.to_vec();
        with_nul.push(0);
        if directive(&mut d, &with_nul, inf) {
            continue;
        }
        let Some(data) = data.as_deref_mut() else {
            continue;
        };
        let key = String::from_utf8_lossy(k).into_owned();
        // SAFETY: as above.
        let value = match unsafe { value_of(&inf.value) } {
            PmixValue::Str(s) => PubValue::Str(s),
            PmixValue::Bytes(b) => PubValue::Bytes(b),
            // SAFETY: one valid info, packed (the library copies it).
            _ => PubValue::Packed(unsafe { pack(info.add(i).cast_mut(), 1) }?),
        };
        data.push((key, value));
    }
    Ok(d)
}

pub(super) unsafe extern "C" fn publish(
    proc_: *const sys::pmix_proc_t,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    if proc_.is_null() {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    let mut data = Vec::new();
    // SAFETY: the library passes `ninfo` valid infos.
    let d = match unsafe { split(info, ninfo, Some(&mut data)) } {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    h.publish(Publish {
        // SAFETY: checked non-null; the library's valid name.
        requester: unsafe { name_of(proc_) },
        range: d.range,
        persist: d.persist,
        data,
        reply: OpReply { cb, cbdata },
    });
    SUCCESS
}

/// The host, the requester, the keys and the directives.
type Keyed = (
    &'static std::sync::Arc<dyn Host>,
    ProcName,
    Vec<String>,
    Directives,
);

/// What a lookup or unpublish upcall was given: the host, the requester, the keys and the
/// directives, or the status to return at once.
///
/// # Safety
/// The library's arguments: `proc_` null or a valid name, `keys` null or a NULL-terminated
/// array of NUL-terminated keys, `info` null or `ninfo` valid infos.
unsafe fn keyed(
    proc_: *const sys::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const sys::pmix_info_t,
    ninfo: usize,
) -> Result<Keyed, sys::pmix_status_t> {
    let h = host().ok_or(sys::PMIX_ERR_NOT_SUPPORTED)?;
    if proc_.is_null() {
        return Err(sys::PMIX_ERR_BAD_PARAM);
    }
    // SAFETY: the caller's contract.
    let d = unsafe { split(info, ninfo, None) }?;
    // SAFETY: the caller's contract (checked non-null above).
    let (who, keys) = unsafe { (name_of(proc_), strings_of(keys)) };
    Ok((h, who, keys, d))
}

pub(super) unsafe extern "C" fn lookup(
    proc_: *const sys::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_lookup_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // SAFETY: the library's arguments, passed on.
    let (h, requester, keys, d) = match unsafe { keyed(proc_, keys, info, ninfo) } {
        Ok(k) => k,
        Err(rc) => return rc,
    };
    h.lookup(Lookup {
        requester,
        range: d.range,
        keys,
        wait: d.wait,
        timeout: d.timeout,
        reply: LookupReply { cb, cbdata },
    });
    SUCCESS
}

pub(super) unsafe extern "C" fn unpublish(
    proc_: *const sys::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // SAFETY: the library's arguments, passed on.
    let (h, requester, keys, d) = match unsafe { keyed(proc_, keys, info, ninfo) } {
        Ok(k) => k,
        Err(rc) => return rc,
    };
    h.unpublish(Unpublish {
        requester,
        range: d.range,
        keys,
        reply: OpReply { cb, cbdata },
    });
    SUCCESS
}

/// Where a lookup's names go: the library's callback, called exactly once (by
/// [`LookupReply::found`], [`LookupReply::fail`] or, unanswered, on drop with
/// `PMIX_ERROR`).
pub struct LookupReply {
    cb: sys::pmix_lookup_cbfunc_t,
    cbdata: *mut c_void,
}

impl std::fmt::Debug for LookupReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LookupReply")
    }
}

// SAFETY: as for `ModexReply`: the callback may be called from any thread.
unsafe impl Send for LookupReply {}

impl LookupReply {
    /// The names found (none: `PMIX_ERR_NOT_FOUND`).
    pub fn found(mut self, names: Vec<Found>) {
        let Some(cb) = self.cb.take() else { return };
        // Each value as an info of its own (strings and bytes loaded, others unpacked).
        let mut vals: Vec<Infos> = Vec::with_capacity(names.len());
        for n in &names {
            let Ok(key) = CString::new(n.key.as_str()) else {
                continue;
            };
            let k = key.as_bytes_with_nul();
            let one = match &n.value {
                PubValue::Str(s) => {
                    let mut i = Infos::new();
                    i.push_string(k, s).map(|()| i)
                }
                PubValue::Bytes(b) => {
                    let mut i = Infos::new();
                    i.push_bytes(k, b);
                    Some(i)
                }
                PubValue::Packed(p) => unpack(p).ok().filter(|i| i.len() == 1),
            };
            match one {
                Some(i) => vals.push(i),
                None => tracing::warn!("a published value of {:?} could not be rebuilt", n.key),
            }
        }
        let mut pdata: Vec<sys::pmix_pdata_t> = Vec::with_capacity(vals.len());
        for (n, v) in names.iter().zip(&vals) {
            // SAFETY: all zeroes is an empty pdata (PMIX_PDATA_CONSTRUCT).
            let mut pd: sys::pmix_pdata_t = unsafe { std::mem::zeroed() };
            let rank = n.publisher.rank.unwrap_or(sys::PMIX_RANK_WILDCARD);
            pd.proc_ = proc_of(n.publisher.nspace.as_bytes(), rank);
            for (d, &s) in pd
                .key
                .iter_mut()
                .zip(n.key.as_bytes().iter().take(sys::PMIX_MAX_KEYLEN as usize))
            {
                *d = s as c_char;
            }
            // SAFETY: `v` holds one valid info; its value is copied (deeply) into the
            // empty value of `pd`.
            unsafe { sys::PMIx_Value_xfer(&mut pd.value, &(*v.as_ptr()).value) };
            pdata.push(pd);
        }
        let st = if pdata.is_empty() {
            sys::PMIX_ERR_NOT_FOUND
        } else {
            SUCCESS
        };
        // SAFETY: `cb` and `cbdata` came together from the library, which expects this
        // call once and copies the names before it returns.
        unsafe { cb(st, pdata.as_mut_ptr(), pdata.len(), self.cbdata) };
        for pd in &mut pdata {
            // SAFETY: each value was loaded by `PMIx_Value_xfer` above, freed once.
            unsafe { sys::PMIx_Value_destruct(&mut pd.value) };
        }
    }

    /// The lookup failed.
    pub fn fail(mut self, why: Failure) {
        let Some(cb) = self.cb.take() else { return };
        // SAFETY: as in `found`; no names on failure.
        unsafe { cb(why.status(), std::ptr::null_mut(), 0, self.cbdata) };
    }
}

impl Drop for LookupReply {
    fn drop(&mut self) {
        if self.cb.is_some() {
            let me = LookupReply {
                cb: self.cb.take(),
                cbdata: self.cbdata,
            };
            me.fail(Failure::Other);
        }
    }
}
