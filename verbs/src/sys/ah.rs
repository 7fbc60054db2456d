//! The address handle (`ibv_ah`) of unreliable-datagram sends.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, AddrVec, Pd};

/// An address handle (`ibv_ah`) for unreliable-datagram sends.
pub(crate) struct Ah {
    pub(super) ptr: NonNull<ffi::ibv_ah>,
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
