//! The gateway's stable hashes: the same value in every process, build and gateway instance,
//! so that rendezvous hashing and prefix keys agree across instances. Not for secrets.

/// FNV-1a's offset basis (the hash of nothing).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// One byte into an FNV-1a hash.
pub fn fnv1a(h: u64, byte: u8) -> u64 {
    (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
}

/// FNV-1a over `bytes`, finished with [`mix64`]: stable, fast, well spread.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let fnv = bytes.iter().fold(FNV_OFFSET, |h, &b| fnv1a(h, b));
    mix64(fnv)
}

/// SplitMix64's finaliser: a fast, stable, well-mixing 64-bit permutation.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_fixed_values() {
        // Must not change between builds: gateway instances compare them.
        assert_eq!(stable_hash(b""), mix64(FNV_OFFSET));
        assert_eq!(fnv1a(FNV_OFFSET, b'a'), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(stable_hash(b"a"), stable_hash(b"b"));
    }
}
