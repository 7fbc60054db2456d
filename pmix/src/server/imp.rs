//! The PMIx server on OpenPMIx's server library: the replies handed to the host, the
//! library's callbacks, and the server itself.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use super::*;
use crate::client::{op_done, status, Done, SUCCESS};
use crate::owned::{proc_name, Infos};
use crate::sys;

/// The host of this process's server (set once, by the only `Server::init`).
static HOST: OnceLock<Arc<dyn Host>> = OnceLock::new();
/// Whether a server was started in this process (the library allows one).
static STARTED: Mutex<bool> = Mutex::new(false);

pub(super) fn host() -> Option<&'static Arc<dyn Host>> {
    HOST.get()
}

impl Failure {
    /// The status the client sees.
    pub(super) fn status(self) -> sys::pmix_status_t {
        match self {
            Failure::ProcGone => sys::PMIX_ERR_PROC_ABORTED,
            Failure::Timeout => sys::PMIX_ERR_TIMEOUT,
            Failure::NotFound => sys::PMIX_ERR_NOT_FOUND,
            Failure::NotSupported => sys::PMIX_ERR_NOT_SUPPORTED,
            Failure::Invalid => sys::PMIX_ERR_BAD_PARAM,
            Failure::Duplicate => sys::PMIX_EXISTS,
            Failure::OutOfResource => sys::PMIX_ERR_OUT_OF_RESOURCE,
            Failure::Other => sys::PMIX_ERROR,
        }
    }

    /// The failure a library status means (`Other` for any but the five named).
    fn of(st: sys::pmix_status_t) -> Failure {
        match st {
            sys::PMIX_ERR_PROC_ABORTED => Failure::ProcGone,
            sys::PMIX_ERR_TIMEOUT => Failure::Timeout,
            sys::PMIX_ERR_NOT_FOUND => Failure::NotFound,
            sys::PMIX_ERR_NOT_SUPPORTED => Failure::NotSupported,
            sys::PMIX_ERR_BAD_PARAM => Failure::Invalid,
            sys::PMIX_EXISTS => Failure::Duplicate,
            _ => Failure::Other,
        }
    }
}

/// Where a fence's or direct modex's result goes: the library's callback, called
/// exactly once (by [`ModexReply::ok`], [`ModexReply::fail`] or, unanswered, on
/// drop with `PMIX_ERROR`).
pub struct ModexReply {
    cb: sys::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
}

impl std::fmt::Debug for ModexReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModexReply")
    }
}

// SAFETY: the library's modex callbacks may be called from any thread (they hand
// the result over to the library's own progress thread); `cbdata` is only passed
// back to that callback.
unsafe impl Send for ModexReply {}

/// Frees the data handed to a modex callback once the library is done with it.
unsafe extern "C" fn release_vec(cbdata: *mut c_void) {
    // SAFETY: `cbdata` is the `Box<Vec<u8>>` leaked in `ModexReply::finish`, and the
    // library calls this release function once.
    drop(unsafe { Box::from_raw(cbdata.cast::<Vec<u8>>()) });
}

impl ModexReply {
    /// The operation succeeded with `data`.
    pub fn ok(self, data: Vec<u8>) {
        self.finish(SUCCESS, data);
    }

    /// The operation failed.
    pub fn fail(self, why: Failure) {
        self.finish(why.status(), Vec::new());
    }

    fn finish(mut self, st: sys::pmix_status_t, data: Vec<u8>) {
        let Some(cb) = self.cb.take() else { return };
        let boxed = Box::new(data);
        let (ptr, len) = (boxed.as_ptr(), boxed.len());
        let keep = Box::into_raw(boxed);
        // SAFETY: `cb` and `cbdata` came together from the library, which expects
        // this call once (`take` above makes it once); the data stays valid until
        // the library calls `release_vec` with `keep`.
        unsafe {
            cb(
                st,
                ptr.cast::<c_char>(),
                len,
                self.cbdata,
                Some(release_vec),
                keep.cast(),
            )
        };
    }
}

impl Drop for ModexReply {
    fn drop(&mut self) {
        if self.cb.is_some() {
            let me = ModexReply {
                cb: self.cb.take(),
                cbdata: self.cbdata,
            };
            me.fail(Failure::Other);
        }
    }
}

/// Where a group operation's result goes: the library's callback, called exactly
/// once (by [`GroupReply::ok`], [`GroupReply::fail`] or, unanswered, on drop with
/// `PMIX_ERROR`).
pub struct GroupReply {
    cb: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
}

impl std::fmt::Debug for GroupReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupReply")
    }
}

// SAFETY: as for `ModexReply`: the callback may be called from any thread.
unsafe impl Send for GroupReply {}

/// Frees the infos handed to an info callback once the library is done with them.
unsafe extern "C" fn release_infos(cbdata: *mut c_void) {
    // SAFETY: `cbdata` is the `Box<Infos>` leaked in `GroupReply::finish`; the
    // library calls this once.
    drop(unsafe { Box::from_raw(cbdata.cast::<Infos>()) });
}

impl GroupReply {
    /// The reply of an upcall answered through `cb`.
    pub(super) fn new(cb: sys::pmix_info_cbfunc_t, cbdata: *mut c_void) -> GroupReply {
        GroupReply { cb, cbdata }
    }

    /// The operation succeeded: the group's context id (if one was assigned) and
    /// every node's contribution, concatenated (empty for a destruct).
    pub fn ok(self, context_id: Option<u64>, endpt: Vec<u8>) {
        let mut info = Infos::new();
        if let Some(c) = context_id {
            info.push_size(sys::PMIX_GROUP_CONTEXT_ID, c as usize);
        }
        if !endpt.is_empty() {
            info.push_bytes(sys::PMIX_GROUP_ENDPT_DATA, &endpt);
        }
        self.finish(SUCCESS, info);
    }

    /// A query's answers (none: `PMIX_ERR_NOT_FOUND`).
    pub fn answers(self, answers: Vec<QueryAnswer>) {
        if answers.is_empty() {
            return self.fail(Failure::NotFound);
        }
        self.finish(SUCCESS, super::query::encode(answers));
    }

    /// The operation failed.
    pub fn fail(self, why: Failure) {
        self.finish(why.status(), Infos::new());
    }

    fn finish(mut self, st: sys::pmix_status_t, info: Infos) {
        let Some(cb) = self.cb.take() else { return };
        let mut info = Box::new(info);
        let (ptr, n) = (info.as_mut_ptr(), info.len());
        let keep = Box::into_raw(info);
        // SAFETY: `cb` and `cbdata` came together from the library, which expects
        // this call once; the infos stay valid until it calls `release_infos`.
        unsafe { cb(st, ptr, n, self.cbdata, Some(release_infos), keep.cast()) };
    }
}

impl Drop for GroupReply {
    fn drop(&mut self) {
        if self.cb.is_some() {
            let me = GroupReply {
                cb: self.cb.take(),
                cbdata: self.cbdata,
            };
            me.fail(Failure::Other);
        }
    }
}

/// A name's parts, the wildcard rank as `None`.
///
/// # Safety
/// `p` points to a valid process name.
pub(super) unsafe fn name_of(p: *const sys::pmix_proc_t) -> ProcName {
    // SAFETY: the caller's contract.
    let (nspace, rank) = unsafe { proc_name(&*p) };
    ProcName {
        nspace,
        rank: (rank != sys::PMIX_RANK_WILDCARD).then_some(rank),
    }
}

/// The names of an array of `n` processes.
///
/// # Safety
/// `p` is null or points to `n` valid process names.
pub(super) unsafe fn names_of(p: *const sys::pmix_proc_t, n: usize) -> Vec<ProcName> {
    if p.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    (0..n).map(|i| unsafe { name_of(p.add(i)) }).collect()
}

/// `PMIX_COLLECT_DATA` and `PMIX_TIMEOUT` of an info array.
///
/// # Safety
/// `info` is null or points to `n` valid infos.
pub(super) unsafe fn directives(
    info: *const sys::pmix_info_t,
    n: usize,
) -> (bool, Option<Duration>) {
    let (mut collect, mut timeout) = (false, None);
    if info.is_null() {
        return (collect, timeout);
    }
    for i in 0..n {
        // SAFETY: the caller's contract: `n` valid infos.
        let inf = unsafe { &*info.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        let v = unsafe { crate::owned::value_of(&inf.value) };
        if k == sys::PMIX_COLLECT_DATA {
            // A flag given without a value (PMIX_UNDEF) means true.
            collect = !matches!(v, crate::PmixValue::Bool(false));
        } else if k == sys::PMIX_TIMEOUT {
            if let Some(s) = v.as_u32().filter(|&s| s > 0) {
                timeout = Some(Duration::from_secs(u64::from(s)));
            }
        }
    }
    (collect, timeout)
}

unsafe extern "C" fn client_connected(
    p: *const sys::pmix_proc_t,
    _obj: *mut c_void,
    _cb: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    super::quickack::client_connected();
    if let Some(h) = host() {
        // SAFETY: the library passes a valid name.
        h.connected(unsafe { name_of(p) });
    }
    sys::PMIX_OPERATION_SUCCEEDED
}

unsafe extern "C" fn client_finalized(
    p: *const sys::pmix_proc_t,
    _obj: *mut c_void,
    _cb: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    if let Some(h) = host() {
        // SAFETY: the library passes a valid name.
        h.finalized(unsafe { name_of(p) });
    }
    sys::PMIX_OPERATION_SUCCEEDED
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn abort(
    p: *const sys::pmix_proc_t,
    _obj: *mut c_void,
    st: c_int,
    msg: *const c_char,
    procs: *mut sys::pmix_proc_t,
    nprocs: usize,
    _cb: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    if let Some(h) = host() {
        let message = if msg.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null message is NUL-terminated.
            unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        };
        // SAFETY: the library passes a valid name and `nprocs` valid targets.
        let (who, targets) = unsafe { (name_of(p), names_of(procs, nprocs)) };
        h.abort(who, st, message, targets);
    }
    sys::PMIX_OPERATION_SUCCEEDED
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn fence_nb(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    data: *mut c_char,
    ndata: usize,
    cb: sys::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    // SAFETY: the library passes `nprocs` names, `ninfo` infos and `ndata` bytes.
    let (procs, (collect, timeout), data) = unsafe {
        (
            names_of(procs, nprocs),
            directives(info, ninfo),
            if data.is_null() || ndata == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data.cast::<u8>(), ndata).to_vec()
            },
        )
    };
    h.fence(Fence {
        procs,
        collect,
        timeout,
        data,
        reply: ModexReply { cb, cbdata },
    });
    SUCCESS
}

unsafe extern "C" fn direct_modex(
    p: *const sys::pmix_proc_t,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cb: sys::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    // SAFETY: the library passes a valid name and `ninfo` infos.
    let (proc, (_, timeout)) = unsafe { (name_of(p), directives(info, ninfo)) };
    h.direct_modex(DirectModex {
        proc,
        timeout,
        reply: ModexReply { cb, cbdata },
    });
    SUCCESS
}

/// An hwloc topology of this machine (hwloc's defaults: no I/O devices).
struct Topology(hwlocality_sys::hwloc_topology_t);

impl Topology {
    fn load() -> Option<Topology> {
        let mut t: hwlocality_sys::hwloc_topology_t = std::ptr::null_mut();
        // SAFETY: init writes a new topology into `t`; load fills it; on failure it
        // is destroyed by the guard's drop.
        unsafe {
            if hwlocality_sys::hwloc_topology_init(&mut t) != 0 || t.is_null() {
                return None;
            }
            let t = Topology(t);
            (hwlocality_sys::hwloc_topology_load(t.0) == 0).then_some(t)
        }
    }
}

// SAFETY: an hwloc topology is plain memory the library reads; it moves between
// threads here (loaded by `preload`'s thread, then owned by the `Server`), never used
// by two at once.
unsafe impl Send for Topology {}

/// The topology `preload` is loading, if it was called.
static PRELOAD: Mutex<Option<std::thread::JoinHandle<Option<Topology>>>> = Mutex::new(None);

/// Starts loading the machine's topology now, on a thread of its own, for a later
/// [`Server::init`] (which otherwise loads it itself, ~3 ms here).
pub fn preload() {
    let mut p = PRELOAD.lock().unwrap_or_else(|e| e.into_inner());
    if p.is_none() {
        *p = std::thread::Builder::new()
            .name("pmix-topology".into())
            .spawn(Topology::load)
            .ok();
    }
}

/// The preloaded topology, else one loaded now.
fn topology() -> Option<Topology> {
    let handle = PRELOAD.lock().unwrap_or_else(|e| e.into_inner()).take();
    match handle {
        Some(h) => h.join().ok().flatten(),
        None => Topology::load(),
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // SAFETY: created by hwloc_topology_init, destroyed once.
        unsafe { hwlocality_sys::hwloc_topology_destroy(self.0) };
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn group(
    op: sys::pmix_group_operation_t,
    grp: *mut c_char,
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    dirs: *const sys::pmix_info_t,
    ndirs: usize,
    cb: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    let id = if grp.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null group id is NUL-terminated.
        unsafe { CStr::from_ptr(grp) }
            .to_string_lossy()
            .into_owned()
    };
    let mut req = Group {
        construct: op == sys::pmix_group_operation_t_PMIX_GROUP_CONSTRUCT,
        id,
        // SAFETY: the library passes `nprocs` valid names.
        procs: unsafe { names_of(procs, nprocs) },
        assign_context_id: false,
        optional: false,
        notify_termination: false,
        timeout: None,
        endpt: Vec::new(),
        reply: GroupReply { cb, cbdata },
    };
    if !dirs.is_null() {
        for i in 0..ndirs {
            // SAFETY: `ndirs` valid infos.
            let inf = unsafe { &*dirs.add(i) };
            // SAFETY: a valid info's key is NUL-terminated within its array.
            let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
            // SAFETY: the union member read is the one the type tag names.
            let v = unsafe { crate::owned::value_of(&inf.value) };
            let on = || !matches!(v, crate::PmixValue::Bool(false));
            if k == sys::PMIX_GROUP_ASSIGN_CONTEXT_ID {
                req.assign_context_id = on();
            } else if k == sys::PMIX_GROUP_OPTIONAL {
                req.optional = on();
            } else if k == sys::PMIX_GROUP_NOTIFY_TERMINATION {
                req.notify_termination = on();
            } else if k == sys::PMIX_TIMEOUT || k == crate::GROUP_TIMEOUT_KEY {
                if let Some(s) = v.as_u32().filter(|&s| s > 0) {
                    req.timeout = Some(Duration::from_secs(u64::from(s)));
                }
            } else if k == sys::PMIX_GROUP_ENDPT_DATA {
                if let crate::PmixValue::Bytes(b) = v {
                    req.endpt = b;
                }
            }
        }
    }
    h.group(req);
    SUCCESS
}

/// The running PMIx server of this process; finalized on drop.
pub struct Server {
    /// The topology handed to the library, kept until it is finalized.
    _topo: Option<(Topology, Box<sys::pmix_topology_t>)>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Server")
    }
}

pub(super) fn nspace_c(op: &'static str, nspace: &str) -> Result<sys::pmix_proc_t, PmixError> {
    if nspace.len() > sys::PMIX_MAX_NSLEN as usize || nspace.contains('\0') {
        return Err(PmixError::InvalidArgs {
            op,
            what: format!(
                "namespace {nspace:?} (PMIx takes at most {} bytes, no NUL)",
                sys::PMIX_MAX_NSLEN
            ),
        });
    }
    Ok(crate::owned::proc_of(nspace.as_bytes(), 0))
}

/// Waits for an operation the library completes through `op_done`.
fn wait(op: &'static str, done: &Done) -> Result<(), PmixError> {
    match done.wait(&mut || Ok(())) {
        Ok(SUCCESS) | Ok(sys::PMIX_OPERATION_SUCCEEDED) => Ok(()),
        Ok(rc) => Err(status(op, rc, "")),
        Err(why) => Err(status(op, sys::PMIX_ERROR, &why)),
    }
}

impl Server {
    /// Starts the server library, its Unix socket in `dir`, with `host` answering
    /// for it. Fails if a server was already started in this process.
    /// `tools` says which tool connections it accepts.
    pub fn init(
        dir: &std::path::Path,
        host_: Arc<dyn Host>,
        tools: ToolSupport,
    ) -> Result<Server, PmixError> {
        const OP: &str = "PMIx_server_init";
        let mut started = STARTED.lock().unwrap_or_else(|p| p.into_inner());
        if *started {
            return Err(PmixError::InvalidArgs {
                op: OP,
                what: "a PMIx server already ran in this process (one per process)".into(),
            });
        }
        let dir_s = dir.to_str().ok_or_else(|| PmixError::InvalidArgs {
            op: OP,
            what: format!("directory {} is not UTF-8", dir.display()),
        })?;
        let _ = HOST.set(host_);
        // SAFETY: a zeroed module is all callbacks absent (None); the ones Weft
        // serves are set below. The library keeps a copy of the struct.
        let mut module: sys::pmix_server_module_t = unsafe { std::mem::zeroed() };
        module.client_connected = Some(client_connected);
        module.client_finalized = Some(client_finalized);
        module.abort = Some(abort);
        module.fence_nb = Some(fence_nb);
        module.direct_modex = Some(direct_modex);
        module.group = Some(group);
        module.query = Some(super::query::query);
        module.log = Some(super::log::log);
        module.notify_event = Some(super::events::notify_event);
        module.spawn = Some(super::spawn::spawn);
        module.publish = Some(super::names::publish);
        module.lookup = Some(super::names::lookup);
        module.unpublish = Some(super::names::unpublish);
        module.connect = Some(super::connect::connect);
        module.job_control = Some(super::jobctl::job_control);
        module.allocate = Some(super::alloc::allocate);
        module.disconnect = Some(super::connect::disconnect);
        module.tool_connected = Some(super::tools::tool_connected);
        let mut info = Infos::new();
        // The system server's file goes where tools look for it (the system temporary
        // directory); everything else the library writes stays in `dir`.
        let system_dir = std::env::temp_dir();
        let system_dir = match system_dir.to_str() {
            Some(d) if tools.system => d,
            _ => dir_s,
        };
        for (k, d) in [
            (&sys::PMIX_SERVER_TMPDIR[..], dir_s),
            (&sys::PMIX_SYSTEM_TMPDIR[..], system_dir),
        ] {
            info.push_string(k, d)
                .ok_or_else(|| PmixError::InvalidArgs {
                    op: OP,
                    what: format!("directory {d:?} holds a NUL byte"),
                })?;
        }
        if tools.tools {
            info.push_bool(sys::PMIX_SERVER_TOOL_SUPPORT, true);
        }
        if tools.system {
            info.push_bool(sys::PMIX_SERVER_SYSTEM_SUPPORT, true);
        }
        // Output a tool asked for is delivered to it (`iof_deliver`); the library must
        // not also write it itself: OpenPMIx 4.2.2's server has no output channel set up
        // for that and crashes in `pmix_iof_write_handler`.
        info.push_bool(sys::PMIX_IOF_LOCAL_OUTPUT, false);
        // The node's topology without I/O devices: left to itself, the library
        // discovers the PCI devices too, which took 15 of its 20 ms of start here.
        // The library keeps pointers to both: they live in the `Server`, past
        // PMIx_server_finalize.
        let topo = topology().map(|t| {
            let pt = Box::new(sys::pmix_topology_t {
                source: c"hwloc".as_ptr().cast_mut(),
                topology: t.0.cast(),
            });
            (t, pt)
        });
        if let Some((_, pt)) = &topo {
            let p: *const sys::pmix_topology_t = &**pt;
            info.push_topology_ptr(sys::PMIX_TOPOLOGY2, p.cast_mut());
        }
        // SAFETY: `module` and `info` are valid for the call; the library copies
        // what it keeps.
        let rc = unsafe { sys::PMIx_server_init(&mut module, info.as_mut_ptr(), info.len()) };
        if rc != SUCCESS {
            return Err(status(OP, rc, ""));
        }
        *started = true;
        super::attrs_guard::keep();
        super::query::register_host_attributes();
        Ok(Server { _topo: topo })
    }

    /// Registers a job (namespace `ns.nspace`) with the information its clients
    /// read at init: job size and maps, this node's peers, every rank's data.
    pub fn register_nspace(&self, ns: &Nspace) -> Result<(), PmixError> {
        const OP: &str = "PMIx_server_register_nspace";
        let p = nspace_c(OP, &ns.nspace)?;
        let size = ns.node_of.len() as u32;
        let locals = ns.ranks_on(ns.node);
        let list = |v: &[u32]| {
            v.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let bad = |what: &str| PmixError::InvalidArgs {
            op: OP,
            what: format!("{what} holds a NUL byte"),
        };
        let mut info = Infos::new();
        info.push_string(sys::PMIX_JOBID, &ns.nspace)
            .ok_or_else(|| bad("the namespace"))?;
        info.push_u32(sys::PMIX_UNIV_SIZE, size);
        info.push_u32(sys::PMIX_JOB_SIZE, size);
        if ns.stop_in_init {
            // Every rank waits (the wildcard), as PRRTE says it.
            info.push_rank(sys::PMIX_DEBUG_STOP_IN_INIT, sys::PMIX_RANK_WILDCARD);
        }
        if let Some(target) = &ns.debug_job {
            info.push_string(sys::PMIX_DEBUG_JOB, target)
                .ok_or_else(|| bad("the debugged job's namespace"))?;
        }
        info.push_u32(sys::PMIX_MAX_PROCS, size);
        info.push_u32(
            sys::PMIX_JOB_NUM_APPS,
            ns.app_of.iter().max().map_or(1, |a| a + 1),
        );
        info.push_u32(sys::PMIX_NUM_NODES, ns.job_nodes().len() as u32);
        info.push_string(sys::PMIX_NODE_MAP, &ns.node_map())
            .ok_or_else(|| bad("a node name"))?;
        info.push_string(sys::PMIX_PROC_MAP, &ns.proc_map());
        info.push_string(sys::PMIX_TMPDIR, &ns.tmpdir)
            .ok_or_else(|| bad("the directory"))?;
        info.push_string(sys::PMIX_NSDIR, &ns.tmpdir);
        // This node.
        info.push_u32(sys::PMIX_LOCAL_SIZE, locals.len() as u32);
        info.push_u32(sys::PMIX_NODE_SIZE, locals.len() as u32);
        info.push_string(sys::PMIX_LOCAL_PEERS, &list(&locals));
        if let Some(&l) = locals.first() {
            info.push_rank(sys::PMIX_LOCALLDR, l);
        }
        info.push_u32(sys::PMIX_NODEID, ns.node);
        if let Some(h) = ns.hostnames.get(ns.node as usize) {
            info.push_string(sys::PMIX_HOSTNAME, h);
        }
        if ns.oversubscribed {
            // Present means oversubscribed (the key is a flag; PRRTE gives it no value).
            info.push_bool(sys::PMIX_NODE_OVERSUBSCRIBED, true);
        }
        if let Some((pns, prank)) = &ns.parent {
            let mut parent = nspace_c(OP, pns)?;
            parent.rank = *prank;
            info.push_bool(sys::PMIX_SPAWNED, true);
            info.push_proc(sys::PMIX_PARENT_ID, &parent);
        }

        // Every rank.
        for r in 0..size {
            let i = r as usize;
            let node = ns.node_of[i];
            let mut pd = Infos::new();
            pd.push_rank(sys::PMIX_RANK, r);
            pd.push_rank(sys::PMIX_GLOBAL_RANK, r);
            let app = ns.app_of.get(i).copied().unwrap_or(0);
            pd.push_u32(sys::PMIX_APPNUM, app);
            let app_first = ns.app_of.iter().position(|&a| a == app).unwrap_or(0);
            pd.push_rank(sys::PMIX_APP_RANK, r - app_first as u32);
            let lr = ns.local_rank_of.get(i).copied().unwrap_or(0);
            pd.push_u16(sys::PMIX_LOCAL_RANK, lr as u16);
            pd.push_u16(sys::PMIX_NODE_RANK, lr as u16);
            pd.push_u32(sys::PMIX_NODEID, node);
            if let Some(h) = ns.hostnames.get(node as usize) {
                pd.push_string(sys::PMIX_HOSTNAME, h);
            }
            if let Some(Some(l)) = ns.locality_of.get(i) {
                pd.push_string(sys::PMIX_LOCALITY_STRING, l);
            }
            info.push_infos(sys::PMIX_PROC_DATA, &mut pd);
        }
        let done = Arc::new(Done::default());
        let cbdata = Arc::into_raw(done.clone()) as *mut c_void;
        // SAFETY: the name and infos are valid for the call (the library copies
        // them); `op_done` takes over the reference in `cbdata` when called.
        let rc = unsafe {
            sys::PMIx_server_register_nspace(
                p.nspace.as_ptr(),
                locals.len() as c_int,
                info.as_mut_ptr(),
                info.len(),
                Some(op_done),
                cbdata,
            )
        };
        if rc != SUCCESS {
            // SAFETY: the callback will not run: the reference is ours again.
            drop(unsafe { Arc::from_raw(cbdata.cast::<Done>().cast_const()) });
            return Err(status(OP, rc, ""));
        }
        wait(OP, &done)
    }

    /// Registers local rank `rank` of `nspace` as a client the library accepts
    /// (with this process's user and group).
    pub fn register_client(&self, nspace: &str, rank: u32) -> Result<(), PmixError> {
        const OP: &str = "PMIx_server_register_client";
        let mut p = nspace_c(OP, nspace)?;
        p.rank = rank;
        let uid = rustix_uid();
        let done = Arc::new(Done::default());
        let cbdata = Arc::into_raw(done.clone()) as *mut c_void;
        // SAFETY: `p` is valid for the call; `op_done` takes over `cbdata`.
        let rc = unsafe {
            sys::PMIx_server_register_client(
                &p,
                uid.0,
                uid.1,
                std::ptr::null_mut(),
                Some(op_done),
                cbdata,
            )
        };
        if rc != SUCCESS {
            // SAFETY: the callback will not run: the reference is ours again.
            drop(unsafe { Arc::from_raw(cbdata.cast::<Done>().cast_const()) });
            return Err(status(OP, rc, ""));
        }
        wait(OP, &done)
    }

    /// The environment a child (rank `rank` of `nspace`) needs to reach this server.
    pub fn setup_fork(&self, nspace: &str, rank: u32) -> Result<Vec<(String, String)>, PmixError> {
        const OP: &str = "PMIx_server_setup_fork";
        let mut p = nspace_c(OP, nspace)?;
        p.rank = rank;
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: `env` starts as an empty argv array the library appends to with
        // malloc'd strings.
        let rc = unsafe { sys::PMIx_server_setup_fork(&p, &mut env) };
        let mut out = Vec::new();
        if !env.is_null() {
            let mut i = 0;
            loop {
                // SAFETY: a NULL-terminated array of malloc'd strings, each read
                // then freed once, then the array itself.
                let s = unsafe { *env.add(i) };
                if s.is_null() {
                    break;
                }
                // SAFETY: each entry is a NUL-terminated string.
                let kv = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
                // SAFETY: allocated by the library with malloc, freed once.
                unsafe { libc::free(s.cast()) };
                if let Some((k, v)) = kv.split_once('=') {
                    out.push((k.to_string(), v.to_string()));
                }
                i += 1;
            }
            // SAFETY: the array was allocated with malloc; freed once.
            unsafe { libc::free(env.cast()) };
        }
        if rc != SUCCESS {
            return Err(status(OP, rc, ""));
        }
        super::quickack::note_env(&out);
        Ok(out)
    }

    /// Acknowledges what clients send at once (see `quickack.rs`: OpenPMIx's client
    /// does not set `TCP_NODELAY`, so otherwise a small request can wait for this end's
    /// delayed ACK, up to 40 ms). Call before clients connect.
    pub fn ack_promptly(&self) {
        super::quickack::enable();
    }

    /// Asks the library for local rank `rank`'s data for another node (answered
    /// through `done` once the rank committed it, on the library's thread).
    pub fn dmodex_request(
        &self,
        nspace: &str,
        rank: u32,
        done: impl FnOnce(Result<Vec<u8>, Failure>) + Send + 'static,
    ) -> Result<(), PmixError> {
        const OP: &str = "PMIx_server_dmodex_request";
        type Cb = Box<dyn FnOnce(Result<Vec<u8>, Failure>) + Send>;
        unsafe extern "C" fn dmodex_done(
            st: sys::pmix_status_t,
            data: *mut c_char,
            sz: usize,
            cbdata: *mut c_void,
        ) {
            // SAFETY: `cbdata` is the `Box<Cb>` leaked below; the library calls
            // this once.
            let f = unsafe { Box::from_raw(cbdata.cast::<Cb>()) };
            let out = match st {
                SUCCESS if data.is_null() || sz == 0 => Ok(Vec::new()),
                SUCCESS => {
                    // SAFETY: `sz` bytes at `data`, valid during the callback.
                    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), sz) }.to_vec())
                }
                st => Err(Failure::of(st)),
            };
            f(out);
        }
        let mut p = nspace_c(OP, nspace)?;
        p.rank = rank;
        let cb: Cb = Box::new(done);
        let cbdata = Box::into_raw(Box::new(cb)) as *mut c_void;
        // SAFETY: `p` is valid for the call; `dmodex_done` takes over `cbdata`.
        let rc = unsafe { sys::PMIx_server_dmodex_request(&p, Some(dmodex_done), cbdata) };
        if rc != SUCCESS {
            // SAFETY: the callback will not run: the box is ours again.
            drop(unsafe { Box::from_raw(cbdata.cast::<Cb>()) });
            return Err(status(OP, rc, ""));
        }
        Ok(())
    }

    /// Forgets a job (its clients' data and connections).
    pub fn deregister_nspace(&self, nspace: &str) {
        let Ok(p) = nspace_c("PMIx_server_deregister_nspace", nspace) else {
            return;
        };
        let done = Arc::new(Done::default());
        let cbdata = Arc::into_raw(done.clone()) as *mut c_void;
        // SAFETY: `p` is valid for the call; `op_done` takes over `cbdata`.
        unsafe { sys::PMIx_server_deregister_nspace(p.nspace.as_ptr(), Some(op_done), cbdata) };
        let _ = wait("PMIx_server_deregister_nspace", &done);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: the library was initialized by `init` and is finalized once; the
        // topology it points to is dropped after this, with the fields.
        unsafe { sys::PMIx_server_finalize() };
    }
}

fn rustix_uid() -> (libc::uid_t, libc::gid_t) {
    // SAFETY: getuid and getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}
