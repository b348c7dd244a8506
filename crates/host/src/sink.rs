//! The host's side of the event stream: plugin threads call [`ChannelSink::send`], which feeds a
//! channel that the HTTP handler reads through an [`EventReceiver`]. When the handler is gone
//! (client disconnected) the receiver is dropped and `send` returns false, which tells the plugin
//! to cancel.
//!
//! **`send` never blocks.** A plugin thread may serve many requests at once (Phi4MM's scheduler
//! steps all its rows together), so a client that stops reading must not hold it: when it did
//! (backpressure, a blocking `send`), one such client paused every request of the instance for
//! `event_send_timeout_secs` at a time, again and again. Instead each request has a window of
//! `server.event_buffer` unread events. A request whose window is full is *stalled*: its events
//! still queue, up to [`STALLED_ROOM`] windows' worth, and `send` returns false (cancel) once it
//! has stayed stalled for `server.event_send_timeout_secs` without its client reading, or once
//! that room is full. A client that reads, even slowly, takes every waiting event at each read
//! and is never cut; one that reads nothing loses its request, and holds at most
//! `STALLED_ROOM × event_buffer` events until then.
//!
//! A `send` made on one of the host's async threads (a plugin answering inside `submit`, as the
//! echo fixture's `inline` mode does) is never refused for room, for the reader may be that very
//! thread and has read nothing yet: `submit` is synchronous and bounded by the request itself.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
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

/// A stalled request's events queue up to this many windows (`event_buffer` events each), then
/// it is cancelled: the bound on what a client that reads nothing makes the server hold.
pub const STALLED_ROOM: usize = 2;

/// What the sink and the receiver share. One lock per event on each side, and no other
/// synchronisation: a short request's dozen events were a noticeable share of its cost when
/// each also went through a channel of its own.
struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    unread: VecDeque<Event>,
    /// The receiver is gone (the client disconnected), or the request was cancelled stalled.
    closed: bool,
    /// The sink is gone: after the unread events, the stream ends.
    ended: bool,
    /// The reading task, waiting for an event.
    reader: Option<Waker>,
    /// Since when the window has been full with no read: the request is stalled.
    stalled_since: Option<Instant>,
}

pub struct ChannelSink {
    shared: Arc<Shared>,
    limits: SinkLimits,
}

impl ChannelSink {
    /// Whether a stalled request has had its time or its room: then it is cancelled.
    fn past_stall(&self, state: &State) -> bool {
        let Some(since) = state.stalled_since else {
            return false;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            return false;
        }
        let out_of_room = state.unread.len() >= STALLED_ROOM * self.limits.capacity;
        if out_of_room || since.elapsed() >= self.limits.send_timeout {
            tracing::warn!(
                unread = state.unread.len(),
                timeout_secs = self.limits.send_timeout.as_secs_f64(),
                "a client stopped reading its events (event_buffer, event_send_timeout_secs); \
                 cancelling its request"
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
        if self.past_stall(&state) {
            // What waits is dropped now, and the request ends cancelled, said so to the
            // handler should it ever read again.
            state.closed = true;
            let cancelled = Event::Failed(PluginError::cancelled(format!(
                "the client read none of its last {} events within event_send_timeout_secs = \
                 {} (or let {} wait: event_buffer = {} times {STALLED_ROOM}); the request was \
                 cancelled",
                state.unread.len(),
                self.limits.send_timeout.as_secs_f64(),
                state.unread.len(),
                self.limits.capacity,
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
        state.unread.push_back(event);
        if state.unread.len() >= self.limits.capacity && state.stalled_since.is_none() {
            // The window is full: the stall's clock runs from now until the next read.
            state.stalled_since = Some(Instant::now());
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
}

impl EventReceiver {
    /// The next event; `None` once the plugin dropped its sink and every event was read.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        if let Some(event) = self.next_of_batch() {
            return Poll::Ready(Some(event));
        }
        let mut state = self.shared.state.lock().unwrap();
        if take_batch(&mut state, &mut self.batch) {
            self.fresh = true;
            return Poll::Ready(self.batch.pop_front());
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
        self.batch.pop_front()
    }

    /// Whether the event last handed out was the first of a batch taken from the channel (a
    /// reader that checks a clock per batch, not per event, looks here).
    pub fn began_batch(&self) -> bool {
        self.fresh
    }

    fn next_of_batch(&mut self) -> Option<Event> {
        self.fresh = false;
        self.batch.pop_front()
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
    fn a_stalled_request_that_fills_its_room_is_cancelled_at_once() {
        let limits = SinkLimits {
            capacity: 4,
            send_timeout: Duration::from_secs(60),
        };
        let (sink, _rx) = channel(limits);
        for _ in 0..STALLED_ROOM * 4 {
            assert!(send_timed(&sink));
        }
        assert!(!send_timed(&sink));
    }

    #[test]
    fn sends_on_the_hosts_async_threads_are_never_refused_for_room() {
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
}
