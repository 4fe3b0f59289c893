//! A panic in a request handler is that request's answer, not a dropped connection: both
//! front doors wrap their handlers with [`catch`], log the panic and answer 500 in their own
//! error shape.
//!
//! Invariant: the handler's panic never unwinds past [`catch`]; every other request and the
//! process go on (hyper would otherwise close the connection with no response at all).

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

/// Runs `handler`; `Err` holds the text of its panic.
pub async fn catch<F: Future>(handler: F) -> Result<F::Output, String> {
    AssertUnwindSafe(handler)
        .catch_unwind()
        .await
        .map_err(|payload| message(payload.as_ref()))
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub fn message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_is_an_error_with_its_message() {
        let caught = catch(async { panic!("bad index {}", 3) }).await;
        assert_eq!(caught, Err("bad index 3".to_string()));
        assert_eq!(catch(async { 7 }).await, Ok(7));
    }
}
