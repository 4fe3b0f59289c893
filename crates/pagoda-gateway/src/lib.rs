//! Pagoda's model gateway: the one entry point in front of many model servers.
//!
//! A request's path: `app` (body limit, auth with `keys`, limits with `limits`, cache lookup with
//! `cache`) -> `route` (client model name -> target version: rules, splits, `rollout` canary
//! weights) -> `proxy` (replica choice and queueing in `upstream`, retries, fallback chain,
//! streaming relay) -> `usage` ledger, `metrics`, rollout statistics. `reload` swaps validated
//! configs in while requests run; `admin` is the operator's API.

pub mod cache;
pub mod config;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod rollout;
pub mod upstream;
pub mod usage;
