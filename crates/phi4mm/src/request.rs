//! From a request as a client sends it — chat messages or expanded ids, plus encoded media — to the
//! model's [`PromptInput`]: media preprocessed by the front end, placeholders bound in order and
//! expanded to each medium's token count. Used by `phi4mm generate` and by the plugin.

use crate::adapter::AdapterChoice;
use crate::model::{AudioInput, ImageInput, PromptInput};
use frontend::audio::{
    features_for_request, features_from_bytes, AudioError, AudioOptions, RequestAudioError,
    ResampleMode,
};
use frontend::image::{preprocess, ImageError, ImageOptions};
use frontend::limits::{LimitError, Limits};
use frontend::prompt::{Message, Prompt, PromptError};

/// How media are checked and decoded: the limits, and how clips not at 16 kHz are resampled.
#[derive(Clone, Debug, Default)]
pub struct MediaOptions {
    pub limits: Limits,
    pub resample: ResampleMode,
}

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Limits(#[from] LimitError),
    // The wrapped errors are not `source`s: their text is in the message already.
    #[error("audio {index}: {cause}")]
    Audio { index: usize, cause: AudioError },
    #[error("image {index}: {cause}")]
    Image { index: usize, cause: ImageError },
}

/// One encoded image → crops, masks and canvas for the vision tower.
pub fn image_input(bytes: &[u8], options: &ImageOptions) -> Result<ImageInput, ImageError> {
    let p = preprocess(bytes, options)?;
    Ok(ImageInput {
        crops: p.num_crops(),
        canvas: [p.image_size.0, p.image_size.1],
        pixel_values: p.pixel_values,
        patch_masks: p.attention_mask,
    })
}

/// One encoded clip → log-mel features.
pub fn audio_input(bytes: &[u8], options: &AudioOptions) -> Result<AudioInput, AudioError> {
    let f = features_from_bytes(bytes, options)?;
    Ok(AudioInput {
        features: f.features,
        frames: f.frames,
    })
}

fn media(
    images: &[&[u8]],
    audios: &[&[u8]],
    options: &MediaOptions,
) -> Result<(Vec<ImageInput>, Vec<AudioInput>), RequestError> {
    let limits = &options.limits;
    limits.check_counts(images.len(), audios.len())?;
    let io = ImageOptions::from_limits(limits);
    let ao = AudioOptions {
        resample: options.resample,
        ..AudioOptions::from_limits(limits)
    };
    let images = images
        .iter()
        .enumerate()
        .map(|(index, b)| image_input(b, &io).map_err(|cause| RequestError::Image { index, cause }))
        .collect::<Result<Vec<_>, _>>()?;
    // One rule for the request's audio totals (seconds and decoded samples, each clip charged
    // with what the earlier ones decoded): the front end's.
    let audios = features_for_request(audios, &ao)
        .map_err(|e| match e {
            RequestAudioError::Clip { index, cause } => RequestError::Audio { index, cause },
            RequestAudioError::Limit(e) => RequestError::Limits(e),
        })?
        .into_iter()
        .map(|f| AudioInput {
            features: f.features,
            frames: f.frames,
        })
        .collect();
    Ok((images, audios))
}

/// Token rows the media will occupy, from their headers alone (no decoding): what admission
/// charges against the queue bound. A header the media stage would refuse (bad container,
/// pixel, rate, duration or sample limits, too many media) is refused here with the same error.
/// Images: the dynamic-HD grid of the header's size, exact. Audio: the feature frames of the
/// stated length, exact; a stream that states no length is charged as the longest clip the
/// limits let it decode.
pub fn media_tokens(
    model: &crate::model::Phi4mm,
    images: &[&[u8]],
    audios: &[&[u8]],
    options: &MediaOptions,
) -> Result<usize, RequestError> {
    let limits = &options.limits;
    limits.check_counts(images.len(), audios.len())?;
    let io = ImageOptions::from_limits(limits);
    let mut ao = AudioOptions {
        resample: options.resample,
        ..AudioOptions::from_limits(limits)
    };
    let mut tokens = 0usize;
    for (index, b) in images.iter().enumerate() {
        tokens += frontend::image::token_count_from_header(b, &io)
            .map_err(|cause| RequestError::Image { index, cause })?;
    }
    let mut seconds = 0.0;
    for (index, b) in audios.iter().enumerate() {
        let header =
            frontend::audio::probe(b, &ao).map_err(|cause| RequestError::Audio { index, cause })?;
        let rate = header.sample_rate;
        let samples = header.frames.unwrap_or_else(|| ao.max_frames(rate));
        ao.request_samples_used = ao.request_samples_used.saturating_add(samples);
        seconds += samples as f64 / f64::from(rate);
        if header.frames.is_some() && seconds > ao.max_seconds {
            return Err(LimitError::AudioSeconds {
                got_s: seconds,
                limit_s: ao.max_seconds,
            }
            .into());
        }
        let frames = frontend::audio::feature_frames(samples, rate, ao.resample);
        tokens += model.audio.token_count(frames);
    }
    Ok(tokens)
}

/// Token rows each medium occupies: images from the vision grid, audio from the frame count.
fn token_counts(
    model: &crate::model::Phi4mm,
    images: &[ImageInput],
    audios: &[AudioInput],
) -> (Vec<usize>, Vec<usize>) {
    (
        images.iter().map(|i| model.vision.token_count(i)).collect(),
        audios
            .iter()
            .map(|a| model.audio.token_count(a.frames))
            .collect(),
    )
}

/// Chat messages (media as content parts, placeholders optional) through the chat template with
/// the generation prompt, media bound in order of appearance and expanded.
pub fn from_messages(
    model: &crate::model::Phi4mm,
    prompt: &Prompt,
    messages: &[Message],
    options: &MediaOptions,
    adapter: AdapterChoice,
) -> Result<PromptInput, RequestError> {
    let ids = prompt.encode_messages(messages, true)?;
    let (images, audios) = media(&ids.images, &ids.audios, options)?;
    let (ic, ac) = token_counts(model, &images, &audios);
    let input_ids = prompt.expand(&ids.ids, &ic, &ac)?;
    Ok(PromptInput {
        input_ids,
        images,
        audios,
        adapter,
    })
}

/// Ids whose placeholders are already expanded, plus the media they stand for (the model checks
/// that the placeholder counts agree with the media).
pub fn from_ids(
    input_ids: Vec<u32>,
    images: &[&[u8]],
    audios: &[&[u8]],
    options: &MediaOptions,
    adapter: AdapterChoice,
) -> Result<PromptInput, RequestError> {
    let (images, audios) = media(images, audios, options)?;
    Ok(PromptInput {
        input_ids,
        images,
        audios,
        adapter,
    })
}
