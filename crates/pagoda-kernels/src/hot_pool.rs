//! A polling thread pool for forward passes: [`run_hot`] runs a pass with helper threads
//! that spin, never sleep, until it ends, and [`parallel_for`] splits a kernel's parallel
//! loop between the pass's thread and those helpers.
//!
//! Why: a forward pass is hundreds of short parallel loops (every matrix product of every
//! layer) with a little serial work between them. Rayon parks a worker that finds no work
//! after a few microseconds, and waking it goes through the OS; on a virtual machine an idle
//! vCPU halts and each wake-up goes through the host (tens of microseconds to milliseconds).
//! Measured on the 2-vCPU dev VM, Qwen2.5-1.5B Q4_K_M decode under rayon alone: ~100
//! context switches per step and 1.6 of 2 CPUs busy; ten interleaved runs of 100 steps each
//! gave a median step of 45-60 ms (mean of medians 53.0 ms) under rayon alone and
//! 42.5-53 ms (47.9 ms) with the hot pool, both CPUs busy. llama.cpp's thread pool polls
//! between graph nodes for the same reason.
//!
//! How: the pool has `rayon::current_num_threads() - 1` helper threads, started on first use.
//! While a hot pass runs (and for [`LINGER`] after it, so consecutive decode steps find
//! them awake) they poll one shared job slot; otherwise they sleep on a condition variable.
//! [`parallel_for`] on the pass's thread publishes a job (a task count and a body), claims
//! tasks alongside the helpers, and spins until every task is done. Anywhere else (another
//! thread, a nested call, a second pass running at the same time) it is rayon's
//! `for_each`.
//!
//! Invariants: one job is published at a time, by the one thread that owns the hot pass;
//! a task index is claimed exactly once (compare-and-swap on a word that packs the job's
//! sequence number, task count and next index), so each task runs once, on some thread,
//! and results do not depend on which; the publisher returns only when all tasks are done,
//! so the job's body outlives every call of it. A panicking task is re-raised on the
//! publishing thread after the job completes.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long helpers keep polling after a hot pass ends before they sleep.
pub const LINGER: Duration = Duration::from_millis(2);

/// `spin_loop` hints between two looks at the job slot while there is nothing to claim;
/// every few of those rounds a helper also yields its CPU to the OS (no starvation when
/// the pool has more threads than the machine has cores).
const SPINS_PER_LOOK: usize = 32;
const LOOKS_PER_YIELD: usize = 16;

/// Bits of the job word: sequence number (high), task count, next task index (low).
const INDEX_BITS: u32 = 20;
const MAX_TASKS: usize = (1 << INDEX_BITS) - 1;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

fn pack(seq: u64, n: usize, next: usize) -> u64 {
    (seq << (2 * INDEX_BITS)) | ((n as u64) << INDEX_BITS) | next as u64
}

fn unpack(word: u64) -> (u64, usize, usize) {
    (
        word >> (2 * INDEX_BITS),
        ((word >> INDEX_BITS) & INDEX_MASK) as usize,
        (word & INDEX_MASK) as usize,
    )
}

/// One published parallel loop, on the publisher's stack.
struct Job<'a> {
    body: &'a (dyn Fn(usize) + Sync),
    done: AtomicUsize,
    panicked: AtomicBool,
}

struct Pool {
    /// The job word: `pack(seq, tasks, next)`; tasks = 0 when no job is open.
    word: AtomicU64,
    /// The open job (valid while the word's task count is non-zero).
    job: AtomicPtr<Job<'static>>,
    /// Whether a hot pass owns the pool.
    owned: AtomicBool,
    /// `LINGER` after the last hot pass ended (`None`: no pass yet): helpers poll until then.
    awake_until: Mutex<Option<Instant>>,
    wake: Condvar,
}

thread_local! {
    /// Whether this thread owns the running hot pass (and may publish jobs).
    static OWNS_PASS: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is inside a published job (nested loops run plainly).
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
    *POOL.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        if helpers == 0 {
            return None;
        }
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            owned: AtomicBool::new(false),
            awake_until: Mutex::new(None),
            wake: Condvar::new(),
        }));
        for i in 0..helpers {
            let spawned = std::thread::Builder::new()
                .name(format!("pagoda-hot-{i}"))
                .spawn(move || helper_loop(pool));
            if spawned.is_err() {
                return None; // no helpers: every loop stays on rayon
            }
        }
        Some(pool)
    })
}

/// Runs `pass` with the pool's helpers polling until it returns (on a rayon worker, as
/// `rayon::scope` runs it, so plain rayon loops inside it fork from within the pool). A
/// pass started while another runs, or from inside one, runs without owning the pool.
pub fn run_hot<R: Send>(pass: impl FnOnce() -> R + Send) -> R {
    let Some(pool) = pool() else {
        return rayon::scope(|_| pass());
    };
    if OWNS_PASS.with(Cell::get)
        || pool
            .owned
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
    {
        return rayon::scope(|_| pass());
    }
    {
        // Under the lock: a helper deciding to sleep either sees `owned` or gets this.
        let _until = pool.awake_until.lock().unwrap_or_else(|e| e.into_inner());
        pool.wake.notify_all();
    }
    let result = rayon::scope(|_| {
        OWNS_PASS.with(|o| o.set(true));
        let r = catch_unwind(AssertUnwindSafe(pass));
        OWNS_PASS.with(|o| o.set(false));
        r
    });
    *pool.awake_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + LINGER);
    pool.owned.store(false, SeqCst);
    result.unwrap_or_else(|p| resume_unwind(p))
}

/// Runs `body(i)` for every `i` in `0..n`, in parallel: on the hot pool when called by the
/// thread that owns a hot pass, else with rayon. Returns when every call has returned.
pub fn parallel_for(n: usize, body: &(dyn Fn(usize) + Sync)) {
    match n {
        0 => return,
        1 => return body(0),
        _ => {}
    }
    let hot = OWNS_PASS.with(Cell::get) && !IN_JOB.with(Cell::get) && n <= MAX_TASKS;
    match hot.then(pool).flatten() {
        Some(pool) => run_job(pool, n, body),
        None => (0..n).into_par_iter().for_each(body),
    }
}

/// Runs `body` on each `chunk`-long piece of `out` with the piece of `input` at the same
/// offsets (the last pieces may be shorter), in parallel as [`parallel_for`] does; `input`
/// must be as long as `out`. For element-wise work too large to leave to one thread (a
/// prefill's activations): each element is computed once, by the same function, whatever
/// the split, so results never depend on it.
pub fn zip_chunks_mut<T: Send, U: Sync>(
    out: &mut [T],
    input: &[U],
    chunk: usize,
    body: &(dyn Fn(&mut [T], &[U]) + Sync),
) {
    assert_eq!(out.len(), input.len(), "zip_chunks_mut: lengths differ");
    let chunk = chunk.max(1);
    let len = out.len();
    if len <= chunk {
        return body(out, input);
    }
    struct Base<T>(*mut T);
    // SAFETY: the pointer is only turned into the disjoint pieces below, one per task.
    unsafe impl<T: Send> Sync for Base<T> {}
    let base = Base(out.as_mut_ptr());
    let base = &base;
    parallel_for(len.div_ceil(chunk), &|i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: task `i` alone touches `start..end` of `out`, which outlives the loop
        // (`parallel_for` returns after every task).
        let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
        body(piece, &input[start..end]);
    });
}

fn run_job(pool: &Pool, n: usize, body: &(dyn Fn(usize) + Sync)) {
    let job = Job {
        body,
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    let (seq, _, _) = unpack(pool.word.load(SeqCst));
    let seq = (seq + 1) & ((1 << (64 - 2 * INDEX_BITS)) - 1);
    // SAFETY of the lifetime erasure: the job is unpublished (task count 0) below, after
    // every task is done, so no thread calls `body` or touches `job` after this returns.
    let erased = &job as *const Job<'_> as *mut Job<'static>;
    pool.job.store(erased, SeqCst);
    pool.word.store(pack(seq, n, 0), SeqCst);
    IN_JOB.with(|f| f.set(true));
    while claim_and_run(pool) {}
    while job.done.load(SeqCst) < n {
        std::hint::spin_loop();
    }
    IN_JOB.with(|f| f.set(false));
    pool.word.store(pack(seq, 0, 0), SeqCst);
    pool.job.store(std::ptr::null_mut(), SeqCst);
    if job.panicked.load(SeqCst) {
        panic!("a task of a hot parallel loop panicked");
    }
}

/// Claims the open job's next task and runs it; false when there is none to claim.
fn claim_and_run(pool: &Pool) -> bool {
    let word = pool.word.load(SeqCst);
    let (seq, n, next) = unpack(word);
    if next >= n {
        return false;
    }
    if pool
        .word
        .compare_exchange(word, pack(seq, n, next + 1), SeqCst, SeqCst)
        .is_err()
    {
        return true; // lost a race: look again
    }
    // SAFETY: task `next` < n of the open job is ours; the publisher keeps the job alive
    // until its `done` count reaches `n`, which needs this task's increment.
    let job = unsafe { &*pool.job.load(SeqCst) };
    let was_in_job = IN_JOB.with(|f| f.replace(true));
    if catch_unwind(AssertUnwindSafe(|| (job.body)(next))).is_err() {
        job.panicked.store(true, SeqCst);
    }
    IN_JOB.with(|f| f.set(was_in_job));
    job.done.fetch_add(1, SeqCst);
    true
}

fn helper_loop(pool: &'static Pool) {
    let mut looks = 0usize;
    loop {
        if claim_and_run(pool) {
            looks = 0;
            continue;
        }
        looks += 1;
        for _ in 0..SPINS_PER_LOOK {
            std::hint::spin_loop();
        }
        if looks % LOOKS_PER_YIELD == 0 {
            std::thread::yield_now();
            // Sleep once no pass owns the pool and the linger after the last one is over.
            let mut until = pool.awake_until.lock().unwrap_or_else(|e| e.into_inner());
            while !pool.owned.load(SeqCst) && until.is_none_or(|t| Instant::now() >= t) {
                until = pool.wake.wait(until).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zip_chunks_mut_covers_every_element_once_in_and_out_of_a_pass() {
        for (len, chunk) in [(0, 4), (1, 4), (7, 3), (64, 8), (1000, 7), (5, 0)] {
            let input: Vec<u32> = (0..len as u32).collect();
            let want: Vec<u32> = input.iter().map(|x| 3 * x + 1).collect();
            let body = |out: &mut [u32], inp: &[u32]| {
                for (o, &i) in out.iter_mut().zip(inp) {
                    *o += 3 * i + 1;
                }
            };
            let mut cold = vec![0u32; len];
            zip_chunks_mut(&mut cold, &input, chunk, &body);
            assert_eq!(cold, want, "len {len}, chunk {chunk}");
            let mut hot = vec![0u32; len];
            run_hot(|| zip_chunks_mut(&mut hot, &input, chunk, &body));
            assert_eq!(hot, want, "hot: len {len}, chunk {chunk}");
        }
    }

    fn squares_hot(n: usize) -> Vec<u64> {
        let out: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        run_hot(|| {
            parallel_for(n, &|i| {
                out[i].fetch_add((i * i) as u64, SeqCst);
            })
        });
        out.into_iter().map(AtomicU64::into_inner).collect()
    }

    #[test]
    fn every_task_runs_exactly_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let got = squares_hot(n);
            let want: Vec<u64> = (0..n).map(|i| (i * i) as u64).collect();
            assert_eq!(got, want, "n = {n}");
        }
    }

    #[test]
    fn many_loops_in_one_pass_and_nested_loops_complete() {
        let total = AtomicU64::new(0);
        run_hot(|| {
            for _ in 0..200 {
                parallel_for(8, &|_| {
                    // A nested loop runs plainly (rayon), never publishes a second job.
                    parallel_for(4, &|j| {
                        total.fetch_add(j as u64, SeqCst);
                    });
                });
            }
        });
        assert_eq!(total.into_inner(), 200 * 8 * 6);
    }

    #[test]
    fn overlapping_passes_from_many_threads_all_finish() {
        std::thread::scope(|s| {
            for t in 0..6usize {
                s.spawn(move || {
                    for _ in 0..30 {
                        let sum = AtomicU64::new(0);
                        run_hot(|| {
                            parallel_for(64, &|i| {
                                sum.fetch_add((i % (t + 2)) as u64, SeqCst);
                            })
                        });
                        let want: u64 = (0..64).map(|i| (i % (t + 2)) as u64).sum();
                        assert_eq!(sum.into_inner(), want);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_task_panics_the_pass_and_the_pool_stays_usable() {
        let caught = catch_unwind(|| {
            run_hot(|| {
                parallel_for(16, &|i| {
                    if i == 5 {
                        panic!("task 5 fails");
                    }
                })
            })
        });
        assert!(caught.is_err());
        assert_eq!(squares_hot(4), vec![0, 1, 4, 9]);
    }

    #[test]
    fn job_words_round_trip() {
        for (seq, n, next) in [(0, 0, 0), (1, 5, 3), (12345, MAX_TASKS, MAX_TASKS - 1)] {
            assert_eq!(unpack(pack(seq, n, next)), (seq, n, next));
        }
    }
}
