//! `PMIx_Spawn` through the host: the library's `spawn` upcall and [`SpawnReply`].

use std::ffi::{c_void, CStr};

use super::imp::{host, name_of};
use super::*;
use crate::client::SUCCESS;
use crate::sys;

/// Where a spawn's result goes: the library's callback, called exactly once (by
/// [`SpawnReply::ok`], [`SpawnReply::fail`] or, unanswered, on drop with `PMIX_ERROR`).
pub struct SpawnReply {
    cb: sys::pmix_spawn_cbfunc_t,
    cbdata: *mut c_void,
}

impl std::fmt::Debug for SpawnReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnReply")
    }
}

// SAFETY: as for `ModexReply`: the callback may be called from any thread.
unsafe impl Send for SpawnReply {}

impl SpawnReply {
    /// The job was started: its namespace.
    pub fn ok(mut self, nspace: &str) {
        let Some(cb) = self.cb.take() else { return };
        // A namespace is at most PMIX_MAX_NSLEN bytes and has no NUL (Weft's are ASCII).
        let mut name = nspace.as_bytes().to_vec();
        name.truncate(sys::PMIX_MAX_NSLEN as usize);
        name.retain(|&b| b != 0);
        name.push(0);
        // SAFETY: `cb` and `cbdata` came together from the library, which expects this
        // call once and copies the namespace before it returns.
        unsafe { cb(SUCCESS, name.as_mut_ptr().cast(), self.cbdata) };
    }

    /// The spawn failed.
    pub fn fail(mut self, why: Failure) {
        let Some(cb) = self.cb.take() else { return };
        // SAFETY: as in `ok`; no namespace on failure.
        unsafe { cb(why.status(), std::ptr::null_mut(), self.cbdata) };
    }
}

impl Drop for SpawnReply {
    fn drop(&mut self) {
        if self.cb.is_some() {
            let me = SpawnReply {
                cb: self.cb.take(),
                cbdata: self.cbdata,
            };
            me.fail(Failure::Other);
        }
    }
}

/// The strings of a NULL-terminated array (none for a null pointer).
///
/// # Safety
/// `p` is null or a NULL-terminated array of NUL-terminated strings.
pub(super) unsafe fn strings_of(p: *mut *mut std::os::raw::c_char) -> Vec<String> {
    let mut out = Vec::new();
    if p.is_null() {
        return out;
    }
    let mut i = 0;
    loop {
        // SAFETY: within the NULL-terminated array (the caller's contract).
        let s = unsafe { *p.add(i) };
        if s.is_null() {
            break;
        }
        // SAFETY: a NUL-terminated string (the caller's contract).
        out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
        i += 1;
    }
    out
}

/// Reads a debugger's directives among `n` infos at `infos` into `debug`; a directive
/// Weft cannot follow (stop on exec, a mapping it does not know for daemons) is
/// refused with its status.
///
/// # Safety
/// `infos` is null or points at `n` valid infos.
unsafe fn debug_infos(
    infos: *const sys::pmix_info_t,
    n: usize,
    debug: &mut SpawnDebug,
) -> Result<(), sys::pmix_status_t> {
    if infos.is_null() {
        return Ok(());
    }
    let set = |v: &crate::PmixValue| !matches!(v, crate::PmixValue::Bool(false));
    for i in 0..n {
        // SAFETY: within the `n` valid infos (the caller's contract).
        let inf = unsafe { &*infos.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_DEBUG_STOP_IN_INIT {
            debug.stop_in_init |= set(&v);
        } else if k == sys::PMIX_DEBUG_STOP_ON_EXEC && set(&v) {
            // Not offered (`PMIX_QUERY_DEBUG_SUPPORT` lists stop-in-init only).
            return Err(sys::PMIX_ERR_NOT_SUPPORTED);
        } else if k == sys::PMIX_DEBUGGER_DAEMONS {
            debug.daemons |= set(&v);
        } else if k == sys::PMIX_DEBUG_JOB {
            debug.target = v.as_str().map(str::to_owned);
        } else if k == sys::PMIX_DEBUG_TARGET {
            if let crate::PmixValue::Procs(p) = &v {
                if let Some((ns, _)) = p.first() {
                    debug.target.get_or_insert_with(|| ns.clone());
                }
            }
        } else if k == sys::PMIX_NOTIFY_COMPLETION {
            debug.notify_completion |= set(&v);
        } else if k == sys::PMIX_FWD_STDOUT {
            debug.fwd_stdout |= set(&v);
        } else if k == sys::PMIX_FWD_STDERR {
            debug.fwd_stderr |= set(&v);
        } else if k == sys::PMIX_MAPBY {
            // `ppr:N:node` (processes per node); other mappings place as Weft does.
            let per_node = v.as_str().and_then(|m| {
                let m = m.split(':').collect::<Vec<_>>();
                match m.as_slice() {
                    ["ppr", n, "node", ..] => n.parse::<u32>().ok().filter(|&n| n > 0),
                    _ => None,
                }
            });
            if per_node.is_some() {
                debug.per_node = per_node;
            }
        }
    }
    Ok(())
}

pub(super) unsafe extern "C" fn spawn(
    proc_: *const sys::pmix_proc_t,
    job_info: *const sys::pmix_info_t,
    ninfo: usize,
    apps: *const sys::pmix_app_t,
    napps: usize,
    cb: sys::pmix_spawn_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    if proc_.is_null() || (apps.is_null() && napps > 0) {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    let mut out = Vec::with_capacity(napps);
    let mut debug = SpawnDebug::default();
    for i in 0..napps {
        // SAFETY: the library passes `napps` valid apps.
        let a = unsafe { &*apps.add(i) };
        // A debugger may give its directives per app (OpenPMIx's debugger.c attaching).
        // SAFETY: the library's app holds `ninfo` valid infos at `info`.
        if let Err(rc) = unsafe { debug_infos(a.info, a.ninfo, &mut debug) } {
            return rc;
        }
        // SAFETY: the app's strings are NUL-terminated, its arrays NULL-terminated.
        let argv = unsafe { strings_of(a.argv) };
        // No command: argv[0] is the program (as OpenPMIx's dynamic.c spawns).
        let cmd = if a.cmd.is_null() {
            match argv.first() {
                Some(c) => c.clone(),
                None => return sys::PMIX_ERR_BAD_PARAM,
            }
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(a.cmd) }
                .to_string_lossy()
                .into_owned()
        };
        // SAFETY: as above.
        let env = unsafe { strings_of(a.env) }
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let cwd = (!a.cwd.is_null()).then(|| {
            // SAFETY: as above (checked non-null).
            unsafe { CStr::from_ptr(a.cwd) }
                .to_string_lossy()
                .into_owned()
        });
        out.push(SpawnApp {
            cmd,
            // argv[0] is the program's name.
            args: argv.into_iter().skip(1).collect(),
            env,
            cwd,
            maxprocs: u32::try_from(a.maxprocs).unwrap_or(0),
        });
    }
    let (mut session, mut alloc_id, mut separate) = (None, None, false);
    for i in 0..if job_info.is_null() { 0 } else { ninfo } {
        // SAFETY: the library passes `ninfo` valid infos.
        let inf = unsafe { &*job_info.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_SESSION_ID {
            session = v.as_u32();
        } else if k == sys::PMIX_ALLOC_ID {
            alloc_id = v.as_str().map(str::to_owned);
        } else if k == super::SPAWN_CHILD_SEP {
            separate = !matches!(v, crate::PmixValue::Bool(false));
        }
    }
    // SAFETY: the library passes `ninfo` valid infos at `job_info` (or null).
    if let Err(rc) = unsafe { debug_infos(job_info, ninfo, &mut debug) } {
        return rc;
    }
    h.spawn(Spawn {
        // SAFETY: checked non-null; the library's valid name.
        requester: unsafe { name_of(proc_) },
        apps: out,
        session,
        alloc_id,
        separate,
        debug,
        reply: SpawnReply { cb, cbdata },
    });
    SUCCESS
}
