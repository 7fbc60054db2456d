//! The protection domain (`ibv_pd`).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, Context};

/// A protection domain (`ibv_pd`).
pub struct Pd {
    pub(super) ptr: NonNull<ffi::ibv_pd>,
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
