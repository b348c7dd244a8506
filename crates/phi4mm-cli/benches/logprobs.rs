//! What choosing and reporting a token costs at the real vocabulary size (200,064), against plain
//! greedy argmax (what every token pays anyway): the log-softmax and top-k of `Logprobs::of`, and
//! seeded temperature + top-p sampling. Two kinds of logits, both deterministic: *flat* —
//! pseudo-random with the spread of real logits (std ≈ 2), the worst case for top-p, whose nucleus
//! then holds tens of thousands of tokens; *peaked* — a rank–frequency (Zipf, exponent 1.2)
//! shape in shuffled order, closer to a language model's next-token distribution, whose nucleus
//! holds hundreds.
//!
//! `cargo bench -p switchyard-phi4mm --bench logprobs` (release profile). Prints the median of
//! several runs of many calls each, and each figure's ratio to argmax from the same run.

use std::hint::black_box;
use std::time::Instant;
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::sampling::{Logprobs, Sampler, SamplingConfig};

const VOCAB: usize = 200_064;

struct Lcg(u32);

impl Lcg {
    /// Uniform in [-0.5, 0.5).
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (self.0 >> 8) as f32 / (1 << 24) as f32 - 0.5
    }
}

fn flat_logits() -> Vec<f32> {
    let mut rng = Lcg(0x2545_f491);
    // Sum of 4 uniforms: roughly normal, std ≈ 2.
    (0..VOCAB)
        .map(|_| (0..4).map(|_| rng.next()).sum::<f32>() * 3.5)
        .collect()
}

fn peaked_logits() -> Vec<f32> {
    // logit = -1.2·ln(rank): probabilities ∝ rank^-1.2, ranks shuffled over the ids.
    let mut ranks: Vec<usize> = (1..=VOCAB).collect();
    let mut rng = Lcg(7);
    for i in (1..VOCAB).rev() {
        let j = ((rng.next() + 0.5) * (i + 1) as f32) as usize % (i + 1);
        ranks.swap(i, j);
    }
    ranks.iter().map(|&r| -1.2 * (r as f32).ln()).collect()
}

/// The sampler as it was before it selected instead of sorting: sort the whole vocabulary, cut
/// to top-k, weigh, cut to the top-p prefix, draw. The baseline of the sampling rows.
fn full_sort_sample(logits: &[f32], t: f32, top_k: usize, top_p: f32, u: f64) -> u32 {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if top_k > 0 {
        idx.truncate(top_k);
    }
    let max = logits[idx[0] as usize];
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i as usize] - max) / t) as f64).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    if top_p < 1.0 {
        let mut mass = 0.0;
        let keep = probs
            .iter()
            .position(|p| {
                mass += p;
                mass >= top_p as f64
            })
            .map_or(probs.len(), |k| k + 1);
        probs.truncate(keep);
        idx.truncate(keep);
        let s: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= s);
    }
    let mut acc = 0.0;
    for (k, p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return idx[k];
        }
    }
    *idx.last().unwrap()
}

/// Median microseconds per call over `runs` runs of `calls` calls.
fn micros(runs: usize, calls: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut per_call: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..calls {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[runs / 2]
}

fn main() {
    let (runs, calls) = (15, 20);
    println!("| per generated token, vocabulary {VOCAB} | logits | median µs | × argmax |");
    println!("| --- | --- | ---: | ---: |");
    for (kind, logits) in [("flat", flat_logits()), ("peaked", peaked_logits())] {
        let base = micros(runs, calls, || {
            black_box(argmax(black_box(&logits)));
        });
        let mut rows = vec![("greedy argmax (baseline)".to_string(), base)];
        for k in [0usize, 5, 20] {
            let t = micros(runs, calls, || {
                black_box(Logprobs::of(black_box(&logits), 7, k));
            });
            rows.push((format!("`Logprobs::of`, top_logprobs = {k}"), t));
        }
        for (temperature, top_k, top_p) in [(0.7, 0, 0.9), (1.0, 0, 1.0), (0.7, 40, 1.0)] {
            let mut sampler = Sampler::new(
                SamplingConfig {
                    temperature,
                    top_k,
                    top_p,
                    seed: Some(1),
                },
                0,
            );
            let t = micros(runs, calls, || {
                black_box(sampler.sample(black_box(&logits)));
            });
            let sorted = micros(runs, calls, || {
                black_box(full_sort_sample(
                    black_box(&logits),
                    temperature,
                    top_k,
                    top_p,
                    0.5,
                ));
            });
            let what = format!("temperature {temperature}, top_k {top_k}, top_p {top_p}");
            rows.push((format!("sampling, {what}: full sort (before)"), sorted));
            rows.push((format!("sampling, {what}: selection (now)"), t));
        }
        for (label, t) in rows {
            println!("| {label} | {kind} | {t:.0} | {:.1} |", t / base);
        }
    }
}
