//! What each sink received, and the durable outputs read back against what was published.

use crate::prelude::*;

/// The positioned batches one sink received: for each position, how many of its envelopes.
///
/// A batch delivers all its envelopes, so envelopes `0..n` of a batch were received iff a receipt
/// had at least `n`. Transactions are published in strictly increasing position order, so a
/// first receipt is almost always a push at the end; a redelivery is found by binary search.
#[derive(Default)]
pub(crate) struct Received {
    /// Positions of the batches received (empty transactions included), strictly increasing.
    pub(crate) positions: Vec<u64>,
    /// Per entry of `positions`: the most envelopes one receipt of it held (with the envelopes
    /// of the transaction's chunks).
    pub(crate) envelopes: Vec<u32>,
    /// The unpositioned chunks of large transactions processed: (commit position, offset in
    /// the transaction).
    pub(crate) chunks: std::collections::HashSet<(u64, u64)>,
    /// Envelopes of those chunks, by their envelopes' position (the transaction's commit LSN).
    pub(crate) chunk_envelopes: HashMap<u64, u32>,
}

impl Received {
    /// Records a receipt of `envelopes` envelopes at `position`; returns how many of them had
    /// been received before (duplicates).
    pub(crate) fn record(&mut self, position: u64, envelopes: u32) -> u64 {
        let i = match self.positions.last() {
            Some(&last) if last >= position => self.positions.partition_point(|&p| p < position),
            _ => self.positions.len(),
        };
        if self.positions.get(i) != Some(&position) {
            self.positions.insert(i, position);
            self.envelopes.insert(i, 0);
        }
        let seen = &mut self.envelopes[i];
        let duplicates = (*seen).min(envelopes);
        *seen = (*seen).max(envelopes);
        u64::from(duplicates)
    }

    /// Records a receipt of a chunk of a large transaction (`chunk`: its commit position and
    /// offset) holding `envelopes` envelopes at `position`; returns how many had been received
    /// before.
    pub(crate) fn record_chunk(&mut self, chunk: (u64, u64), position: u64, envelopes: u32) -> u64 {
        if !self.chunks.insert(chunk) {
            return u64::from(envelopes);
        }
        *self.chunk_envelopes.entry(position).or_default() += envelopes;
        0
    }

    /// Records a receipt of the positioned (last) batch of a transaction, adding the envelopes
    /// of its chunks received before.
    pub(crate) fn record_last(&mut self, position: u64, envelopes: u32) -> u64 {
        let chunks = self.chunk_envelopes.get(&position).copied().unwrap_or(0);
        self.record(position, envelopes.saturating_add(chunks))
    }

    /// How many positioned batches (transactions) were received at least once.
    pub(crate) fn transactions(&self) -> u64 {
        self.positions.len() as u64
    }

    /// How many of their envelopes were received at least once.
    pub(crate) fn envelopes(&self) -> u64 {
        self.envelopes.iter().map(|&n| u64::from(n)).sum()
    }

    /// How many of the `published` (position, envelope count) batches, and how many of their
    /// envelopes (a lost batch's included), were never received: (transactions, envelopes).
    /// `published` is in increasing position order.
    pub(crate) fn lost(&self, published: &[(u64, u32)]) -> (u64, u64) {
        let (mut transactions, mut envelopes) = (0, 0);
        let mut j = 0;
        for &(p, n) in published {
            while self.positions.get(j).is_some_and(|&q| q < p) {
                j += 1;
            }
            let got = if self.positions.get(j) == Some(&p) {
                self.envelopes[j]
            } else {
                transactions += 1;
                0
            };
            envelopes += u64::from(n.saturating_sub(got));
        }
        (transactions, envelopes)
    }
}

/// Compares a sink's NDJSON output with what was published: envelopes per transaction,
/// counted by the `position` each line starts with. Returns ((transactions, envelopes) lost,
/// envelopes written more than once); transactions without envelopes are left out (they write
/// nothing; the watermark check covers their acks).
/// With `since`, lines at positions before it are left out (an earlier run's, on the live
/// source); snapshot rows (position null) and lines past the last published transaction (chunks
/// of a transaction the ingest stopped in) always are.
pub(crate) fn check_output(
    path: &Path,
    published: &[(u64, u32)],
    since: Option<u64>,
) -> Result<((u64, u64), u64), BoxError> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut lines: HashMap<u64, u32> = HashMap::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.starts_with("{\"position\":null") {
            continue;
        }
        let bad = || format!("{}:{}: expected a line starting {{\"position\":\"X/Y\"", path.display(), i + 1);
        let rest = line.strip_prefix("{\"position\":\"").ok_or_else(bad)?;
        let lsn = rest.split_once('"').ok_or_else(bad)?.0;
        let p = Position::from_lsn(lsn).map_err(|_| bad())?.0;
        // Past the last transaction published: chunks of one the ingest stopped in the middle of.
        let unfinished = published.last().is_some_and(|&(last, _)| p > last);
        if since.is_none_or(|s| p >= s) && !unfinished {
            *lines.entry(p).or_default() += 1;
        }
    }
    let mut positions: Vec<(u64, u32)> = lines.into_iter().collect();
    positions.sort_unstable();
    // A transaction without envelopes leaves no line: only its ack (the watermark) shows it.
    let published: Vec<(u64, u32)> = published.iter().copied().filter(|&(_, n)| n > 0).collect();
    let published = published.as_slice();
    let mut received = Received::default();
    for &(p, n) in &positions {
        received.record(p, n);
    }
    let expected: HashMap<u64, u32> = published.iter().copied().collect();
    let duplicates = positions
        .iter()
        .map(|&(p, n)| u64::from(n.saturating_sub(expected.get(&p).copied().unwrap_or(0))))
        .sum();
    Ok((received.lost(published), duplicates))
}
