//! The machine's memory as `/proc/meminfo` reports it (Linux; `None` elsewhere): what the KV
//! pool planner sizes a default pool from, and what the server derives its default memory
//! budget from.

/// `MemAvailable`, in bytes.
pub fn available_memory() -> Option<u64> {
    meminfo_bytes("MemAvailable:")
}

/// `MemTotal`, in bytes.
pub fn total_memory() -> Option<u64> {
    meminfo_bytes("MemTotal:")
}

fn meminfo_bytes(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn linux_reports_available_within_total() {
        let total = super::total_memory().expect("MemTotal");
        let available = super::available_memory().expect("MemAvailable");
        assert!(
            available > 0 && available <= total,
            "{available} of {total}"
        );
    }
}
