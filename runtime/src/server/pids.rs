//! Every process's pid, as tools see them (`PMIX_QUERY_PROC_TABLE`, the launcher's
//! MPIR table): this node's, as its processes start, reported to the launcher once all
//! have started; the other nodes', as the launcher passes their reports on. IO-free.

use weft_wireup::Rank;

/// A job's pids by rank (0: not started, or not known here yet).
#[derive(Debug, Default)]
pub(super) struct Pids {
    pids: Vec<u32>,
    /// Local ranks whose start (or failure to start) has not been reported yet.
    waiting: Vec<Rank>,
    /// This node's pids once they are all known, sent once.
    local: Vec<(Rank, u32)>,
}

impl Pids {
    /// A job of `size` ranks, `local` of them on this node.
    pub(super) fn new(size: usize, local: impl IntoIterator<Item = Rank>) -> Pids {
        Pids {
            pids: vec![0; size],
            waiting: local.into_iter().collect(),
            local: Vec::new(),
        }
    }

    /// Local rank `rank` started as `pid` (`None`: it could not start). Once every local
    /// rank has, this node's pids (the ones that started) to report to the launcher.
    pub(super) fn on_spawned(&mut self, rank: Rank, pid: Option<u32>) -> Option<Vec<(Rank, u32)>> {
        let at = self.waiting.iter().position(|&r| r == rank)?;
        self.waiting.swap_remove(at);
        if let Some(pid) = pid {
            if let Some(p) = self.pids.get_mut(rank as usize) {
                *p = pid;
            }
            self.local.push((rank, pid));
        }
        if !self.waiting.is_empty() {
            return None;
        }
        let mut report = std::mem::take(&mut self.local);
        report.sort_unstable();
        Some(report)
    }

    /// Another node's pids, as the launcher passed them on (ranks out of range are
    /// ignored).
    pub(super) fn on_report(&mut self, pids: &[(Rank, u32)]) {
        for &(r, pid) in pids {
            if let Some(p) = self.pids.get_mut(r as usize) {
                *p = pid;
            }
        }
    }

    /// Rank `rank`'s pid (0: not known).
    pub(super) fn pid(&self, rank: Rank) -> u32 {
        self.pids.get(rank as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::Pids;

    #[test]
    fn the_local_report_waits_for_every_local_start_and_skips_failures() {
        let mut p = Pids::new(4, [1, 3]);
        assert_eq!(p.on_spawned(3, Some(300)), None);
        // A rank reported twice, or not local, changes nothing.
        assert_eq!(p.on_spawned(3, Some(301)), None);
        assert_eq!(p.on_spawned(0, Some(5)), None);
        assert_eq!(p.on_spawned(1, None), Some(vec![(3, 300)]));
        assert_eq!(p.pid(3), 300);
        assert_eq!(p.pid(1), 0);
        p.on_report(&[(0, 10), (2, 20), (9, 90)]);
        assert_eq!((p.pid(0), p.pid(2), p.pid(9)), (10, 20, 0));
    }
}
