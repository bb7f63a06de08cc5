//! Llama-architecture GGUF files with seeded random weights, and a matching tokenizer.
//!
//! [`write_gguf`] writes every tensor and metadata key that
//! `candle_transformers::models::quantized_llama::ModelWeights::from_gguf` reads, through
//! Candle's own `gguf_file::write` and `QTensor::quantize` (so the blocks are Candle's CPU
//! quantization of the random weights). Weights are uniform in `±1/sqrt(cols)` (activations
//! keep their scale through the layers), norm weights `1 ± 0.1`, stored `f32` as real
//! files do; the values depend only on the seed and the tensor's name.
//! [`write_tokenizer`] makes a byte-level BPE `tokenizer.json` with the `tokenizers` crate
//! whose vocabulary is exactly the model's. [`load`] reads a file back with clear errors.
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use std::path::Path;

/// Errors of this crate: a message naming the file and what is wrong.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error(format!("{}: {what}", path.display()))
}

/// The sizes of a llama model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaShape {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
}

impl LlamaShape {
    /// A test model: 2 layers, hidden 256 (one k-quant super-block), vocabulary 512.
    pub const TINY: LlamaShape = LlamaShape { vocab: 512, hidden: 256, intermediate: 512, layers: 2, heads: 4, kv_heads: 2, context: 512, rope_theta: 10000.0, rms_eps: 1e-5 };
    /// Llama 3.2 1B's sizes.
    pub const LLAMA_1B: LlamaShape = LlamaShape { vocab: 128256, hidden: 2048, intermediate: 8192, layers: 16, heads: 32, kv_heads: 8, context: 4096, rope_theta: 500000.0, rms_eps: 1e-5 };
    /// Llama 3.1 8B's sizes.
    pub const LLAMA_8B: LlamaShape = LlamaShape { vocab: 128256, hidden: 4096, intermediate: 14336, layers: 32, heads: 32, kv_heads: 8, context: 4096, rope_theta: 500000.0, rms_eps: 1e-5 };

    /// `tiny`, `1b` or `8b`.
    pub fn by_name(name: &str) -> Option<LlamaShape> {
        match name {
            "tiny" => Some(Self::TINY),
            "1b" => Some(Self::LLAMA_1B),
            "8b" => Some(Self::LLAMA_8B),
            _ => None,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Every tensor: GGUF name, `(rows, cols)` (a weight matrix is `(out, in)`), and whether it
    /// is a norm weight (stored `f32`, one row).
    pub fn tensors(&self) -> Vec<(String, (usize, usize), bool)> {
        let (h, kv) = (self.hidden, self.kv_heads * self.head_dim());
        let mut v = vec![("token_embd.weight".to_string(), (self.vocab, h), false)];
        for l in 0..self.layers {
            let p = format!("blk.{l}");
            v.push((format!("{p}.attn_norm.weight"), (1, h), true));
            v.push((format!("{p}.attn_q.weight"), (h, h), false));
            v.push((format!("{p}.attn_k.weight"), (kv, h), false));
            v.push((format!("{p}.attn_v.weight"), (kv, h), false));
            v.push((format!("{p}.attn_output.weight"), (h, h), false));
            v.push((format!("{p}.ffn_norm.weight"), (1, h), true));
            v.push((format!("{p}.ffn_gate.weight"), (self.intermediate, h), false));
            v.push((format!("{p}.ffn_up.weight"), (self.intermediate, h), false));
            v.push((format!("{p}.ffn_down.weight"), (h, self.intermediate), false));
        }
        v.push(("output_norm.weight".to_string(), (1, h), true));
        v.push(("output.weight".to_string(), (self.vocab, h), false));
        v
    }
}

/// GGML types the tool writes, by name: `f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2k q3k q4k
/// q5k q6k` (`q4_k` spellings too).
pub fn parse_type(name: &str) -> Option<GgmlDType> {
    Some(match name.to_ascii_lowercase().replace('_', "").as_str() {
        "f32" => GgmlDType::F32,
        "f16" => GgmlDType::F16,
        "bf16" => GgmlDType::BF16,
        "q40" => GgmlDType::Q4_0,
        "q41" => GgmlDType::Q4_1,
        "q50" => GgmlDType::Q5_0,
        "q51" => GgmlDType::Q5_1,
        "q80" => GgmlDType::Q8_0,
        "q2k" => GgmlDType::Q2K,
        "q3k" => GgmlDType::Q3K,
        "q4k" => GgmlDType::Q4K,
        "q5k" => GgmlDType::Q5K,
        "q6k" => GgmlDType::Q6K,
        _ => return None,
    })
}

/// `n` values uniform in `[lo, hi)` from `seed` (xorshift64*; the same on every machine).
/// Long sequences are generated in chunks on all cores: each chunk starts from the state
/// the single sequence reaches there (the xorshift step is linear over GF(2), so a jump of
/// [`SEEDED_CHUNK`] steps is one 64x64 bit-matrix product), so the values do not depend on
/// the thread count.
pub fn seeded_values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let s0 = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if n <= SEEDED_CHUNK || threads == 1 {
        seeded_fill(&mut out, s0, lo, hi);
        return out;
    }
    let jump = BitMatrix::xorshift().pow2(SEEDED_CHUNK.trailing_zeros());
    let mut state = s0;
    let mut chunks: Vec<(u64, &mut [f32])> = Vec::with_capacity(n.div_ceil(SEEDED_CHUNK));
    for c in out.chunks_mut(SEEDED_CHUNK) {
        chunks.push((state, c));
        state = jump.apply(state);
    }
    let per = chunks.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut rest = chunks.as_mut_slice();
        while !rest.is_empty() {
            let (mine, more) = rest.split_at_mut(per.min(rest.len()));
            rest = more;
            scope.spawn(move || {
                for (s, c) in mine.iter_mut() {
                    seeded_fill(c, *s, lo, hi);
                }
            });
        }
    });
    out
}

/// Values per chunk of [`seeded_values`]' parallel generation (a power of two).
pub const SEEDED_CHUNK: usize = 1 << 20;

/// The xorshift64* values of [`seeded_values`] from state `s` into `out`.
fn seeded_fill(out: &mut [f32], mut s: u64, lo: f32, hi: f32) {
    for x in out {
        s = xorshift_step(s);
        let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
        *x = lo + (hi - lo) * u;
    }
}

/// One step of xorshift64 (shifts 12, 25, 27).
fn xorshift_step(mut s: u64) -> u64 {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    s
}

/// A linear map of 64-bit states over GF(2): column `j` is the image of bit `j`.
struct BitMatrix([u64; 64]);

impl BitMatrix {
    /// [`xorshift_step`] as a matrix.
    fn xorshift() -> BitMatrix {
        BitMatrix(std::array::from_fn(|j| xorshift_step(1u64 << j)))
    }

    /// The image of `v`: the sum (XOR) of the columns of its set bits.
    fn apply(&self, v: u64) -> u64 {
        (0..64).filter(|j| v >> j & 1 == 1).fold(0, |acc, j| acc ^ self.0[j])
    }

    /// This map applied `2^k` times.
    fn pow2(&self, k: u32) -> BitMatrix {
        let mut m = BitMatrix(self.0);
        for _ in 0..k {
            m = BitMatrix(std::array::from_fn(|j| m.apply(m.0[j])));
        }
        m
    }
}

/// FNV-1a of a tensor name: its weights' seed, mixed with the file's seed.
fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// How [`write_gguf`] stores the weight matrices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Storage {
    /// Quantized to this type.
    Quantized(GgmlDType),
    /// Quantized to this type, then stored dequantized as `f32`: the same model without
    /// quantization (a reference for quantized inference).
    Dequantized(GgmlDType),
}

/// BOS and EOS ids (the tokenizer's two special tokens, last in the vocabulary).
pub fn special_ids(vocab: usize) -> (u32, u32) {
    (vocab as u32 - 2, vocab as u32 - 1)
}

/// Writes a llama GGUF of `shape` with weights from `seed` to `path`.
pub fn write_gguf(path: &Path, shape: &LlamaShape, storage: Storage, seed: u64) -> Result<()> {
    let dtype = match storage {
        Storage::Quantized(d) | Storage::Dequantized(d) => d,
    };
    let e = |x: candle_core::Error| err(path, x);
    // One tensor: seeded values, quantized with Candle's CPU code.
    let make = |name: &str, (rows, cols): (usize, usize), norm: bool| -> Result<QTensor> {
        let s = name_seed(seed, name);
        Ok(if norm {
            let v = seeded_values(cols, s, 0.9, 1.1);
            QTensor::quantize(&Tensor::from_vec(v, cols, &Device::Cpu).map_err(e)?, GgmlDType::F32).map_err(e)?
        } else {
            let a = 1.0 / (cols as f32).sqrt();
            let t = Tensor::from_vec(seeded_values(rows * cols, s, -a, a), (rows, cols), &Device::Cpu).map_err(e)?;
            // A Q4_K file keeps its output head in Q6_K, as llama.cpp's Q4_K_M files do.
            let ty = if dtype == GgmlDType::Q4K && name == "output.weight" { GgmlDType::Q6K } else { dtype };
            let q = QTensor::quantize(&t, ty).map_err(|x| err(path, format!("{name} ({rows} x {cols}) as {ty:?}: {x}")))?;
            match storage {
                Storage::Quantized(_) => q,
                Storage::Dequantized(_) => QTensor::quantize(&q.dequantize(&Device::Cpu).map_err(e)?, GgmlDType::F32).map_err(e)?,
            }
        })
    };
    // Tensors are independent (each has its own seed): quantize them on all cores (the
    // k-quant quantizers are slow: an 8B-shaped Q4_K file took over 5 minutes on one),
    // then write them in the model's order.
    let specs = shape.tensors();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: std::sync::Mutex<Vec<Option<Result<QTensor>>>> = std::sync::Mutex::new((0..specs.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(specs.len().max(1));
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, dims, norm)) = specs.get(i) else { break };
                let q = make(name, *dims, *norm);
                done.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(q);
            });
        }
    });
    let mut tensors = Vec::with_capacity(specs.len());
    for ((name, ..), q) in specs.iter().zip(done.into_inner().unwrap_or_else(|p| p.into_inner())) {
        tensors.push((name.clone(), q.expect("every tensor was made")?));
    }
    use gguf_file::Value as V;
    let (bos, eos) = special_ids(shape.vocab);
    let u = |x: usize| V::U32(x as u32);
    let md: Vec<(&str, V)> = vec![
        ("general.architecture", V::String("llama".into())),
        ("general.name", V::String(format!("random llama (seed {seed}, {dtype:?})"))),
        ("llama.context_length", u(shape.context)),
        ("llama.embedding_length", u(shape.hidden)),
        ("llama.block_count", u(shape.layers)),
        ("llama.feed_forward_length", u(shape.intermediate)),
        ("llama.attention.head_count", u(shape.heads)),
        ("llama.attention.head_count_kv", u(shape.kv_heads)),
        ("llama.rope.dimension_count", u(shape.head_dim())),
        ("llama.rope.freq_base", V::F32(shape.rope_theta)),
        ("llama.attention.layer_norm_rms_epsilon", V::F32(shape.rms_eps)),
        ("llama.vocab_size", u(shape.vocab)),
        // The vocabulary is tokenizer.json beside the file; "none" tells other GGUF readers
        // (llama.cpp, the benchmark peer) that the file carries none of its own.
        ("tokenizer.ggml.model", V::String("none".into())),
        ("tokenizer.ggml.bos_token_id", V::U32(bos)),
        ("tokenizer.ggml.eos_token_id", V::U32(eos)),
    ];
    let md: Vec<(&str, &V)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, q)| (n.as_str(), q)).collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(|x| err(path, x))?);
    gguf_file::write(&mut f, &md, &ts).map_err(e)?;
    std::io::Write::flush(&mut f).map_err(|x| err(path, x))
}

/// GPT-2's byte-to-character map of byte-level BPE: printable bytes stand for themselves,
/// the others for the characters from U+0100 on.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("latin-1")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below U+0200")
            }
        })
        .collect()
}

/// Writes a byte-level BPE tokenizer with `vocab` ids: the 256 bytes, merges of letter
/// pairs and triples (`"th"`, `"the"`, ...) up to `vocab - 2`, then `<s>` and `</s>`.
/// Every text encodes (bytes are in the vocabulary) and decodes back.
pub fn write_tokenizer(path: &Path, vocab: usize) -> Result<()> {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    if vocab < 260 {
        return Err(err(path, format!("a vocabulary of {vocab} is smaller than the 256 bytes + 2 special tokens")));
    }
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    // The space (as its byte-level character), then letters by English frequency.
    let alphabet: Vec<String> = std::iter::once(chars[b' ' as usize]).chain("etaoinshrdlcumwfgypbvkjxqz".chars()).map(String::from).collect();
    let mut level: Vec<String> = alphabet.clone();
    'grow: while tokens.len() < vocab - 2 {
        let mut next_level = Vec::new();
        for a in &level {
            for b in &alphabet {
                if tokens.len() >= vocab - 2 {
                    break 'grow;
                }
                let t = format!("{a}{b}");
                merges.push((a.clone(), b.clone()));
                tokens.push(t.clone());
                next_level.push(t);
            }
        }
        level = next_level;
    }
    let v: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(v, merges).build().map_err(|x| err(path, x))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.add_special_tokens([AddedToken::from("<s>", true), AddedToken::from("</s>", true)]).map_err(|x| err(path, x))?;
    if tok.get_vocab_size(true) != vocab {
        return Err(err(path, format!("tokenizer has {} ids, {vocab} wanted", tok.get_vocab_size(true))));
    }
    tok.save(path, false).map_err(|x| err(path, x))
}

/// Reads a tokenizer file (a clear error for a missing or malformed one).
pub fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
    if !path.is_file() {
        return Err(err(path, "tokenizer file not found"));
    }
    tokenizers::Tokenizer::from_file(path).map_err(|x| err(path, format!("not a tokenizer.json: {x}")))
}

/// A loaded model and the facts the worker needs from the file.
pub struct Loaded {
    pub model: ModelWeights,
    pub eos: Option<u32>,
    pub vocab: Option<usize>,
    /// The weights' GGML type (of `blk.0.attn_q.weight`, or the first tensor).
    pub dtype: Option<GgmlDType>,
}

/// Loads a llama GGUF onto `device`. Missing files, truncated or malformed GGUF (bad
/// magic, unknown tensor type ids, data past the end, missing metadata), and other
/// architectures are errors naming the file.
pub fn load(path: &Path, device: &Device) -> Result<Loaded> {
    if !path.is_file() {
        return Err(err(path, "model file not found"));
    }
    let mut f = std::fs::File::open(path).map_err(|x| err(path, x))?;
    let ct = gguf_file::Content::read(&mut f).map_err(|x| err(path, format!("malformed GGUF: {x}")))?;
    let arch = ct.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned();
    if arch.as_deref() != Some("llama") {
        return Err(err(path, format!("architecture {arch:?}; this loader reads llama models")));
    }
    let file_len = f.metadata().map_err(|x| err(path, x))?.len();
    for (name, info) in &ct.tensor_infos {
        let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        let end = ct.tensor_data_offset.checked_add(info.offset).and_then(|s| s.checked_add(bytes as u64));
        if end.is_none_or(|e| e > file_len) {
            return Err(err(path, format!("malformed GGUF: tensor {name} ({:?}, {:?}) ends past the end of the file ({file_len} bytes): truncated?", info.ggml_dtype, info.shape)));
        }
    }
    let eos = ct.metadata.get("tokenizer.ggml.eos_token_id").and_then(|v| v.to_u32().ok());
    let vocab = ct.tensor_infos.get("token_embd.weight").map(|i| i.shape.dims()[0]);
    let dtype = ct.tensor_infos.get("blk.0.attn_q.weight").map(|i| i.ggml_dtype);
    let model = ModelWeights::from_gguf(ct, &mut f, device).map_err(|x| err(path, format!("cannot load the llama model: {x}")))?;
    Ok(Loaded { model, eos, vocab, dtype })
}

#[cfg(test)]
mod tests {
    use super::{seeded_values, SEEDED_CHUNK};

    /// The chunked, multi-threaded generation gives the single sequence: the xorshift64*
    /// recurrence written out here, value by value, over three and a half chunks.
    #[test]
    fn seeded_values_in_chunks_are_the_single_sequence() {
        let n = 3 * SEEDED_CHUNK + SEEDED_CHUNK / 2 + 7;
        for seed in [0u64, 1, 0xdead_beef] {
            let got = seeded_values(n, seed, -0.5, 2.0);
            let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for (i, g) in got.iter().enumerate() {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
                let want = -0.5 + 2.5 * u;
                assert_eq!(g.to_bits(), want.to_bits(), "seed {seed}, value {i}");
            }
        }
        // Short sequences take the single-threaded path: a prefix of the long one.
        assert_eq!(seeded_values(100, 1, -0.5, 2.0), seeded_values(n, 1, -0.5, 2.0)[..100]);
    }
}
