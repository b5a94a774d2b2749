//! A pgoutput capture read from a file or a pipe ([`PgOutputReader`]): each message as a 4-byte
//! big-endian length, then its bytes (the `XLogData` payloads of a `START_REPLICATION ... LOGICAL`
//! stream, Begin and Commit included, as `scripts/capture-pgoutput.sh --workload` writes them).

use std::io::{self, BufRead};

use lanestream::Batch;

use super::decoder::PgOutputDecoder;
use super::error::PgOutputError;
use crate::batch::TransactionBuilder;

/// Reads a pgoutput capture (each message a 4-byte big-endian length, then its bytes) through a
/// [`PgOutputDecoder`]: an iterator of the batches it builds — one per committed transaction,
/// large ones in chunks, as from the live stream. At the end of the input a transaction left
/// open is an error (its changes are lost: [`PgOutputError::lost_changes`]); an I/O error or a
/// message cut short ends the iteration with
/// [`PgOutputErrorKind::Io`](super::PgOutputErrorKind::Io).
///
/// ```
/// use lanestream::Position;
/// use lanestream_postgres::pgoutput::PgOutputReader;
/// use lanestream_postgres::batch::TransactionBuilder;
///
/// let mut capture = Vec::new();
/// let mut frame = |m: Vec<u8>| {
///     capture.extend((m.len() as u32).to_be_bytes());
///     capture.extend(m);
/// };
/// let mut begin = vec![b'B'];
/// begin.extend(0x16B_3748u64.to_be_bytes());
/// begin.extend(0i64.to_be_bytes());
/// begin.extend(7u32.to_be_bytes());
/// frame(begin);
/// let mut commit = vec![b'C', 0];
/// commit.extend(0x16B_3748u64.to_be_bytes());
/// commit.extend(0x16B_3778u64.to_be_bytes());
/// commit.extend(0i64.to_be_bytes());
/// frame(commit);
/// let batches: Vec<_> = PgOutputReader::new(&capture[..], TransactionBuilder::new()).collect::<Result<_, _>>()?;
/// assert_eq!(batches.len(), 1);
/// assert_eq!(batches[0].position, Some(Position::from_lsn("0/16B3748")?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PgOutputReader<R> {
    input: R,
    decoder: PgOutputDecoder,
    message: Vec<u8>,
    done: bool,
}

impl<R: BufRead> PgOutputReader<R> {
    /// A reader of `input` decoding with `builder` (its chunk size, key columns).
    pub fn new(input: R, builder: TransactionBuilder) -> Self {
        PgOutputReader { input, decoder: PgOutputDecoder::new(builder), message: Vec::new(), done: false }
    }

    /// The decoder (its builder's counters).
    pub fn decoder(&self) -> &PgOutputDecoder {
        &self.decoder
    }

    /// The next message into `self.message`; `Ok(false)` at a clean end (no byte of a length).
    fn read_message(&mut self) -> io::Result<bool> {
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < len.len() {
            match self.input.read(&mut len[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a message's length cut short"))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.message.resize(u32::from_be_bytes(len) as usize, 0);
        self.input.read_exact(&mut self.message)?;
        Ok(true)
    }
}

impl<R: BufRead> Iterator for PgOutputReader<R> {
    type Item = Result<Batch, PgOutputError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            match self.read_message() {
                Ok(true) => match self.decoder.decode(&self.message) {
                    Ok(Some(batch)) => return Some(Ok(batch)),
                    Ok(None) => {}
                    Err(e) => return Some(Err(e)),
                },
                Ok(false) => {
                    self.done = true;
                    return self.decoder.finish().err().map(Err);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(self.decoder.input_error(e)));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// The workload capture reads whole, and a capture cut inside a message is an I/O error
    /// after the transactions before the cut.
    #[test]
    fn the_workload_capture_reads_and_a_cut_one_ends_with_an_error() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/workload.pgoutput.gz");
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).expect("the capture"))
            .read_to_end(&mut bytes)
            .expect("gunzip");
        let batches: Vec<Batch> = PgOutputReader::new(&bytes[..], TransactionBuilder::new())
            .collect::<Result<_, _>>()
            .expect("reads");
        assert!(batches.len() > 100, "{}", batches.len());
        let cut = &bytes[..bytes.len() - 3];
        let results: Vec<Result<Batch, PgOutputError>> =
            PgOutputReader::new(cut, TransactionBuilder::new()).collect();
        let e = results.last().expect("something").as_ref().expect_err("cut short");
        assert!(matches!(e.kind(), super::super::PgOutputErrorKind::Io(_)), "{e}");
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), batches.len() - 1);
    }
}
