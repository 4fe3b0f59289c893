//! ARCHITECTURE.md against the tree (rust-analyzer's "tidy" idea): the paths it names exist,
//! and the crates depend on each other only as its Architecture Invariants say.
//!
//! Paths: every backticked span in ARCHITECTURE.md that looks like a file or folder
//! (`dtype.rs`, `quant/`, `simd/avx512_fmt.rs`, `crates/pagoda-kernels`, `tests/it/*.rs`,
//! `tiny-llama-{gptq,awq}`) must name something in the tree. Under a
//! `### \`crates/pagoda-x\`` header a name is looked up in that crate first (`src/` and the
//! crate folder, then any file of the crate whose path ends with it: `int8.rs` under
//! `quant/`), then from the repository root (`crates/` too); a bare name that is not a `.rs`
//! file (a script, a golden file) may be anywhere in the tree. Spans that are URLs, templates
//! (`<target>`, `…`) or paths a program makes at run time ([`RUNTIME_PATHS`]) are not files of
//! the tree.
//!
//! Crates: every crate folder under `crates/` has its `### \`crates/pagoda-x\`` section, and
//! every section names a crate that exists ([`listed_crates`], [`crate_list_breaks`]).
//!
//! Dependencies: [`ALLOWED_DEPS`] is the Bird's-eye view's Architecture Invariant as data;
//! a manifest that names another Pagoda crate outside its row fails, and so does a crate
//! with no row.

use std::fs;
use std::path::{Path, PathBuf};

/// Which Pagoda crates each Pagoda crate may depend on (normal, build or dev dependencies).
/// From ARCHITECTURE.md: kernels ◄ model ◄ engine ◄ runtime ◄ server / cli; compress on model
/// and kernels (and svg) only; runtime (the one request path between the front ends and the
/// engine) on engine, model, store, compress, protocol and kernels; store, protocol, http and
/// svg on none; the gateway on protocol and http; bench on protocol and svg only; train on model and compress
/// (kernels in its tests); cuda (NVIDIA GPUs reached at run
/// time) on kernels only as a dev-dependency (its GPU kernels are tested against kernels'
/// CPU reference), used by model (the CUDA backend of the forward pass) and the cli. The
/// server does not depend on compress (quantize-at-load is the runtime's). pagoda-tidy reads
/// text only.
pub const ALLOWED_DEPS: &[(&str, &[&str])] = &[
    ("pagoda-kernels", &[]),
    ("pagoda-cuda", &["pagoda-kernels"]),
    ("pagoda-model", &["pagoda-kernels", "pagoda-cuda"]),
    ("pagoda-engine", &["pagoda-model", "pagoda-kernels"]),
    (
        "pagoda-compress",
        &["pagoda-model", "pagoda-kernels", "pagoda-svg"],
    ),
    ("pagoda-store", &[]),
    ("pagoda-protocol", &[]),
    ("pagoda-http", &[]),
    // Hand-written SVG charts: a leaf both report writers (bench, compress) draw with.
    ("pagoda-svg", &[]),
    ("pagoda-gateway", &["pagoda-protocol", "pagoda-http"]),
    ("pagoda-bench", &["pagoda-protocol", "pagoda-svg"]),
    (
        "pagoda-runtime",
        &[
            "pagoda-engine",
            "pagoda-model",
            "pagoda-kernels",
            "pagoda-store",
            "pagoda-compress",
            "pagoda-protocol",
        ],
    ),
    (
        "pagoda-server",
        &[
            "pagoda-runtime",
            "pagoda-engine",
            "pagoda-model",
            "pagoda-kernels",
            "pagoda-store",
            "pagoda-protocol",
            "pagoda-http",
        ],
    ),
    (
        "pagoda-cli",
        &[
            "pagoda-server",
            "pagoda-runtime",
            "pagoda-engine",
            "pagoda-compress",
            "pagoda-model",
            "pagoda-kernels",
            "pagoda-cuda",
            "pagoda-store",
            "pagoda-protocol",
            "pagoda-http",
            "pagoda-gateway",
            "pagoda-bench",
            "pagoda-train",
            // Dev only: the tests check the plots the CLI writes with pagoda-svg's checker.
            "pagoda-svg",
        ],
    ),
    // Training (distillation): the teacher's forward pass and the student's file from model,
    // the writers and the LoRA merge from compress; kernels only in its tests.
    (
        "pagoda-train",
        &["pagoda-model", "pagoda-compress", "pagoda-kernels"],
    ),
    ("pagoda-tidy", &[]),
];

/// Backticked names in ARCHITECTURE.md that are made at run time, not files of the tree.
pub const RUNTIME_PATHS: &[&str] = &[
    "OUT.partial/",
    "state.json",
    "blobs/",
    "tmp/",
    "target/test-store",
    "adapter_config.json",
    "adapter_model.safetensors",
    "config.json",
    "tokenizer.json",
    "/proc/meminfo",
];

/// The Pagoda crates a manifest names in any `[*dependencies]` table.
pub fn pagoda_deps(manifest: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.trim_matches(|c| c == '[' || c == ']');
            // `[dependencies]`, `[dev-dependencies]`, `[target.'…'.dependencies]`, and the
            // table form `[dependencies.pagoda-x]`.
            let last = header.rsplit('.').next().unwrap_or("");
            if header.contains("dependencies.") && last.starts_with("pagoda-") {
                deps.push(last.to_string());
                in_deps = false;
            } else {
                in_deps = header.ends_with("dependencies");
            }
            continue;
        }
        if !in_deps {
            continue;
        }
        let key: String = line
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if key.starts_with("pagoda-") {
            deps.push(key);
        }
    }
    deps.sort();
    deps.dedup();
    deps
}

/// Every dependency of `crate_name` (its manifest's text) outside [`ALLOWED_DEPS`], as
/// messages.
pub fn dependency_breaks(crate_name: &str, manifest: &str) -> Vec<String> {
    let Some((_, allowed)) = ALLOWED_DEPS.iter().find(|(c, _)| *c == crate_name) else {
        return vec![format!(
            "{crate_name} has no row in pagoda-tidy's ALLOWED_DEPS: place it in ARCHITECTURE.md's \
             Architecture Invariant and add the row"
        )];
    };
    pagoda_deps(manifest)
        .into_iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .map(|d| {
            format!(
                "{crate_name} depends on {d}, against ARCHITECTURE.md's direction (allowed: {})",
                if allowed.is_empty() {
                    "no Pagoda crate".to_string()
                } else {
                    allowed.join(", ")
                }
            )
        })
        .collect()
}

/// The crates ARCHITECTURE.md gives a section: every `### \`crates/<name>\`` header, in order.
pub fn listed_crates(doc: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(h) = line.strip_prefix("### ").filter(|_| !fenced) else {
            continue;
        };
        if let Some(name) = spans(h)
            .first()
            .and_then(|s| s.trim_end_matches('/').strip_prefix("crates/"))
        {
            out.push(name.to_string());
        }
    }
    out
}

/// The differences between the crates ARCHITECTURE.md lists (`listed`, from
/// [`listed_crates`]) and the crate folders under `crates/` (`on_disk`), as messages: a crate
/// with no section, a section for a crate that is not there, a crate listed twice.
pub fn crate_list_breaks(listed: &[String], on_disk: &[String]) -> Vec<String> {
    let mut breaks: Vec<String> = on_disk
        .iter()
        .filter(|c| !listed.contains(c))
        .map(|c| {
            format!(
                "crates/{c} has no section in ARCHITECTURE.md's codemap: add a `### crates/{c}` \
                 header (what it is for, its invariants, where to start reading)"
            )
        })
        .collect();
    breaks.extend(
        listed
            .iter()
            .filter(|c| !on_disk.contains(c))
            .map(|c| format!("ARCHITECTURE.md has a section for crates/{c}, which is not a crate")),
    );
    for (i, c) in listed.iter().enumerate() {
        if listed[..i].contains(c) {
            breaks.push(format!("ARCHITECTURE.md lists crates/{c} twice"));
        }
    }
    breaks
}

/// A backticked span of ARCHITECTURE.md that names a path, with the crate section it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPath {
    pub line: usize,
    pub text: String,
    /// `crates/pagoda-x` (or `fuzz`) when under that section's header.
    pub scope: Option<String>,
}

/// The path-like backticked spans of `doc`.
pub fn named_paths(doc: &str) -> Vec<NamedPath> {
    let mut out = Vec::new();
    let mut scope: Option<String> = None;
    let mut fenced = false;
    for (i, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            scope = spans(h)
                .first()
                .map(|s| s.trim_end_matches('/').to_string());
        } else if line.starts_with("## ") || line.starts_with("# ") {
            scope = None;
        }
        for s in spans(line) {
            if looks_like_path(&s) {
                out.push(NamedPath {
                    line: i + 1,
                    text: s,
                    scope: scope.clone(),
                });
            }
        }
    }
    out
}

fn spans(line: &str) -> Vec<String> {
    line.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

const EXTENSIONS: [&str; 11] = [
    ".rs", ".md", ".py", ".sh", ".json", ".jsonl", ".toml", ".txt", ".html", ".gguf", ".yml",
];

fn looks_like_path(s: &str) -> bool {
    if s.is_empty()
        || s == "/"
        || s.contains("://")
        || s.contains(' ')
        || s.contains('<')
        || s.contains('…')
        || s.contains("::")
        || RUNTIME_PATHS.iter().any(|r| s.starts_with(r))
    {
        return false;
    }
    s.starts_with("crates/") || s.ends_with('/') || EXTENSIONS.iter().any(|e| s.ends_with(e))
}

/// `a{b,c}d` → `abd`, `acd` (one level, several groups).
fn expand_braces(s: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else {
        return vec![s.to_string()];
    };
    if close < open {
        return vec![s.to_string()];
    }
    let (head, alts, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    alts.split(',')
        .flat_map(|a| expand_braces(&format!("{head}{a}{tail}")))
        .collect()
}

/// Whether `name` matches `pattern` with `*` for any run of characters.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((pre, post)) => {
            name.len() >= pre.len() + post.len() && name.starts_with(pre) && name.ends_with(post)
        }
    }
}

/// Whether `rel` (components may hold `*`) names something under `base`.
fn exists_under(base: &Path, rel: &str) -> bool {
    let parts: Vec<&str> = rel.trim_end_matches('/').split('/').collect();
    fn walk(dir: &Path, parts: &[&str]) -> bool {
        let Some((first, rest)) = parts.split_first() else {
            return true;
        };
        if !first.contains('*') {
            let p = dir.join(first);
            return p.exists() && walk(&p, rest);
        }
        let Ok(rd) = fs::read_dir(dir) else {
            return false;
        };
        rd.filter_map(|e| e.ok()).any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| wildcard(first, n) && walk(&e.path(), rest))
        })
    }
    walk(base, &parts)
}

/// Every file and folder under `dir` (relative, `/`-separated), leaving out build output.
fn all_paths(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if matches!(name.as_str(), "target" | ".git" | "node_modules" | "corpus") {
                continue;
            }
            if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// The named paths of `doc` that exist nowhere they could mean, under `repo`.
pub fn missing_paths(repo: &Path, doc: &str) -> Vec<NamedPath> {
    let mut cache: Vec<(PathBuf, Vec<String>)> = Vec::new();
    let mut listing = |dir: &Path| -> Vec<String> {
        if let Some((_, l)) = cache.iter().find(|(d, _)| d == dir) {
            return l.clone();
        }
        let l = all_paths(dir);
        cache.push((dir.to_path_buf(), l.clone()));
        l
    };
    let mut missing = Vec::new();
    for np in named_paths(doc) {
        let scope = np.scope.as_ref().map(|s| repo.join(s));
        let found = expand_braces(&np.text).iter().all(|p| {
            let rel = p.trim_end_matches('/');
            let mut bases: Vec<PathBuf> = Vec::new();
            if let Some(s) = &scope {
                bases.push(s.join("src"));
                bases.push(s.clone());
            }
            bases.push(repo.to_path_buf());
            bases.push(repo.join("crates"));
            if bases.iter().any(|b| exists_under(b, rel)) {
                return true;
            }
            // A source file within its section's crate (`int8.rs` under `quant/`); any other
            // name (a script, a golden file) anywhere in the tree.
            let within = match &scope {
                Some(s) if rel.ends_with(".rs") => s.clone(),
                _ => repo.to_path_buf(),
            };
            listing(&within).iter().any(|q| {
                let q = q.as_str();
                q.ends_with(&format!("/{rel}")) && !rel.contains('*')
                    || q.rsplit('/').next().is_some_and(|n| wildcard(rel, n))
            })
        });
        if !found {
            missing.push(np);
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_read_every_kind_of_dependency_table() {
        let m = "[package]\nname = \"x\"\n[dependencies]\npagoda-model.workspace = true\n\
                 serde = \"1\"\npagoda-kernels = { workspace = true }\n[dev-dependencies]\n\
                 pagoda-store = { path = \"../s\" }\n[dependencies.pagoda-http]\npath = \"../h\"\n";
        assert_eq!(
            pagoda_deps(m),
            [
                "pagoda-http",
                "pagoda-kernels",
                "pagoda-model",
                "pagoda-store"
            ]
        );
    }

    #[test]
    fn a_dependency_against_the_direction_is_named() {
        let m = "[dependencies]\npagoda-engine.workspace = true\n";
        let e = dependency_breaks("pagoda-model", m);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].contains("pagoda-model depends on pagoda-engine"),
            "{e:?}"
        );
        assert!(dependency_breaks("pagoda-server", m).is_empty());
        let server = "[dependencies]\npagoda-compress.workspace = true\n";
        assert_eq!(dependency_breaks("pagoda-server", server).len(), 1);
        assert!(
            !dependency_breaks("pagoda-new", "").is_empty(),
            "unknown crate"
        );
    }

    #[test]
    fn the_allowed_direction_has_no_cycle() {
        // Depth-first over ALLOWED_DEPS: no crate reaches itself.
        fn reaches(from: &str, to: &str, seen: &mut Vec<String>) -> bool {
            let Some((_, deps)) = ALLOWED_DEPS.iter().find(|(c, _)| *c == from) else {
                return false;
            };
            deps.iter().any(|d| {
                *d == to
                    || (!seen.iter().any(|s| s == d) && {
                        seen.push(d.to_string());
                        reaches(d, to, seen)
                    })
            })
        }
        for (c, _) in ALLOWED_DEPS {
            assert!(!reaches(c, c, &mut Vec::new()), "{c} reaches itself");
        }
        assert!(ALLOWED_DEPS
            .iter()
            .all(|(_, d)| !d.contains(&"pagoda-tidy")));
    }

    #[test]
    fn sections_scope_names_and_odd_spans_are_not_paths() {
        let doc = "# A\n`crates/pagoda-x` `a.rs`\n### `crates/pagoda-y`\n- `quant/` — `int8.rs`, \
                   `Model::forward`, `hf://x`, `corpus/<t>/`, `OUT.partial/`\n```\n`b.rs`\n```\n\
                   ## Tests\n`tests/golden/x-{a,b}.json`\n";
        let got: Vec<(String, Option<String>)> = named_paths(doc)
            .into_iter()
            .map(|n| (n.text, n.scope))
            .collect();
        let y = Some("crates/pagoda-y".to_string());
        assert_eq!(
            got,
            [
                ("crates/pagoda-x".to_string(), None),
                ("a.rs".to_string(), None),
                ("crates/pagoda-y".to_string(), y.clone()),
                ("quant/".to_string(), y.clone()),
                ("int8.rs".to_string(), y),
                ("tests/golden/x-{a,b}.json".to_string(), None),
            ]
        );
        assert_eq!(expand_braces("x-{a,b}.json"), ["x-a.json", "x-b.json"]);
    }

    #[test]
    fn crate_sections_are_read_from_headers_only() {
        let doc = "# A\n`crates/pagoda-a` in text\n### `crates/pagoda-b`\nx\n### `fuzz/`\n\
                   ```\n### `crates/pagoda-c`\n```\n### `crates/pagoda-d/` and more\n";
        assert_eq!(listed_crates(doc), ["pagoda-b", "pagoda-d"]);
    }

    #[test]
    fn a_crate_missing_from_either_side_is_named() {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(crate_list_breaks(&v(&["a", "b"]), &v(&["b", "a"])).is_empty());
        let breaks = crate_list_breaks(&v(&["a", "gone", "a"]), &v(&["a", "new"]));
        assert_eq!(breaks.len(), 3, "{breaks:?}");
        assert!(
            breaks[0].contains("crates/new has no section"),
            "{breaks:?}"
        );
        assert!(
            breaks[1].contains("crates/gone, which is not a crate"),
            "{breaks:?}"
        );
        assert!(breaks[2].contains("crates/a twice"), "{breaks:?}");
    }

    #[test]
    fn a_path_that_is_gone_is_reported() {
        let dir = std::env::temp_dir().join(format!("pagoda-tidy-codemap-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let src = dir.join("crates/pagoda-y/src/quant");
        fs::create_dir_all(&src).expect("temp dir");
        fs::write(src.join("int8.rs"), "").expect("temp file");
        let doc = "### `crates/pagoda-y`\n- `quant/` — `int8.rs`, `int4.rs`; `tests/it/q_*.rs`\n\
                   - `quant/int8.rs`\n";
        let missing: Vec<String> = missing_paths(&dir, doc)
            .into_iter()
            .map(|n| n.text)
            .collect();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(missing, ["int4.rs", "tests/it/q_*.rs"]);
    }
}
