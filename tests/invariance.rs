//! Batch invariance: a token's logits and KV entries are the same bits however the tokens were batched —
//! alone, in decode-sized batches, in prompt chunks of any size starting at any offset, after a prefix
//! loaded from a saved copy (the prompt cache) or kept after a rollback. So no answer depends on what a
//! cache held or on how a conversation was split into calls.
//!
//! Each architecture's tiny model and a llama of every kernel weight type run on the best tier here; the
//! same tests run again in child processes under every other tier this CPU has (`REAGENT_KERNELS`).

mod common;

use common::{scratch, tiny_model, ARCHS};
use reagent::model::kernels::{Tier, KERNEL_TYPES};
use reagent::model::tiny::{write_tiny_gguf, TinySpec};
use reagent::model::{Arch, LanguageModel};
use reagent::{LoadOptions, Model};

/// Prompt splits, as the issue of record names them: chunk sizes and where the chunks start.
const SPLITS: [usize; 6] = [1, 2, 7, 16, 64, 512];
const OFFSETS: [usize; 3] = [0, 1, 63];

/// Set in the child processes of [`every_tier_is_batch_invariant`], which must not start more.
const CHILD: &str = "REAGENT_INVARIANCE_CHILD";

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A token sequence of `n` ids in `20..vocab` (the tiny vocabularies start with control tokens).
fn sequence(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| (20 + (i * 7919 + i / 3) % (vocab - 20)) as u32).collect()
}

/// Every position's logits, one token at a time: the reference every split must give.
fn one_at_a_time(model: &mut Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    model.truncate(0);
    tokens.iter().enumerate().map(|(i, &t)| model.forward(&[t], i).unwrap()).collect()
}

/// Prefills `tokens` in every split and through every cache path, checking each pass's last logits (and
/// so every KV entry before it) against `reference`.
fn check(model: &mut Model, tokens: &[u32], label: &str) {
    let reference = one_at_a_time(model, tokens);
    let n = tokens.len();
    for split in SPLITS {
        for offset in OFFSETS.into_iter().filter(|&o| o < n) {
            model.truncate(0);
            let mut pos = 0;
            if offset > 0 {
                let l = model.forward(&tokens[..offset], 0).unwrap();
                assert!(same_bits(&l, &reference[offset - 1]), "{label}: the first {offset} tokens in one batch");
                pos = offset;
            }
            for chunk in tokens[offset..].chunks(split) {
                let l = model.forward(chunk, pos).unwrap();
                pos += chunk.len();
                assert!(
                    same_bits(&l, &reference[pos - 1]),
                    "{label}: chunks of {split} from offset {offset}: position {} differs",
                    pos - 1
                );
            }
        }
    }

    // Every position's logits of a batch (speculation's verification pass), past the first pass.
    let (at, len) = (n / 3, (n / 2).min(40));
    model.truncate(0);
    model.forward(&tokens[..at], 0).unwrap();
    let all = model.forward_all(&tokens[at..at + len], at).unwrap();
    let vocab = reference[0].len();
    for (i, row) in all.chunks_exact(vocab).enumerate() {
        assert!(same_bits(row, &reference[at + i]), "{label}: forward_all's row {i} (position {})", at + i);
    }

    // A saved prefix (the prompt cache's KV copy), computed in one batch, loaded into a cache that then
    // goes on in another split.
    let cut = n / 2 + 3;
    model.truncate(0);
    model.forward(&tokens[..cut], 0).unwrap();
    let prefix = model.export_prefix(cut).expect("a model on the CPU exports its KV");
    model.truncate(0);
    model.forward(&tokens[..5], 0).unwrap();
    model.import_prefix(&prefix).unwrap();
    let l = model.forward(&tokens[cut..], cut).unwrap();
    assert!(same_bits(&l, &reference[n - 1]), "{label}: after a loaded prefix of {cut}");

    // A rollback (a failed attempt, the agent's next step) and the rest in one batch.
    model.truncate(cut - 9);
    let l = model.forward(&tokens[cut - 9..], cut - 9).unwrap();
    assert!(same_bits(&l, &reference[n - 1]), "{label}: after a rollback to {}", cut - 9);
}

#[test]
fn tiny_models_are_batch_invariant() {
    for arch in ARCHS {
        let mut model = tiny_model(arch);
        let vocab = model.vocab_size();
        let n = 150.min(model.context_length());
        check(&mut model, &sequence(n, vocab), &format!("{arch:?} on {}", Tier::best().name()));
    }
}

/// Every weight type the kernels take (the K-quants need rows of 256), in a llama of one type.
#[test]
fn every_kernel_type_is_batch_invariant() {
    for ty in KERNEL_TYPES {
        let spec = TinySpec { dim: 256, ffn: 512, weight_type: ty, ..TinySpec::new(Arch::Llama) };
        let path = scratch().join(format!("tiny-invariant-{ty:?}.gguf"));
        write_tiny_gguf(&path, &spec).unwrap();
        let mut model = Model::load(&path, &LoadOptions::default()).unwrap();
        let vocab = model.vocab_size();
        check(&mut model, &sequence(100, vocab), &format!("{ty:?} on {}", Tier::best().name()));
    }
}

/// The tests above under every other tier this CPU has, each in a child process (the tier is chosen once
/// per process).
#[test]
fn every_tier_is_batch_invariant() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for tier in Tier::supported().into_iter().filter(|&t| t != Tier::best()) {
        for test in ["tiny_models_are_batch_invariant", "every_kernel_type_is_batch_invariant"] {
            let out = std::process::Command::new(&exe)
                .args(["--exact", test, "--test-threads", "1"])
                .env(CHILD, "1")
                .env("REAGENT_KERNELS", tier.name())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{test} under REAGENT_KERNELS={}:\n{}{}",
                tier.name(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The default model, in `.ci/run`: a prompt of a real tokenizer's ids through the same splits.
#[test]
#[cfg_attr(
    not(reagent_test_qwen),
    ignore = "needs qwen2.5-coder-0.5b: build the tests with REAGENT_TEST_MODELS=qwen2.5-coder-0.5b (or all)"
)]
fn qwen_is_batch_invariant() {
    let path = common::require_model("qwen2.5-coder-0.5b");
    let mut model = Model::load(&path, &LoadOptions::default()).unwrap();
    let text = "You are a helpful assistant. Answer the question about the files under the root, calling a \
                tool when one is needed. Which port does the server use according to config/settings.ini? \
                The settings file holds the port, the host and the log level of the service, one per line.";
    let mut tokens = model.tokenizer().encode(text, false).unwrap();
    tokens.truncate(80);
    check(&mut model, &tokens, &format!("qwen2.5-coder-0.5b on {}", Tier::best().name()));
}

/// A run resumed from its trace decides as the uninterrupted run did: the resumed run computes the
/// recorded conversation in one prompt, the uninterrupted one step by step with each step's KV kept; with
/// batch invariance both see the same numbers.
#[test]
fn a_resumed_run_on_the_test_model_decides_as_the_uninterrupted_one() {
    use reagent::agent::{read_trace, Agent, EventLog, ModelDriver};
    use reagent::tools::{builtin_tools, BuiltinOptions};

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("numbers.txt"), "12\n7\n30\n41\n").unwrap();
    let task = "Read numbers.txt, then compute 12 * 7 + 30 with the calculator.";
    let agent = |log: Option<EventLog>| {
        let model = Model::load(common::real_model_path("smollm2-135m"), &LoadOptions::default()).unwrap();
        let driver = ModelDriver::constrained(model, reagent::Sampling::Greedy, 0).unwrap();
        let tools = builtin_tools(&BuiltinOptions::default().root(dir.path().to_path_buf())).unwrap();
        let config = reagent::AgentConfig::default().max_steps(4);
        let mut b = Agent::builder().driver(driver).tools(tools).config(config);
        if let Some(log) = log {
            b = b.events(log);
        }
        b.build().unwrap()
    };
    let trace = dir.path().join("trace.jsonl");
    let whole = agent(Some(EventLog::create(&trace).unwrap())).run(task).unwrap();
    assert!(whole.steps.len() >= 2, "the run needs two steps to cut between: {whole:#?}");
    let recorded = read_trace(&trace).unwrap();
    for cut in 1..whole.steps.len() {
        let steps = recorded.steps[..cut].to_vec();
        let resumed = agent(None).resume(&[reagent::ChatMessage::user(task)], steps).unwrap();
        let decisions = |t: &reagent::Transcript| t.steps.iter().map(|s| s.decision.clone()).collect::<Vec<_>>();
        assert_eq!(decisions(&resumed), decisions(&whole), "resumed after step {cut}");
        assert_eq!(resumed.final_answer, whole.final_answer, "resumed after step {cut}");
    }
}
