//! Giving a model's memory back to the operating system once it is unloaded.
//!
//! glibc's malloc keeps freed memory for the next allocation rather than returning it. Its
//! dynamic thresholds make it worse for a server that loads and unloads models: after the
//! first large block is freed, blocks up to that size (a model's tensors, up to 32 MiB) come
//! from the arenas' heaps rather than their own mappings, and a heap's free top is trimmed only
//! above twice that size, so each load/unload cycle of SmolLM2 grew the RSS by ~40-80 MiB.
//! [`configure_allocator`] (once, when the registry is made) fixes the thresholds — blocks of
//! [`MMAP_THRESHOLD`] and more get their own mapping, a heap's free top above
//! [`TRIM_THRESHOLD`] goes back at once — and [`release_free_memory`] returns every free page
//! of every arena (`malloc_trim(0)`); the registry calls it after an unloaded model's engine
//! has stopped and its weights were dropped ([`after_unload`]).
//!
//! Invariants: only free memory is released (nothing in use moves); a no-op where the C
//! library is not glibc; thresholds an operator set (`MALLOC_MMAP_THRESHOLD_`,
//! `MALLOC_TRIM_THRESHOLD_`) are left as set; never blocks longer than [`WEIGHTS_WAIT`] waiting
//! for other holders of the weights.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long [`after_unload`] waits for the last other holder of the weights (the unloaded
/// model's own fields, dropped on the thread that unloaded it) to let go.
pub const WEIGHTS_WAIT: Duration = Duration::from_secs(2);

/// Blocks of this size and more are mapped on their own (and unmapped when freed): glibc's
/// largest dynamic threshold, fixed, so the hot path's buffers stay in the heaps.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// A heap's free top above this goes back to the OS when a block is freed.
pub const TRIM_THRESHOLD: usize = 8 << 20;

/// Fixes glibc's mmap and trim thresholds (see the module doc), once per process, unless the
/// environment sets them.
pub fn configure_allocator() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        for (env, param, value) in [
            (
                "MALLOC_MMAP_THRESHOLD_",
                libc::M_MMAP_THRESHOLD,
                MMAP_THRESHOLD,
            ),
            (
                "MALLOC_TRIM_THRESHOLD_",
                libc::M_TRIM_THRESHOLD,
                TRIM_THRESHOLD,
            ),
        ] {
            if std::env::var_os(env).is_none() {
                // SAFETY: mallopt only sets the allocator's parameters under its lock.
                let set = unsafe { libc::mallopt(param, value as libc::c_int) };
                if set != 1 {
                    tracing::debug!(param, value, "mallopt refused the threshold");
                }
            }
        }
    });
}

/// Returns the allocator's free memory to the operating system (glibc's `malloc_trim(0)`:
/// every arena, free pages in the middle of the heap included); returns whether any was.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists under its locks; it
        // takes no pointer and is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Drops `weights` once no one else holds them (or after [`WEIGHTS_WAIT`]), then releases
/// the free memory: called on the unload thread after the engine has stopped.
pub fn after_unload<T>(weights: Arc<T>) {
    let start = Instant::now();
    while Arc::strong_count(&weights) > 1 && start.elapsed() < WEIGHTS_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(weights);
    release_free_memory();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_unload_waits_for_the_other_holder_then_returns() {
        let weights = Arc::new(vec![0u8; 1 << 20]);
        let other = Arc::clone(&weights);
        let weak = Arc::downgrade(&weights);
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(other);
        });
        let t = Instant::now();
        after_unload(weights);
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "waited for the holder"
        );
        assert!(t.elapsed() < WEIGHTS_WAIT, "did not wait past it");
        assert!(weak.upgrade().is_none(), "the weights are freed");
        holder.join().unwrap();
    }
}
