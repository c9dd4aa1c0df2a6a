//! placeholder
pub use lock_core::*;
