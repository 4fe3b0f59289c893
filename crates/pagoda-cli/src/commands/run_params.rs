//! The sampling settings of one `pagoda run` session: set from the flags at start, changed
//! by `/set parameter NAME VALUE` in the interactive chat (Ollama's parameter names), and
//! turned into request knobs for each turn.
//!
//! Invariants: a name Pagoda's sampler does not take, or a value that does not parse, is
//! refused with a message and leaves the settings as they were; ranges are checked by the
//! runtime on the next turn, like any request's.

use pagoda_runtime::Knobs;

/// Ollama parameter names this session can change, each with what it takes (for messages).
pub const SETTABLE: &[(&str, &str)] = &[
    ("temperature", "<float>  Sampling temperature; 0 is greedy"),
    (
        "top_p",
        "<float>        Keep the tokens whose probability sums to p",
    ),
    (
        "top_k",
        "<int>          Keep the k most likely tokens (0 = off)",
    ),
    (
        "min_p",
        "<float>        Drop tokens below min_p times the top one",
    ),
    (
        "repeat_penalty",
        "<float> Penalty on tokens already in the context",
    ),
    (
        "repeat_last_n",
        "<int>  How far back the repeat penalty looks",
    ),
    (
        "presence_penalty",
        "<float> Subtracted once per token already generated",
    ),
    (
        "frequency_penalty",
        "<float> Subtracted per time a token was generated",
    ),
    ("seed", "<int>           Random seed"),
    (
        "num_predict",
        "<int>    Most tokens per answer (-1: until the context is full)",
    ),
    (
        "stop",
        "<string> ...    Stop sequences (replace the ones set)",
    ),
];

/// Names Ollama knows that are fixed once the model is loaded, with the flag that sets them.
const FIXED_AT_START: &[(&str, &str)] = &[
    ("num_ctx", "--ctx-size"),
    ("num_gpu", "--gpu-layers"),
    ("num_thread", "--threads"),
];

/// The sampling settings of a session (`None`: the model's own default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<u64>,
    /// Most tokens per answer; `None`: until the context is full.
    pub max_tokens: Option<usize>,
    /// Stop sequences (the Modelfile's are added when a request is made).
    pub stop: Vec<String>,
}

impl Params {
    /// These settings as request knobs, with `default_stops` (the model's) added to the stops.
    pub fn knobs(&self, with_default_stops: impl FnOnce(Vec<String>) -> Vec<String>) -> Knobs {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(as_i64),
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n.map(as_i64),
            seed: self.seed,
            stop: with_default_stops(self.stop.clone()),
            max_tokens: self.max_tokens,
            n: 1,
            ..Knobs::default()
        }
    }

    /// `/set parameter NAME VALUE...`: sets one setting, and says what was set; an unknown
    /// name or a bad value is an error message and changes nothing.
    pub fn set(&mut self, name: &str, values: &[&str]) -> Result<String, String> {
        if let Some((_, flag)) = FIXED_AT_START.iter().find(|(n, _)| *n == name) {
            return Err(format!(
                "'{name}' is fixed once the model is loaded; start `pagoda run` again with {flag}"
            ));
        }
        if !SETTABLE.iter().any(|(n, _)| *n == name) {
            let names: Vec<&str> = SETTABLE.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown parameter '{name}'; Pagoda's sampler takes: {}",
                names.join(", ")
            ));
        }
        if values.is_empty() {
            return Err(format!("/set parameter {name} needs a value"));
        }
        if name == "stop" {
            self.stop = values.iter().map(|v| v.to_string()).collect();
            return Ok(format!("Set parameter 'stop' to '{}'", values.join(", ")));
        }
        let [value] = values else {
            return Err(format!(
                "/set parameter {name} takes one value, got {}",
                values.len()
            ));
        };
        let float = || {
            value
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("'{value}' is not a number (for {name})"))
        };
        let count = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("'{value}' is not a whole number of 0 or more (for {name})"))
        };
        match name {
            "temperature" => self.temperature = Some(float()?),
            "top_p" => self.top_p = Some(float()?),
            "top_k" => self.top_k = Some(count()?),
            "min_p" => self.min_p = Some(float()?),
            "repeat_penalty" => self.repeat_penalty = Some(float()?),
            "repeat_last_n" => self.repeat_last_n = Some(count()?),
            "presence_penalty" => self.presence_penalty = Some(float()?),
            "frequency_penalty" => self.frequency_penalty = Some(float()?),
            "seed" => {
                self.seed = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("'{value}' is not a seed (a whole number)"))?,
                )
            }
            "num_predict" => {
                self.max_tokens = match value.parse::<i64>() {
                    Ok(-1) => None,
                    Ok(n @ 1..) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                    _ => {
                        return Err(format!(
                            "num_predict must be a positive number of tokens or -1, got '{value}'"
                        ))
                    }
                }
            }
            _ => unreachable!("every name of SETTABLE is handled"),
        }
        Ok(format!("Set parameter '{name}' to '{value}'"))
    }

    /// The settings given a value, as `(name, value)` rows for `/show parameters`.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = Vec::new();
        let mut row = |name: &'static str, value: Option<String>| {
            if let Some(v) = value {
                rows.push((name, v));
            }
        };
        row("temperature", self.temperature.map(|v| v.to_string()));
        row("top_p", self.top_p.map(|v| v.to_string()));
        row("top_k", self.top_k.map(|v| v.to_string()));
        row("min_p", self.min_p.map(|v| v.to_string()));
        row("repeat_penalty", self.repeat_penalty.map(|v| v.to_string()));
        row("repeat_last_n", self.repeat_last_n.map(|v| v.to_string()));
        row(
            "presence_penalty",
            self.presence_penalty.map(|v| v.to_string()),
        );
        row(
            "frequency_penalty",
            self.frequency_penalty.map(|v| v.to_string()),
        );
        row("seed", self.seed.map(|v| v.to_string()));
        row(
            "num_predict",
            Some(self.max_tokens.map_or("-1".into(), |v| v.to_string())),
        );
        row(
            "stop",
            (!self.stop.is_empty()).then(|| format!("{:?}", self.stop)),
        );
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_what_the_sampler_takes_and_refuses_the_rest_unchanged() {
        let mut p = Params {
            max_tokens: Some(512),
            ..Params::default()
        };
        assert_eq!(
            p.set("temperature", &["0.5"]),
            Ok("Set parameter 'temperature' to '0.5'".into())
        );
        p.set("top_k", &["40"]).unwrap();
        p.set("seed", &["7"]).unwrap();
        p.set("num_predict", &["-1"]).unwrap();
        p.set("stop", &["<end>", "###"]).unwrap();
        assert_eq!(p.temperature, Some(0.5));
        assert_eq!(p.top_k, Some(40));
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.stop, ["<end>", "###"]);
        let before = p.clone();
        let e = p.set("mirostat", &["1"]).unwrap_err();
        assert!(e.contains("unknown parameter 'mirostat'"), "{e}");
        assert!(e.contains("temperature"), "{e}");
        let e = p.set("num_ctx", &["8192"]).unwrap_err();
        assert!(e.contains("--ctx-size"), "{e}");
        assert!(p.set("temperature", &["hot"]).is_err());
        assert!(p.set("top_k", &["-3"]).is_err());
        assert!(p.set("num_predict", &["0"]).is_err());
        assert!(p.set("seed", &[]).is_err());
        assert!(p.set("seed", &["1", "2"]).is_err());
        assert_eq!(p, before, "a refused /set changes nothing");
    }

    #[test]
    fn knobs_carry_every_setting_and_the_model_stops() {
        let mut p = Params::default();
        p.set("repeat_penalty", &["1.1"]).unwrap();
        p.set("num_predict", &["9"]).unwrap();
        p.set("stop", &["x"]).unwrap();
        let k = p.knobs(|mut s| {
            s.push("<|im_end|>".into());
            s
        });
        assert_eq!(k.repetition_penalty, Some(1.1));
        assert_eq!(k.max_tokens, Some(9));
        assert_eq!(k.stop, ["x", "<|im_end|>"]);
        assert_eq!(k.n, 1);
        let rows = p.rows();
        assert!(rows.contains(&("num_predict", "9".into())), "{rows:?}");
    }
}
