//! Win rate of variant A over variant B from blind pairwise judgements, with 95% confidence
//! intervals.
//!
//! Each judged prompt is an [`Outcome`]: A wins (score 1), B wins (0) or a tie (½). The win
//! rate is the mean score, `(wins + ties/2) / n`, so **ties count half a win for each side**.
//!
//! Two intervals are given:
//! - the **Wilson score interval** (Wilson 1927) with `z = 1.959964` on the win rate as a
//!   proportion of `n` judgements (a tie counts as half a success, the usual convention for
//!   paired preference data; with no ties it is the textbook interval);
//! - a **percentile bootstrap**: the judgements resampled with replacement `resamples` times
//!   (a seeded SplitMix64 stream, so reruns agree), the 2.5th and 97.5th percentiles of the
//!   resampled win rates. It makes no normal approximation and treats ties as they are.
//!
//! Invariants: `0 ≤ low ≤ win_rate ≤ high ≤ 1` for both intervals (rounding is clamped);
//! no judgements at all is an error, not a NaN.

use serde::Serialize;

use crate::CompressError;

/// The two-sided 95% normal quantile.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// Default number of bootstrap resamples.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// One judged prompt, from variant A's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    AWins,
    BWins,
    Tie,
}

impl Outcome {
    /// A's score: 1 for a win, ½ for a tie, 0 for a loss.
    pub fn score(self) -> f64 {
        match self {
            Outcome::AWins => 1.0,
            Outcome::Tie => 0.5,
            Outcome::BWins => 0.0,
        }
    }
}

/// A closed interval `[low, high]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

/// The tally and its statistics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WinRate {
    pub a_wins: usize,
    pub b_wins: usize,
    pub ties: usize,
    /// Judgements counted (`a_wins + b_wins + ties`).
    pub n: usize,
    /// `(a_wins + ties / 2) / n`: ties count half.
    pub win_rate_a: f64,
    /// 95% Wilson score interval of `win_rate_a`.
    pub wilson_95: Interval,
    /// 95% percentile-bootstrap interval of `win_rate_a`.
    pub bootstrap_95: Interval,
    pub bootstrap_resamples: usize,
    pub bootstrap_seed: u64,
}

/// Wilson score interval for `score` successes out of `n` (score may be fractional: ties
/// count half) at normal quantile `z`; clamped so that it lies in [0, 1] and holds
/// `score / n`.
pub fn wilson(score: f64, n: usize, z: f64) -> Result<Interval, CompressError> {
    if n == 0 {
        return Err(CompressError::InvalidInput(
            "no judgements: a win rate needs at least one pick".into(),
        ));
    }
    let n = n as f64;
    if !(0.0..=n).contains(&score) {
        return Err(CompressError::InvalidInput(format!(
            "a score of {score} out of {n} is not a proportion"
        )));
    }
    let p = score / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // Rounding can put an end a hair past p or outside [0, 1] at p = 0 or 1.
    Ok(Interval {
        low: (center - half).clamp(0.0, p),
        high: (center + half).clamp(p, 1.0),
    })
}

/// SplitMix64 (Steele, Lea & Flood 2014): a small, fixed, seedable stream, so a seed gives the
/// same numbers on every platform and release.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2⁻³² for the
    /// sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Percentile bootstrap of the mean score: `resamples` resamples of `outcomes` with
/// replacement; the interval between the 2.5th and 97.5th percentiles (nearest rank).
pub fn bootstrap(
    outcomes: &[Outcome],
    resamples: usize,
    seed: u64,
) -> Result<Interval, CompressError> {
    if outcomes.is_empty() {
        return Err(CompressError::InvalidInput(
            "no judgements: a win rate needs at least one pick".into(),
        ));
    }
    if resamples == 0 {
        return Err(CompressError::InvalidInput(
            "the bootstrap needs at least one resample".into(),
        ));
    }
    let n = outcomes.len();
    let p = outcomes.iter().map(|o| o.score()).sum::<f64>() / n as f64;
    let mut rng = SplitMix64::new(seed);
    let mut rates: Vec<f64> = (0..resamples)
        .map(|_| (0..n).map(|_| outcomes[rng.below(n)].score()).sum::<f64>() / n as f64)
        .collect();
    rates.sort_by(f64::total_cmp);
    let rank = |q: f64| rates[((q * resamples as f64).ceil() as usize).clamp(1, resamples) - 1];
    // With few judgements the resampled percentiles may miss the estimate itself; the
    // interval is widened to hold it.
    Ok(Interval {
        low: rank(0.025).min(p),
        high: rank(0.975).max(p),
    })
}

/// Tallies `outcomes` and computes both intervals.
pub fn win_rate(
    outcomes: &[Outcome],
    resamples: usize,
    seed: u64,
) -> Result<WinRate, CompressError> {
    let count = |o: Outcome| outcomes.iter().filter(|&&x| x == o).count();
    let (a_wins, b_wins, ties) = (
        count(Outcome::AWins),
        count(Outcome::BWins),
        count(Outcome::Tie),
    );
    let n = outcomes.len();
    let score = a_wins as f64 + ties as f64 / 2.0;
    let wilson_95 = wilson(score, n, Z_95)?;
    let bootstrap_95 = bootstrap(outcomes, resamples, seed)?;
    Ok(WinRate {
        a_wins,
        b_wins,
        ties,
        n,
        win_rate_a: score / n as f64,
        wilson_95,
        bootstrap_95,
        bootstrap_resamples: resamples,
        bootstrap_seed: seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn wilson_matches_hand_computed_values() {
        // p = 0.7, n = 10: centre (0.7 + z²/20) / (1 + z²/10) = 0.644492..., half-width
        // z / (1 + z²/10) * sqrt(0.021 + z²/400) = 0.247715...
        let i = wilson(7.0, 10, Z_95).unwrap();
        assert!(close(i.low, 0.396_778_147_461_145_4), "{i:?}");
        assert!(close(i.high, 0.892_208_732_593_698_9), "{i:?}");
        // 50 of 100: symmetric about 0.5.
        let i = wilson(50.0, 100, Z_95).unwrap();
        assert!(close(i.low, 0.403_831_530_365_995_6) && close(i.high, 0.596_168_469_634_004_4));
        // All losses / all wins: one end pinned at 0 or 1.
        let i = wilson(0.0, 5, Z_95).unwrap();
        assert!(
            close(i.low, 0.0) && close(i.high, 0.434_482_464_783_174_8),
            "{i:?}"
        );
        let i = wilson(5.0, 5, Z_95).unwrap();
        assert!(
            close(i.low, 0.565_517_535_216_825_1) && close(i.high, 1.0),
            "{i:?}"
        );
    }

    #[test]
    fn ties_count_half() {
        use Outcome::*;
        // 6 wins, 2 losses, 2 ties: score 7 of 10, the same Wilson interval as 7 of 10.
        let outcomes = [
            AWins, AWins, AWins, AWins, AWins, AWins, BWins, BWins, Tie, Tie,
        ];
        let r = win_rate(&outcomes, 2000, 1).unwrap();
        assert_eq!((r.a_wins, r.b_wins, r.ties, r.n), (6, 2, 2, 10));
        assert!(close(r.win_rate_a, 0.7));
        assert!(close(r.wilson_95.low, 0.396_778_147_461_145_4));
        assert!(r.bootstrap_95.low <= 0.7 && 0.7 <= r.bootstrap_95.high);
        // Reruns with the same seed agree.
        assert_eq!(r, win_rate(&outcomes, 2000, 1).unwrap());
    }

    #[test]
    fn bootstrap_is_close_to_the_normal_interval_for_many_judgements() {
        // 60 of 100: the percentile bootstrap of a proportion is near p ± 1.96·sqrt(pq/n)
        // = [0.504, 0.696].
        let outcomes: Vec<_> = (0..100)
            .map(|i| {
                if i < 60 {
                    Outcome::AWins
                } else {
                    Outcome::BWins
                }
            })
            .collect();
        let i = bootstrap(&outcomes, 10_000, 7).unwrap();
        assert!(
            (i.low - 0.504).abs() < 0.02 && (i.high - 0.696).abs() < 0.02,
            "{i:?}"
        );
    }

    #[test]
    fn no_judgements_is_an_error() {
        assert!(win_rate(&[], 100, 0).is_err());
        assert!(wilson(3.0, 2, Z_95).is_err());
        assert!(bootstrap(&[Outcome::Tie], 0, 0).is_err());
    }

    proptest! {
        #[test]
        fn intervals_lie_in_unit_range_and_hold_the_estimate(
            a in 0usize..60, b in 0usize..60, t in 0usize..60, seed in any::<u64>(),
        ) {
            prop_assume!(a + b + t > 0);
            let mut outcomes = vec![Outcome::AWins; a];
            outcomes.extend(vec![Outcome::BWins; b]);
            outcomes.extend(vec![Outcome::Tie; t]);
            let r = win_rate(&outcomes, 200, seed).unwrap();
            for i in [r.wilson_95, r.bootstrap_95] {
                prop_assert!(0.0 <= i.low && i.low <= r.win_rate_a);
                prop_assert!(r.win_rate_a <= i.high && i.high <= 1.0);
            }
            // Wilson's interval is never degenerate.
            prop_assert!(r.wilson_95.high - r.wilson_95.low > 0.0);
        }
    }
}
