//! The shared receive queue (`ibv_srq`).

use std::io;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, Pd};

/// A shared receive queue (`ibv_srq`).
pub struct Srq {
    pub(super) ptr: NonNull<ffi::ibv_srq>,
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
