//! Lock-free reads of a ring's state: idleness, acked position, counters.

use super::Ring;
use crate::lane::stats::LaneStats;
use crate::position::Position;
use crate::sync::Ordering;

impl<T> Ring<T> {
    /// [W5](crate::contract#w5) for one lane: nothing queued, released, or delivered-but-unacked.
    pub(crate) fn is_idle(&self) -> bool {
        // Load `acked_end` before the cursor: both grow and `acked_end <= tail`, so equality means that at
        // the moment of the first load everything published was acked.
        let acked = self.adv.acked_end.load(Ordering::Acquire);
        acked == self.published()
    }

    /// The lane's acked position ([L5](crate::contract#l5)).
    pub(crate) fn acked(&self) -> Option<Position> {
        self.shape.mark.load()
    }

    pub(crate) fn stats(&self) -> LaneStats {
        // Lower bounds first (acked_end <= next <= tail at every instant, all growing), so the
        // differences never underflow; `released` is read separately and clamped.
        let free = self.adv.free.load(Ordering::Acquire);
        let acked = self.adv.acked_end.load(Ordering::Acquire);
        let next = self.cons.next.load(Ordering::Acquire);
        let tail = self.published();
        let released = (self.cons.released.load(Ordering::Relaxed) as u64).min(next - acked);
        LaneStats {
            capacity: self.shape.capacity as usize,
            queued: tail - next,
            released,
            in_flight: next - acked - released,
            // Relaxed: statistics counters, each exact for the moment it is read.
            delivered: self.cons.delivered.load(Ordering::Relaxed),
            redelivered: self.cons.redelivered.load(Ordering::Relaxed),
            published: tail,
            acked_items: acked,
            pinned: acked - free,
            last_published: self.shape.cells.last_published(),
            acked: self.acked(),
            closed: self.is_closed(),
        }
    }
}
