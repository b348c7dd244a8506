//! Per-row token sampling: greedy, or temperature with top-k / top-p from a seeded generator.
//!
//! Every row owns its own [`Sampler`] (and so its own random state): a row's tokens never depend
//! on which other rows share its batch, and a reused slot starts from a fresh sampler.

/// Index of the largest logit (first one on ties, like `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The first logit that is NaN or infinite, with its id. Finite weights and inputs give finite
/// logits, so one that is not means broken weights or config (say, weights near the largest
/// bf16 that overflow a product), and no token drawn from them means anything. The scan costs
/// a pass over the vocabulary per row and step: `v * 0` is 0 for a finite `v` and NaN
/// otherwise, summed in lanes without a branch, and only a row that fails is searched.
pub fn first_non_finite(logits: &[f32]) -> Option<(u32, f32)> {
    const LANES: usize = 16;
    let mut lanes = [0.0f32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v * 0.0;
        }
    }
    if lanes.iter().all(|&l| l == 0.0) && rest.iter().all(|v| v.is_finite()) {
        return None;
    }
    logits
        .iter()
        .position(|v| !v.is_finite())
        .map(|i| (i as u32, logits[i]))
}

/// How one request picks its tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    /// `0` (or below) = greedy.
    pub temperature: f32,
    /// `0` = no top-k cut.
    pub top_k: usize,
    /// `1` = no nucleus cut.
    pub top_p: f32,
    /// Seed of the row's generator; `None` takes the scheduler's per-request default.
    pub seed: Option<u64>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingConfig {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Refuses values a sampler cannot honour (checked at admission).
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }
}

/// A sampling setting no sampler can honour.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be finite and ≥ 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
}

/// Log probabilities at one step: the sampled token's and the `k` most likely tokens', best first
/// (ties by id, as argmax), from the model's logits — before temperature, top-k or top-p shape
/// them for sampling.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub sampled: (u32, f32),
    pub top: Vec<(u32, f32)>,
}

impl Logprobs {
    pub fn of(logits: &[f32], sampled: u32, k: usize) -> Self {
        // log-softmax: each term in f32 (relative error ~1e-7), the sum and the log in f64, so
        // the result is exact to f32 even over a 200k vocabulary.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
        let lse = max as f64 + sum.ln();
        let logprob = |i: u32| (logits[i as usize] as f64 - lse) as f32;
        Logprobs {
            sampled: (sampled, logprob(sampled)),
            top: best_ids(logits, k)
                .into_iter()
                .map(|i| (i, logprob(i)))
                .collect(),
        }
    }
}

/// Whether token `a` ranks before token `b`: the higher logit, and on a tie the lower id (the
/// order greedy argmax picks in). A total order, so every selection below is deterministic.
fn ranks_before(logits: &[f32], a: u32, b: u32) -> bool {
    logits[b as usize]
        .total_cmp(&logits[a as usize])
        .then(a.cmp(&b))
        .is_lt()
}

/// Up to this many, the best ids come from one pass with a sorted shortlist; beyond, from a
/// selection over all ids.
const SHORTLIST: usize = 64;

/// The `m` best token ids, best first. Never sorts the whole vocabulary: the per-token cost at
/// 200k tokens is what every sampled or reported token pays.
pub(crate) fn best_ids(logits: &[f32], m: usize) -> Vec<u32> {
    let n = logits.len();
    let m = m.min(n);
    if m == 0 {
        return Vec::new();
    }
    if m <= SHORTLIST {
        // Almost every logit loses to the shortlist's last entry at its first comparison.
        let mut best: Vec<u32> = Vec::with_capacity(m + 1);
        for i in 0..n as u32 {
            if best.len() == m && !ranks_before(logits, i, best[m - 1]) {
                continue;
            }
            let at = best.partition_point(|&b| ranks_before(logits, b, i));
            best.insert(at, i);
            best.truncate(m);
        }
        return best;
    }
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..n as u32).collect();
    if m < n {
        ids.select_nth_unstable_by(m - 1, order);
        ids.truncate(m);
    }
    ids.sort_unstable_by(order);
    ids
}

/// SplitMix64: tiny, seedable, and good enough for drawing one token per step.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The sampling state of one row.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplingConfig,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(config: SamplingConfig, default_seed: u64) -> Self {
        let seed = config.seed.unwrap_or(default_seed);
        Sampler {
            config,
            rng: SplitMix64(seed),
        }
    }

    /// Picks the next token from a row's logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.is_greedy() {
            return argmax(logits);
        }
        let (t, n) = (self.config.temperature, logits.len());
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weight = |i: u32| (((logits[i as usize] - max) / t) as f64).exp();
        let top_p = self.config.top_p as f64;
        if self.config.top_k > 0 && self.config.top_k < n {
            let ids = best_ids(logits, self.config.top_k);
            let total: f64 = ids.iter().map(|&i| weight(i)).sum();
            let keep = nucleus(&ids, &weight, total, top_p).unwrap_or(ids.len());
            return self.draw(ids[..keep].iter().copied(), &weight);
        }
        // Every token's weight, computed once.
        let weights: Vec<f64> = (0..n as u32).map(weight).collect();
        let weight = |i: u32| weights[i as usize];
        if top_p >= 1.0 {
            return self.draw(0..n as u32, &weight);
        }
        // The nucleus is the best tokens up to `top_p` of the whole mass. A language model's
        // distribution is peaked, so look at the best few, then at more, and sort the whole
        // vocabulary only when a flat distribution needs it.
        let total: f64 = weights.iter().sum();
        for m in [SHORTLIST, 1024, n] {
            let ids = best_ids(logits, m);
            if let Some(keep) = nucleus(&ids, &weight, total, top_p) {
                return self.draw(ids[..keep].iter().copied(), &weight);
            }
            if m >= n {
                return self.draw(ids.into_iter(), &weight);
            }
        }
        unreachable!("the last round looks at every token")
    }

    /// Draws one of `ids` (at least one) with probability proportional to its weight.
    fn draw(
        &mut self,
        ids: impl Iterator<Item = u32> + Clone,
        weight: &impl Fn(u32) -> f64,
    ) -> u32 {
        let total: f64 = ids.clone().map(weight).sum();
        let u = self.rng.next_f64() * total;
        let mut acc = 0.0;
        let mut last = None;
        for i in ids {
            acc += weight(i);
            if u < acc {
                return i;
            }
            last = Some(i);
        }
        // Rounding left `acc` a hair under `total`: the last candidate.
        last.expect("at least one candidate")
    }
}

/// How many of `ids` (best first) make the smallest prefix holding `top_p` of `total`; `None`
/// when all of them hold less.
fn nucleus(ids: &[u32], weight: &impl Fn(u32) -> f64, total: f64, top_p: f64) -> Option<usize> {
    let mut mass = 0.0;
    for (k, &i) in ids.iter().enumerate() {
        mass += weight(i) / total;
        if mass >= top_p {
            return Some(k + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingConfig {
        SamplingConfig {
            temperature,
            top_k,
            top_p,
            seed: Some(seed),
        }
    }

    #[test]
    fn non_finite_logits_are_found_wherever_they_are() {
        let mut logits: Vec<f32> = (0..1000).map(|i| (i as f32).sin() * 30.0).collect();
        assert_eq!(first_non_finite(&logits), None);
        for (at, bad) in [
            (0, f32::NAN),
            (517, f32::INFINITY),
            (999, f32::NEG_INFINITY),
        ] {
            let mut broken = logits.clone();
            broken[at] = bad;
            let (id, value) = first_non_finite(&broken).expect("found");
            assert_eq!(id as usize, at);
            assert!(value.is_nan() || value == bad);
        }
        // The largest finite values are finite.
        logits[3] = f32::MAX;
        logits[4] = f32::MIN;
        assert_eq!(first_non_finite(&logits), None);
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingConfig::default(), 0);
        assert_eq!(s.sample(&[0.1, 3.0, 2.0, 3.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_even_with_temperature() {
        let mut s = Sampler::new(cfg(5.0, 1, 1.0, 9), 0);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn top_k_never_draws_outside_the_k_best() {
        let logits = [1.0, 0.9, 0.8, -5.0, 0.95];
        let mut s = Sampler::new(cfg(10.0, 2, 1.0, 3), 0);
        for _ in 0..200 {
            let t = s.sample(&logits);
            assert!(t == 0 || t == 4, "drew {t}");
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_the_mass() {
        // Probabilities ≈ [0.665, 0.245, 0.09]: top_p 0.6 keeps only the first.
        let logits = [2.0, 1.0, 0.0];
        let mut s = Sampler::new(cfg(1.0, 0, 0.6, 5), 0);
        for _ in 0..100 {
            assert_eq!(s.sample(&logits), 0);
        }
    }

    #[test]
    fn same_seed_same_tokens_and_draws_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75] at temperature 1
        let draw = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 1.0, seed), 0);
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(11), draw(11));
        let ones = draw(11).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "frequency {ones}");
    }

    #[test]
    fn logprobs_are_log_softmax_and_top_k_is_ordered() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let l = Logprobs::of(&logits, 2, 3);
        assert!((l.sampled.1 as f64 - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(l.sampled.0, 2);
        // Ties go to the lower id, as greedy sampling breaks them.
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| (Logprobs::of(&logits, i as u32, 0).sampled.1 as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "probabilities sum to {total}");
        assert!(Logprobs::of(&logits, 0, 0).top.is_empty());
        assert_eq!(Logprobs::of(&logits, 0, 99).top.len(), logits.len());
    }

    #[test]
    fn best_ids_equal_a_full_sort_on_either_path() {
        // Many ties (values repeat every 7 ids) to check that they go to the lower id.
        let logits: Vec<f32> = (0..1000u32)
            .map(|i| ((i * 37) % 7) as f32 - (i % 3) as f32 * 0.5)
            .collect();
        let mut sorted: Vec<u32> = (0..1000).collect();
        sorted.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        for m in [1, 5, SHORTLIST, SHORTLIST + 1, 400, 1000, 5000] {
            assert_eq!(best_ids(&logits, m), sorted[..m.min(1000)], "m = {m}");
        }
        assert!(best_ids(&logits, 0).is_empty());
    }

    #[test]
    fn top_p_draws_only_from_the_nucleus_even_past_the_shortlist() {
        // 1000 equal logits: the nucleus of 0.5 is the first 500 ids, beyond the shortlist.
        let logits = vec![0.0f32; 1000];
        let mut s = Sampler::new(cfg(1.0, 0, 0.5, 3), 0);
        let draws: Vec<u32> = (0..2000).map(|_| s.sample(&logits)).collect();
        assert!(draws.iter().all(|&t| t < 500), "{:?}", draws.iter().max());
        assert!(draws.iter().any(|&t| t >= SHORTLIST as u32));
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(cfg(-1.0, 0, 1.0, 0).validate().is_err());
        assert!(cfg(1.0, 0, 0.0, 0).validate().is_err());
        assert!(cfg(f32::NAN, 0, 1.0, 0).validate().is_err());
        assert!(cfg(0.7, 40, 0.9, 0).validate().is_ok());
    }
}
