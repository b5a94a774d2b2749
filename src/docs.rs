//! Documentation-only modules: how the engine is built and why it is correct.
//!
//! - [`memory_ordering`]: every atomic of the lane engine, which Release pairs with which
//!   Acquire, and what breaks (found by the loom models) when a protection is weakened.

pub mod memory_ordering {
    #![doc = include_str!("docs/memory_ordering.md")]
}
