//! distlock backend, being written.
