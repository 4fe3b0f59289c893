mod access_test;
mod config_test;
mod harness;
mod privacy_test;
mod rollout_test;
mod routing_test;
mod shared_rollout_test;
mod stub;
