//! How deep a constraint spec nests, measured before it is compiled: JSON schema subschemas
//! with `$ref` chains followed, Lark rule chains (including the schemas of `%json { … }`) and
//! brackets, regex groups.
//!
//! Why: llguidance compiles by recursion over exactly these structures. A spec that is small
//! in bytes can still be deep (a chain of 800 Lark rules is 9.5 KB; 1,000 `$ref`s 34 KB), and
//! recursion that deep needs more stack than any fixed thread has. Constraints are compiled on
//! a deep stack ([`pagoda_model::isolated`]); this check keeps every spec within what that
//! stack is tested to hold, and tells the client which limit it crossed.
//!
//! Invariants: measuring never recurses (explicit stacks), visits each `$ref` target and each
//! Lark rule once (memoized), and stops at [`MAX_WORK`] nodes, so it is linear in the spec's
//! size whatever its shape. A cycle (a rule or `$ref` that reaches itself) is recursion the
//! grammar handles lazily; it adds no depth here.

use std::collections::HashMap;

/// Deepest nesting of a JSON schema, in JSON objects and arrays entered with each local
/// `$ref` followed: an object property costs two (`properties`, then the property's schema).
/// A request body nests at most 64 deep, so only `$ref` chains come near this.
pub const MAX_SCHEMA_DEPTH: usize = 256;

/// Longest chain of Lark rules each referring to the next, and deepest nesting of brackets
/// (`(`, `[`, `{`) in a grammar or regex.
pub const MAX_GRAMMAR_DEPTH: usize = 128;

/// Most JSON values or grammar bytes one measurement looks at.
pub const MAX_WORK: usize = 4_000_000;

/// A spec deeper than a limit: the message names what and the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep(pub String);

/// Checks a JSON schema's depth against [`MAX_SCHEMA_DEPTH`].
pub fn check_schema(schema: &serde_json::Value) -> Result<(), TooDeep> {
    let depth = schema_depth(schema)?;
    if depth > MAX_SCHEMA_DEPTH {
        return Err(TooDeep(format!(
            "the JSON schema nests {depth} levels deep (subschemas and $ref chains), more than the limit of {MAX_SCHEMA_DEPTH}"
        )));
    }
    Ok(())
}

/// Checks a regex's group nesting against [`MAX_GRAMMAR_DEPTH`].
pub fn check_regex(regex: &str) -> Result<(), TooDeep> {
    let depth = bracket_depth(regex);
    if depth > MAX_GRAMMAR_DEPTH {
        return Err(TooDeep(format!(
            "the regex nests groups {depth} deep, more than the limit of {MAX_GRAMMAR_DEPTH}"
        )));
    }
    Ok(())
}

/// Checks a Lark grammar: its rule chains, bracket nesting and embedded `%json` schemas.
pub fn check_lark(grammar: &str) -> Result<(), TooDeep> {
    let parsed = LarkOutline::read(grammar);
    if parsed.bracket_depth > MAX_GRAMMAR_DEPTH {
        return Err(TooDeep(format!(
            "the grammar nests brackets {} deep, more than the limit of {MAX_GRAMMAR_DEPTH}",
            parsed.bracket_depth
        )));
    }
    let chain = parsed.longest_chain();
    if chain > MAX_GRAMMAR_DEPTH {
        return Err(TooDeep(format!(
            "the grammar has a chain of {chain} rules each using the next, more than the limit of {MAX_GRAMMAR_DEPTH}"
        )));
    }
    for schema in &parsed.json_schemas {
        match serde_json::from_str::<serde_json::Value>(schema) {
            Ok(v) => check_schema(&v).map_err(|TooDeep(m)| TooDeep(format!("%json: {m}")))?,
            // Not JSON: llguidance reports it when compiling.
            Err(_) => continue,
        }
    }
    Ok(())
}

/// Depth of `root`: one level per JSON object or array entered, a local `$ref` (`#…`)
/// continuing at its target. Each target's own depth is computed once.
fn schema_depth(root: &serde_json::Value) -> Result<usize, TooDeep> {
    // Depth below each `$ref` target (`None` while it is being measured: a cycle).
    let mut targets: HashMap<String, Option<usize>> = HashMap::new();
    let mut work = 0usize;
    measure_schema(root, root, &mut targets, &mut work)
}

/// One frame of the explicit stack of [`measure_schema`].
struct Frame<'a> {
    children: Vec<Child<'a>>,
    next: usize,
    deepest: usize,
    /// The `$ref` target this frame measures (its result is memoized).
    target: Option<String>,
}

enum Child<'a> {
    Value(&'a serde_json::Value),
    Ref(String),
}

fn children(value: &serde_json::Value) -> Vec<Child<'_>> {
    let mut out = Vec::new();
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", serde_json::Value::String(r)) if r.starts_with('#') => {
                        out.push(Child::Ref(r.clone()))
                    }
                    (_, serde_json::Value::Object(_) | serde_json::Value::Array(_)) => {
                        out.push(Child::Value(v))
                    }
                    _ => {}
                }
            }
        }
        serde_json::Value::Array(items) => out.extend(
            items
                .iter()
                .filter(|v| v.is_object() || v.is_array())
                .map(Child::Value),
        ),
        _ => {}
    }
    out
}

/// `#/a/b` (percent-decoded) as the value it points at.
fn resolve<'a>(root: &'a serde_json::Value, reference: &str) -> Option<&'a serde_json::Value> {
    let pointer = reference.strip_prefix('#')?;
    let decoded = percent_decode(pointer);
    root.pointer(&decoded)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn measure_schema<'a>(
    root: &'a serde_json::Value,
    start: &'a serde_json::Value,
    targets: &mut HashMap<String, Option<usize>>,
    work: &mut usize,
) -> Result<usize, TooDeep> {
    let mut stack = vec![Frame {
        children: children(start),
        next: 0,
        deepest: 0,
        target: None,
    }];
    loop {
        *work += 1;
        if *work > MAX_WORK {
            return Err(TooDeep(format!(
                "the JSON schema is too large to measure (more than {MAX_WORK} values and references)"
            )));
        }
        // Past the limit there is nothing more to learn: report it now (and stay linear).
        if stack.len() > MAX_SCHEMA_DEPTH + 1 {
            return Ok(stack.len());
        }
        let top = stack.len() - 1;
        let frame = &mut stack[top];
        if frame.next == frame.children.len() {
            let done = stack.pop().expect("a frame is on the stack");
            let depth = done.deepest + 1;
            if let Some(t) = done.target {
                targets.insert(t, Some(depth));
            }
            match stack.last_mut() {
                Some(parent) => parent.deepest = parent.deepest.max(depth),
                None => return Ok(depth),
            }
            continue;
        }
        let child = match &frame.children[frame.next] {
            Child::Value(v) => Child::Value(v),
            Child::Ref(r) => Child::Ref(r.clone()),
        };
        frame.next += 1;
        match child {
            Child::Value(v) => stack.push(Frame {
                children: children(v),
                next: 0,
                deepest: 0,
                target: None,
            }),
            Child::Ref(r) => match targets.get(&r) {
                Some(Some(known)) => {
                    let frame = &mut stack[top];
                    frame.deepest = frame.deepest.max(*known);
                }
                // A cycle: recursion, which the grammar expands lazily.
                Some(None) => {}
                // Not measured yet (an unresolvable one is llguidance's to report).
                None => {
                    if let Some(target) = resolve(root, &r) {
                        targets.insert(r.clone(), None);
                        stack.push(Frame {
                            children: children(target),
                            next: 0,
                            deepest: 0,
                            target: Some(r),
                        });
                    }
                }
            },
        }
    }
}

/// Deepest nesting of `(`, `[` and `{` in `text`, skipping escaped characters.
fn bracket_depth(text: &str) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '(' | '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// What the depth check needs of a Lark grammar: each rule's name and the names its body
/// mentions, the deepest bracket nesting outside literals, and the `%json` schemas' texts.
/// A rough reading (no full Lark parser): it may see a reference where Lark sees none, which
/// only makes the measured chain longer.
#[derive(Debug, Default)]
struct LarkOutline {
    rules: Vec<(String, Vec<String>)>,
    bracket_depth: usize,
    json_schemas: Vec<String>,
}

impl LarkOutline {
    fn read(grammar: &str) -> LarkOutline {
        let mut outline = LarkOutline::default();
        let mut current: Option<(String, Vec<String>)> = None;
        for line in grammar.lines() {
            let trimmed = line.trim_start();
            let continues = line.starts_with([' ', '\t']) || trimmed.starts_with('|');
            if !continues && !trimmed.is_empty() && !trimmed.starts_with("//") {
                if let Some(rule) = current.take() {
                    outline.rules.push(rule);
                }
                if let Some((name, body)) = rule_head(trimmed) {
                    let mut refs = Vec::new();
                    outline.scan_body(body, &mut refs);
                    current = Some((name, refs));
                    continue;
                }
                // A directive (`%import`, `%ignore`, …): no rule follows until the next head.
                continue;
            }
            if let Some((_, refs)) = current.as_mut() {
                let mut more = Vec::new();
                outline.scan_body(line, &mut more);
                refs.extend(more);
            }
        }
        if let Some(rule) = current.take() {
            outline.rules.push(rule);
        }
        outline
    }

    /// Collects the identifiers of `body` outside strings, regexes, comments and `%json`
    /// objects, and measures its brackets.
    fn scan_body(&mut self, body: &str, refs: &mut Vec<String>) {
        let chars: Vec<char> = body.chars().collect();
        let mut depth = 0usize;
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match c {
                '/' if chars.get(i + 1) == Some(&'/') => break,
                '"' | '/' => i = skip_literal(&chars, i),
                '%' if body[char_offset(body, i)..].starts_with("%json") => {
                    let start = i + "%json".len();
                    let end = skip_object(&chars, start);
                    self.json_schemas.push(chars[start..end].iter().collect());
                    i = end;
                    continue;
                }
                '(' | '[' | '{' => {
                    depth += 1;
                    self.bracket_depth = self.bracket_depth.max(depth);
                }
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                c if c.is_ascii_alphabetic() || c == '_' => {
                    let start = i;
                    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                    refs.push(chars[start..i].iter().collect());
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// The longest chain of rules each mentioning the next (cycles cut), in rules.
    fn longest_chain(&self) -> usize {
        let index: HashMap<&str, usize> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.as_str(), i))
            .collect();
        let edges: Vec<Vec<usize>> = self
            .rules
            .iter()
            .map(|(_, refs)| {
                let mut e: Vec<usize> = refs
                    .iter()
                    .filter_map(|r| index.get(r.as_str()).copied())
                    .collect();
                e.sort_unstable();
                e.dedup();
                e
            })
            .collect();
        // 0: unvisited, 1: on the stack, 2: done (length in `chain`).
        let mut state = vec![0u8; edges.len()];
        let mut chain = vec![0usize; edges.len()];
        let mut longest = 0;
        for start in 0..edges.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&to) = edges[node].get(*next) {
                    *next += 1;
                    match state[to] {
                        0 => {
                            state[to] = 1;
                            stack.push((to, 0));
                        }
                        2 => chain[node] = chain[node].max(chain[to]),
                        _ => {}
                    }
                } else {
                    chain[node] += 1;
                    state[node] = 2;
                    stack.pop();
                    if let Some(&(parent, _)) = stack.last() {
                        chain[parent] = chain[parent].max(chain[node]);
                    }
                }
            }
            longest = longest.max(chain[start]);
        }
        longest
    }
}

/// `name: body` (Lark rule or terminal, optional `?`/`!` and `.priority`) as (name, body).
fn rule_head(line: &str) -> Option<(String, &str)> {
    let rest = line.trim_start_matches(['?', '!']);
    let name_len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    if name_len == 0 {
        return None;
    }
    let (name, after) = rest.split_at(name_len);
    let after = after
        .strip_prefix('.')
        .map(|p| p.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-'))
        .unwrap_or(after);
    let body = after.trim_start().strip_prefix(':')?;
    Some((name.to_string(), body))
}

/// The index just past the string (`"…"`) or regex (`/…/flags`) starting at `start`.
fn skip_literal(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_alphabetic() {
                    i += 1;
                }
                return i;
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// The index just past the balanced `{…}` at or after `start` (strings skipped).
fn skip_object(chars: &[char], start: usize) -> usize {
    let mut i = start;
    let mut depth = 0usize;
    while i < chars.len() {
        match chars[i] {
            '"' => {
                i = skip_literal(chars, i);
                continue;
            }
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

/// The byte offset of char index `i` in `s`.
fn char_offset(s: &str, i: usize) -> usize {
    s.char_indices().nth(i).map_or(s.len(), |(o, _)| o)
}

/// Spec builders shared with the constraint tests.
#[cfg(test)]
pub(crate) mod test_specs {
    use serde_json::json;

    /// A schema whose root refers to d0, d0 to d1, …: `n` definitions in a chain.
    pub(crate) fn ref_chain(n: usize) -> serde_json::Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                json!({"type": "integer"})
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    /// `r0: r1`, `r1: r2`, … (`n` rules).
    pub(crate) fn lark_chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            if i + 1 < n {
                g.push_str(&format!("r{i}: r{}\n", i + 1));
            } else {
                g.push_str(&format!("r{i}: \"x\"\n"));
            }
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::test_specs::{lark_chain, ref_chain};
    use super::*;
    use serde_json::json;

    #[test]
    fn ref_chains_count_each_reference() {
        assert!(check_schema(&ref_chain(10)).is_ok());
        let e = check_schema(&ref_chain(1000)).expect_err("too deep");
        assert!(e.0.contains("limit of 256"), "{}", e.0);
    }

    #[test]
    fn cycles_and_shared_targets_are_not_depth() {
        let recursive = json!({
            "$ref": "#/$defs/node",
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}
        });
        assert!(check_schema(&recursive).is_ok());
        assert!(check_schema(&json!({"$ref": "#"})).is_ok());
        // 60 levels each referring to the next twice: memoized, so linear, and not deep.
        let mut defs = serde_json::Map::new();
        for i in 0..60 {
            let n = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": n}, {"$ref": n}]}),
            );
        }
        defs.insert("d60".into(), json!({"type": "string"}));
        let wide = json!({"$ref": "#/$defs/d0", "$defs": defs});
        let depth = schema_depth(&wide).expect("measured");
        assert!(depth > 60 && depth <= MAX_SCHEMA_DEPTH, "{depth}");
    }

    #[test]
    fn lark_rule_chains_and_brackets() {
        assert!(check_lark(&lark_chain(20)).is_ok());
        let e = check_lark(&lark_chain(800)).expect_err("too deep");
        assert!(e.0.contains("chain of 801 rules"), "{}", e.0);
        let nested = format!("start: {}\"a\"{}", "(".repeat(500), ")".repeat(500));
        assert!(check_lark(&nested)
            .expect_err("deep")
            .0
            .contains("brackets"));
        // Recursion is not a chain; names inside strings and regexes are not references.
        let ok =
            "start: item+\nitem: \"(\" item \")\" | WORD\nWORD: /[a-z(]+/ // r1 r2\n%ignore \" \"";
        assert!(check_lark(ok).is_ok());
    }

    #[test]
    fn lark_json_schemas_are_checked() {
        let g = format!("start: %json {}", ref_chain(500));
        let e = check_lark(&g).expect_err("too deep");
        assert!(e.0.starts_with("%json:"), "{}", e.0);
        assert!(check_lark("start: %json {\"type\": \"integer\"}").is_ok());
    }

    #[test]
    fn regex_groups() {
        assert!(check_regex(r"(a(b)[c(])\(").is_ok());
        assert!(check_regex(&"(".repeat(200)).is_err());
    }
}
