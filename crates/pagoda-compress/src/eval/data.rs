//! The evaluation data that ships inside the binary, so `pagoda eval` runs without a
//! download: an English prose text for perplexity (`data/eval_text.txt`, original writing,
//! free to use) and a small multiple-choice sample (`data/mc_sample.jsonl`, simple facts and
//! common sense). Both files are also in the repository for other tools to read.

/// The default perplexity text (about 30 KB of varied English prose).
pub const EVAL_TEXT: &str = include_str!("../../data/eval_text.txt");

/// The default multiple-choice questions, JSONL (`context`, `choices`, `gold`).
pub const MC_SAMPLE: &str = include_str!("../../data/mc_sample.jsonl");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_questions_parse() {
        let items = crate::eval::multiple_choice::parse_jsonl(MC_SAMPLE).expect("sample parses");
        assert!(items.len() >= 20, "{} questions", items.len());
    }

    #[test]
    fn the_text_is_substantial() {
        assert!(EVAL_TEXT.len() > 20_000, "{} bytes", EVAL_TEXT.len());
    }
}
