//! Which flight started a load: the library opens its `onefill.load` span
//! in the flight's task just before it spawns the loader, and the loader
//! runs inside that span. A subscriber of that one span tells a loader the
//! task of the flight that started it, so the checker knows for certain
//! whether the load runs under a lease the flight just won, even when two
//! flights of one key in one process start loads in the same instant.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::Id;
use tracing::span::{Attributes, Record};
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Event, Metadata};

const LOAD_SPAN: &str = "onefill.load";

/// The load spans of one run (one thread: the runtime is current-thread).
#[derive(Debug, Default)]
pub(crate) struct LoadSpans {
    next: AtomicU64,
    /// The task that opened each span: the flight's.
    flights: Mutex<HashMap<u64, Option<Id>>>,
    /// The spans entered now, innermost last.
    entered: Mutex<Vec<u64>>,
}

impl LoadSpans {
    /// Subscribes to the load spans on this thread until the guard drops.
    pub(crate) fn install(self: &Arc<Self>) -> DefaultGuard {
        tracing::subscriber::set_default(Spans(self.clone()))
    }

    /// The task of the flight whose loader runs now.
    pub(crate) fn current_flight(&self) -> Option<Id> {
        let span = *self.entered.lock().unwrap().last()?;
        self.flights.lock().unwrap().get(&span).copied().flatten()
    }
}

struct Spans(Arc<LoadSpans>);

fn is_load_span(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.name() == LOAD_SPAN
}

impl tracing::Subscriber for Spans {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_load_span(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_load_span(metadata)
    }
    fn new_span(&self, _: &Attributes<'_>) -> tracing::span::Id {
        let id = self.0.next.fetch_add(1, Ordering::SeqCst) + 1;
        let flight = tokio::task::try_id();
        self.0.flights.lock().unwrap().insert(id, flight);
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, _: &tracing::span::Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, span: &tracing::span::Id) {
        self.0.entered.lock().unwrap().push(span.into_u64());
    }
    fn exit(&self, _: &tracing::span::Id) {
        self.0.entered.lock().unwrap().pop();
    }
}
