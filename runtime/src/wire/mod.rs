//! The runtime's wire formats: the async frame codec ([`frame`]) and the messages only
//! servers and the launcher exchange ([`proto`]: `JobMsg`, `ToServer`, `ToLauncher`,
//! `JobPlan`), each beside what it re-exports of the client protocol in `weft-wireup`, so
//! that an application (which links only `weft-wireup`) builds neither tokio nor them.

pub mod frame;
pub mod proto;

#[cfg(test)]
pub(crate) mod fuzz;
