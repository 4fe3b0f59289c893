//! The one integration-test binary of pagoda-engine.

mod batching;
mod constraint;
mod lora;
mod numerical;
mod real_models;
mod reference;
mod sampling;
mod scheduler_props;
mod speculative;
