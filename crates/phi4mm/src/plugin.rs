//! The `phi4mm` model kind as a Switchyard plugin: settings → checkpoint, tokenizer, host backend
//! and scheduler; host requests → prompt + media jobs; scheduler events → host events.
#![allow(non_local_definitions)] // abi_stable's export macro defines items inside a function.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use switchyard_plugin_api::{
    abi_stable::std_types::{ROption, RString},
    AdapterRows, Endpoint, ErrorKind, Event, EventSinkBox, HostServices, Modality, ModelKindInfo,
    ModelResources, ModelStats, Part, PluginError, PluginManifest, PluginModel,
    Prompt as RawPrompt, Request, SettingsText, TokenLogprob, TokenLogprobs, Usage, API_VERSION,
};

use crate::backend::{self, BackendChoice};
use crate::checkpoint::{Checkpoint, LoraAdapter};
use crate::config::{Phi4mmSettings, MAX_THREADS};
use crate::model::{MediaStage, Phi4mm, PromptInput};
use crate::options::RequestOptions;
use crate::request::{self, MediaOptions, RequestError};
use crate::sampling::{Logprobs, SamplingConfig};
use crate::scheduler::{
    Detokenize, FinishReason, GenerationParams, Job, KvBudget, Outcome, Refusal, RowError, RowSink,
    Scheduler, SchedulerConfig,
};
use artifact_cache::Progress;
use frontend::prompt::{ContentPart, Message, Prompt, Role};

pub const KIND: &str = "phi4mm";

pub fn plugin_manifest() -> PluginManifest {
    PluginManifest {
        name: "phi4mm".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        build_id: concat!("phi4mm-", env!("CARGO_PKG_VERSION")).into(),
        api_version: API_VERSION,
        models: vec![ModelKindInfo {
            kind: KIND.into(),
            chat_modalities: Modality::ALL.to_vec().into(),
            transcription_modalities: vec![Modality::Audio].into(),
        }]
        .into(),
    }
}

/// One `phi4mm` model instance.
pub struct Phi4mmModel {
    settings: Phi4mmSettings,
    model: Arc<Phi4mm>,
    prompt: Arc<Prompt>,
    media: MediaStage,
    backend_name: &'static str,
    producer_name: &'static str,
    backend_details: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    scheduler: Scheduler,
}

pub fn create_instance(
    kind: &str,
    settings: SettingsText,
    services: HostServices,
) -> Result<Phi4mmModel, PluginError> {
    let mut settings = settings_of(kind, &settings, |p| services.resolve_path(p))?;
    // The compiled modules go where the host keeps its plugins' caches
    // (`<server.cache_dir>/plugins/phi4mm/iree`) unless the settings name a directory: an
    // operator who puts `server.cache_dir` on a persistent volume keeps them across restarts.
    if settings.iree.cache_dir.is_none() && !services.cache_dir.is_empty() {
        settings.iree.cache_dir = Some(Path::new(services.cache_dir.as_str()).join("iree"));
    }
    // A cold artifact cache compiles for minutes before the instance is ready: each compile's
    // start and end go into the host's log, so that an operator watching a starting pod sees
    // what it waits for.
    let host = services.clone();
    let compiles = Progress::new(move |event| {
        let line = event.to_string();
        if event.is_warning() {
            host.warn(&line)
        } else {
            host.info(&line)
        }
    });
    Phi4mmModel::load(
        settings,
        services.thread_budget as usize,
        &|m| services.info(m),
        compiles,
    )
}

/// Whether [`create_instance`] would accept `kind` and `settings` (the plugin's settings check,
/// API 2.2, for `switchyard config check`): the settings parse and validate, the backend and
/// producer they name are in this build, and the checkpoint's config, tensor names and shapes,
/// LoRA pairs and tokenizer load. Left to the creation: the weights' values (a pass over every
/// byte) and the IREE modules' compiles.
pub fn check_settings(
    kind: &str,
    settings: SettingsText,
    config_dir: &Path,
) -> Result<(), PluginError> {
    let settings = settings_of(kind, &settings, |p| {
        switchyard_plugin_api::resolve_settings_path(config_dir, p)
    })?;
    backend::check_available(settings.backend, settings.producer, &settings.iree)
        .map_err(|e| PluginError::invalid_settings(e.to_string()))?;
    let dir: &Path = &settings.checkpoint;
    let ck = Checkpoint::open_structure(dir).map_err(|e| checkpoint_refusal(dir, e))?;
    let prompt = tokenizer_of(&ck, &settings)?;
    if let Some(pool) = settings.kv_cache_bytes {
        // The pool must hold the row of a one-word chat with the default budget: a smaller one
        // passed here and then refused every request that set no `max_tokens` (or failed the
        // warm-up). A row costs at least what the host backend's does (the IREE backend's rows
        // come in compiled sizes, so they may need more: its refusals say so).
        let positions = warm_up_prompt(&prompt)?.len() + settings.default_max_tokens;
        let row = crate::model::kv_cache::row_bytes(&ck.config.text, positions);
        if row as u64 > pool {
            return Err(PluginError::invalid_settings(format!(
                "kv_cache_bytes = {pool} holds no ordinary request: a one-word chat with \
                 default_max_tokens = {} ({positions} positions) needs {row} bytes of KV cache",
                settings.default_max_tokens
            )));
        }
    }
    Ok(())
}

/// The warm-up's prompt: one short user turn.
fn warm_up_prompt(prompt: &Prompt) -> Result<Vec<u32>, PluginError> {
    let messages = [Message::text(Role::User, "Hello".to_string())];
    Ok(prompt
        .encode_messages(&messages, true)
        .map_err(|e| PluginError::internal(format!("warm-up prompt: {e}")))?
        .ids)
}

/// The checkpoint's tokenizer, whose chat template must fit the model's vocabulary, and which
/// must take the settings' transcription instruction.
fn tokenizer_of(ck: &Checkpoint, settings: &Phi4mmSettings) -> Result<Prompt, PluginError> {
    let dir: &Path = &ck.dir;
    let prompt = Prompt::load(dir).map_err(|e| tokenizer_refusal(dir, e))?;
    let vocab = ck.config.text.vocab_size;
    // Any id the tokenizer can produce must be one the model embeds: else the first prompt
    // that yields it fails, every time.
    let largest = prompt.tokenizer().get_vocab(true).into_values().max();
    if let Some(largest) = largest.filter(|&id| id as usize >= vocab) {
        let token = prompt.tokenizer().id_to_token(largest).unwrap_or_default();
        return Err(tokenizer_refusal(
            dir,
            format!(
                "token {token:?} is id {largest}, outside the model's vocabulary of {vocab} \
                 (config.json's vocab_size)"
            ),
        ));
    }
    // The instruction is the user turn of every transcription, after its clip: one the
    // template refuses (a reserved token, a placeholder) would fail each of them, and the
    // refusal would blame the client.
    let turn = Message {
        role: Role::User,
        content: vec![
            ContentPart::Audio { bytes: Vec::new() },
            ContentPart::Text {
                text: settings.transcription_instruction.clone(),
            },
        ],
    };
    if let Err(e) = prompt.encode_messages(&[turn], true) {
        return Err(PluginError::invalid_settings(format!(
            "transcription_instruction: {e}"
        )));
    }
    Ok(prompt)
}

/// The settings of a model of `kind`, parsed, validated and with their paths resolved by
/// `resolve`: what creating and checking share.
fn settings_of(
    kind: &str,
    settings: &SettingsText,
    resolve: impl Fn(&Path) -> std::path::PathBuf,
) -> Result<Phi4mmSettings, PluginError> {
    if kind != KIND {
        return Err(PluginError::invalid_settings(format!(
            "plugin phi4mm has no model kind {kind:?} (it has {KIND:?})"
        )));
    }
    let mut settings: Phi4mmSettings = settings.parse().map_err(PluginError::invalid_settings)?;
    settings
        .validate()
        .map_err(|e| PluginError::invalid_settings(e.to_string()))?;
    settings.resolve_paths(resolve);
    Ok(settings)
}

fn checkpoint_refusal(dir: &Path, e: impl std::fmt::Display) -> PluginError {
    PluginError::invalid_settings(format!("checkpoint {}: {e}", dir.display()))
}

fn tokenizer_refusal(dir: &Path, e: impl std::fmt::Display) -> PluginError {
    PluginError::invalid_settings(format!("tokenizer in {}: {e}", dir.display()))
}

impl Phi4mmModel {
    /// Loads the checkpoint and starts the scheduler. `thread_budget` is the default for
    /// `threads`; the artifact cache's events (the IREE backend's compiles) go to `compiles`.
    pub fn load(
        settings: Phi4mmSettings,
        thread_budget: usize,
        log: &dyn Fn(&str),
        compiles: Progress,
    ) -> Result<Self, PluginError> {
        let dir: &Path = &settings.checkpoint;
        let ck = Checkpoint::open(dir).map_err(|e| checkpoint_refusal(dir, e))?;
        let prompt = tokenizer_of(&ck, &settings)?;
        let threads = settings.threads.unwrap_or(thread_budget).max(1);
        if threads > MAX_THREADS {
            // The host's `threads` for the model, which the settings' own bound cannot see.
            return Err(PluginError::invalid_settings(format!(
                "threads: the host gives this model {threads} threads, over the most \
                 {MAX_THREADS}; set the model's threads (host config) or settings.threads lower"
            )));
        }
        let model = Arc::new(Phi4mm::load(&ck, threads));
        let media_threads = settings.media_threads.unwrap_or((threads / 4).max(1));
        let prompt = Arc::new(prompt);
        let p = prompt.clone();
        let detok: Detokenize =
            Arc::new(move |ids: &[u32]| p.tokenizer().decode(ids, true).unwrap_or_default());
        let running = backend::start(
            BackendChoice {
                kind: settings.backend,
                producer: settings.producer,
                iree: &settings.iree,
                compiles,
            },
            &ck,
            model.clone(),
            SchedulerConfig {
                slots: settings.slots,
                max_queued: settings.max_queued,
                max_queued_tokens: settings.max_queued_tokens,
                media_threads,
                prefill_chunk: settings.prefill_chunk,
                kv_cache: match settings.kv_cache_bytes {
                    Some(b) => KvBudget::Bytes(usize::try_from(b).unwrap_or(usize::MAX)),
                    None => KvBudget::SlotsOf(ck.config.text.original_max_position_embeddings),
                },
            },
            Some(detok),
        )
        .map_err(|e| PluginError::invalid_settings(e.to_string()))?;
        log(&format!(
            "phi4mm loaded from {} on the {} backend ({} producer): {} slots, {threads} decoder threads, {media_threads} media threads",
            dir.display(),
            running.name,
            running.producer,
            settings.slots
        ));
        Ok(Phi4mmModel {
            settings,
            model,
            prompt,
            media: running.media,
            backend_name: running.name,
            producer_name: running.producer,
            backend_details: running.details,
            scheduler: running.scheduler,
        })
    }

    /// Where the prompt comes from: the messages through the chat template, or the ids of
    /// `model_options.input_ids` with the messages' media (the messages then carry no text).
    fn prompt_source(
        &self,
        request: &Request,
        options: &RequestOptions,
    ) -> Result<PromptSource, PluginError> {
        let Some(input_ids) = &options.input_ids else {
            return Ok(PromptSource::Messages(self.messages(request)));
        };
        if request.endpoint != Endpoint::Chat {
            return Err(PluginError::invalid_request(
                "model_options.input_ids: only chat requests take a prompt as ids",
            ));
        }
        if input_ids.is_empty() {
            return Err(PluginError::invalid_request(
                "model_options.input_ids: the prompt is empty",
            ));
        }
        let (mut images, mut audios) = (Vec::new(), Vec::new());
        for part in request.messages.iter().flat_map(|m| m.parts.iter()) {
            match part {
                Part::Text(_) => {
                    return Err(PluginError::invalid_request(
                        "model_options.input_ids replaces the text of the messages: send only \
                         their image and audio parts",
                    ))
                }
                Part::Image(bytes) => images.push(bytes.to_vec()),
                Part::Audio { data, .. } => audios.push(data.to_vec()),
            }
        }
        self.check_ids("model_options.input_ids", input_ids, &images, &audios)?;
        Ok(PromptSource::Ids {
            input_ids: input_ids.clone(),
            images,
            audios,
        })
    }

    /// Refuses ids a client may not send: an id past the vocabulary has no embedding row; an
    /// id inside it that the tokenizer does not define (the padding rows of the embedding
    /// table) was never trained, and no text can produce it; and a media placeholder without a
    /// medium to bind, which the model would read as an ordinary token (as the reference
    /// does), means that a medium went missing. `what` names the ids in the error.
    fn check_ids(
        &self,
        what: &str,
        ids: &[u32],
        images: &[Vec<u8>],
        audios: &[Vec<u8>],
    ) -> Result<(), PluginError> {
        let config = &self.model.config;
        let vocab = config.text.vocab_size;
        for (position, &id) in ids.iter().enumerate() {
            if id as usize >= vocab {
                return Err(PluginError::invalid_request(format!(
                    "{what}: id {id} at position {position} is outside the vocabulary ({vocab})"
                )));
            }
            if self.prompt.tokenizer().id_to_token(id).is_none() {
                return Err(PluginError::invalid_request(format!(
                    "{what}: id {id} at position {position} is a reserved id that the \
                     tokenizer does not define"
                )));
            }
        }
        for (kind, id, media) in [
            ("image", config.image_token_id, images.len()),
            ("audio", config.audio_token_id, audios.len()),
        ] {
            let placeholders = ids.iter().filter(|&&x| x == id).count();
            if media == 0 && placeholders > 0 {
                return Err(PluginError::invalid_request(format!(
                    "{what}: {placeholders} {kind} placeholder id(s) ({id}) but the request \
                     carries no {kind}"
                )));
            }
        }
        Ok(())
    }

    /// A completion's raw prompt as ids (docs/phi4mm.md, "Completions"). Text is tokenized as
    /// plain text, so a special token's spelling stays text and cannot forge a turn or a
    /// placeholder. Ids are the developer's path (the chat template's own ids, say): any id of
    /// the vocabulary but a media placeholder, which would have no medium to bind.
    fn completion_ids(
        &self,
        prompt: RawPrompt,
        max_new_tokens: usize,
    ) -> Result<Vec<u32>, PluginError> {
        let ids = match prompt {
            RawPrompt::Text(text) => self
                .prompt
                .encode_untrusted_text(&text)
                .map_err(|e| PluginError::invalid_request(format!("prompt: {e}")))?,
            RawPrompt::Tokens(ids) => ids.to_vec(),
        };
        // The media stage checks again; here the refusal comes before admission.
        let input = PromptInput {
            input_ids: ids,
            ..PromptInput::default()
        };
        self.model
            .validate_input(&input, max_new_tokens)
            .map_err(|e| PluginError::invalid_request(format!("prompt: {e}")))?;
        self.check_ids("prompt", &input.input_ids, &[], &[])?;
        Ok(input.input_ids)
    }

    /// Admits a request whose prompt comes from `source`, with the request's sampling, stops,
    /// log probabilities and deadline.
    fn admit(
        &self,
        request: &Request,
        options: RequestOptions,
        source: PromptSource,
        sink: EventSinkBox,
    ) -> Result<(), PluginError> {
        let media_options = MediaOptions {
            limits: self.settings.limits.clone(),
            resample: self.settings.resample,
        };
        // Tokenizing and reading the media headers here refuses malformed chats and media at
        // admission and gives the queue its real charge.
        let places = MediaPlaces::of(request);
        let charged = source.charge(&self.model, &self.prompt, &media_options, &places)?;
        let max_new_tokens = self.max_new_tokens(request, charged);
        let (model, prompt) = (self.model.clone(), self.prompt.clone());
        let media = self.media.clone();
        let prepare = Box::new(move || {
            let input = source
                .build(&model, &prompt, &media_options, &options)
                .map_err(|e| RowError::Invalid(places.error(&e).message.into()))?;
            (media.prepare_fn(input, max_new_tokens))()
        });
        let s = &request.sampling;
        let job = Job {
            id: request.id,
            prompt_tokens: charged,
            prepare,
            generation: GenerationParams {
                sampling: SamplingConfig {
                    temperature: s.temperature,
                    top_k: s.top_k as usize,
                    top_p: s.top_p,
                    seed: s.seed.into_option(),
                },
                logprobs: request.logprobs.into_option().map(usize::from),
                max_new_tokens,
                stop_ids: self.model.config.eos_token_ids.clone(),
                stop_strings: request.stop.iter().map(|s| s.to_string()).collect(),
                deadline: deadline_of(request.deadline_unix_ms.into_option()),
            },
            sink: Box::new(HostSink {
                sink,
                prompt: self.prompt.clone(),
            }),
        };
        self.scheduler.submit(job).map_err(|r| match r {
            Refusal::Overloaded(m) => PluginError::overloaded(m),
            Refusal::Unavailable(m) => PluginError::unavailable(m),
            Refusal::Invalid(m) => PluginError::invalid_request(m),
        })
    }

    /// The request's `max_tokens`, or the instance's `default_max_tokens`; for a transcription,
    /// [`Self::transcription_budget`].
    fn max_new_tokens(&self, request: &Request, prompt_tokens: usize) -> usize {
        let asked = request
            .sampling
            .max_tokens
            .into_option()
            .map(|m| m as usize);
        if request.endpoint == Endpoint::Transcription {
            return self.transcription_budget(asked, prompt_tokens);
        }
        asked.unwrap_or(self.settings.default_max_tokens)
    }

    /// A transcription's budget follows its clip: as many tokens as its prompt of
    /// `prompt_tokens` (the clip's audio tokens, 12.5 a second, and the instruction: more than
    /// speech says in that time) as far as the longest row the instance can hold leaves room
    /// for them, at least `default_max_tokens` (what it was before it followed the clip), within
    /// `bound`, the request's `max_tokens` (no client states a transcript's length; the host
    /// sends its cap).
    fn transcription_budget(&self, bound: Option<usize>, prompt_tokens: usize) -> usize {
        let room = self.scheduler.largest_row().saturating_sub(prompt_tokens);
        let from_clip = prompt_tokens
            .min(room)
            .max(self.settings.default_max_tokens);
        bound.map_or(from_clip, |bound| bound.min(from_clip))
    }

    /// The request's chat as prompt messages; a transcription becomes one user turn with its
    /// audio and the instruction.
    fn messages(&self, request: &Request) -> Vec<Message> {
        let convert = |p: &Part| match p {
            Part::Text(t) => ContentPart::Text {
                text: t.to_string(),
            },
            Part::Image(b) => ContentPart::Image { bytes: b.to_vec() },
            Part::Audio { data, .. } => ContentPart::Audio {
                bytes: data.to_vec(),
            },
        };
        if request.endpoint == Endpoint::Transcription {
            let mut content: Vec<ContentPart> = request
                .messages
                .iter()
                .flat_map(|m| m.parts.iter())
                .filter(|p| matches!(p, Part::Audio { .. }))
                .map(convert)
                .collect();
            content.push(ContentPart::Text {
                text: self.settings.transcription_instruction.clone(),
            });
            return vec![Message {
                role: Role::User,
                content,
            }];
        }
        request
            .messages
            .iter()
            .map(|m| Message {
                role: match m.role {
                    switchyard_plugin_api::Role::System => Role::System,
                    switchyard_plugin_api::Role::User => Role::User,
                    switchyard_plugin_api::Role::Assistant => Role::Assistant,
                },
                content: m.parts.iter().map(convert).collect(),
            })
            .collect()
    }
}

/// What a chat request's prompt is built from, checked at admission; the media work (decoding,
/// preprocessing, placeholder expansion) is left to the media pool.
enum PromptSource {
    /// The chat template over the messages.
    Messages(Vec<Message>),
    /// `model_options.input_ids`, placeholders expanded, with the messages' media in order.
    Ids {
        input_ids: Vec<u32>,
        images: Vec<Vec<u8>>,
        audios: Vec<Vec<u8>>,
    },
}

impl PromptSource {
    /// Tokens charged against the queue bound: the prompt's text tokens plus each medium at its
    /// real token count, read from its header (a header the media stage would refuse is
    /// refused here with the same error). Ids come with their placeholders already expanded.
    fn charge(
        &self,
        model: &Phi4mm,
        prompt: &Prompt,
        media: &MediaOptions,
        places: &MediaPlaces,
    ) -> Result<usize, PluginError> {
        match self {
            PromptSource::Messages(messages) => {
                let ids = prompt
                    .encode_messages(messages, true)
                    .map_err(|e| PluginError::invalid_request(e.to_string()))?;
                // One placeholder id per medium, replaced by the medium's tokens.
                let text = ids
                    .ids
                    .len()
                    .saturating_sub(ids.images.len() + ids.audios.len());
                let media = request::media_tokens(model, &ids.images, &ids.audios, media)
                    .map_err(|e| places.error(&e))?;
                Ok(text + media)
            }
            PromptSource::Ids { input_ids, .. } => Ok(input_ids.len()),
        }
    }

    fn build(
        &self,
        model: &Phi4mm,
        prompt: &Prompt,
        media: &MediaOptions,
        options: &RequestOptions,
    ) -> Result<PromptInput, RequestError> {
        let adapter = options.adapter;
        match self {
            PromptSource::Messages(messages) => {
                request::from_messages(model, prompt, messages, media, adapter)
            }
            PromptSource::Ids {
                input_ids,
                images,
                audios,
            } => {
                let images: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
                let audios: Vec<&[u8]> = audios.iter().map(Vec::as_slice).collect();
                request::from_ids(input_ids.clone(), &images, &audios, media, adapter)
            }
        }
    }
}

/// Where each medium of a request sits, as `(message, part)`: images and audio each in order of
/// appearance, the order the prompt binds them in. A refusal of one medium names its part, which
/// the client sees as the error's `param` (a chat's content part, a transcription's `file`).
#[derive(Default)]
struct MediaPlaces {
    images: Vec<(usize, usize)>,
    audios: Vec<(usize, usize)>,
}

impl MediaPlaces {
    fn of(request: &Request) -> Self {
        let mut places = Self::default();
        for (m, message) in request.messages.iter().enumerate() {
            for (p, part) in message.parts.iter().enumerate() {
                match part {
                    Part::Image(_) => places.images.push((m, p)),
                    Part::Audio { .. } => places.audios.push((m, p)),
                    Part::Text(_) => {}
                }
            }
        }
        places
    }

    /// The refusal: blamed on the medium's part when one medium is at fault.
    fn error(&self, e: &RequestError) -> PluginError {
        let place = match e {
            RequestError::Image { index, .. } => self.images.get(*index),
            RequestError::Audio { index, .. } => self.audios.get(*index),
            RequestError::Prompt(_) | RequestError::Limits(_) => None,
        };
        match place {
            Some(&(message, part)) => PluginError::invalid_part(message, part, e),
            None => PluginError::invalid_request(e.to_string()),
        }
    }
}

/// The request's `model_options`, parsed and checked.
fn options_of(request: &Request) -> Result<RequestOptions, PluginError> {
    let options = request
        .model_options_json()
        .map_err(PluginError::invalid_request)?;
    RequestOptions::from_json(options).map_err(|e| PluginError::invalid_request(e.to_string()))
}

fn deadline_of(unix_ms: Option<u64>) -> Option<Instant> {
    let ms = unix_ms?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Some(Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms)))
}

/// Id of the warm-up job; request ids from the host count up from 1, far from this.
const WARM_JOB_ID: u64 = u64::MAX;

/// Collects the outcome of the warm-up job.
struct WarmSink(std::sync::mpsc::Sender<Outcome>);

impl RowSink for WarmSink {
    fn started(&mut self, _: usize) -> bool {
        true
    }
    fn token(&mut self, _: u32, _: &str, _: Option<&Logprobs>) -> bool {
        true
    }
    fn done(&mut self, outcome: Outcome) {
        let _ = self.0.send(outcome);
    }
}

impl PluginModel for Phi4mmModel {
    /// One real token through the whole path — media stage, prefill, sampling — before the host
    /// routes traffic here: it pages the weights in, and a backend that cannot run fails the
    /// (re)load instead of the first request.
    fn warm(&self) -> Result<(), PluginError> {
        let ids = warm_up_prompt(&self.prompt)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let job = Job {
            id: WARM_JOB_ID,
            prompt_tokens: ids.len(),
            prepare: self.media.prepare_fn(
                PromptInput {
                    input_ids: ids.clone(),
                    ..PromptInput::default()
                },
                1,
            ),
            generation: GenerationParams::greedy(1),
            sink: Box::new(WarmSink(tx)),
        };
        self.scheduler
            .submit(job)
            .map_err(|r| PluginError::internal(format!("warm-up request refused: {r}")))?;
        match rx.recv() {
            Ok(Outcome::Finished { .. }) => Ok(()),
            Ok(Outcome::Failed(e)) => Err(PluginError::internal(format!("warm-up failed: {e}"))),
            Err(_) => Err(PluginError::internal("warm-up: the scheduler stopped")),
        }
    }

    fn submit(&self, request: Request, sink: EventSinkBox) -> Result<(), PluginError> {
        let modality = request.modality();
        if !plugin_manifest().models[0].accepts(request.endpoint, modality) {
            return Err(PluginError::new(
                ErrorKind::Unsupported,
                format!("phi4mm does not serve {modality} on {:?}", request.endpoint),
            ));
        }
        let options = options_of(&request)?;
        let source = self.prompt_source(&request, &options)?;
        self.admit(&request, options, source, sink)
    }

    fn submit_prompt(
        &self,
        request: Request,
        prompt: RawPrompt,
        sink: EventSinkBox,
    ) -> Result<(), PluginError> {
        let options = options_of(&request)?;
        if options.input_ids.is_some() {
            return Err(PluginError::invalid_request(
                "model_options.input_ids: a completion's prompt is its ids already; send them \
                 as the prompt",
            ));
        }
        // The budget does not depend on the prompt's length but for transcriptions.
        let ids = self.completion_ids(prompt, self.max_new_tokens(&request, 0))?;
        let source = PromptSource::Ids {
            input_ids: ids,
            images: Vec::new(),
            audios: Vec::new(),
        };
        self.admit(&request, options, source, sink)
    }

    fn cancel(&self, request_id: u64) -> bool {
        self.scheduler.cancel(request_id)
    }

    fn stats(&self) -> ModelStats {
        let s = self.scheduler.stats();
        let adapters = ["base", "speech", "vision"]
            .iter()
            .zip(s.rows_per_adapter)
            .map(|(name, rows)| AdapterRows {
                adapter: (*name).into(),
                rows: rows as u32,
            })
            .collect::<Vec<_>>();
        ModelStats {
            running: s.running as u32,
            queued: s.queued as u32,
            free_slots: s.free_slots as u32,
            adapters: adapters.into(),
            details_json: RString::from(
                serde_json::json!({
                    "slots": s.slots,
                    "queued_tokens": s.queued_tokens,
                    "steps_by_rows": s.steps_by_rows,
                    "prepared_waiting": s.ready,
                    "audio_rows_per_branch": { "speech": s.rows_per_audio_branch[0], "vision": s.rows_per_audio_branch[1] },
                    "backend": self.backend_name,
                    "producer": self.producer_name,
                    "backend_details": (self.backend_details)(),
                })
                .to_string(),
            ),
        }
    }

    /// The KV capacity is the KV pool, in positions of f32 keys and values (what both backends
    /// store); in use are the positions the running rows hold. The checkpoint's LoRA adapters
    /// are loaded with it (a row picks one per request), so they are resident and nothing ever
    /// waits for one; a checkpoint without one reports it missing from the list.
    fn resources(&self) -> ModelResources {
        let s = self.scheduler.stats();
        let resident: Vec<String> = LoraAdapter::ALL
            .into_iter()
            .filter(|&a| self.model.config.lora(a).is_some())
            .map(|a| a.as_str().into())
            .collect();
        let c = &self.model.config.text;
        let position_bytes = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4;
        ModelResources {
            kv_capacity_tokens: (s.kv_pool_bytes / position_bytes) as u64,
            kv_used_tokens: s.kv_positions as u64,
            max_adapters: resident.len() as u32,
            resident_adapters: resident,
            waiting_adapters: Vec::new(),
        }
    }

    fn drain(&self) {
        self.scheduler.drain();
    }

    fn shutdown(&self) {
        self.scheduler.shutdown();
    }
}

/// Scheduler events → host events.
struct HostSink {
    sink: EventSinkBox,
    /// For the bytes of the tokens in log-probability reports.
    prompt: Arc<Prompt>,
}

impl HostSink {
    fn logprob(&self, (id, logprob): (u32, f32)) -> TokenLogprob {
        TokenLogprob {
            id,
            bytes: self.prompt.token_bytes(id).into(),
            logprob,
        }
    }
}

impl RowSink for HostSink {
    fn started(&mut self, prompt_tokens: usize) -> bool {
        self.sink.send(Event::Started {
            prompt_tokens: prompt_tokens as u32,
        })
    }

    fn token(&mut self, id: u32, text: &str, logprobs: Option<&Logprobs>) -> bool {
        let logprobs = logprobs.map(|l| TokenLogprobs {
            sampled: self.logprob(l.sampled),
            top: l
                .top
                .iter()
                .map(|&t| self.logprob(t))
                .collect::<Vec<_>>()
                .into(),
        });
        self.sink.send(Event::Token {
            id,
            text: text.into(),
            logprobs: logprobs.map_or(ROption::RNone, ROption::RSome),
        })
    }

    fn done(&mut self, outcome: Outcome) {
        let event = match outcome {
            Outcome::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
            } => Event::Finished {
                reason: match reason {
                    FinishReason::Stop => switchyard_plugin_api::FinishReason::Stop,
                    FinishReason::Length => switchyard_plugin_api::FinishReason::Length,
                    FinishReason::Cancelled => switchyard_plugin_api::FinishReason::Cancelled,
                },
                usage: Usage {
                    prompt_tokens: prompt_tokens as u32,
                    completion_tokens: completion_tokens as u32,
                },
            },
            Outcome::Failed(RowError::Invalid(m)) => Event::Failed(PluginError::invalid_request(m)),
            Outcome::Failed(RowError::Internal(m)) => Event::Failed(PluginError::internal(m)),
            Outcome::Failed(RowError::Deadline) => {
                Event::Failed(PluginError::cancelled("deadline exceeded"))
            }
        };
        self.sink.send(event);
    }
}

switchyard_plugin_api::export_plugin! {
    manifest: plugin_manifest,
    create: create_instance,
    check: check_settings,
}
