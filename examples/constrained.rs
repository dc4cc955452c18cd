//! Generation constrained by a JSON schema: whatever the model writes parses and validates.
//!
//! ```sh
//! cargo run --release --example constrained -- [MODEL]
//! ```

use reagent::{catalog, ChatMessage, GenerateParams, Grammar, Input, LoadOptions, Model, Sampling};
use serde_json::json;

fn main() -> reagent::Result<()> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "smollm2-135m".into());
    let path = catalog::resolve(&catalog::Catalog::builtin(), &name, &catalog::FetchOptions::default())?;
    let mut model = Model::load(&path, &LoadOptions::default())?;
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "population_millions": {"type": "number"}
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": false
    });
    let messages = [ChatMessage::user("Describe the capital of France as JSON.")];
    let params = GenerateParams::default().max_tokens(96).sampling(Sampling::Greedy);
    let grammar = Grammar::JsonSchema(schema);
    let out = model.generate(Input::chat(&messages).grammar(&grammar), &params, &mut |_| {})?;
    let value: serde_json::Value = serde_json::from_str(&out.text).expect("the grammar makes it JSON");
    println!("{value}");
    Ok(())
}
