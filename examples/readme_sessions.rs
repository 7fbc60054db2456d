//! README.md, "Sessions, groups and communicators". Run with `weft run -n 4 [--nodes 2]
//! target/debug/examples/readme_sessions` (the group `incl` needs ranks 0 and 2); every
//! rank prints its rank and the communicator's context id.

// The README's blocks keep their layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // README: sessions
    use weft::prelude::*;

    let session = Session::init(Info::new().thread_level(ThreadLevel::Multiple), ErrHandler::Return)?;
    let world = session.group_from_pset("weft://world")?;     // or mpi://WORLD, weft://self, --pset names
    let evens = world.incl(&[0, 2])?;   // also union, intersection, difference, excl, compare
    let comm = Communicator::create_from_group(&world, "org.example.solver", ErrHandler::Return)?;
    println!("rank {} of {}, context id (PGCID) {}", comm.rank(), comm.size(), comm.context_id());
    comm.disconnect()?;                                       // or comm.free(): finalize syncs later
    session.finalize()?;
    // README end
    println!("evens has {} members", evens.size());
    Ok(())
}
