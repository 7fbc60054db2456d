//! README.md, "Collectives" (fences and communicators without the servers): a fence by
//! allgather and a communicator from `FabricGroup::create_comm`. Run with `weft run -n 4
//! [--nodes 2] target/debug/examples/readme_fabric_wire`; every rank prints the card it
//! got and the communicator's size.

// The README's blocks keep their layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fabric = Fabric::init()?;
    let world = fabric.world();
    // README: fabric-wire
    use weft::prelude::*; // FabricGroup for create_comm
    let wire = fabric.wire();
    wire.put(Scope::Global, "card", vec![1u8; 64])?;
    wire.commit()?;
    world.fence()?;                  // cards committed since the last fence move by allgather
    let card = wire.get(0, "card", GetOpts::default())?;   // answered from the fence's copy
    let session = Session::init(Info::new(), ErrHandler::Return)?;
    let group = session.group_from_pset("weft://world")?;
    let comm = group.create_comm("solver")?; // one allreduce among the members, no server
    // README end
    println!(
        "rank {} card of {} bytes, comm of {}",
        world.rank(),
        card.as_bytes().map_or(0, <[u8]>::len),
        comm.size()
    );
    comm.free()?;
    session.finalize()?;
    fabric.finalize()?;
    Ok(())
}
