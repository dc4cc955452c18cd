//! A chat answer streamed from a catalog model (fetched on first use).
//!
//! ```sh
//! cargo run --release --example generate -- [MODEL] ["QUESTION"]
//! ```

use std::io::Write;

use reagent::{catalog, ChatMessage, GenerateParams, LoadOptions, Model, Sampling};

fn main() -> reagent::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let question = args.next().unwrap_or_else(|| "What is the capital of France?".into());
    let path = catalog::resolve(&catalog::Catalog::builtin(), &name, &catalog::FetchOptions::default())?;
    let mut model = Model::load(&path, &LoadOptions::default())?;
    let params = GenerateParams::default().max_tokens(128).sampling(Sampling::Greedy);
    let out = model.generate(&[ChatMessage::user(question)], &params, &mut |text| {
        print!("{text}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!("[{} tokens at {:.1} tok/s; stop: {:?}]", out.stats.generated_tokens, out.stats.decode_tok_s(), out.stop);
    Ok(())
}
