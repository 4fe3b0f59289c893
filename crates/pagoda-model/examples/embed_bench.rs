//! Embedding throughput of an [`EmbeddingModel`]: `cargo run --release --example embed_bench
//! -- DIR [TEXTS]` embeds TEXTS (default 256) sentences of about 12, 40 and 200 tokens in
//! batches of 32 and prints texts/s and tokens/s for each length.
use pagoda_model::EmbeddingModel;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: embed_bench DIR [TEXTS]");
        std::process::exit(2);
    };
    let n: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
        .max(1);
    let m = match EmbeddingModel::load(std::path::Path::new(&dir)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let sentence = "The pagoda stands above the old temple garden by the river. ";
    for repeat in [1usize, 4, 18] {
        let text = sentence.repeat(repeat);
        let texts: Vec<&str> = vec![text.as_str(); n];
        // Warm-up (page in the weights).
        if let Err(e) = m.embed(&texts[..1]) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        let t = Instant::now();
        let mut tokens = 0;
        for batch in texts.chunks(32) {
            match m.embed(batch) {
                Ok(out) => tokens += out.iter().map(|e| e.tokens).sum::<usize>(),
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(1);
                }
            }
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{:>4} tokens/text: {:>8.1} texts/s {:>9.0} tokens/s ({n} texts in {s:.2} s, {} threads)",
            tokens / n,
            n as f64 / s,
            tokens as f64 / s,
            rayon::current_num_threads()
        );
    }
}
