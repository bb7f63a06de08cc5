//! Tensor-parallel sharding arithmetic (Megatron-style) for the llama family, and loaders
//! that read only a rank's slice of each weight from the file.
//!
//! Rank `r` of `N` holds:
//! - q, k, v (and their biases): column-parallel, the rows of its heads (`nh / N` query
//!   heads, `nkv / N` key/value heads, contiguous);
//! - o: row-parallel, the input columns of those query heads; its products are summed
//!   across ranks (one all-reduce);
//! - gate, up: column-parallel, rows `r * I / N ..`; down: row-parallel, those columns
//!   (one all-reduce);
//! - the embedding and the lm head: vocabulary-parallel, rows `r * V / N ..` (a masked
//!   lookup plus an all-reduce; logits all-gathered);
//! - every norm (the qwen3 per-head q/k norms included): replicated.
//!
//! Weights are row-major `[out, in]` (safetensors and, after Candle's reversal of GGML's
//! dimensions, GGUF). A row slice is one byte range; a column slice is one range per row.
//! For GGML block types both slices must fall on whole blocks, which lie along the columns:
//! any row slice does; a column slice needs its start and width to be multiples of the block
//! size (32 for Q4_0..Q8_0, 256 for the K-quants). When they are not (for example Q4_K's
//! 256-wide blocks over the 352 columns of each rank's `down` slice), loading fails with
//! [`Error::TensorParallel`] naming the tensor; there is no silent replicated fallback.
use crate::config::ModelConfig;
use crate::error::{malformed, Error, Result};
use crate::model::{gguf_qmatmul, rope_tables, Layer, Linear, Model, Weight};
use crate::tp::{TpCollective, TpRank};
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

/// Which part of a weight a rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The whole tensor (replicated).
    Full,
    /// Rows `start..start + len` of `[rows, cols]` (of a 1-D tensor: its elements).
    Rows { start: usize, len: usize },
    /// Columns `start..start + len` of `[rows, cols]`.
    Cols { start: usize, len: usize },
}

/// The weights of a llama-family layer (and the model's ends), as sharding sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// `q_proj` weight or bias.
    Q,
    /// `k_proj` weight or bias.
    K,
    /// `v_proj` weight or bias.
    V,
    /// `o_proj`.
    O,
    /// `gate_proj`.
    Gate,
    /// `up_proj`.
    Up,
    /// `down_proj`.
    Down,
    /// The token embedding.
    Embed,
    /// The output head.
    LmHead,
    /// A norm's scale (layer norms, the final norm, qwen3's q/k norms).
    Norm,
}

/// Rank `rank` of `world`'s share of a model: checked divisibility and the split of each
/// weight kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpPlan {
    pub rank: usize,
    pub world: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
}

impl TpPlan {
    /// The plan of rank `rank` of `world` for `cfg`: an error when `world` is 0, `rank` is
    /// out of range, or the heads, key/value heads, intermediate size or vocabulary are not
    /// divisible by `world`.
    pub fn new(cfg: &ModelConfig, rank: usize, world: usize) -> Result<TpPlan> {
        if world == 0 || rank >= world {
            return Err(Error::TensorParallel(format!("rank {rank} of {world}")));
        }
        for (what, n) in [("attention heads", cfg.num_heads), ("key/value heads", cfg.num_kv_heads), ("intermediate size", cfg.intermediate_size), ("vocabulary size", cfg.vocab_size)] {
            if n % world != 0 {
                return Err(Error::TensorParallel(format!("the model's {what} ({n}) is not divisible by the tensor-parallel size {world}")));
            }
        }
        Ok(TpPlan { rank, world, heads: cfg.num_heads, kv_heads: cfg.num_kv_heads, head_dim: cfg.head_dim, intermediate: cfg.intermediate_size, vocab: cfg.vocab_size })
    }

    /// Query heads per rank.
    pub fn local_heads(&self) -> usize {
        self.heads / self.world
    }

    /// Key/value heads per rank.
    pub fn local_kv_heads(&self) -> usize {
        self.kv_heads / self.world
    }

    /// This rank's vocabulary rows `start..end`.
    pub fn vocab_range(&self) -> Range<usize> {
        let n = self.vocab / self.world;
        self.rank * n..(self.rank + 1) * n
    }

    /// Which part of a weight of `kind` this rank holds (biases split like their weight's rows).
    pub fn split(&self, kind: WeightKind) -> Split {
        let (r, w, hd) = (self.rank, self.world, self.head_dim);
        let part = |n: usize| (r * (n / w), n / w);
        match kind {
            WeightKind::Q => {
                let (s, l) = part(self.heads);
                Split::Rows { start: s * hd, len: l * hd }
            }
            WeightKind::K | WeightKind::V => {
                let (s, l) = part(self.kv_heads);
                Split::Rows { start: s * hd, len: l * hd }
            }
            WeightKind::O => {
                let (s, l) = part(self.heads);
                Split::Cols { start: s * hd, len: l * hd }
            }
            WeightKind::Gate | WeightKind::Up => {
                let (start, len) = part(self.intermediate);
                Split::Rows { start, len }
            }
            WeightKind::Down => {
                let (start, len) = part(self.intermediate);
                Split::Cols { start, len }
            }
            WeightKind::Embed | WeightKind::LmHead => {
                let (start, len) = part(self.vocab);
                Split::Rows { start, len }
            }
            WeightKind::Norm => Split::Full,
        }
    }
}

/// The byte ranges of `split` of a row-major `dims` tensor (1-D: one row) stored in units of
/// `unit_bytes` bytes holding `per_unit` elements each (1 for plain dtypes, the block size
/// for GGML blocks), and the slice's dims. An error naming `name` when the split does not
/// fall on whole units or exceeds the tensor.
#[allow(clippy::single_range_in_vec_init)] // a list of ranges that may have one
pub fn byte_ranges(name: &str, dims: &[usize], per_unit: usize, unit_bytes: usize, split: Split) -> Result<(Vec<Range<usize>>, Vec<usize>)> {
    let bad = |m: String| Error::TensorParallel(format!("tensor {name} {dims:?}: {m}"));
    // 1-D tensors are one row: their element slice is a column slice.
    let (rows, cols, one_d) = match dims {
        [n] => (1, *n, true),
        [r, c] => (*r, *c, false),
        _ => return Err(bad("sharding needs a 1-D or 2-D tensor".into())),
    };
    if cols % per_unit != 0 {
        return Err(bad(format!("{cols} columns are not whole blocks of {per_unit}")));
    }
    let row_bytes = cols / per_unit * unit_bytes;
    let split = match (split, one_d) {
        (Split::Rows { start, len }, true) => Split::Cols { start, len },
        (s, _) => s,
    };
    match split {
        Split::Full => Ok((vec![0..rows * row_bytes], dims.to_vec())),
        Split::Rows { start, len } => {
            if start + len > rows {
                return Err(bad(format!("rows {start}..{} past {rows}", start + len)));
            }
            Ok((vec![start * row_bytes..(start + len) * row_bytes], vec![len, cols]))
        }
        Split::Cols { start, len } => {
            if start + len > cols {
                return Err(bad(format!("columns {start}..{} past {cols}", start + len)));
            }
            if start % per_unit != 0 || len % per_unit != 0 {
                return Err(bad(format!(
                    "columns {start}..{} do not fall on whole blocks of {per_unit} elements: this GGML type cannot be split along its columns for this tensor-parallel size (use a type with smaller blocks, e.g. q8_0 or q4_0, or fewer ranks)",
                    start + len
                )));
            }
            let (b0, nb) = (start / per_unit * unit_bytes, len / per_unit * unit_bytes);
            let ranges = (0..rows).map(|r| r * row_bytes + b0..r * row_bytes + b0 + nb).collect();
            Ok((ranges, if one_d { vec![len] } else { vec![rows, len] }))
        }
    }
}

/// Safetensors files, memory-mapped: a tensor's slice is copied out of the mapping (only
/// the slice's pages are read).
pub struct SafetensorsSource {
    st: candle_core::safetensors::MmapedSafetensors,
    dir: std::path::PathBuf,
}

impl SafetensorsSource {
    /// Maps the safetensors files of a Hugging Face folder.
    pub fn open(dir: &Path) -> Result<SafetensorsSource> {
        let files = crate::model::safetensors_files(dir)?;
        // SAFETY: the files are mapped read-only; the model does not outlive a change to
        // them any more than any mmap-based loader does.
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(|e| malformed(files[0].clone(), e))?;
        Ok(SafetensorsSource { st, dir: dir.into() })
    }

    /// Whether the files hold `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.st.get(name).is_ok()
    }

    /// The dtype of `name`.
    pub fn dtype(&self, name: &str) -> Result<DType> {
        let v = self.st.get(name).map_err(|e| malformed(&self.dir, format!("{name}: {e}")))?;
        Ok(match v.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            other => return Err(Error::Unsupported { path: self.dir.clone(), msg: format!("tensor {name} of dtype {other:?} (bf16, f16, f32 are)") }),
        })
    }

    /// `split` of tensor `name` (which must have `dims`), as `dtype` on `dev`.
    pub fn get(&self, name: &str, dims: &[usize], split: Split, dtype: DType, dev: &Device) -> Result<Tensor> {
        let v = self.st.get(name).map_err(|e| malformed(&self.dir, format!("tensor {name}: {e}")))?;
        if v.shape() != dims {
            return Err(malformed(&self.dir, format!("tensor {name}: shape {:?}, expected {dims:?}", v.shape())));
        }
        let file_dtype = self.dtype(name)?;
        let (ranges, out) = byte_ranges(name, dims, 1, file_dtype.size_in_bytes(), split)?;
        let data = v.data();
        let mut bytes = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
        for r in ranges {
            bytes.extend_from_slice(&data[r]);
        }
        let t = Tensor::from_raw_buffer(&bytes, file_dtype, &out, &Device::Cpu)?;
        Ok(t.to_dtype(dtype)?.to_device(dev)?)
    }
}

/// A GGUF file: a tensor's slice is read as byte ranges (one for rows, one per row for columns).
pub struct GgufSource {
    file: std::fs::File,
    ct: gguf_file::Content,
    path: std::path::PathBuf,
}

impl GgufSource {
    /// Reads the GGUF header of `path` (tensors stay on disk).
    pub fn open(path: &Path) -> Result<GgufSource> {
        let mut file = std::fs::File::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let ct = gguf_file::Content::read(&mut file).map_err(|e| {
            let m = e.to_string();
            if m.contains("unknown dtype") {
                Error::UnsupportedGgmlType { path: path.into(), msg: m }
            } else {
                malformed(path, format!("not a GGUF file: {m}"))
            }
        })?;
        Ok(GgufSource { file, ct, path: path.into() })
    }

    /// The header (metadata and tensor infos).
    pub fn content(&self) -> &gguf_file::Content {
        &self.ct
    }

    /// `split` of tensor `name`, still in its GGML blocks, on `dev`.
    pub fn get(&mut self, name: &str, split: Split, dev: &Device) -> Result<QTensor> {
        let info = self.ct.tensor_infos.get(name).ok_or_else(|| malformed(&self.path, format!("no tensor {name}")))?;
        let (ty, dims, offset): (GgmlDType, Vec<usize>, u64) = (info.ggml_dtype, info.shape.dims().to_vec(), info.offset);
        let (ranges, out) = byte_ranges(name, &dims, ty.block_size(), ty.type_size(), split)?;
        let base = self.ct.tensor_data_offset + offset;
        let mut bytes = vec![0u8; ranges.iter().map(|r| r.len()).sum()];
        let mut at = 0;
        let io = |source| Error::Io { path: self.path.clone(), source };
        for r in ranges {
            self.file.seek(SeekFrom::Start(base + r.start as u64)).map_err(io)?;
            self.file.read_exact(&mut bytes[at..at + r.len()]).map_err(|e| malformed(&self.path, format!("tensor {name}: {e} (truncated?)")))?;
            at += r.len();
        }
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(ty, &bytes, out, dev)?)
    }
}

/// The configuration of the model at `path` (a Hugging Face folder's `config.json`, or a
/// GGUF file's metadata), without loading weights.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    if path.is_dir() {
        ModelConfig::from_hf_file(&path.join("config.json"))
    } else if path.is_file() {
        ModelConfig::from_gguf(GgufSource::open(path)?.content(), path)
    } else {
        Err(Error::NotFound(path.into()))
    }
}

/// Loads rank `comm.rank()` of `comm.world()`'s shard of the model at `path` (a Hugging
/// Face folder or a GGUF file) onto `dev`: only its slices are read.
pub fn load_shard(path: &Path, dev: &Device, comm: Box<dyn TpCollective>) -> Result<Model> {
    if path.is_dir() {
        load_safetensors_shard(path, dev, comm)
    } else if path.is_file() {
        load_gguf_shard(path, dev, comm)
    } else {
        Err(Error::NotFound(path.into()))
    }
}

fn load_safetensors_shard(dir: &Path, dev: &Device, comm: Box<dyn TpCollective>) -> Result<Model> {
    let cfg = ModelConfig::from_hf_file(&dir.join("config.json"))?;
    let plan = TpPlan::new(&cfg, comm.rank(), comm.world())?;
    let src = SafetensorsSource::open(dir)?;
    let embed_name = "model.embed_tokens.weight";
    let dtype = src.dtype(embed_name)?;
    let c = &cfg;
    let (h, nh, nkv, hd, im) = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size);
    let get = |name: &str, dims: &[usize], kind: WeightKind| src.get(name, dims, plan.split(kind), dtype, dev);
    let lin = |p: &str, out: usize, inp: usize, kind: WeightKind, bias: bool| -> Result<Linear> {
        let w = Weight::Dense(get(&format!("{p}.weight"), &[out, inp], kind)?);
        let b = if bias { Some(get(&format!("{p}.bias"), &[out], kind)?) } else { None };
        Ok(Linear { w, b })
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        let norm = |n: &str, d: usize| get(&format!("{p}.{n}.weight"), &[d], WeightKind::Norm);
        let mut layer = Layer {
            qkv: None,
            gate_up: None,
            input_norm: norm("input_layernorm", h)?,
            q: Some(lin(&format!("{p}.self_attn.q_proj"), nh * hd, h, WeightKind::Q, c.qkv_bias)?),
            k: Some(lin(&format!("{p}.self_attn.k_proj"), nkv * hd, h, WeightKind::K, c.qkv_bias)?),
            v: Some(lin(&format!("{p}.self_attn.v_proj"), nkv * hd, h, WeightKind::V, c.qkv_bias)?),
            o: lin(&format!("{p}.self_attn.o_proj"), h, nh * hd, WeightKind::O, false)?,
            q_norm: if c.qk_norm { Some(norm("self_attn.q_norm", hd)?) } else { None },
            k_norm: if c.qk_norm { Some(norm("self_attn.k_norm", hd)?) } else { None },
            post_norm: norm("post_attention_layernorm", h)?,
            gate: Some(lin(&format!("{p}.mlp.gate_proj"), im, h, WeightKind::Gate, false)?),
            up: Some(lin(&format!("{p}.mlp.up_proj"), im, h, WeightKind::Up, false)?),
            down: lin(&format!("{p}.mlp.down_proj"), h, im, WeightKind::Down, false)?,
        };
        layer.stack_dense()?;
        layers.push(layer);
    }
    let embed = get(embed_name, &[c.vocab_size, h], WeightKind::Embed)?;
    let lm_head = if c.tie_word_embeddings && !src.contains("lm_head.weight") {
        Linear { w: Weight::Dense(embed.clone()), b: None }
    } else {
        lin("lm_head", c.vocab_size, h, WeightKind::LmHead, false)?
    };
    let norm = get("model.norm.weight", &[h], WeightKind::Norm)?;
    let (cos, sin) = rope_tables(c, dtype, dev)?;
    let tp = TpRank::new(plan, comm, c.vocab_size, embed.dtype(), dev)?;
    Ok(Model::from_parts(cfg, dtype, dev.clone(), dir.into(), embed, layers, norm, lm_head, (cos, sin), Some(tp)))
}

fn load_gguf_shard(path: &Path, dev: &Device, comm: Box<dyn TpCollective>) -> Result<Model> {
    let mut src = GgufSource::open(path)?;
    let cfg = ModelConfig::from_gguf(src.content(), path)?;
    let plan = TpPlan::new(&cfg, comm.rank(), comm.world())?;
    // As Model::load_gguf: bf16 activations on our device, f32 elsewhere.
    let dtype = crate::model::gguf_dtype(dev);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let p = format!("blk.{l}");
        let mut qlin = |name: &str, kind: WeightKind, bias: bool| -> Result<Linear> {
            let w = Weight::Quant(gguf_qmatmul(src.get(&format!("{p}.{name}.weight"), plan.split(kind), dev)?, dtype)?);
            let b = if bias { Some(src.get(&format!("{p}.{name}.bias"), plan.split(kind), dev)?.dequantize(dev)?.to_dtype(dtype)?) } else { None };
            Ok(Linear { w, b })
        };
        let bias = cfg.qkv_bias;
        let (q, k, v, o) = (qlin("attn_q", WeightKind::Q, bias)?, qlin("attn_k", WeightKind::K, bias)?, qlin("attn_v", WeightKind::V, bias)?, qlin("attn_output", WeightKind::O, false)?);
        let (gate, up, down) = (qlin("ffn_gate", WeightKind::Gate, false)?, qlin("ffn_up", WeightKind::Up, false)?, qlin("ffn_down", WeightKind::Down, false)?);
        let mut norm = |name: &str| -> Result<Tensor> { Ok(src.get(&format!("{p}.{name}.weight"), Split::Full, dev)?.dequantize(dev)?.to_dtype(dtype)?) };
        let (q_norm, k_norm) = if cfg.qk_norm { (Some(norm("attn_q_norm")?), Some(norm("attn_k_norm")?)) } else { (None, None) };
        layers.push(Layer { qkv: None, gate_up: None, input_norm: norm("attn_norm")?, q: Some(q), k: Some(k), v: Some(v), o, q_norm, k_norm, post_norm: norm("ffn_norm")?, gate: Some(gate), up: Some(up), down });
    }
    let final_norm = src.get("output_norm.weight", Split::Full, dev)?.dequantize(dev)?.to_dtype(dtype)?;
    let vocab = plan.split(WeightKind::Embed);
    let embed_q = src.get("token_embd.weight", vocab, dev)?;
    let embed = embed_q.dequantize(dev)?.to_dtype(dtype)?;
    let head = if src.content().tensor_infos.contains_key("output.weight") { src.get("output.weight", plan.split(WeightKind::LmHead), dev)? } else { embed_q };
    let lm_head = Linear { w: Weight::Quant(gguf_qmatmul(head, dtype)?), b: None };
    let tables = rope_tables(&cfg, dtype, dev)?;
    let tp = TpRank::new(plan, comm, cfg.vocab_size, embed.dtype(), dev)?;
    Ok(Model::from_parts(cfg, dtype, dev.clone(), path.into(), embed, layers, final_norm, lm_head, tables, Some(tp)))
}
