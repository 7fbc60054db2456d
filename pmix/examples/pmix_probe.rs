//! A PMIx client run by a host engine (`mpirun.openmpi -n 4 target/debug/examples/pmix_probe`):
//! it checks what Weft's PMIx backend needs of the host, printing `rank R pmix ok ...`
//! or naming the first failure (exit status 1):
//!
//! 1. job information: job size, local rank and size, local peers, number of nodes,
//!    hostname (job-level keys read with the wildcard rank), the node list and the ranks
//!    on this node;
//! 2. put (global and local scopes) + commit + a fence collecting the data, then every
//!    other rank's card read from the local copy only (`local_only`);
//! 3. a second put + commit + a fence without data, then the cards fetched on demand
//!    (direct modex through the servers);
//! 4. a key nobody put: `NotFound` or `Timeout` within a few seconds, never a hang;
//! 5. a fence among the even ranks only; finalize.

use std::time::{Duration, Instant};

use weft_pmix::{keys, GetOpts, Pmix, PmixError, Scope};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn card(round: u32, rank: u32) -> Vec<u8> {
    (0..64 + rank as usize)
        .map(|i| (i as u32 ^ rank.wrapping_mul(31) ^ round) as u8)
        .collect()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("pmix_probe: {e}");
        std::process::exit(1);
    }
}

fn job_u32(px: &Pmix, k: &str) -> Res<u32> {
    px.get(None, k, GetOpts::default())?
        .as_u32()
        .ok_or_else(|| format!("{k}: not an integer").into())
}

fn run() -> Res<()> {
    let px = Pmix::init()?;
    let me = px.rank();
    let size = job_u32(&px, keys::JOB_SIZE)?;
    let mine = |k: &str| -> Res<u32> {
        px.get(Some(me), k, GetOpts::default())?
            .as_u32()
            .ok_or_else(|| format!("{k}: not an integer").into())
    };
    let local_rank = mine(keys::LOCAL_RANK)?;
    let local_size =
        job_u32(&px, keys::LOCAL_SIZE).or_else(|_| -> Res<u32> { mine(keys::LOCAL_SIZE) })?;
    let peers = px
        .get(None, keys::LOCAL_PEERS, GetOpts::default())
        .or_else(|_| px.get(Some(me), keys::LOCAL_PEERS, GetOpts::default()))?;
    let peers = peers
        .as_str()
        .ok_or("local peers: not a string")?
        .to_string();
    let nodes = job_u32(&px, keys::NUM_NODES)?;
    let host = px.get(Some(me), keys::HOSTNAME, GetOpts::default())?;
    let host = host.as_str().unwrap_or("?").to_string();
    if me >= size || local_rank >= local_size {
        return Err(format!("rank {me} of {size}, local rank {local_rank} of {local_size}").into());
    }
    if !peers.split(',').any(|p| p.parse() == Ok(me)) {
        return Err(format!("local peers {peers:?} do not name rank {me}").into());
    }
    let node_names = px.nodes()?;
    if node_names.len() as u32 != nodes || !node_names.contains(&host) {
        return Err(format!("nodes {node_names:?}: expected {nodes} naming {host}").into());
    }
    let here = px.peers_on(&host)?;
    let listed: Vec<u32> = peers.split(',').filter_map(|p| p.parse().ok()).collect();
    if here != listed {
        return Err(format!("peers on {host}: {here:?}, local peers {listed:?}").into());
    }

    // 2: collected fence, then local reads only.
    px.put(Scope::Global, "weft.card", &card(1, me))?;
    px.put(Scope::Local, "weft.local", &[me as u8; 3])?;
    px.commit()?;
    px.fence(None, true, Some(Duration::from_secs(60)))?;
    let local = GetOpts {
        local_only: true,
        ..GetOpts::default()
    };
    for r in (0..size).filter(|&r| r != me) {
        let got = px.get(Some(r), "weft.card", local)?;
        if got.as_bytes() != Some(&card(1, r)[..]) {
            return Err(format!("round 1: rank {r}'s card is {got:?}").into());
        }
    }

    // 3: fence without data; direct fetches.
    px.put(Scope::Global, "weft.card2", &card(2, me))?;
    px.commit()?;
    px.fence(None, false, None)?;
    let fetch = GetOpts {
        timeout: Some(Duration::from_secs(30)),
        ..GetOpts::default()
    };
    for r in (0..size).filter(|&r| r != me) {
        let got = px.get(Some(r), "weft.card2", fetch)?;
        if got.as_bytes() != Some(&card(2, r)[..]) {
            return Err(format!("round 2: rank {r}'s card is {got:?}").into());
        }
    }

    // 4: a key nobody put.
    let t = Instant::now();
    let peer = (me + 1) % size;
    match px.get(
        Some(peer),
        "weft.nobody-put-this",
        GetOpts {
            timeout: Some(Duration::from_secs(1)),
            ..GetOpts::default()
        },
    ) {
        Err(PmixError::NotFound { .. }) | Err(PmixError::Timeout { .. }) => {}
        other => return Err(format!("a missing key gave {other:?}").into()),
    }
    let missing_ms = t.elapsed().as_millis();
    if t.elapsed() > Duration::from_secs(10) {
        return Err(format!("a missing key took {missing_ms} ms").into());
    }

    // 5: a fence among the even ranks.
    if me % 2 == 0 {
        let evens: Vec<u32> = (0..size).filter(|r| r % 2 == 0).collect();
        px.fence(Some(&evens), false, Some(Duration::from_secs(60)))?;
    }
    println!(
        "rank {me} pmix ok: nspace {} size {size} local {local_rank}/{local_size} peers {peers} \
         nodes {nodes} host {host} missing-key {missing_ms} ms",
        px.nspace()
    );
    px.finalize()?;
    Ok(())
}
