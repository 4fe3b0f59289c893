//! Writing the trained student, through pagoda-compress's writers (no writer of our own):
//! a full fine-tune replaces every student tensor of the student's own file
//! (`pagoda_compress::merge::write_edited`: a GGUF keeps the student's metadata, a folder
//! its config and tokenizer files); a LoRA run writes a PEFT adapter folder and merges it
//! with `pagoda_compress::merge::merge_lora`, the path `pagoda merge-lora` takes.
//!
//! Invariants: the output appears only when complete (the writers' `OUT.partial`, renamed);
//! an adapter written only to be merged lives in a temporary folder removed afterwards.

use std::path::Path;

use pagoda_compress::merge::{merge_lora, write_edited, MergeBase, MergeDtype, Replaced};
use pagoda_model::lora::LoraAdapter;

use crate::error::{Result, TrainError};
use crate::student::Student;

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// Bytes of the output's weights.
    pub bytes: u64,
    pub tensors: usize,
}

/// Writes `student` (trained from the model at `student_path`) to `out` in `dtype`; with
/// LoRA, the adapter also goes to `adapter_dir` when given.
pub fn write_student(
    student: &Student,
    student_path: &Path,
    out: &Path,
    dtype: MergeDtype,
    force: bool,
    adapter_dir: Option<&Path>,
    note: &str,
) -> Result<Written> {
    let base = MergeBase::open(student_path)?;
    match student.lora() {
        None => {
            let edits = Replaced(student.export()?);
            let (_, bytes, tensors, _) = write_edited(
                &base,
                &edits,
                dtype,
                out,
                force,
                ("pagoda.distilled", note.to_string()),
                |_, _| {},
            )?;
            Ok(Written { bytes, tensors })
        }
        Some(set) => {
            let tmp = tempfile::tempdir_in(
                out.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
            )
            .map_err(|e| TrainError::io(out, e))?;
            let base_name = student_path.display().to_string();
            set.write_peft(tmp.path(), &base_name)?;
            let adapter = LoraAdapter::open(tmp.path())?;
            let report = merge_lora(&base, &adapter, dtype, out, force, |_, _| {})?;
            if let Some(dir) = adapter_dir {
                if dir.exists() && !force {
                    return Err(TrainError::InvalidOption(format!(
                        "{} already exists; pass --force to replace it",
                        dir.display()
                    )));
                }
                std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
                set.write_peft(dir, &base_name)?;
            }
            Ok(Written {
                bytes: report.bytes,
                tensors: report.tensors,
            })
        }
    }
}
