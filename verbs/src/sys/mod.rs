//! The verbs objects: the only module that names `rdma_mummy_sys`.
//!
//! Each object owns its verbs handle and destroys it on drop; each holds an `Arc` to the
//! object it was created from (Qp -> Pd, Cq, Srq; Mr, Srq, Ah -> Pd; Pd, Cq -> Context), so a
//! parent is only destroyed after all its children. Queue pair states are types: `Qp<Reset>`
//! becomes `Qp<Init>`, `Qp<Rtr>` and `Qp<Rts>` by consuming transitions, and only a `Qp<Rts>`
//! can post sends. Posting work requests that name raw memory is crate-internal and `unsafe`;
//! users of the crate go through [`crate::Endpoint`].

mod ah;
mod context;
mod cq;
mod mr;
mod pd;
mod qp;
mod srq;

use std::io;
use std::os::raw::c_int;

use rdma_mummy_sys as ffi;

pub(crate) use ah::Ah;
pub use context::Context;
pub(crate) use context::{
    device_names, mtu_bytes, port_state_name, GidKind, LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND,
    PORT_ACTIVE,
};
pub use cq::Cq;
pub(crate) use cq::{wc_status_str, Wc, POLL_BATCH, WC_SUCCESS};
pub use mr::Mr;
pub use pd::Pd;
pub use qp::{Init, Qp, QpType, Reset, Rtr, Rts};
pub(crate) use qp::{QpCaps, RtrAttr, RtsAttr, SendOp, Sge};
pub use srq::Srq;

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
