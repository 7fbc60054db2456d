//! [`Collectives::fence`](crate::Collectives::fence): a fence whose data moves over the
//! fabric. Each member's part (what it committed since its last fence, from its wire-up
//! client) goes to every member: an allgather of the parts' lengths (which alone is the
//! synchronization, and all there is when nothing was committed), then the parts (padded
//! to the largest with an allgather up to 64 KiB, which goes through the node's
//! shared-memory segment when the members share a node; an allgatherv above), each
//! handed to the client, whose gets answer from them first.

use weft_fabric::{Communicator, P2pError};

use crate::{CollError, Collectives};

const OP: &str = "fence";
/// Parts up to this many bytes move padded to the largest, with an allgather.
const PAD_MAX: usize = 64 << 10;

pub(crate) fn run(comm: &Communicator) -> Result<(), CollError> {
    let Some(wire) = comm.wire() else {
        return Err(CollError::InvalidArgs {
            op: OP,
            what: "this fabric runs without the wire-up service (start it with weft run)".into(),
        });
    };
    let n = comm.size() as usize;
    let part = wire.fence_contribution();
    let mut lens = vec![0u64; n];
    comm.allgather(&[part.len() as u64], &mut lens)?;
    if lens.iter().all(|&l| l == 0) {
        return Ok(());
    }
    let counts: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    let max = counts.iter().copied().max().unwrap_or(0);
    let (all, displs) = if max <= PAD_MAX {
        // Padded to equal blocks: an allgather (through the node's segment when the
        // members share a node).
        let mut mine = part;
        mine.resize(max, 0);
        let mut all = vec![0u8; max * n];
        comm.allgather(&mine, &mut all)?;
        (all, (0..n).map(|r| r * max).collect::<Vec<_>>())
    } else {
        let mut displs = Vec::with_capacity(n);
        let mut total = 0usize;
        for &c in &counts {
            displs.push(total);
            total += c;
        }
        let mut all = vec![0u8; total];
        comm.allgatherv(&part, &mut all, &counts, &displs)?;
        (all, displs)
    };
    for r in 0..n {
        if counts[r] == 0 {
            continue;
        }
        let job = comm.job_rank(r as u32);
        wire.fence_deliver(job, &all[displs[r]..displs[r] + counts[r]])
            .map_err(|e| CollError::Transport {
                op: OP,
                source: P2pError::Transport {
                    rank: r as u32,
                    reason: e.to_string(),
                },
            })?;
    }
    Ok(())
}
