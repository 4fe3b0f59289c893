//! Wall-clock stamps as the APIs write them: Unix seconds (OpenAI `created`) and RFC 3339
//! UTC (Ollama `created_at`, `modified_at`, `expires_at`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    unix(SystemTime::now())
}

/// Seconds since the Unix epoch of `t` (0 before it).
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        // 2000-02-29 12:34:56.5 (a leap day) = 951827696.5
        let t = UNIX_EPOCH + Duration::from_millis(951_827_696_500);
        assert_eq!(rfc3339(t), "2000-02-29T12:34:56.500000000Z");
        // 2026-12-03 00:00:00 = 1796256000
        let t = UNIX_EPOCH + Duration::from_secs(1_796_256_000);
        assert_eq!(rfc3339(t), "2026-12-03T00:00:00.000000000Z");
    }
}
