//! Partial rotary embedding with LongRoPE factors and magnitude scaling, and the LongRoPE switch
//! every backend follows ([`RopeState::plan`]).

use crate::checkpoint::TextConfig;

/// Which factor set a forward uses. The reference picks it per forward call from the total
/// sequence length: long iff length > original_max_position_embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    Short,
    Long,
}

pub struct Rope {
    rotary_dim: usize,
    head_dim: usize,
    inv_freq_short: Vec<f32>,
    inv_freq_long: Vec<f32>,
    attention_factor: f32,
    original_max: usize,
    longrope: bool,
}

impl Rope {
    pub fn new(c: &TextConfig) -> Self {
        let half = c.rotary_dim / 2;
        // base^(2i/d) as f32 (torch: python float ** float32 tensor), then
        // 1 / (factor · base^(2i/d)) in f32, as the reference computes it.
        let pow: Vec<f32> = (0..half)
            .map(|i| {
                let e = (2 * i) as f32 / c.rotary_dim as f32;
                c.rope_theta.powf(e as f64) as f32
            })
            .collect();
        let inv = |factors: Option<&[f32]>| -> Vec<f32> {
            pow.iter()
                .enumerate()
                .map(|(i, p)| 1.0 / (factors.map_or(1.0, |f| f[i]) * p))
                .collect()
        };
        let lr = c.longrope.as_ref();
        Rope {
            rotary_dim: c.rotary_dim,
            head_dim: c.head_dim,
            inv_freq_short: inv(lr.map(|l| l.short_factor.as_slice())),
            inv_freq_long: inv(lr.map(|l| l.long_factor.as_slice())),
            attention_factor: lr.map_or(1.0, |l| l.attention_factor as f32),
            original_max: c.original_max_position_embeddings,
            longrope: lr.is_some(),
        }
    }

    /// Whether the model has LongRoPE factors at all (else every forward is short).
    pub fn is_long_capable(&self) -> bool {
        self.longrope
    }

    /// Factor set for a forward whose total visible length is `total_len`.
    pub fn mode_for(&self, total_len: usize) -> RopeMode {
        if self.longrope && total_len > self.original_max {
            RopeMode::Long
        } else {
            RopeMode::Short
        }
    }

    /// The cos/sin tables of `n` tokens from `pos0`, `[n, rotary_dim/2]` each, already scaled by
    /// the attention factor: what a [`RopeTable`] holds, for backends that rotate elsewhere.
    pub fn cos_sin(&self, pos0: usize, n: usize, mode: RopeMode) -> (Vec<f32>, Vec<f32>) {
        let inv = match mode {
            RopeMode::Short => &self.inv_freq_short,
            RopeMode::Long => &self.inv_freq_long,
        };
        let half = self.rotary_dim / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for t in 0..n {
            let p = (pos0 + t) as f32;
            for &f in &inv[..half] {
                let angle = p * f;
                cos.push((angle as f64).cos() as f32 * self.attention_factor);
                sin.push((angle as f64).sin() as f32 * self.attention_factor);
            }
        }
        (cos, sin)
    }

    /// The cos/sin tables of `n` tokens from `pos0`, for [`Rope::rotate`]. A step computes them
    /// once per row and every layer rotates with them (a 128-token prefill of the benchmark
    /// config took 65,000 `f64` sines and cosines, one set per layer, before).
    pub fn table(&self, pos0: usize, n: usize, mode: RopeMode) -> RopeTable {
        let (cos, sin) = self.cos_sin(pos0, n, mode);
        RopeTable { cos, sin }
    }

    /// Rotates the first `rotary_dim` channels of each head of `x` (`[n, heads·head_dim]`),
    /// token `t` by row `t` of `table`.
    pub fn rotate(&self, x: &mut [f32], heads: usize, table: &RopeTable) {
        let half = self.rotary_dim / 2;
        let width = heads * self.head_dim;
        assert_eq!(
            x.len() / width * half,
            table.cos.len(),
            "rope: table length"
        );
        let rows = table.cos.chunks(half).zip(table.sin.chunks(half));
        for (tok, (cos, sin)) in x.chunks_mut(width).zip(rows) {
            for h in tok.chunks_mut(self.head_dim) {
                for i in 0..half {
                    let (a, b) = (h[i], h[i + half]);
                    h[i] = a * cos[i] - b * sin[i];
                    h[i + half] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

/// What [`Rope::rotate`] turns a span's channels by: per token and frequency, cos and sin of the
/// angle, scaled by the attention factor.
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// A row's RoPE bookkeeping, kept by every backend beside its cache: the positions cached, the
/// factor set they were rotated with, and while that is the short set on a LongRoPE model, the
/// input embeddings of every cached position.
#[derive(Clone, Debug)]
pub struct RopeState {
    /// Positions in the cache (= position of the next token).
    pub len: usize,
    pub mode: RopeMode,
    /// The reference re-encodes a sequence from scratch with the long factors when it first grows
    /// past `original_max_position_embeddings`, which needs these; dropped once long.
    history: Vec<f32>,
}

/// How a row's new tokens enter its cache in this step ([`RopeState::plan`]).
pub enum RopePlan<'a> {
    /// Rotated from the current position with the current factors, appended to the cache.
    Append(&'a [f32]),
    /// The row has just crossed the original context with a short-factor cache: its whole
    /// history and the new tokens, from position 0 with the long factors. The cache restarts
    /// empty.
    Reencode(Vec<f32>),
}

impl RopePlan<'_> {
    /// The embeddings to run, `[n, hidden]`.
    pub fn embeds(&self) -> &[f32] {
        match self {
            RopePlan::Append(e) => e,
            RopePlan::Reencode(e) => e,
        }
    }
}

impl Default for RopeState {
    fn default() -> Self {
        RopeState {
            len: 0,
            mode: RopeMode::Short,
            history: Vec::new(),
        }
    }
}

impl RopeState {
    /// Decides how `tokens` new tokens (`embeds`, `[tokens, hidden]`) enter the cache, and moves
    /// the state to the factor set they run with. The factor set follows the total length (long
    /// iff cache + new tokens > `original_max_position_embeddings`); the first forward that
    /// crosses it re-encodes the short-factor history once, as the reference intends. The caller
    /// advances [`RopeState::len`] by the tokens it runs.
    pub fn plan<'a>(&mut self, rope: &Rope, embeds: &'a [f32], tokens: usize) -> RopePlan<'a> {
        let mode = rope.mode_for(self.len + tokens);
        if mode == RopeMode::Long && self.mode == RopeMode::Short {
            let mut full = std::mem::take(&mut self.history);
            full.extend_from_slice(embeds);
            self.len = 0;
            self.mode = RopeMode::Long;
            return RopePlan::Reencode(full);
        }
        self.mode = mode;
        if mode == RopeMode::Short && rope.is_long_capable() {
            self.history.extend_from_slice(embeds);
        }
        RopePlan::Append(embeds)
    }
}
