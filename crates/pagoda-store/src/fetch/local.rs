//! Local sources: a GGUF file or a Hugging Face folder already on this machine.
//!
//! Owns copying them into the store and [`detect_format`]. Invariant: the original files are only
//! read, never moved or changed; a folder must hold `config.json` to count as a Hugging Face
//! folder; hidden files (`.git`, `.cache`, ...) are skipped; only regular files are opened
//! ([`open_regular`]: a FIFO or device is refused at once, never waited on).

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{finish_single, FetchCtx, Fetched, GGUF_MAGIC};
use crate::blob::BlobWriter;
use crate::error::{Result, StoreError};
use crate::manifest::Format;
use crate::progress::copy_with_progress;

/// Says whether `path` is a GGUF file or a Hugging Face folder, or why it is neither.
pub fn detect_format(path: &Path) -> Result<Format> {
    let meta = fs::metadata(path).map_err(StoreError::io("open", path))?;
    if meta.is_dir() {
        // is_file() follows links and is false for a FIFO, so nothing here opens one.
        if path.join("config.json").is_file() {
            return Ok(Format::HfFolder);
        }
        if path.join("adapter_config.json").is_file() {
            // The same deploy path as pagoda_model::lora::MERGE_THEN_QUANTIZE (this crate
            // depends on no other Pagoda crate).
            return Err(StoreError::NotAModel {
                path: path.to_path_buf(),
                reason: "this is a PEFT LoRA adapter (adapter_config.json, no config.json), \
                         not a model: it only holds the changes to a base model. To serve the \
                         fine-tune, merge the adapter into the unquantized base model, then \
                         quantize the merged model: `pagoda merge-lora BASE ADAPTER -o merged`, \
                         then `pagoda quantize merged -o merged-q4.gguf` (a GGUF base), or \
                         quantize at load: `pagoda run merged --quantize nf4`"
                    .into(),
            });
        }
        return Err(StoreError::NotAModel {
            path: path.to_path_buf(),
            reason: "the folder has no config.json, so it is not a Hugging Face model folder; to use a GGUF file, pass the file itself".into(),
        });
    }
    if !meta.is_file() {
        return Err(not_a_regular_file(path));
    }
    let mut magic = [0u8; 4];
    let mut f = open_regular(path)?;
    let n = read_up_to(&mut f, &mut magic).map_err(StoreError::io("read", path))?;
    if n == 4 && &magic == GGUF_MAGIC {
        Ok(Format::Gguf)
    } else {
        Err(StoreError::NotAModel {
            path: path.to_path_buf(),
            reason: "the file does not start with the GGUF magic; pass a .gguf file or a Hugging Face model folder".into(),
        })
    }
}

fn not_a_regular_file(path: &Path) -> StoreError {
    StoreError::NotAModel {
        path: path.to_path_buf(),
        reason: "not a regular file (a FIFO, socket or device is never opened as a model)".into(),
    }
}

/// Opens `path` for reading only if it is a regular file. The open does not block (a FIFO
/// swapped in after a metadata check would otherwise wait for a writer forever) and the
/// opened handle itself is checked, so no race can hand back anything but a regular file.
pub fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(StoreError::io("open", path))?;
    let meta = f.metadata().map_err(StoreError::io("open", path))?;
    if !meta.is_file() {
        return Err(not_a_regular_file(path));
    }
    // O_NONBLOCK means nothing for regular files' reads, so the flag can stay.
    Ok(f)
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Copies a local GGUF file or Hugging Face folder into blobs.
pub fn fetch(ctx: &FetchCtx<'_>, path: &Path) -> Result<Fetched> {
    match detect_format(path)? {
        Format::Gguf => {
            let name = path
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let file_name = super::gguf_file_name(&name, ctx.default_file_name);
            let blob = copy_file(ctx, path, &file_name, true)?;
            Ok(Fetched::single_gguf(blob, file_name))
        }
        Format::HfFolder => {
            let mut rels = Vec::new();
            walk(path, Path::new(""), &mut rels)?;
            rels.sort();
            ctx.promise(
                rels.iter()
                    .filter_map(|rel| fs::metadata(path.join(rel)).ok())
                    .map(|m| m.len())
                    .sum(),
            );
            let mut files = Vec::new();
            for rel in rels {
                let rel_text = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let blob = copy_file(ctx, &path.join(&rel), &rel_text, false)?;
                files.push(super::folder_file(rel_text, blob));
            }
            Ok(Fetched {
                format: Format::HfFolder,
                files,
            })
        }
    }
}

fn copy_file(
    ctx: &FetchCtx<'_>,
    src: &Path,
    label: &str,
    single: bool,
) -> Result<crate::blob::Blob> {
    let mut f = open_regular(src)?;
    let len = f.metadata().map(|m| m.len()).ok();
    if single {
        if let Some(len) = len {
            ctx.promise(len);
        }
    }
    ctx.progress.begin_file();
    let mut w = BlobWriter::create(ctx.blobs_dir)?;
    copy_with_progress(&mut f, &mut w, |n| ctx.progress.advance(n))
        .map_err(StoreError::io("copy", src))?;
    let what = src.display().to_string();
    let blob = if single {
        finish_single(w, ctx, &what)?
    } else {
        w.finish(None, &what)?
    };
    ctx.progress.finish_file(label, blob.size);
    Ok(blob)
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    for entry in fs::read_dir(&dir).map_err(StoreError::io("list", &dir))? {
        let entry = entry.map_err(StoreError::io("list", &dir))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let child = rel.join(&name);
        // metadata() follows symlinks, as Hugging Face cache snapshots are symlinks to blobs.
        let meta = fs::metadata(entry.path()).map_err(StoreError::io("read", entry.path()))?;
        if meta.is_dir() {
            walk(root, &child, out)?;
        } else if meta.is_file() {
            out.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_fifo_is_refused_at_once_never_opened_for_a_writer() {
        let dir = tempfile::tempdir().expect("tmp");
        let fifo = dir.path().join("m.gguf");
        let c_path = std::ffi::CString::new(fifo.display().to_string()).expect("path");
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
        let started = Instant::now();
        let e = detect_format(&fifo).expect_err("a FIFO is no model");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // The race a metadata check cannot close: the open itself refuses.
        let e = open_regular(&fifo).expect_err("refused on the handle");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(open_regular(Path::new("/dev/null")).is_err());
        let file = dir.path().join("f");
        fs::write(&file, b"GGUF").expect("write");
        assert!(open_regular(&file).is_ok());
    }
}
