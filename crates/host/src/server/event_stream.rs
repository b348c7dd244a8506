//! An admitted request's plugin events, read in one place for every way of answering it: one
//! JSON body, chat chunks, transcription events, or the terminal of `switchyard run`. Those only
//! format the [`Step`]s; [`EventStream`] keeps the rules of the plugin contract:
//!
//! - a request ends with `Finished` or `Failed`; a channel that closes before either (the plugin
//!   dropped its sink) fails the request too, so no caller waits for an end that never comes;
//! - a request that asked for log probabilities gets them with every token, or fails, rather
//!   than answering with a silently shorter list;
//! - the request's record (status, error kind, duration, time to the first token) is written
//!   however it ends, and a client that goes away is recorded as such;
//! - dropping the stream before the end cancels the request inside the plugin (through the
//!   [`Admission`]); reaching the end does not.

use super::{
    error::{ApiError, PartNames},
    record::RequestRecord,
};
use crate::{
    instance::{Admission, Instance, InstanceState, Refusal, Submission},
    metrics::Metrics,
    sink::EventReceiver,
};
use abi_stable::std_types::RString;
use futures_util::{stream, Stream};
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};
use switchyard_plugin_api::{Event, FinishReason, PluginError, TokenLogprobs, Usage};

/// One step of an answer. The last step is `Finished` or `Failed`; nothing follows it.
#[derive(Debug)]
pub enum Step {
    /// `logprobs` is set exactly when the request asked for log probabilities.
    Token {
        text: RString,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(Failure),
}

/// The whole answer of a request that finished.
#[derive(Debug)]
pub struct Answer {
    pub text: String,
    /// One entry per token when the request asked for log probabilities, else empty.
    pub logprobs: Vec<TokenLogprobs>,
    /// Beside each entry of `logprobs`: the characters of the tokens before it, where its text
    /// begins in `text` (a token that a stop string cut may begin past the text kept).
    pub text_offsets: Vec<usize>,
    pub reason: FinishReason,
    pub usage: Usage,
}

/// Why an admitted request did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The plugin said so (`Event::Failed`); with what the parts it may blame are called.
    #[error("{0}")]
    Plugin(PluginError, PartNames),
    #[error("the model sent a token without the log probabilities the request asked for")]
    MissingLogprobs,
    #[error("the model ended the request without finishing it")]
    NoTerminalEvent,
    /// The plugin ended the request as cancelled although its client was still there: a
    /// shutdown, a drain that reached its deadline, or the plugin's own deadline.
    #[error("{0}")]
    Cancelled(String),
    /// The host's wall-clock limit (`request_timeout_secs`) passed.
    #[error("the request ran past request_timeout_secs = {0}")]
    Deadline(f64),
}

impl Failure {
    /// The error a client sees.
    pub fn to_api_error(&self, retry_after: u32) -> ApiError {
        match self {
            Self::Plugin(error, names) => ApiError::from_plugin(error, retry_after, *names),
            Self::MissingLogprobs | Self::NoTerminalEvent => ApiError::internal(self.to_string()),
            Self::Cancelled(message) => ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "cancelled",
                message.clone(),
            ),
            Self::Deadline(_) => ApiError::new(
                axum::http::StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "request_timeout",
                self.to_string(),
            ),
        }
    }

    /// The status and error kind the request's record keeps. A missing end is a plugin bug
    /// worth its own kind, although the client sees a plain internal error.
    fn recorded_as(&self) -> (u16, &'static str) {
        match self {
            Self::NoTerminalEvent => (500, "no_terminal_event"),
            Self::Deadline(_) => (504, "request_timeout"),
            other => {
                // `Retry-After` does not change the status or the code.
                let error = other.to_api_error(0);
                (error.status.as_u16(), error.code)
            }
        }
    }
}

pub struct EventStream {
    admission: Admission,
    events: EventReceiver,
    record: RequestRecord,
    logprobs_wanted: bool,
    /// What a part that the plugin's failure blames is called in the client's request.
    part_names: PartNames,
    ended: bool,
    deadline: Option<Deadline>,
    /// When the batch of events being read was taken from the channel: the arrival time of
    /// each of its tokens (they arrived together; one clock read serves them all).
    batch_taken: Instant,
    /// A step read while waiting for the start ([`Self::started`]), handed out first. Boxed:
    /// the stream is moved with every request, and this is seldom set.
    pending: Option<Box<Step>>,
}

/// The host's wall-clock limit of a request.
struct Deadline {
    /// When the limit passes.
    at: Instant,
    /// The timer, made the first time the stream has to wait: a request whose events are all
    /// there when it is read (a fast plugin's) never makes one.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// `request_timeout_secs`, for the error.
    secs: f64,
}

impl EventStream {
    /// Submits `request` (a chat's [`switchyard_plugin_api::Request`] or a completion's
    /// [`Submission`]) to `instance`. `model` is the name the client asked for, and `started`
    /// when the request arrived; both go into the request's record.
    pub fn open(
        instance: &Arc<Instance>,
        request: impl Into<Submission>,
        metrics: &Metrics,
        model: &str,
        started: Instant,
    ) -> Result<Self, Refusal> {
        let submission = request.into();
        let endpoint = submission.endpoint_name();
        let logprobs_wanted = submission.request.logprobs.is_some();
        let part_names = PartNames::of(&submission);
        let (admission, events) = instance.submit(submission)?;
        let series = instance.request_series(metrics);
        let record = RequestRecord::new(metrics.clone(), series, model, endpoint, started);
        Ok(Self {
            admission,
            events,
            record,
            logprobs_wanted,
            part_names,
            ended: false,
            deadline: None,
            batch_taken: started,
            pending: None,
        })
    }

    /// Waits until the plugin has started the request (`Event::Started`: its inputs, media
    /// included, were read and it holds the resources to run), or has ended it. A request that
    /// failed before it started is the failure, so that a streamed answer gets the status a
    /// plain one would (a 400 for a clip that does not decode) instead of a 200 and an error
    /// event. What arrives instead of `Started` is kept for the steps.
    pub async fn started(mut self) -> Result<Self, Failure> {
        let step = std::future::poll_fn(|cx| loop {
            let event = match self.poll_event(cx) {
                Poll::Ready(Ok(event)) => event,
                Poll::Ready(Err(deadline)) => return Poll::Ready(Some(deadline)),
                Poll::Pending => return Poll::Pending,
            };
            if matches!(event, Some(Event::Started { .. })) {
                self.step(event);
                return Poll::Ready(None);
            }
            if let Some(step) = self.step(event) {
                return Poll::Ready(Some(step));
            }
        })
        .await;
        match step {
            Some(Step::Failed(failure)) => Err(failure),
            other => {
                self.pending = other.map(Box::new);
                Ok(self)
            }
        }
    }

    /// Fails the request with [`Failure::Deadline`] at `at` unless it ended before; `secs` is
    /// the limit the error names. (The plugin got the same deadline in the request.)
    pub fn with_deadline(mut self, at: Instant, secs: f64) -> Self {
        self.deadline = Some(Deadline {
            at,
            sleep: None,
            secs,
        });
        self
    }

    /// The instance serving the request.
    pub fn instance(&self) -> &Arc<Instance> {
        self.admission.instance()
    }

    /// The steps, ending after `Finished` or `Failed`. The admission and the record go when the
    /// consumer asks past the end, so a streamed answer counts as in flight until its last byte.
    pub fn into_steps(self) -> impl Stream<Item = Step> {
        stream::unfold(self, |mut events| async move {
            // A terminal step read while waiting for the start is still to be handed out.
            if events.ended && events.pending.is_none() {
                return None;
            }
            let step = std::future::poll_fn(|cx| events.poll_step(cx)).await;
            Some((step, events))
        })
    }

    /// Waits for the whole answer.
    pub async fn answer(mut self) -> Result<Answer, Failure> {
        // Room for a short answer at once, instead of a reallocation every few tokens.
        let mut text = String::with_capacity(256);
        let (mut chars, mut logprobs, mut text_offsets) = (0, Vec::new(), Vec::new());
        loop {
            match std::future::poll_fn(|cx| self.poll_step(cx)).await {
                Step::Token {
                    text: piece,
                    logprobs: sent,
                } => {
                    // A token's offset counts the characters of the tokens before it, not the
                    // text sent so far: a plugin holds text back (the start of a possible stop
                    // string) and sends it with a later token.
                    if let Some(sent) = sent {
                        text_offsets.push(chars);
                        chars += super::logprobs::chars_begun(&sent.sampled.bytes);
                        logprobs.push(sent);
                    }
                    text.push_str(&piece);
                }
                Step::Finished { reason, usage } => {
                    return Ok(Answer {
                        text,
                        logprobs,
                        text_offsets,
                        reason,
                        usage,
                    })
                }
                Step::Failed(failure) => return Err(failure),
            }
        }
    }

    /// The next step; only for a stream that has not ended.
    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        if let Some(step) = self.pending.take() {
            return Poll::Ready(*step);
        }
        loop {
            let event = match self.poll_event(cx) {
                Poll::Ready(Ok(event)) => event,
                Poll::Ready(Err(deadline)) => return Poll::Ready(deadline),
                Poll::Pending => return Poll::Pending,
            };
            if let Some(step) = self.step(event) {
                return Poll::Ready(step);
            }
        }
    }

    /// The next event (`None`: the channel closed), or the deadline's failure.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Event>, Step>> {
        // The events first: a request whose events are already there (a fast plugin) then
        // never makes its deadline's timer (an allocation and a place in tokio's timer
        // wheel), for the timer is made only when the stream has to wait. The clock
        // check, once per batch of events taken from the channel, keeps a plugin that never
        // lets the channel run dry from outliving it.
        match self.events.poll_recv(cx) {
            Poll::Ready(event) => {
                if self.events.began_batch() {
                    self.batch_taken = Instant::now();
                    if self.past_deadline() {
                        return Poll::Ready(Err(self.deadline_passed()));
                    }
                }
                Poll::Ready(Ok(event))
            }
            Poll::Pending => {
                if let Some(d) = &mut self.deadline {
                    let at = d.at;
                    let sleep = d
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at.into())));
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(self.deadline_passed()));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline
            .as_ref()
            .is_some_and(|d| self.batch_taken >= d.at)
    }

    fn deadline_passed(&mut self) -> Step {
        let secs = self.deadline.as_ref().map_or(0.0, |d| d.secs);
        // Not marked finished: dropping the admission cancels it in the plugin.
        let failure = Failure::Deadline(secs);
        let (status, kind) = failure.recorded_as();
        self.record.fail(status, kind);
        self.ended = true;
        Step::Failed(failure)
    }

    /// Reads one event and does what it implies for the admission and the record.
    fn step(&mut self, event: Option<Event>) -> Option<Step> {
        match &event {
            Some(Event::Token { .. }) => self.record.token(self.batch_taken),
            Some(Event::Started { prompt_tokens }) => self.record.started(*prompt_tokens),
            _ => {}
        }
        let mut step = read(event, self.logprobs_wanted, self.part_names)?;
        // The plugin got the host's deadline, and may see it pass before the host's timer
        // fires: then its cancellation is the host's 504, not a 408.
        if let Step::Failed(Failure::Plugin(e, _)) = &step {
            let passed = self
                .deadline
                .as_ref()
                .is_some_and(|d| Instant::now() >= d.at);
            if e.kind == switchyard_plugin_api::ErrorKind::Cancelled && passed {
                self.admission.mark_finished();
                return Some(self.deadline_passed());
            }
        }
        if let Step::Finished {
            reason: FinishReason::Cancelled,
            ..
        } = step
        {
            // Nobody cancels a request whose client is still reading but a shutdown, a drain
            // cut at its deadline or a deadline: that is no answer, whatever it looks like.
            let message = if self.instance().state() == InstanceState::Ready {
                "the model cancelled the request".to_string()
            } else {
                format!(
                    "the request was cut when model {} was stopped (a reload or shutdown \
                     reached drain_timeout_secs)",
                    self.instance().name
                )
            };
            step = Step::Failed(Failure::Cancelled(message));
        }
        match &step {
            Step::Token { .. } => {}
            Step::Finished { .. } => {
                self.admission.mark_finished();
                self.record.finish(200);
                self.ended = true;
            }
            Step::Failed(failure) => {
                // A request the plugin has not ended stays unfinished, so that dropping the
                // admission cancels it there.
                if !matches!(failure, Failure::MissingLogprobs) {
                    self.admission.mark_finished();
                }
                let (status, kind) = failure.recorded_as();
                super::outcome::log_plugin_fault(self.instance(), status, kind, failure);
                self.record.fail(status, kind);
                self.ended = true;
            }
        }
        Some(step)
    }
}

/// What one event (`None`: the channel closed) means for a request that did or did not ask for
/// log probabilities; `None` for an event no caller formats.
fn read(event: Option<Event>, logprobs_wanted: bool, names: PartNames) -> Option<Step> {
    Some(match event {
        Some(Event::Started { .. }) => return None,
        Some(Event::Token { text, logprobs, .. }) => match logprobs.into_option() {
            None if logprobs_wanted => Step::Failed(Failure::MissingLogprobs),
            sent => Step::Token {
                text,
                logprobs: sent.filter(|_| logprobs_wanted),
            },
        },
        Some(Event::Finished { reason, usage }) => Step::Finished { reason, usage },
        Some(Event::Failed(error)) => Step::Failed(Failure::Plugin(error, names)),
        None => Step::Failed(Failure::NoTerminalEvent),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::ROption;
    use switchyard_plugin_api::TokenLogprob;

    fn token(logprobs: bool) -> Option<Event> {
        let sampled = TokenLogprob {
            id: 3,
            bytes: b"hi".to_vec().into(),
            logprob: -0.5,
        };
        Some(Event::Token {
            id: 3,
            text: "hi".into(),
            logprobs: if logprobs {
                ROption::RSome(TokenLogprobs {
                    sampled,
                    top: Vec::new().into(),
                })
            } else {
                ROption::RNone
            },
        })
    }

    #[test]
    fn tokens_carry_log_probabilities_exactly_when_asked() {
        assert!(read(
            Some(Event::Started { prompt_tokens: 2 }),
            true,
            PartNames::Nothing
        )
        .is_none());
        match read(token(true), true, PartNames::Nothing) {
            Some(Step::Token { text, logprobs }) => {
                assert_eq!(text.as_str(), "hi");
                assert_eq!(logprobs.map(|l| l.sampled.id), Some(3));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read(token(true), false, PartNames::Nothing),
            Some(Step::Token { logprobs: None, .. })
        ));
        assert!(matches!(
            read(token(false), false, PartNames::Nothing),
            Some(Step::Token { logprobs: None, .. })
        ));
        assert!(matches!(
            read(token(false), true, PartNames::Nothing),
            Some(Step::Failed(Failure::MissingLogprobs))
        ));
    }

    #[test]
    fn a_request_ends_finished_failed_or_without_an_end() {
        let finished = Event::Finished {
            reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
            },
        };
        assert!(matches!(
            read(Some(finished), false, PartNames::Nothing),
            Some(Step::Finished {
                reason: FinishReason::Length,
                usage: Usage {
                    completion_tokens: 2,
                    ..
                }
            })
        ));
        let failed = Event::Failed(PluginError::overloaded("queue full"));
        match read(Some(failed), false, PartNames::Nothing) {
            Some(Step::Failed(Failure::Plugin(e, _))) => {
                assert_eq!(e.message.as_str(), "queue full")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read(None, false, PartNames::Nothing),
            Some(Step::Failed(Failure::NoTerminalEvent))
        ));
    }

    #[test]
    fn failures_read_as_http_errors_and_are_recorded_by_kind() {
        let overloaded = Failure::Plugin(PluginError::overloaded("queue full"), PartNames::Nothing);
        let error = overloaded.to_api_error(7);
        assert_eq!(error.status.as_u16(), 429);
        assert_eq!(error.message, "queue full");
        assert_eq!(error.retry_after, Some(7));
        assert_eq!(overloaded.recorded_as(), (429, "overloaded"));
        let panicked = Failure::Plugin(
            PluginError::new(switchyard_plugin_api::ErrorKind::Panic, "boom"),
            PartNames::Nothing,
        );
        assert_eq!(panicked.recorded_as(), (500, "plugin_panic"));

        let error = Failure::NoTerminalEvent.to_api_error(1);
        assert_eq!(error.status.as_u16(), 500);
        assert_eq!(error.code, "internal_error");
        assert_eq!(
            error.message,
            "the model ended the request without finishing it"
        );
        assert_eq!(
            Failure::NoTerminalEvent.recorded_as(),
            (500, "no_terminal_event")
        );
        let error = Failure::MissingLogprobs.to_api_error(1);
        assert_eq!(
            error.message,
            "the model sent a token without the log probabilities the request asked for"
        );
        assert_eq!(
            Failure::MissingLogprobs.recorded_as(),
            (500, "internal_error")
        );
    }
}
