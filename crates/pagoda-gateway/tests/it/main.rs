mod config_test;
