//! Context ids derived locally for dup, split and create (no server round trip).
//!
//! A derived id is `DERIVED_CTX | base << 40 | path`: `base` is the root server's PGCID
//! the family started from (22 bits: PGCIDs below 4 M), and `path` (40 bits) the child
//! counters along the way down, one level per generation, filled from the top: level 0
//! (16 bits, 65,535 children of a server-made communicator), levels 1 to 3 (8 bits, 255
//! children each). A child fills the first empty level of its parent's path with the
//! parent's next counter (never 0), so:
//!
//! - every member computes the same id from the parent's id and its counter, which every
//!   member advances alike (collectives on a communicator run in the same order);
//! - ids are unique in the job for its whole life: distinct (parent, counter) pairs give
//!   distinct paths, and the `DERIVED_CTX` bit keeps them apart from PGCIDs;
//! - the limits are depth 4 below a PGCID and the counts above; past them (or for a
//!   PGCID of 4 M or more) the collective asks the root server for a PGCID instead, and
//!   that communicator starts a family of its own.
//!
//! Communicators made from session groups by their members ([`crate::FabricGroup`]) take
//! ids of base 0, which no PGCID is (the root server counts from 1):
//! `DERIVED_CTX | leader << 20 | counter`, where `leader` is the job rank of the group's
//! first member (below 2^19) and `counter` that process's count of such communicators it
//! led (1 to 2^20 - 1), so no two ever share one; past the limits the members ask the
//! root server instead. Their members agree on the id over a bootstrap id
//! `DERIVED_CTX | 1 << 39 | hash` (39 bits of a hash of the tag, the members and how
//! often they made one with both). Such communicators derive no children of their own:
//! their dup and split get a PGCID from the root server and start a family there.

use weft_fabric::sched::DERIVED_CTX;

/// (shift, bits) of each level of the path.
const LEVELS: [(u32, u32); 4] = [(24, 16), (16, 8), (8, 8), (0, 8)];
const BASE_SHIFT: u32 = 40;
const BASE_BITS: u32 = 22;

/// How many children a communicator of id `parent` may derive (its level's counter
/// range), or 0 if its path is full.
pub(crate) fn capacity(parent: u64) -> u32 {
    if is_group_made(parent) {
        return 0;
    }
    let path = if parent & DERIVED_CTX != 0 {
        parent & ((1 << BASE_SHIFT) - 1)
    } else {
        0
    };
    LEVELS
        .iter()
        .find(|&&(sh, bits)| (path >> sh) & ((1 << bits) - 1) == 0)
        .map_or(0, |&(_, bits)| (1u32 << bits) - 1)
}

/// The id of child number `counter` (from 1) of `parent`, or `None` past the limits.
pub(crate) fn derive(parent: u64, counter: u64) -> Option<u64> {
    if is_group_made(parent) {
        return None;
    }
    let (base, path) = if parent & DERIVED_CTX != 0 {
        (
            (parent >> BASE_SHIFT) & ((1 << BASE_BITS) - 1),
            parent & ((1 << BASE_SHIFT) - 1),
        )
    } else if parent < 1 << BASE_BITS {
        (parent, 0)
    } else {
        return None;
    };
    let &(sh, bits) = LEVELS
        .iter()
        .find(|&&(sh, bits)| (path >> sh) & ((1 << bits) - 1) == 0)?;
    if counter == 0 || counter >= 1 << bits {
        return None;
    }
    Some(DERIVED_CTX | base << BASE_SHIFT | path | counter << sh)
}

/// Whether `id` was made from a group by its members (or is such a bootstrap id).
fn is_group_made(id: u64) -> bool {
    id & DERIVED_CTX != 0 && (id >> BASE_SHIFT) & ((1 << BASE_BITS) - 1) == 0
}

const LEADER_BITS: u32 = 19;
const COUNTER_BITS: u32 = 20;

/// The id of the `counter`-th communicator (from 1) led by job rank `leader`, or `None`
/// past the limits.
pub(crate) fn from_group(leader: u64, counter: u64) -> Option<u64> {
    (leader < 1 << LEADER_BITS && (1..1 << COUNTER_BITS).contains(&counter))
        .then_some(DERIVED_CTX | leader << COUNTER_BITS | counter)
}

/// The bootstrap id for `hash`.
pub(crate) fn bootstrap(hash: u64) -> u64 {
    DERIVED_CTX | 1 << 39 | (hash & ((1 << 39) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn children_of_one_parent_and_of_different_parents_never_collide() {
        let mut seen = HashSet::new();
        // Server PGCIDs 1..4, three generations below each.
        for pg in 1u64..4 {
            assert!(seen.insert(pg));
            for c1 in 1..40 {
                let a = derive(pg, c1).unwrap();
                assert!(seen.insert(a), "{a:#x}");
                for c2 in 1..12 {
                    let b = derive(a, c2).unwrap();
                    assert!(seen.insert(b), "{b:#x}");
                    for c3 in 1..4 {
                        let c = derive(b, c3).unwrap();
                        assert!(seen.insert(c), "{c:#x}");
                    }
                }
            }
        }
        for id in &seen {
            assert_eq!(id & weft_fabric::sched::COLL_PLANE, 0);
        }
    }

    #[test]
    fn group_made_ids_never_meet_derived_ones_or_each_other() {
        let mut seen = HashSet::new();
        for pg in 1u64..3 {
            for c1 in 1..300 {
                seen.insert(derive(pg, c1).unwrap());
            }
        }
        let derived = seen.len();
        for leader in [0u64, 1, 7, (1 << 19) - 1] {
            for counter in [1u64, 2, 1000, (1 << 20) - 1] {
                let id = from_group(leader, counter).unwrap();
                assert!(seen.insert(id), "{id:#x}");
                assert_eq!(capacity(id), 0);
                assert!(derive(id, 1).is_none());
            }
        }
        assert_eq!(seen.len(), derived + 16);
        assert!(from_group(1 << 19, 1).is_none());
        assert!(from_group(0, 0).is_none());
        assert!(from_group(0, 1 << 20).is_none());
        for h in [0u64, 1, u64::MAX] {
            let b = bootstrap(h);
            assert!(!seen.contains(&b) && b & weft_fabric::sched::COLL_PLANE == 0);
            assert!(is_group_made(b) && capacity(b) == 0);
        }
    }

    #[test]
    fn limits_give_none() {
        assert_eq!(capacity(1), 65535);
        assert!(derive(1, 65535).is_some());
        assert!(derive(1, 65536).is_none());
        assert!(derive(1, 0).is_none());
        assert!(derive(1 << 22, 1).is_none());
        let mut id = 5;
        for depth in 0..4 {
            id = derive(id, 255).unwrap_or_else(|| panic!("depth {depth}"));
        }
        assert_eq!(capacity(id), 0);
        assert!(derive(id, 1).is_none());
    }
}
