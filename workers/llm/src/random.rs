//! Random-weight Hugging Face folders for tests and benchmarks: `config.json` in the current
//! `transformers` form (or the older top-level `rope_theta`), safetensors weights (sharded
//! with an index when asked), a real byte-level BPE `tokenizer.json` (`gguf_llama`'s, the
//! model's vocabulary exactly) and a `tokenizer_config.json` with a chat template.
//! Weights are uniform in `±1/sqrt(in)` (activations keep their scale), norms `1 ± 0.1`,
//! from a seed and the tensor's name only. Tensors are generated one at a time while the
//! file is written, so an 8B-shaped folder needs memory for one tensor only.
use crate::config::Family;
use crate::error::{Error, Result};
use candle_core::DType;
use serde_json::json;
use safetensors::View;
use std::borrow::Cow;
use std::path::Path;

/// Sizes of a model to write.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_positions: usize,
}

impl Shape {
    /// A test model: 2 layers, hidden 64, 4 heads of 16 (2 key/value heads), vocabulary 512.
    pub const TINY: Shape = Shape { vocab: 512, hidden: 64, intermediate: 128, layers: 2, heads: 4, kv_heads: 2, head_dim: 16, max_positions: 1024 };
    /// Llama 3.2 1B's sizes.
    pub const B1: Shape = Shape { vocab: 128256, hidden: 2048, intermediate: 8192, layers: 16, heads: 32, kv_heads: 8, head_dim: 64, max_positions: 131072 };
    /// Llama 3.1 8B's sizes.
    pub const B8: Shape = Shape { vocab: 128256, hidden: 4096, intermediate: 14336, layers: 32, heads: 32, kv_heads: 8, head_dim: 128, max_positions: 131072 };
    /// Llama 3.1 70B's layer sizes with 54 of its 80 layers: about 48B parameters, 97 GB in
    /// bf16, more than one 80 GB GPU holds (the tensor-parallel benchmark's model).
    pub const B48: Shape = Shape { vocab: 128256, hidden: 8192, intermediate: 28672, layers: 54, heads: 64, kv_heads: 8, head_dim: 128, max_positions: 131072 };

    /// `tiny`, `1b`, `8b` or `48b`.
    pub fn by_name(name: &str) -> Option<Shape> {
        match name {
            "tiny" => Some(Self::TINY),
            "1b" => Some(Self::B1),
            "8b" => Some(Self::B8),
            "48b" => Some(Self::B48),
            _ => None,
        }
    }

    /// Parameters of a model of this shape: embedding, layers (q, k, v, o, gate, up, down
    /// and two norms), final norm, and an untied head.
    pub fn parameters(&self) -> u64 {
        let (h, q, kv) = (self.hidden as u64, (self.heads * self.head_dim) as u64, (self.kv_heads * self.head_dim) as u64);
        let layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate as u64 + 2 * h;
        2 * self.vocab as u64 * h + self.layers as u64 * layer + h
    }
}

/// What to write.
#[derive(Clone, Debug)]
pub struct RandomModel {
    pub family: Family,
    pub shape: Shape,
    /// f32, f16 or bf16.
    pub dtype: DType,
    pub seed: u64,
    pub rope_theta: f64,
    /// Llama 3.1-style scaling `(factor, low_freq_factor, high_freq_factor, original_max_positions)`.
    pub llama3_scaling: Option<(f64, f64, f64, usize)>,
    /// Write `rope_theta` (and `rope_scaling`) at the top level, as `transformers` < 4.56 did,
    /// instead of under `rope_parameters`.
    pub legacy_rope: bool,
    /// Mistral's window (tokens).
    pub sliding_window: Option<usize>,
    pub tie_word_embeddings: bool,
    /// Split the weights into shards of about this many bytes (with an index file).
    pub shard_bytes: Option<usize>,
}

impl RandomModel {
    /// The defaults for `family` and `shape`: f32, seed 0, rope theta 10000 (500000 and
    /// llama3 scaling for the 1b/8b shapes), windows and ties as the family's models have.
    pub fn new(family: Family, shape: Shape) -> RandomModel {
        let big = shape.hidden >= 2048;
        RandomModel {
            family,
            shape,
            dtype: DType::F32,
            seed: 0,
            rope_theta: if big { 500_000.0 } else { 10_000.0 },
            llama3_scaling: if big && family == Family::Llama { Some((32.0, 1.0, 4.0, 8192)) } else { None },
            legacy_rope: false,
            sliding_window: if family == Family::Mistral { Some(4096) } else { None },
            tie_word_embeddings: matches!(family, Family::Qwen3) || (big && family == Family::Llama && shape.hidden == 2048),
            shard_bytes: None,
        }
    }

    /// Every tensor: name, shape, and its value range.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, f32, f32)> {
        let s = &self.shape;
        let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let w = |name: String, out: usize, inp: usize| {
            let a = 1.0 / (inp as f32).sqrt();
            (name, vec![out, inp], -a, a)
        };
        let norm = |name: String, n: usize| (name, vec![n], 0.9, 1.1);
        let bias = |name: String, n: usize| (name, vec![n], -0.1, 0.1);
        let mut v = vec![w("model.embed_tokens.weight".into(), s.vocab, h)];
        for l in 0..s.layers {
            let p = format!("model.layers.{l}");
            v.push(norm(format!("{p}.input_layernorm.weight"), h));
            v.push(w(format!("{p}.self_attn.q_proj.weight"), q, h));
            v.push(w(format!("{p}.self_attn.k_proj.weight"), kv, h));
            v.push(w(format!("{p}.self_attn.v_proj.weight"), kv, h));
            if self.family == Family::Qwen2 {
                v.push(bias(format!("{p}.self_attn.q_proj.bias"), q));
                v.push(bias(format!("{p}.self_attn.k_proj.bias"), kv));
                v.push(bias(format!("{p}.self_attn.v_proj.bias"), kv));
            }
            if self.family == Family::Qwen3 {
                v.push(norm(format!("{p}.self_attn.q_norm.weight"), s.head_dim));
                v.push(norm(format!("{p}.self_attn.k_norm.weight"), s.head_dim));
            }
            v.push(w(format!("{p}.self_attn.o_proj.weight"), h, q));
            v.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
            v.push(w(format!("{p}.mlp.gate_proj.weight"), s.intermediate, h));
            v.push(w(format!("{p}.mlp.up_proj.weight"), s.intermediate, h));
            v.push(w(format!("{p}.mlp.down_proj.weight"), h, s.intermediate));
        }
        v.push(norm("model.norm.weight".into(), h));
        if !self.tie_word_embeddings {
            v.push(w("lm_head.weight".into(), s.vocab, h));
        }
        v
    }

    /// `config.json`'s content.
    pub fn config_json(&self) -> serde_json::Value {
        let s = &self.shape;
        let (bos, eos) = gguf_llama::special_ids(s.vocab);
        let dtype = match self.dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let mut c = json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": s.max_positions,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "dtype": dtype,
            "attention_dropout": 0.0,
        });
        let o = c.as_object_mut().expect("an object");
        let mut rope = json!({"rope_theta": self.rope_theta, "rope_type": "default"});
        if let Some((factor, low, high, omp)) = self.llama3_scaling {
            rope = json!({"rope_theta": self.rope_theta, "rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high, "original_max_position_embeddings": omp});
        }
        if self.legacy_rope {
            o.insert("rope_theta".into(), json!(self.rope_theta));
            if let Some((factor, low, high, omp)) = self.llama3_scaling {
                o.insert("rope_scaling".into(), json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high, "original_max_position_embeddings": omp}));
            }
        } else {
            o.insert("rope_parameters".into(), rope);
        }
        match self.family {
            Family::Llama => {
                o.insert("attention_bias".into(), json!(false));
                o.insert("mlp_bias".into(), json!(false));
            }
            Family::Mistral => {
                o.insert("sliding_window".into(), json!(self.sliding_window));
            }
            Family::Qwen2 | Family::Qwen3 => {
                o.insert("use_sliding_window".into(), json!(false));
                o.insert("sliding_window".into(), json!(null));
                o.insert("max_window_layers".into(), json!(s.layers));
                if self.family == Family::Qwen3 {
                    o.insert("attention_bias".into(), json!(false));
                }
            }
        }
        c
    }

    /// Writes the folder `dir` (created if needed).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let st_dtype = match self.dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
            d => return Err(Error::Invalid(format!("weights of dtype {d:?} (f32, f16, bf16 can be written)"))),
        };
        let views: Vec<(String, Lazy)> = self
            .tensors()
            .into_iter()
            .map(|(name, shape, lo, hi)| {
                let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325 ^ self.seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
                (name, Lazy { shape, lo, hi, seed, dtype: st_dtype })
            })
            .collect();
        // Shards: consecutive tensors up to shard_bytes each.
        let mut shards: Vec<Vec<(String, Lazy)>> = vec![vec![]];
        let mut size = 0;
        for (n, v) in views {
            let len = v.data_len();
            if let Some(max) = self.shard_bytes {
                if size > 0 && size + len > max {
                    shards.push(vec![]);
                    size = 0;
                }
            }
            size += len;
            shards.last_mut().expect("one shard").push((n, v));
        }
        let meta = Some(std::collections::HashMap::from([("format".to_string(), "pt".to_string())]));
        if shards.len() == 1 {
            let f = dir.join("model.safetensors");
            safetensors::serialize_to_file(shards.pop().expect("one shard"), meta, &f).map_err(|e| Error::Invalid(format!("{}: {e}", f.display())))?;
        } else {
            let n = shards.len();
            let mut map = serde_json::Map::new();
            let mut total = 0;
            for (i, shard) in shards.into_iter().enumerate() {
                let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
                for (t, v) in &shard {
                    map.insert(t.clone(), json!(name));
                    total += v.data_len();
                }
                let f = dir.join(&name);
                safetensors::serialize_to_file(shard, meta.clone(), &f).map_err(|e| Error::Invalid(format!("{}: {e}", f.display())))?;
            }
            let index = json!({"metadata": {"total_size": total}, "weight_map": map});
            let f = dir.join("model.safetensors.index.json");
            std::fs::write(&f, serde_json::to_string_pretty(&index).expect("json")).map_err(io(&f))?;
        }
        let f = dir.join("config.json");
        std::fs::write(&f, serde_json::to_string_pretty(&self.config_json()).expect("json")).map_err(io(&f))?;
        gguf_llama::write_tokenizer(&dir.join("tokenizer.json"), self.shape.vocab).map_err(|e| Error::Invalid(e.to_string()))?;
        let tc = json!({
            "bos_token": "<s>",
            "eos_token": "</s>",
            "add_bos_token": false,
            "model_max_length": self.shape.max_positions,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHAT_TEMPLATE,
        });
        let f = dir.join("tokenizer_config.json");
        std::fs::write(&f, serde_json::to_string_pretty(&tc).expect("json")).map_err(io(&f))
    }
}

impl RandomModel {
    /// Writes the same model (same seed, same values) as a GGUF file of the `qwen2` or
    /// `qwen3` architecture, weight matrices quantized to `ty` with Candle's CPU code, norms
    /// and biases `f32`; `tokenizer.json` next to it. (Llama GGUF files come from
    /// `gguf-llama`: their q/k rows are permuted for the interleaved rope.)
    pub fn write_gguf(&self, path: &Path, ty: candle_core::quantized::GgmlDType) -> Result<()> {
        use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
        let arch = match self.family {
            Family::Qwen2 | Family::Qwen3 => self.family.model_type(),
            f => return Err(Error::Invalid(format!("GGUF files of the {f:?} family are written by gguf-llama (llama only)"))),
        };
        let e = |x: candle_core::Error| Error::Invalid(format!("{}: {x}", path.display()));
        let rename = |n: &str| -> String {
            let n = n.replace("model.embed_tokens.", "token_embd.").replace("model.norm.", "output_norm.").replace("lm_head.", "output.");
            let n = n.replace("model.layers.", "blk.");
            [
                ("self_attn.q_proj", "attn_q"),
                ("self_attn.k_proj", "attn_k"),
                ("self_attn.v_proj", "attn_v"),
                ("self_attn.o_proj", "attn_output"),
                ("self_attn.q_norm", "attn_q_norm"),
                ("self_attn.k_norm", "attn_k_norm"),
                ("input_layernorm", "attn_norm"),
                ("post_attention_layernorm", "ffn_norm"),
                ("mlp.gate_proj", "ffn_gate"),
                ("mlp.up_proj", "ffn_up"),
                ("mlp.down_proj", "ffn_down"),
            ]
            .iter()
            .fold(n, |n, (a, b)| n.replace(a, b))
        };
        let mut tensors = vec![];
        for (name, shape, lo, hi) in self.tensors() {
            let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325 ^ self.seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
            let v = gguf_llama::seeded_values(shape.iter().product(), seed, lo, hi);
            // The safetensors folder rounds to its dtype: so does this file's source.
            let t = candle_core::Tensor::from_vec(v, shape.as_slice(), &candle_core::Device::Cpu).map_err(e)?.to_dtype(self.dtype).map_err(e)?.to_dtype(DType::F32).map_err(e)?;
            let q = if shape.len() == 1 { QTensor::quantize(&t, GgmlDType::F32) } else { QTensor::quantize(&t, ty) };
            tensors.push((rename(&name), q.map_err(|x| Error::Invalid(format!("{name} {shape:?} as {ty:?}: {x}")))?));
        }
        let s = &self.shape;
        let (bos, eos) = gguf_llama::special_ids(s.vocab);
        use gguf_file::Value as V;
        let u = |x: usize| V::U32(x as u32);
        let k = |key: &str| format!("{arch}.{key}");
        let md: Vec<(String, V)> = vec![
            ("general.architecture".into(), V::String(arch.into())),
            ("general.name".into(), V::String(format!("random {arch} (seed {}, {ty:?})", self.seed))),
            // quantized_qwen3 reads its rope tables' dtype here: 0 = f32.
            ("general.dtype".into(), V::U32(0)),
            (k("context_length"), u(s.max_positions)),
            (k("embedding_length"), u(s.hidden)),
            (k("block_count"), u(s.layers)),
            (k("feed_forward_length"), u(s.intermediate)),
            (k("attention.head_count"), u(s.heads)),
            (k("attention.head_count_kv"), u(s.kv_heads)),
            (k("attention.key_length"), u(s.head_dim)),
            (k("attention.value_length"), u(s.head_dim)),
            (k("rope.freq_base"), V::F32(self.rope_theta as f32)),
            (k("attention.layer_norm_rms_epsilon"), V::F32(1e-5)),
            (k("vocab_size"), u(s.vocab)),
            // The vocabulary lives in tokenizer.json beside the file (which our loader
            // prefers); "none" says so to other GGUF readers, so llama.cpp (the benchmark
            // peer) loads the file as a model without a vocabulary of its own.
            ("tokenizer.ggml.model".into(), V::String("none".into())),
            ("tokenizer.ggml.bos_token_id".into(), V::U32(bos)),
            ("tokenizer.ggml.eos_token_id".into(), V::U32(eos)),
            ("tokenizer.chat_template".into(), V::String(CHAT_TEMPLATE.into())),
        ];
        let md: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, q)| (n.as_str(), q)).collect();
        let io = |source| Error::Io { path: path.into(), source };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        gguf_file::write(&mut f, &md, &ts).map_err(e)?;
        std::io::Write::flush(&mut f).map_err(io)?;
        gguf_llama::write_tokenizer(&path.with_file_name("tokenizer.json"), s.vocab).map_err(|x| Error::Invalid(x.to_string()))
    }
}

/// The chat template of written models: ChatML-like turns, with the Python-style
/// `.strip()` and `raise_exception` that real templates use.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}<|{{ message['role'] }}|>\n{{ message['content'].strip() }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// A tensor whose bytes are generated when the writer asks for them.
struct Lazy {
    shape: Vec<usize>,
    lo: f32,
    hi: f32,
    seed: u64,
    dtype: safetensors::Dtype,
}

impl safetensors::View for Lazy {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let v = gguf_llama::seeded_values(self.shape.iter().product(), self.seed, self.lo, self.hi);
        Cow::Owned(encode(&v, self.dtype))
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// `v` as little-endian bytes of `dtype` (f16, bf16, else f32), converted on all cores
/// (a 48B-shaped folder converts 48 billion values).
fn encode(v: &[f32], dtype: safetensors::Dtype) -> Vec<u8> {
    let width = dtype.bitsize() / 8;
    let mut out = vec![0u8; v.len() * width];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = v.len().div_ceil(threads).max(1 << 16);
    std::thread::scope(|scope| {
        for (src, dst) in v.chunks(per).zip(out.chunks_mut(per * width)) {
            scope.spawn(move || {
                for (x, d) in src.iter().zip(dst.chunks_exact_mut(width)) {
                    match dtype {
                        safetensors::Dtype::F16 => d.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes()),
                        safetensors::Dtype::BF16 => d.copy_from_slice(&half::bf16::from_f32(*x).to_le_bytes()),
                        _ => d.copy_from_slice(&x.to_le_bytes()),
                    }
                }
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::Shape;

    /// The shapes' parameter counts against Meta's published ones: Llama 3.1 8B has
    /// 8,030,261,248; 70B (Llama 3.1/3.3) 70,553,706,496, of which `48b` keeps 54 of 80 layers.
    #[test]
    fn shapes_have_the_published_parameter_counts() {
        assert_eq!(Shape::B8.parameters(), 8_030_261_248);
        let b70 = Shape { layers: 80, ..Shape::B48 };
        assert_eq!(b70.parameters(), 70_553_706_496);
        let per_layer = (b70.parameters() - Shape { layers: 0, ..Shape::B48 }.parameters()) / 80;
        assert_eq!(Shape::B48.parameters(), b70.parameters() - 26 * per_layer);
        // More than one 80 GB GPU holds in bf16.
        assert!(Shape::B48.parameters() * 2 > 80 * (1 << 30));
        assert_eq!(Shape::by_name("48b"), Some(Shape::B48));
        assert_eq!(Shape::by_name("70b"), None);
    }

    /// The parallel conversion gives each value's own little-endian bytes, in order.
    #[test]
    fn encode_writes_each_value_in_order() {
        let v: Vec<f32> = (0..200_003).map(|i| (i as f32 - 1e5) * 0.37).collect();
        let bf = super::encode(&v, safetensors::Dtype::BF16);
        let f = super::encode(&v, safetensors::Dtype::F32);
        assert_eq!((bf.len(), f.len()), (2 * v.len(), 4 * v.len()));
        for (i, x) in v.iter().enumerate() {
            assert_eq!(bf[2 * i..2 * i + 2], half::bf16::from_f32(*x).to_le_bytes(), "bf16 {i}");
            assert_eq!(f[4 * i..4 * i + 4], x.to_le_bytes(), "f32 {i}");
        }
    }
}
