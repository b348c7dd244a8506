//! IREE runtimes on dedicated threads.
//!
//! eerie's runtime objects are `!Send`/`!Sync`, so each component (decoder, vision tower, audio
//! encoder) owns one thread that creates its runtime, loads its modules, uploads its weights once
//! and keeps them resident. Callers send closures over a channel and wait for the answer; the
//! thread state never leaves its thread.

use std::sync::mpsc;
use std::thread::JoinHandle;

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// A thread owning a state `S` built on that thread.
pub struct Worker<S> {
    tx: Option<mpsc::Sender<Job<S>>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: 'static> Worker<S> {
    /// Starts the thread and builds its state there; returns once `init` has finished, with its
    /// error if it failed.
    pub fn spawn<E: Send + 'static>(
        name: &str,
        init: impl FnOnce() -> Result<S, E> + Send + 'static,
    ) -> Result<Self, E> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), E>>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut state = match init() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut state);
                }
            })
            .expect("spawn IREE worker thread");
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Worker {
                tx: Some(tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                // init panicked: re-raise it here, where the caller can see it.
                match thread.join() {
                    Err(p) => std::panic::resume_unwind(p),
                    Ok(()) => unreachable!("init returned without reporting"),
                }
            }
        }
    }

    /// Runs `f` on the worker thread and waits for its result. A panic inside `f` is re-raised
    /// here (the worker keeps running).
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut S) -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::sync_channel(1);
        self.post(move |s| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s)));
            let _ = tx.send(r);
        });
        match rx.recv().expect("IREE worker thread is gone") {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// Queues `f` without waiting (used to free per-sequence buffers from `Drop`).
    pub fn post(&self, f: impl FnOnce(&mut S) + Send + 'static) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Box::new(f));
        }
    }
}

impl<S> Drop for Worker<S> {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; its state (runtime, buffers) drops there.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
