//! The queue pair (`ibv_qp`): typestate transitions and posting work requests.

use std::io;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::Error;

use super::{dec, inc, last_err, live, ret_err, AddrVec, Ah, Cq, Pd, Srq};

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
