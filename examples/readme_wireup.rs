//! README.md, "Running jobs" and "Collectives" (the groups underneath): the wire-up
//! client's put/commit/fence/get, then a group construct with an event handler. Run with
//! `weft run -n 6 [--nodes 2] target/debug/examples/readme_wireup` (the README's get asks
//! rank 5); every rank prints what it got and `readme_wireup ok`.

// The README's blocks keep their layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let card_bytes = format!("card of rank {}", std::env::var("WEFT_RANK")?).into_bytes();
    // README: wireup-client
    use std::time::Duration;
    use weft::wireup::{Client, FenceMode, GetOpts, Procs, Scope};

    let wire = Client::init()?;                        // job info is available now
    wire.put(Scope::Global, "my.card", card_bytes)?;  // Local, Remote or Global
    wire.commit()?;
    wire.fence(Procs::All, FenceMode::Sparse, Some(Duration::from_secs(30)))?;
    let peer_card = wire.get(5, "my.card", GetOpts::default())?; // pulled on demand, then cached
    // README end
    let got = String::from_utf8_lossy(peer_card.as_bytes().ok_or("a card is bytes")?).into_owned();
    println!("rank {} got {got:?}", wire.rank());
    let members: Vec<u32> = (0..wire.size()).collect();
    let timeout = Duration::from_secs(30);
    // README: wireup-groups
    use weft::wireup::{EventCode, EventCodes, EventFlow, GroupDirectives};
    let g = wire.group_construct("solver", &members,
        &GroupDirectives::default().assign_context_id().notify_termination().leader(0), Some(timeout))?;
    // g.members, g.pgcid, g.left_out; members' committed cards are now on the node
    wire.register_event_handler(EventCodes::One(EventCode::MemberFailed), |ev, _| {
        eprintln!("{:?} left {:?}", ev.rank, ev.group); EventFlow::Continue });
    wire.process_events(Duration::from_millis(10));          // handlers also run inside Weft calls
    wire.group_destruct("solver", Some(timeout))?;
    // README end
    println!(
        "rank {} group of {} pgcid {:?}",
        wire.rank(),
        g.members.len(),
        g.pgcid
    );
    wire.finalize()?;
    println!("readme_wireup ok");
    Ok(())
}
