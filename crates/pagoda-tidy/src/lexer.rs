//! A Rust token stream good enough to read module structure: identifiers, `::`, single
//! punctuation characters and string literals; comments (nested block comments too), char
//! literals, lifetimes, numbers and whitespace are dropped.
//!
//! Invariant: a `{`, `}`, `;` or `::` inside a comment, string or char literal never becomes a
//! token, so brace depth and paths read from the stream match the compiler's.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A string literal's contents (escapes left as written).
    Str(String),
}

/// The tokens of `src`.
pub fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = c.len();
    while i < n {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < n && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < n {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some((s, next)) = string_at(&c, i) {
            out.push(Tok::Str(s));
            i = next;
        } else if ch == '\'' {
            i = skip_char_or_lifetime(&c, i);
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // Raw identifiers: `r#type` is `type` as a name.
            out.push(Tok::Ident(word));
        } else if ch.is_ascii_digit() {
            while i < n && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                // `0..n`: stop at a range.
                if c[i] == '.' && c.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// A string literal starting at `i` (`"…"`, `b"…"`, `c"…"`, `r#"…"#`, `br"…"`): its
/// contents and the index after it.
fn string_at(c: &[char], i: usize) -> Option<(String, usize)> {
    // Only at the start of a token: `br"x"` is not the identifier `br` then a string.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if matches!(c.get(j), Some('b') | Some('c')) {
        j += 1;
    }
    let raw = c.get(j) == Some(&'r');
    if raw {
        j += 1;
        let mut hashes = 0;
        while c.get(j) == Some(&'#') {
            hashes += 1;
            j += 1;
        }
        if c.get(j) != Some(&'"') {
            return None;
        }
        j += 1;
        let start = j;
        while j < c.len() {
            if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                return Some((c[start..j].iter().collect(), j + 1 + hashes));
            }
            j += 1;
        }
        return Some((c[start..].iter().collect(), c.len()));
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    let start = j;
    while j < c.len() {
        match c[j] {
            '\\' => j += 2,
            '"' => return Some((c[start..j].iter().collect(), j + 1)),
            _ => j += 1,
        }
    }
    Some((c[start..].iter().collect(), c.len()))
}

/// Skips a char literal (`'{'`, `'\''`, `'\u{7f}'`) or a lifetime (`'a`) starting at `i`.
fn skip_char_or_lifetime(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        // The escaped character, then up to the closing quote (`'\''`, `'\u{7f}'`).
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if c.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    // A lifetime or label: the quote and its name.
    let mut j = i + 1;
    while j < c.len() && (c[j].is_alphanumeric() || c[j] == '_') {
        j += 1;
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_strings_and_chars_hide_their_braces() {
        let toks = tokenize(
            "/* { /* } */ } */ let a = \"}\"; let b = '{'; let q = '\\''; let c = r#\"}\"#; fn f<'a>() {}",
        );
        let braces: Vec<&Tok> = toks
            .iter()
            .filter(|t| matches!(t, Tok::Punct('{') | Tok::Punct('}')))
            .collect();
        assert_eq!(braces, [&Tok::Punct('{'), &Tok::Punct('}')]);
        assert!(toks.contains(&Tok::Str("}".into())));
    }

    #[test]
    fn paths_are_idents_and_separators() {
        assert_eq!(
            tokenize("crate::a::B; // crate::c"),
            [
                Tok::Ident("crate".into()),
                Tok::PathSep,
                Tok::Ident("a".into()),
                Tok::PathSep,
                Tok::Ident("B".into()),
                Tok::Punct(';'),
            ]
        );
    }
}
