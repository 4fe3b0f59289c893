//! Dumps the logits of every position for a token id list as JSON (debugging against
//! references): `cargo run --example logits -- MODEL '[1,2,3]' > out.json`.
use pagoda_model::arch::{Logits, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: logits MODEL JSON_IDS");
        std::process::exit(2);
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let src = pagoda_model::open_model(std::path::Path::new(&args[1]))?;
        let ids: Vec<u32> = serde_json::from_str(&args[2])?;
        let model = Model::from_source(&src)?;
        let mut cache = model.new_cache(ids.len());
        let logits = model.forward(&ids, 0, &mut cache, Logits::All)?;
        let v = model.config().vocab_size;
        let rows: Vec<&[f32]> = logits.chunks(v).collect();
        println!("{}", serde_json::to_string(&rows)?);
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
