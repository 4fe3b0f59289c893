//! Window planning for strided perplexity (the Hugging Face "perplexity of fixed-length models"
//! method): windows of at most `ctx` tokens start every `stride` tokens, and each window scores
//! only the tokens that no earlier window scored, with everything before them in the window as
//! context.
//!
//! Invariants of [`plan_windows`] (property tested below): every token `1..n` is scored by
//! exactly one window, in order; token 0 is never scored (it has no context); a window feeds at
//! most `ctx` tokens and scores at least one; a scored token always has the token before it in
//! its window (`first_scored > begin`). This needs `1 <= stride < ctx`: with `stride == ctx`
//! Hugging Face's loop would leave the first token of every window after the first unscored.

use crate::CompressError;

/// One forward pass of a strided perplexity run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First token of the window (position 0 of its forward pass).
    pub begin: usize,
    /// One past the last token of the window.
    pub end: usize,
    /// First token this window scores: tokens `first_scored..end` are scored, each from the
    /// logits of the token before it.
    pub first_scored: usize,
}

impl Window {
    /// Tokens this window scores.
    pub fn scored(&self) -> usize {
        self.end - self.first_scored
    }

    /// Tokens the model must run to score them: `begin..end - 1` (the last token is only ever
    /// a target, never an input).
    pub fn inputs(&self) -> usize {
        self.end - 1 - self.begin
    }
}

/// Checks `ctx` and `stride` against each other (the model's limit is the caller's check).
pub fn check_window(ctx: usize, stride: usize) -> Result<(), CompressError> {
    if ctx < 2 {
        return Err(CompressError::InvalidInput(format!(
            "a window of {ctx} token(s) scores nothing; --ctx must be at least 2"
        )));
    }
    if stride == 0 || stride >= ctx {
        return Err(CompressError::InvalidInput(format!(
            "--stride must be at least 1 and less than --ctx ({ctx}), got {stride}: every \
             window after the first must overlap the one before by at least one token"
        )));
    }
    Ok(())
}

/// The windows that score every token of an `n_tokens`-token text exactly once.
///
/// Errors: fewer than 2 tokens ([`CompressError::TextTooShort`]), `ctx < 2`, `stride == 0`
/// or `stride >= ctx`.
pub fn plan_windows(
    n_tokens: usize,
    ctx: usize,
    stride: usize,
) -> Result<Vec<Window>, CompressError> {
    if n_tokens < 2 {
        return Err(CompressError::TextTooShort { tokens: n_tokens });
    }
    check_window(ctx, stride)?;
    let mut windows = Vec::with_capacity(n_tokens.div_ceil(stride));
    let (mut begin, mut prev_end) = (0usize, 0usize);
    loop {
        let end = (begin + ctx).min(n_tokens);
        let first_scored = prev_end.max(begin + 1);
        debug_assert!(first_scored < end, "every window scores a token");
        windows.push(Window {
            begin,
            end,
            first_scored,
        });
        if end == n_tokens {
            return Ok(windows);
        }
        prev_end = end;
        begin += stride;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hugging Face's loop, transcribed: `for begin in range(0, n, stride)`, targets the last
    /// `end - prev_end` tokens, the window's first token never a target (the shift).
    fn hf_scored(n: usize, ctx: usize, stride: usize) -> Vec<usize> {
        let mut scored = Vec::new();
        let mut prev_end = 0;
        for begin in (0..n).step_by(stride) {
            let end = (begin + ctx).min(n);
            let trg_len = end - prev_end;
            scored.extend((end - trg_len..end).filter(|&t| t > begin));
            prev_end = end;
            if end == n {
                break;
            }
        }
        scored
    }

    #[test]
    fn one_window_when_the_text_fits() {
        let w = plan_windows(10, 512, 256).unwrap();
        assert_eq!(
            w,
            vec![Window {
                begin: 0,
                end: 10,
                first_scored: 1
            }]
        );
        assert_eq!(w[0].scored(), 9);
        assert_eq!(w[0].inputs(), 9);
    }

    #[test]
    fn later_windows_score_only_their_new_tokens() {
        let w = plan_windows(10, 4, 2).unwrap();
        let spans: Vec<_> = w.iter().map(|w| (w.begin, w.end, w.first_scored)).collect();
        assert_eq!(spans, vec![(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]);
    }

    #[test]
    fn bad_windows_and_short_texts_are_errors() {
        assert!(matches!(
            plan_windows(0, 8, 4),
            Err(CompressError::TextTooShort { tokens: 0 })
        ));
        assert!(matches!(
            plan_windows(1, 8, 4),
            Err(CompressError::TextTooShort { tokens: 1 })
        ));
        for (ctx, stride) in [(1, 1), (0, 1), (8, 0), (8, 8), (8, 9)] {
            let e = plan_windows(100, ctx, stride).unwrap_err();
            assert!(
                matches!(e, CompressError::InvalidInput(_)),
                "{ctx} {stride}: {e}"
            );
        }
    }

    proptest! {
        #[test]
        fn every_token_after_the_first_is_scored_exactly_once(
            n in 2usize..3000,
            ctx in 2usize..400,
            stride_frac in 0.0f64..1.0,
        ) {
            let stride = 1 + ((ctx - 1) as f64 * stride_frac) as usize;
            let stride = stride.min(ctx - 1);
            let windows = plan_windows(n, ctx, stride).unwrap();
            let mut scored = Vec::new();
            for w in &windows {
                prop_assert!(w.end - w.begin <= ctx);
                prop_assert!(w.first_scored > w.begin);
                prop_assert!(w.first_scored < w.end);
                scored.extend(w.first_scored..w.end);
            }
            prop_assert_eq!(&scored, &(1..n).collect::<Vec<_>>());
            prop_assert_eq!(windows.iter().map(Window::scored).sum::<usize>(), n - 1);
            prop_assert_eq!(scored, hf_scored(n, ctx, stride));
        }
    }
}
