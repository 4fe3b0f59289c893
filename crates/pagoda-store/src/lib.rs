//! pagoda-store (being built).
