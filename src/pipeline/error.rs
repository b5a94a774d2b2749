//! [`PipelineError`]: why a pipeline (or a sink engine run alone) stopped with an error.

use crate::{SinkName, StreamError};

use super::BoxError;

/// Why a pipeline stopped with an error. Each names the part that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The source failed (reading, confirming, or serving a backfill).
    #[error("the source: {0}")]
    Source(#[source] BoxError),
    /// A sink's engine gave up: its `apply`/`commit` failed or panicked on the same run
    /// `attempts` times in a row (or its instance could not be opened). Nothing of that run was
    /// acked. In a [`Pipeline`](super::Pipeline) its lane was closed and the pipeline stopped; an engine run alone
    /// ([`run_sink`](super::run_sink)) left its lane open, for the engine restarted after it (P8).
    #[error("sink {sink}: gave up after {attempts} attempts: {error}")]
    Sink {
        /// The sink.
        sink: SinkName,
        /// Tries made of the last run.
        attempts: u32,
        /// The last failure (a panic's message reads `panicked: ...`).
        #[source]
        error: BoxError,
    },
    /// The stream refused (a lane unknown, the publisher busy, a publish refused).
    #[error("the stream: {0}")]
    Stream(String),
    /// The source handed over a snapshot item for a sink the stream has no lane for.
    #[error("the source sent a snapshot item for sink {0}, which has no lane")]
    UnknownSink(SinkName),
    /// The pipeline refused to start a sink: its state says it cannot be fed from this source
    /// as it is (another origin, or a joiner under [`Joiners::Refuse`](super::Joiners::Refuse)). Nothing was read from
    /// the source and nothing written to any sink.
    #[error("sink {sink}: {reason}")]
    Refused {
        /// The sink.
        sink: SinkName,
        /// Why, and what to do.
        reason: String,
    },
}

impl From<StreamError> for PipelineError {
    fn from(e: StreamError) -> Self {
        PipelineError::Stream(e.to_string())
    }
}

/// A panic's message (`&str` or `String` payloads), for an error that reports it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
