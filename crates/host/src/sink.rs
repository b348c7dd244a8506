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
    sync::{Arc, Condvar, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};
use switchyard_plugin_api::{Event, EventSink, EventSinkBox, EventSink_TO};
use tokio::sync::mpsc;

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

/// What the sink and the receiver share: the number of unread events, and whether the
/// receiver is gone.
struct Window {
    state: Mutex<WindowState>,
    changed: Condvar,
}

#[derive(Default)]
struct WindowState {
    unread: usize,
    closed: bool,
    /// Senders blocked on a full window. The reader wakes them only when there are some: a
    /// condvar notification is a system call, and most events find nobody waiting.
    waiting: usize,
}

pub struct ChannelSink {
    tx: mpsc::UnboundedSender<Event>,
    window: Arc<Window>,
    limits: SinkLimits,
}

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        let on_async_thread = tokio::runtime::Handle::try_current().is_ok();
        let mut state = self.window.state.lock().unwrap();
        if !on_async_thread && !state.closed && state.unread >= self.limits.capacity {
            let until = Instant::now() + self.limits.send_timeout;
            state.waiting += 1;
            while !state.closed && state.unread >= self.limits.capacity {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    state.waiting -= 1;
                    tracing::warn!(
                        timeout_secs = self.limits.send_timeout.as_secs_f64(),
                        "a client read no event within event_send_timeout_secs; cancelling its request"
                    );
                    return false;
                }
                state = self.window.changed.wait_timeout(state, left).unwrap().0;
            }
            state.waiting -= 1;
        }
        if state.closed {
            return false;
        }
        state.unread += 1;
        drop(state);
        self.tx.send(event).is_ok()
    }
}

/// The handler's end of a request's events.
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<Event>,
    window: Arc<Window>,
}

impl EventReceiver {
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let event = std::task::ready!(self.rx.poll_recv(cx));
        if event.is_some() {
            self.read_one();
        }
        Poll::Ready(event)
    }

    /// The next event if one is there (for callers outside an async context).
    pub fn try_recv(&mut self) -> Result<Event, mpsc::error::TryRecvError> {
        let event = self.rx.try_recv()?;
        self.read_one();
        Ok(event)
    }

    fn read_one(&self) {
        let mut state = self.window.state.lock().unwrap();
        state.unread = state.unread.saturating_sub(1);
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.window.changed.notify_all();
        }
    }

    pub async fn recv(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut state = self.window.state.lock().unwrap();
        state.closed = true;
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.window.changed.notify_all();
        }
    }
}

/// A sink for the plugin and the receiver for the handler.
pub fn channel(limits: SinkLimits) -> (EventSinkBox, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let window = Arc::new(Window {
        state: Mutex::new(WindowState::default()),
        changed: Condvar::new(),
    });
    let sink = ChannelSink {
        tx,
        window: window.clone(),
        limits,
    };
    let sink = EventSink_TO::from_value(sink, abi_stable::sabi_trait::TD_Opaque);
    (sink, EventReceiver { rx, window })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_plugin_api::Event;

    fn started() -> Event {
        Event::Started { prompt_tokens: 1 }
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
