//! pagoda-engine (being built).
