//! The registration cache: registered regions keyed by their page-aligned virtual address
//! range `[start, end)`.
//!
//! Correctness rule: an entry is valid only while the same pages back its range. Memory that
//! is unmapped or freed and then reused must be invalidated ([`crate::Endpoint::invalidate`])
//! before it is used with verbs again; the cache does not intercept `munmap`/`free`.
//!
//! Lifetimes: the cache holds an `Arc` of each registration. An RDMA read in flight holds
//! another, so dropping a cache entry never pulls a registration from under the local NIC.
//! A region exposed to a peer ([`crate::Endpoint::register`]) is *pinned* until
//! [`crate::Endpoint::release`]: neither the size limit nor a new overlapping registration
//! evicts a pinned entry (the peer may be reading through its rkey). `invalidate` removes
//! the unpinned entries it overlaps and *dooms* the pinned ones: lookups skip a doomed entry
//! at once (its memory may be gone), and it is removed when its last pin goes (a transfer
//! in flight through a buffer sharing a page with the invalidated one finishes normally).

use std::collections::BTreeMap;
use std::sync::Arc;

/// Page size used for alignment (registrations cover whole pages).
pub(crate) const PAGE: u64 = 4096;

/// How many entries starting at or below an address a lookup examines.
const LOOKUP_DEPTH: usize = 16;

/// Page-aligned `[start, end)` covering `[addr, addr + len)`.
pub(crate) fn page_range(addr: u64, len: usize) -> (u64, u64) {
    let start = addr & !(PAGE - 1);
    let end = (addr + len.max(1) as u64).div_ceil(PAGE) * PAGE;
    (start, end)
}

/// A cache key: `(start, end, generation)`; the generation tells apart a doomed entry and
/// its replacement for the same range.
pub(crate) type Key = (u64, u64, u64);

#[derive(Debug)]
struct Entry<T> {
    value: Arc<T>,
    last_use: u64,
    pins: u32,
    /// Invalidated while pinned: never looked up again, removed at the last unpin.
    doomed: bool,
}

/// Registration cache counters.
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
    /// Entries pinned by exposures not yet released.
    pub pinned: usize,
}

/// The cache (generic over the registration so the index logic is testable alone).
#[derive(Debug)]
pub(crate) struct RegCache<T> {
    map: BTreeMap<Key, Entry<T>>,
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

    /// An entry covering `[start, end)`: its key and value.
    pub(crate) fn lookup(&mut self, start: u64, end: u64) -> Option<(Key, Arc<T>)> {
        self.clock += 1;
        let clock = self.clock;
        let hit = self
            .map
            .range_mut(..=(start, u64::MAX, u64::MAX))
            .rev()
            .take(LOOKUP_DEPTH)
            .find(|(k, e)| k.1 >= end && !e.doomed);
        match hit {
            Some((k, e)) => {
                e.last_use = clock;
                self.stats.hits += 1;
                Some((*k, e.value.clone()))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Inserts a registration of `[start, end)`, evicting the unpinned entries it overlaps
    /// and, beyond the size limit, the least recently used unpinned ones (never the new
    /// one, which its caller is about to use or pin).
    pub(crate) fn insert(&mut self, start: u64, end: u64, value: Arc<T>) -> Key {
        let doomed: Vec<Key> = self
            .map
            .range(..(end, 0, 0))
            .filter(|(k, e)| k.1 > start && e.pins == 0)
            .map(|(k, _)| *k)
            .collect();
        for k in &doomed {
            self.map.remove(k);
        }
        self.stats.evictions += doomed.len() as u64;
        self.clock += 1;
        let key = (start, end, self.clock);
        self.map.insert(
            key,
            Entry {
                value,
                last_use: self.clock,
                pins: 0,
                doomed: false,
            },
        );
        while self.map.len() > self.max {
            let oldest = self
                .map
                .iter()
                .filter(|(k, e)| e.pins == 0 && **k != key)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    self.map.remove(&k);
                    self.stats.evictions += 1;
                }
                None => break, // everything else is pinned
            }
        }
        key
    }

    /// Pins the entry `key` (an exposure in progress).
    pub(crate) fn pin(&mut self, key: Key) {
        if let Some(e) = self.map.get_mut(&key) {
            e.pins += 1;
        }
    }

    /// Unpins the entry `key` (removing it if it was doomed and this was its last pin);
    /// false if it is gone.
    pub(crate) fn unpin(&mut self, key: Key) -> bool {
        let Some(e) = self.map.get_mut(&key) else {
            return false;
        };
        e.pins = e.pins.saturating_sub(1);
        if e.pins == 0 && e.doomed {
            self.map.remove(&key);
            self.stats.evictions += 1;
        }
        true
    }

    /// Whether the entry `key` is pinned.
    pub(crate) fn is_pinned(&self, key: Key) -> bool {
        self.map.get(&key).is_some_and(|e| e.pins > 0)
    }

    /// Removes the entry `key`.
    pub(crate) fn remove(&mut self, key: Key) {
        if self.map.remove(&key).is_some() {
            self.stats.evictions += 1;
        }
    }

    /// Removes the unpinned entries overlapping `[start, end)` and dooms the pinned ones;
    /// returns how many entries were affected.
    pub(crate) fn invalidate(&mut self, start: u64, end: u64) -> usize {
        let hit: Vec<Key> = self
            .map
            .range(..(end, 0, 0))
            .filter(|(k, _)| k.1 > start)
            .map(|(k, _)| *k)
            .collect();
        for k in &hit {
            if let Some(e) = self.map.get_mut(k) {
                if e.pins > 0 {
                    e.doomed = true;
                } else {
                    self.map.remove(k);
                    self.stats.evictions += 1;
                }
            }
        }
        hit.len()
    }

    pub(crate) fn stats(&self) -> RcacheStats {
        RcacheStats {
            entries: self.map.len(),
            pinned: self.map.values().filter(|e| e.pins > 0).count(),
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
        let k = c.insert(4096, 16384, Arc::new(1));
        assert_eq!(c.lookup(4096, 8192).map(|h| *h.1), Some(1));
        assert_eq!(c.lookup(8192, 16384).map(|h| h.0), Some(k));
        assert!(c.lookup(8192, 20480).is_none(), "extends past the entry");
        assert!(c.lookup(0, 4096).is_none(), "below the entry");
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (2, 2, 1));
    }

    #[test]
    fn invalidate_removes_unpinned_and_dooms_pinned_entries() {
        let mut c = RegCache::new(8);
        c.insert(0, 4096, Arc::new(0));
        let k = c.insert(8192, 16384, Arc::new(1));
        c.insert(16384, 20480, Arc::new(2));
        c.pin(k);
        c.pin(k);
        assert_eq!(c.invalidate(12288, 16385), 2);
        assert!(
            c.lookup(8192, 12288).is_none(),
            "a doomed entry is not looked up"
        );
        assert!(c.lookup(16384, 20480).is_none());
        assert_eq!(c.lookup(0, 4096).map(|h| *h.1), Some(0));
        assert_eq!(
            c.invalidate(4096, 8192),
            0,
            "touching ranges do not overlap"
        );
        assert_eq!(c.stats().entries, 2, "the doomed entry stays while pinned");
        // A new registration of the same range lives beside the doomed one.
        let k2 = c.insert(8192, 16384, Arc::new(3));
        assert_ne!(k, k2);
        assert_eq!(c.lookup(8192, 16384).map(|h| *h.1), Some(3));
        assert!(c.unpin(k));
        assert_eq!(c.stats().entries, 3, "one pin left");
        assert!(c.unpin(k));
        assert_eq!(c.stats().entries, 2, "removed with its last pin");
        assert!(!c.unpin(k));
    }

    #[test]
    fn insert_replaces_unpinned_overlaps_and_keeps_pinned_ones() {
        let mut c = RegCache::new(8);
        c.insert(0, 8192, Arc::new(0));
        let k1 = c.insert(4096, 12288, Arc::new(1));
        assert!(c.lookup(0, 4096).is_none(), "the overlapped entry is gone");
        assert_eq!(c.lookup(4096, 12288).map(|h| *h.1), Some(1));
        // A pinned entry (exposed to a peer) survives an overlapping registration.
        c.pin(k1);
        c.insert(8192, 16384, Arc::new(2));
        assert_eq!(c.lookup(4096, 8192).map(|h| *h.1), Some(1));
        assert_eq!(c.lookup(12288, 16384).map(|h| *h.1), Some(2));
        assert_eq!(c.stats().pinned, 1);
        assert!(c.unpin(k1));
        c.insert(0, 20480, Arc::new(3));
        assert_eq!(c.stats().entries, 1, "unpinned overlaps are replaced");
    }

    #[test]
    fn lru_eviction_skips_pinned_entries_and_keeps_users_alive() {
        let mut c = RegCache::new(2);
        let a = Arc::new(10);
        let ka = c.insert(0, 4096, a.clone());
        c.insert(4096, 8192, Arc::new(11));
        c.lookup(0, 4096); // a is now the most recently used
        let k3 = c.insert(8192, 12288, Arc::new(12));
        assert!(
            c.lookup(4096, 8192).is_none(),
            "least recently used evicted"
        );
        assert!(c.lookup(0, 4096).is_some());
        c.pin(k3);
        c.pin(ka);
        c.insert(12288, 16384, Arc::new(13));
        assert_eq!(
            c.stats().entries,
            3,
            "pinned entries are not evicted by the limit"
        );
        c.unpin(ka);
        c.invalidate(0, 4096);
        assert_eq!(
            Arc::strong_count(&a),
            1,
            "the cache let go; the in-flight user still holds it"
        );
    }
}
