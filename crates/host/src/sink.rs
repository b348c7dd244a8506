//! The host's side of the event stream: plugin threads call [`ChannelSink::send`], which feeds a
//! tokio channel that the HTTP handler reads. When the handler is gone (client disconnected) the
//! channel is closed and `send` returns false, which tells the plugin to cancel.

use switchyard_plugin_api::{Event, EventSink, EventSinkBox, EventSink_TO};
use tokio::sync::mpsc;

pub struct ChannelSink {
    tx: mpsc::UnboundedSender<Event>,
}

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.tx.send(event).is_ok()
    }
}

/// A sink for the plugin and the receiver for the handler.
pub fn channel() -> (EventSinkBox, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = EventSink_TO::from_value(ChannelSink { tx }, abi_stable::sabi_trait::TD_Opaque);
    (sink, rx)
}
