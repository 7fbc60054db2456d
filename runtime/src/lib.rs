//! Weft's runtime: the launcher (`weft run`, [`launcher::run`]) and the per-node wire-up
//! server (`weft server`, [`server::run`]) that starts a node's processes, keeps its
//! datastore and runs fences, gets, groups and process sets with the other nodes'
//! servers. Processes talk to it through `weft-wireup`'s client, whose protocol
//! (`weft_wireup::proto`) both sides share.
#![forbid(unsafe_code)]

pub mod launcher;
mod modex;
pub mod server;
