//! From a request (ids with expanded placeholders + media) to decoder input: encoders, the
//! per-request adapter and audio branch, and the placeholder merge — all validated first.

use crate::adapter::{AdapterChoice, AdapterMode, AudioBranch};
use crate::checkpoint::LoraAdapter;

use super::audio::AudioEncoding;
use super::phi4mm::Phi4mm;
use super::vision::{ImageEncoding, ImageInput};

/// Why a backend's encoder failed (the host encoders never do; a compiled one can fail at
/// run time). Boxed, since the model does not know the backends' error types.
pub type EncoderError = Box<dyn std::error::Error + Send + Sync>;

/// The encoders a backend runs media through. The host backend's own encoders are one
/// implementation, the IREE modules another; validation, adapter choice and the placeholder
/// merge around them are the same for both.
pub trait MediaEncoders {
    fn encode_image(&self, image: &ImageInput) -> Result<ImageEncoding, EncoderError>;
    fn encode_audio(
        &self,
        features: &[f32],
        frames: usize,
        branch: AudioBranch,
    ) -> Result<AudioEncoding, EncoderError>;
    /// Token embeddings `[ids.len(), hidden]` when this producer computes them; `None` (the
    /// default): the host model's table.
    fn embed_tokens(&self, _ids: &[u32]) -> Option<Result<Vec<f32>, EncoderError>> {
        None
    }
}

/// The host backend's encoders.
impl MediaEncoders for Phi4mm {
    fn encode_image(&self, image: &ImageInput) -> Result<ImageEncoding, EncoderError> {
        Ok(self.vision.encode(image))
    }

    fn encode_audio(
        &self,
        features: &[f32],
        frames: usize,
        branch: AudioBranch,
    ) -> Result<AudioEncoding, EncoderError> {
        Ok(self.audio.encode(features, frames, branch))
    }
}

/// One clip of log-mel features.
#[derive(Clone, Debug)]
pub struct AudioInput {
    /// `[frames, mel bins]`.
    pub features: Vec<f32>,
    pub frames: usize,
}

/// A request as the model sees it: placeholders already expanded to one id per media row.
#[derive(Clone, Debug, Default)]
pub struct PromptInput {
    pub input_ids: Vec<u32>,
    pub images: Vec<ImageInput>,
    pub audios: Vec<AudioInput>,
    pub adapter: AdapterChoice,
}

/// One row's prompt after the media stage: token embeddings with the encoders' rows written over
/// the placeholders, and the row's adapter and audio branch.
#[derive(Clone, Debug)]
pub struct MergedPrompt {
    /// `[len, hidden]`.
    pub embeds: Vec<f32>,
    pub len: usize,
    pub adapter: AdapterMode,
    /// The projection the clips went through; `None` without audio.
    pub audio_branch: Option<AudioBranch>,
    /// Encoder outputs kept for inspection: per image the tower features, per clip the
    /// Conformer output.
    pub vision_features: Vec<Vec<f32>>,
    pub audio_encoder_out: Vec<Vec<f32>>,
}

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("token id {id} at position {position} is outside the vocabulary ({vocab})")]
    TokenOutOfRange {
        id: u32,
        position: usize,
        vocab: usize,
    },
    #[error("{kind} placeholders: the prompt has {placeholders} placeholder ids but the {media} given produce {rows} rows")]
    PlaceholderMismatch {
        kind: &'static str,
        placeholders: usize,
        media: usize,
        rows: usize,
    },
    #[error("{what} contains a non-finite value at index {index}")]
    NonFinite { what: String, index: usize },
    #[error("{what}: {reason}")]
    BadShape { what: String, reason: String },
    #[error(
        "prompt of {prompt} tokens + {new_tokens} new tokens exceeds the context of {context}"
    )]
    ContextOverflow {
        prompt: usize,
        new_tokens: usize,
        context: usize,
    },
    /// The adapter the request asked for, or that `auto` chose for its media.
    #[error("the request needs the {} LoRA, and the checkpoint has none (no {} folder, or no `{}_lora` in an original-layout config.json)", .0.as_str(), .0.folder(), .0.as_str())]
    AdapterUnavailable(LoraAdapter),
    /// An encoder failed; `what` names the encoder and the medium.
    #[error("{what}: {cause}")]
    Encoder { what: String, cause: EncoderError },
}

fn check_finite(what: impl Fn() -> String, data: &[f32]) -> Result<(), InputError> {
    match data.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(InputError::NonFinite {
            what: what(),
            index,
        }),
        None => Ok(()),
    }
}

impl Phi4mm {
    /// Checks what can be checked without compute: ids, shapes, finiteness, placeholder counts,
    /// context length, adapter availability.
    pub fn validate_input(&self, p: &PromptInput, max_new_tokens: usize) -> Result<(), InputError> {
        self.validate_input_within(p, max_new_tokens, self.config.text.max_position_embeddings)
    }

    /// As [`Phi4mm::validate_input`] for a backend built for a shorter `context`.
    pub fn validate_input_within(
        &self,
        p: &PromptInput,
        max_new_tokens: usize,
        context: usize,
    ) -> Result<(), InputError> {
        let c = &self.config;
        if p.input_ids.is_empty() {
            return Err(InputError::EmptyPrompt);
        }
        let vocab = c.text.vocab_size;
        if let Some((position, &id)) = p
            .input_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(InputError::TokenOutOfRange {
                id,
                position,
                vocab,
            });
        }
        if p.input_ids.len().saturating_add(max_new_tokens) > context {
            return Err(InputError::ContextOverflow {
                prompt: p.input_ids.len(),
                new_tokens: max_new_tokens,
                context,
            });
        }
        let mut image_rows = 0;
        for (i, img) in p.images.iter().enumerate() {
            self.vision.check(img).map_err(|e| InputError::BadShape {
                what: format!("image {i}"),
                reason: e.to_string(),
            })?;
            check_finite(|| format!("pixel values of image {i}"), &img.pixel_values)?;
            image_rows += self.vision.token_count(img);
        }
        let mut audio_rows = 0;
        for (i, a) in p.audios.iter().enumerate() {
            if a.frames == 0 || a.features.len() != a.frames * c.audio.input_size {
                return Err(InputError::BadShape {
                    what: format!("audio {i}"),
                    reason: format!("expected [frames ≥ 1, {}] features", c.audio.input_size),
                });
            }
            check_finite(|| format!("features of audio {i}"), &a.features)?;
            audio_rows += self.audio.token_count(a.frames);
        }
        let count = |id: u32| p.input_ids.iter().filter(|&&x| x == id).count();
        // Without media, placeholder ids are ordinary tokens (reference text-only behaviour).
        if !p.images.is_empty() && count(c.image_token_id) != image_rows {
            return Err(InputError::PlaceholderMismatch {
                kind: "image",
                placeholders: count(c.image_token_id),
                media: p.images.len(),
                rows: image_rows,
            });
        }
        if !p.audios.is_empty() && count(c.audio_token_id) != audio_rows {
            return Err(InputError::PlaceholderMismatch {
                kind: "audio",
                placeholders: count(c.audio_token_id),
                media: p.audios.len(),
                rows: audio_rows,
            });
        }
        let (adapter, _) = self.resolve_adapter(p);
        let available = match adapter {
            AdapterMode::None => true,
            AdapterMode::Speech => c.speech_lora.is_some(),
            AdapterMode::Vision => c.vision_lora.is_some(),
        };
        if let (false, Some(lora)) = (available, adapter.lora()) {
            return Err(InputError::AdapterUnavailable(lora));
        }
        Ok(())
    }

    fn resolve_adapter(&self, p: &PromptInput) -> (AdapterMode, AudioBranch) {
        p.adapter
            .resolve(!p.images.is_empty(), !p.audios.is_empty())
    }

    /// Validates, runs the host encoders on the model's pool and writes their rows over the
    /// placeholder ids. (The scheduler's media stage runs them on its own pool instead:
    /// [`super::HostBackend::media_stage`].)
    pub fn prepare(
        &self,
        p: &PromptInput,
        max_new_tokens: usize,
    ) -> Result<MergedPrompt, InputError> {
        let context = self.config.text.max_position_embeddings;
        self.install(|| self.prepare_with(p, max_new_tokens, self, context))
    }

    /// The media stage with another backend's encoders and context length.
    pub fn prepare_with(
        &self,
        p: &PromptInput,
        max_new_tokens: usize,
        encoders: &dyn MediaEncoders,
        context: usize,
    ) -> Result<MergedPrompt, InputError> {
        self.validate_input_within(p, max_new_tokens, context)?;
        let c = &self.config;
        let h = c.text.hidden_size;
        let (adapter, audio_branch) = self.resolve_adapter(p);
        {
            let mut embeds = match encoders.embed_tokens(&p.input_ids) {
                Some(e) => e.map_err(|cause| InputError::Encoder {
                    what: "token embeddings".into(),
                    cause,
                })?,
                None => self.decoder.embed(&p.input_ids),
            };
            let mut vision_features = Vec::new();
            let mut audio_encoder_out = Vec::new();
            let mut image_rows = Vec::new();
            for (i, img) in p.images.iter().enumerate() {
                let enc = encoders
                    .encode_image(img)
                    .map_err(|cause| InputError::Encoder {
                        what: format!("vision encoder, image {i}"),
                        cause,
                    })?;
                check_finite(
                    || format!("vision encoder output of image {i}"),
                    &enc.embeds,
                )?;
                image_rows.extend_from_slice(&enc.embeds);
                vision_features.push(enc.features);
            }
            // Each clip is encoded on its own (no cross-clip padding): a clip's rows are what it
            // gives alone, as for every single-clip reference case.
            let mut audio_rows = Vec::new();
            for (i, a) in p.audios.iter().enumerate() {
                let enc = encoders
                    .encode_audio(&a.features, a.frames, audio_branch)
                    .map_err(|cause| InputError::Encoder {
                        what: format!("audio encoder, clip {i}"),
                        cause,
                    })?;
                check_finite(|| format!("audio encoder output of clip {i}"), &enc.embeds)?;
                audio_rows.extend_from_slice(&enc.embeds);
                audio_encoder_out.push(enc.encoder_out);
            }
            if !p.images.is_empty() {
                scatter(&mut embeds, &p.input_ids, c.image_token_id, &image_rows, h);
            }
            if !p.audios.is_empty() {
                scatter(&mut embeds, &p.input_ids, c.audio_token_id, &audio_rows, h);
            }
            Ok(MergedPrompt {
                len: p.input_ids.len(),
                embeds,
                adapter,
                audio_branch: (!p.audios.is_empty()).then_some(audio_branch),
                vision_features,
                audio_encoder_out,
            })
        }
    }
}

/// Writes `rows` in order over the positions holding `id`.
fn scatter(embeds: &mut [f32], ids: &[u32], id: u32, rows: &[f32], h: usize) {
    let mut next = rows.chunks(h);
    for (pos, _) in ids.iter().enumerate().filter(|(_, &x)| x == id) {
        let row = next.next().expect("placeholder count validated");
        embeds[pos * h..(pos + 1) * h].copy_from_slice(row);
    }
}
