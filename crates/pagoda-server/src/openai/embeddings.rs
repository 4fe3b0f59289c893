//! `POST /v1/embeddings`: text or token-id inputs, one or a batch, embedded by a BERT
//! sentence encoder (mean pooling + L2 normalisation, as sentence-transformers does), as
//! floats or base64 of little-endian f32.
//!
//! Invariant: an input longer than the model's window is a 400, never silently cut (the
//! Ollama route, whose API defines `truncate`, is where truncation is asked for).

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_model::embedding::Embedded;
use pagoda_protocol::openai::embedding::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector,
};

/// Most inputs in one request.
pub const MAX_INPUTS: usize = 2048;

pub(super) async fn handle(State(app): State<AppState>, body: Body) -> Response {
    let result = run(&app, body).await;
    respond(&app, result)
}

async fn run(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: EmbeddingRequest = crate::body::json(body, app.body_limits()).await?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("encoding_format must be float or base64, got `{other}`"),
            ))
        }
    };
    let count = match &req.input {
        EmbeddingInput::Text(_) | EmbeddingInput::Tokens(_) => 1,
        EmbeddingInput::Texts(v) => v.len(),
        EmbeddingInput::TokenLists(v) => v.len(),
    };
    if count == 0 || count > MAX_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!("send between 1 and {MAX_INPUTS} inputs, got {count}"),
        ));
    }
    let served = app.embedders.acquire(&req.model).await?;
    let dims = served.model.dimensions();
    if let Some(d) = req.dimensions {
        if d != dims {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!("this model's embeddings have {dims} dimensions; it cannot give {d}"),
            ));
        }
    }
    let model = served.clone();
    let input = req.input.clone();
    let embedded: Vec<Embedded> = tokio::task::spawn_blocking(move || match input {
        EmbeddingInput::Text(t) => model.model.embed(&[t.as_str()]),
        EmbeddingInput::Texts(v) => {
            let refs: Vec<&str> = v.iter().map(String::as_str).collect();
            model.model.embed(&refs)
        }
        EmbeddingInput::Tokens(ids) => model.model.embed_tokens(&[ids]),
        EmbeddingInput::TokenLists(v) => model.model.embed_tokens(&v),
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::invalid_param("input", e.to_string()))?;
    let max = served.model.max_seq_len();
    if let Some(i) = embedded.iter().position(|e| e.truncated) {
        return Err(ApiError::invalid_param(
            "input",
            format!("input {i} is longer than this model's {max} tokens; shorten or split it"),
        )
        .with_code("context_length_exceeded"));
    }
    let tokens: usize = embedded.iter().map(|e| e.tokens).sum();
    let data = embedded
        .into_iter()
        .enumerate()
        .map(|(index, e)| Embedding {
            object: "embedding".into(),
            index,
            embedding: if base64 {
                EmbeddingVector::Base64(base64_f32(&e.vector))
            } else {
                EmbeddingVector::Float(e.vector)
            },
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model: served.name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response())
}

/// Standard base64 (with padding) of the vector's little-endian f32 bytes, as the OpenAI
/// SDK decodes it.
fn base64_f32(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_f32;

    #[test]
    fn base64_of_floats_matches_the_standard_encoding() {
        // 1.0f32 = 00 00 80 3f; 2.0 = 00 00 00 40 (little endian).
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
