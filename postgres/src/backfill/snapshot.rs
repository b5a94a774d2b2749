//! A chunk's snapshot ([`XidSnapshot`]): which transactions the chunk's read saw (see the
//! [backfill](super) docs, *One chunk*).

/// A chunk's snapshot, as `pg_current_snapshot()` tells it (`xmin:xmax:xip,...`, 64-bit xids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XidSnapshot {
    pub(super) xmin: u64,
    pub(super) xmax: u64,
    pub(super) xip: Vec<u64>,
}

impl XidSnapshot {
    pub(crate) fn parse(text: &str) -> Option<XidSnapshot> {
        let mut parts = text.split(':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let xip = match parts.next()? {
            "" => Vec::new(),
            list => list.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u64>>>()?,
        };
        parts.next().is_none().then_some(XidSnapshot { xmin, xmax, xip })
    }

    /// Whether the committed transaction `xid` (the stream's 32-bit xid, of a transaction
    /// within 2^31 of the snapshot, as every live one is) is visible in this snapshot.
    pub(crate) fn visible(&self, xid: u32) -> bool {
        // The epoch is the snapshot's: the xid as a 64-bit xid at most 2^31 around xmax.
        let base = self.xmax & !0xFFFF_FFFF;
        let mut full = base | u64::from(xid);
        if full > self.xmax.saturating_add(1 << 31) {
            full = full.saturating_sub(1 << 32);
        } else if full.saturating_add(1 << 31) < self.xmax {
            full = full.saturating_add(1 << 32);
        }
        full < self.xmin || (full < self.xmax && !self.xip.contains(&full))
    }
}
