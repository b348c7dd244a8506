//! What one slot owns while a request runs: its decoder state, adapter and audio branch, prompt
//! still to prefill, sampler, stop conditions, budget, and the text already streamed.

use crate::adapter::{AdapterMode, AudioBranch};
use crate::sampling::Sampler;

use super::job::{Detokenize, GenerationParams, JobRest, RowPrompt, RowSink};

/// Why a row stops after the token just sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowEnd {
    Continue,
    /// EOS, a stop id or a stop string.
    Stop,
    /// The token budget ran out.
    Length,
}

pub(crate) struct Row<S> {
    pub id: u64,
    pub adapter: AdapterMode,
    pub audio_branch: Option<AudioBranch>,
    pub state: S,
    /// Prompt embeddings `[prompt_tokens, hidden]`; dropped once prefilled.
    pub prompt: Vec<f32>,
    pub prompt_tokens: usize,
    /// Prompt tokens already through the decoder.
    pub prefilled: usize,
    /// Embedding of the last sampled token (next decode input).
    pub next_input: Vec<f32>,
    pub sampler: Sampler,
    /// Budget, stops, deadline, log probabilities (empty stop strings dropped).
    pub generation: GenerationParams,
    pub sink: Box<dyn RowSink>,
    pub tokens: Vec<u32>,
    /// Bytes of the decoded text already sent.
    emitted: usize,
}

impl<S> Row<S> {
    /// The row of a job that got a slot, with a fresh decoder `state` and a fresh sampler.
    pub fn new(job: JobRest, prompt: RowPrompt, state: S) -> Self {
        let JobRest {
            id,
            mut generation,
            sink,
            ..
        } = job;
        generation.stop_strings.retain(|s| !s.is_empty());
        // Unseeded requests still get a reproducible, per-request stream.
        let default_seed = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Row {
            id,
            adapter: prompt.adapter,
            audio_branch: prompt.audio_branch,
            state,
            prompt: prompt.embeds,
            prompt_tokens: prompt.prompt_tokens,
            prefilled: 0,
            next_input: Vec::new(),
            sampler: Sampler::new(generation.sampling.clone(), default_seed),
            generation,
            sink,
            tokens: Vec::new(),
            emitted: 0,
        }
    }

    pub fn in_prefill(&self) -> bool {
        self.prefilled < self.prompt_tokens
    }

    /// Records a sampled token; returns the text it adds and whether the row stops here.
    pub fn push_token(&mut self, token: u32, detok: Option<&Detokenize>) -> (String, RowEnd) {
        self.tokens.push(token);
        let g = &self.generation;
        let stop = if g.stop_ids.contains(&token) {
            RowEnd::Stop
        } else if self.tokens.len() >= g.max_new_tokens {
            RowEnd::Length
        } else {
            RowEnd::Continue
        };
        let Some(detok) = detok else {
            return (String::new(), stop);
        };
        let full = detok(&self.tokens);
        if self.emitted > full.len() || !full.is_char_boundary(self.emitted) {
            // The decoder revised text already sent (should not happen with byte-level BPE);
            // send nothing rather than garbage.
            return (String::new(), stop);
        }
        // A stop string ends the text before its first occurrence.
        if let Some(pos) = self
            .generation
            .stop_strings
            .iter()
            .filter_map(|s| full.find(s.as_str()))
            .min()
        {
            let end = pos.max(self.emitted);
            let delta = full[self.emitted..end].to_string();
            self.emitted = end;
            return (delta, RowEnd::Stop);
        }
        let mut end = full.len();
        if stop == RowEnd::Continue {
            // Hold back an incomplete character and any tail that may still become a stop
            // string; both are released with a later token or at the end.
            end = full.trim_end_matches('\u{FFFD}').len();
            let held = self
                .generation
                .stop_strings
                .iter()
                .map(|s| longest_tail_prefix(&full[..end], s))
                .max()
                .unwrap_or(0);
            end -= held;
        }
        let end = end.max(self.emitted);
        let delta = full[self.emitted..end].to_string();
        self.emitted = end;
        (delta, stop)
    }
}

/// Length of the longest proper prefix of `pattern` that `text` ends with (on char boundaries).
fn longest_tail_prefix(text: &str, pattern: &str) -> usize {
    let mut best = 0;
    for (i, _) in pattern.char_indices().skip(1) {
        if text.ends_with(&pattern[..i]) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Null;
    impl RowSink for Null {
        fn started(&mut self, _: usize) -> bool {
            true
        }
        fn token(&mut self, _: u32, _: &str, _: Option<&crate::sampling::Logprobs>) -> bool {
            true
        }
        fn done(&mut self, _: crate::scheduler::job::Outcome) {}
    }

    fn row(stop_strings: &[&str], max: usize) -> Row<()> {
        let job = JobRest {
            id: 1,
            prompt_tokens: 1,
            generation: GenerationParams {
                stop_ids: vec![0],
                stop_strings: stop_strings.iter().map(|s| s.to_string()).collect(),
                ..GenerationParams::greedy(max)
            },
            sink: Box::new(Null),
        };
        let prompt = RowPrompt {
            embeds: vec![],
            prompt_tokens: 1,
            adapter: AdapterMode::None,
            audio_branch: None,
        };
        Row::new(job, prompt, ())
    }

    /// Token `i` decodes to the i-th character of a fixed string; 0 is "" (EOS).
    fn detok() -> Detokenize {
        Arc::new(|ids: &[u32]| {
            let alphabet: Vec<char> = " abcdefghij".chars().collect();
            ids.iter()
                .filter(|&&i| i != 0)
                .map(|&i| alphabet[i as usize])
                .collect()
        })
    }

    #[test]
    fn stop_string_ends_text_before_it_and_partial_matches_are_held() {
        let d = detok();
        let mut r = row(&["cd"], 10);
        assert_eq!(r.push_token(1, Some(&d)), ("a".into(), RowEnd::Continue));
        // "ac": "c" may start "cd", so it is held.
        assert_eq!(r.push_token(3, Some(&d)), ("".into(), RowEnd::Continue));
        // "acb": "c" was not the start of "cd" after all: released.
        assert_eq!(r.push_token(2, Some(&d)), ("cb".into(), RowEnd::Continue));
        assert_eq!(r.push_token(3, Some(&d)), ("".into(), RowEnd::Continue));
        assert_eq!(r.push_token(4, Some(&d)), ("".into(), RowEnd::Stop));
    }

    #[test]
    fn budget_and_stop_ids_end_the_row_and_release_held_text() {
        let d = detok();
        let mut r = row(&["cd"], 2);
        assert_eq!(r.push_token(1, Some(&d)).1, RowEnd::Continue);
        assert_eq!(r.push_token(3, Some(&d)), ("c".into(), RowEnd::Length));
        let mut r = row(&[], 5);
        r.push_token(1, Some(&d));
        assert_eq!(r.push_token(0, Some(&d)), ("".into(), RowEnd::Stop));
    }
}
