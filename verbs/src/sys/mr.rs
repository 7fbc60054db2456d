//! The registered memory region (`ibv_mr`).

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, Pd};

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
