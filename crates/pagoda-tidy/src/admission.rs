//! Where the front ends range-check a request's fields: the functions whose code refuses a
//! field by name (`param("max_tokens", ...)`, `invalid_param("temperature", ...)`) or refuses
//! a prompt for its length (`with_code("context_length_exceeded")`). One admission (a request
//! becomes one checked plan in pagoda-runtime) means each field has exactly one such
//! function; `tests/structure.rs` holds the list.
//!
//! Invariant: only code counts — comments, doc text and `#[cfg(test)] mod` blocks are
//! skipped, and the enclosing function is the last `fn` opened before the site.

use crate::lexer::{tokenize, Tok};

/// A field whose range is checked in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    /// `max_tokens` (OpenAI's `max_tokens` / `max_completion_tokens`, Ollama's
    /// `options.num_predict`).
    MaxTokens,
    Temperature,
    /// The number of choices.
    N,
    /// The prompt's length against the context (`context_length_exceeded`).
    PromptLength,
}

/// A function that refuses a field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Site {
    pub field: Field,
    /// The function the check is in.
    pub function: String,
}

/// The field a parameter name in an error belongs to.
fn field_of_param(name: &str) -> Option<Field> {
    match name {
        "max_tokens" | "options.num_predict" => Some(Field::MaxTokens),
        "temperature" => Some(Field::Temperature),
        "n" => Some(Field::N),
        _ => None,
    }
}

/// The check sites in one file's source, each once per function.
pub fn sites(src: &str) -> Vec<Site> {
    let toks = tokenize(src);
    let mut out: Vec<Site> = Vec::new();
    let mut function = String::new();
    let mut i = 0;
    while i < toks.len() {
        if is_test_module(&toks, i) {
            i = skip_block(&toks, i);
            continue;
        }
        let field = match (&toks[i], toks.get(i + 1), toks.get(i + 2)) {
            (Tok::Ident(f), Some(Tok::Ident(name)), _) if f == "fn" => {
                function = name.clone();
                None
            }
            (Tok::Ident(call), Some(Tok::Punct('(')), Some(Tok::Str(s)))
                if call == "param" || call == "invalid_param" =>
            {
                field_of_param(s)
            }
            (Tok::Ident(call), Some(Tok::Punct('(')), Some(Tok::Str(s)))
                if call == "with_code" && s == "context_length_exceeded" =>
            {
                Some(Field::PromptLength)
            }
            _ => None,
        };
        if let Some(field) = field {
            let site = Site {
                field,
                function: function.clone(),
            };
            if !out.contains(&site) {
                out.push(site);
            }
        }
        i += 1;
    }
    out
}

/// `#[cfg(test)] mod NAME {` at `i`.
fn is_test_module(toks: &[Tok], i: usize) -> bool {
    let want = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
        Tok::Ident("mod".into()),
    ];
    toks.get(i..i + want.len()) == Some(&want[..])
        && matches!(toks.get(i + want.len() + 1), Some(Tok::Punct('{')))
}

/// The index after the block that opens at the first `{` from `i`.
fn skip_block(toks: &[Tok], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_named_refusals_in_code_only_with_their_function() {
        let src = r#"
            /// param("temperature", ...) in a doc comment does not count.
            fn check(t: f32) -> Result<(), E> {
                // Nor param("n") in a comment.
                Err(RequestError::param(
                    "temperature",
                    "temperature must be in [0, 2]",
                ))
            }
            fn build() {
                let a = ApiError::invalid_param("max_tokens", "x");
                let b = RequestError::param("options.num_predict", "y");
                let c = e.with_code("context_length_exceeded");
                let d = RequestError::param("top_p", "not tracked");
            }
            #[cfg(test)]
            mod tests {
                fn t() { RequestError::param("n", "in a test"); }
            }
        "#;
        let got = sites(src);
        let site = |field, function: &str| Site {
            field,
            function: function.into(),
        };
        assert_eq!(
            got,
            vec![
                site(Field::Temperature, "check"),
                site(Field::MaxTokens, "build"),
                site(Field::PromptLength, "build"),
            ]
        );
    }
}
