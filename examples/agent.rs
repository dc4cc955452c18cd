//! The README's library example, as a program (a test checks that the two say the same):
//!
//! ```sh
//! cargo run --release --example agent
//! ```

use reagent::agent::Agent;
use reagent::tools::{builtin_tools, BuiltinOptions};
use reagent::{catalog, LoadOptions, Model};

fn main() -> reagent::Result<()> {
    let path = catalog::resolve(&catalog::Catalog::builtin(), "qwen2.5-coder-0.5b", &Default::default())?;
    let model = Model::load(&path, &LoadOptions::default())?;
    let mut agent = Agent::builder().model(model)?.tools(builtin_tools(&BuiltinOptions::default())?).build()?;
    let transcript = agent.run("What is 37 * 43 + 12?")?; // steps, final answer, stop reason, stats
    println!("{}", transcript.final_answer.as_deref().unwrap_or("(no answer)"));
    Ok(())
}
