//! [`QuantReport`]: what quantizing a model did — bytes before and after, tensor counts per
//! type, and every tensor that was kept or fell back to another type — with the one-line
//! summary the CLI prints.
//!
//! Invariant: `tensors` has one entry per tensor of the input, in name order; the byte and
//! count figures are sums over it.

use super::rules::Plan;
use pagoda_kernels::GgmlType;
use std::collections::BTreeMap;
use std::time::Duration;

/// What happened to one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorOutcome {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
    pub plan: Plan,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

impl TensorOutcome {
    /// True when the tensor was converted (dequantized and quantized again).
    pub fn converted(&self) -> bool {
        matches!(self.plan, Plan::Convert { .. })
    }

    /// The type the rules wanted, when the row length forced another one.
    pub fn fell_back_from(&self) -> Option<GgmlType> {
        match self.plan {
            Plan::Convert { to, wanted } if to != wanted => Some(wanted),
            _ => None,
        }
    }
}

/// The result of [`quantize_weights`](super::quantize_weights).
#[derive(Debug, Clone)]
pub struct QuantReport {
    /// The type asked for.
    pub target: GgmlType,
    /// One entry per tensor, in name order.
    pub tensors: Vec<TensorOutcome>,
    /// Wall time of the whole conversion.
    pub elapsed: Duration,
}

impl QuantReport {
    /// Bytes of all weights before.
    pub fn bytes_before(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_before).sum()
    }

    /// Bytes of all weights after.
    pub fn bytes_after(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_after).sum()
    }

    /// Tensors converted to another type.
    pub fn n_converted(&self) -> usize {
        self.tensors.iter().filter(|t| t.converted()).count()
    }

    /// Tensors left as they were (not weight matrices, or already of their type).
    pub fn n_kept(&self) -> usize {
        self.tensors.len() - self.n_converted()
    }

    /// Tensors whose rows did not fit the wanted type and got another.
    pub fn fallbacks(&self) -> impl Iterator<Item = &TensorOutcome> {
        self.tensors.iter().filter(|t| t.fell_back_from().is_some())
    }

    /// Tensor count per type before.
    pub fn types_before(&self) -> BTreeMap<&'static str, usize> {
        count(self.tensors.iter().map(|t| t.from))
    }

    /// Tensor count per type after.
    pub fn types_after(&self) -> BTreeMap<&'static str, usize> {
        count(self.tensors.iter().map(|t| t.to))
    }

    /// The type holding most bytes before (what the model "was": `F16`, `Q4_1`, ...).
    pub fn main_type_before(&self) -> Option<GgmlType> {
        let mut bytes: Vec<(GgmlType, u64)> = Vec::new();
        for t in &self.tensors {
            match bytes.iter_mut().find(|(ty, _)| *ty == t.from) {
                Some((_, b)) => *b += t.bytes_before,
                None => bytes.push((t.from, t.bytes_before)),
            }
        }
        bytes.into_iter().max_by_key(|&(_, b)| b).map(|(ty, _)| ty)
    }

    /// `60 tensors fell back: 59 Q4_K -> Q5_0, 1 Q6_K -> Q8_0 (rows not whole blocks)`, or
    /// `None` when nothing fell back.
    pub fn fallback_summary(&self) -> Option<String> {
        let mut pairs: BTreeMap<(&'static str, &'static str), usize> = BTreeMap::new();
        for t in self.fallbacks() {
            let wanted = t.fell_back_from().unwrap_or(t.to);
            *pairs.entry((wanted.name(), t.to.name())).or_insert(0) += 1;
        }
        if pairs.is_empty() {
            return None;
        }
        let total: usize = pairs.values().sum();
        let parts: Vec<String> = pairs
            .iter()
            .map(|((w, t), n)| format!("{n} {w} -> {t}"))
            .collect();
        Some(format!(
            "{total} tensor{} fell back: {} (their rows are not whole blocks of the wanted type, as llama.cpp does)",
            if total == 1 { "" } else { "s" },
            parts.join(", ")
        ))
    }

    /// `Q5_0: 12, Q8_0: 1, F32: 5`: the types after, most tensors first.
    pub fn types_after_summary(&self) -> String {
        let mut v: Vec<(&str, usize)> = self.types_after().into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(t, n)| format!("{t}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn count(types: impl Iterator<Item = GgmlType>) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for t in types {
        *m.entry(t.name()).or_insert(0) += 1;
    }
    m
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl std::fmt::Display for QuantReport {
    /// `quantized 211 tensors to Q4_K in 3.1 s: weights 540.2 MiB (F16) -> 151.3 MiB`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "quantized {} tensor{} to {} in {:.1} s: weights {}",
            self.n_converted(),
            if self.n_converted() == 1 { "" } else { "s" },
            self.target,
            self.elapsed.as_secs_f64(),
            mib(self.bytes_before()),
        )?;
        if let Some(ty) = self.main_type_before() {
            write!(f, " ({ty})")?;
        }
        write!(f, " -> {}", mib(self.bytes_after()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, from: GgmlType, plan: Plan, before: u64, after: u64) -> TensorOutcome {
        let to = match plan {
            Plan::Convert { to, .. } => to,
            _ => from,
        };
        TensorOutcome {
            name: name.into(),
            from,
            to,
            plan,
            bytes_before: before,
            bytes_after: after,
        }
    }

    #[test]
    fn summaries_add_up() {
        let r = QuantReport {
            target: GgmlType::Q4_K,
            tensors: vec![
                outcome("a", GgmlType::F16, Plan::KeepNotMatrix, 10, 10),
                outcome(
                    "b",
                    GgmlType::F16,
                    Plan::Convert {
                        to: GgmlType::Q4_K,
                        wanted: GgmlType::Q4_K,
                    },
                    2 << 20,
                    1 << 19,
                ),
                outcome(
                    "c",
                    GgmlType::F32,
                    Plan::Convert {
                        to: GgmlType::Q5_0,
                        wanted: GgmlType::Q4_K,
                    },
                    1 << 20,
                    1 << 18,
                ),
            ],
            elapsed: Duration::from_millis(1500),
        };
        assert_eq!(r.n_converted(), 2);
        assert_eq!(r.n_kept(), 1);
        assert_eq!(r.bytes_before(), (3 << 20) + 10);
        assert_eq!(r.main_type_before(), Some(GgmlType::F16));
        assert_eq!(r.types_before()["F16"], 2);
        assert_eq!(r.types_after()["Q5_0"], 1);
        assert_eq!(
            r.to_string(),
            "quantized 2 tensors to Q4_K in 1.5 s: weights 3.0 MiB (F16) -> 0.8 MiB"
        );
        let fb = r.fallback_summary().unwrap();
        assert!(fb.starts_with("1 tensor fell back: 1 Q4_K -> Q5_0"), "{fb}");
        assert_eq!(r.types_after_summary(), "F16: 1, Q4_K: 1, Q5_0: 1");
    }
}
