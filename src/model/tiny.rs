//! Tiny random-weight GGUF files, written on the spot, for hermetic tests and benches.
//!
//! Each architecture reagent supports gets a file with the real tensor names, metadata keys and a small
//! but real tokenizer (byte-level BPE for llama/qwen2 with a few merges and special tokens, a
//! SentencePiece-style vocabulary with scores and byte fallback for gemma3), so loading, tokenization,
//! chat templates, the forward pass and the KV cache can all be exercised without a download.
//! Weights come from a fixed-seed generator: the same call always writes the same bytes.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::Arch;
use crate::error::{Error, Result};

/// Shape of a tiny model.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub arch: Arch,
    pub layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: usize,
    /// Quantization of the large matrices (the embedding is always Q8_0, norms F32).
    pub weight_type: GgmlDType,
    pub seed: u64,
    /// Metadata entries that replace (by key) or add to the file's own: damaged files for tests.
    pub metadata: Vec<(String, Value)>,
    /// A thinking model (BPE vocabularies): `<think>` and `</think>` tokens, and a template that thinks
    /// unless `enable_thinking` is false, as Qwen 3's.
    pub thinking: bool,
    /// Tokens added at the end of the vocabulary, each with its GGUF token type (3: control, 4:
    /// user-defined): another family's call markers, for one.
    pub extra_tokens: Vec<(String, i32)>,
}

impl TinySpec {
    /// A two-layer model of the given architecture: 64 wide, 4 heads over 2 KV heads.
    pub fn new(arch: Arch) -> Self {
        Self {
            arch,
            layers: 2,
            dim: 64,
            ffn: 128,
            heads: 4,
            kv_heads: 2,
            context: 256,
            weight_type: GgmlDType::Q8_0,
            seed: 7,
            metadata: Vec::new(),
            thinking: false,
            extra_tokens: Vec::new(),
        }
    }
}

/// Merges of the tiny BPE vocabulary, in rank order; each result is also a token.
pub const TINY_MERGES: &[(&str, &str)] = &[
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("o", "r"),
    ("\u{120}", "w"),
    ("\u{120}w", "or"),
    ("l", "d"),
    ("\u{120}wor", "ld"),
];

/// Control tokens of the tiny BPE vocabulary (after the 256 byte tokens and the merges).
pub const TINY_BPE_CONTROL: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// User-defined tokens (always parsed, like Qwen's call markers).
pub const TINY_BPE_USER: &[&str] = &["<tool_call>", "</tool_call>"];

/// Qwen 3's template, reduced to its thinking switch.
const CHATML_THINKING: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}\
{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}";

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + \
'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's printable stand-in for each byte.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid char")
}

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    scores: Option<Vec<f32>>,
    merges: Option<Vec<String>>,
    meta: Vec<(String, Value)>,
}

fn bpe_vocab(pre: &str) -> Vocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    for (a, b) in TINY_MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(1);
    }
    for t in TINY_BPE_CONTROL {
        tokens.push(t.to_string());
        types.push(3);
    }
    for t in TINY_BPE_USER {
        tokens.push(t.to_string());
        types.push(4);
    }
    let id = |t: &str| tokens.iter().position(|x| x == t).expect("token exists") as u32;
    let meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(id("<|im_start|>"))),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(id("<|im_end|>"))),
        ("tokenizer.ggml.add_bos_token".to_string(), Value::Bool(false)),
        ("tokenizer.chat_template".to_string(), Value::String(CHATML.into())),
    ];
    let merges = TINY_MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    Vocab { tokens, types, scores: None, merges: Some(merges), meta }
}

/// Pieces of the tiny SentencePiece vocabulary with their scores (higher merges first).
pub const TINY_SPM_PIECES: &[(&str, f32)] = &[
    ("\u{2581}", -1.0),
    ("h", -2.0),
    ("e", -2.0),
    ("l", -2.0),
    ("o", -2.0),
    ("w", -2.0),
    ("r", -2.0),
    ("d", -2.0),
    ("he", -3.0),
    ("ll", -3.5),
    ("hell", -4.0),
    ("hello", -4.5),
    ("\u{2581}w", -5.0),
    ("or", -5.0),
    ("\u{2581}wor", -6.0),
    ("ld", -6.0),
    ("\u{2581}world", -7.0),
];

fn spm_vocab() -> Vocab {
    let mut tokens = vec!["<pad>".to_string(), "<eos>".into(), "<bos>".into(), "<unk>".into()];
    let mut types = vec![3, 3, 3, 2];
    let mut scores = vec![0.0; 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in TINY_SPM_PIECES {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
    for t in ["<start_of_turn>", "<end_of_turn>"] {
        tokens.push(t.to_string());
        types.push(3);
        scores.push(0.0);
    }
    let meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("llama".into())),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".to_string(), Value::U32(3)),
        ("tokenizer.ggml.add_bos_token".to_string(), Value::Bool(true)),
        ("tokenizer.ggml.add_space_prefix".to_string(), Value::Bool(false)),
    ];
    Vocab { tokens, types, scores: Some(scores), merges: None, meta }
}

/// A deterministic stream of values in [-1, 1) (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32, ty: GgmlDType) -> Result<QTensor> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| self.next() * scale).collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
        Ok(QTensor::quantize(&t, ty)?)
    }

    fn norm(&mut self, dim: usize) -> Result<QTensor> {
        let data: Vec<f32> = (0..dim).map(|_| 1.0 + 0.1 * self.next()).collect();
        Ok(QTensor::quantize(&Tensor::from_vec(data, dim, &Device::Cpu)?, GgmlDType::F32)?)
    }
}

/// Writes a tiny model of `spec` to `path`.
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec) -> Result<()> {
    let arch = spec.arch.as_str();
    let vocab = match spec.arch {
        Arch::Llama | Arch::SmolLM3 | Arch::Phi3 => bpe_vocab("smollm"),
        Arch::Qwen2 | Arch::Qwen3 => bpe_vocab("qwen2"),
        Arch::Gemma3 => spm_vocab(),
    };
    let mut vocab = vocab;
    if spec.thinking {
        for t in ["<think>", "</think>"] {
            vocab.tokens.push(t.into());
            vocab.types.push(4);
        }
        if let Some(m) = vocab.meta.iter_mut().find(|(k, _)| k == "tokenizer.chat_template") {
            m.1 = Value::String(CHATML_THINKING.into());
        }
    }
    for (t, kind) in &spec.extra_tokens {
        vocab.tokens.push(t.clone());
        vocab.types.push(*kind);
    }
    let head_dim = spec.dim / spec.heads;
    // Phi 3 rotates three quarters of each head (Phi-4-mini: 96 of 128).
    let rope_dims = if spec.arch == Arch::Phi3 { head_dim * 3 / 4 / 2 * 2 } else { head_dim };
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(format!("tiny-{arch}"))),
        (k("block_count"), Value::U32(spec.layers as u32)),
        (k("context_length"), Value::U32(spec.context as u32)),
        (k("embedding_length"), Value::U32(spec.dim as u32)),
        (k("feed_forward_length"), Value::U32(spec.ffn as u32)),
        (k("attention.head_count"), Value::U32(spec.heads as u32)),
        (k("attention.head_count_kv"), Value::U32(spec.kv_heads as u32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("rope.freq_base"), Value::F32(10_000.0)),
        (k("rope.dimension_count"), Value::U32(rope_dims as u32)),
    ];
    if spec.arch == Arch::Phi3 {
        // LongRoPE: trained at a quarter of the context, so the long factors apply at full context.
        meta.push((k("rope.scaling.original_context_length"), Value::U32((spec.context / 4).max(1) as u32)));
        meta.push((k("rope.scaling.attn_factor"), Value::F32(1.19)));
    }
    if spec.arch == Arch::Gemma3 {
        meta.push((k("attention.key_length"), Value::U32(head_dim as u32)));
        meta.push((k("attention.value_length"), Value::U32(head_dim as u32)));
        meta.push((k("attention.sliding_window"), Value::U32(8)));
    }
    meta.extend(vocab.meta);
    meta.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(vocab.tokens.iter().cloned().map(Value::String).collect()),
    ));
    meta.push(("tokenizer.ggml.token_type".into(), Value::Array(vocab.types.iter().map(|&t| Value::I32(t)).collect())));
    if let Some(s) = vocab.scores {
        meta.push(("tokenizer.ggml.scores".into(), Value::Array(s.into_iter().map(Value::F32).collect())));
    }
    if let Some(m) = vocab.merges {
        meta.push(("tokenizer.ggml.merges".into(), Value::Array(m.into_iter().map(Value::String).collect())));
    }
    for (key, value) in &spec.metadata {
        match meta.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.clone(),
            None => meta.push((key.clone(), value.clone())),
        }
    }

    let n_vocab = vocab.tokens.len();
    let (d, f, q_out, kv_out) = (spec.dim, spec.ffn, spec.heads * head_dim, spec.kv_heads * head_dim);
    let wt = spec.weight_type;
    let mut rng = Rng(spec.seed);
    let mut tensors: Vec<(String, QTensor)> =
        vec![("token_embd.weight".into(), rng.tensor(&[n_vocab, d], 1.0, GgmlDType::Q8_0)?)];
    let s = 1.0 / (d as f32).sqrt();
    for i in 0..spec.layers {
        let p = |n: &str| format!("blk.{i}.{n}");
        tensors.push((p("attn_norm.weight"), rng.norm(d)?));
        if spec.arch == Arch::Phi3 {
            tensors.push((p("attn_qkv.weight"), rng.tensor(&[q_out + 2 * kv_out, d], s, wt)?));
        } else {
            tensors.push((p("attn_q.weight"), rng.tensor(&[q_out, d], s, wt)?));
            tensors.push((p("attn_k.weight"), rng.tensor(&[kv_out, d], s, wt)?));
            tensors.push((p("attn_v.weight"), rng.tensor(&[kv_out, d], s, wt)?));
        }
        tensors.push((p("attn_output.weight"), rng.tensor(&[d, q_out], s, wt)?));
        if spec.arch == Arch::Qwen2 {
            tensors.push((p("attn_q.bias"), rng.tensor(&[q_out], 0.1, GgmlDType::F32)?));
            tensors.push((p("attn_k.bias"), rng.tensor(&[kv_out], 0.1, GgmlDType::F32)?));
            tensors.push((p("attn_v.bias"), rng.tensor(&[kv_out], 0.1, GgmlDType::F32)?));
        }
        if spec.arch == Arch::Qwen3 {
            tensors.push((p("attn_q_norm.weight"), rng.norm(head_dim)?));
            tensors.push((p("attn_k_norm.weight"), rng.norm(head_dim)?));
        }
        if spec.arch == Arch::Gemma3 {
            tensors.push((p("attn_q_norm.weight"), rng.norm(head_dim)?));
            tensors.push((p("attn_k_norm.weight"), rng.norm(head_dim)?));
            tensors.push((p("post_attention_norm.weight"), rng.norm(d)?));
            tensors.push((p("post_ffw_norm.weight"), rng.norm(d)?));
        }
        tensors.push((p("ffn_norm.weight"), rng.norm(d)?));
        if spec.arch == Arch::Phi3 {
            tensors.push((p("ffn_up.weight"), rng.tensor(&[2 * f, d], s, wt)?));
        } else {
            tensors.push((p("ffn_gate.weight"), rng.tensor(&[f, d], s, wt)?));
            tensors.push((p("ffn_up.weight"), rng.tensor(&[f, d], s, wt)?));
        }
        tensors.push((p("ffn_down.weight"), rng.tensor(&[d, f], 1.0 / (f as f32).sqrt(), wt)?));
    }
    if spec.arch == Arch::Phi3 {
        // Short factors near 1, long ones growing to 20 (slower rotations at long range).
        let long: Vec<f32> = (0..rope_dims / 2).map(|i| 1.0 + 19.0 * i as f32 / (rope_dims / 2) as f32).collect();
        let long = QTensor::quantize(&Tensor::from_vec(long, rope_dims / 2, &Device::Cpu)?, GgmlDType::F32)?;
        tensors.push(("rope_factors_short.weight".into(), rng.norm(rope_dims / 2)?));
        tensors.push(("rope_factors_long.weight".into(), long));
    }
    tensors.push(("output_norm.weight".into(), rng.norm(d)?));
    if matches!(spec.arch, Arch::Qwen2 | Arch::Qwen3) {
        tensors.push(("output.weight".into(), rng.tensor(&[n_vocab, d], s, GgmlDType::Q8_0)?));
    }

    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| Error::io(path, e))?);
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    std::io::Write::flush(&mut file).map_err(|e| Error::io(path, e))?;
    Ok(())
}
