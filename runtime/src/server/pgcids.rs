//! The allocator of process-group context ids (PGCIDs): the root server (node 0) is the
//! only one that hands them out, so they are unique across the job.

/// The next PGCID to hand out, at the root server.
#[derive(Debug)]
pub(crate) struct Pgcids {
    next: u64,
}

impl Pgcids {
    /// The allocator of a job whose world communicator has PGCID `world`.
    pub(crate) fn new(world: u64) -> Pgcids {
        Pgcids { next: world + 1 }
    }

    /// A PGCID not handed out before.
    pub(crate) fn take(&mut self) -> u64 {
        let p = self.next;
        self.next += 1;
        p
    }
}

#[cfg(test)]
mod tests {
    use super::Pgcids;

    #[test]
    fn pgcids_are_handed_out_once_each_after_the_worlds() {
        let mut p = Pgcids::new(7);
        let got: Vec<u64> = (0..4).map(|_| p.take()).collect();
        assert_eq!(got, vec![8, 9, 10, 11]);
    }
}
