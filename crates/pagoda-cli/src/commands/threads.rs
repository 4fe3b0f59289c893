//! The worker thread count shared by every command that runs a model.

/// Sizes the global rayon pool the kernels run on: `threads`, or every core when `None`.
/// Must be called before the first kernel call; later calls are ignored with a warning.
pub fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    let n = match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
    {
        tracing::warn!("thread pool already started, keeping its size: {e}");
    }
    tracing::debug!(threads = n, "worker threads");
    Ok(())
}
