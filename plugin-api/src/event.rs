use crate::error::PluginError;
use abi_stable::{sabi_trait, std_types::RString, StableAbi};

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

/// What a model reports about one request, in order: one `Started`, any number of `Token`s, then
/// exactly one of `Finished` or `Failed`.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum Event {
    Started {
        prompt_tokens: u32,
    },
    /// One generated token: its id and the text it adds (may be empty when a multi-byte
    /// character spans tokens; the text then arrives with a later token).
    Token {
        id: u32,
        text: RString,
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
    /// Delivers one event. Returns `false` when nobody listens any more (the client went away):
    /// the plugin must then cancel the request and free its slot.
    #[sabi(last_prefix_field)]
    fn send(&self, event: Event) -> bool;
}

/// An owned, FFI-safe event sink.
pub type EventSinkBox = EventSink_TO<'static, abi_stable::std_types::RBox<()>>;
