//! Dumps tensors of a model as Pagoda loads them (canonical names, dequantized to f32) and the
//! token ids of a text, as JSON, for comparisons against references:
//! `cargo run --example weights_dump -- MODEL 'blk.0.attn_q.weight,...' ['text to encode']`.
//! Prints `{"tensors": {name: {"type", "shape", "values" (flat, row-major)}}, "ids": [...]}`.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(3..=4).contains(&args.len()) {
        eprintln!("usage: weights_dump MODEL NAME[,NAME...] [TEXT]");
        std::process::exit(2);
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let src = pagoda_model::open_model(std::path::Path::new(&args[1]))?;
        let mut tensors = serde_json::Map::new();
        for name in args[2].split(',').filter(|n| !n.is_empty()) {
            let view = src.weights.get(name)?;
            tensors.insert(
                name.to_string(),
                serde_json::json!({
                    "type": view.ty.to_string(),
                    "shape": view.shape,
                    "values": view.to_f32()?,
                }),
            );
        }
        let ids = match args.get(3) {
            Some(text) => src.tokenizer.encode(text, false)?,
            None => Vec::new(),
        };
        println!("{}", serde_json::json!({"tensors": tensors, "ids": ids}));
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
