//! The README's Rust snippets, compiled (and run, unless marked `no_run`) as doc tests, so
//! the code people copy from it keeps building. One snippet is the blocking client, so
//! they are tested in builds with the `blocking` feature (the test suite's
//! `--all-features`).

#![cfg(all(doctest, feature = "blocking"))]

#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
