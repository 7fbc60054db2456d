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

use weft_fabric::sched::DERIVED_CTX;

/// (shift, bits) of each level of the path.
const LEVELS: [(u32, u32); 4] = [(24, 16), (16, 8), (8, 8), (0, 8)];
const BASE_SHIFT: u32 = 40;
const BASE_BITS: u32 = 22;

/// How many children a communicator of id `parent` may derive (its level's counter
/// range), or 0 if its path is full.
pub(crate) fn capacity(parent: u64) -> u32 {
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
