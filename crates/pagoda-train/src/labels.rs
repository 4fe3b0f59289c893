//! The teacher's soft labels: for every position of every training sequence, the top-k token
//! ids and their log-probabilities at temperature `T`, computed by Pagoda's own engine
//! (`Model::forward_batch` with every row's logits, several sequences per pass) and cached
//! on disk so a rerun (or a crash) resumes where labelling stopped.
//!
//! Cache format (little-endian): the magic `PGDLBL01`, a `u32` length and a JSON header
//! ([`CacheHeader`]: the teacher's fingerprint, `k`, `T`, the digest of the tokenized data,
//! the sequence length and count), then one record per sequence in data order:
//! `u32 index, u32 positions, positions·k u32 ids, positions·k f32 log-probabilities, u64
//! FNV-1a checksum of the record so far`. Records are appended without fsync; on open, the
//! records are read while each is complete, in order and checksummed, and the file is cut
//! after the last good one (a torn record at the end of a killed run is dropped and
//! recomputed).
//!
//! Invariants: a cache is used only for the header it was written with — another teacher,
//! data, `k`, `T` or sequence length is refused with a message saying to delete the file or
//! pass another `--labels` path; records hold log-probabilities sorted from the most likely
//! token down, clamped below at [`MIN_LOGPROB`] (so `0 · log 0` never appears in a loss).

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pagoda_model::arch::{BatchSegment, Logits, Model};
use pagoda_model::KvDtype;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, TrainError};

const MAGIC: &[u8; 8] = b"PGDLBL01";
/// Teacher log-probabilities below this are stored as this.
pub const MIN_LOGPROB: f32 = -1e4;
/// Rows of logits one teacher pass may hold: about 256 MiB of f32 logits.
const LOGIT_BUDGET: usize = 1 << 26;
/// Positions per KV block of the teacher's paged cache.
const BLOCK: usize = 16;

/// What a label cache was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheHeader {
    pub teacher: String,
    pub top_k: usize,
    pub temperature: f64,
    pub data_digest: String,
    pub seq_len: usize,
    pub sequences: usize,
}

/// Top-k labels of every position of every sequence, in data order.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    pub top_k: usize,
    /// `ids[offsets[s]·k ..]`: sequence `s`'s positions, `k` each.
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Position offset of each sequence; one more entry than sequences.
    pub offsets: Vec<usize>,
}

impl Labels {
    /// Sequence `s`'s (ids, log-probabilities), `positions · k` each.
    pub fn sequence(&self, s: usize) -> (&[u32], &[f32]) {
        let (a, b) = (
            self.offsets[s] * self.top_k,
            self.offsets[s + 1] * self.top_k,
        );
        (&self.ids[a..b], &self.logprobs[a..b])
    }

    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The labels of sequences `order`, in that order.
    pub fn select(&self, order: &[usize]) -> Labels {
        let mut out = Labels {
            top_k: self.top_k,
            offsets: vec![0],
            ..Labels::default()
        };
        for &s in order {
            let (i, l) = self.sequence(s);
            out.push(i, l);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, ids: &[u32], logprobs: &[f32]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.ids.extend_from_slice(ids);
        self.logprobs.extend_from_slice(logprobs);
        let last = self.offsets[self.offsets.len() - 1];
        self.offsets.push(last + ids.len() / self.top_k.max(1));
    }
}

/// SHA-256 of the tokenized sequences (their lengths and ids): what the labels are of.
pub fn data_digest(sequences: &[Vec<u32>]) -> String {
    let mut h = Sha256::new();
    for s in sequences {
        h.update((s.len() as u64).to_le_bytes());
        for t in s {
            h.update(t.to_le_bytes());
        }
    }
    hex::encode(h.finalize())
}

/// A cheap fingerprint of a model file or folder: for each weight file (the file itself, or
/// a folder's `*.safetensors` and `config.json`), its name, size and the SHA-256 of its
/// first and last MiB.
pub fn fingerprint(path: &Path) -> Result<String> {
    let mut files = Vec::new();
    if path.is_dir() {
        let rd = std::fs::read_dir(path).map_err(|e| TrainError::io(path, e))?;
        for entry in rd {
            let p = entry.map_err(|e| TrainError::io(path, e))?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            if let Some(n) = name {
                if n.ends_with(".safetensors") || n == "config.json" {
                    files.push(p);
                }
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut h = Sha256::new();
    for f in &files {
        let mut file = File::open(f).map_err(|e| TrainError::io(f, e))?;
        let size = file.metadata().map_err(|e| TrainError::io(f, e))?.len();
        if let Some(n) = f.file_name() {
            h.update(n.to_string_lossy().as_bytes());
        }
        h.update(size.to_le_bytes());
        let mut buf = vec![0u8; (1 << 20).min(size as usize)];
        file.read_exact(&mut buf)
            .map_err(|e| TrainError::io(f, e))?;
        h.update(&buf);
        file.seek(SeekFrom::Start(size - buf.len() as u64))
            .map_err(|e| TrainError::io(f, e))?;
        file.read_exact(&mut buf)
            .map_err(|e| TrainError::io(f, e))?;
        h.update(&buf);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(format!("{name}:{}", &hex::encode(h.finalize())[..16]))
}

/// Top-k of one row of logits at temperature `t`: (ids, log-probabilities), most likely
/// first.
pub fn top_k_logprobs(row: &[f32], k: usize, t: f64) -> (Vec<u32>, Vec<f32>) {
    let inv_t = 1.0 / t;
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&z| ((z as f64 - max) * inv_t).exp())
        .sum::<f64>()
        .ln();
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    let by_logit = |a: &u32, b: &u32| {
        row[*b as usize]
            .partial_cmp(&row[*a as usize])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(b))
    };
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_logit);
        idx.truncate(k);
    }
    idx.sort_by(by_logit);
    let lp = idx
        .iter()
        .map(|&i| (((row[i as usize] as f64 - max) * inv_t - lse) as f32).max(MIN_LOGPROB))
        .collect();
    (idx, lp)
}

/// The label cache file at `path` for `header`.
pub struct LabelCache {
    path: PathBuf,
    header: CacheHeader,
}

/// FNV-1a, 64 bits.
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

impl LabelCache {
    pub fn new(path: &Path, header: CacheHeader) -> LabelCache {
        LabelCache {
            path: path.to_path_buf(),
            header,
        }
    }

    fn stale(&self, what: &str) -> TrainError {
        TrainError::Stale(format!(
            "the label cache {} was made for {what}; delete it to recompute the labels, or \
             pass another --labels path",
            self.path.display()
        ))
    }

    /// The complete records already in the file (none for a new file), after checking the
    /// header; the file is cut after the last complete record.
    pub fn load(&self) -> Result<Labels> {
        let mut labels = Labels {
            top_k: self.header.top_k,
            offsets: vec![0],
            ..Labels::default()
        };
        if !self.path.exists() {
            return Ok(labels);
        }
        let err = |e| TrainError::io(&self.path, e);
        let file = File::open(&self.path).map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        let mut r = BufReader::new(file);
        let mut magic = [0u8; 8];
        let mut good = 0u64;
        if r.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(self.stale("something else (it is not a Pagoda label cache)"));
        }
        let hlen = read_u32(&mut r).map_err(|_| self.stale("nothing (its header is cut)"))?;
        let mut hbuf = vec![0u8; (hlen as usize).min(1 << 20)];
        r.read_exact(&mut hbuf)
            .map_err(|_| self.stale("nothing (its header is cut)"))?;
        let header: CacheHeader = serde_json::from_slice(&hbuf)
            .map_err(|_| self.stale("nothing readable (its header is damaged)"))?;
        self.compare(&header)?;
        good += 12 + hlen as u64;
        let k = self.header.top_k;
        while labels.len() < self.header.sequences {
            let Some((ids, lps, bytes)) = read_record(&mut r, labels.len(), k, len - good) else {
                break;
            };
            labels.push(&ids, &lps);
            good += bytes;
        }
        drop(r);
        if good < len {
            let f = OpenOptions::new()
                .write(true)
                .open(&self.path)
                .map_err(err)?;
            f.set_len(good).map_err(err)?;
        }
        Ok(labels)
    }

    fn compare(&self, found: &CacheHeader) -> Result<()> {
        let want = &self.header;
        if found.teacher != want.teacher {
            return Err(self.stale(&format!("the teacher {}", found.teacher)));
        }
        if found.data_digest != want.data_digest
            || found.seq_len != want.seq_len
            || found.sequences != want.sequences
        {
            return Err(self.stale(&format!(
                "other data ({} sequences of at most {} tokens, digest {}…)",
                found.sequences,
                found.seq_len,
                &found.data_digest[..found.data_digest.len().min(12)]
            )));
        }
        if found.top_k != want.top_k {
            return Err(self.stale(&format!("--top-k {}", found.top_k)));
        }
        if found.temperature != want.temperature {
            return Err(self.stale(&format!("--temperature {}", found.temperature)));
        }
        Ok(())
    }

    /// Labels every sequence `labels` lacks with `teacher`, appending each batch's records
    /// to the file; `progress(done, total)` after each batch.
    pub fn complete(
        &self,
        teacher: &Model,
        sequences: &[Vec<u32>],
        labels: &mut Labels,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<()> {
        let total = sequences.len();
        if labels.len() >= total {
            return Ok(());
        }
        let err = |e| TrainError::io(&self.path, e);
        let new = !self.path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(err)?;
        let mut w = BufWriter::new(file);
        if new {
            let h = serde_json::to_vec(&self.header)
                .map_err(|e| TrainError::Data(format!("label cache header: {e}")))?;
            w.write_all(MAGIC).map_err(err)?;
            w.write_all(&(h.len() as u32).to_le_bytes()).map_err(err)?;
            w.write_all(&h).map_err(err)?;
        }
        let vocab = teacher.config().vocab_size;
        let rows_budget = (LOGIT_BUDGET / vocab.max(1)).max(self.header.seq_len);
        let blocks_per_seq = self.header.seq_len.div_ceil(BLOCK).max(1);
        let max_seqs = (rows_budget / self.header.seq_len.max(1)).max(1);
        let mut cache = teacher.new_paged_cache(max_seqs * blocks_per_seq, BLOCK, KvDtype::F32);
        let tables: Vec<Vec<u32>> = (0..max_seqs)
            .map(|s| ((s * blocks_per_seq) as u32..((s + 1) * blocks_per_seq) as u32).collect())
            .collect();
        progress(labels.len(), total);
        while labels.len() < total {
            let first = labels.len();
            let mut rows = 0;
            let mut end = first;
            while end < total
                && end - first < max_seqs
                && rows + sequences[end].len() <= rows_budget
            {
                rows += sequences[end].len();
                end += 1;
            }
            end = end.max(first + 1);
            let segments: Vec<BatchSegment<'_>> = (first..end)
                .map(|s| BatchSegment {
                    tokens: &sequences[s],
                    start: 0,
                    block_table: &tables[s - first][..sequences[s].len().div_ceil(BLOCK)],
                    logits: Some(Logits::All),
                    adapter: None,
                    state_slot: None,
                })
                .collect();
            let logits = teacher.forward_batch(&segments, &mut cache)?;
            let mut row = 0;
            for (s, seq) in sequences.iter().enumerate().take(end).skip(first) {
                let n = seq.len();
                let mut ids = Vec::with_capacity(n * self.header.top_k);
                let mut lps = Vec::with_capacity(n * self.header.top_k);
                for p in 0..n {
                    let r = &logits[(row + p) * vocab..(row + p + 1) * vocab];
                    if let Some(bad) = r.iter().position(|x| !x.is_finite()) {
                        return Err(TrainError::Diverged(format!(
                            "the teacher's logit of token {bad} at position {p} of sequence \
                             {s} is not finite"
                        )));
                    }
                    let (i, l) = top_k_logprobs(r, self.header.top_k, self.header.temperature);
                    ids.extend(i);
                    lps.extend(l);
                }
                row += n;
                write_record(&mut w, s, n, &ids, &lps).map_err(err)?;
                labels.push(&ids, &lps);
            }
            w.flush().map_err(err)?;
            progress(labels.len(), total);
        }
        Ok(())
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// One record, if complete, of sequence `index` with `k` labels per position, within
/// `left` bytes: (ids, log-probabilities, bytes read).
fn read_record(
    r: &mut impl Read,
    index: usize,
    k: usize,
    left: u64,
) -> Option<(Vec<u32>, Vec<f32>, u64)> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head).ok()?;
    let i = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let n = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let body = n.checked_mul(k)?.checked_mul(8)?;
    let bytes = 8 + body as u64 + 8;
    if i != index || bytes > left {
        return None;
    }
    let mut buf = vec![0u8; body + 8];
    r.read_exact(&mut buf).ok()?;
    let sum = fnv(&buf[..body], fnv(&head, FNV_START));
    let stored = u64::from_le_bytes(buf[body..].try_into().ok()?);
    if sum != stored {
        return None;
    }
    let half = n * k * 4;
    let ids = buf[..half]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let lps = buf[half..body]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some((ids, lps, bytes))
}

fn write_record(
    w: &mut impl Write,
    index: usize,
    n: usize,
    ids: &[u32],
    lps: &[f32],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(8 + ids.len() * 8 + 8);
    buf.extend_from_slice(&(index as u32).to_le_bytes());
    buf.extend_from_slice(&(n as u32).to_le_bytes());
    for i in ids {
        buf.extend_from_slice(&i.to_le_bytes());
    }
    for l in lps {
        buf.extend_from_slice(&l.to_le_bytes());
    }
    let sum = fnv(&buf[8..], fnv(&buf[..8], FNV_START));
    buf.extend_from_slice(&sum.to_le_bytes());
    w.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_normalised_over_the_vocabulary() {
        let row = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let (ids, lps) = top_k_logprobs(&row, 3, 1.0);
        assert_eq!(ids, vec![1, 3, 0]);
        let lse = row.iter().map(|&z| (z as f64).exp()).sum::<f64>().ln();
        assert!((lps[0] as f64 - (3.0 - lse)).abs() < 1e-6);
        let (_, all) = top_k_logprobs(&row, 5, 2.0);
        let total: f64 = all.iter().map(|&l| (l as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_torn_record_is_dropped_and_the_file_cut() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("labels.bin");
        let header = CacheHeader {
            teacher: "t".into(),
            top_k: 2,
            temperature: 1.0,
            data_digest: "d".into(),
            seq_len: 4,
            sequences: 3,
        };
        {
            let mut f = BufWriter::new(File::create(&path).expect("create"));
            let h = serde_json::to_vec(&header).expect("json");
            f.write_all(MAGIC).expect("w");
            f.write_all(&(h.len() as u32).to_le_bytes()).expect("w");
            f.write_all(&h).expect("w");
            write_record(&mut f, 0, 1, &[3, 4], &[-0.1, -2.0]).expect("w");
            write_record(&mut f, 1, 2, &[1, 2, 3, 4], &[-0.1, -2.0, -0.5, -0.9]).expect("w");
        }
        let full = std::fs::metadata(&path).expect("meta").len();
        // Cut in the middle of the second record.
        let f = OpenOptions::new().write(true).open(&path).expect("open");
        f.set_len(full - 5).expect("cut");
        let cache = LabelCache::new(&path, header.clone());
        let labels = cache.load().expect("load");
        assert_eq!(labels.len(), 1);
        assert_eq!(labels.sequence(0), (&[3u32, 4][..], &[-0.1f32, -2.0][..]));
        assert!(std::fs::metadata(&path).expect("meta").len() < full - 5);
        // Another k is refused, naming what to do.
        let other = LabelCache::new(&path, CacheHeader { top_k: 3, ..header });
        let e = other.load().expect_err("stale").to_string();
        assert!(e.contains("--top-k 2") && e.contains("delete it"), "{e}");
    }
}
