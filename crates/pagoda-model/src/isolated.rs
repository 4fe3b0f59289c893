//! Work on client-controlled input, run where it cannot take the process down: a thread of its
//! own whose stack is sized for the deepest input the caller's limits allow, with its panics
//! caught and returned as an error.
//!
//! Why: the compilers and renderers of what a client sends (JSON schemas and grammars in
//! llguidance, chat templates in minijinja) recurse over their input. On an async worker's
//! 2 MiB stack a long enough `$ref` chain overflows it, and a stack overflow is not a panic:
//! it aborts the whole process with every request in flight. Each caller bounds the depth of
//! its input (see the limits next to it) and asks for a stack that holds that depth with room
//! to spare; the stack is only reserved address space until it is touched.
//!
//! Invariants: `f` runs to completion before [`run_isolated`] returns (a scoped thread, so `f`
//! may borrow); a panic in `f` is [`Crashed`], never a second panic in the caller.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Stack for work that recurses over client input: 256 MiB of address space (only the pages
/// touched are memory). The callers' depth limits are tested to fit in a quarter of it.
pub const DEEP_STACK_BYTES: usize = 256 << 20;

/// The work panicked (or its thread could not be started): the message says which work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal error while {what}: {reason}")]
pub struct Crashed {
    /// What was being done (`compiling the JSON schema`, `rendering the chat template`).
    pub what: String,
    /// The panic's message, or why the thread did not start.
    pub reason: String,
}

/// Runs `f` on a new thread with a stack of `stack_bytes` and waits for it.
pub fn run_isolated<T: Send>(
    what: &str,
    stack_bytes: usize,
    f: impl FnOnce() -> T + Send,
) -> Result<T, Crashed> {
    let crashed = |reason: String| Crashed {
        what: what.to_string(),
        reason,
    };
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("pagoda-isolated".into())
            .stack_size(stack_bytes)
            .spawn_scoped(scope, move || catch_unwind(AssertUnwindSafe(f)))
            .map_err(|e| crashed(format!("cannot start a thread: {e}")))?;
        match handle.join() {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) | Err(panic) => Err(crashed(panic_message(panic.as_ref()))),
        }
    })
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(n: u64) -> u64 {
        // Keeps a frame per level (the black box stops the optimizer folding it).
        let pad = std::hint::black_box([n; 64]);
        if n == 0 {
            0
        } else {
            1 + depth(pad[63] - 1)
        }
    }

    #[test]
    fn returns_the_value_and_borrows() {
        let input = [1, 2, 3];
        let sum = run_isolated("summing", 1 << 20, || input.iter().sum::<i32>());
        assert_eq!(sum, Ok(6));
    }

    #[test]
    fn a_panic_is_an_error_naming_the_work() {
        let e = run_isolated("compiling the grammar", 1 << 20, || -> u8 {
            panic!("boom {}", 7)
        })
        .expect_err("panicked");
        assert_eq!(e.what, "compiling the grammar");
        assert_eq!(e.reason, "boom 7");
        assert!(e.to_string().contains("compiling the grammar"), "{e}");
    }

    #[test]
    fn recursion_too_deep_for_a_worker_stack_fits_the_deep_stack() {
        // ~600 bytes a frame x 100k frames = ~60 MB: far past 2 MiB, within the deep stack.
        assert_eq!(
            run_isolated("recursing", DEEP_STACK_BYTES, || depth(100_000)),
            Ok(100_000)
        );
    }
}
