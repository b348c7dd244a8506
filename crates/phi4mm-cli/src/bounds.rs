//! The work a benchmark's figures are measured against: the floating-point operations of a
//! prefill, the bytes a decode step reads, and this machine's read bandwidth. `phi4mm bench` and
//! `phi4mm bench-batch` both report their figures as fractions of the bounds these give (with the
//! FMA peak of [`crate::peak`]), measured in the same run.

use std::time::Instant;

use rayon::prelude::*;
use serde_json::{json, Value};
use switchyard_phi4mm::checkpoint::{Checkpoint, TextConfig};
use switchyard_phi4mm::kernels::linear::Matrix;

/// Best-of-3 multithreaded read bandwidth in bytes/s (sums a buffer far larger than the caches).
fn read_bandwidth(bytes: usize) -> f64 {
    let n = bytes / 8;
    let buf: Vec<u64> = (0..n as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .reduce(|| 0, u64::wrapping_add);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max(bytes as f64 / secs);
    }
    best
}

/// This machine's FMA peak and read bandwidth, measured before a benchmark's rounds and again
/// after them; each bound is the higher of the two. A bound is what the machine can do, and a
/// measurement can only come in low: on these shared 2-vCPU machines a neighbour that takes a
/// core for the fraction of a second the peak test runs halves it (one run measured 103
/// GFLOP/s against 202 in the runs beside it, and reported a prefill at 1.04 of its peak).
/// Measured twice, a bound would have to be disturbed at both ends of the run. Each
/// measurement is kept in the report, so a disturbed one shows.
pub struct MachineBounds {
    pub peak_gflops: f64,
    pub peak_vector_path: &'static str,
    /// Bytes/s.
    pub read_bandwidth: f64,
    peak_measured: Vec<f64>,
    bandwidth_measured: Vec<f64>,
}

impl MachineBounds {
    /// The first measurement; run it on the pool whose threads the benchmark uses.
    pub fn measure(bandwidth_bytes: usize) -> MachineBounds {
        let mut bounds = MachineBounds {
            peak_gflops: 0.0,
            peak_vector_path: "",
            read_bandwidth: 0.0,
            peak_measured: Vec::new(),
            bandwidth_measured: Vec::new(),
        };
        bounds.measure_again(bandwidth_bytes);
        bounds
    }

    /// One more measurement, on the same pool.
    pub fn measure_again(&mut self, bandwidth_bytes: usize) {
        let bandwidth = read_bandwidth(bandwidth_bytes);
        let (peak, path) = crate::peak::peak_gflops();
        self.peak_measured.push(peak);
        self.bandwidth_measured.push(bandwidth);
        self.peak_gflops = self.peak_gflops.max(peak);
        self.read_bandwidth = self.read_bandwidth.max(bandwidth);
        self.peak_vector_path = path;
    }

    /// Writes every measurement, in order, into the JSON object `report`:
    /// `peak_gflops_measured` and `read_bandwidth_gb_s_measured`.
    pub fn record_measurements(&self, report: &mut Value) {
        let gb: Vec<f64> = self.bandwidth_measured.iter().map(|b| b / 1e9).collect();
        report["peak_gflops_measured"] = json!(self.peak_measured);
        report["read_bandwidth_gb_s_measured"] = json!(gb);
    }
}

/// Floating-point operations of one prefill of `tokens` tokens, as the host does them: the
/// layers' linears on every token, causal attention (scores and weighted values, both halves of
/// the triangle's work), and the LM head on the last token. Only the last token feeds the head,
/// so the last layer projects every token's keys and values but attends, projects and runs its
/// MLP for the last token alone.
pub fn prefill_flops(ck: &Checkpoint, c: &TextConfig, tokens: usize) -> f64 {
    let params = |m: &Matrix<'_>| m.out_dim * m.in_dim;
    let linears = layer_linears(ck, c.num_layers);
    let all_tokens: usize = linears.iter().map(params).sum();
    // The last layer's linears past its qkv projection (`layer_linears` order).
    let last_token_only: usize = linears.iter().rev().take(3).map(params).sum();
    let linear_macs = all_tokens * tokens - last_token_only * tokens.saturating_sub(1);
    let triangle: usize = (1..=tokens).sum();
    let positions = c.num_layers.saturating_sub(1) * triangle + tokens;
    let attention = 4 * c.num_heads * c.head_dim * positions;
    let head = c.hidden_size * c.vocab_size;
    2.0 * (linear_macs + head) as f64 + attention as f64
}

/// The decoder's linear weights one decode step reads, per layer, in the model's order.
pub fn layer_linears(ck: &Checkpoint, layers: usize) -> Vec<Matrix<'_>> {
    let modules = [
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
    ];
    (0..layers)
        .flat_map(|l| modules.map(|m| format!("model.layers.{l}.{m}.weight")))
        .map(|n| Matrix::of(ck.tensor(&n)))
        .collect()
}

/// Bytes of weights one decode step reads, whatever the batch: every decoder linear and the LM
/// head (tied in the benchmark checkpoint: the embedding table; the embedding lookup itself
/// reads one row per token).
pub struct DecodeBytes {
    pub linears: usize,
    pub head: usize,
}

impl DecodeBytes {
    pub fn of(ck: &Checkpoint, c: &TextConfig) -> DecodeBytes {
        let head_name = if c.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let linears = ck
            .tensor_names()
            .filter(|n| n.starts_with("model.layers.") && n.ends_with("_proj.weight"))
            .map(|n| ck.tensor(n).size_bytes())
            .sum();
        DecodeBytes {
            linears,
            head: ck.tensor(head_name).size_bytes(),
        }
    }

    pub fn total(&self) -> usize {
        self.linears + self.head
    }
}
