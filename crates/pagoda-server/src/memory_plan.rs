//! How the server's memory budget is shared among its models: each model's weights stay as
//! they are, and its engine's KV pool (with a hybrid's recurrent-state slots) is sized here.
//!
//! What a model wants ([`KvNeed`]): `max_num_seqs` sequences of `max_model_len` positions (what
//! its engine would reserve alone), at most [`MAX_SHARE`] of the budget; the least it can run
//! with is one sequence of `max_model_len` positions. Models named at start are planned
//! together ([`plan_together`]): each gets what it wants when that fits, otherwise the room
//! left after the weights is shared in proportion to what each wants, none below its least;
//! a set whose weights and least KV exceed the budget is refused, naming each model's sizes.
//! A model loaded on demand later gets what it wants of the room the loaded models leave, or
//! at least its least ([`plan_one`]).
//!
//! Invariants: a plan never gives a model less than its least nor more than it wants, and the
//! plan's weights plus KV never exceed the budget.

use std::fmt::Write as _;

/// Most of the budget one model's KV pool takes by default (the engine's own default share
/// of the machine's memory, so one small model does not reserve most of a laptop's RAM).
pub const MAX_SHARE: f64 = pagoda_engine::engine::DEFAULT_KV_FRACTION;

/// One model's memory, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvNeed {
    pub name: String,
    /// Weights as loaded (after any online quantization).
    pub weights: u64,
    /// KV (and state) bytes for `max_num_seqs` full-length sequences.
    pub wanted: u64,
    /// KV (and state) bytes for one full-length sequence: less cannot serve it.
    pub least: u64,
}

impl KvNeed {
    /// What it wants under `budget`: its full need, capped at [`MAX_SHARE`] of the budget,
    /// never below its least.
    fn capped(&self, budget: u64) -> u64 {
        let cap = (budget as f64 * MAX_SHARE) as u64;
        self.wanted.min(cap).max(self.least)
    }
}

/// KV bytes for each model of `needs` (same order) inside `budget`; `Err` says why the set
/// cannot fit, with each model's sizes and what to change.
pub fn plan_together(budget: u64, needs: &[KvNeed]) -> Result<Vec<u64>, String> {
    let weights: u64 = needs.iter().map(|n| n.weights).sum();
    let least: u64 = needs.iter().map(|n| n.least).sum();
    if weights.saturating_add(least) > budget {
        return Err(refusal(budget, needs));
    }
    let room = budget - weights;
    let wants: Vec<u64> = needs.iter().map(|n| n.capped(budget)).collect();
    if wants.iter().sum::<u64>() <= room {
        return Ok(wants);
    }
    // Share `room` in proportion to what each wants; a model whose share falls below its
    // least gets its least, and the others share what is left (water-filling).
    let mut fixed: Vec<Option<u64>> = vec![None; needs.len()];
    loop {
        let fixed_sum: u64 = fixed.iter().flatten().sum();
        let open_wants: u64 = wants
            .iter()
            .zip(&fixed)
            .filter(|(_, f)| f.is_none())
            .map(|(w, _)| w)
            .sum();
        let left = room - fixed_sum;
        let mut changed = false;
        for (i, n) in needs.iter().enumerate() {
            if fixed[i].is_none() {
                let share = (left as u128 * wants[i] as u128 / open_wants.max(1) as u128) as u64;
                if share < n.least {
                    fixed[i] = Some(n.least);
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(needs
                .iter()
                .enumerate()
                .map(|(i, _)| {
                    fixed[i].unwrap_or_else(|| {
                        let share = left as u128 * wants[i] as u128 / open_wants.max(1) as u128;
                        (share as u64).min(wants[i])
                    })
                })
                .collect());
        }
    }
}

/// KV bytes for a model loaded on demand when the loaded models hold `used` bytes: what it
/// wants of the room left, or `None` when not even its least fits.
pub fn plan_one(budget: u64, used: u64, need: &KvNeed) -> Option<u64> {
    let room = budget.checked_sub(used)?.checked_sub(need.weights)?;
    (room >= need.least).then(|| need.capped(budget).min(room))
}

fn refusal(budget: u64, needs: &[KvNeed]) -> String {
    let mut s = format!(
        "the models named at start do not fit in the memory budget of {}:",
        gib(budget)
    );
    for n in needs {
        let _ = write!(
            s,
            " {} needs {} of weights and at least {} of KV cache (one sequence of \
             --max-model-len; {} for --max-num-seqs sequences);",
            n.name,
            gib(n.weights),
            gib(n.least),
            gib(n.wanted)
        );
    }
    s.push_str(
        " name fewer models with -m, lower --max-model-len, use smaller or quantized models \
         (--quantize), or raise --memory-budget",
    );
    s
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn need(name: &str, weights: u64, wanted: u64, least: u64) -> KvNeed {
        KvNeed {
            name: name.into(),
            weights,
            wanted,
            least,
        }
    }

    #[test]
    fn models_that_fit_get_what_they_want_capped_at_a_share_of_the_budget() {
        let needs = [
            need("a", GIB, GIB, GIB / 8),
            need("b", GIB, 20 * GIB, GIB / 8),
        ];
        let plan = plan_together(20 * GIB, &needs).unwrap();
        assert_eq!(plan[0], GIB);
        // b wants 20 GiB: capped at 40 % of the budget (8 GiB), which still fits.
        assert_eq!(plan[1], (20.0 * GIB as f64 * MAX_SHARE) as u64);
    }

    #[test]
    fn models_that_do_not_fit_share_the_room_in_proportion_with_their_least_kept() {
        // 10 GiB budget, 3 GiB of weights, 7 GiB of room; wants 4 + 4 + 0.5 (least 0.5 each).
        let needs = [
            need("a", GIB, 4 * GIB, GIB / 2),
            need("b", GIB, 4 * GIB, GIB / 2),
            need("c", GIB, GIB / 2, GIB / 2),
        ];
        let plan = plan_together(10 * GIB, &needs).unwrap();
        assert!(plan.iter().sum::<u64>() <= 7 * GIB, "{plan:?}");
        assert_eq!(plan[0], plan[1]);
        assert!(plan[2] >= GIB / 2);
        assert!(plan[0] > 3 * GIB, "{plan:?}");
    }

    #[test]
    fn a_set_that_cannot_fit_is_refused_with_each_models_sizes_and_the_flags() {
        let needs = [
            need("big", 6 * GIB, 8 * GIB, 2 * GIB),
            need("small", GIB, GIB, GIB),
        ];
        let e = plan_together(8 * GIB, &needs).unwrap_err();
        for part in [
            "big",
            "small",
            "6.00 GiB",
            "2.00 GiB",
            "--memory-budget",
            "--max-model-len",
        ] {
            assert!(e.contains(part), "{part} missing: {e}");
        }
    }

    #[test]
    fn an_on_demand_model_gets_the_room_left_or_nothing() {
        let n = need("x", GIB, 4 * GIB, GIB);
        assert_eq!(plan_one(10 * GIB, 3 * GIB, &n), Some(4 * GIB));
        assert_eq!(plan_one(10 * GIB, 7 * GIB, &n), Some(2 * GIB));
        assert_eq!(plan_one(10 * GIB, 8 * GIB + 1, &n), None);
        assert_eq!(plan_one(GIB, 2 * GIB, &n), None);
    }

    proptest! {
        #[test]
        fn a_plan_keeps_every_least_no_more_than_wanted_and_inside_the_budget(
            budget in 1u64..(64 * GIB),
            models in proptest::collection::vec((0u64..8 * GIB, 1u64..8 * GIB, 1u64..GIB), 1..6),
        ) {
            let needs: Vec<KvNeed> = models
                .iter()
                .enumerate()
                .map(|(i, &(w, wanted, least))| need(&format!("m{i}"), w, wanted.max(least), least))
                .collect();
            match plan_together(budget, &needs) {
                Ok(plan) => {
                    let total: u64 = needs.iter().map(|n| n.weights).sum::<u64>()
                        + plan.iter().sum::<u64>();
                    prop_assert!(total <= budget, "{total} > {budget}");
                    for (n, &kv) in needs.iter().zip(&plan) {
                        prop_assert!(kv >= n.least && kv <= n.capped(budget));
                    }
                }
                Err(_) => {
                    let least: u64 = needs.iter().map(|n| n.weights + n.least).sum();
                    prop_assert!(least > budget);
                }
            }
        }
    }
}
