//! `pagoda create NAME -f Modelfile`: a derived model from an Ollama-style Modelfile.
//!
//! Owns reading the file and the command's output; the grammar is
//! `pagoda_store::modelfile`, the manifest work `Store::create`. Invariants: a Modelfile that
//! does not parse, a TEMPLATE that is not Jinja, an ADAPTER that is not a PEFT folder or a FROM that names nothing
//! fail with exit code 1 before any manifest is written; the base's weights are never copied
//! when FROM is a stored model.

use std::path::{Path, PathBuf};

use anyhow::Context;
use pagoda_model::chat_template::ChatTemplate;
use pagoda_store::modelfile::looks_like_go_template;
use pagoda_store::{CreateOptions, Modelfile, StoreError};

use super::open_store;
use crate::cli::CreateArgs;

/// Runs `pagoda create`.
pub fn run(args: CreateArgs) -> anyhow::Result<()> {
    let shown = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).with_context(|| {
        format!("cannot read the Modelfile '{shown}' (name another one with -f FILE)")
    })?;
    let modelfile =
        Modelfile::parse(&text).with_context(|| format!("{shown} is not a valid Modelfile"))?;
    check_template(&modelfile).with_context(|| format!("{shown}: TEMPLATE"))?;
    let store = open_store()?;
    let opts = CreateOptions {
        base_dir: Some(modelfile_dir(&args.file)),
        progress: !args.quiet,
    };
    let created = store
        .create(&args.name, &modelfile, &opts)
        .with_context(|| format!("cannot create '{}' from {shown}", args.name))?;
    let name = created
        .name
        .map_or_else(|| args.name.clone(), |n| n.to_string());
    let from = created
        .manifest
        .as_ref()
        .and_then(|m| m.modelfile.as_ref())
        .map_or(modelfile.from.as_str(), |l| l.from.as_str())
        .to_string();
    println!("created {name} from {from}");
    Ok(())
}

/// A TEMPLATE must be a Jinja template that compiles (checked here, where the template
/// engine is at hand, so a bad one never reaches the store).
fn check_template(modelfile: &Modelfile) -> anyhow::Result<()> {
    let Some(source) = &modelfile.template else {
        return Ok(());
    };
    if looks_like_go_template(source) {
        return Err(StoreError::GoTemplate.into());
    }
    ChatTemplate::new(source.clone(), String::new(), String::new())
        .context("the Jinja template does not compile")?
        .check_limits()
        .context("the Jinja template cannot render within the limits")?;
    Ok(())
}

/// The folder a Modelfile's relative paths start from.
fn modelfile_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_start_at_the_modelfile() {
        assert_eq!(modelfile_dir(Path::new("Modelfile")), PathBuf::from("."));
        assert_eq!(
            modelfile_dir(Path::new("models/pirate/Modelfile")),
            PathBuf::from("models/pirate")
        );
    }

    #[test]
    fn templates_must_be_jinja() {
        let with = |t: &str| Modelfile {
            from: "x".into(),
            template: Some(t.into()),
            ..Modelfile::default()
        };
        assert!(check_template(&with(
            "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        ))
        .is_ok());
        let e = check_template(&with("{{ .Prompt }}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Go template"), "{e}");
        assert!(check_template(&with("{% for m in messages %}")).is_err());
        assert!(check_template(&Modelfile::default()).is_ok());
    }
}
