//! Prints a chat rendering and its tokens: `cargo run --example chat_tokens -- MODEL "question"`.
use pagoda_model::chat_template::ChatMessage;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: chat_tokens MODEL QUESTION");
        std::process::exit(2);
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let src = pagoda_model::open_model(std::path::Path::new(&args[1]))?;
        let text = src
            .chat_template_or_default()
            .render(&[ChatMessage::new("user", args[2].clone())], true)?;
        println!("{text:?}");
        let ids = src.tokenizer.encode(&text, true)?;
        println!("{ids:?}");
        for id in ids {
            print!("{:?} ", src.tokenizer.id_to_token(id).unwrap_or_default());
        }
        println!();
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
