//! Request work that takes real CPU time on the request's own task — rendering the chat
//! template (a round trip to a template worker, up to its fuel), tokenizing a long prompt,
//! compiling a constraint — run so that it does not hold up the other connections the same
//! async worker serves.
//!
//! Invariant: on the server's multi-thread runtime the work runs under
//! `tokio::task::block_in_place` (the worker's other tasks move to another thread while it
//! runs); anywhere else (a current-thread runtime in tests, no runtime) it runs inline, as
//! before. The result is the same either way.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work` where a long stretch of it cannot stall other requests.
pub(crate) fn run<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn work_runs_once_with_its_result_on_every_kind_of_runtime() {
        assert_eq!(super::run(|| 7), 7);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { super::run(|| 8) }), 8);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let answer = multi.block_on(async { tokio::spawn(async { super::run(|| 9) }).await });
        assert_eq!(answer.unwrap(), 9);
    }
}
