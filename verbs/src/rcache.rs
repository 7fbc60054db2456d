//! The registration cache: registered regions keyed by their page-aligned virtual address
//! range.
//!
//! Correctness rule: an entry is valid only while the same pages back its range. Memory that
//! is unmapped or freed and then reused must be invalidated ([`crate::Endpoint::invalidate`])
//! before it is used with verbs again; the cache does not intercept `munmap`/`free`.
//! Entries are disjoint: inserting a range first evicts every entry that overlaps it, so a
//! lookup only has to check the closest entry starting at or below the address. An evicted
//! region is deregistered when its last user lets go of it (an in-flight RDMA read keeps its
//! `Arc`).

use std::collections::BTreeMap;
use std::sync::Arc;

/// Page size used for alignment (registrations cover whole pages).
pub(crate) const PAGE: u64 = 4096;

/// Page-aligned `[start, end)` covering `[addr, addr + len)`.
pub(crate) fn page_range(addr: u64, len: usize) -> (u64, u64) {
    let start = addr & !(PAGE - 1);
    let end = (addr + len.max(1) as u64).div_ceil(PAGE) * PAGE;
    (start, end)
}

#[derive(Debug)]
struct Entry<T> {
    end: u64,
    value: Arc<T>,
    last_use: u64,
}

/// Cache counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RcacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Entries removed by `invalidate`, overlap or the size limit.
    pub evictions: u64,
    /// Entries now.
    pub entries: usize,
}

/// The cache (generic over the registration so the index logic is testable alone).
#[derive(Debug)]
pub(crate) struct RegCache<T> {
    map: BTreeMap<u64, Entry<T>>,
    max: usize,
    clock: u64,
    stats: RcacheStats,
}

impl<T> RegCache<T> {
    pub(crate) fn new(max: usize) -> Self {
        RegCache {
            map: BTreeMap::new(),
            max: max.max(1),
            clock: 0,
            stats: RcacheStats::default(),
        }
    }

    /// The entry covering `[start, end)`, if any.
    pub(crate) fn lookup(&mut self, start: u64, end: u64) -> Option<Arc<T>> {
        self.clock += 1;
        let clock = self.clock;
        match self.map.range_mut(..=start).next_back() {
            Some((_, e)) if e.end >= end => {
                e.last_use = clock;
                self.stats.hits += 1;
                Some(e.value.clone())
            }
            _ => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Inserts a registration of `[start, end)`, evicting overlapping entries and, beyond
    /// the size limit, the least recently used one.
    pub(crate) fn insert(&mut self, start: u64, end: u64, value: Arc<T>) {
        self.invalidate(start, end);
        self.clock += 1;
        self.map.insert(
            start,
            Entry {
                end,
                value,
                last_use: self.clock,
            },
        );
        while self.map.len() > self.max {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.map.remove(&k);
                self.stats.evictions += 1;
            }
        }
    }

    /// Removes every entry overlapping `[start, end)`; returns how many.
    pub(crate) fn invalidate(&mut self, start: u64, end: u64) -> usize {
        let doomed: Vec<u64> = self
            .map
            .range(..end)
            .filter(|(s, e)| **s < end && e.end > start)
            .map(|(s, _)| *s)
            .collect();
        for s in &doomed {
            self.map.remove(s);
        }
        self.stats.evictions += doomed.len() as u64;
        doomed.len()
    }

    pub(crate) fn stats(&self) -> RcacheStats {
        RcacheStats {
            entries: self.map.len(),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges_cover_the_buffer() {
        assert_eq!(page_range(4096, 1), (4096, 8192));
        assert_eq!(page_range(4095, 2), (0, 8192));
        assert_eq!(page_range(8192, 4096), (8192, 12288));
        assert_eq!(page_range(8192, 0), (8192, 12288));
    }

    #[test]
    fn hits_inside_misses_outside() {
        let mut c = RegCache::new(8);
        c.insert(4096, 16384, Arc::new(1));
        assert_eq!(c.lookup(4096, 8192).as_deref(), Some(&1));
        assert_eq!(c.lookup(8192, 16384).as_deref(), Some(&1));
        assert!(c.lookup(8192, 20480).is_none(), "extends past the entry");
        assert!(c.lookup(0, 4096).is_none(), "below the entry");
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (2, 2, 1));
    }

    #[test]
    fn invalidate_removes_overlapping_entries_only() {
        let mut c = RegCache::new(8);
        c.insert(0, 4096, Arc::new(0));
        c.insert(8192, 16384, Arc::new(1));
        c.insert(16384, 20480, Arc::new(2));
        assert_eq!(c.invalidate(12288, 16385), 2);
        assert!(c.lookup(8192, 12288).is_none());
        assert!(c.lookup(16384, 20480).is_none());
        assert_eq!(c.lookup(0, 4096).as_deref(), Some(&0));
        assert_eq!(
            c.invalidate(4096, 8192),
            0,
            "touching ranges do not overlap"
        );
    }

    #[test]
    fn insert_replaces_overlaps_and_keeps_entries_disjoint() {
        let mut c = RegCache::new(8);
        c.insert(0, 8192, Arc::new(0));
        c.insert(4096, 12288, Arc::new(1));
        assert!(c.lookup(0, 4096).is_none(), "the overlapped entry is gone");
        assert_eq!(c.lookup(4096, 12288).as_deref(), Some(&1));
        assert_eq!(c.stats().entries, 1);
    }

    #[test]
    fn lru_eviction_beyond_the_limit_keeps_users_alive() {
        let mut c = RegCache::new(2);
        let a = Arc::new(10);
        c.insert(0, 4096, a.clone());
        c.insert(4096, 8192, Arc::new(11));
        c.lookup(0, 4096); // a is now the most recently used
        c.insert(8192, 12288, Arc::new(12));
        assert!(
            c.lookup(4096, 8192).is_none(),
            "least recently used evicted"
        );
        assert!(c.lookup(0, 4096).is_some());
        c.invalidate(0, 4096);
        assert_eq!(
            Arc::strong_count(&a),
            1,
            "the cache let go; the in-flight user still holds it"
        );
    }
}
