//! `GET /`: the chat page, one self-contained HTML file (no build step) compiled into the
//! binary. It streams from `/v1/chat/completions`, lists models from `/v1/models`, and
//! shows tokens per second.

use axum::response::Html;

const PAGE: &str = include_str!("../assets/chat.html");

pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
