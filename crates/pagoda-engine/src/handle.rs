//! The thread-safe face of the engine: [`EngineHandle`] owns an [`EngineCore`] on its own
//! thread and talks to it by messages; each request gets a [`RequestStream`] of events.
//!
//! Invariants: only the engine thread touches the core; a request is validated once, on the
//! caller's thread (so bad input fails at `submit`, with the error, not later on the stream;
//! the engine thread only `debug_assert`s it);
//! dropping a stream aborts its request at the next token (client disconnect frees its blocks).

use crate::constraint::{CompiledConstraint, ConstraintError, Constraints};
use crate::engine::{EngineCore, EngineStats};
use crate::planning::{EngineConfig, KvLayout};
use crate::request::ConstraintSpec;
use crate::request::{EngineRequest, RequestId, TokenEvent};
use crate::EngineError;
use flume::RecvTimeoutError;
use pagoda_model::arch::Model;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

enum Command {
    Submit {
        id: RequestId,
        request: Box<EngineRequest>,
        constraint: Option<Box<CompiledConstraint>>,
        events: flume::Sender<TokenEvent>,
        arrived: Instant,
    },
    Abort(RequestId),
    Shutdown,
}

struct Shared {
    commands: Mutex<Sender<Command>>,
    stats: Mutex<EngineStats>,
    next_id: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    layout: KvLayout,
    constraints: Arc<Constraints>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Sizes the KV pool, then starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let mut core = EngineCore::new(model.clone(), tokenizer.clone(), &config)?;
        let layout = core.layout();
        let constraints = core.constraints().clone();
        let (tx, rx) = mpsc::channel::<Command>();
        let shared = Arc::new(Shared {
            commands: Mutex::new(tx),
            stats: Mutex::new(core.stats()),
            next_id: AtomicU64::new(1),
            thread: Mutex::new(None),
        });
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pagoda-engine".into())
            .spawn(move || run_loop(&mut core, &rx, &for_thread))
            .map_err(|e| {
                EngineError::InvalidConfig(format!("cannot start the engine thread: {e}"))
            })?;
        *shared.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread);
        Ok(EngineHandle {
            shared,
            model,
            tokenizer,
            layout,
            constraints,
        })
    }

    /// Checks that `spec` compiles against this engine's tokenizer, as `submit` would (the
    /// token environment is the engine's, built once): a front end's 400 before submitting.
    pub fn validate_constraint(&self, spec: &ConstraintSpec) -> Result<(), ConstraintError> {
        self.constraints.compile(spec).map(|_| ())
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The KV pool's geometry and the longest sequence allowed.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Queues a request. Bad input (empty or too-long prompt, bad sampling parameters, a
    /// constraint that does not compile: [`EngineError::InvalidConstraint`], ...) is an error
    /// here; the stream then yields its tokens and one `Finished` per choice. The constraint
    /// is compiled on the caller's thread.
    pub fn submit(&self, request: EngineRequest) -> Result<RequestStream, EngineError> {
        EngineCore::validate(&self.model, &self.layout, &request)?;
        let constraint = match &request.constraint {
            Some(spec) => {
                Some(Box::new(self.constraints.compile(spec).map_err(|e| {
                    EngineError::InvalidConstraint(e.to_string())
                })?))
            }
            None => None,
        };
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events_rx) = flume::unbounded();
        let n = request.n;
        self.send(Command::Submit {
            id,
            request: Box::new(request),
            constraint,
            events: events_tx,
            arrived: Instant::now(),
        })?;
        Ok(RequestStream {
            id,
            events: events_rx,
            open_choices: n,
            failed: false,
        })
    }

    /// Ends request `id` now (every choice finishes with `Abort`); unknown ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.send(Command::Abort(id));
    }

    /// The statistics of the last step.
    pub fn stats(&self) -> EngineStats {
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the engine thread after the current step; requests in flight are dropped.
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
        let thread = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn send(&self, command: Command) -> Result<(), EngineError> {
        self.shared
            .commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(command)
            .map_err(|_| EngineError::Stopped)
    }
}

fn run_loop(core: &mut EngineCore, rx: &Receiver<Command>, shared: &Shared) {
    loop {
        if !core.has_work() {
            match rx.recv() {
                Ok(cmd) => {
                    if !apply(core, cmd) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if !apply(core, cmd) {
                        return;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if !core.has_work() {
                        return;
                    }
                    break;
                }
            }
        }
        if core.has_work() && !core.step() {
            // Work is queued but nothing could be scheduled this step; do not spin hot.
            std::thread::sleep(Duration::from_micros(200));
        }
        *shared.stats.lock().unwrap_or_else(PoisonError::into_inner) = core.stats();
    }
}

/// Applies one command; `false` means shut down.
fn apply(core: &mut EngineCore, cmd: Command) -> bool {
    match cmd {
        Command::Submit {
            id,
            request,
            constraint,
            events,
            arrived,
        } => core.add_compiled(id, *request, constraint.map(|c| *c), events, arrived),
        Command::Abort(id) => core.abort(id),
        Command::Shutdown => return false,
    }
    true
}

/// The events of one request, in order. Iterating blocks until the next event and ends after
/// the last choice's `Finished` (or an `Error`).
#[derive(Debug)]
pub struct RequestStream {
    pub id: RequestId,
    events: flume::Receiver<TokenEvent>,
    open_choices: usize,
    failed: bool,
}

impl RequestStream {
    /// Waits up to `timeout` for the next event; `Ok(None)` when the stream is over.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<TokenEvent>, EngineError> {
        if self.is_done() {
            return Ok(None);
        }
        match self.events.recv_timeout(timeout) {
            Ok(ev) => {
                self.track(&ev);
                Ok(Some(ev))
            }
            Err(RecvTimeoutError::Timeout) => Err(EngineError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
        }
    }

    /// The next event, awaited (for async servers); `None` when the stream is over.
    pub async fn next_event(&mut self) -> Option<TokenEvent> {
        if self.is_done() {
            return None;
        }
        let ev = self.events.recv_async().await.ok()?;
        self.track(&ev);
        Some(ev)
    }

    fn is_done(&self) -> bool {
        self.failed || self.open_choices == 0
    }

    fn track(&mut self, ev: &TokenEvent) {
        match ev {
            TokenEvent::Finished { .. } => self.open_choices = self.open_choices.saturating_sub(1),
            TokenEvent::Error { .. } => self.failed = true,
            TokenEvent::Token { .. } => {}
        }
    }
}

impl Iterator for RequestStream {
    type Item = TokenEvent;

    fn next(&mut self) -> Option<TokenEvent> {
        if self.is_done() {
            return None;
        }
        let ev = self.events.recv().ok()?;
        self.track(&ev);
        Some(ev)
    }
}
