//! Loading: config.json in both rope forms, sharded safetensors, and the typed errors of
//! missing or malformed files, unknown architectures and unsupported GGML types.
use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::Device;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::{Error, Family, LlamaRunner, Model, ModelConfig, RopeScaling};
use std::path::Path;

fn cfg(json: &str) -> llm_worker::Result<ModelConfig> {
    ModelConfig::from_hf_json(json, Path::new("config.json"))
}

const BASE: &str = r#""model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5"#;

#[test]
fn rope_theta_at_top_level_and_under_rope_parameters() {
    let old = cfg(&format!("{{{BASE}, \"rope_theta\": 500000.0}}")).unwrap();
    let new = cfg(&format!("{{{BASE}, \"rope_parameters\": {{\"rope_theta\": 500000.0, \"rope_type\": \"default\"}}}}")).unwrap();
    assert_eq!(old.rope_theta, 500000.0);
    assert_eq!(new, old);
    assert_eq!(new.rope_scaling, None);
    // llama3 scaling: under rope_scaling (older) or in rope_parameters (current).
    let l3 = r#""rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192"#;
    let old = cfg(&format!("{{{BASE}, \"rope_theta\": 500000.0, \"rope_scaling\": {{{l3}}}}}")).unwrap();
    let new = cfg(&format!("{{{BASE}, \"rope_parameters\": {{\"rope_theta\": 500000.0, {l3}}}}}")).unwrap();
    assert_eq!(new, old);
    assert_eq!(new.rope_scaling, Some(RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 }));
    // Candle's LlamaConfig misses the current form (the reason for this loader).
    let candle: candle_transformers::models::llama::LlamaConfig = serde_json::from_str(&format!("{{{BASE}, \"max_position_embeddings\": 64, \"rope_parameters\": {{\"rope_theta\": 500000.0, \"rope_type\": \"default\"}}}}")).unwrap();
    assert_eq!(candle.rope_theta, 10000.0);
    // The writer's two forms load to the same config.
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut r = RandomModel::new(Family::Llama, Shape::TINY);
    r.rope_theta = 500000.0;
    r.llama3_scaling = Some((8.0, 1.0, 4.0, 64));
    r.write(a.path()).unwrap();
    r.legacy_rope = true;
    r.write(b.path()).unwrap();
    let ta = std::fs::read_to_string(a.path().join("config.json")).unwrap();
    let tb = std::fs::read_to_string(b.path().join("config.json")).unwrap();
    assert!(ta.contains("rope_parameters") && !ta.contains("rope_scaling") && tb.contains("rope_scaling") && !tb.contains("rope_parameters"));
    let (ca, cb) = (ModelConfig::from_hf_file(&a.path().join("config.json")).unwrap(), ModelConfig::from_hf_file(&b.path().join("config.json")).unwrap());
    assert_eq!(ca, cb);
    assert_eq!(ca.rope_theta, 500000.0);
}

#[test]
fn config_errors() {
    assert!(matches!(cfg("{"), Err(Error::Malformed { .. })));
    assert!(matches!(cfg(r#"{"model_type": "gpt2"}"#), Err(Error::UnknownArchitecture { arch, .. }) if arch == "gpt2"));
    let no_inter = format!("{{{}}}", BASE.replace("\"intermediate_size\": 128,", ""));
    assert!(matches!(cfg(&no_inter), Err(Error::Malformed { msg, .. }) if msg.contains("intermediate_size")));
    assert!(matches!(cfg(&format!("{{{BASE}, \"rope_scaling\": {{\"rope_type\": \"yarn\", \"factor\": 4.0}}}}")), Err(Error::Unsupported { .. })));
    assert!(matches!(cfg(&format!("{{{BASE}, \"rope_scaling\": {{\"rope_type\": \"llama3\", \"factor\": 4.0}}}}")), Err(Error::Malformed { .. })));
    assert!(matches!(cfg(&format!("{{{BASE}, \"hidden_act\": \"gelu\"}}")), Err(Error::Unsupported { .. })));
    let bad_heads = format!("{{{}}}", BASE.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"));
    assert!(matches!(cfg(&bad_heads), Err(Error::Malformed { msg, .. }) if msg.contains("heads")));
}

fn logits(dir: &Path) -> Vec<f32> {
    let mut r = LlamaRunner::new(Model::load(dir, &Device::Cpu).unwrap(), 4, 4).unwrap();
    r.step(&[SeqChunk { seq_id: 0, tokens: vec![1, 2, 3, 4, 5], start_pos: 0, block_table: vec![0, 1], sample: true }]).unwrap().remove(0)
}

#[test]
fn sharded_safetensors_load_like_one_file() {
    let (one, sharded) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut r = RandomModel::new(Family::Llama, Shape::TINY);
    r.write(one.path()).unwrap();
    r.shard_bytes = Some(100_000);
    r.write(sharded.path()).unwrap();
    assert!(sharded.path().join("model.safetensors.index.json").is_file());
    let shards = std::fs::read_dir(sharded.path()).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "safetensors")).count();
    assert!(shards > 2, "{shards} shards");
    assert_eq!(logits(one.path()), logits(sharded.path()));
    // bf16 weights load as bf16 (activations in the weights' dtype).
    let bf = tempfile::tempdir().unwrap();
    r.dtype = candle_core::DType::BF16;
    r.shard_bytes = None;
    r.write(bf.path()).unwrap();
    assert_eq!(Model::load(bf.path(), &Device::Cpu).unwrap().dtype, candle_core::DType::BF16);
}

#[test]
fn missing_and_malformed_model_files() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = &Device::Cpu;
    assert!(matches!(Model::load(&dir.path().join("nope"), cpu), Err(Error::NotFound(_))));
    // A folder without config.json, then without weights, then with a broken weights file.
    assert!(matches!(Model::load(dir.path(), cpu), Err(Error::NotFound(p)) if p.ends_with("config.json")));
    RandomModel::new(Family::Llama, Shape::TINY).write(dir.path()).unwrap();
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(Model::load(dir.path(), cpu), Err(Error::Malformed { .. })), "truncated safetensors");
    std::fs::remove_file(&st).unwrap();
    assert!(matches!(Model::load(dir.path(), cpu), Err(Error::NotFound(_))));
    // A config whose sizes disagree with the weights.
    RandomModel::new(Family::Llama, Shape::TINY).write(dir.path()).unwrap();
    let c = std::fs::read_to_string(dir.path().join("config.json")).unwrap().replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    std::fs::write(dir.path().join("config.json"), c).unwrap();
    assert!(matches!(Model::load(dir.path(), cpu), Err(Error::Malformed { msg, .. }) if msg.contains("gate_proj")));
}

/// Offset of the type field of `name`'s tensor info in a GGUF file.
fn type_offset(bytes: &[u8], name: &str) -> usize {
    let pos = bytes.windows(name.len()).position(|w| w == name.as_bytes()).unwrap();
    let p = pos + name.len();
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    p + 4 + 8 * n_dims
}

#[test]
fn gguf_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let cpu = &Device::Cpu;
    gguf_llama::write_gguf(&path, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(GgmlDType::Q8_0), 1).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    Model::load(&path, cpu).unwrap();
    // Truncated.
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    assert!(matches!(Model::load(&path, cpu), Err(Error::Malformed { msg, .. }) if msg.contains("truncated")));
    // Not GGUF.
    std::fs::write(&path, b"hello, not a model").unwrap();
    assert!(matches!(Model::load(&path, cpu), Err(Error::Malformed { .. })));
    // An unknown GGML type id.
    let mut b = bytes.clone();
    let at = type_offset(&b, "blk.0.attn_q.weight");
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 8, "Q8_0's id");
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert!(matches!(Model::load(&path, cpu), Err(Error::UnsupportedGgmlType { .. })));
    // Another architecture.
    let mut f = std::fs::File::create(&path).unwrap();
    let arch = gguf_file::Value::String("gpt2".into());
    gguf_file::write(&mut f, &[("general.architecture", &arch)], &[]).unwrap();
    drop(f);
    assert!(matches!(Model::load(&path, cpu), Err(Error::UnknownArchitecture { arch, .. }) if arch == "gpt2"));
}
