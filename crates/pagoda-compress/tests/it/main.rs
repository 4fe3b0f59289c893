//! Integration tests of pagoda-compress (one binary): evaluation against references we did not
//! write.

mod eval_golden;
