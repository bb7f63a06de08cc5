//! Sampling parameters and the host sampler (skeleton).

/// Per-request generation settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy argmax; must be >= 0.
    pub temperature: f32,
    /// Keep only the k most likely tokens (k >= 1).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p, p in (0, 1].
    pub top_p: Option<f32>,
    /// Drop tokens whose probability is below min_p times the largest, min_p in [0, 1].
    pub min_p: Option<f32>,
    /// Divides positive logits (multiplies negative ones) of tokens already in the sequence; > 0.
    pub repetition_penalty: Option<f32>,
    /// Seed of the request's RNG (ChaCha); `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Tokens to generate at most (>= 1).
    pub max_tokens: usize,
    /// Token ids that end generation (EOS); not emitted.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation when they appear in the decoded completion; not emitted.
    pub stop_strings: Vec<String>,
    /// Report the sampled token's logprob and this many top logprobs.
    pub logprobs: Option<usize>,
}

/// One row to sample: the logits and the request state the processors need.
pub struct SampleInput<'a> {
    pub logits: &'a [f32],
    pub params: &'a SamplingParams,
    /// Every token of the sequence so far (prompt and generated), for the repetition penalty.
    pub history: &'a [u32],
    /// The request's RNG.
    pub rng: &'a mut rand_chacha::ChaCha12Rng,
}

/// A sampled token with its logprobs when asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Turns logits rows into tokens; the host implementation is [`HostSampler`], a device sampler
/// may replace it.
pub trait Sampler: Send {
    /// Samples one token per input, in order.
    fn sample(&mut self, batch: &mut [SampleInput<'_>]) -> Vec<Sampled>;
}

/// Sampling on the host in f32/f64.
#[derive(Clone, Debug, Default)]
pub struct HostSampler;

impl Sampler for HostSampler {
    fn sample(&mut self, _batch: &mut [SampleInput<'_>]) -> Vec<Sampled> {
        todo!()
    }
}
