//! Modelfiles, as Ollama writes them: a base model plus the defaults a derived model carries.
//!
//! Owns [`Modelfile`], [`Parameters`], [`Message`], [`Role`], [`ModelfileError`], the parser
//! ([`Modelfile::parse`]) and the renderer ([`Modelfile::render`]). The grammar, one instruction
//! per line (instruction names are case-insensitive; `#` at the start of a line is a comment):
//!
//! ```text
//! FROM smollm2:135m                 # a store or catalog name, a path, a GGUF file or a source
//! PARAMETER temperature 0.2         # typed; unknown keys are an error
//! PARAMETER stop "<|im_end|>"       # `stop` repeats; every other key is given at most once
//! TEMPLATE """{{ messages }}"""     # a Jinja chat template (Go templates are not supported)
//! SYSTEM You are a pirate.          # the rest of the line, or a quoted string
//! MESSAGE user Hello                # system, user or assistant; repeats, kept in order
//! ADAPTER ./lora.gguf               # parsed; `pagoda create` refuses it (no LoRA yet)
//! LICENSE """MIT ..."""             # repeats
//! ```
//!
//! A value is the rest of the line (trailing blanks dropped), or a quoted string: `"""..."""`
//! (raw: no escapes, may span lines, ends at the first `"""`), or `"..."` / `'...'` (may span
//! lines; `\"`, `\'` and `\\` are escapes, any other backslash is kept as written). Nothing but
//! blanks may follow a closing quote on its line.
//!
//! Invariants:
//! - [`Modelfile::parse`] never panics, whatever its input; every error but a missing FROM
//!   names the 1-based line it is about.
//! - A parsed Modelfile is valid: exactly one FROM (non-empty), TEMPLATE and SYSTEM at most once,
//!   TEMPLATE not empty, every scalar PARAMETER at most once and in its range, no empty stop
//!   string. [`Modelfile::validate`] checks the same for values built in code.
//! - Round trip: `Modelfile::parse(&m.render()) == Ok(m)` for every valid `m` (the renderer picks
//!   for each string a form that reads back to exactly that string).
//! - Serialized (in a manifest), absent fields read back as empty, so manifests written before
//!   a field existed still read.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The keys `PARAMETER` accepts.
pub const PARAMETER_KEYS: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "num_predict",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "num_ctx",
];

const INSTRUCTIONS: &str = "FROM, PARAMETER, TEMPLATE, SYSTEM, ADAPTER, MESSAGE and LICENSE";

/// Why a Modelfile could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelfileError {
    #[error("line {line}: unknown instruction `{word}`; a Modelfile uses {INSTRUCTIONS}")]
    UnknownInstruction { line: usize, word: String },

    #[error("line {line}: {instruction} needs {what}")]
    MissingArgument {
        line: usize,
        instruction: &'static str,
        what: &'static str,
    },

    #[error("line {line}: the string opened with {quote} is never closed; end it with {quote}")]
    Unterminated { line: usize, quote: &'static str },

    #[error("line {line}: unexpected text `{text}` after the closing quote")]
    TrailingText { line: usize, text: String },

    #[error(
        "line {line}: unknown parameter `{key}`; known parameters: {}",
        PARAMETER_KEYS.join(", ")
    )]
    UnknownParameter { line: usize, key: String },

    #[error("line {line}: PARAMETER {key} {value}: {reason}")]
    InvalidParameter {
        line: usize,
        key: String,
        value: String,
        reason: String,
    },

    #[error("line {line}: unknown MESSAGE role `{role}`; use system, user or assistant")]
    InvalidRole { line: usize, role: String },

    #[error("line {line}: {what} is given twice (first on line {first}); keep one")]
    Duplicate {
        line: usize,
        what: String,
        first: usize,
    },

    #[error("line {line}: {instruction} is empty")]
    Empty {
        line: usize,
        instruction: &'static str,
    },

    #[error(
        "the Modelfile has no FROM line; start it with `FROM <model name, path or GGUF file>`"
    )]
    MissingFrom,

    /// A value built in code that a Modelfile could not hold ([`Modelfile::validate`]).
    #[error("{0}")]
    Invalid(String),
}

/// Who speaks in a `MESSAGE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// `system`, `user` or `assistant`, as chat templates name roles.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    /// `system`, `user` or `assistant` (any case); `None` for anything else.
    pub fn parse(text: &str) -> Option<Role> {
        match text.to_ascii_lowercase().as_str() {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }
}

/// One `MESSAGE role content` line: a turn put in front of every chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// The `PARAMETER` lines, typed. `None` / empty: not set (the base model's value holds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Parameters {
    /// `>= 0`; 0 is greedy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// `0` is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// In `[0, 1]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// In `[0, 1]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Negative: a random seed per request (Ollama's `-1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Stop strings, in order; none empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Most tokens per answer; `-1` no limit, `-2` until the context is full; never 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_predict: Option<i64>,
    /// `> 0`; 1 is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f32>,
    /// `-1`: the whole context; 0: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_last_n: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Context window in tokens, `>= 1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_ctx: Option<u32>,
}

impl Parameters {
    /// True when no parameter is set.
    pub fn is_empty(&self) -> bool {
        *self == Parameters::default()
    }

    /// `(key, value)` of every parameter set, in [`PARAMETER_KEYS`] order (one pair per stop
    /// string), values as a Modelfile writes them (stop strings unquoted).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        fn push<T: fmt::Display>(
            out: &mut Vec<(&'static str, String)>,
            k: &'static str,
            v: &Option<T>,
        ) {
            if let Some(v) = v {
                out.push((k, v.to_string()));
            }
        }
        let mut out = Vec::new();
        push(&mut out, "temperature", &self.temperature);
        push(&mut out, "top_k", &self.top_k);
        push(&mut out, "top_p", &self.top_p);
        push(&mut out, "min_p", &self.min_p);
        push(&mut out, "seed", &self.seed);
        for s in &self.stop {
            out.push(("stop", s.clone()));
        }
        push(&mut out, "num_predict", &self.num_predict);
        push(&mut out, "repeat_penalty", &self.repeat_penalty);
        push(&mut out, "repeat_last_n", &self.repeat_last_n);
        push(&mut out, "presence_penalty", &self.presence_penalty);
        push(&mut out, "frequency_penalty", &self.frequency_penalty);
        push(&mut out, "num_ctx", &self.num_ctx);
        out
    }

    /// Sets `key` from its text as a `PARAMETER key value` line does, for parameters given
    /// some other way (a JSON map): `stop` appends, any other key given twice, an unknown key
    /// or a value out of range is an error naming the key and the accepted values.
    pub fn set_text(&mut self, key: &str, value: &str) -> Result<(), ModelfileError> {
        match self.set(key, value) {
            Ok(true) => Ok(()),
            Ok(false) => Err(ModelfileError::Invalid(format!(
                "parameter `{key}` is given twice; keep one"
            ))),
            Err(None) => Err(ModelfileError::Invalid(format!(
                "unknown parameter `{key}`; known parameters: {}",
                PARAMETER_KEYS.join(", ")
            ))),
            Err(Some(reason)) => Err(ModelfileError::Invalid(format!(
                "parameter `{key}` {value}: {reason}"
            ))),
        }
    }

    /// Sets `key` from its text. `Err(None)`: unknown key; `Err(Some(reason))`: bad value.
    /// `Ok(false)`: the key was already set (and is left as it was); `stop` appends.
    fn set(&mut self, key: &str, value: &str) -> Result<bool, Option<String>> {
        fn slot<T>(s: &mut Option<T>, v: T) -> bool {
            if s.is_some() {
                return false;
            }
            *s = Some(v);
            true
        }
        Ok(match key {
            "temperature" => slot(&mut self.temperature, non_negative(value)?),
            "top_k" => slot(&mut self.top_k, int::<u32>(value, "a whole number >= 0")?),
            "top_p" => slot(&mut self.top_p, unit(value)?),
            "min_p" => slot(&mut self.min_p, unit(value)?),
            "seed" => slot(&mut self.seed, int::<i64>(value, "a whole number")?),
            "stop" => {
                if value.is_empty() {
                    return Err(Some("a stop string must not be empty".into()));
                }
                self.stop.push(value.to_string());
                true
            }
            "num_predict" => {
                let n = int::<i64>(value, "a whole number")?;
                if n == 0 || n < -2 {
                    return Err(Some(
                        "use a positive count, -1 (no limit) or -2 (fill the context)".into(),
                    ));
                }
                slot(&mut self.num_predict, n)
            }
            "repeat_penalty" => {
                let v = non_negative(value)?;
                if v <= 0.0 {
                    return Err(Some("must be > 0 (1 is off)".into()));
                }
                slot(&mut self.repeat_penalty, v)
            }
            "repeat_last_n" => {
                let n = int::<i64>(value, "a whole number")?;
                if n < -1 {
                    return Err(Some(
                        "use -1 (the whole context), 0 (off) or a count".into(),
                    ));
                }
                slot(&mut self.repeat_last_n, n)
            }
            "presence_penalty" => slot(&mut self.presence_penalty, float(value)?),
            "frequency_penalty" => slot(&mut self.frequency_penalty, float(value)?),
            "num_ctx" => {
                let n = int::<u32>(value, "a whole number >= 1")?;
                if n == 0 {
                    return Err(Some("expected a whole number >= 1".into()));
                }
                slot(&mut self.num_ctx, n)
            }
            _ => return Err(None),
        })
    }

    /// Fills what `self` leaves unset from `parent` (`stop` as a whole: the child's list, if
    /// it has one, replaces the parent's).
    pub fn inherit(&mut self, parent: &Parameters) {
        fn fill<T: Clone>(s: &mut Option<T>, p: &Option<T>) {
            if s.is_none() {
                s.clone_from(p);
            }
        }
        fill(&mut self.temperature, &parent.temperature);
        fill(&mut self.top_k, &parent.top_k);
        fill(&mut self.top_p, &parent.top_p);
        fill(&mut self.min_p, &parent.min_p);
        fill(&mut self.seed, &parent.seed);
        if self.stop.is_empty() {
            self.stop.clone_from(&parent.stop);
        }
        fill(&mut self.num_predict, &parent.num_predict);
        fill(&mut self.repeat_penalty, &parent.repeat_penalty);
        fill(&mut self.repeat_last_n, &parent.repeat_last_n);
        fill(&mut self.presence_penalty, &parent.presence_penalty);
        fill(&mut self.frequency_penalty, &parent.frequency_penalty);
        fill(&mut self.num_ctx, &parent.num_ctx);
    }

    /// Checks every value as the parser would.
    fn validate(&self) -> Result<(), String> {
        let mut fresh = Parameters::default();
        for (key, value) in self.entries() {
            match fresh.set(key, &value) {
                Ok(true) => {}
                Ok(false) => return Err(format!("PARAMETER {key} is set twice")),
                Err(reason) => {
                    return Err(format!(
                        "PARAMETER {key} {value}: {}",
                        reason.unwrap_or_else(|| "unknown key".into())
                    ))
                }
            }
        }
        Ok(())
    }
}

/// A finite number.
fn float(text: &str) -> Result<f32, Option<String>> {
    let v: f32 = text
        .parse()
        .map_err(|_| Some("expected a number such as 0.7".to_string()))?;
    if !v.is_finite() {
        return Err(Some("expected a finite number".into()));
    }
    Ok(v)
}

/// A finite number `>= 0`.
fn non_negative(text: &str) -> Result<f32, Option<String>> {
    let v = float(text)?;
    if v < 0.0 {
        return Err(Some("expected a number >= 0".into()));
    }
    Ok(v)
}

/// A number from 0 to 1.
fn unit(text: &str) -> Result<f32, Option<String>> {
    let v = float(text)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(Some("expected a number from 0 to 1".into()));
    }
    Ok(v)
}

fn int<T: FromStr>(text: &str, expected: &str) -> Result<T, Option<String>> {
    text.parse()
        .map_err(|_| Some(format!("expected {expected}")))
}

/// A parsed Modelfile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Modelfile {
    /// The base model as written after FROM (in a manifest: the base's store name or path).
    pub from: String,
    #[serde(skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
    /// A Jinja chat template replacing the base model's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The default system message; `Some("")` removes the base model's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// ADAPTER lines (LoRA); parsed, but `Store::create` refuses them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
    /// Turns put in front of every chat, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// LICENSE texts, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub license: Vec<String>,
}

impl FromStr for Modelfile {
    type Err = ModelfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Modelfile::parse(s)
    }
}

impl fmt::Display for Modelfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl Modelfile {
    /// Parses Modelfile text; see the module docs for the grammar.
    pub fn parse(text: &str) -> Result<Modelfile, ModelfileError> {
        Parser::new(text).modelfile()
    }

    /// The Modelfile as text that [`Modelfile::parse`] reads back to `self`.
    pub fn render(&self) -> String {
        let mut out = format!("FROM {}\n", quote(&self.from));
        for a in &self.adapters {
            out.push_str(&format!("ADAPTER {}\n", quote(a)));
        }
        for (key, value) in self.parameters.entries() {
            out.push_str(&format!("PARAMETER {key} {}\n", quote(&value)));
        }
        if let Some(t) = &self.template {
            out.push_str(&format!("TEMPLATE {}\n", quote(t)));
        }
        if let Some(s) = &self.system {
            out.push_str(&format!("SYSTEM {}\n", quote(s)));
        }
        for m in &self.messages {
            out.push_str(&format!(
                "MESSAGE {} {}\n",
                m.role.as_str(),
                quote(&m.content)
            ));
        }
        for l in &self.license {
            out.push_str(&format!("LICENSE {}\n", quote(l)));
        }
        out
    }

    /// Checks what the parser guarantees, for a Modelfile built in code.
    pub fn validate(&self) -> Result<(), ModelfileError> {
        if self.from.is_empty() {
            return Err(ModelfileError::MissingFrom);
        }
        if self.template.as_deref() == Some("") {
            return Err(ModelfileError::Invalid("TEMPLATE is empty".into()));
        }
        if self.adapters.iter().any(String::is_empty) {
            return Err(ModelfileError::Invalid("an ADAPTER path is empty".into()));
        }
        self.parameters.validate().map_err(ModelfileError::Invalid)
    }

    /// Fills what `self` leaves unset from `parent`, the layer of the base model: parameters
    /// key by key, TEMPLATE and SYSTEM if not given, MESSAGE and LICENSE lines as a whole.
    pub fn inherit(&mut self, parent: &Modelfile) {
        self.parameters.inherit(&parent.parameters);
        if self.template.is_none() {
            self.template.clone_from(&parent.template);
        }
        if self.system.is_none() {
            self.system.clone_from(&parent.system);
        }
        if self.messages.is_empty() {
            self.messages.clone_from(&parent.messages);
        }
        if self.license.is_empty() {
            self.license.clone_from(&parent.license);
        }
        if self.adapters.is_empty() {
            self.adapters.clone_from(&parent.adapters);
        }
    }
}

/// True when `text` looks like an Ollama (Go `text/template`) template rather than Jinja:
/// an action starting with a field (`{{ .Prompt }}`) or a Go keyword (`{{ if .System }}`,
/// `{{ range .Messages }}`, `{{ end }}`). Pagoda's chat templates are Jinja only.
pub fn looks_like_go_template(text: &str) -> bool {
    const KEYWORDS: [&str; 8] = [
        "if", "range", "end", "else", "with", "template", "define", "block",
    ];
    let mut rest = text;
    while let Some(i) = rest.find("{{") {
        rest = &rest[i + 2..];
        let action = rest.trim_start_matches('-').trim_start();
        if action.starts_with('.') || action.starts_with('$') {
            return true;
        }
        let word: String = action
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = action.get(word.len()..).unwrap_or("").trim_start();
        let go_operand =
            after.starts_with(['.', '$']) || after.starts_with("}}") || after.starts_with("-}}");
        let go_condition = word == "if"
            && ["not ", "and ", "or ", "eq ", "ne "]
                .iter()
                .any(|p| after.starts_with(p));
        if KEYWORDS.contains(&word.as_str()) && (go_operand || go_condition) {
            return true;
        }
    }
    false
}

/// A value as text that reads back to exactly `s`: bare when that is safe, else `"""raw"""`
/// when `s` holds no `"""` and does not end with `"`, else `"escaped"`.
fn quote(s: &str) -> String {
    let bare = !s.is_empty()
        && !s.contains(['\n', '\r'])
        && !s.starts_with([' ', '\t', '"', '\''])
        && !s.ends_with([' ', '\t']);
    if bare {
        s.to_string()
    } else if !s.contains("\"\"\"") && !s.ends_with('"') {
        format!("\"\"\"{s}\"\"\"")
    } else {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\r'
}

/// A cursor over the text that counts lines.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

/// Where each once-only thing was first given.
#[derive(Default)]
struct Seen {
    from: Option<usize>,
    template: Option<usize>,
    system: Option<usize>,
    parameters: Vec<(&'static str, usize)>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text: text.strip_prefix('\u{feff}').unwrap_or(text),
            pos: 0,
            line: 1,
        }
    }

    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Moves over `n` bytes that start at a char boundary (counting their newlines).
    fn advance(&mut self, n: usize) {
        let end = (self.pos + n).min(self.text.len());
        while self.pos < end {
            if self.bump().is_none() {
                break;
            }
        }
    }

    fn skip_blanks(&mut self) {
        while self.peek().is_some_and(is_blank) {
            self.bump();
        }
    }

    fn at_line_end(&self) -> bool {
        matches!(self.peek(), None | Some('\n'))
    }

    /// The run of characters up to a blank or the end of the line.
    fn word(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(|c| !is_blank(c) && c != '\n') {
            self.bump();
        }
        self.text.get(start..self.pos).unwrap_or("")
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.bump() {
            if c == '\n' {
                break;
            }
        }
    }

    fn modelfile(mut self) -> Result<Modelfile, ModelfileError> {
        let mut m = Modelfile::default();
        let mut seen = Seen::default();
        loop {
            while self.peek().is_some_and(|c| is_blank(c) || c == '\n') {
                self.bump();
            }
            match self.peek() {
                None => break,
                Some('#') => {
                    self.skip_line();
                    continue;
                }
                Some(_) => {}
            }
            self.instruction(&mut m, &mut seen)?;
        }
        if seen.from.is_none() {
            return Err(ModelfileError::MissingFrom);
        }
        Ok(m)
    }

    fn instruction(&mut self, m: &mut Modelfile, seen: &mut Seen) -> Result<(), ModelfileError> {
        let line = self.line;
        let word = self.word();
        let name: &'static str = match word.to_ascii_uppercase().as_str() {
            "FROM" => "FROM",
            "PARAMETER" => "PARAMETER",
            "TEMPLATE" => "TEMPLATE",
            "SYSTEM" => "SYSTEM",
            "ADAPTER" => "ADAPTER",
            "MESSAGE" => "MESSAGE",
            "LICENSE" => "LICENSE",
            _ => {
                return Err(ModelfileError::UnknownInstruction {
                    line,
                    word: word.chars().take(40).collect(),
                })
            }
        };
        let missing = |what: &'static str| ModelfileError::MissingArgument {
            line,
            instruction: name,
            what,
        };
        let once = |slot: &mut Option<usize>, what: &str| match *slot {
            Some(first) => Err(ModelfileError::Duplicate {
                line,
                what: what.to_string(),
                first,
            }),
            None => {
                *slot = Some(line);
                Ok(())
            }
        };
        self.skip_blanks();
        match name {
            "FROM" => {
                let v = self
                    .value()?
                    .ok_or_else(|| missing("a model name, a path or a GGUF file"))?;
                once(&mut seen.from, "FROM")?;
                if v.is_empty() {
                    return Err(ModelfileError::Empty {
                        line,
                        instruction: name,
                    });
                }
                m.from = v;
            }
            "PARAMETER" => {
                let key = self.word().to_ascii_lowercase();
                if key.is_empty() {
                    return Err(missing(
                        "a key and a value, e.g. `PARAMETER temperature 0.7`",
                    ));
                }
                self.skip_blanks();
                let value = self.value()?.ok_or_else(|| {
                    missing("a key and a value, e.g. `PARAMETER temperature 0.7`")
                })?;
                let Some(&known) = PARAMETER_KEYS.iter().find(|k| **k == key) else {
                    return Err(ModelfileError::UnknownParameter {
                        line,
                        key: key.chars().take(40).collect(),
                    });
                };
                match m.parameters.set(known, &value) {
                    Ok(true) => seen.parameters.push((known, line)),
                    Ok(false) => {
                        let first = seen
                            .parameters
                            .iter()
                            .find(|(k, _)| *k == known)
                            .map_or(line, |(_, l)| *l);
                        return Err(ModelfileError::Duplicate {
                            line,
                            what: format!("PARAMETER {known}"),
                            first,
                        });
                    }
                    Err(reason) => {
                        return Err(ModelfileError::InvalidParameter {
                            line,
                            key: known.to_string(),
                            value: value.chars().take(60).collect(),
                            reason: reason.unwrap_or_default(),
                        })
                    }
                }
            }
            "TEMPLATE" => {
                let v = self
                    .value()?
                    .ok_or_else(|| missing("a Jinja chat template"))?;
                once(&mut seen.template, "TEMPLATE")?;
                if v.is_empty() {
                    return Err(ModelfileError::Empty {
                        line,
                        instruction: name,
                    });
                }
                m.template = Some(v);
            }
            "SYSTEM" => {
                let v = self.value()?.ok_or_else(|| missing("the system message"))?;
                once(&mut seen.system, "SYSTEM")?;
                m.system = Some(v);
            }
            "ADAPTER" => {
                let v = self
                    .value()?
                    .ok_or_else(|| missing("the path of a LoRA adapter"))?;
                if v.is_empty() {
                    return Err(ModelfileError::Empty {
                        line,
                        instruction: name,
                    });
                }
                m.adapters.push(v);
            }
            "MESSAGE" => {
                let role_text = self.word();
                if role_text.is_empty() {
                    return Err(missing("a role (system, user or assistant) and the text"));
                }
                let role = Role::parse(role_text).ok_or_else(|| ModelfileError::InvalidRole {
                    line,
                    role: role_text.chars().take(40).collect(),
                })?;
                self.skip_blanks();
                let content = self
                    .value()?
                    .ok_or_else(|| missing("a role (system, user or assistant) and the text"))?;
                m.messages.push(Message { role, content });
            }
            _ => {
                let v = self.value()?.ok_or_else(|| missing("the license text"))?;
                m.license.push(v);
            }
        }
        Ok(())
    }

    /// The value at the cursor (blanks before it already skipped); `None` when the line ends
    /// first. Leaves the cursor at the end of the value's last line.
    fn value(&mut self) -> Result<Option<String>, ModelfileError> {
        let line = self.line;
        let rest = self.rest();
        if self.at_line_end() {
            return Ok(None);
        }
        let value = if let Some(body) = rest.strip_prefix("\"\"\"") {
            let Some(end) = body.find("\"\"\"") else {
                return Err(ModelfileError::Unterminated {
                    line,
                    quote: "\"\"\"",
                });
            };
            let v = body.get(..end).unwrap_or("").to_string();
            self.advance(3 + end + 3);
            v
        } else if rest.starts_with(['"', '\'']) {
            let (q, name) = if rest.starts_with('"') {
                ('"', "\"")
            } else {
                ('\'', "'")
            };
            self.bump();
            let mut v = String::new();
            loop {
                match self.bump() {
                    None => return Err(ModelfileError::Unterminated { line, quote: name }),
                    Some('\\') => match self.peek() {
                        Some(c) if c == q || c == '\\' => {
                            self.bump();
                            v.push(c);
                        }
                        _ => v.push('\\'),
                    },
                    Some(c) if c == q => break,
                    Some(c) => v.push(c),
                }
            }
            v
        } else {
            let start = self.pos;
            while !self.at_line_end() {
                self.bump();
            }
            let raw = self.text.get(start..self.pos).unwrap_or("");
            return Ok(Some(raw.trim_end_matches(is_blank).to_string()));
        };
        self.skip_blanks();
        if !self.at_line_end() {
            let line = self.line;
            let text: String = self
                .rest()
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(40)
                .collect();
            return Err(ModelfileError::TrailingText { line, text });
        }
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err(text: &str) -> ModelfileError {
        match Modelfile::parse(text) {
            Ok(m) => panic!("expected an error for {text:?}, got {m:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_an_ollama_style_modelfile() {
        let text = r#"# A pirate.
from smollm2:135m
PARAMETER temperature 0.2
parameter TOP_K 20
PARAMETER stop "<|im_end|>"
PARAMETER stop '</s>'
PARAMETER num_ctx 2048
PARAMETER seed -1
Template """{% for m in messages %}{{ m['content'] + '\n' }}{% endfor %}"""
SYSTEM You are a pirate. # not a comment
MESSAGE user "Who are you?"
MESSAGE assistant """I be a pirate,
matey."""
ADAPTER ./lora.gguf
LICENSE """MIT
License"""
"#;
        let m = Modelfile::parse(text).unwrap();
        assert_eq!(m.from, "smollm2:135m");
        assert_eq!(m.parameters.temperature, Some(0.2));
        assert_eq!(m.parameters.top_k, Some(20));
        assert_eq!(m.parameters.stop, vec!["<|im_end|>", "</s>"]);
        assert_eq!(m.parameters.num_ctx, Some(2048));
        assert_eq!(m.parameters.seed, Some(-1));
        assert_eq!(
            m.template.as_deref(),
            Some("{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}")
        );
        assert_eq!(
            m.system.as_deref(),
            Some("You are a pirate. # not a comment")
        );
        assert_eq!(
            m.messages,
            vec![
                Message {
                    role: Role::User,
                    content: "Who are you?".into()
                },
                Message {
                    role: Role::Assistant,
                    content: "I be a pirate,\nmatey.".into()
                },
            ]
        );
        assert_eq!(m.adapters, vec!["./lora.gguf"]);
        assert_eq!(m.license, vec!["MIT\nLicense"]);
        assert_eq!(Modelfile::parse(&m.render()), Ok(m));
    }

    #[test]
    fn quoted_strings_escape_quotes_and_backslashes_only() {
        let m = Modelfile::parse("FROM x\nSYSTEM \"say \\\"hi\\\" \\\\ \\n\"\n").unwrap();
        assert_eq!(m.system.as_deref(), Some("say \"hi\" \\ \\n"));
        let m = Modelfile::parse("FROM x\nSYSTEM 'it\\'s'\n").unwrap();
        assert_eq!(m.system.as_deref(), Some("it's"));
        // CRLF line endings and a byte-order mark.
        let m = Modelfile::parse("\u{feff}FROM x\r\nSYSTEM hi there \r\n").unwrap();
        assert_eq!(m.system.as_deref(), Some("hi there"));
        // An empty SYSTEM clears the base model's.
        let m = Modelfile::parse("FROM x\nSYSTEM \"\"").unwrap();
        assert_eq!(m.system.as_deref(), Some(""));
    }

    #[test]
    fn unknown_instruction_names_the_line() {
        let e = err("FROM x\n\nFORM y\n");
        assert_eq!(
            e,
            ModelfileError::UnknownInstruction {
                line: 3,
                word: "FORM".into()
            }
        );
        assert!(
            e.to_string()
                .starts_with("line 3: unknown instruction `FORM`"),
            "{e}"
        );
    }

    #[test]
    fn missing_from_is_an_error() {
        assert_eq!(err("# nothing\nSYSTEM hi\n"), ModelfileError::MissingFrom);
        assert_eq!(err(""), ModelfileError::MissingFrom);
        assert!(err("").to_string().contains("FROM"));
    }

    #[test]
    fn missing_arguments_name_the_instruction() {
        for (text, instruction) in [
            ("FROM\n", "FROM"),
            ("FROM x\nSYSTEM   \n", "SYSTEM"),
            ("FROM x\nPARAMETER\n", "PARAMETER"),
            ("FROM x\nPARAMETER temperature\n", "PARAMETER"),
            ("FROM x\nMESSAGE user\n", "MESSAGE"),
            ("FROM x\nMESSAGE\n", "MESSAGE"),
            ("FROM x\nTEMPLATE", "TEMPLATE"),
            ("FROM x\nADAPTER\n", "ADAPTER"),
            ("FROM x\nLICENSE\n", "LICENSE"),
        ] {
            match err(text) {
                ModelfileError::MissingArgument {
                    instruction: i,
                    line,
                    ..
                } => {
                    assert_eq!(i, instruction, "{text:?}");
                    assert_eq!(line, if instruction == "FROM" { 1 } else { 2 });
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn unterminated_strings_name_the_opening_line() {
        let e = err("FROM x\nTEMPLATE \"\"\"{{ messages }}\n\nSYSTEM hi\n");
        assert_eq!(
            e,
            ModelfileError::Unterminated {
                line: 2,
                quote: "\"\"\""
            }
        );
        assert_eq!(
            err("FROM x\n\nSYSTEM \"hi\n"),
            ModelfileError::Unterminated {
                line: 3,
                quote: "\""
            }
        );
        assert_eq!(
            err("FROM 'x"),
            ModelfileError::Unterminated {
                line: 1,
                quote: "'"
            }
        );
    }

    #[test]
    fn text_after_a_closing_quote_is_an_error() {
        let e = err("FROM x\nSYSTEM \"\"\"a\nb\"\"\" trailing\n");
        assert_eq!(
            e,
            ModelfileError::TrailingText {
                line: 3,
                text: "trailing".into()
            }
        );
    }

    #[test]
    fn unknown_parameter_lists_the_known_ones() {
        let e = err("FROM x\nPARAMETER temprature 0\n");
        assert_eq!(
            e,
            ModelfileError::UnknownParameter {
                line: 2,
                key: "temprature".into()
            }
        );
        let s = e.to_string();
        for k in PARAMETER_KEYS {
            assert!(s.contains(k), "{s}");
        }
    }

    #[test]
    fn parameter_values_are_typed_and_checked() {
        for (line, key) in [
            ("temperature hot", "temperature"),
            ("temperature -1", "temperature"),
            ("temperature nan", "temperature"),
            ("temperature inf", "temperature"),
            ("top_k 1.5", "top_k"),
            ("top_k -1", "top_k"),
            ("top_p 1.5", "top_p"),
            ("min_p -0.1", "min_p"),
            ("seed x", "seed"),
            ("stop \"\"", "stop"),
            ("num_predict 0", "num_predict"),
            ("num_predict -3", "num_predict"),
            ("repeat_penalty 0", "repeat_penalty"),
            ("repeat_last_n -2", "repeat_last_n"),
            ("presence_penalty lots", "presence_penalty"),
            ("frequency_penalty 1e99", "frequency_penalty"),
            ("num_ctx 0", "num_ctx"),
            ("num_ctx 99999999999", "num_ctx"),
        ] {
            let text = format!("FROM x\nPARAMETER {line}\n");
            match err(&text) {
                ModelfileError::InvalidParameter {
                    line: 2,
                    key: k,
                    reason,
                    ..
                } => {
                    assert_eq!(k, key, "{text}");
                    assert!(!reason.is_empty());
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = err("FROM x\nPARAMETER top_p 2\n").to_string();
        assert_eq!(
            e,
            "line 2: PARAMETER top_p 2: expected a number from 0 to 1"
        );
    }

    #[test]
    fn duplicates_name_both_lines() {
        assert_eq!(
            err("FROM x\nFROM y\n"),
            ModelfileError::Duplicate {
                line: 2,
                what: "FROM".into(),
                first: 1
            }
        );
        assert_eq!(
            err("FROM x\nSYSTEM a\n# c\nSYSTEM b\n"),
            ModelfileError::Duplicate {
                line: 4,
                what: "SYSTEM".into(),
                first: 2
            }
        );
        assert_eq!(
            err("FROM x\nTEMPLATE a\nTEMPLATE b\n"),
            ModelfileError::Duplicate {
                line: 3,
                what: "TEMPLATE".into(),
                first: 2
            }
        );
        assert_eq!(
            err("FROM x\nPARAMETER top_k 1\nPARAMETER top_k 2\n"),
            ModelfileError::Duplicate {
                line: 3,
                what: "PARAMETER top_k".into(),
                first: 2
            }
        );
        // stop repeats.
        let m = Modelfile::parse("FROM x\nPARAMETER stop a\nPARAMETER stop b\n").unwrap();
        assert_eq!(m.parameters.stop, vec!["a", "b"]);
    }

    #[test]
    fn empty_values_are_errors_where_they_mean_nothing() {
        assert_eq!(
            err("FROM \"\"\n"),
            ModelfileError::Empty {
                line: 1,
                instruction: "FROM"
            }
        );
        assert_eq!(
            err("FROM x\nTEMPLATE \"\"\"\"\"\"\n"),
            ModelfileError::Empty {
                line: 2,
                instruction: "TEMPLATE"
            }
        );
        assert_eq!(
            err("FROM x\nADAPTER ''\n"),
            ModelfileError::Empty {
                line: 2,
                instruction: "ADAPTER"
            }
        );
    }

    #[test]
    fn parameters_set_from_text_check_like_the_parser() {
        let mut p = Parameters::default();
        p.set_text("temperature", "0.5").unwrap();
        p.set_text("stop", "a").unwrap();
        p.set_text("stop", "b").unwrap();
        assert_eq!(p.temperature, Some(0.5));
        assert_eq!(p.stop, vec!["a", "b"]);
        let e = p.set_text("temperature", "1").unwrap_err().to_string();
        assert!(e.contains("`temperature` is given twice"), "{e}");
        assert_eq!(p.temperature, Some(0.5));
        let e = p.set_text("temprature", "1").unwrap_err().to_string();
        assert!(e.contains("unknown parameter `temprature`"), "{e}");
        assert!(e.contains("temperature, top_k"), "{e}");
        let e = p.set_text("top_p", "3").unwrap_err().to_string();
        assert!(e.contains("`top_p` 3") && e.contains("from 0 to 1"), "{e}");
        assert_eq!(Role::parse("User"), Some(Role::User));
        assert_eq!(Role::parse("tool"), None);
    }

    #[test]
    fn unknown_role_is_an_error() {
        let e = err("FROM x\nMESSAGE tool hi\n");
        assert_eq!(
            e,
            ModelfileError::InvalidRole {
                line: 2,
                role: "tool".into()
            }
        );
        assert!(e.to_string().contains("system, user or assistant"));
    }

    #[test]
    fn validate_catches_what_the_parser_would() {
        let mut m = Modelfile {
            from: "x".into(),
            ..Modelfile::default()
        };
        assert!(m.validate().is_ok());
        m.parameters.top_p = Some(3.0);
        assert!(matches!(m.validate(), Err(ModelfileError::Invalid(_))));
        m.parameters.top_p = None;
        m.parameters.stop = vec![String::new()];
        assert!(m.validate().is_err());
        assert_eq!(
            Modelfile::default().validate(),
            Err(ModelfileError::MissingFrom)
        );
    }

    #[test]
    fn inherit_fills_only_what_is_unset() {
        let parent = Modelfile::parse(
            "FROM base\nPARAMETER temperature 0.5\nPARAMETER top_k 7\nPARAMETER stop a\nSYSTEM old\nMESSAGE user hi\n",
        )
        .unwrap();
        let mut child =
            Modelfile::parse("FROM parent\nPARAMETER temperature 0\nSYSTEM \"\"\n").unwrap();
        child.inherit(&parent);
        assert_eq!(child.parameters.temperature, Some(0.0));
        assert_eq!(child.parameters.top_k, Some(7));
        assert_eq!(child.parameters.stop, vec!["a"]);
        assert_eq!(child.system.as_deref(), Some(""));
        assert_eq!(child.messages.len(), 1);
        assert_eq!(child.from, "parent");
    }

    #[test]
    fn go_templates_are_recognised() {
        for go in [
            "{{ .Prompt }}",
            "{{- .System }}",
            "{{ if .System }}<|system|>{{ end }}",
            "{{ range .Messages }}{{ .Content }}{{ end }}",
            "{{- range $i, $m := .Messages }}",
            "{{ if not .Tools }}x{{ end }}",
        ] {
            assert!(looks_like_go_template(go), "{go}");
        }
        for jinja in [
            "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            "{{ bos_token }}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
            "{{- messages[0].content }}",
            "plain text {{",
        ] {
            assert!(!looks_like_go_template(jinja), "{jinja}");
        }
    }

    #[test]
    fn serde_reads_missing_fields_as_empty() {
        let m: Modelfile = serde_json::from_str(r#"{"from":"x"}"#).unwrap();
        assert_eq!(m.from, "x");
        assert!(m.parameters.is_empty());
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"from":"x"}"#);
    }

    // ------------------------------------------------------------------ properties

    fn text() -> impl Strategy<Value = String> {
        // Quotes, backslashes, newlines, blanks and `#` are what quoting has to get right.
        proptest::string::string_regex("[a-z \t\n\"'\\\\#{}%.|<>é]{0,24}").expect("regex")
    }

    fn nonempty() -> impl Strategy<Value = String> {
        text().prop_filter("non-empty", |s| !s.is_empty())
    }

    fn parameters() -> impl Strategy<Value = Parameters> {
        (
            (
                proptest::option::of(0.0f32..4.0),
                proptest::option::of(0u32..1000),
                proptest::option::of(0.0f32..=1.0),
                proptest::option::of(0.0f32..=1.0),
                proptest::option::of(any::<i64>()),
                proptest::collection::vec(nonempty(), 0..3),
            ),
            (
                proptest::option::of(prop_oneof![Just(-1i64), Just(-2), 1i64..100_000]),
                proptest::option::of(0.01f32..3.0),
                proptest::option::of(-1i64..4096),
                proptest::option::of(-2.0f32..2.0),
                proptest::option::of(-2.0f32..2.0),
                proptest::option::of(1u32..1_000_000),
            ),
        )
            .prop_map(|((t, k, p, mp, seed, stop), (np, rp, rl, pp, fp, ctx))| {
                Parameters {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: mp,
                    seed,
                    stop,
                    num_predict: np,
                    repeat_penalty: rp,
                    repeat_last_n: rl,
                    presence_penalty: pp,
                    frequency_penalty: fp,
                    num_ctx: ctx,
                }
            })
    }

    fn modelfiles() -> impl Strategy<Value = Modelfile> {
        let role = prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)];
        (
            nonempty(),
            parameters(),
            proptest::option::of(nonempty()),
            proptest::option::of(text()),
            proptest::collection::vec(nonempty(), 0..2),
            proptest::collection::vec((role, text()), 0..3),
            proptest::collection::vec(text(), 0..2),
        )
            .prop_map(
                |(from, parameters, template, system, adapters, messages, license)| Modelfile {
                    from,
                    parameters,
                    template,
                    system,
                    adapters,
                    messages: messages
                        .into_iter()
                        .map(|(role, content)| Message { role, content })
                        .collect(),
                    license,
                },
            )
    }

    proptest! {
        #[test]
        fn render_then_parse_round_trips(m in modelfiles()) {
            prop_assert!(m.validate().is_ok());
            let text = m.render();
            prop_assert_eq!(Modelfile::parse(&text), Ok(m), "{}", text);
        }

        #[test]
        fn arbitrary_input_never_panics(s in "\\PC{0,200}") {
            let _ = Modelfile::parse(&s);
        }

        #[test]
        fn modelfile_like_input_never_panics(
            lines in proptest::collection::vec(
                proptest::string::string_regex(
                    "(FROM|from|PARAMETER|TEMPLATE|SYSTEM|MESSAGE|ADAPTER|LICENSE|#)?[ \t]{0,2}(temperature|stop|num_ctx|user|tool)?[ \t]?(\"\"\"|\"|'|\\\\)?[a-z0-9.\\- \"'\\\\]{0,12}(\"\"\"|\"|')?"
                ).expect("regex"),
                0..8,
            )
        ) {
            let text = lines.join("\n");
            if let Err(e) = Modelfile::parse(&text) {
                // Every error is printable; all but a missing FROM name a line inside the text.
                let msg = e.to_string();
                if e != ModelfileError::MissingFrom {
                    prop_assert!(msg.starts_with("line "), "{}", msg);
                }
            }
        }
    }
}
