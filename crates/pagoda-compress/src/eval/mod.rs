//! Accuracy evaluation of a loaded model: perplexity over a text, multiple-choice accuracy.
