//! CLIP's byte-level BPE tokenizer from the `vocab.json` + `merges.txt` of a diffusers
//! `tokenizer/` directory (or its `tokenizer.json` when there is one), with CLIP's
//! normalisation (NFC, lower case) and word split, start/end tokens and padding to the
//! text encoder's length.

use crate::{ClipConfig, Result, SdError};
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{unicode::NFC, utils::Sequence as NormSeq, Lowercase};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSeq;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

/// CLIP's word pattern (special tokens, English contractions, letter runs, single digits,
/// runs of other non-space characters).
pub const CLIP_PATTERN: &str = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
pub const BOS: &str = "<|startoftext|>";
pub const EOS: &str = "<|endoftext|>";

/// Tokens of the tiny vocabulary [`crate::random`] writes: 256 byte symbols, each again
/// with CLIP's end-of-word suffix, [`TINY_MERGES`] merged tokens, then the two specials.
pub const TINY_VOCAB_SIZE: usize = 512 + TINY_MERGES.len() + 2;
/// The tiny vocabulary's merges (enough to exercise BPE merging on common words).
pub const TINY_MERGES: &[(&str, &str)] = &[("t", "h"), ("th", "e</w>"), ("a", "n"), ("an", "d</w>"), ("o", "f</w>"), ("i", "n"), ("in", "g</w>")];

/// A CLIP tokenizer for one text encoder.
pub struct ClipTokenizer {
    tok: Tokenizer,
    bos: u32,
    eos: u32,
    pad: u32,
    len: usize,
    vocab: usize,
    path: PathBuf,
}

fn err(path: &Path, msg: impl ToString) -> SdError {
    SdError::Tokenizer { path: path.into(), msg: msg.to_string() }
}

impl ClipTokenizer {
    /// Loads the tokenizer of `dir` for an encoder of config `clip` (sequence length, pad
    /// token, vocabulary size, which every id must fit).
    pub fn load(dir: &Path, clip: &ClipConfig) -> Result<Self> {
        let json = dir.join("tokenizer.json");
        let tok = if json.is_file() {
            Tokenizer::from_file(&json).map_err(|e| err(&json, e))?
        } else {
            let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
            for p in [&vocab, &merges] {
                if !p.is_file() {
                    return Err(SdError::MissingFile { what: "tokenizer file", path: p.clone() });
                }
            }
            let bpe = BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy())
                .unk_token(EOS.into())
                .end_of_word_suffix("</w>".into())
                .build()
                .map_err(|e| err(&vocab, e))?;
            let mut tok = Tokenizer::new(bpe);
            tok.with_normalizer(Some(NormSeq::new(vec![NFC.into(), Lowercase.into()]))).map_err(|e| err(dir, e))?;
            let split = Split::new(SplitPattern::Regex(CLIP_PATTERN.into()), SplitDelimiterBehavior::Removed, true).map_err(|e| err(dir, e))?;
            tok.with_pre_tokenizer(Some(PreSeq::new(vec![split.into(), ByteLevel::new(false, true, false).into()])));
            tok
        };
        let id = |s: &str| tok.token_to_id(s).ok_or_else(|| err(dir, format!("no {s} token")));
        let (bos, eos) = (id(BOS)?, id(EOS)?);
        let pad = match clip.pad_with() {
            Some(p) => id(p).or_else(|_| id(&format!("{p}</w>")))?,
            None => eos,
        };
        let vocab = tok.get_vocab_size(true);
        if vocab > clip.vocab_size() {
            return Err(err(dir, format!("{vocab} tokens, but the text encoder has {}", clip.vocab_size())));
        }
        Ok(Self { tok, bos, eos, pad, len: clip.max_len(), vocab, path: dir.into() })
    }

    /// Token ids of `text`: start token, the text's tokens (cut to fit), end token, padding
    /// to the encoder's length.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tok.encode(text, false).map_err(|e| err(&self.path, e))?;
        let mut ids = vec![self.bos];
        ids.extend(enc.get_ids().iter().take(self.len - 2));
        ids.push(self.eos);
        ids.resize(self.len, self.pad);
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(err(&self.path, format!("token id {bad} out of the vocabulary")));
        }
        Ok(ids)
    }
}

/// Writes the tiny CLIP tokenizer (`vocab.json`, `merges.txt`) into `dir`.
pub fn write_tiny(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // The byte-level alphabet: bytes mapped to printable characters as GPT-2/CLIP do.
    let alphabet = ByteLevel::alphabet();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort();
    let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    vocab.extend(chars.iter().map(|c| format!("{c}</w>")));
    vocab.extend(TINY_MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    vocab.push(BOS.into());
    vocab.push(EOS.into());
    debug_assert_eq!(vocab.len(), TINY_VOCAB_SIZE);
    let map: serde_json::Map<String, serde_json::Value> = vocab.into_iter().enumerate().map(|(i, t)| (t, i.into())).collect();
    std::fs::write(dir.join("vocab.json"), serde_json::to_string(&map)?)?;
    let mut merges = String::from("#version: 0.2\n");
    for (a, b) in TINY_MERGES {
        merges.push_str(&format!("{a} {b}\n"));
    }
    std::fs::write(dir.join("merges.txt"), merges)
}
