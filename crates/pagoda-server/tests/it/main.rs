//! Integration tests of pagoda-server: real HTTP on loopback against the tiny test models.

mod api_keys;
mod browsers;
mod chat_page;
mod embeddings;
mod fuzz_requests;
mod harness;
mod hybrids;
mod lifecycle;
mod lora;
mod ollama_api;
mod openai_api;
mod request_fields;
mod robustness;
mod security;
mod tools;
