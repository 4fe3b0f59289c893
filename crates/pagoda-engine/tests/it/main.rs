//! The one integration-test binary of pagoda-engine.

mod real_models;
mod sampling;
