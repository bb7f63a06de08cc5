//! The llm-engine contract (`SeqChunk`, `ModelRunner`) until that crate lands on this branch.
/// One sequence's work in one engine step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    pub seq_id: u64,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    pub block_table: Vec<u32>,
    pub sample: bool,
}
/// The model side of the engine.
pub trait ModelRunner {
    type Error: std::error::Error + Send + Sync + 'static;
    fn block_size(&self) -> usize;
    fn num_blocks(&self) -> usize;
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error>;
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), Self::Error>;
}
