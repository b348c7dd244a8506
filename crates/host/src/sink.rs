//! The host's side of the event stream: plugin threads call [`ChannelSink::send`], which feeds a
//! channel that the HTTP handler reads through an [`EventReceiver`]. When the handler is gone
//! (client disconnected) the receiver is dropped and `send` returns false, which tells the plugin
//! to cancel; after the request's terminal event it returns false too.
//!
//! **`send` never blocks.** A plugin thread may serve many requests at once (Phi4MM's scheduler
//! steps all its rows together), so a client that stops reading must not hold it: when it did
//! (backpressure, a blocking `send`), one such client paused every request of the instance for
//! `event_send_timeout_secs` at a time, again and again. Instead each request has a window of
//! `server.event_buffer` unread events. A request whose window is full and whose client has
//! read nothing since is *stalled*: its events still queue, and `send` returns false (cancel)
//! once it has stayed stalled for `server.event_send_timeout_secs`. Any event the handler hands
//! on (it takes what waits in batches and writes them out one by one as the client reads)
//! counts as a read and restarts that time, so a client that keeps reading, however slowly, is
//! never cut. What a request holds is bounded by what its plugin sends: its `max_tokens`.
//!
//! A `send` made on one of the host's async threads (a plugin answering inside `submit`, as the
//! echo fixture's `inline` mode does) is never refused for room, for the reader may be that very
//! thread and has read nothing yet: `submit` is synchronous and bounded by the request itself.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};
use switchyard_plugin_api::{Event, EventSink, EventSinkBox, EventSink_TO, PluginError};

/// How many events may wait unread per request, and how long a request may stay stalled.
#[derive(Clone, Debug, PartialEq)]
pub struct SinkLimits {
    pub capacity: usize,
    pub send_timeout: Duration,
}

impl Default for SinkLimits {
    fn default() -> Self {
        Self {
            capacity: 256,
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// What the sink and the receiver share. One lock per event on each side, and no other
/// synchronisation: a short request's dozen events were a noticeable share of its cost when
/// each also went through a channel of its own.
struct Shared {
    state: Mutex<State>,
    /// Events the receiver has handed on so far: its progress, which the sender reads when the
    /// window is full. Written with a plain store per event (no lock, no read-modify-write).
    handed_on: AtomicU64,
}

#[derive(Default)]
struct State {
    unread: VecDeque<Event>,
    /// The receiver is gone (the client disconnected), the request was cancelled stalled, or
    /// its terminal event was sent.
    closed: bool,
    /// The sink is gone: after the unread events, the stream ends.
    ended: bool,
    /// The reading task, waiting for an event.
    reader: Option<Waker>,
    /// Since when the window has been full with no event handed on: the request is stalled.
    stalled_since: Option<Instant>,
    /// `Shared::handed_on` when `stalled_since` was last set.
    handed_on_then: u64,
}

pub struct ChannelSink {
    shared: Arc<Shared>,
    limits: SinkLimits,
}

impl ChannelSink {
    /// Whether a stalled request has had its time: then it is cancelled.
    fn past_stall(&self, state: &mut State) -> bool {
        let Some(since) = state.stalled_since else {
            return false;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            return false;
        }
        let handed_on = self.shared.handed_on.load(Ordering::Relaxed);
        if handed_on != state.handed_on_then {
            // The client read since: its time starts again.
            state.stalled_since = Some(Instant::now());
            state.handed_on_then = handed_on;
            return false;
        }
        if since.elapsed() >= self.limits.send_timeout {
            tracing::warn!(
                unread = state.unread.len(),
                timeout_secs = self.limits.send_timeout.as_secs_f64(),
                "a client stopped reading its events (event_send_timeout_secs); cancelling its \
                 request"
            );
            return true;
        }
        false
    }
}

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        let mut state = self.shared.state.lock().unwrap();
        if state.closed {
            return false;
        }
        if self.past_stall(&mut state) {
            // What waits is dropped now, and the request ends cancelled, said so to the
            // handler should it ever read again.
            state.closed = true;
            let cancelled = Event::Failed(PluginError::cancelled(format!(
                "the client read none of the events waiting for it (event_buffer = {}) within \
                 event_send_timeout_secs = {}; the request was cancelled",
                self.limits.capacity,
                self.limits.send_timeout.as_secs_f64(),
            )));
            let unread = std::mem::replace(&mut state.unread, VecDeque::from([cancelled]));
            let reader = state.reader.take();
            drop(state);
            drop(unread);
            if let Some(reader) = reader {
                reader.wake();
            }
            return false;
        }
        // The request is over after its terminal event: whatever a plugin sends later is a
        // bug of its own, refused (`false`) rather than queued for nobody.
        state.closed = matches!(event, Event::Finished { .. } | Event::Failed(_));
        state.unread.push_back(event);
        if state.unread.len() >= self.limits.capacity && state.stalled_since.is_none() {
            // The window is full: the stall's clock runs from now until the next read.
            state.stalled_since = Some(Instant::now());
            state.handed_on_then = self.shared.handed_on.load(Ordering::Relaxed);
        }
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
        true
    }
}

impl Drop for ChannelSink {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap();
        state.ended = true;
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }
}

/// The handler's end of a request's events. It takes the unread events in batches, all that
/// are there under one lock (a fast plugin's whole answer, often), and hands them out one by
/// one; so besides the events in the channel, those of the batch being read wait too.
pub struct EventReceiver {
    shared: Arc<Shared>,
    batch: VecDeque<Event>,
    /// The last event handed out began a new batch.
    fresh: bool,
    /// Events handed out so far (published in `Shared::handed_on`).
    handed_on: u64,
}

impl EventReceiver {
    /// The next event; `None` once the plugin dropped its sink and every event was read.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        if let Some(event) = self.next_of_batch() {
            return Poll::Ready(Some(event));
        }
        let mut state = self.shared.state.lock().unwrap();
        if take_batch(&mut state, &mut self.batch) {
            drop(state);
            self.fresh = true;
            return Poll::Ready(self.hand_on());
        }
        if state.ended {
            return Poll::Ready(None);
        }
        match &mut state.reader {
            Some(waker) => waker.clone_from(cx.waker()),
            None => state.reader = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next event if one is there (for callers outside an async context).
    pub fn try_recv(&mut self) -> Option<Event> {
        if let Some(event) = self.next_of_batch() {
            return Some(event);
        }
        let mut state = self.shared.state.lock().unwrap();
        if !take_batch(&mut state, &mut self.batch) {
            return None;
        }
        drop(state);
        self.fresh = true;
        self.hand_on()
    }

    /// Whether the event last handed out was the first of a batch taken from the channel (a
    /// reader that checks a clock per batch, not per event, looks here).
    pub fn began_batch(&self) -> bool {
        self.fresh
    }

    fn next_of_batch(&mut self) -> Option<Event> {
        self.fresh = false;
        self.hand_on()
    }

    /// The batch's next event, counted as read: the sender sees the client's progress.
    fn hand_on(&mut self) -> Option<Event> {
        let event = self.batch.pop_front()?;
        self.handed_on += 1;
        self.shared
            .handed_on
            .store(self.handed_on, Ordering::Relaxed);
        Some(event)
    }

    pub async fn recv(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap();
        state.closed = true;
        // The events still unread go now, not when the plugin drops its sink.
        let unread = std::mem::take(&mut state.unread);
        drop(state);
        drop(unread);
    }
}

/// Moves every unread event into the (empty) `batch`; false when there was none. A read ends
/// a stall.
fn take_batch(state: &mut State, batch: &mut VecDeque<Event>) -> bool {
    if state.unread.is_empty() {
        return false;
    }
    // The buffers trade places, so neither allocates once both have grown.
    std::mem::swap(&mut state.unread, batch);
    state.stalled_since = None;
    true
}

/// Events the channel has room for before it first grows.
const INITIAL_ROOM: usize = 16;

/// A sink for the plugin and the receiver for the handler.
pub fn channel(limits: SinkLimits) -> (EventSinkBox, EventReceiver) {
    // Room for a short answer's events from the start: growing from empty cost three
    // reallocations per request.
    let state = State {
        unread: VecDeque::with_capacity(INITIAL_ROOM.min(limits.capacity)),
        ..State::default()
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        handed_on: AtomicU64::new(0),
    });
    let sink = ChannelSink {
        shared: shared.clone(),
        limits,
    };
    let sink = EventSink_TO::from_value(sink, abi_stable::sabi_trait::TD_Opaque);
    let receiver = EventReceiver {
        shared,
        batch: VecDeque::new(),
        fresh: false,
        handed_on: 0,
    };
    (sink, receiver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_plugin_api::Event;

    fn started() -> Event {
        Event::Started { prompt_tokens: 1 }
    }

    #[test]
    fn the_reader_takes_what_waits_as_one_batch_in_order() {
        let (sink, mut rx) = channel(SinkLimits::default());
        for tokens in 1..=3 {
            assert!(sink.send(Event::Started {
                prompt_tokens: tokens
            }));
        }
        let read = |rx: &mut EventReceiver| match rx.try_recv() {
            Some(Event::Started { prompt_tokens }) => (prompt_tokens, rx.began_batch()),
            other => panic!("{other:?}"),
        };
        assert_eq!(read(&mut rx), (1, true));
        // Sent after the batch was taken: it waits for the next one.
        assert!(sink.send(Event::Started { prompt_tokens: 4 }));
        assert_eq!(read(&mut rx), (2, false));
        assert_eq!(read(&mut rx), (3, false));
        assert_eq!(read(&mut rx), (4, true));
        assert!(rx.try_recv().is_none());
        drop(sink);
        assert!(rx.try_recv().is_none());
    }

    /// Sends on a plain thread, as a plugin's scheduler does; each must return at once.
    fn send_timed(sink: &EventSinkBox) -> bool {
        let t = Instant::now();
        let sent = sink.send(started());
        assert!(
            t.elapsed() < Duration::from_millis(50),
            "send waited {:?}",
            t.elapsed()
        );
        sent
    }

    #[test]
    fn a_stalled_request_never_blocks_the_plugin_and_is_cancelled_after_the_timeout() {
        let limits = SinkLimits {
            capacity: 2,
            send_timeout: Duration::from_millis(300),
        };
        let (sink, mut rx) = channel(limits);
        // The window fills and stays full: sends still return at once and queue.
        for _ in 0..3 {
            assert!(send_timed(&sink));
        }
        // A read ends the stall; sending goes on.
        std::thread::sleep(Duration::from_millis(200));
        assert!(rx.try_recv().is_some());
        std::thread::sleep(Duration::from_millis(200));
        assert!(send_timed(&sink));
        assert!(send_timed(&sink));
        // Now nobody reads: past the timeout since the window filled, the request is
        // cancelled, and the reader learns why.
        std::thread::sleep(Duration::from_millis(350));
        assert!(!send_timed(&sink));
        assert!(!send_timed(&sink), "a cancelled request stays cancelled");
        let mut last = None;
        while let Some(event) = rx.try_recv() {
            last = Some(event);
        }
        match last {
            Some(Event::Failed(e)) => {
                assert!(e.message.contains("event_send_timeout_secs"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_client_that_keeps_reading_slowly_is_never_cancelled() {
        let limits = SinkLimits {
            capacity: 2,
            send_timeout: Duration::from_millis(200),
        };
        let (sink, mut rx) = channel(limits);
        // The model writes three events for every one the client reads, 100 ms apart, for
        // five timeouts: the window stays full, but the client reads.
        for _ in 0..10 {
            for _ in 0..3 {
                assert!(send_timed(&sink));
            }
            assert!(rx.try_recv().is_some());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(send_timed(&sink));
    }

    #[test]
    fn sends_on_the_hosts_async_threads_are_never_cancelled() {
        let limits = SinkLimits {
            capacity: 1,
            send_timeout: Duration::ZERO,
        };
        let (sink, mut rx) = channel(limits);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            for _ in 0..10 {
                assert!(sink.send(started()));
            }
        });
        drop(sink);
        let mut read = 0;
        while rx.try_recv().is_some() {
            read += 1;
        }
        assert_eq!(read, 10);
    }

    #[test]
    fn nothing_is_taken_after_the_terminal_event() {
        for terminal in [
            Event::Finished {
                reason: switchyard_plugin_api::FinishReason::Stop,
                usage: Default::default(),
            },
            Event::Failed(PluginError::internal("broken")),
        ] {
            let (sink, mut rx) = channel(SinkLimits::default());
            assert!(sink.send(started()));
            assert!(sink.send(terminal.clone()));
            assert!(!sink.send(started()), "a send after {terminal:?}");
            assert!(!sink.send(terminal.clone()));
            drop(sink);
            assert_eq!(rx.try_recv(), Some(started()));
            assert_eq!(rx.try_recv(), Some(terminal));
            assert_eq!(rx.try_recv(), None);
        }
    }
}
