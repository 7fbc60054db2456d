//! The device context (`ibv_context`): opening a device, device and port queries.

use std::ffi::CStr;
use std::io;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err};

/// Link layer values of `ibv_port_attr::link_layer` (an anonymous enum in verbs.h).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// Ethernet link layer (RoCE).
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

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
    pub(super) ptr: NonNull<ffi::ibv_context>,
    pub(super) name: String,
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
