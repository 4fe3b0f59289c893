//! What minijinja's own limits do not cover in a chat template's source, checked before it
//! is compiled: a namespace may not end up inside a namespace.
//!
//! Why: minijinja's namespaces are the one mutable value a template has, and
//! `{% set ns.x = ns %}` makes a value that contains itself. Printing, concatenating or
//! comparing it recurses without end, which overflows any stack and aborts the process (the
//! `chat_template` fuzz target found it). The check keeps namespaces where real templates use
//! them: all 66 of the 70 templates llama.cpp ships that minijinja compiles pass it
//! (`fuel_of_real_templates` in chat_template.rs asserts so).
//!
//! The rules, on the template's expressions (strings, comments and `raw` blocks skipped):
//! - `namespace(...)` appears only as `{% set NAME = namespace(...) %}`;
//! - such a NAME is used only through its attributes or items (`NAME.x`, `NAME['x']`), or
//!   passed whole as an argument to one of the template's own macros, whose parameter is then
//!   held to the same rule; never as a value of its own otherwise (so it cannot be stored,
//!   aliased, given to a filter or printed whole).
//!
//! - in `{% set NAME.attr = ... %}`, a namespace's attributes do not go inside a list, dict,
//!   tuple or call, nor through a filter that nests (`batch`, `slice`, `groupby`, `items`,
//!   `dictsort`), unless a filter that makes a scalar follows (`| join(...)`, `| length`, …):
//!   a namespace is the one value that outlives a loop turn, so `{% set ns.l = [ns.l] %}` in a
//!   loop would nest a value as deep as the fuel allows, and printing it would recurse that
//!   deep. Elsewhere nesting is bounded: by the recursion limit in macros, by the source's
//!   length in a chain of `set`s.
//!
//! Invariant: linear in the source's length per statement; no recursion.

/// Why a template is refused (the message names the rule and the line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// One token of a template expression.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token<'a> {
    Ident(&'a str),
    Punct(char),
    Literal,
}

/// The tokens of each `{{ }}` and `{% %}` block of `source`, with the block's line.
fn blocks(source: &str) -> Vec<(usize, Vec<Token<'_>>)> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut in_raw = false;
    while i + 1 < bytes.len() {
        let opener = &bytes[i..i + 2];
        let close: &[u8] = match opener {
            b"{{" => b"}}",
            b"{%" => b"%}",
            b"{#" => b"#}",
            _ => {
                i += 1;
                continue;
            }
        };
        let line = source[..i].matches('\n').count() + 1;
        // Whitespace control (`{%-`, `{{+`) is not part of the expression.
        let start = i + 2 + usize::from(matches!(bytes.get(i + 2), Some(b'-' | b'+')));
        let (tokens, end) = tokenize(source, start, close);
        i = end;
        if opener == b"{#" {
            continue;
        }
        let is_statement = opener == b"{%";
        let keyword = match tokens.first() {
            Some(Token::Ident(k)) => Some(*k),
            _ => None,
        };
        if in_raw {
            if is_statement && keyword == Some("endraw") {
                in_raw = false;
            }
            continue;
        }
        if is_statement && keyword == Some("raw") {
            in_raw = true;
            continue;
        }
        out.push((line, tokens));
    }
    out
}

/// Tokens from `start` up to the block's `close` (outside strings); returns where the block
/// ends (past `close`, or the end of the source).
fn tokenize<'a>(source: &'a str, start: usize, close: &[u8]) -> (Vec<Token<'a>>, usize) {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = start;
    while i < bytes.len() {
        if bytes[i..].starts_with(close) {
            return (tokens, i + close.len());
        }
        let c = bytes[i];
        match c {
            b'\'' | b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                tokens.push(Token::Literal);
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let from = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                tokens.push(Token::Ident(&source[from..i]));
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if c.is_ascii_digit() => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
                tokens.push(Token::Literal);
            }
            c => {
                tokens.push(Token::Punct(char::from(c)));
                i += 1;
            }
        }
    }
    (tokens, bytes.len())
}

/// `{% set NAME = namespace(` as NAME.
fn namespace_binding<'a>(tokens: &[Token<'a>]) -> Option<&'a str> {
    match tokens {
        [Token::Ident("set"), Token::Ident(name), Token::Punct('='), Token::Ident("namespace"), Token::Punct('('), ..] => {
            Some(name)
        }
        _ => None,
    }
}

/// `{% macro NAME(p1, p2=default, ...) %}` as (NAME, [p1, p2, ...]).
fn macro_signature<'a>(tokens: &[Token<'a>]) -> Option<(&'a str, Vec<&'a str>)> {
    let [Token::Ident("macro"), Token::Ident(name), Token::Punct('('), rest @ ..] = tokens else {
        return None;
    };
    Some((
        name,
        call_arguments(rest)
            .into_iter()
            .filter_map(|a| a.name)
            .collect(),
    ))
}

/// One argument of a call (or parameter of a macro): `name` if it is `name` or `name=...`,
/// `value` if it is a single identifier (`f(ns)`, `f(k=ns)`).
struct Argument<'a> {
    name: Option<&'a str>,
    value: Option<&'a str>,
    keyword: bool,
}

/// The arguments from just after a `(` to its `)`.
fn call_arguments<'a>(tokens: &[Token<'a>]) -> Vec<Argument<'a>> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut current: Vec<&Token<'a>> = Vec::new();
    let finish = |current: &mut Vec<&Token<'a>>, out: &mut Vec<Argument<'a>>| {
        let arg = match current.as_slice() {
            [Token::Ident(v)] => Argument {
                name: Some(*v),
                value: Some(*v),
                keyword: false,
            },
            [Token::Ident(k), Token::Punct('='), Token::Ident(v)] => Argument {
                name: Some(*k),
                value: Some(*v),
                keyword: true,
            },
            [Token::Ident(k), Token::Punct('='), ..] => Argument {
                name: Some(*k),
                value: None,
                keyword: true,
            },
            _ => Argument {
                name: None,
                value: None,
                keyword: false,
            },
        };
        if !current.is_empty() {
            out.push(arg);
        }
        current.clear();
    };
    for token in tokens {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') if depth == 0 => break,
            Token::Punct(')' | ']' | '}') => depth -= 1,
            Token::Punct(',') if depth == 0 => {
                finish(&mut current, &mut out);
                continue;
            }
            _ => {}
        }
        current.push(token);
    }
    finish(&mut current, &mut out);
    out
}

/// Filters whose result holds no part of their input as a nested value.
const SCALAR_FILTERS: &[&str] = &[
    "join",
    "string",
    "length",
    "count",
    "trim",
    "lower",
    "upper",
    "int",
    "float",
    "tojson",
    "safe",
    "escape",
    "e",
    "capitalize",
    "title",
    "wordcount",
    "round",
    "abs",
    "bool",
];

/// Filters whose result nests their input one level deeper.
const NESTING_FILTERS: &[&str] = &["batch", "slice", "groupby", "items", "dictsort"];

/// In `{% set NS.attr = EXPR %}`, where a namespace access in EXPR would nest (see the module
/// docs): `Err` names the line.
fn check_nesting(line: usize, tokens: &[Token<'_>], names: &[&str]) -> Result<(), Refused> {
    let [Token::Ident("set"), Token::Ident(target), Token::Punct('.'), Token::Ident(_), Token::Punct('='), rhs @ ..] =
        tokens
    else {
        return Ok(());
    };
    if !names.contains(target) {
        return Ok(());
    }
    let refuse = || {
        Err(Refused(format!(
            "line {line}: `{{% set {target}.… %}}` nests a namespace's attribute in a list, dict, tuple, call or nesting filter; a loop could nest it without bound"
        )))
    };
    for at in 0..rhs.len() {
        let Token::Ident(name) = rhs[at] else {
            continue;
        };
        let after_dot = at > 0 && rhs[at - 1] == Token::Punct('.');
        if after_dot || !names.contains(&name) {
            continue;
        }
        // The end of the access chain: `.x`, `['x']`.
        let mut end = at + 1;
        loop {
            match (rhs.get(end), rhs.get(end + 1)) {
                (Some(Token::Punct('.')), Some(Token::Ident(_))) => end += 2,
                (Some(Token::Punct('[')), _) => {
                    let mut depth = 0usize;
                    while let Some(t) = rhs.get(end) {
                        end += 1;
                        match t {
                            Token::Punct('[') => depth += 1,
                            Token::Punct(']') => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => break,
            }
        }
        let filter = match (rhs.get(end), rhs.get(end + 1)) {
            (Some(Token::Punct('|')), Some(Token::Ident(f))) => Some(*f),
            _ => None,
        };
        if filter.is_some_and(|f| SCALAR_FILTERS.contains(&f)) {
            continue;
        }
        if filter.is_some_and(|f| NESTING_FILTERS.contains(&f)) {
            return refuse();
        }
        // The brackets around the access: a list, dict, call or tuple nests it.
        let mut open: Vec<(usize, char)> = Vec::new();
        for (i, t) in rhs[..at].iter().enumerate() {
            match t {
                Token::Punct(c @ ('(' | '[' | '{')) => open.push((i, *c)),
                Token::Punct(')' | ']' | '}') => {
                    open.pop();
                }
                _ => {}
            }
        }
        for &(i, c) in &open {
            let call = c == '(' && i > 0 && matches!(rhs[i - 1], Token::Ident(_));
            let tuple = c == '(' && !call && has_comma_at_level(&rhs[i + 1..]);
            if c != '(' || call || tuple {
                return refuse();
            }
        }
    }
    Ok(())
}

/// Whether the bracket whose contents start `inside` holds a comma at its own level.
fn has_comma_at_level(inside: &[Token<'_>]) -> bool {
    let mut depth = 0usize;
    for t in inside {
        match t {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') if depth == 0 => return false,
            Token::Punct(')' | ']' | '}') => depth -= 1,
            Token::Punct(',') if depth == 0 => return true,
            _ => {}
        }
    }
    false
}

/// Checks `source` against the module's rules.
pub fn check(source: &str) -> Result<(), Refused> {
    let blocks = blocks(source);
    let macros: Vec<(&str, Vec<&str>)> = blocks
        .iter()
        .filter_map(|(_, tokens)| macro_signature(tokens))
        .collect();
    let mut names: Vec<&str> = blocks
        .iter()
        .filter_map(|(_, tokens)| namespace_binding(tokens))
        .collect();
    // A namespace passed to a macro of the template is a namespace under its parameter's
    // name there too (to a fixed point: macros pass it on).
    loop {
        let before = names.len();
        for (_, tokens) in &blocks {
            for at in 0..tokens.len() {
                let (Token::Ident(callee), Some(Token::Punct('('))) =
                    (&tokens[at], tokens.get(at + 1))
                else {
                    continue;
                };
                let Some((_, params)) = macros.iter().find(|(m, _)| m == callee) else {
                    continue;
                };
                for (position, arg) in call_arguments(&tokens[at + 2..]).iter().enumerate() {
                    if !arg.value.is_some_and(|v| names.contains(&v)) {
                        continue;
                    }
                    let param = if arg.keyword {
                        arg.name
                    } else {
                        params.get(position).copied()
                    };
                    if let Some(p) = param.filter(|p| !names.contains(p)) {
                        names.push(p);
                    }
                }
            }
        }
        if names.len() == before {
            break;
        }
    }
    // A macro parameter named `namespace` shadows the function inside that macro (one real
    // template names its parameter so); elsewhere a bare `namespace` would alias the function.
    let namespace_is_shadowed = macros
        .iter()
        .any(|(_, params)| params.contains(&"namespace"));
    for (line, tokens) in &blocks {
        check_nesting(*line, tokens, &names)?;
        let binding = namespace_binding(tokens);
        let is_macro_header = macro_signature(tokens).is_some();
        // Positions of whole arguments of calls to the template's own macros.
        let mut macro_arguments: Vec<usize> = Vec::new();
        for at in 0..tokens.len() {
            if let (Token::Ident(callee), Some(Token::Punct('('))) =
                (&tokens[at], tokens.get(at + 1))
            {
                if macros.iter().any(|(m, _)| m == callee) {
                    let mut depth = 0usize;
                    for (offset, t) in tokens[at + 2..].iter().enumerate() {
                        match t {
                            Token::Punct('(' | '[' | '{') => depth += 1,
                            Token::Punct(')' | ']' | '}') if depth == 0 => break,
                            Token::Punct(')' | ']' | '}') => depth -= 1,
                            Token::Ident(_) if depth == 0 => {
                                let i = at + 2 + offset;
                                let before = &tokens[i - 1];
                                let after = tokens.get(i + 1);
                                let starts = matches!(before, Token::Punct('(' | ',' | '='));
                                let ends = matches!(after, Some(Token::Punct(',' | ')')));
                                if starts && ends {
                                    macro_arguments.push(i);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        for (at, token) in tokens.iter().enumerate() {
            let Token::Ident(name) = token else { continue };
            let after_dot = at > 0 && tokens[at - 1] == Token::Punct('.');
            if after_dot {
                continue;
            }
            let called = tokens.get(at + 1) == Some(&Token::Punct('('));
            if *name == "namespace" && (called || !namespace_is_shadowed) {
                if binding.is_none() || at != 3 {
                    return Err(Refused(format!(
                        "line {line}: `namespace(...)` is only allowed as `{{% set NAME = namespace(...) %}}`"
                    )));
                }
                continue;
            }
            if !names.contains(name)
                || (binding.is_some() && at == 1)
                || is_macro_header
                || macro_arguments.contains(&at)
            {
                continue;
            }
            // `name = ...`: a keyword argument's name or an assignment's target, not a use.
            let assigned = tokens.get(at + 1) == Some(&Token::Punct('='))
                && tokens.get(at + 2) != Some(&Token::Punct('='));
            let accessed = assigned
                || matches!(
                    tokens.get(at + 1),
                    Some(Token::Punct('.')) | Some(Token::Punct('['))
                );
            if !accessed {
                return Err(Refused(format!(
                    "line {line}: the namespace `{name}` is used as a value; use its attributes (`{name}.x`): a namespace may be passed to the template's macros, but not stored, aliased or printed whole"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_used_through_attributes_pass() {
        let ok = "{% set ns = namespace(found=false, items=[]) %}{% for m in messages %}\
                  {% set ns.found = ns.found or m.role == 'tool' %}\
                  {% set ns.items = ns.items + [m.content | trim] %}{% endfor %}\
                  {{ ns.found }}{{ ns['items'] | join(', ') }}{{ 'namespace' }}{# ns #}\
                  {% raw %}{{ ns }}{% endraw %}{{ namespace_name }}\
                  {%- set ns2 = namespace(a=1) -%}{{- ns2.a -}}\
                  {% macro bump(text, state) %}{{ text }}{% set state.a = state.a + 1 %}{% endmacro %}\
                  {{ bump('x', ns2) }}{{ bump(text='y', state=ns2) }}";
        assert_eq!(check(ok), Ok(()));
    }

    #[test]
    fn a_namespace_inside_a_namespace_is_refused() {
        for bad in [
            "{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns.x }}",
            "{% set ns = namespace(x=0) %}{% set ns.x = [ns] %}",
            "{% set a = namespace() %}{% set b = namespace(x=a) %}",
            "{% set ns = namespace() %}{% set alias = ns %}",
            "{% set ns = namespace() %}{{ ns }}",
            "{% set ns = namespace() %}{% macro f(n) %}{% set n.x = n %}{% endmacro %}{{ f(ns) }}",
            "{% set ns = namespace() %}{% macro f(a, n) %}{{ n }}{% endmacro %}{{ f(1, n=ns) }}",
            "{% set ns = namespace() %}{{ ns | tojson }}",
            "{% set make = namespace %}",
            "{% set ns = namespace() %}{% set ns.child = namespace() %}",
            "{{ namespace(a=1) }}",
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.0.starts_with("line 1:"), "{bad}: {}", e.0);
        }
    }

    #[test]
    fn lines_are_counted() {
        let e = check("a\nb\n{% set ns = namespace() %}\n{{ ns }}").expect_err("bare");
        assert!(e.0.starts_with("line 4:"), "{}", e.0);
    }
}
