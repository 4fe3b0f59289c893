//! The one integration-test binary of pagoda-model.

mod real_models;
