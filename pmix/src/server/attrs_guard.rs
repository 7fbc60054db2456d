//! A guard for the server against OpenPMIx 4.2's attribute queries
//! (`PMIX_QUERY_ATTRIBUTE_SUPPORT`, what `pattrs` asks): the library answers them itself
//! and then calls the server's reply function with the wrong callback data (its own
//! query object instead of the caller's), which makes the server library write to a
//! stray pointer and kill the process: every job of the node with it. The `weft`
//! executable exports this `PMIx_Query_info_nb` (its link line names it,
//! `cli/build.rs`), so the library's own call resolves here: attribute queries are
//! refused as not supported, every other query goes on to the library's function.
//! In a program that does not export it, nothing changes.
//!
//! The same function takes a shortcut for the process tables (`PMIX_QUERY_PROC_TABLE`,
//! `PMIX_QUERY_LOCAL_PROC_TABLE`): before asking the host, OpenPMIx 4.2 looks such a
//! key up in its own store under every rank of the namespace the query names, each
//! lookup finding the key's index by a linear scan of ~400 attribute names with
//! `strcmp`: for 1,024 processes that search was 60% of the server's 8.3 ms per query
//! (perf), and it never finds anything (only the host knows a process table). Queries
//! made of those keys only go to the host's query function directly, as the library
//! would after its search.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use crate::sys;

type QueryNb = unsafe extern "C" fn(
    *mut sys::pmix_query_t,
    usize,
    sys::pmix_info_cbfunc_t,
    *mut c_void,
) -> sys::pmix_status_t;

/// The library's own `PMIx_Query_info_nb`.
fn real() -> Option<QueryNb> {
    static REAL: OnceLock<usize> = OnceLock::new();
    let addr = *REAL.get_or_init(|| {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only looks a symbol up.
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"PMIx_Query_info_nb".as_ptr()) as usize }
    });
    // SAFETY: a non-null address of the symbol of that name in libpmix, whose type is
    // the function's (pmix_common.h).
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, QueryNb>(addr) })
}

/// Whether any of the `n` queries asks for attribute support.
///
/// # Safety
/// `queries` points at `n` valid queries (or is null).
unsafe fn asks_attributes(queries: *const sys::pmix_query_t, n: usize) -> bool {
    if queries.is_null() {
        return false;
    }
    (0..n).any(|i| {
        // SAFETY: `n` valid queries, each with a NULL-terminated key array (or none).
        let q = unsafe { &*queries.add(i) };
        let first = if q.keys.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: a non-null key array holds at least its NULL terminator.
            unsafe { *q.keys }
        };
        // SAFETY: a non-null key is a NUL-terminated string.
        !first.is_null()
            && unsafe { CStr::from_ptr(first) }.to_bytes_with_nul()
                == sys::PMIX_QUERY_ATTRIBUTE_SUPPORT
    })
}

/// Whether each of the `n` queries asks only for process tables, which only the host
/// answers.
///
/// # Safety
/// `queries` points at `n` valid queries (or is null).
unsafe fn host_only(queries: *const sys::pmix_query_t, n: usize) -> bool {
    if queries.is_null() || n == 0 {
        return false;
    }
    (0..n).all(|i| {
        // SAFETY: `n` valid queries.
        let q = unsafe { &*queries.add(i) };
        if q.keys.is_null() {
            return false;
        }
        let mut k = 0;
        loop {
            // SAFETY: a NULL-terminated key array.
            let key = unsafe { *q.keys.add(k) };
            if key.is_null() {
                return k > 0;
            }
            // SAFETY: a non-null key is a NUL-terminated string.
            let key = unsafe { CStr::from_ptr(key) }.to_bytes_with_nul();
            if key != sys::PMIX_QUERY_PROC_TABLE && key != sys::PMIX_QUERY_LOCAL_PROC_TABLE {
                return false;
            }
            k += 1;
        }
    })
}

/// `PMIx_Query_info_nb`, as the library's callers see it where the executable exports
/// this one (see the module's text).
///
/// # Safety
/// As the library's function: `queries` holds `nqueries` valid queries; `cbfunc` and
/// `cbdata` go together.
#[no_mangle]
#[allow(unreachable_pub)] // exported by symbol name, for the library
pub unsafe extern "C" fn PMIx_Query_info_nb(
    queries: *mut sys::pmix_query_t,
    nqueries: usize,
    cbfunc: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // SAFETY: the caller passes `nqueries` valid queries.
    if unsafe { asks_attributes(queries, nqueries) } {
        if let Some(cb) = cbfunc {
            // SAFETY: the caller's callback with its own data, once, with no results
            // (nothing to release).
            unsafe {
                cb(
                    sys::PMIX_ERR_NOT_SUPPORTED,
                    std::ptr::null_mut(),
                    0,
                    cbdata,
                    None,
                    std::ptr::null_mut(),
                )
            };
        }
        return crate::client::SUCCESS;
    }
    // SAFETY: as above.
    if unsafe { host_only(queries, nqueries) } {
        // The host's function, as the library calls it after its own search: the
        // requester is the server itself (a name of no job).
        // SAFETY: all zeroes is an empty name; the namespace is NUL-terminated.
        let mut me: sys::pmix_proc_t = unsafe { std::mem::zeroed() };
        for (d, s) in me.nspace.iter_mut().zip(b"weft-server".iter()) {
            *d = *s as std::ffi::c_char;
        }
        me.rank = sys::PMIX_RANK_WILDCARD;
        // SAFETY: the caller's valid queries and callback; `me` is only read during the
        // call (the host copies the name).
        return unsafe { super::query::query(&mut me, queries, nqueries, cbfunc, cbdata) };
    }
    match real() {
        // SAFETY: the library's function, with the caller's arguments unchanged.
        Some(f) => unsafe { f(queries, nqueries, cbfunc, cbdata) },
        None => sys::PMIX_ERR_NOT_SUPPORTED,
    }
}

/// Keeps the guard in every program that starts a server (an unreferenced object of the
/// crate could be left out of the link).
pub(super) fn keep() {
    std::hint::black_box(PMIx_Query_info_nb as *const () as usize);
}
