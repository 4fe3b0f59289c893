//! `pagoda show NAME|PATH`: what the store knows about a model.
//!
//! Owns the layout of the details: the store part (format, size, digest, source, files) from the
//! manifest; model details (architecture, parameters, context, quantization, chat template; or
//! an embedding model's dimensions, window and pooling) from `pagoda_model::validate_model`,
//! which opens the model as loading does; a derived model's Modelfile layer (`pagoda create`),
//! and with `--modelfile` the Modelfile text the model behaves by. Invariant: a model that
//! cannot be loaded still shows its store part on stdout, then fails (exit 1) with the
//! reader's error and what to do; `--path` and `--modelfile` do not open the model.

use anyhow::Context;
use pagoda_model::validate::Validated;
use pagoda_store::{Format, Modelfile, ResolvedModel, Store};

use super::{human_size, open_store};
use crate::cli::ShowArgs;

/// Runs `pagoda show`.
pub fn run(args: ShowArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let model = resolve(&store, &args.model)?;
    if args.path {
        println!("{}", model.path.display());
        return Ok(());
    }
    let layer = store.modelfile_of(&model);
    if args.modelfile {
        let mf = layer.unwrap_or_else(|| Modelfile {
            from: model
                .name
                .as_ref()
                .map_or_else(|| model.path.display().to_string(), |n| n.to_string()),
            ..Modelfile::default()
        });
        print!("# Modelfile of {}\n{}", args.model.trim(), mf.render());
        return Ok(());
    }
    print!("{}", render(&model));
    let opened = pagoda_model::validate_model(&model.path).with_context(|| unloadable(&model))?;
    print!("{}", render_details(&opened));
    let derived = model.manifest.as_ref().and_then(|m| m.modelfile.as_ref());
    if let Some(layer) = derived {
        print!("{}", render_layer(layer));
    } else if let Some(entry) = pagoda_store::catalog::lookup(&args.model) {
        print!("{}", render_defaults(entry));
    }
    Ok(())
}

/// A derived model's Modelfile layer, what `pagoda run` and the server apply at load.
fn render_layer(layer: &Modelfile) -> String {
    let mut out = String::from("\n  Modelfile (pagoda create; `--modelfile` prints it whole)\n");
    let mut row = |k: &str, v: &str| out.push_str(&format!("    {k:<16}{v}\n"));
    row("from", &layer.from);
    for (key, value) in layer.parameters.entries() {
        let value = if key == "stop" {
            format!("{value:?}")
        } else {
            value
        };
        row(key, &value);
    }
    if let Some(system) = &layer.system {
        row("system", &one_line(system));
    }
    if let Some(t) = &layer.template {
        row(
            "template",
            &format!("custom Jinja, {} lines", t.lines().count().max(1)),
        );
    }
    for m in &layer.messages {
        row(
            "message",
            &format!("{}: {}", m.role.as_str(), one_line(&m.content)),
        );
    }
    for l in &layer.license {
        row("license", &one_line(l));
    }
    out
}

/// The first line of `text`, with `…` when there is more.
fn one_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    if lines.next().is_some() {
        format!("{first} …")
    } else {
        first.to_string()
    }
}

/// The catalog's per-model defaults that `pagoda run` applies when no flag overrides them.
fn render_defaults(entry: &pagoda_store::CatalogEntry) -> String {
    if entry.system.is_none() && entry.temperature.is_none() {
        return String::new();
    }
    let mut out = String::from("\n  Defaults (catalog; --system / --temperature override)\n");
    if let Some(system) = &entry.system {
        out.push_str(&format!("    {:<16}{system}\n", "system"));
    }
    if let Some(t) = entry.temperature {
        out.push_str(&format!("    {:<16}{t}\n", "temperature"));
    }
    out
}

/// What `show` says about a model that does not load (the reader's error follows it).
fn unloadable(model: &ResolvedModel) -> String {
    match &model.name {
        Some(name) => format!(
            "model '{name}' is in the store but cannot be loaded; remove it (`pagoda rm {name}`) and pull it again from a complete source"
        ),
        None => format!(
            "'{}' cannot be loaded; pass a complete GGUF file or Hugging Face folder of a supported model",
            model.path.display()
        ),
    }
}

fn render_details(opened: &Validated) -> String {
    let mut out = String::from("\n  Details\n");
    let mut row = |k: &str, v: String| out.push_str(&format!("    {k:<16}{v}\n"));
    match opened {
        Validated::Embedding(m) => {
            let c = m.config();
            row("kind", "embedding (BERT encoder)".into());
            row("dimensions", m.dimensions().to_string());
            row("max tokens", m.max_seq_len().to_string());
            row("layers", c.num_hidden_layers.to_string());
            row("vocabulary", c.vocab_size.to_string());
            row(
                "pooling",
                match c.pooling {
                    pagoda_model::embedding::Pooling::Mean => "mean",
                    pagoda_model::embedding::Pooling::Cls => "cls",
                }
                .to_string()
                    + if c.normalize { ", L2-normalised" } else { "" },
            );
        }
        Validated::Generative(src) => {
            let info = &src.info;
            let c = &src.config;
            if !info.name.is_empty() {
                row("model", info.name.clone());
            }
            row("architecture", info.architecture.clone());
            row(
                "parameters",
                crate::commands::human_count(info.parameter_count),
            );
            if let Some(moe) = &c.moe {
                row(
                    "active params",
                    format!(
                        "{} per token ({} of {} experts)",
                        crate::commands::human_count(info.active_parameter_count),
                        moe.n_used,
                        moe.n_experts
                    ),
                );
            }
            row("context length", info.context_length.to_string());
            row("quantization", info.file_type.clone());
            row("layers", c.n_layers.to_string());
            row("embedding", c.hidden_size.to_string());
            row(
                "heads",
                format!("{} (kv {}, dim {})", c.n_heads, c.n_kv_heads, c.head_dim),
            );
            row("vocabulary", c.vocab_size.to_string());
            if let Some(w) = c.sliding_window {
                row("sliding window", w.to_string());
            }
            row(
                "chat template",
                if src.chat_template.is_some() {
                    "yes".into()
                } else {
                    "no (ChatML is used)".into()
                },
            );
        }
    }
    out
}

/// A stored name, else a path used in place (never pulls).
fn resolve(store: &Store, text: &str) -> anyhow::Result<ResolvedModel> {
    let as_path = std::path::Path::new(text);
    let looks_like_path = pagoda_store::source::looks_like_path(text);
    if !looks_like_path {
        match store.resolve(text) {
            Ok(Some(m)) => return Ok(m),
            Ok(None) if !as_path.exists() => {
                return Err(pagoda_store::StoreError::NotFound {
                    name: text.trim().to_string(),
                }
                .into())
            }
            Ok(None) => {}
            Err(e) if !as_path.exists() => return Err(e.into()),
            Err(_) => {}
        }
    }
    Ok(pagoda_store::resolve_or_pull(store, text)?)
}

fn render(model: &ResolvedModel) -> String {
    let mut out = String::new();
    let mut row = |k: &str, v: &str| out.push_str(&format!("    {k:<16}{v}\n"));
    let format = match model.format {
        Format::Gguf => "gguf",
        Format::HfFolder => "hf-folder (safetensors)",
    };
    let mut text = String::from("  Model\n");
    if let Some(name) = &model.name {
        row("name", &name.to_string());
    }
    row("format", format);
    row("path", &model.path.display().to_string());
    if let Some(m) = &model.manifest {
        if let Some(primary) = m.primary() {
            row("digest", &primary.digest.to_string());
        }
        row(
            "size",
            &format!("{} ({} bytes)", human_size(m.total_size), m.total_size),
        );
        row("source", &m.source);
        row("pulled", &format_utc(m.created));
    }
    text.push_str(&out);
    if let Some(m) = &model.manifest {
        if m.format == Format::HfFolder {
            text.push_str("\n  Files\n");
            let width = m
                .files
                .iter()
                .map(|f| f.path.chars().count())
                .max()
                .unwrap_or(0);
            for f in &m.files {
                text.push_str(&format!(
                    "    {:<width$}  {:>7}  {}\n",
                    f.path,
                    human_size(f.size),
                    f.digest.short()
                ));
            }
        }
    }
    text
}

/// `2026-12-02 18:40:00 UTC` from Unix seconds (civil-from-days, no time-zone database).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(crate::commands::human_count(134_515_008), "134.5M");
        assert_eq!(crate::commands::human_count(1_543_714_304), "1.5B");
        assert_eq!(crate::commands::human_count(12), "12");
    }

    #[test]
    fn layer_rows() {
        let mf = Modelfile::parse(
            "FROM base:1\nPARAMETER temperature 0\nPARAMETER stop \"<|end|>\"\nSYSTEM \"\"\"Be brief.\nVery.\"\"\"\nMESSAGE user hi\n",
        )
        .unwrap();
        let out = render_layer(&mf);
        assert!(out.contains("    from            base:1\n"), "{out}");
        assert!(out.contains("    temperature     0\n"), "{out}");
        assert!(out.contains("    stop            \"<|end|>\"\n"), "{out}");
        assert!(out.contains("    system          Be brief. …\n"), "{out}");
        assert!(out.contains("    message         user: hi\n"), "{out}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }
}
