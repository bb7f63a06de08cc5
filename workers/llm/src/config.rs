//! Model configuration: one normalized [`ModelConfig`] for every family, read from a Hugging
//! Face `config.json` (both the `rope_theta` at top level and the current `rope_parameters`
//! form, `rope_scaling` with llama3-style scaling) or from GGUF metadata.
use crate::error::{malformed, Error, Result};
use candle_core::quantized::gguf_file;
use serde_json::Value;
use std::path::Path;

/// The llama-family variants: they differ in biases, norms and attention windows only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 2 / 3.x.
    Llama,
    /// Mistral: sliding-window attention.
    Mistral,
    /// Qwen2 / 2.5: biases on q, k and v.
    Qwen2,
    /// Qwen3: RMSNorm of each head's q and k before rope.
    Qwen3,
}

impl Family {
    /// The family of a `model_type` or `architectures[0]` name.
    pub fn from_name(name: &str) -> Option<Family> {
        Some(match name.to_ascii_lowercase().as_str() {
            "llama" | "llamaforcausallm" => Family::Llama,
            "mistral" | "mistralforcausallm" => Family::Mistral,
            "qwen2" | "qwen2forcausallm" => Family::Qwen2,
            "qwen3" | "qwen3forcausallm" => Family::Qwen3,
            _ => return None,
        })
    }

    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The `architectures[0]` string of `config.json`.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// How rope frequencies are scaled for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: usize },
    /// Positions divided by `factor` (every frequency divided by it).
    Linear { factor: f32 },
}

/// Everything the forward needs to know about a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// GGUF llama files pair dimensions `(2i, 2i+1)` (their q/k rows are permuted); Hugging
    /// Face checkpoints pair `(i, i + d/2)`.
    pub rope_interleaved: bool,
    pub max_position_embeddings: usize,
    /// A query at position `p` attends to keys at `p - w < k <= p` (Hugging Face's meaning).
    pub sliding_window: Option<usize>,
    /// Biases on the q, k, v products (Qwen2; Qwen3 with `attention_bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k (Qwen3).
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<ModelConfig> {
        if !path.is_file() {
            return Err(Error::NotFound(path.to_path_buf()));
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
        Self::from_hf_json(&text, path)
    }

    /// Parses the text of a Hugging Face `config.json` (`path` names it in errors).
    pub fn from_hf_json(text: &str, path: &Path) -> Result<ModelConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| malformed(path, format!("not JSON: {e}")))?;
        let name = v
            .get("model_type")
            .and_then(Value::as_str)
            .or_else(|| v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str))
            .unwrap_or("(none)");
        let family = Family::from_name(name).ok_or_else(|| Error::UnknownArchitecture { path: path.into(), arch: name.into() })?;
        let us = |k: &str| -> Result<usize> {
            v.get(k).and_then(Value::as_u64).map(|x| x as usize).ok_or_else(|| malformed(path, format!("`{k}` missing or not a non-negative integer")))
        };
        let opt_us = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        let hidden_size = us("hidden_size")?;
        let num_heads = us("num_attention_heads")?;
        let num_kv_heads = opt_us("num_key_value_heads").unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(malformed(path, format!("{num_heads} attention heads are not a multiple of {num_kv_heads} key/value heads")));
        }
        let head_dim = opt_us("head_dim").unwrap_or(hidden_size / num_heads);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(malformed(path, format!("head_dim {head_dim} must be even and positive")));
        }
        // rope_theta: top level (older transformers) or under rope_parameters (current).
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_theta = f("rope_theta")
            .or_else(|| rope_params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64))
            .unwrap_or(match family {
                Family::Qwen2 | Family::Qwen3 => 1_000_000.0,
                _ => 10_000.0,
            });
        // Scaling: `rope_scaling` (older) or the rope_parameters themselves (current).
        let scaling = v.get("rope_scaling").filter(|s| s.is_object()).or(rope_params);
        let rope_scaling = match scaling {
            None => None,
            Some(s) => {
                let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
                let sf = |k: &str| -> Result<f32> { s.get(k).and_then(Value::as_f64).map(|x| x as f32).ok_or_else(|| malformed(path, format!("rope scaling `{kind}` needs `{k}`"))) };
                match kind {
                    "default" => None,
                    "linear" => Some(RopeScaling::Linear { factor: sf("factor")? }),
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: sf("factor")?,
                        low_freq_factor: sf("low_freq_factor")?,
                        high_freq_factor: sf("high_freq_factor")?,
                        original_max_position_embeddings: s
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_u64)
                            .ok_or_else(|| malformed(path, "llama3 rope scaling needs `original_max_position_embeddings`"))? as usize,
                    }),
                    other => return Err(Error::Unsupported { path: path.into(), msg: format!("rope type {other:?} (default, linear and llama3 are)") }),
                }
            }
        };
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(Error::Unsupported { path: path.into(), msg: format!("hidden_act {act:?} (silu is)") });
            }
        }
        let sliding_window = match family {
            Family::Mistral => opt_us("sliding_window"),
            // Qwen checkpoints carry a window but disable it unless use_sliding_window is set.
            Family::Qwen2 | Family::Qwen3 if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) => {
                return Err(Error::Unsupported { path: path.into(), msg: "use_sliding_window with max_window_layers (Qwen's per-layer windows)".into() })
            }
            _ => None,
        };
        let bool_or = |k: &str, d: bool| v.get(k).and_then(Value::as_bool).unwrap_or(d);
        Ok(ModelConfig {
            family,
            vocab_size: us("vocab_size")?,
            hidden_size,
            intermediate_size: us("intermediate_size")?,
            num_layers: us("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f("rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_interleaved: false,
            max_position_embeddings: opt_us("max_position_embeddings").unwrap_or(4096),
            sliding_window,
            qkv_bias: match family {
                Family::Qwen2 => true,
                _ => bool_or("attention_bias", false),
            },
            qk_norm: family == Family::Qwen3,
            tie_word_embeddings: bool_or("tie_word_embeddings", false),
            bos_token_id: v.get("bos_token_id").and_then(Value::as_u64).map(|x| x as u32),
            eos_token_ids: ids(v.get("eos_token_id")),
        })
    }

    /// Reads a GGUF file's metadata: architectures `llama` (interleaved rope: llama.cpp's
    /// converter permutes q/k), `qwen2` (q/k/v biases) and `qwen3` (q/k norms, explicit
    /// head size), both with rope on halves.
    pub fn from_gguf(ct: &gguf_file::Content, path: &Path) -> Result<ModelConfig> {
        let arch = ct.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_else(|| "(none)".into());
        let family = match arch.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            _ => return Err(Error::UnknownArchitecture { path: path.into(), arch }),
        };
        let get = |k: &str| ct.metadata.get(&format!("{arch}.{k}"));
        let u = |k: &str| -> Result<usize> { get(k).and_then(|v| v.to_u32().ok()).map(|x| x as usize).ok_or_else(|| malformed(path, format!("metadata {arch}.{k} missing"))) };
        let hidden_size = u("embedding_length")?;
        let num_heads = u("attention.head_count")?;
        let num_kv_heads = u("attention.head_count_kv").unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(malformed(path, format!("{num_heads} attention heads are not a multiple of {num_kv_heads} key/value heads")));
        }
        let head_dim = u("attention.key_length").unwrap_or(hidden_size / num_heads);
        let vocab_size = match ct.tensor_infos.get("token_embd.weight") {
            Some(i) => i.shape.dims()[0],
            None => return Err(malformed(path, "tensor token_embd.weight missing")),
        };
        let tok = |k: &str| ct.metadata.get(&format!("tokenizer.ggml.{k}")).and_then(|v| v.to_u32().ok());
        Ok(ModelConfig {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: u("feed_forward_length")?,
            num_layers: u("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: get("attention.layer_norm_rms_epsilon").and_then(|v| v.to_f32().ok()).unwrap_or(1e-5) as f64,
            rope_theta: get("rope.freq_base").and_then(|v| v.to_f32().ok()).unwrap_or(10_000.0) as f64,
            rope_scaling: None,
            rope_interleaved: family == Family::Llama,
            max_position_embeddings: u("context_length").unwrap_or(4096),
            sliding_window: None,
            qkv_bias: ct.tensor_infos.contains_key("blk.0.attn_q.bias"),
            qk_norm: ct.tensor_infos.contains_key("blk.0.attn_q_norm.weight"),
            tie_word_embeddings: !ct.tensor_infos.contains_key("output.weight"),
            bos_token_id: tok("bos_token_id"),
            eos_token_ids: tok("eos_token_id").into_iter().collect(),
        })
    }

    /// The rope inverse frequencies (`head_dim / 2` of them), with the configured scaling.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d).step_by(2).map(|i| 1f32 / (self.rope_theta as f32).powf(i as f32 / d as f32)).collect();
        match self.rope_scaling {
            None => base,
            Some(RopeScaling::Linear { factor }) => base.into_iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings: omp }) => {
                let low_wavelen = omp as f32 / low_freq_factor;
                let high_wavelen = omp as f32 / high_freq_factor;
                base.into_iter()
                    .map(|freq| {
                        let wavelen = 2. * std::f32::consts::PI / freq;
                        if wavelen < high_wavelen {
                            freq
                        } else if wavelen > low_wavelen {
                            freq / factor
                        } else {
                            let smooth = (omp as f32 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1. - smooth) * freq / factor + smooth * freq
                        }
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_scaling_divides_every_frequency() {
        let base = r#""model_type": "llama", "vocab_size": 8, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4, "rope_theta": 10000.0"#;
        let plain = ModelConfig::from_hf_json(&format!("{{{base}}}"), Path::new("c")).unwrap();
        let scaled = ModelConfig::from_hf_json(&format!("{{{base}, \"rope_scaling\": {{\"type\": \"linear\", \"factor\": 4.0}}}}"), Path::new("c")).unwrap();
        assert_eq!(scaled.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
        let (p, s) = (plain.inv_freq(), scaled.inv_freq());
        assert_eq!(p.len(), 8);
        for (i, (a, b)) in p.iter().zip(&s).enumerate() {
            let exact = 1.0 / 10000f64.powf(2.0 * i as f64 / 16.0);
            assert!((*a as f64 - exact).abs() <= 1e-6 * exact, "{i}: {a} vs {exact}");
            assert_eq!(*b, a / 4.0);
        }
    }
}
