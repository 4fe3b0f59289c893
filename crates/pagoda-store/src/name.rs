//! Model names: `name[:tag]`, Ollama style.
//!
//! Owns [`ModelName`] and its parser. Invariants: a parsed name is lowercase; every `/`-separated
//! segment of the name and the tag start with a letter, digit (or `_` for the tag) and contain only
//! `[a-z0-9._-]`, so no segment can be `.` or `..` and a name maps to a safe relative path under
//! `manifests/`. A missing tag means `latest`.

use std::fmt;
use std::path::PathBuf;

use crate::error::{Result, StoreError};

/// The tag a bare name stands for.
pub const DEFAULT_TAG: &str = "latest";
const MAX_NAME_LEN: usize = 200;
const MAX_TAG_LEN: usize = 128;

/// A validated `name:tag` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    name: String,
    tag: String,
}

impl ModelName {
    /// Parses `name` or `name:tag` (case-insensitive; stored lowercase).
    pub fn parse(text: &str) -> Result<ModelName> {
        let invalid = |reason: &str| StoreError::InvalidName {
            name: text.to_string(),
            reason: reason.to_string(),
        };
        let lower = text.trim().to_ascii_lowercase();
        if lower.is_empty() {
            return Err(invalid("the name is empty"));
        }
        // The tag is after the last ':' unless that ':' belongs to a path segment (it cannot:
        // ':' is not allowed in segments), so a plain rsplit is right.
        let (name, tag) = match lower.rsplit_once(':') {
            Some((n, t)) => (n, t),
            None => (lower.as_str(), DEFAULT_TAG),
        };
        if name.is_empty() {
            return Err(invalid("the part before ':' is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(&format!("longer than {MAX_NAME_LEN} characters")));
        }
        for segment in name.split('/') {
            check_segment(segment, false).map_err(|r| invalid(&r))?;
        }
        if tag.is_empty() {
            return Err(invalid("the tag after ':' is empty"));
        }
        if tag.len() > MAX_TAG_LEN {
            return Err(invalid(&format!(
                "tag longer than {MAX_TAG_LEN} characters"
            )));
        }
        check_segment(tag, true).map_err(|r| invalid(&format!("tag: {r}")))?;
        Ok(ModelName {
            name: name.to_string(),
            tag: tag.to_string(),
        })
    }

    /// Builds a name from free text (a file stem, a repo name), replacing what is not allowed.
    pub fn sanitized(name: &str, tag: &str) -> Result<ModelName> {
        fn clean(s: &str, allow_slash: bool) -> String {
            let mut out: String = s
                .to_ascii_lowercase()
                .chars()
                .map(|c| match c {
                    'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                    '/' if allow_slash => '/',
                    _ => '-',
                })
                .collect();
            // Each segment must start with an alphanumeric character.
            out = out
                .split('/')
                .map(|seg| seg.trim_start_matches(['.', '_', '-']))
                .filter(|seg| !seg.is_empty())
                .collect::<Vec<_>>()
                .join("/");
            out
        }
        let n = clean(name, true);
        let t = clean(tag, false);
        let n: String = n.chars().take(MAX_NAME_LEN).collect();
        let t: String = t.chars().take(MAX_TAG_LEN).collect();
        let t = if t.is_empty() {
            DEFAULT_TAG.to_string()
        } else {
            t
        };
        ModelName::parse(&format!("{n}:{t}"))
    }

    /// The name without the tag (`smollm2`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tag (`135m`, `latest`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The same name with another tag.
    pub fn with_tag(&self, tag: &str) -> Result<ModelName> {
        ModelName::parse(&format!("{}:{tag}", self.name))
    }

    /// Relative path of this name's manifest under `manifests/`.
    pub fn manifest_rel_path(&self) -> PathBuf {
        let mut p: PathBuf = self.name.split('/').collect();
        p.push(format!("{}.json", self.tag));
        p
    }

    /// Relative path of this name's materialized folder under `models/`.
    pub fn model_dir_rel_path(&self) -> PathBuf {
        let mut p: PathBuf = self.name.split('/').collect();
        p.push(&self.tag);
        p
    }
}

fn check_segment(segment: &str, is_tag: bool) -> std::result::Result<(), String> {
    let mut chars = segment.chars();
    let Some(first) = chars.next() else {
        return Err("empty path segment (check for '//' or a leading/trailing '/')".into());
    };
    let first_ok = first.is_ascii_lowercase() || first.is_ascii_digit() || (is_tag && first == '_');
    if !first_ok {
        return Err(format!("'{segment}' must start with a letter or digit"));
    }
    if let Some(bad) = segment
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("character {bad:?} is not allowed"));
    }
    Ok(())
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

impl std::str::FromStr for ModelName {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        ModelName::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_name_means_latest() {
        let n = ModelName::parse("smollm2").unwrap();
        assert_eq!(n.to_string(), "smollm2:latest");
    }

    #[test]
    fn name_with_tag_and_namespace() {
        let n = ModelName::parse("hf.co/Owner/Repo:Q4_K_M").unwrap();
        assert_eq!(n.name(), "hf.co/owner/repo");
        assert_eq!(n.tag(), "q4_k_m");
        assert_eq!(
            n.manifest_rel_path(),
            PathBuf::from("hf.co/owner/repo/q4_k_m.json")
        );
    }

    #[test]
    fn invalid_names_are_rejected_with_a_reason() {
        for bad in [
            "", ":", "a:", ":b", "../x", "a/../b", "a//b", "/abs", "a b", "a:b:c", ".hidden",
            "x:..", "x:-t", "name!", "a/", "x:a/b",
        ] {
            let err = ModelName::parse(bad).expect_err(bad).to_string();
            assert!(err.contains("invalid model name"), "{bad}: {err}");
        }
    }

    #[test]
    fn sanitized_names_are_valid() {
        let n = ModelName::sanitized("SmolLM2-135M-Instruct.Q4_1", "latest").unwrap();
        assert_eq!(n.to_string(), "smollm2-135m-instruct.q4_1:latest");
        let n = ModelName::sanitized("_weird name!", "").unwrap();
        assert_eq!(n.to_string(), "weird-name-:latest");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,80}") {
            let _ = ModelName::parse(&s);
        }

        #[test]
        fn valid_names_round_trip(
            segs in proptest::collection::vec("[a-z0-9][a-z0-9._-]{0,15}", 1..4),
            tag in "[a-z0-9_][a-z0-9._-]{0,15}",
        ) {
            let text = format!("{}:{}", segs.join("/"), tag);
            let n = ModelName::parse(&text).unwrap();
            prop_assert_eq!(n.to_string(), text.clone());
            prop_assert_eq!(ModelName::parse(&n.to_string()).unwrap(), n.clone());
            // The manifest path never escapes manifests/.
            for c in n.manifest_rel_path().components() {
                prop_assert!(matches!(c, std::path::Component::Normal(_)));
            }
        }

        #[test]
        fn parsed_names_are_safe_paths(s in "[a-zA-Z0-9./:_-]{1,40}") {
            if let Ok(n) = ModelName::parse(&s) {
                for c in n.manifest_rel_path().components() {
                    prop_assert!(matches!(c, std::path::Component::Normal(_)));
                }
                prop_assert!(!n.name().split('/').any(|seg| seg == "." || seg == ".."));
            }
        }

        #[test]
        fn sanitized_is_always_valid_or_errors_cleanly(s in "\\PC{0,40}", t in "\\PC{0,20}") {
            if let Ok(n) = ModelName::sanitized(&s, &t) {
                prop_assert!(ModelName::parse(&n.to_string()).is_ok());
            }
        }
    }
}
