//! Prompt front end (docs/phi4mm-model.md §10, fixture README §11): tokenizer, chat template, media
//! placeholders and their expansion.
//!
//! Flow for one request:
//! 1. [`Prompt::encode_messages`] renders the Phi-4 chat template over [`Message`]s, binds
//!    `<|image_N|>` / `<|audio_N|>` placeholders to the media parts in order (inserting them at
//!    the start of a user turn that has media but none written, images first), refuses reserved
//!    tokens typed in content and count mismatches, and tokenizes piece by piece (one id per
//!    medium): each role marker, placeholder and run of user text on its own, so user text can
//!    never join a neighbour into a special token, and user text never yields a reserved id;
//! 2. the caller preprocesses the media in [`PromptIds::images`] / [`PromptIds::audios`] order;
//! 3. [`Prompt::expand`] replaces the k-th placeholder id by its medium's token count.

mod error;
mod messages;
mod special;
mod template;
mod token_bytes;

pub use error::PromptError;
pub use messages::{ContentPart, Message, Role};
pub use special::SpecialTokens;

use std::collections::HashMap;
use std::path::Path;
use template::Piece;
use tokenizers::Tokenizer;

/// Token ids of a rendered prompt before expansion, with its media in binding order.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptIds<'a> {
    /// One placeholder id per medium.
    pub ids: Vec<u32>,
    /// Image bytes in the order their placeholders appear.
    pub images: Vec<&'a [u8]>,
    /// Audio bytes in the order their placeholders appear.
    pub audios: Vec<&'a [u8]>,
    /// The rendered template with `<|image_N|>` / `<|audio_N|>` (before substitution).
    pub text: String,
}

/// Tokenizer plus the special ids of one checkpoint.
pub struct Prompt {
    tokenizer: Tokenizer,
    special: SpecialTokens,
    /// Special added tokens (`<|end|>`, `<|endoftext11|>`, …) that content may not contain.
    reserved: Vec<String>,
    /// Their ids, which user text may never produce.
    reserved_ids: HashMap<u32, String>,
}

impl Prompt {
    /// Loads `tokenizer.json`, `config.json` and (optionally) `tokenizer_config.json` from a
    /// checkpoint directory of either layout.
    pub fn load(model_dir: &Path) -> Result<Self, PromptError> {
        let path = model_dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| PromptError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let special = SpecialTokens::load(model_dir)?;
        Self::new(tokenizer, special)
    }

    /// Builds from an already loaded tokenizer; checks that the tokenizer's placeholder tokens
    /// carry the ids the config names.
    pub fn new(mut tokenizer: Tokenizer, special: SpecialTokens) -> Result<Self, PromptError> {
        for (token, id) in [
            (special::IMAGE_TOKEN, special.image),
            (special::AUDIO_TOKEN, special.audio),
        ] {
            match tokenizer.token_to_id(token) {
                Some(found) if found == id => {}
                Some(found) => {
                    return Err(PromptError::Config(format!(
                        "{token} is id {found} in tokenizer.json but {id} in config.json"
                    )))
                }
                None => {
                    return Err(PromptError::Config(format!(
                        "{token} is not in tokenizer.json; config.json gives it id {id}"
                    )))
                }
            }
        }
        let reserved_ids: HashMap<u32, String> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            // Special tokens, and any `<|…|>` added token even if not flagged special: typed in
            // content they would forge turns or placeholders.
            .filter(|(_, t)| {
                t.special || (t.content.starts_with("<|") && t.content.ends_with("|>"))
            })
            .map(|(id, t)| (id, t.content))
            .collect();
        // The template's markers must each be one added token: otherwise `<|user|>` would
        // tokenize as text, the turns would blur, and a user could type the marker's pieces.
        let markers = [Role::System, Role::User, Role::Assistant].map(Role::marker);
        for marker in markers
            .into_iter()
            .chain(["<|end|>", special.eos_token.as_str()])
        {
            match tokenizer.token_to_id(marker) {
                Some(id) if reserved_ids.contains_key(&id) => {}
                _ => {
                    return Err(PromptError::Config(format!(
                        "the chat template's {marker} is not an added token of tokenizer.json"
                    )))
                }
            }
        }
        let mut reserved: Vec<String> = reserved_ids.values().cloned().collect();
        reserved.sort();
        // A prompt is tokenized piece by piece; a truncation or padding setting in
        // tokenizer.json would apply to every piece (and has no meaning for a chat prompt).
        tokenizer
            .with_truncation(None)
            .map_err(|e| PromptError::Config(format!("cannot disable truncation: {e}")))?;
        tokenizer.with_padding(None);
        Ok(Self {
            tokenizer,
            special,
            reserved,
            reserved_ids,
        })
    }

    /// The special ids in use.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// The underlying tokenizer (for decoding generated ids).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The raw bytes of one token (it may hold part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        token_bytes::token_bytes(&self.tokenizer, id)
    }

    /// Tokenizes raw prompt text: placeholders substituted, special tokens in the text honoured
    /// (this is the developer path: `phi4mm tokenize --text`; chat content goes through
    /// [`Prompt::encode_messages`], which refuses typed special tokens).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        let (substituted, _, _) = template::substitute_placeholders(text);
        self.tokenize(&substituted)
    }

    /// Tokenizes untrusted raw text (a completion's prompt) as plain text: without the
    /// added-token pass, so a special token's spelling (`<|user|>`, a placeholder) stays text,
    /// and with no placeholder substitution. A reserved id in the result is refused all the
    /// same, so no tokenizer quirk can let the text forge one.
    pub fn encode_untrusted_text(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        let ids = self.tokenize_plain(text)?;
        match ids.iter().find_map(|id| self.reserved_ids.get(id)) {
            Some(token) => Err(PromptError::ReservedInText {
                token: token.clone(),
            }),
            None => Ok(ids),
        }
    }

    /// Renders, binds, validates and tokenizes a chat (see the module docs).
    pub fn encode_messages<'a>(
        &self,
        messages: &'a [Message],
        add_generation_prompt: bool,
    ) -> Result<PromptIds<'a>, PromptError> {
        self.check_reserved(messages)?;
        let bound =
            template::bind_and_render(messages, add_generation_prompt, &self.special.eos_token)?;
        let count = |want_image: bool| {
            bound
                .pieces
                .iter()
                .filter(|p| matches!(p, Piece::Placeholder { image, .. } if *image == want_image))
                .count()
        };
        for (kind, placeholders, media) in [
            ("image", count(true), bound.images.len()),
            ("audio", count(false), bound.audios.len()),
        ] {
            if placeholders != media {
                return Err(PromptError::CountMismatch {
                    kind,
                    placeholders,
                    media,
                });
            }
        }
        let ids = self.encode_pieces(&bound.pieces)?;
        Ok(PromptIds {
            ids,
            images: bound.images,
            audios: bound.audios,
            text: bound.text,
        })
    }

    /// Renders and tokenizes a chat without binding media (for tools such as
    /// `phi4mm tokenize --messages`): reserved tokens are still refused, placeholders are
    /// substituted by one id each, and their number is not checked against media parts.
    pub fn tokenize_messages(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), PromptError> {
        self.check_reserved(messages)?;
        let bound =
            template::bind_and_render(messages, add_generation_prompt, &self.special.eos_token)?;
        let ids = self.encode_pieces(&bound.pieces)?;
        Ok((bound.text, ids))
    }

    /// Replaces the k-th image placeholder id by `image_tokens[k]` copies and the k-th audio
    /// placeholder id by `audio_tokens[k]` copies.
    pub fn expand(
        &self,
        ids: &[u32],
        image_tokens: &[usize],
        audio_tokens: &[usize],
    ) -> Result<Vec<u32>, PromptError> {
        expand(
            ids,
            self.special.image,
            image_tokens,
            self.special.audio,
            audio_tokens,
        )
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| PromptError::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Tokenizes a rendered chat piece by piece. Markers and placeholders go through the
    /// tokenizer alone (each is one added token); user text too, so that it cannot merge with
    /// what surrounds it. The added tokens split the whole rendered string at exactly these
    /// boundaries, so for a chat whose content holds no reserved token this equals tokenizing
    /// the joined text with its placeholders substituted (the fixture's ids).
    fn encode_pieces(&self, pieces: &[Piece]) -> Result<Vec<u32>, PromptError> {
        let mut ids = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Marker(marker) => ids.extend(self.tokenize(marker)?),
                Piece::Eos => ids.extend(self.tokenize(&self.special.eos_token)?),
                Piece::Placeholder { image: true, .. } => ids.push(self.special.image),
                Piece::Placeholder { image: false, .. } => ids.push(self.special.audio),
                Piece::Text { message, text } => ids.extend(self.encode_user_text(*message, text)?),
            }
        }
        Ok(ids)
    }

    /// Tokenizes user text so that it yields no reserved id. Each text part was checked to hold
    /// no reserved token, but the parts of a message are joined (`<|en` + `d|>`), so the joined
    /// text can: then it is tokenized as plain text, without the added-token pass, and the
    /// reserved token it spells stays text. Whatever the path, a reserved id in the result is
    /// refused, so no tokenizer quirk can let user text forge a turn or a placeholder.
    fn encode_user_text(&self, message: usize, text: &str) -> Result<Vec<u32>, PromptError> {
        let mut ids = self.tokenize(text)?;
        if ids.iter().any(|id| self.reserved_ids.contains_key(id)) {
            ids = self.tokenize_plain(text)?;
        }
        match ids.iter().find_map(|id| self.reserved_ids.get(id)) {
            Some(token) => Err(PromptError::ReservedToken {
                message,
                token: token.clone(),
            }),
            None => Ok(ids),
        }
    }

    /// The tokenizer's pipeline without its added vocabulary: normalizer, pre-tokenizer and
    /// model, as `Tokenizer::encode` runs them on the text between added tokens.
    fn tokenize_plain(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        use tokenizers::{
            Model, NormalizedString, Normalizer, OffsetType, PreTokenizedString, PreTokenizer,
        };
        let fail = |e: tokenizers::Error| PromptError::Tokenize(e.to_string());
        let mut normalized = NormalizedString::from(text);
        if let Some(normalizer) = self.tokenizer.get_normalizer() {
            normalizer.normalize(&mut normalized).map_err(fail)?;
        }
        let mut pretokenized = PreTokenizedString::from(normalized);
        if let Some(pre_tokenizer) = self.tokenizer.get_pre_tokenizer() {
            pre_tokenizer
                .pre_tokenize(&mut pretokenized)
                .map_err(fail)?;
        }
        let model = self.tokenizer.get_model();
        pretokenized
            .tokenize(|n| model.tokenize(n.get()))
            .map_err(fail)?;
        let encoding = pretokenized
            .into_encoding(None, 0, OffsetType::Byte)
            .map_err(fail)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Refuses a reserved token typed whole in one text part.
    fn check_reserved(&self, messages: &[Message]) -> Result<(), PromptError> {
        for (index, message) in messages.iter().enumerate() {
            for part in &message.content {
                if let ContentPart::Text { text } = part {
                    if let Some(token) = self.reserved.iter().find(|t| text.contains(t.as_str())) {
                        return Err(PromptError::ReservedToken {
                            message: index,
                            token: token.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Placeholder expansion on ids (free function so it can be used without a tokenizer).
pub fn expand(
    ids: &[u32],
    image_id: u32,
    image_tokens: &[usize],
    audio_id: u32,
    audio_tokens: &[usize],
) -> Result<Vec<u32>, PromptError> {
    let n_images = ids.iter().filter(|&&id| id == image_id).count();
    let n_audios = ids.iter().filter(|&&id| id == audio_id).count();
    if n_images != image_tokens.len() {
        return Err(PromptError::CountMismatch {
            kind: "image",
            placeholders: n_images,
            media: image_tokens.len(),
        });
    }
    if n_audios != audio_tokens.len() {
        return Err(PromptError::CountMismatch {
            kind: "audio",
            placeholders: n_audios,
            media: audio_tokens.len(),
        });
    }
    let total = ids.len() - n_images - n_audios
        + image_tokens.iter().sum::<usize>()
        + audio_tokens.iter().sum::<usize>();
    let mut out = Vec::with_capacity(total);
    let (mut next_image, mut next_audio) = (image_tokens.iter(), audio_tokens.iter());
    for &id in ids {
        if id == image_id {
            let n = *next_image.next().expect("counted above");
            out.extend(std::iter::repeat_n(id, n));
        } else if id == audio_id {
            let n = *next_audio.next().expect("counted above");
            out.extend(std::iter::repeat_n(id, n));
        } else {
            out.push(id);
        }
    }
    Ok(out)
}
