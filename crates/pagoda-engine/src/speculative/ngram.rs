//! Prompt-lookup proposals (n-gram speculation): the tokens that followed the latest earlier
//! occurrence of the sequence's last n tokens, for the largest n that occurs. No model runs,
//! so a proposal costs only the search; strong where the output copies its input
//! (summaries, code edits, retrieval-augmented answers).
//!
//! Invariant: a proposal is a contiguous run of tokens that already occurred in the sequence,
//! at most `k` long, following an occurrence of the sequence's last n-gram (or of the n-gram
//! before its last token, one token further on), and empty when neither recurs.

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
    /// Up to `k` tokens expected to follow `tokens`: what followed the latest earlier
    /// occurrence of the longest n-gram ending at the last token; failing that, when the last
    /// token looks like a one-token replacement (an n-gram ends just before it), what followed
    /// the replaced token there — an edit that renames `values` to `samples` goes on copying
    /// the original line after the new name.
    pub fn propose(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        if k == 0 || tokens.len() < 2 {
            return Vec::new();
        }
        let from = self
            .continuation(tokens, tokens.len(), 0)
            .or_else(|| self.continuation(tokens, tokens.len() - 1, 1));
        match from {
            Some(from) => tokens[from..(from + k).min(tokens.len())].to_vec(),
            None => Vec::new(),
        }
    }

    /// Where the continuation starts after the latest earlier occurrence of the longest
    /// n-gram (`min_n..=max_n` tokens) that ends at `end` (exclusive), skipping `skip` tokens
    /// after the occurrence; `None` when no n-gram recurs or nothing follows it.
    fn continuation(&self, tokens: &[u32], end: usize, skip: usize) -> Option<usize> {
        let lo = end.saturating_sub(SEARCH_WINDOW);
        let min_n = self.min_n.max(1);
        for n in (min_n..=self.max_n.max(min_n)).rev() {
            if end <= n {
                continue;
            }
            let tail = &tokens[end - n..end];
            // Latest earlier occurrence whose continuation exists: starts before end - n.
            let mut start = end - n;
            while start > lo {
                start -= 1;
                let from = start + n + skip;
                if &tokens[start..start + n] == tail && from < tokens.len() {
                    return Some(from);
                }
            }
        }
        None
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
    fn after_a_one_token_replacement_it_goes_on_copying() {
        let p = NgramProposer { min_n: 2, max_n: 3 };
        // Original "total -= values [ i ]", the edit writes "total -= samples": propose "[ i ]".
        let (total, minus, values, open, i, close, samples) = (1, 2, 3, 4, 5, 6, 7);
        let t = [
            total, minus, values, open, i, close, 9, total, minus, samples,
        ];
        assert_eq!(p.propose(&t, 3), vec![open, i, close]);
        // A plain match still wins over the replacement rule.
        let t = [
            total, minus, values, open, 8, minus, samples, 40, 41, total, minus, samples,
        ];
        assert_eq!(p.propose(&t, 2), vec![40, 41]);
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
                // Some earlier position starts a copy of the proposal right after an
                // occurrence of the last token, or one token after an occurrence of the one
                // before it.
                let len = tokens.len();
                let found = (1..len).any(|from| {
                    tokens[from..].starts_with(&got)
                        && (tokens[from - 1] == tokens[len - 1]
                            || (from >= 2 && tokens[from - 2] == tokens[len - 2]))
                });
                prop_assert!(found);
            }
        }
    }
}
