//! Redraws a size-against-perplexity plot (`pagoda eval report --plot`, `pagoda compress`'s
//! `report.svg`) from the points an earlier plot holds, with the current layout: each point's
//! `<title>NAME: X MiB, perplexity Y</title>` is read back (the first is the baseline) and
//! drawn again by [`Report::svg`]. For the committed plots in docs/img, whose models are not
//! at hand to measure again.
//!
//! Usage: `cargo run -p pagoda-compress --example replot_size_ppl -- IN.svg OUT.svg`
//! (IN and OUT may be the same file).

use pagoda_compress::eval::report::{Report, VariantRow};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = &args[..] else {
        return Err("usage: replot_size_ppl IN.svg OUT.svg".into());
    };
    let text = std::fs::read_to_string(input)?;
    let mut rows = Vec::new();
    for part in text.split("<title>").skip(1) {
        let Some(title) = part.split("</title>").next() else {
            continue;
        };
        // NAME: X MiB, perplexity Y (NAME may hold colons: split at the last ": ").
        let Some((name, figures)) = title.rsplit_once(": ") else {
            continue;
        };
        let Some((mib, ppl)) = figures.split_once(" MiB, perplexity ") else {
            continue;
        };
        let (mib, ppl): (f64, f64) = (mib.parse()?, ppl.parse()?);
        let name = name
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&amp;", "&");
        let weight_bytes = (mib * 1_048_576.0).round() as u64;
        rows.push(VariantRow {
            name: name.clone(),
            model: name,
            quantize: None,
            file_bytes: weight_bytes,
            weight_bytes,
            parameters: 1,
            bits_per_weight: 0.0,
            peak_rss_bytes: 0,
            load_seconds: 0.0,
            prefill_tokens: 0,
            prefill_tps: 0.0,
            decode_tokens: 0,
            decode_tps: 0.0,
            perplexity: Some(ppl),
            mc_acc: None,
            mc_acc_norm: None,
            gsm8k: None,
        });
    }
    if rows.is_empty() {
        return Err(format!("{input}: no point titles (NAME: X MiB, perplexity Y)").into());
    }
    let n = rows.len();
    let svg = Report::new(rows)?.svg()?;
    pagoda_svg::check(&svg).map_err(|p| p.join("; "))?;
    std::fs::write(output, svg)?;
    eprintln!("{output}: {n} points redrawn from {input}");
    Ok(())
}
