//! Benchmark support shared by the bench binaries.
