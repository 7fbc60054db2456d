//! Queries (`PMIx_Query_info` of clients and tools): the library's `query` upcall read
//! into a [`Query`] for the host, the host's [`QueryAnswer`]s encoded as the infos the
//! library passes back, and the functions and attributes the host says it serves.

use std::ffi::{c_char, c_void, CStr};

use super::imp::{host, name_of};
use super::{GroupReply, Query, QueryAnswer, QueryKey};
use crate::client::SUCCESS;
use crate::owned::Infos;
use crate::sys;

/// The infos that carry `answers` back to the library.
pub(super) fn encode(answers: Vec<QueryAnswer>) -> Infos {
    let mut info = Infos::new();
    for a in answers {
        match a {
            // OpenPMIx 4.2 documents a comma-delimited list.
            QueryAnswer::PsetNames(names) => {
                info.push_string(sys::PMIX_QUERY_PSET_NAMES, &names.join(","));
            }
            QueryAnswer::NumPsets(n) => info.push_size(sys::PMIX_QUERY_NUM_PSETS, n),
            QueryAnswer::PsetMembers(procs) => {
                let procs: Vec<sys::pmix_proc_t> = procs
                    .iter()
                    .map(|p| {
                        crate::owned::proc_of(
                            p.nspace.as_bytes(),
                            p.rank.unwrap_or(sys::PMIX_RANK_WILDCARD),
                        )
                    })
                    .collect();
                info.push_procs(sys::PMIX_QUERY_PSET_MEMBERSHIP, &procs);
            }
            QueryAnswer::AllocStatus(s) => {
                info.push_string(sys::PMIX_QUERY_ALLOC_STATUS, &s);
            }
            QueryAnswer::Namespaces(ns) => {
                info.push_string(sys::PMIX_QUERY_NAMESPACES, &ns.join(","));
            }
            QueryAnswer::NamespaceInfo(ns) => {
                // One info array per namespace: its name and command line (as
                // PRRTE answers; OpenPMIx's tool.c prints each entry as a string).
                let mut outer = Infos::new();
                for (nspace, cmd) in ns {
                    let mut inner = Infos::new();
                    inner.push_string(sys::PMIX_NSPACE, &nspace);
                    inner.push_string(sys::PMIX_CMD_LINE, &cmd);
                    outer.push_infos(sys::PMIX_QUERY_NAMESPACE_INFO, &mut inner);
                }
                info.push_infos(sys::PMIX_QUERY_NAMESPACE_INFO, &mut outer);
            }
            QueryAnswer::ProcTable { local, procs } => {
                let key = if local {
                    &sys::PMIX_QUERY_LOCAL_PROC_TABLE[..]
                } else {
                    &sys::PMIX_QUERY_PROC_TABLE[..]
                };
                info.push_proc_infos(key, &procs);
            }
            QueryAnswer::SpawnSupport(keys) => {
                info.push_string(sys::PMIX_QUERY_SPAWN_SUPPORT, &keys.join(","));
            }
            QueryAnswer::DebugSupport(keys) => {
                info.push_string(sys::PMIX_QUERY_DEBUG_SUPPORT, &keys.join(","));
            }
            QueryAnswer::JobSize(n) => info.push_u32(sys::PMIX_JOB_SIZE, n),
            QueryAnswer::JobStatus(st) => info.push_status(sys::PMIX_QUERY_JOB_STATUS, st),
            QueryAnswer::Allocated {
                session,
                alloc_id,
                nodes,
            } => {
                info.push_u32(sys::PMIX_SESSION_ID, session);
                info.push_string(sys::PMIX_ALLOC_ID, &alloc_id);
                info.push_string(sys::PMIX_ALLOC_NODE_LIST, &nodes.join(","));
            }
        }
    }
    info
}

pub(super) unsafe extern "C" fn query(
    proct: *mut sys::pmix_proc_t,
    queries: *mut sys::pmix_query_t,
    nqueries: usize,
    cb: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    let mut keys = Vec::new();
    for qi in 0..nqueries {
        if queries.is_null() {
            break;
        }
        // SAFETY: the library passes `nqueries` valid queries.
        let q = unsafe { &*queries.add(qi) };
        let mut pset = None;
        let mut alloc_id = None;
        let mut nspace = None;
        for i in 0..q.nqual {
            if q.qualifiers.is_null() {
                break;
            }
            // SAFETY: `nqual` valid qualifiers.
            let inf = unsafe { &*q.qualifiers.add(i) };
            // SAFETY: a valid info's key is NUL-terminated within its array.
            let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
            if k == sys::PMIX_PSET_NAME {
                // SAFETY: the union member read is the one the type tag names.
                if let crate::PmixValue::Str(n) = unsafe { crate::owned::value_of(&inf.value) } {
                    pset = Some(n);
                }
            } else if k == sys::PMIX_ALLOC_ID {
                // SAFETY: the union member read is the one the type tag names.
                if let crate::PmixValue::Str(n) = unsafe { crate::owned::value_of(&inf.value) } {
                    alloc_id = Some(n);
                }
            } else if k == sys::PMIX_NSPACE {
                // SAFETY: the union member read is the one the type tag names.
                if let crate::PmixValue::Str(n) = unsafe { crate::owned::value_of(&inf.value) } {
                    nspace = Some(n);
                }
            }
        }
        let mut i = 0;
        while !q.keys.is_null() {
            // SAFETY: a NULL-terminated array of NUL-terminated keys.
            let k = unsafe { *q.keys.add(i) };
            if k.is_null() {
                break;
            }
            keys.push(QueryKey {
                // SAFETY: as above.
                key: unsafe { CStr::from_ptr(k) }.to_string_lossy().into_owned(),
                pset: pset.clone(),
                alloc_id: alloc_id.clone(),
                nspace: nspace.clone(),
            });
            i += 1;
        }
    }
    if proct.is_null() {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    h.query(Query {
        // SAFETY: the library passes the requester's valid name (checked non-null).
        requester: unsafe { name_of(proct) },
        keys,
        reply: GroupReply::new(cb, cbdata),
    });
    SUCCESS
}

/// Tells the library which functions the host serves, with the attributes each honours
/// (what `pattrs --host` lists).
pub(super) fn register_host_attributes() {
    let table: &[(&CStr, &[&[u8]])] = &[
        (
            c"PMIx_Query_info",
            &[
                sys::PMIX_QUERY_NAMESPACES,
                sys::PMIX_QUERY_NAMESPACE_INFO,
                sys::PMIX_QUERY_PROC_TABLE,
                sys::PMIX_QUERY_LOCAL_PROC_TABLE,
                sys::PMIX_QUERY_SPAWN_SUPPORT,
                sys::PMIX_QUERY_DEBUG_SUPPORT,
                sys::PMIX_QUERY_JOB_STATUS,
                sys::PMIX_QUERY_PSET_NAMES,
                sys::PMIX_QUERY_NUM_PSETS,
                sys::PMIX_QUERY_PSET_MEMBERSHIP,
            ],
        ),
        (c"PMIx_Spawn", &[sys::PMIX_SESSION_ID, sys::PMIX_ALLOC_ID]),
        (c"PMIx_Fence", &[sys::PMIX_COLLECT_DATA, sys::PMIX_TIMEOUT]),
    ];
    for (func, attrs) in table {
        let mut ptrs: Vec<*mut c_char> = attrs
            .iter()
            .map(|a| a.as_ptr().cast::<c_char>().cast_mut())
            .collect();
        ptrs.push(std::ptr::null_mut());
        // SAFETY: a NUL-terminated function name and a NULL-terminated array of
        // NUL-terminated keys, valid for the call; the library copies both.
        let rc =
            unsafe { sys::PMIx_Register_attributes(func.as_ptr().cast_mut(), ptrs.as_mut_ptr()) };
        if rc != SUCCESS {
            tracing::debug!("PMIx_Register_attributes({func:?}): status {rc}");
        }
    }
}
