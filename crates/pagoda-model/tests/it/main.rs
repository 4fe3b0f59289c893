//! The one integration-test binary of pagoda-model.

mod bad_files;
mod common;
mod real_models;
