//! The worker's typed errors: each names the file (or input) and what is wrong with it.
use std::path::PathBuf;

/// Errors of loading and running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder the model needs does not exist.
    #[error("{0}: not found")]
    NotFound(PathBuf),
    /// A file exists but cannot be parsed (JSON, safetensors, GGUF, tokenizer).
    #[error("{path}: malformed: {msg}")]
    Malformed { path: PathBuf, msg: String },
    /// The model's architecture is not one of the llama family this worker runs.
    #[error("{path}: unknown architecture {arch:?}; supported: llama, mistral, qwen2, qwen3 (safetensors) and llama, qwen2, qwen3 (GGUF)")]
    UnknownArchitecture { path: PathBuf, arch: String },
    /// A GGUF tensor type the loader cannot read.
    #[error("{path}: unsupported GGML type: {msg}")]
    UnsupportedGgmlType { path: PathBuf, msg: String },
    /// The tokenizer has ids the model has no embedding for.
    #[error("tokenizer {path}: {tokenizer} ids, but the model's vocabulary has {model}: mismatched tokenizer")]
    VocabMismatch { path: PathBuf, tokenizer: usize, model: usize },
    /// A model option this worker does not implement (a rope type, an activation, ...).
    #[error("{path}: unsupported: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    /// A GGUF file without a usable tokenizer in its metadata and no tokenizer.json.
    #[error("{0}: no tokenizer.json next to the model and no usable tokenizer in its metadata; pass --tokenizer FILE")]
    NoTokenizer(PathBuf),
    /// Rendering the chat template failed (syntax, `raise_exception`, missing template).
    #[error("chat template: {0}")]
    Template(String),
    /// Bad input to the runner (a block table too short, a position past the rope table, ...).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A tensor-parallel split this model or machine cannot do: heads, key/value heads,
    /// intermediate size or vocabulary not divisible by the size, more ranks than devices,
    /// a GGML block layout that a column slice would cut.
    #[error("tensor parallelism: {0}")]
    TensorParallel(String),
    /// The communicator between the ranks could not be set up or failed (NCCL's or RCCL's
    /// own message included).
    #[error("tensor parallelism: communicator: {0}")]
    Collective(String),
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// An error of a tensor op.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn malformed(path: impl Into<PathBuf>, msg: impl std::fmt::Display) -> Error {
    Error::Malformed { path: path.into(), msg: msg.to_string() }
}
