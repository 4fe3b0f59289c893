//! The blind comparison page: one self-contained HTML file (inline CSS and JavaScript, no
//! network; a Content-Security-Policy forbids any fetch) showing each prompt with its two
//! answers as "Left" and "Right", buttons and keys for Left better / Tie / Right better,
//! progress, and "Export picks" (a [`super::compare::Picks`] JSON download).
//!
//! Invariants: every prompt, answer and id is HTML-escaped before it enters the page
//! ([`escape_html`]); the page holds no trace of which variant is on which side — no model
//! names, no key: only the shown texts, the ids and the comparison's `compare_id`.

use super::compare::Comparison;

const TEMPLATE: &str = include_str!("compare_page.html");

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page for `comparison` (its items only; the key stays out).
pub fn render(comparison: &Comparison) -> String {
    let mut items = String::new();
    for (i, item) in comparison.items.iter().enumerate() {
        let id = escape_html(&item.id);
        items.push_str(&format!(
            "<section class=\"item\" data-id=\"{id}\">\n\
             <h2>Prompt {n} <small>(id {id})</small></h2>\n\
             <div class=\"prompt\">{prompt}</div>\n\
             <div class=\"sides\">\n\
             <div class=\"side left\"><h3>Left</h3><div class=\"answer\">{left}</div></div>\n\
             <div class=\"side right\"><h3>Right</h3><div class=\"answer\">{right}</div></div>\n\
             </div>\n\
             <div class=\"buttons\">\
             <button type=\"button\" data-pick=\"left\">Left better <kbd>1</kbd></button>\
             <button type=\"button\" data-pick=\"tie\">Tie <kbd>2</kbd></button>\
             <button type=\"button\" data-pick=\"right\">Right better <kbd>3</kbd></button>\
             </div>\n</section>\n",
            n = i + 1,
            prompt = escape_html(&item.prompt),
            left = escape_html(&item.left),
            right = escape_html(&item.right),
        ));
    }
    // The items go in last, so that nothing in a model's answer is taken for a placeholder.
    TEMPLATE
        .replace("{{COUNT}}", &comparison.items.len().to_string())
        .replace("{{COMPARE_ID}}", &escape_html(&comparison.key.compare_id))
        .replace("{{ITEMS}}", &items)
}

#[cfg(test)]
mod tests {
    use super::super::compare::{ComparePrompt, Comparison, GenerationSettings, Variant};
    use super::*;

    fn page(answer_a: &str) -> (String, Comparison) {
        let prompts = vec![ComparePrompt {
            id: "q<1>".into(),
            prompt: "Say \"hi\" & <b>bye</b>".into(),
        }];
        let c = Comparison::new(
            &prompts,
            &[answer_a.to_string()],
            &["{{ITEMS}} plain".to_string()],
            Variant {
                model: "secret-model-a".into(),
                quantize: None,
            },
            Variant {
                model: "secret-model-b".into(),
                quantize: Some("q4_0".into()),
            },
            GenerationSettings {
                max_tokens: 4,
                temperature: 0.0,
                sampling_seed: None,
            },
            5,
        )
        .unwrap();
        (render(&c), c)
    }

    #[test]
    fn model_output_is_escaped() {
        let (html, _) = page("<script>alert('x')</script>");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
        assert!(html.contains("Say &quot;hi&quot; &amp; &lt;b&gt;bye&lt;/b&gt;"));
        assert!(html.contains("data-id=\"q&lt;1&gt;\""));
        // One script element: the page's own.
        assert_eq!(html.matches("<script").count(), 1);
        // An answer that looks like a placeholder stays text.
        assert!(html.contains("{{ITEMS}} plain"));
    }

    #[test]
    fn the_page_does_not_reveal_the_sides() {
        let (html, c) = page("answer a");
        for secret in ["secret-model", "q4_0", "variant", "\"left\":", "seed"] {
            assert!(!html.contains(secret), "page contains {secret:?}");
        }
        assert!(html.contains(&c.key.compare_id));
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no network"
        );
        assert!(html.contains("Left better") && html.contains("Export picks"));
    }
}
