//! docs/guide.md, "Publishing names": rank 0 publishes a name, every rank waits for it and
//! prints who published it. Run with `weft run -n 2 target/debug/examples/readme_names`.

// The guide's block keeps its layout here (tests/readme.rs compares them).
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // README: wireup-names
    use std::time::Duration;
    use weft::wireup::{Client, LookupOptions, NameRange, Persistence};

    let wire = Client::init()?;
    if wire.rank() == 0 {
        wire.publish(&[("my-port", b"127.0.0.1:4000".as_slice())], NameRange::Session, Persistence::Session)?;
    }
    // Every rank (and any other job of the runtime): wait up to 5 s for it.
    let wait = LookupOptions { wait: Some(Duration::from_secs(5)), ..Default::default() };
    let found = wire.lookup(&["my-port"], wait)?;
    println!("rank {}: {} published by {}:{}", wire.rank(), found[0].key, found[0].nspace, found[0].owner.rank);
    // README end
    wire.finalize()?;
    Ok(())
}
