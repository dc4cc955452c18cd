//! `reagent`: a thin command line over the library (see `cli`).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
