//! The lanes' limits: the largest capacity and memory budget, and their checks at build time.

use crate::error::BuildError;

/// The most slots a lane may have: 2^24 (16,777,216). A slot takes at least one 64-byte cache
/// line, so the largest lane holds 1 GiB of slots; larger capacities are refused at build time
/// with [`BuildError::CapacityTooLarge`] rather than failing to allocate.
pub const MAX_CAPACITY: usize = 1 << 24;

/// The largest memory budget: 2^62 bytes (a budget counts bytes in a `u64` that must not
/// overflow while one more item's charge is added).
pub const MAX_BUDGET: u64 = 1 << 62;

/// Checks a memory budget ([M4](crate::contract#m4)).
pub(crate) fn check_budget(bytes: u64) -> Result<(), BuildError> {
    match bytes {
        0 => Err(BuildError::ZeroBudget),
        b if b > MAX_BUDGET => Err(BuildError::BudgetTooLarge { bytes, max: MAX_BUDGET }),
        _ => Ok(()),
    }
}

/// Checks a capacity asked for `what`.
pub(crate) fn check_capacity(capacity: usize, what: &'static str) -> Result<(), BuildError> {
    if capacity == 0 {
        return Err(BuildError::ZeroCapacity(what));
    }
    if capacity > MAX_CAPACITY {
        return Err(BuildError::CapacityTooLarge { what, capacity, max: MAX_CAPACITY });
    }
    Ok(())
}
