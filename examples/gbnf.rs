//! The decision grammars of an eval task file written as GBNF, llama.cpp's grammar format (what
//! `--constraint gbnf` sends to llama.cpp's server): for each task, its native decision in the model's
//! call syntax (`ID.native.gbnf`) and its ReAct decision (`ID.react.gbnf`). Only the model's template and
//! tokenizer are read.
//!
//! ```sh
//! cargo run --release --example gbnf -- TASKS.jsonl OUT_DIR [MODEL]
//! ```

use reagent::agent::driver::gbnf;
use reagent::agent::native::{native_grammar, CallSyntax};
use reagent::{catalog, decision_schema, DecisionOptions, ToolChoice, ToolSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tasks, out, rest @ ..] = args.as_slice() else {
        eprintln!("usage: gbnf TASKS.jsonl OUT_DIR [MODEL]");
        std::process::exit(2);
    };
    let name = rest.first().map_or("qwen2.5-coder-0.5b", String::as_str);
    let path = catalog::resolve(&catalog::Catalog::builtin(), name, &catalog::FetchOptions::default())?;
    let (tok, template, _) = reagent::text::template_of_file(&path)?;
    let syntax = CallSyntax::of(&template, &tok);
    std::fs::create_dir_all(out)?;
    let opts = DecisionOptions::default().parallel_calls(Some(4));
    let tasks = reagent::eval::load_tasks(std::path::Path::new(tasks))?;
    for t in &tasks {
        let specs = t.functions.iter().map(ToolSpec::from_function_json).collect::<reagent::Result<Vec<_>>>()?;
        let react = decision_schema(&specs, &ToolChoice::Auto, &opts)?;
        std::fs::write(format!("{out}/{}.react.gbnf", t.id), gbnf::schema(&react)?)?;
        if let Some(syntax) = &syntax {
            let lark = native_grammar(&specs, &ToolChoice::Auto, &opts, syntax)?;
            std::fs::write(format!("{out}/{}.native.gbnf", t.id), gbnf::lark(&lark, &tok)?)?;
        }
    }
    println!("{} tasks written to {out}", tasks.len());
    Ok(())
}
