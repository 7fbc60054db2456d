//! Processes held in init for a debugger (`weft run --stop-in-init`, a tool's spawn with
//! `PMIX_DEBUG_STOP_IN_INIT`, a launcher started under `MPIR_being_debugged`): a Weft
//! program waits for its server's welcome, a PMIx one in `PMIx_Init` for
//! `PMIX_DEBUGGER_RELEASE`, until its job is released on this node.
//!
//! The release comes from the launcher ([`ToServer::Release`]: after `MPIR_Breakpoint`,
//! or passing on a PMIx tool's release). A PMIx process that says it waits
//! (`PMIX_READY_FOR_DEBUG`, sent once it registered for the release) after its job was
//! released is released at once: a release never overtakes a process still on its way
//! into `PMIx_Init`.
//!
//! [`ToServer::Release`]: crate::wire::proto::ToServer::Release

use tokio::sync::mpsc::UnboundedSender;
use weft_wireup::{NsId, ProcId, Rank};

use super::{Out, State};
use crate::modex::ConnId;

/// A native hello held until the release.
struct HeldHello {
    conn: ConnId,
    proc: ProcId,
    token: u64,
    tx: UnboundedSender<Out>,
}

/// A job's hold on this node.
pub(super) struct Hold {
    released: bool,
    hellos: Vec<HeldHello>,
    /// PMIx ranks that wait in `PMIx_Init` (said `PMIX_READY_FOR_DEBUG`).
    pmix_waiting: Vec<Rank>,
}

impl Hold {
    /// A job's hold: released already unless it is to stop in init.
    pub(super) fn new(stop_in_init: bool) -> Hold {
        Hold {
            released: !stop_in_init,
            hellos: Vec::new(),
            pmix_waiting: Vec::new(),
        }
    }
}

impl Hold {
    /// Whether the job's processes still wait for the release.
    pub(super) fn holds(&self) -> bool {
        !self.released
    }
}

impl State {
    /// Keeps a native hello of the focused job, which [`holds`](Hold::holds), until the
    /// release answers it.
    pub(super) fn hold_hello(
        &mut self,
        conn: ConnId,
        proc: ProcId,
        token: u64,
        tx: UnboundedSender<Out>,
    ) {
        tracing::debug!("rank {} waits in init for a debugger", proc.rank);
        self.job.hold.hellos.push(HeldHello {
            conn,
            proc,
            token,
            tx,
        });
    }

    /// PMIx ranks `ranks` of the focused job wait in `PMIx_Init` for the release: told
    /// at once if their job was released already.
    pub(super) fn pmix_waits(&mut self, ranks: &[Rank]) {
        tracing::debug!("PMIx ranks {ranks:?} wait in init for a debugger");
        if self.job.hold.released {
            self.pmix_release(ranks);
        } else {
            self.job.hold.pmix_waiting.extend_from_slice(ranks);
        }
    }

    /// Job `ns` is released on this node: its held hellos are answered and its PMIx
    /// processes waiting in init get `PMIX_DEBUGGER_RELEASE` (unless `pmix_done`: a
    /// tool's release, which the PMIx library already gave them).
    pub(super) fn release(&mut self, ns: NsId, pmix_done: bool) {
        if !self.focus(ns) || self.job.hold.released {
            return;
        }
        let hold = &mut self.job.hold;
        hold.released = true;
        let hellos = std::mem::take(&mut hold.hellos);
        let waiting = std::mem::take(&mut hold.pmix_waiting);
        tracing::debug!(
            "{ns} released: {} native and {} PMIx processes here go on",
            hellos.len(),
            if pmix_done { 0 } else { waiting.len() }
        );
        for h in hellos {
            self.on_hello(h.conn, h.proc, h.token, h.tx);
        }
        if !pmix_done && !waiting.is_empty() {
            self.pmix_release(&waiting);
        }
    }

    /// `PMIX_DEBUGGER_RELEASE` to the focused job's PMIx processes `ranks`.
    fn pmix_release(&self, ranks: &[Rank]) {
        if let (Some(px), Some(pj)) = (self.pmix.as_ref(), self.job.pmix.as_ref()) {
            px.server.notify_release(&pj.nspace, ranks);
        }
    }
}
