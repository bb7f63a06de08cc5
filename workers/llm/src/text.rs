//! Tokenizer and chat template: `tokenizer.json` through the `tokenizers` crate (or built
//! from GGUF metadata for the `gpt2` BPE kind), the chat template from
//! `tokenizer_config.json` or GGUF metadata, rendered with `minijinja` with the helpers
//! Hugging Face templates use (`raise_exception`, `strftime_now`, Python string methods).
use crate::error::{malformed, Error, Result};
use candle_core::quantized::gguf_file;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// A model's text side: tokenizer, chat template and special tokens.
pub struct TextTools {
    pub tokenizer: Tokenizer,
    /// The Jinja chat template, if the model has one.
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Where the tokenizer came from (a file, or the GGUF metadata).
    pub source: PathBuf,
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    /// A message of `role` (`system`, `user`, `assistant`).
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

/// Reads a `tokenizer.json` (clear errors for a missing or malformed one).
pub fn load_tokenizer_file(path: &Path) -> Result<Tokenizer> {
    if !path.is_file() {
        return Err(Error::NotFound(path.into()));
    }
    Tokenizer::from_file(path).map_err(|e| malformed(path, format!("not a tokenizer.json: {e}")))
}

/// The chat template of a `tokenizer_config.json` value: a string, or a list of named
/// templates (the one named `default`).
fn template_of(v: &Value) -> Option<String> {
    match v.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => a.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("default")).and_then(|t| t.get("template")).and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

impl TextTools {
    /// The text tools of a model at `model_path` (folder or GGUF file); `tokenizer` overrides
    /// the tokenizer file. `vocab` is the model's vocabulary: a tokenizer with more ids is
    /// [`Error::VocabMismatch`].
    pub fn load(model_path: &Path, tokenizer: Option<&Path>, vocab: usize) -> Result<TextTools> {
        let tools = if model_path.is_dir() { Self::load_hf(model_path, tokenizer)? } else { Self::load_gguf(model_path, tokenizer)? };
        let n = tools.tokenizer.get_vocab_size(true);
        if n > vocab {
            return Err(Error::VocabMismatch { path: tools.source.clone(), tokenizer: n, model: vocab });
        }
        Ok(tools)
    }

    fn load_hf(dir: &Path, tokenizer: Option<&Path>) -> Result<TextTools> {
        let tpath = tokenizer.map(PathBuf::from).unwrap_or_else(|| dir.join("tokenizer.json"));
        let tok = load_tokenizer_file(&tpath)?;
        let cfg_path = dir.join("tokenizer_config.json");
        let (mut chat_template, mut bos_token, mut eos_token) = (None, None, None);
        if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|source| Error::Io { path: cfg_path.clone(), source })?;
            let v: Value = serde_json::from_str(&text).map_err(|e| malformed(&cfg_path, format!("not JSON: {e}")))?;
            chat_template = template_of(&v);
            bos_token = token_text(v.get("bos_token"));
            eos_token = token_text(v.get("eos_token"));
        }
        // Newer checkpoints keep the template in its own file.
        let jinja = dir.join("chat_template.jinja");
        if chat_template.is_none() && jinja.is_file() {
            chat_template = Some(std::fs::read_to_string(&jinja).map_err(|source| Error::Io { path: jinja, source })?);
        }
        Ok(TextTools { tokenizer: tok, chat_template, bos_token, eos_token, source: tpath })
    }

    fn load_gguf(file: &Path, tokenizer: Option<&Path>) -> Result<TextTools> {
        let mut f = std::fs::File::open(file).map_err(|source| Error::Io { path: file.into(), source })?;
        let ct = gguf_file::Content::read(&mut f).map_err(|e| malformed(file, format!("not a GGUF file: {e}")))?;
        let md = |k: &str| ct.metadata.get(k);
        let s = |k: &str| md(k).and_then(|v| v.to_string().ok()).cloned();
        let chat_template = s("tokenizer.chat_template");
        let tokens: Option<Vec<String>> = md("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()).map(|a| a.iter().filter_map(|x| x.to_string().ok().cloned()).collect());
        let id_text = |k: &str| md(k).and_then(|v| v.to_u32().ok()).and_then(|i| tokens.as_ref()?.get(i as usize).cloned());
        let (bos_token, eos_token) = (id_text("tokenizer.ggml.bos_token_id"), id_text("tokenizer.ggml.eos_token_id"));
        let next_to = file.with_file_name("tokenizer.json");
        let (tok, source) = match tokenizer {
            Some(p) => (load_tokenizer_file(p)?, p.to_path_buf()),
            None if next_to.is_file() => (load_tokenizer_file(&next_to)?, next_to),
            None => match (s("tokenizer.ggml.model").as_deref(), &tokens) {
                (Some("gpt2"), Some(tokens)) => {
                    let merges: Vec<String> = md("tokenizer.ggml.merges").and_then(|v| v.to_vec().ok()).map(|a| a.iter().filter_map(|x| x.to_string().ok().cloned()).collect()).unwrap_or_default();
                    (gpt2_tokenizer(tokens, &merges).map_err(|e| malformed(file, format!("tokenizer in the metadata: {e}")))?, file.to_path_buf())
                }
                _ => return Err(Error::NoTokenizer(file.into())),
            },
        };
        Ok(TextTools { tokenizer: tok, chat_template, bos_token, eos_token, source })
    }

    /// Token ids of `text` (special tokens written in the text are recognized; nothing is
    /// added: what a rendered chat template needs).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, false)
    }

    /// Token ids of `text`, with the tokenizer's post-processor adding its special tokens
    /// (a BOS for Llama checkpoints) when `add_special_tokens`: what a plain prompt needs,
    /// as `transformers` encodes by default.
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, add_special_tokens).map_err(|e| Error::Invalid(format!("tokenizing: {e}")))?.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| Error::Invalid(format!("decoding: {e}")))
    }

    /// Renders the chat template for `messages`, ending with the assistant's turn's opening
    /// when `add_generation_prompt`.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let t = self.chat_template.as_deref().ok_or_else(|| Error::Template("the model has no chat template".into()))?;
        render_chat(t, messages, add_generation_prompt, self.bos_token.as_deref(), self.eos_token.as_deref())
    }
}

/// A byte-level BPE tokenizer from GGUF `gpt2`-kind metadata (tokens and `"a b"` merges).
fn gpt2_tokenizer(tokens: &[String], merges: &[String]) -> std::result::Result<Tokenizer, String> {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| format!("merge {m:?} is not two tokens")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| e.to_string())?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevel::default()));
    Ok(tok)
}

/// Civil date of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `strftime` of the current UTC time for the directives chat templates use
/// (`%d %m %Y %y %b %B %H %M %S %%`).
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let tod = secs.rem_euclid(86_400);
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('d') => out += &format!("{d:02}"),
            Some('m') => out += &format!("{m:02}"),
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &format!("{:02}", y.rem_euclid(100)),
            Some('b') => out += &MONTHS[m as usize - 1][..3],
            Some('B') => out += MONTHS[m as usize - 1],
            Some('H') => out += &format!("{:02}", tod / 3600),
            Some('M') => out += &format!("{:02}", tod / 60 % 60),
            Some('S') => out += &format!("{:02}", tod % 60),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o)
            }
            None => out.push('%'),
        }
    }
    out
}

/// serde_json formatting with Python's `json.dumps` separators (`", "` and `": "`).
struct PySeparators;

impl serde_json::ser::Formatter for PySeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `tojson` as `transformers` defines it for chat templates: `json.dumps` (Python's
/// separators, `indent=N` pretty-printing, no HTML escaping, non-ASCII kept).
fn tojson(v: minijinja::Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<minijinja::Value, minijinja::Error> {
    use serde::Serialize;
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let r = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad));
            v.serialize(&mut ser)
        }
        None => v.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PySeparators)),
    };
    r.map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(minijinja::Value::from_safe_string(String::from_utf8(out).expect("serde_json writes UTF-8")))
}

/// Renders a Hugging Face chat template (Jinja) with `messages`, `add_generation_prompt`,
/// `bos_token` and `eos_token`, as `transformers` does (trim_blocks, lstrip_blocks).
pub fn render_chat(template: &str, messages: &[Message], add_generation_prompt: bool, bos: Option<&str>, eos: Option<&str>) -> Result<String> {
    use minijinja::{context, Environment, ErrorKind};
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> { Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg)) });
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", tojson);
    let e = |x: minijinja::Error| Error::Template(format!("{x:#}"));
    env.add_template("chat", template).map_err(e)?;
    let t = env.get_template("chat").map_err(e)?;
    t.render(context! { messages => messages, add_generation_prompt => add_generation_prompt, bos_token => bos.unwrap_or(""), eos_token => eos.unwrap_or("") }).map_err(e)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil(0), (1970, 1, 1));
        assert_eq!(super::civil(19_723), (2024, 1, 1));
        assert_eq!(super::civil(11_016), (2000, 2, 29));
    }
}
