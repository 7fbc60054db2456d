//! Fences and communicators from groups over the fabric (no server in the data path):
//! every rank commits a card, `world.fence()` moves the cards, every rank reads its
//! neighbour's; then a communicator from the world group made by its members alone
//! (`FabricGroup::create_comm`) sums the ranks. Prints `rank R fabric demo ok`.
//!
//! `weft run -n 4 target/release/examples/fabric_demo`

use weft::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fabric = Fabric::init()?;
    let world = fabric.world();
    let wire = fabric.wire();
    let (me, n) = (world.rank(), world.size());
    wire.put(Scope::Global, "card", format!("card of rank {me}"))?;
    wire.commit()?;
    world.fence()?; // cards committed since the last fence move by allgather
    let next = (me + 1) % n;
    let card = wire.get(next, "card", GetOpts::default())?;
    if card != Value::Str(format!("card of rank {next}")) {
        return Err(format!("rank {me}: rank {next}'s card reads {card:?}").into());
    }
    let session = Session::init(Info::new(), ErrHandler::Return)?;
    let group = session.group_from_pset("weft://world")?;
    let comm = group.create_comm("demo")?; // one allreduce among the members, no server
    let mut sum = [0u32];
    comm.allreduce(&[me], &mut sum, Op::Sum)?;
    if sum[0] != n * (n - 1) / 2 {
        return Err(format!("rank {me}: sum {}", sum[0]).into());
    }
    println!("rank {me} fabric demo ok");
    comm.free()?;
    session.finalize()?;
    fabric.finalize()?;
    Ok(())
}
