//! A served test model: a real `tokenizers` byte-level BPE tokenizer (one token per byte, ids =
//! byte values, `<s>` = 256, `</s>` = 257) and a deterministic paged "model" whose logits after
//! a context are a hash of every token of it, read back through the block table from the
//! runner's own slot store (a wrong block table or a slot of another sequence changes the
//! tokens). Its outputs are lowercase letters, spaces, `é` (two byte tokens, to exercise
//! held-back partial characters) and sometimes EOS. [`reference_greedy`] computes the greedy
//! continuation directly, without engine or server.
#![allow(dead_code)]

use llm_engine::{Engine, EngineConfig, ModelRunner, SeqChunk};
use llm_server::{ChatMessage, ServedModel, Server, ServerConfig};
use std::time::Duration;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

pub const VOCAB: usize = 258;
pub const BOS: u32 = 256;
pub const EOS: u32 = 257;

/// GPT-2's byte-to-character map (the byte-level pre-tokenizer's alphabet).
fn byte_char(b: u8) -> char {
    let keep = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if keep(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !keep(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

pub fn tokenizer() -> Tokenizer {
    let vocab: tokenizers::models::bpe::Vocab = (0..=255u8).map(|b| (byte_char(b).to_string(), b as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, vec![]).build().unwrap();
    let mut t = Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(ByteLevel::new(false, false, false)));
    t.with_decoder(Some(ByteLevel::default()));
    t.add_special_tokens([AddedToken::from("<s>", true), AddedToken::from("</s>", true)]).unwrap();
    assert_eq!(t.token_to_id("<s>"), Some(BOS));
    assert_eq!(t.token_to_id("</s>"), Some(EOS));
    let post = TemplateProcessing::builder().try_single("<s> $A").unwrap().special_tokens(vec![("<s>", BOS)]).build().unwrap();
    t.with_post_processor(Some(post));
    t
}

pub struct TestModel {
    pub tok: Tokenizer,
    pub max_len: usize,
}

impl ServedModel for TestModel {
    fn name(&self) -> &str {
        "tiny-test"
    }
    fn max_model_len(&self) -> usize {
        self.max_len
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        vec![EOS]
    }
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.tok.encode(text, add_special_tokens).map(|e| e.get_ids().to_vec()).map_err(|e| e.to_string())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tok.decode(ids, true).map_err(|e| e.to_string())
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let mut s = String::from("<s>");
        for m in messages {
            s.push_str(&format!("[{}] {}\n", m.role, m.content));
        }
        s.push_str("[assistant] ");
        Ok(s)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The logits after `history`, straight from the tokens.
pub fn reference_logits(history: &[u32]) -> Vec<f32> {
    let h = history.iter().enumerate().fold(0x5eed_u64, |h, (p, &t)| mix(mix(h, t as u64 + 1), p as u64));
    let last = *history.last().unwrap();
    let mut l = vec![-40.0f32; VOCAB];
    if last == 0xC3 {
        l[0xA9] = 10.0; // the second byte of é
        return l;
    }
    for (i, t) in (b'a'..=b'z').chain([b' ', 0xC3]).enumerate() {
        l[t as usize] = ((mix(h, i as u64) >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0;
    }
    l[0xC3] -= 1.5;
    // EOS now and then (about one context in 60 greedily).
    l[EOS as usize] = if mix(h, 999).is_multiple_of(60) { 5.0 } else { -5.0 };
    l
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

/// Greedy continuation of `prompt` (without the EOS that ends it), and whether EOS ended it.
pub fn reference_greedy(prompt: &[u32], max_tokens: usize) -> (Vec<u32>, bool) {
    let mut h = prompt.to_vec();
    for _ in 0..max_tokens {
        let t = argmax(&reference_logits(&h));
        if t == EOS {
            return (h[prompt.len()..].to_vec(), true);
        }
        h.push(t);
    }
    (h[prompt.len()..].to_vec(), false)
}

#[derive(Debug)]
pub struct RunnerError(String);
impl std::fmt::Display for RunnerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for RunnerError {}

/// The paged runner: slot `block * block_size + offset` holds (token, position). A prompt
/// with the byte token 1 makes its step fail; with 2, panic.
pub struct TestRunner {
    pub block_size: usize,
    pub slots: Vec<Option<(u32, usize)>>,
    pub step_delay: Duration,
}

impl ModelRunner for TestRunner {
    type Error = RunnerError;
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.slots.len() / self.block_size
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, RunnerError> {
        std::thread::sleep(self.step_delay);
        // Fault injection: byte 1 in a prompt makes the step fail, byte 2 panics the engine.
        if batch.iter().any(|c| c.tokens.contains(&1)) {
            return Err(RunnerError("injected runner failure".into()));
        }
        assert!(!batch.iter().any(|c| c.tokens.contains(&2)), "injected runner panic");
        let bs = self.block_size;
        let mut out = Vec::new();
        for c in batch {
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                self.slots[c.block_table[p / bs] as usize * bs + p % bs] = Some((t, p));
            }
            if c.sample {
                let end = c.start_pos + c.tokens.len();
                let mut hist = Vec::with_capacity(end);
                for p in 0..end {
                    match self.slots[c.block_table[p / bs] as usize * bs + p % bs] {
                        Some((t, q)) if q == p => hist.push(t),
                        s => return Err(RunnerError(format!("slot of position {p} holds {s:?}"))),
                    }
                }
                out.push(reference_logits(&hist));
            }
        }
        Ok(out)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), RunnerError> {
        let bs = self.block_size;
        for &(s, d) in pairs {
            for o in 0..bs {
                self.slots[d as usize * bs + o] = self.slots[s as usize * bs + o];
            }
        }
        Ok(())
    }
}

/// Engine limits and runner speed of a test server.
#[derive(Clone)]
pub struct Setup {
    pub max_num_seqs: usize,
    pub num_blocks: usize,
    pub max_len: usize,
    pub step_delay: Duration,
    pub load_delay: Duration,
    pub config: ServerConfig,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            max_num_seqs: 8,
            num_blocks: 48,
            max_len: 256,
            step_delay: Duration::from_millis(1),
            load_delay: Duration::ZERO,
            config: ServerConfig { max_body_bytes: 64 << 10, shutdown_grace: Duration::from_secs(5), ..ServerConfig::default() },
        }
    }
}

/// Starts a server on 127.0.0.1 (a free port) over the test model; not yet necessarily ready.
pub async fn start(setup: Setup) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = setup.clone();
    Server::start(setup.config, listener, move || {
        std::thread::sleep(s.load_delay);
        let runner = TestRunner { block_size: 16, slots: vec![None; s.num_blocks * 16], step_delay: s.step_delay };
        let cfg = EngineConfig { max_num_seqs: s.max_num_seqs, max_batched_tokens: 128, max_model_len: s.max_len, prefix_caching: true };
        let engine = Engine::try_new(runner, cfg)?;
        Ok((TestModel { tok: tokenizer(), max_len: s.max_len }, engine))
    })
    .unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap()
}

/// The `data:` payloads of a complete SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n").filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))).map(str::to_string).collect()
}

/// The value of a Prometheus series line `name value`.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).unwrap_or_else(|| panic!("no {name} in\n{text}")).parse().unwrap()
}
