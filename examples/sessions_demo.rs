//! MPI-4 sessions on Weft: run with `weft run -n 4 .../examples/sessions_demo`.
//!
//! Each process inits a session, takes the `weft://world` process set as a group, and
//! creates two communicators from it with different tags (each gets its own PGCID from
//! the root server). A token goes around a ring on each communicator, both rings at
//! once with the same message tag, so messages would mix if the context ids did not
//! keep them apart. Each rank prints, per communicator, `comm TAG rank R size N pgcid P`
//! and exits 0 only if both rings completed with the right token.

use weft::prelude::*;

const TAGS: [&str; 2] = ["org.weft.demo.ring-a", "org.weft.demo.ring-b"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let session = Session::init(
        Info::new().thread_level(ThreadLevel::Funneled),
        ErrHandler::Return,
    )?;
    let world = session.group_from_pset("weft://world")?;
    let comms = TAGS
        .iter()
        .map(|t| Communicator::create_from_group(&world, t, ErrHandler::Return))
        .collect::<Result<Vec<_>, _>>()?;
    if comms[0].context_id() == comms[1].context_id() {
        return Err("both communicators got the same PGCID".into());
    }
    // Both rings at once: rank 0 starts a token on each (different start values), the
    // others pass it on adding their rank; messages of both use message tag 7.
    let (rank, size) = (comms[0].rank(), comms[0].size());
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let start = [1_000u64, 2_000_000];
    let mut tokens = [0u64; 2];
    if rank == 0 {
        for (c, s) in comms.iter().zip(start) {
            c.send(&[s], right, Tag(7))?;
        }
    }
    // Receive on the second communicator first: its message must not be the first one's.
    for i in [1usize, 0] {
        let mut t = [0u64];
        comms[i].recv(&mut t, Source::Rank(left), Tag(7))?;
        tokens[i] = t[0];
    }
    if rank != 0 {
        for (i, c) in comms.iter().enumerate() {
            c.send(&[tokens[i] + u64::from(rank)], right, Tag(7))?;
        }
    }
    let sum: u64 = (0..u64::from(size)).sum();
    for (i, c) in comms.iter().enumerate() {
        let want = if rank == 0 {
            start[i] + sum
        } else {
            start[i] + (0..u64::from(rank)).sum::<u64>()
        };
        if tokens[i] != want {
            return Err(format!(
                "ring on {} carried {} to rank {rank}, want {want}",
                TAGS[i], tokens[i]
            )
            .into());
        }
        println!(
            "comm {} rank {} size {} pgcid {}",
            TAGS[i],
            c.rank(),
            c.size(),
            c.context_id()
        );
    }
    for c in comms {
        c.disconnect()?;
    }
    session.finalize()?;
    Ok(())
}
