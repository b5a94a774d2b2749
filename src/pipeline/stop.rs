//! [`StopHandle`]: how a running pipeline or sink engine is asked to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Asks a running pipeline (or sink engine) to stop: the driver stops reading the source, waits
/// (up to the drain timeout) until the sinks acked what was published, confirms the source at
/// the watermark, stops its local sink engines and returns `Ok`. The lanes stay open: a stop is
/// a pause, and a closed lane is final ([L10](crate::contract#l10)); on a broker, sink
/// engines in other processes wait for the next ingest. Clone it freely; hand
/// [`flag`](StopHandle::flag) to a signal handler (`signal_hook::flag::register`).
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// A handle not stopped yet.
    pub fn new() -> Self {
        StopHandle::default()
    }

    /// Asks to stop.
    pub fn stop(&self) {
        // Release: pairs with the Acquire in `is_stopped`; the flag carries no other data, so
        // Relaxed would do, but a stopper's writes before it are then visible to the driver.
        self.0.store(true, Ordering::Release);
    }

    /// Whether a stop was asked.
    pub fn is_stopped(&self) -> bool {
        // Acquire: pairs with `stop`'s Release.
        self.0.load(Ordering::Acquire)
    }

    /// The flag itself, for a signal handler that sets it.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}
