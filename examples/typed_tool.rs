//! An agent with one typed Rust tool: the arguments are a struct (its JSON schema derived with
//! schemars, so the decision grammar constrains them), the result any serializable value.
//!
//! ```sh
//! cargo run --release --example typed_tool -- [MODEL] ["TASK"]
//! ```

use reagent::agent::{Agent, AgentEvent, FirstCall};
use reagent::tools::TypedTool;
use reagent::{catalog, LoadOptions, Model};

/// The tool's arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Convert {
    /// The temperature in degrees Celsius.
    celsius: f64,
}

fn main() -> reagent::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let task = args.next().unwrap_or_else(|| "What is 21.5 degrees Celsius in Fahrenheit?".into());
    let to_fahrenheit = TypedTool::new("to_fahrenheit", "Converts degrees Celsius to Fahrenheit.", |a: Convert| {
        if a.celsius < -273.15 {
            return Err(format!("{} °C is below absolute zero", a.celsius));
        }
        Ok(a.celsius * 9.0 / 5.0 + 32.0)
    })?;
    let path = catalog::resolve(&catalog::Catalog::builtin(), &name, &catalog::FetchOptions::default())?;
    let mut agent = Agent::builder()
        .model(Model::load(&path, &LoadOptions::default())?)?
        .tool(to_fahrenheit)
        // The catalog's settings for the model apply. One number is no arithmetic to compute, so by
        // default the model may answer from memory what the tool gets right: make the first decision a call.
        .first_call(FirstCall::Always)
        .max_steps(4)
        .events(|e: &AgentEvent| match e {
            AgentEvent::ToolCallCompleted { call, outcome, .. } => {
                eprintln!("{} {} → {}", call.tool, call.args, outcome.observation())
            }
            AgentEvent::FinalAnswer { answer, .. } => eprintln!("answer: {answer}"),
            _ => {}
        })
        .build()?;
    let transcript = agent.run(&task)?;
    println!("{}", transcript.final_answer.as_deref().unwrap_or("(no answer)"));
    Ok(())
}
