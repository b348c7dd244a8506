//! The host's side of the event stream: plugin threads call [`ChannelSink::send`], which feeds a
//! channel that the HTTP handler reads through an [`EventReceiver`]. When the handler is gone
//! (client disconnected) the receiver is dropped and `send` returns false, which tells the plugin
//! to cancel.
//!
//! **The channel is bounded** (`server.event_buffer` events per request), with backpressure to
//! the plugin: when that many events wait unread (a client that reads slower than the model
//! writes), `send` blocks the plugin's thread until the handler reads one. So a slow client holds
//! at most `event_buffer` events in memory, and the model slows down to its pace instead.
//!
//! A stuck client must not wedge the plugin forever, for a plugin thread (Phi4MM's scheduler)
//! may serve many requests at once: `send` waits at most `server.event_send_timeout_secs` in
//! total per blocked event and returns false when that passes (as for a client that went away:
//! the plugin drops the request, the client sees its stream end with an error or its
//! connection closed), and it returns false at once when the receiver is dropped meanwhile. The
//! cost of that bound is that one stuck client can pause such a shared thread for up to the
//! timeout; operators who batch many requests on one thread keep it short.
//!
//! A `send` made on one of the host's async threads (a plugin answering inside `submit`, as the
//! echo fixture's `inline` mode does) never blocks, for the reader may be that very thread: such
//! events are counted but not held back. `submit` is synchronous and bounded by the request
//! itself, so this cannot grow without end.

use std::{
    collections::VecDeque,
    sync::{Arc, Condvar, Mutex},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};
use switchyard_plugin_api::{Event, EventSink, EventSinkBox, EventSink_TO};

/// How many events may wait unread per request, and how long a plugin's `send` may block.
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
    /// Signalled when a blocked sender may go on: room in the window, or the receiver gone.
    room: Condvar,
}

#[derive(Default)]
struct State {
    unread: VecDeque<Event>,
    /// The receiver is gone (the client disconnected).
    closed: bool,
    /// The sink is gone: after the unread events, the stream ends.
    ended: bool,
    /// The reading task, waiting for an event.
    reader: Option<Waker>,
    /// Senders blocked on a full window. The reader signals `room` only when there are some: a
    /// condvar notification is a system call, and most events find nobody waiting.
    waiting: usize,
}

pub struct ChannelSink {
    shared: Arc<Shared>,
    limits: SinkLimits,
}

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        let mut state = self.shared.state.lock().unwrap();
        // On one of the host's async threads the reader may be this very thread: never block.
        if !state.closed
            && state.unread.len() >= self.limits.capacity
            && tokio::runtime::Handle::try_current().is_err()
        {
            let until = Instant::now() + self.limits.send_timeout;
            state.waiting += 1;
            while !state.closed && state.unread.len() >= self.limits.capacity {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    state.waiting -= 1;
                    tracing::warn!(
                        timeout_secs = self.limits.send_timeout.as_secs_f64(),
                        "a client read no event within event_send_timeout_secs; cancelling its request"
                    );
                    return false;
                }
                state = self.shared.room.wait_timeout(state, left).unwrap().0;
            }
            state.waiting -= 1;
        }
        if state.closed {
            return false;
        }
        state.unread.push_back(event);
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
/// one; so besides the `event_buffer` events in the channel, up to as many more wait in the
/// batch being read.
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
        if take_batch(&self.shared, &mut state, &mut self.batch) {
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
        if !take_batch(&self.shared, &mut state, &mut self.batch) {
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
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.shared.room.notify_all();
        }
        drop(unread);
    }
}

/// Moves every unread event into the (empty) `batch`; false when there was none.
fn take_batch(shared: &Shared, state: &mut State, batch: &mut VecDeque<Event>) -> bool {
    if state.unread.is_empty() {
        return false;
    }
    // The buffers trade places, so neither allocates once both have grown.
    std::mem::swap(&mut state.unread, batch);
    if state.waiting > 0 {
        shared.room.notify_all();
    }
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
        room: Condvar::new(),
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

    #[test]
    fn a_full_window_blocks_the_plugin_until_the_reader_reads_or_the_timeout() {
        let limits = SinkLimits {
            capacity: 2,
            send_timeout: Duration::from_millis(300),
        };
        let (sink, mut rx) = channel(limits);
        assert!(sink.send(started()));
        assert!(sink.send(started()));
        // Nobody reads: the third send waits the timeout, then gives up.
        let t = Instant::now();
        assert!(!sink.send(started()));
        assert!(
            t.elapsed() >= Duration::from_millis(280),
            "{:?}",
            t.elapsed()
        );

        // A reader frees room and the blocked sender goes on.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let sender = std::thread::spawn(move || {
            let t = Instant::now();
            let sent = sink.send(started());
            (sent, t.elapsed(), sink)
        });
        std::thread::sleep(Duration::from_millis(100));
        runtime.block_on(async { assert!(rx.recv().await.is_some()) });
        let (sent, waited, sink) = sender.join().unwrap();
        assert!(sent);
        assert!(waited >= Duration::from_millis(80), "{waited:?}");
        // The reader took both waiting events in one batch, so the window had room for two:
        // the sender's, and one more now, which fills it again.
        assert!(sink.send(started()));

        // A dropped receiver wakes a blocked sender at once, with false.
        let sender = std::thread::spawn(move || {
            let t = Instant::now();
            (sink.send(started()), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(rx);
        let (sent, waited) = sender.join().unwrap();
        assert!(!sent);
        assert!(waited < Duration::from_millis(250), "{waited:?}");
    }
}
