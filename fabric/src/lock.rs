//! The engine's lock: a test-and-set lock whose release is one plain store.
//!
//! `std::sync::Mutex` releases with an atomic swap (to learn whether a thread sleeps on
//! it), a locked instruction that also waits for the store buffer to drain: on the
//! shared-memory fast path, right after the store that publishes a message. A blocking
//! receive and the send that answers it take and release the engine once each, so the
//! swap sat twice in every turnaround. Here a thread that finds the lock taken spins
//! briefly, then yields, then sleeps in short naps: the engine is only ever held for the
//! length of one call into the transports, and wait loops let go of it whenever another
//! thread waits (see `Inner::pause`).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Spins before the first yield.
const SPINS: u32 = 64;
/// Yields before napping.
const YIELDS: u32 = 64;
/// One nap of a thread that keeps finding the lock taken.
const NAP: Duration = Duration::from_micros(20);

/// A value behind a test-and-set lock whose release is one plain store (see the module's
/// documentation): for state held briefly on fast paths, such as a collective library's
/// per-communicator state, where `std::sync::Mutex`'s release would wait for the store
/// buffer to drain right after the store that publishes a flag.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out the value to one thread at a time, so sharing the lock
// between threads moves the value between them: `T: Send` is all that needs.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> std::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinLock").finish_non_exhaustive()
    }
}

impl<T> SpinLock<T> {
    /// A lock holding `value`.
    pub fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, if no other thread holds it: one compare-and-swap.
    #[inline]
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        // SYNC: Acquire pairs with the Release store in `Guard::drop`: the previous
        // holder's writes to the value happen before ours.
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Lazily: a guard built and dropped after a failed swap would unlock.
            .then(|| Guard {
                lock: self,
                _value: PhantomData,
            })
    }

    /// The value, waiting for it: spins, then yields, then naps.
    pub fn lock(&self) -> Guard<'_, T> {
        let mut tries = 0u32;
        loop {
            // Relaxed: a hint before the compare-and-swap, which orders.
            if !self.locked.load(Ordering::Relaxed) {
                if let Some(g) = self.try_lock() {
                    return g;
                }
            }
            tries = tries.saturating_add(1);
            if tries <= SPINS {
                std::hint::spin_loop();
            } else if tries <= SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }
}

impl<T> std::fmt::Debug for Guard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

/// The locked value; dropping it releases the lock (also while unwinding: the engine's
/// queues are consistent between calls, so a panic does not poison it).
pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
    /// The guard lends out `&mut T`: it is `Send` and `Sync` only as that is.
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only use of the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SYNC: pairs with the Acquire compare-and-swap in `try_lock`: our writes to the
        // value happen before the next holder's reads.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Threads incrementing a plain counter under the lock lose no increment, and one
    /// that holds the lock keeps others out (try_lock fails).
    #[test]
    fn excludes_other_threads() {
        let lock = Arc::new(SpinLock::new(0u64));
        {
            let _g = lock.lock();
            let l2 = lock.clone();
            let other = std::thread::spawn(move || l2.try_lock().is_none());
            assert!(other.join().unwrap(), "try_lock succeeded while held");
        }
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 80_000);
    }
}
