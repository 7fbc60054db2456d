//! The verbs objects: the only module that names `rdma_mummy_sys`.
//!
//! Each object owns its verbs handle and destroys it on drop; each holds an `Arc` to the
//! object it was created from (Qp -> Pd, Cq, Srq; Mr, Srq, Ah -> Pd; Pd, Cq -> Context), so a
//! parent is only destroyed after all its children. Queue pair states are types: `Qp<Reset>`
//! becomes `Qp<Init>`, `Qp<Rtr>` and `Qp<Rts>` by consuming transitions, and only a `Qp<Rts>`
//! can post sends. Posting work requests that name raw memory is crate-internal and `unsafe`;
//! users of the crate go through [`crate::Endpoint`].

use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

/// Link layer values of `ibv_port_attr::link_layer` (an anonymous enum in verbs.h).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// Ethernet link layer (RoCE).
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// Verbs objects alive in this process (all endpoints), for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveObjects {
    /// Open device contexts.
    pub contexts: usize,
    /// Protection domains.
    pub pds: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Address handles.
    pub ahs: usize,
}

mod live {
    use std::sync::atomic::AtomicUsize;
    pub(super) static CONTEXTS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static PDS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static CQS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static SRQS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static QPS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static MRS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static AHS: AtomicUsize = AtomicUsize::new(0);
}

fn inc(c: &std::sync::atomic::AtomicUsize) {
    // SYNC: a statistic; no other memory is published through it.
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn dec(c: &std::sync::atomic::AtomicUsize) {
    // SYNC: a statistic; no other memory is published through it.
    c.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many verbs objects this process holds now.
pub fn live_objects() -> LiveObjects {
    use std::sync::atomic::Ordering::Relaxed;
    // SYNC: statistics, read without ordering.
    LiveObjects {
        contexts: live::CONTEXTS.load(Relaxed),
        pds: live::PDS.load(Relaxed),
        cqs: live::CQS.load(Relaxed),
        srqs: live::SRQS.load(Relaxed),
        qps: live::QPS.load(Relaxed),
        mrs: live::MRS.load(Relaxed),
        ahs: live::AHS.load(Relaxed),
    }
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// `ret` of a verb that returns 0 or an errno value (some providers return -1 and set errno).
fn ret_err(ret: c_int) -> io::Error {
    if ret > 0 {
        io::Error::from_raw_os_error(ret)
    } else {
        last_err()
    }
}

/// `ibv_wc_status_str` of a work-completion status.
pub(crate) fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str accepts any value and returns a static string (or NULL when
    // libibverbs could not be loaded).
    let s = unsafe { ffi::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null return values are static NUL-terminated strings.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    format!("{text} ({status})")
}

/// Whether a work-completion status is success.
pub(crate) const WC_SUCCESS: u32 = ffi::ibv_wc_status::IBV_WC_SUCCESS;

/// Names of the devices libibverbs finds; `NoDevice` when it finds none or cannot load.
pub(crate) fn device_names() -> Result<Vec<String>, Error> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = last_err();
        let reason = if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            "libibverbs.so.1 could not be loaded (install rdma-core / libibverbs1)".to_string()
        } else {
            format!("libibverbs finds no RDMA subsystem in this kernel (ibv_get_device_list: {e})")
        };
        return Err(Error::NoDevice { reason });
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a valid device of the list; the name is a NUL-terminated string.
        let name = unsafe { ffi::ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: checked non-null above; valid until the list is freed.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(Error::NoDevice {
            reason: "libibverbs found no device (no RDMA driver loaded; for soft-RoCE: \
                     `rdma link add rxe0 type rxe netdev IFACE`)"
                .to_string(),
        });
    }
    Ok(names)
}

/// Device attributes Weft uses (from `ibv_query_device`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceAttr {
    pub(crate) max_qp_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_cqe: u32,
    pub(crate) max_srq_wr: u32,
    pub(crate) max_mr_size: u64,
    pub(crate) max_qp_rd_atom: u32,
    pub(crate) max_qp_init_rd_atom: u32,
    pub(crate) phys_port_cnt: u8,
}

/// Port attributes Weft uses (from `ibv_query_port`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortAttr {
    pub(crate) state: u32,
    pub(crate) active_mtu: u32,
    pub(crate) max_mtu: u32,
    pub(crate) lid: u16,
    pub(crate) link_layer: u8,
    pub(crate) max_msg_sz: u32,
    pub(crate) gid_tbl_len: u32,
}

/// Port state value of an active port.
pub(crate) const PORT_ACTIVE: u32 = ffi::ibv_port_state::IBV_PORT_ACTIVE;

/// Name of a port state.
pub(crate) fn port_state_name(state: u32) -> &'static str {
    match state {
        ffi::ibv_port_state::IBV_PORT_DOWN => "DOWN",
        ffi::ibv_port_state::IBV_PORT_INIT => "INIT",
        ffi::ibv_port_state::IBV_PORT_ARMED => "ARMED",
        ffi::ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// Bytes of an `ibv_mtu` value (0 when unknown).
pub(crate) fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// Kind of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GidKind {
    /// InfiniBand or RoCE v1.
    IbOrRoceV1,
    /// RoCE v2 (routable, UDP).
    RoceV2,
}

/// An open device (`ibv_context`).
pub struct Context {
    ptr: NonNull<ffi::ibv_context>,
    name: String,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core verbs are thread safe);
// the context is only closed on drop, when no other reference exists.
unsafe impl Send for Context {}
// SAFETY: as above: verbs calls on one context from several threads are allowed.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens the device named `name`, or the first device libibverbs lists.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>, Error> {
        let names = device_names()?;
        let want = match name {
            Some(n) => n.to_string(),
            None => names[0].clone(),
        };
        if !names.contains(&want) {
            return Err(Error::NoDevice {
                reason: format!("device {want:?} not found (libibverbs lists {names:?})"),
            });
        }
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; list freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(Error::NoDevice {
                reason: format!("ibv_get_device_list: {}", last_err()),
            });
        }
        let mut ctx = ptr::null_mut();
        let mut err = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is valid while the list is alive.
            let dn = unsafe { ffi::ibv_get_device_name(dev) };
            // SAFETY: device names are NUL-terminated strings owned by the list.
            if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_string_lossy() == want {
                // SAFETY: `dev` is a valid device; the context outlives the list (documented).
                ctx = unsafe { ffi::ibv_open_device(dev) };
                if ctx.is_null() {
                    err = Some(last_err());
                }
                break;
            }
        }
        // SAFETY: freed once; open contexts stay valid after freeing the list.
        unsafe { ffi::ibv_free_device_list(list) };
        match NonNull::new(ctx) {
            Some(ptr) => {
                inc(&live::CONTEXTS);
                Ok(Arc::new(Context { ptr, name: want }))
            }
            None => Err(Error::OpenDevice {
                device: want,
                source: err.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
            }),
        }
    }

    /// The device's name (e.g. `rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn query_device(&self) -> Result<DeviceAttr, Error> {
        // SAFETY: ibv_device_attr is plain C data; all-zero is a valid value.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid out-pointer.
        let ret = unsafe { ffi::ibv_query_device(self.ptr.as_ptr(), &mut a) };
        if ret != 0 {
            return Err(Error::QueryDevice {
                device: self.name.clone(),
                source: ret_err(ret),
            });
        }
        let u = |v: c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttr {
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_srq_wr: u(a.max_srq_wr),
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    pub(crate) fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        // SAFETY: ibv_port_attr is plain C data; all-zero is a valid value.
        let mut a: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid out-pointer of the right size.
        let ret = unsafe { ffi::ibv_query_port(self.ptr.as_ptr(), port, &mut a) };
        if ret != 0 {
            return Err(Error::QueryPort {
                device: self.name.clone(),
                port,
                source: ret_err(ret),
            });
        }
        Ok(PortAttr {
            state: a.state,
            active_mtu: a.active_mtu,
            max_mtu: a.max_mtu,
            lid: a.lid,
            link_layer: a.link_layer,
            max_msg_sz: a.max_msg_sz,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
        })
    }

    /// Every valid GID of `port` (index, GID, kind) in one call (`ibv_query_gid_table`),
    /// or `None` when the library cannot (then query index by index). A table of
    /// `table_len` entries mostly empty costs two system calls per index otherwise.
    pub(crate) fn query_gid_table(
        &self,
        port: u8,
        table_len: u32,
    ) -> Option<Vec<(u32, [u8; 16], GidKind)>> {
        let n = table_len as usize;
        if n == 0 {
            return Some(Vec::new());
        }
        // SAFETY: ibv_gid_entry is plain data (a byte-array union and integers).
        let mut entries: Vec<ffi::ibv_gid_entry> = vec![unsafe { std::mem::zeroed() }; n];
        // SAFETY: the context is open; `entries` has room for `n` entries, the count passed.
        let got =
            unsafe { ffi::ibv_query_gid_table(self.ptr.as_ptr(), entries.as_mut_ptr(), n, 0) };
        let got = usize::try_from(got).ok()?;
        Some(
            entries[..got.min(n)]
                .iter()
                .filter(|e| e.port_num == u32::from(port))
                .map(|e| {
                    // SAFETY: every bit pattern of the union is a valid byte array.
                    let raw = unsafe { e.gid.raw };
                    let kind = if e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2 {
                        GidKind::RoceV2
                    } else {
                        GidKind::IbOrRoceV1
                    };
                    (e.gid_index, raw, kind)
                })
                .collect(),
        )
    }

    /// GID `index` of `port` and its kind.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<([u8; 16], GidKind), Error> {
        // SAFETY: ibv_gid is a union of byte arrays; all-zero is valid.
        let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        let idx = c_int::try_from(index).unwrap_or(c_int::MAX);
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        let ret = unsafe { ffi::ibv_query_gid(self.ptr.as_ptr(), port, idx, &mut gid) };
        if ret != 0 {
            return Err(Error::QueryGid {
                device: self.name.clone(),
                port,
                index,
                source: ret_err(ret),
            });
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        let raw = unsafe { gid.raw };
        let mut ty: ffi::ibv_gid_type_sysfs = 0;
        // SAFETY: the context is open; `ty` is a valid out-pointer.
        let ret = unsafe { ffi::ibv_query_gid_type(self.ptr.as_ptr(), port, index, &mut ty) };
        let kind = if ret == 0 && ty == ffi::IBV_GID_TYPE_SYSFS_ROCE_V2 {
            GidKind::RoceV2
        } else {
            GidKind::IbOrRoceV1
        };
        Ok((raw, kind))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this context, so none is alive any more.
        let ret = unsafe { ffi::ibv_close_device(self.ptr.as_ptr()) };
        dec(&live::CONTEXTS);
        if ret != 0 {
            tracing::warn!("ibv_close_device({}): {}", self.name, ret_err(ret));
        }
    }
}

/// A protection domain (`ibv_pd`).
pub struct Pd {
    ptr: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: see Context; the PD is only deallocated on drop.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.ctx.name)
            .finish()
    }
}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, Error> {
        // SAFETY: the context is open.
        let p = unsafe { ffi::ibv_alloc_pd(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::AllocPd { source: last_err() })?;
        inc(&live::PDS);
        Ok(Arc::new(Pd {
            ptr,
            ctx: ctx.clone(),
        }))
    }

    /// The device context this domain belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: all children (QPs, MRs, SRQs, AHs) hold an Arc to this PD and are gone.
        let ret = unsafe { ffi::ibv_dealloc_pd(self.ptr.as_ptr()) };
        dec(&live::PDS);
        if ret != 0 {
            tracing::warn!("ibv_dealloc_pd: {}", ret_err(ret));
        }
    }
}

/// A registered memory region (`ibv_mr`).
pub struct Mr {
    ptr: NonNull<ffi::ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: see Context; the MR is only deregistered on drop.
unsafe impl Send for Mr {}
// SAFETY: see Context; the MR's fields are immutable after registration.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl Mr {
    /// Registers `[addr, addr + len)` for local write and remote read and write.
    ///
    /// Registration pins the pages; it does not read or write them. An address range that is
    /// not mapped fails with `EFAULT` (`Error::RegMr`).
    pub fn register(pd: &Arc<Pd>, addr: *const u8, len: usize) -> Result<Mr, Error> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        Self::register_access(pd, addr, len, access)
    }

    /// Registers `[addr, addr + len)` for remote reads only: memory the process cannot
    /// write (read-only data) can be registered so. Local writes into it (an RDMA read's
    /// destination) fail with a local protection error.
    pub fn register_read_only(pd: &Arc<Pd>, addr: *const u8, len: usize) -> Result<Mr, Error> {
        Self::register_access(pd, addr, len, ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
    }

    fn register_access(
        pd: &Arc<Pd>,
        addr: *const u8,
        len: usize,
        access: ffi::ibv_access_flags,
    ) -> Result<Mr, Error> {
        // SAFETY: ibv_reg_mr validates the range itself (EFAULT when unmapped) and keeps no
        // Rust reference to it; the PD is alive.
        let p = unsafe {
            ffi::ibv_reg_mr(pd.ptr.as_ptr(), addr as *mut c_void, len, access.0 as c_int)
        };
        let ptr = NonNull::new(p).ok_or_else(|| Error::RegMr {
            addr: addr as u64,
            len,
            source: last_err(),
        })?;
        inc(&live::MRS);
        Ok(Mr {
            ptr,
            _pd: pd.clone(),
        })
    }

    fn raw(&self) -> &ffi::ibv_mr {
        // SAFETY: the MR is registered until drop; libibverbs does not change these fields.
        unsafe { self.ptr.as_ref() }
    }

    /// Start address of the region.
    pub fn addr(&self) -> u64 {
        self.raw().addr as u64
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.raw().length
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once here.
        let ret = unsafe { ffi::ibv_dereg_mr(self.ptr.as_ptr()) };
        dec(&live::MRS);
        if ret != 0 {
            tracing::warn!("ibv_dereg_mr: {}", ret_err(ret));
        }
    }
}

/// One work completion, copied out of `ibv_wc`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) byte_len: u32,
    /// Immediate data in host order, when the completion carries one.
    pub(crate) imm: Option<u32>,
    pub(crate) qp_num: u32,
}

/// A completion queue (`ibv_cq`).
pub struct Cq {
    ptr: NonNull<ffi::ibv_cq>,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context; polling one CQ from several threads is allowed by libibverbs.
unsafe impl Sync for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq").finish_non_exhaustive()
    }
}

/// Most completions taken out of a CQ by one poll.
pub(crate) const POLL_BATCH: usize = 32;

impl Cq {
    /// Creates a completion queue of at least `cqe` entries.
    pub fn new(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<Cq>, Error> {
        let n = c_int::try_from(cqe).unwrap_or(c_int::MAX);
        // SAFETY: the context is open; no completion channel, no user context.
        let p =
            unsafe { ffi::ibv_create_cq(ctx.ptr.as_ptr(), n, ptr::null_mut(), ptr::null_mut(), 0) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::CreateCq {
            cqe,
            source: last_err(),
        })?;
        inc(&live::CQS);
        Ok(Arc::new(Cq {
            ptr,
            _ctx: ctx.clone(),
        }))
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions into `out`.
    #[inline(always)]
    pub(crate) fn poll(&self, out: &mut [Wc]) -> io::Result<usize> {
        let mut raw = [const { std::mem::MaybeUninit::<ffi::ibv_wc>::uninit() }; POLL_BATCH];
        let want = out.len().min(POLL_BATCH) as c_int;
        // SAFETY: the CQ is alive; `raw` has room for `want` entries, which the provider
        // writes (the first `n` of them) before returning `n`.
        let n = unsafe { ffi::ibv_poll_cq(self.ptr.as_ptr(), want, raw.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq returned {n}")));
        }
        let n = n as usize;
        for (o, w) in out.iter_mut().zip(&raw[..n]) {
            // SAFETY: the provider initialised the first `n` entries.
            let w = unsafe { w.assume_init_ref() };
            let with_imm = w.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            *o = Wc {
                wr_id: w.wr_id,
                status: w.status,
                byte_len: w.byte_len,
                // SAFETY: the union holds imm_data when IBV_WC_WITH_IMM is set; both
                // members are u32, so any value is valid.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data })),
                qp_num: w.qp_num,
            };
        }
        Ok(n)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold an Arc to it, so they are destroyed already.
        let ret = unsafe { ffi::ibv_destroy_cq(self.ptr.as_ptr()) };
        dec(&live::CQS);
        if ret != 0 {
            tracing::warn!("ibv_destroy_cq: {}", ret_err(ret));
        }
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct Srq {
    ptr: NonNull<ffi::ibv_srq>,
    max_wr: u32,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Srq {}
// SAFETY: see Context.
unsafe impl Sync for Srq {}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq").field("max_wr", &self.max_wr).finish()
    }
}

impl Srq {
    /// Creates a shared receive queue of `max_wr` single-SGE receives.
    pub fn new(pd: &Arc<Pd>, max_wr: u32) -> Result<Arc<Srq>, Error> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = 1;
        // SAFETY: the PD is alive; `attr` is valid and updated in place with actual sizes.
        let p = unsafe { ffi::ibv_create_srq(pd.ptr.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::CreateSrq {
            max_wr,
            source: last_err(),
        })?;
        inc(&live::SRQS);
        Ok(Arc::new(Srq {
            ptr,
            max_wr: attr.attr.max_wr,
            _pd: pd.clone(),
        }))
    }

    /// Capacity in receives.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Posts one receive of `[addr, addr + len)`.
    ///
    /// # Safety
    /// The range lies inside a registered region with `lkey` and is neither read nor written
    /// by anyone else until its completion is polled (or the SRQ is destroyed).
    pub(crate) unsafe fn post_recv(
        &self,
        wr_id: u64,
        addr: u64,
        len: u32,
        lkey: u32,
    ) -> io::Result<()> {
        let mut sge = ffi::ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the SRQ is alive; wr/sge are valid for the call; the caller guarantees
        // the buffer.
        let ret = unsafe { ffi::ibv_post_srq_recv(self.ptr.as_ptr(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(ret_err(ret));
        }
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: QPs attached to this SRQ hold an Arc to it and are gone.
        let ret = unsafe { ffi::ibv_destroy_srq(self.ptr.as_ptr()) };
        dec(&live::SRQS);
        if ret != 0 {
            tracing::warn!("ibv_destroy_srq: {}", ret_err(ret));
        }
    }
}

/// Where a queue pair or address handle sends to: a RoCE/IB address vector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddrVec {
    pub(crate) port: u8,
    pub(crate) dlid: u16,
    pub(crate) dgid: [u8; 16],
    pub(crate) sgid_index: u8,
    /// Use a global route header (always on RoCE).
    pub(crate) global: bool,
}

impl AddrVec {
    fn to_ffi(self) -> ffi::ibv_ah_attr {
        ffi::ibv_ah_attr {
            grh: ffi::ibv_global_route {
                dgid: ffi::ibv_gid { raw: self.dgid },
                flow_label: 0,
                sgid_index: self.sgid_index,
                hop_limit: 64,
                traffic_class: 0,
            },
            dlid: self.dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: u8::from(self.global),
            port_num: self.port,
        }
    }
}

/// An address handle (`ibv_ah`) for unreliable-datagram sends.
pub(crate) struct Ah {
    ptr: NonNull<ffi::ibv_ah>,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Ah {}
// SAFETY: see Context.
unsafe impl Sync for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").finish_non_exhaustive()
    }
}

impl Ah {
    pub(crate) fn new(pd: &Arc<Pd>, av: AddrVec) -> Result<Ah, Error> {
        let mut attr = av.to_ffi();
        // SAFETY: the PD is alive; `attr` is a valid address vector.
        let p = unsafe { ffi::ibv_create_ah(pd.ptr.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::CreateAh { source: last_err() })?;
        inc(&live::AHS);
        Ok(Ah {
            ptr,
            _pd: pd.clone(),
        })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; sends using it hold a reference to it
        // until they complete (the endpoint keeps AHs for its lifetime).
        let ret = unsafe { ffi::ibv_destroy_ah(self.ptr.as_ptr()) };
        dec(&live::AHS);
        if ret != 0 {
            tracing::warn!("ibv_destroy_ah: {}", ret_err(ret));
        }
    }
}

/// QP state marker: just created.
#[derive(Debug)]
pub struct Reset;
/// QP state marker: initialised (receives may be posted).
#[derive(Debug)]
pub struct Init;
/// QP state marker: ready to receive.
#[derive(Debug)]
pub struct Rtr;
/// QP state marker: ready to send.
#[derive(Debug)]
pub struct Rts;

/// Queue pair transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
}

struct QpInner {
    ptr: NonNull<ffi::ibv_qp>,
    ty: QpType,
    qpn: u32,
    max_inline: u32,
    max_send_wr: u32,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: created in `Qp::create`, destroyed once; its CQs, SRQ and PD outlive it
        // through the Arcs held beside.
        let ret = unsafe { ffi::ibv_destroy_qp(self.ptr.as_ptr()) };
        dec(&live::QPS);
        if ret != 0 {
            tracing::warn!("ibv_destroy_qp({}): {}", self.qpn, ret_err(ret));
        }
    }
}

/// A queue pair (`ibv_qp`) in state `S` (one of [`Reset`], [`Init`], [`Rtr`], [`Rts`]).
pub struct Qp<S> {
    inner: QpInner,
    _state: PhantomData<S>,
}

// SAFETY: see Context; the QP is destroyed only on drop.
unsafe impl<S> Send for Qp<S> {}
// SAFETY: see Context; posting to one QP from several threads is allowed by libibverbs.
unsafe impl<S> Sync for Qp<S> {}

impl<S> std::fmt::Debug for Qp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("type", &self.inner.ty)
            .field("qpn", &self.inner.qpn)
            .field("state", &std::any::type_name::<S>())
            .finish()
    }
}

/// Sizes of a new queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_inline: u32,
}

/// Attributes of the INIT -> RTR transition of an RC queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RtrAttr {
    pub(crate) dest_qpn: u32,
    pub(crate) rq_psn: u32,
    pub(crate) mtu: u32,
    pub(crate) av: AddrVec,
    pub(crate) max_dest_rd_atomic: u8,
}

/// Attributes of the RTR -> RTS transition of an RC queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RtsAttr {
    pub(crate) sq_psn: u32,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout.
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) max_rd_atomic: u8,
}

impl<S> Qp<S> {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// Inline data the QP accepts per send (what the device granted).
    pub fn max_inline(&self) -> u32 {
        self.inner.max_inline
    }

    /// Send queue depth the device granted.
    pub fn max_send_wr(&self) -> u32 {
        self.inner.max_send_wr
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        to: &'static str,
    ) -> Result<(), Error> {
        // SAFETY: the QP is alive; `attr` is valid and `mask` names the fields set.
        let ret = unsafe { ffi::ibv_modify_qp(self.inner.ptr.as_ptr(), attr, mask.0 as c_int) };
        if ret != 0 {
            return Err(Error::ModifyQp {
                qpn: self.inner.qpn,
                to,
                source: ret_err(ret),
            });
        }
        Ok(())
    }

    fn into_state<T>(self) -> Qp<T> {
        Qp {
            inner: self.inner,
            _state: PhantomData,
        }
    }

    /// Moves the QP to the error state (flushes outstanding work requests).
    pub(crate) fn set_error(&self) -> Result<(), Error> {
        // SAFETY: plain C data; all-zero is valid.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE, "ERR")
    }
}

fn zeroed_attr() -> ffi::ibv_qp_attr {
    // SAFETY: plain C data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

impl Qp<Reset> {
    /// Creates a queue pair. RC queue pairs may receive from `srq`.
    pub(crate) fn create(
        pd: &Arc<Pd>,
        ty: QpType,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        srq: Option<&Arc<Srq>>,
        caps: QpCaps,
    ) -> Result<Qp<Reset>, Error> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.ptr.as_ptr();
        attr.recv_cq = recv_cq.ptr.as_ptr();
        attr.srq = srq.map_or(ptr::null_mut(), |s| s.ptr.as_ptr());
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = if srq.is_some() { 0 } else { caps.max_recv_wr };
        attr.cap.max_send_sge = caps.max_send_sge;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = caps.max_inline;
        attr.qp_type = match ty {
            QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
        };
        attr.sq_sig_all = 0;
        // SAFETY: the PD, CQs and SRQ are alive (and kept alive by the Arcs stored below);
        // `attr` is valid and updated in place with the granted capabilities.
        let p = unsafe { ffi::ibv_create_qp(pd.ptr.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p).ok_or_else(|| Error::CreateQp {
            qp_type: ty,
            source: last_err(),
        })?;
        // SAFETY: a freshly created QP; qp_num is immutable.
        let qpn = unsafe { ptr.as_ref() }.qp_num;
        inc(&live::QPS);
        Ok(Qp {
            inner: QpInner {
                ptr,
                ty,
                qpn,
                max_inline: attr.cap.max_inline_data,
                max_send_wr: attr.cap.max_send_wr,
                _pd: pd.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                _srq: srq.cloned(),
            },
            _state: PhantomData,
        })
    }

    /// RESET -> INIT of an RC queue pair (local write, remote read and write allowed).
    pub(crate) fn init_rc(self, port: u8) -> Result<Qp<Init>, Error> {
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0;
        use ffi::ibv_qp_attr_mask as m;
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        Ok(self.into_state())
    }

    /// RESET -> INIT -> RTR -> RTS of a UD queue pair with `qkey`.
    pub(crate) fn activate_ud(self, port: u8, qkey: u32, sq_psn: u32) -> Result<Qp<Rts>, Error> {
        use ffi::ibv_qp_attr_mask as m;
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
            "INIT",
        )?;
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, m::IBV_QP_STATE, "RTR")?;
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        self.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_SQ_PSN, "RTS")?;
        Ok(self.into_state())
    }
}

impl Qp<Init> {
    /// INIT -> RTR of an RC queue pair: connects it to the remote QP.
    pub(crate) fn rtr(self, r: RtrAttr) -> Result<Qp<Rtr>, Error> {
        use ffi::ibv_qp_attr_mask as m;
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = r.mtu;
        a.dest_qp_num = r.dest_qpn;
        a.rq_psn = r.rq_psn;
        a.max_dest_rd_atomic = r.max_dest_rd_atomic;
        a.min_rnr_timer = 12; // 0.64 ms
        a.ah_attr = r.av.to_ffi();
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        Ok(self.into_state())
    }
}

impl Qp<Rtr> {
    /// RTR -> RTS of an RC queue pair.
    pub(crate) fn rts(self, r: RtsAttr) -> Result<Qp<Rts>, Error> {
        use ffi::ibv_qp_attr_mask as m;
        let mut a = zeroed_attr();
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = r.sq_psn;
        a.timeout = r.timeout;
        a.retry_cnt = r.retry_cnt;
        a.rnr_retry = r.rnr_retry;
        a.max_rd_atomic = r.max_rd_atomic;
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        Ok(self.into_state())
    }
}

/// One scatter/gather element: `(addr, len, lkey)`.
pub(crate) type Sge = (u64, u32, u32);

/// What a send work request does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SendOp<'a> {
    /// SEND_WITH_IMM on an RC queue pair.
    SendImm { imm: u32 },
    /// RDMA READ from `(remote_addr, rkey)` into the (single) local SGE.
    Read { remote_addr: u64, rkey: u32 },
    /// RDMA WRITE of the (single) local SGE to `(remote_addr, rkey)`.
    Write { remote_addr: u64, rkey: u32 },
    /// SEND on a UD queue pair to `(ah, qpn, qkey)`.
    UdSend {
        ah: &'a Ah,
        remote_qpn: u32,
        qkey: u32,
    },
}

impl Qp<Rts> {
    /// Posts one send work request.
    ///
    /// # Safety
    /// Each SGE lies in a registered region with its lkey (unless `inline`, in which case
    /// the bytes are copied during the call and need only be readable now); non-inline
    /// SGEs (and, for a read, the destination) are not modified (for a read: not accessed)
    /// until the request's completion is known; an `ah` outlives the request.
    pub(crate) unsafe fn post_send(
        &self,
        wr_id: u64,
        sges: &[Sge],
        op: SendOp<'_>,
        signaled: bool,
        inline: bool,
    ) -> io::Result<()> {
        let mut list = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 2];
        if sges.len() > list.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut n = 0;
        for &(addr, length, lkey) in sges {
            if length > 0 {
                list[n] = ffi::ibv_sge { addr, length, lkey };
                n += 1;
            }
        }
        // SAFETY: plain C data (pointers and integers); all-zero is valid.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = n as c_int;
        let mut flags = ffi::ibv_send_flags(0);
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED;
        }
        if inline {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE;
        }
        wr.send_flags = flags.0;
        match op {
            SendOp::SendImm { imm } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::Read { remote_addr, rkey } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
                wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
            }
            SendOp::Write { remote_addr, rkey } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
            }
            SendOp::UdSend {
                ah,
                remote_qpn,
                qkey,
            } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
                wr.wr.ud = ffi::ud_t {
                    ah: ah.ptr.as_ptr(),
                    remote_qpn,
                    remote_qkey: qkey,
                };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive and in RTS; `wr` and `list` are valid for the call; the
        // caller guarantees the memory the SGEs name.
        let ret = unsafe { ffi::ibv_post_send(self.inner.ptr.as_ptr(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(ret_err(ret));
        }
        Ok(())
    }

    /// Posts one SEND_WITH_IMM of `a ++ b` with the bytes inline (copied during the call,
    /// so nothing is referenced afterwards): the small-message path, kept apart from
    /// [`Qp::post_send`] so that it builds only what it needs. A frame beyond the queue
    /// pair's max inline data is refused by the provider (an error, nothing sent).
    #[inline(always)]
    pub(crate) fn post_send_inline_imm(
        &self,
        wr_id: u64,
        a: &[u8],
        b: &[u8],
        imm: u32,
        signaled: bool,
    ) -> io::Result<()> {
        let mut list = [
            ffi::ibv_sge {
                addr: a.as_ptr() as u64,
                length: a.len() as u32,
                lkey: 0,
            },
            ffi::ibv_sge {
                addr: b.as_ptr() as u64,
                length: b.len() as u32,
                lkey: 0,
            },
        ];
        // SAFETY: plain C data (pointers and integers); all-zero is valid.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = if b.is_empty() { 1 } else { 2 };
        let mut flags = ffi::ibv_send_flags::IBV_SEND_INLINE;
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED;
        }
        wr.send_flags = flags.0;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive and in RTS; `wr` and `list` are valid for the call; with
        // IBV_SEND_INLINE the provider copies the bytes during the call, and `a` and `b`
        // are readable for its duration.
        let ret = unsafe { ffi::ibv_post_send(self.inner.ptr.as_ptr(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(ret_err(ret));
        }
        Ok(())
    }

    /// Posts one receive (UD queue pairs; RC queue pairs receive through their SRQ).
    ///
    /// # Safety
    /// As [`Srq::post_recv`].
    pub(crate) unsafe fn post_recv(
        &self,
        wr_id: u64,
        addr: u64,
        len: u32,
        lkey: u32,
    ) -> io::Result<()> {
        let mut sge = ffi::ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive; wr/sge valid for the call; caller guarantees the buffer.
        let ret = unsafe { ffi::ibv_post_recv(self.inner.ptr.as_ptr(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(ret_err(ret));
        }
        Ok(())
    }
}
