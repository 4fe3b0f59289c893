//! Prompt-lookup proposals (n-gram speculation): the tokens that followed the latest earlier
//! occurrence of the sequence's last n tokens, for the largest n that occurs. No model runs,
//! so a proposal costs only the search; strong where the output copies its input
//! (summaries, code edits, retrieval-augmented answers).
//!
//! Invariant: a proposal is a contiguous run of tokens that already occurred in the sequence,
//! at most `k` long, and empty when no n-gram of the configured lengths recurs.

/// Prompt-lookup proposer: n-grams of `min_n..=max_n` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        NgramProposer { min_n: 2, max_n: 4 }
    }
}

/// Longest stretch of history searched backwards for a match, so a proposal stays cheap on
/// long contexts.
const SEARCH_WINDOW: usize = 8192;

impl NgramProposer {
    /// Up to `k` tokens expected to follow `tokens`.
    pub fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        if k == 0 || tokens.len() < 2 {
            return Vec::new();
        }
        let lo = tokens.len().saturating_sub(SEARCH_WINDOW);
        let min_n = self.min_n.max(1);
        for n in (min_n..=self.max_n.max(min_n)).rev() {
            if tokens.len() <= n {
                continue;
            }
            let tail = &tokens[tokens.len() - n..];
            // Latest earlier occurrence whose continuation exists: starts before len - n.
            let mut start = tokens.len() - n;
            while start > lo {
                start -= 1;
                if &tokens[start..start + n] == tail {
                    let from = start + n;
                    let to = (from + k).min(tokens.len());
                    return tokens[from..to].to_vec();
                }
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn proposes_what_followed_the_latest_match() {
        let p = NgramProposer { min_n: 2, max_n: 3 };
        // ... 7 8 9 10 ... 7 8 | -> propose 9 10 11
        let t = [1, 7, 8, 9, 10, 11, 2, 3, 7, 8];
        assert_eq!(p.propose(&t, 3), vec![9, 10, 11]);
        assert_eq!(p.propose(&t, 1), vec![9]);
    }

    #[test]
    fn prefers_the_longest_ngram() {
        let p = NgramProposer { min_n: 1, max_n: 3 };
        // "5 6" recurs at two places; only one continues "4 5 6".
        let t = [4, 5, 6, 100, 9, 5, 6, 200, 4, 5, 6];
        assert_eq!(p.propose(&t, 1), vec![100]);
    }

    #[test]
    fn nothing_when_no_ngram_recurs() {
        let p = NgramProposer::default();
        assert!(p.propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(p.propose(&[], 4).is_empty());
        assert!(p.propose(&[1, 2, 1, 2], 0).is_empty());
    }

    proptest! {
        #[test]
        fn a_proposal_is_a_run_that_follows_an_occurrence(
            tokens in proptest::collection::vec(0u32..4, 0..60),
            k in 0usize..6,
        ) {
            let p = NgramProposer { min_n: 1, max_n: 3 };
            let got = p.propose(&tokens, k);
            prop_assert!(got.len() <= k);
            if !got.is_empty() {
                // Some earlier position starts a copy of the proposal right after a match
                // of at least min_n tail tokens.
                let found = (1..tokens.len()).any(|from| {
                    let n = 1usize;
                    from >= n
                        && tokens[from - n..from] == tokens[tokens.len() - n..]
                        && tokens[from..].starts_with(&got)
                });
                prop_assert!(found);
            }
        }
    }
}
