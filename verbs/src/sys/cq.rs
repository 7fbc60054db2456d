//! The completion queue (`ibv_cq`) and the work completions polled from it.

use std::ffi::CStr;
use std::io;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, Context};

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
    pub(super) ptr: NonNull<ffi::ibv_cq>,
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
