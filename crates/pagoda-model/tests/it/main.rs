//! The one integration-test binary of pagoda-model.

mod bad_files;
mod common;
mod mutations;
mod real_models;
