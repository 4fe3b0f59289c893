//! The teacher and the student must share a tokenizer: the teacher's labels name token ids,
//! and they mean the same tokens to the student only when both vocabularies list the same
//! token at every id.
//!
//! Invariant: [`check_shared`] compares the token strings id by id (GGUF
//! `tokenizer.ggml.tokens` and a Hugging Face `tokenizer.json` are compared the same way,
//! through Pagoda's `Tokenizer`), and a mismatch names the sizes or the first differing id
//! with both tokens; the teacher's output rows must all be rows of the student's head.

use pagoda_model::tokenizer::Tokenizer;

use crate::error::{Result, TrainError};

/// Checks that `teacher` and `student` tokenize alike and that every id the teacher can
/// predict (`teacher_rows` logits) is a row of the student's output (`student_rows`).
pub fn check_shared(
    teacher: &Tokenizer,
    student: &Tokenizer,
    teacher_rows: usize,
    student_rows: usize,
) -> Result<()> {
    let (nt, ns) = (teacher.vocab_size(), student.vocab_size());
    if nt != ns {
        return Err(TrainError::TokenizerMismatch(format!(
            "the teacher and the student do not share a tokenizer: the teacher's has {nt} \
             tokens, the student's {ns}; distillation needs the same vocabulary (e.g. \
             Qwen2.5 0.5B from 1.5B, SmolLM2 135M from 360M)"
        )));
    }
    for id in 0..nt as u32 {
        let (a, b) = (teacher.id_to_token(id), student.id_to_token(id));
        if a != b {
            return Err(TrainError::TokenizerMismatch(format!(
                "the teacher and the student do not share a tokenizer: id {id} is {} for the \
                 teacher and {} for the student",
                a.map_or("missing".to_string(), |t| format!("{t:?}")),
                b.map_or("missing".to_string(), |t| format!("{t:?}")),
            )));
        }
    }
    if teacher_rows > student_rows {
        return Err(TrainError::TokenizerMismatch(format!(
            "the teacher predicts {teacher_rows} token ids but the student's output head has \
             {student_rows} rows"
        )));
    }
    Ok(())
}
