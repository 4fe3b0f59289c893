//! Prints the parsed config of a model file or folder: `cargo run --example inspect -- PATH`.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: inspect PATH");
        std::process::exit(2);
    };
    match pagoda_model::open_model(std::path::Path::new(&path)) {
        Ok(src) => println!("{:#?}\n{:#?}", src.config, src.info),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
