use crate::error::PluginError;
use abi_stable::{
    sabi_trait,
    std_types::{ROption, RString, RVec},
    StableAbi,
};

#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of sequence or a stop condition.
    Stop,
    /// The token budget ran out.
    Length,
    /// Cancelled (client gone, explicit cancel, deadline, shutdown).
    Cancelled,
}

impl FinishReason {
    /// The value of OpenAI's `finish_reason`.
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
        }
    }
}

#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// One token with its log probability under the model.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    /// The token's own bytes (a byte-level token may be part of a UTF-8 character).
    pub bytes: RVec<u8>,
    /// Natural log of the token's probability in the model's distribution at this step (before
    /// temperature, top-k or top-p shape it for sampling).
    pub logprob: f32,
}

/// The log probabilities reported with one generated token.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The token that was generated.
    pub sampled: TokenLogprob,
    /// The most likely tokens at this step, most likely first: as many as the request asked for.
    pub top: RVec<TokenLogprob>,
}

/// What a model reports about one request, in order: one `Started`, any number of `Token`s, then
/// exactly one of `Finished` or `Failed`.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum Event {
    Started {
        prompt_tokens: u32,
    },
    /// One generated token: its id and the text it adds (may be empty when a multi-byte
    /// character spans tokens; the text then arrives with a later token). `logprobs` is set when
    /// the request asked for them ([`crate::Request::logprobs`]), and only then.
    Token {
        id: u32,
        text: RString,
        logprobs: ROption<TokenLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(PluginError),
}

/// The host's per-request receiver of [`Event`]s. Plugins call it from their own threads.
#[sabi_trait]
pub trait EventSink: Send + Sync {
    /// Delivers one event. Returns `false` when nobody listens any more (the client went away,
    /// or stopped reading for the host's `event_send_timeout_secs`): the plugin must then cancel
    /// the request and free its slot. After the request's `Finished` or `Failed` it returns
    /// `false` too and drops the event: the request is over.
    #[sabi(last_prefix_field)]
    fn send(&self, event: Event) -> bool;
}

/// An owned, FFI-safe event sink.
pub type EventSinkBox = EventSink_TO<'static, abi_stable::std_types::RBox<()>>;
