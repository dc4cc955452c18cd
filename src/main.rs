//! `reagent`: a thin command line over the library (see `cli`).

mod cli;

// Holds chat-template rendering (untrusted input from model files) to a memory budget.
#[global_allocator]
static ALLOC: reagent::limits::BudgetAllocator = reagent::limits::BudgetAllocator;

fn main() -> std::process::ExitCode {
    cli::main()
}
